//! Scratch: spsc bounded(1), courier vs crossbeam, alternating.
use std::time::Instant;
const N: usize = 200_000;
fn pin(cpu: usize) {
    if std::env::var("PIN").is_err() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).unwrap();
}
fn courier() -> f64 {
    let (tx, rx) = courier::chan::bounded::<usize>(1);
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        pin(1);
        for i in 0..N {
            tx.send(i).unwrap();
        }
    });
    for _ in 0..N {
        rx.recv().unwrap();
    }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / N as f64
}
fn cb() -> f64 {
    let (tx, rx) = crossbeam_channel::bounded::<usize>(1);
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        pin(1);
        for i in 0..N {
            tx.send(i).unwrap();
        }
    });
    for _ in 0..N {
        rx.recv().unwrap();
    }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / N as f64
}
fn floor() -> f64 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let flag = Arc::new(AtomicUsize::new(0));
    let f2 = flag.clone();
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        pin(1);
        for i in 0..N {
            while f2.load(Ordering::Acquire) != 0 {
                std::hint::spin_loop();
            }
            f2.store(i + 1, Ordering::Release);
        }
    });
    for _ in 0..N {
        while flag.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        flag.store(0, Ordering::Release);
    }
    h.join().unwrap();
    t.elapsed().as_nanos() as f64 / N as f64
}
fn main() {
    let mut f: Vec<u64> = (0..5).map(|_| floor() as u64).collect();
    f.sort();
    println!("floor {f:?}");
    pin(0);
    let mut a = vec![];
    let mut b = vec![];
    for _ in 0..9 {
        a.push(courier());
        b.push(cb());
    }
    a.sort_by(|x, y| x.partial_cmp(y).unwrap());
    b.sort_by(|x, y| x.partial_cmp(y).unwrap());
    println!(
        "courier {:?}\ncrossbeam {:?}",
        a.iter().map(|x| *x as u64).collect::<Vec<_>>(),
        b.iter().map(|x| *x as u64).collect::<Vec<_>>()
    );
}
