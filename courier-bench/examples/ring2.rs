//! Scratch: a ring of two threads over bounded(1): courier, crossbeam, and a one-line slot
//! (CAS-claimed, spin only) to see what a single cache line per message would give.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
const N: usize = 500_000;
fn pin(cpu: usize) {
    if std::env::var("PIN").is_err() { return; }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).unwrap();
}
#[repr(align(64))]
struct Slot { state: AtomicUsize, msg: std::cell::UnsafeCell<usize> }
unsafe impl Sync for Slot {}
const EMPTY: usize = 0; const BUSY: usize = 1; const FULL: usize = 2;
impl Slot {
    fn send(&self, v: usize) {
        loop {
            if self.state.load(Ordering::Relaxed) == EMPTY
                && self.state.compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                unsafe { *self.msg.get() = v };
                self.state.store(FULL, Ordering::Release);
                return;
            }
            std::hint::spin_loop();
        }
    }
    fn recv(&self) -> usize {
        loop {
            if self.state.load(Ordering::Relaxed) == FULL
                && self.state.compare_exchange(FULL, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                let v = unsafe { *self.msg.get() };
                self.state.store(EMPTY, Ordering::Release);
                return v;
            }
            std::hint::spin_loop();
        }
    }
}
fn oneline() -> f64 {
    let a = Arc::new((Slot { state: AtomicUsize::new(0), msg: 0.into() }, Slot { state: AtomicUsize::new(0), msg: 0.into() }));
    let b = a.clone();
    let t = Instant::now();
    let h = std::thread::spawn(move || { pin(1); for i in 0..N { b.1.send(i); b.0.recv(); } });
    for i in 0..N { a.0.send(i); a.1.recv(); }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / (2 * N) as f64
}
fn courier() -> f64 {
    let (tx1, rx1) = courier::chan::bounded::<usize>(1);
    let (tx2, rx2) = courier::chan::bounded::<usize>(1);
    let t = Instant::now();
    let h = std::thread::spawn(move || { pin(1); for i in 0..N { tx2.send(i).unwrap(); rx1.recv().unwrap(); } });
    for i in 0..N { tx1.send(i).unwrap(); rx2.recv().unwrap(); }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / (2 * N) as f64
}
fn cb() -> f64 {
    let (tx1, rx1) = crossbeam_channel::bounded::<usize>(1);
    let (tx2, rx2) = crossbeam_channel::bounded::<usize>(1);
    let t = Instant::now();
    let h = std::thread::spawn(move || { pin(1); for i in 0..N { tx2.send(i).unwrap(); rx1.recv().unwrap(); } });
    for i in 0..N { tx1.send(i).unwrap(); rx2.recv().unwrap(); }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / (2 * N) as f64
}
fn main() {
    pin(0);
    let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
    for _ in 0..7 { a.push(courier() as u64); b.push(cb() as u64); c.push(oneline() as u64); }
    a.sort(); b.sort(); c.sort();
    println!("courier {a:?}\ncrossbeam {b:?}\noneline {c:?}");
}
