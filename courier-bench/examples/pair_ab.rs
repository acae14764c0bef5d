//! Two threads over `bounded(1)` or `unbounded` channels, courier against crossbeam-channel in
//! one process, taking turns, beside the floor of a hand-off between two CPUs.
//!
//! `pair_ab [spsc|ring] [bounded1|unbounded] [rounds]` (default 7 rounds); `PIN=1` puts the
//! two threads on CPUs 0 and 1. `spsc`: one thread sends, the other receives; `ring`: each
//! thread sends to the other, then receives (the `ring` suite's ring of two). `spsc` also runs
//! its floor: one atomic word handed back and forth, both threads spinning. Prints each
//! subject's ns per message, sorted.
//!
//! `PIN=1 pair_ab spsc bounded1` is also a probe of the machine's state: on the 2-vCPU guests
//! this project is measured on, its floor reads either ~80-100 ns or ~450-500 ns for minutes at
//! a time, and every cross-thread figure moves with it (`docs/waiting-policy.md`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const MESSAGES: usize = 200_000;

fn pin(cpu: usize) {
    if std::env::var_os("PIN").is_none() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
}

/// The pair of operations a subject's channel offers, boxed so that one driver runs them all.
trait Pair: Send + 'static {
    fn make(unbounded: bool) -> (Self, Self)
    where
        Self: Sized;
    fn send(&self, v: usize);
    fn recv(&self) -> usize;
}

struct Courier(courier::chan::Sender<usize>, courier::chan::Receiver<usize>);
struct Crossbeam(
    crossbeam_channel::Sender<usize>,
    crossbeam_channel::Receiver<usize>,
);

impl Pair for Courier {
    fn make(unbounded: bool) -> (Self, Self) {
        let chan = || {
            if unbounded {
                courier::chan::unbounded()
            } else {
                courier::chan::bounded(1)
            }
        };
        let (a_tx, b_rx) = chan();
        let (b_tx, a_rx) = chan();
        (Courier(a_tx, a_rx), Courier(b_tx, b_rx))
    }
    fn send(&self, v: usize) {
        self.0.send(v).unwrap();
    }
    fn recv(&self) -> usize {
        self.1.recv().unwrap()
    }
}

impl Pair for Crossbeam {
    fn make(unbounded: bool) -> (Self, Self) {
        let chan = || {
            if unbounded {
                crossbeam_channel::unbounded()
            } else {
                crossbeam_channel::bounded(1)
            }
        };
        let (a_tx, b_rx) = chan();
        let (b_tx, a_rx) = chan();
        (Crossbeam(a_tx, a_rx), Crossbeam(b_tx, b_rx))
    }
    fn send(&self, v: usize) {
        self.0.send(v).unwrap();
    }
    fn recv(&self) -> usize {
        self.1.recv().unwrap()
    }
}

/// ns per message: `a` sends to `b` (spsc), or both send then receive (ring).
fn run<P: Pair>(ring: bool, unbounded: bool) -> f64 {
    let (a, b) = P::make(unbounded);
    let start = Instant::now();
    let peer = std::thread::spawn(move || {
        pin(1);
        for i in 0..MESSAGES {
            if ring {
                b.send(i);
            }
            b.recv();
        }
    });
    for i in 0..MESSAGES {
        a.send(i);
        if ring {
            a.recv();
        }
    }
    peer.join().unwrap();
    let messages = if ring { 2 * MESSAGES } else { MESSAGES };
    start.elapsed().as_nanos() as f64 / messages as f64
}

/// The floor of `spsc`: one word, set by one thread and cleared by the other.
fn floor() -> f64 {
    let word = Arc::new(AtomicUsize::new(0));
    let peer_word = Arc::clone(&word);
    let start = Instant::now();
    let peer = std::thread::spawn(move || {
        pin(1);
        for i in 0..MESSAGES {
            while peer_word.load(Ordering::Acquire) != 0 {
                std::hint::spin_loop();
            }
            peer_word.store(i + 1, Ordering::Release);
        }
    });
    for _ in 0..MESSAGES {
        while word.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        word.store(0, Ordering::Release);
    }
    peer.join().unwrap();
    start.elapsed().as_nanos() as f64 / MESSAGES as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ring = args.next().as_deref() == Some("ring");
    let unbounded = args.next().as_deref() == Some("unbounded");
    let rounds: usize = args.next().map_or(7, |r| r.parse().expect("rounds"));
    pin(0);
    let (mut ours, mut theirs, mut limit) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        ours.push(run::<Courier>(ring, unbounded) as u64);
        theirs.push(run::<Crossbeam>(ring, unbounded) as u64);
        if !ring {
            limit.push(floor() as u64);
        }
    }
    for v in [&mut ours, &mut theirs, &mut limit] {
        v.sort_unstable();
    }
    println!("courier           {ours:?}");
    println!("crossbeam-channel {theirs:?}");
    if !ring {
        println!("floor             {limit:?}");
    }
}
