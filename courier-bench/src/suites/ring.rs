//! Suite `ring` (seed 003): a ring of N tasks, each receiving from one neighbour and sending to
//! the next, M messages in total, reported as messages/s and ns/message.
//!
//! As in Rust 2012's `msgsend-ring`, every task loops "send to the next, receive from my own
//! channel", so N messages circulate at once and every task can make progress in parallel.
//! On a rendezvous channel (`bounded(0)`) that order deadlocks (every task waits in `send`),
//! so there task 0 sends first and the others receive first: one message circulates, and every
//! hop is a hand-off between two threads.
//!
//! Tasks are threads (N = 2, 4, 16) for courier, crossbeam-channel, flume and std::sync::mpsc;
//! `courier-local` runs the same ring inside one thread on `chan::local` channels, as a state
//! machine (each task is a step of a loop) until fibers exist.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use super::chan::{Courier, Crossbeam, Flume, Kind, Peer, Sample, StdMpsc};

/// Ring sizes measured.
pub(crate) const TASKS: [usize; 3] = [2, 4, 16];

/// The ring of threads for peer `P`; returns the time for `per_task * n` messages.
pub(crate) fn thread_ring<P: Peer>(kind: Kind, n: usize, per_task: usize) -> Duration {
    let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| P::make(kind)).unzip();
    // Task i receives on channel i and sends on channel i + 1.
    txs.rotate_left(1);
    let one_token = kind == Kind::Bounded0;
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = txs
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(i, (tx, rx))| {
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let sends_first = !one_token || i == 0;
                for j in 0..per_task as u64 {
                    if sends_first {
                        P::send(&tx, j);
                        std::hint::black_box(P::recv(&rx));
                    } else {
                        let v = P::recv(&rx);
                        P::send(&tx, std::hint::black_box(v));
                    }
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("ring thread panicked");
    }
    start.elapsed()
}

/// The ring inside one thread on `chan::local`: each round, every task sends to its successor
/// and then receives from its own channel (the state-machine form of the threaded loop).
pub(crate) fn local_ring(kind: Kind, n: usize, per_task: usize) -> Duration {
    let chans: Vec<_> = (0..n)
        .map(|_| match kind {
            Kind::Bounded1 => courier::chan::local::bounded(1),
            _ => courier::chan::local::channel(),
        })
        .collect();
    let start = Instant::now();
    for j in 0..per_task as u64 {
        for i in 0..n {
            chans[(i + 1) % n].0.try_send(j).unwrap_or_else(|_| unreachable!());
        }
        for (_, rx) in &chans {
            std::hint::black_box(rx.try_recv().unwrap());
        }
    }
    start.elapsed()
}

fn emit<P: Peer>(kind: Kind, n: usize, total: usize, out: &mut dyn FnMut(Sample)) {
    let per_task = total / n;
    out(Sample {
        case: format!("threads-{n}/{}", kind.label()),
        subject: P::NAME,
        messages: (per_task * n) as u64,
        elapsed: thread_ring::<P>(kind, n, per_task),
    });
}

/// Runs every ring with `total` messages each, handing each sample to `out`.
pub(crate) fn run(total: usize, out: &mut dyn FnMut(Sample)) {
    for kind in [Kind::Bounded1, Kind::Unbounded, Kind::Bounded0] {
        for n in TASKS {
            emit::<Courier>(kind, n, total, out);
            emit::<Crossbeam>(kind, n, total, out);
            emit::<Flume>(kind, n, total, out);
            emit::<StdMpsc>(kind, n, total, out);
            if kind != Kind::Bounded0 {
                let per_task = total / n;
                out(Sample {
                    case: format!("threads-{n}/{}", kind.label()),
                    subject: "courier-local",
                    messages: (per_task * n) as u64,
                    elapsed: local_ring(kind, n, per_task),
                });
            }
        }
    }
}
