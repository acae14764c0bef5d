//! Suite `ring`: the benchmark of Rust's 2012 message-passing post ("Progress on Message
//! Passing Performance", June 2012): a ring of N tasks, each receiving from one neighbour and
//! sending to the next, M messages in total, reported as messages/s and ns/message.
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
//!
//! The rendezvous rings also have a `floor` row: the same ring of threads with no channel at
//! all, each hop a bare futex hand-off (the sender stores the token in the recipient's word and
//! wakes it with `FUTEX_WAKE`; the recipient waits in `FUTEX_WAIT`). It is what any channel pays
//! whose recipient has parked by the time its message comes, which in a ring of more tasks than
//! CPUs is most of them. A channel can only go below it by catching recipients before they park.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex;

use super::chan::{
    measure_interleaved, time_threads, Courier, Crossbeam, Flume, Kind, Peer, Runner, StdMpsc,
};
use crate::harness::report::FLOOR;
use crate::harness::{Case, Ctx, Result};

/// Ring sizes measured.
pub(crate) const TASKS: [usize; 3] = [2, 4, 16];

/// The ring of threads for peer `P`; the time for `per_task * n` messages (`None`: stuck).
pub(crate) fn thread_ring<P: Peer>(kind: Kind, n: usize, per_task: usize) -> Option<Duration> {
    let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| P::make(kind)).unzip();
    // Task i receives on channel i and sends on channel i + 1.
    txs.rotate_left(1);
    let one_token = kind == Kind::Bounded0;
    let tasks = txs
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(i, (tx, rx))| {
            move || {
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
            }
        })
        .collect();
    time_threads(n * per_task, tasks)
}

/// A task's futex word, alone on its cache lines (two, against the adjacent-line prefetcher).
#[repr(align(128))]
struct Word(AtomicU32);

/// The floor of the rendezvous ring: the ring of threads in which every hop is a bare futex
/// hand-off (see the module docs); the time for `per_task * n` hops (`None`: stuck).
pub(crate) fn futex_ring(n: usize, per_task: usize) -> Option<Duration> {
    let words: std::sync::Arc<[Word]> = (0..n).map(|_| Word(AtomicU32::new(0))).collect();
    let tasks = (0..n)
        .map(|i| {
            let words = words.clone();
            move || {
                let (own, next) = (&words[i].0, &words[(i + 1) % n].0);
                let hand_off = || {
                    next.store(1, Ordering::Release);
                    futex::wake(next, futex::Flags::PRIVATE, 1).expect("FUTEX_WAKE");
                };
                let take = || {
                    while own.swap(0, Ordering::Acquire) == 0 {
                        // EAGAIN (the token came meanwhile) and EINTR both mean: look again.
                        let _ = futex::wait(own, futex::Flags::PRIVATE, 0, None);
                    }
                };
                for _ in 0..per_task {
                    if i == 0 {
                        hand_off();
                        take();
                    } else {
                        take();
                        hand_off();
                    }
                }
            }
        })
        .collect();
    time_threads(n * per_task, tasks)
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
            chans[(i + 1) % n]
                .0
                .try_send(j)
                .unwrap_or_else(|_| unreachable!());
        }
        for (_, rx) in &chans {
            std::hint::black_box(rx.try_recv().unwrap());
        }
    }
    start.elapsed()
}

/// `P`'s ring of `n` threads.
fn ring_runner<P: Peer>(kind: Kind, n: usize) -> (&'static str, Runner) {
    (P::NAME, Box::new(move |m| thread_ring::<P>(kind, n, m / n)))
}

/// Messages per sample: quick, and `--full` (the 2012 benchmark's million).
const MESSAGES: (usize, usize) = (10_000, 1_000_000);
/// Quick runs of the buffered rings move ten times as many: at 10,000 a ring
/// of two took ~0.6 ms a sample, which the threads' start-up skew swamps
/// (as in the `chan` suite's buffered cases).
const QUICK_BUFFERED: usize = 100_000;

/// `courier-bench ring`: rings of 2, 4 and 16 threads on bounded(1), unbounded and bounded(0)
/// channels for every subject, and the single-thread `chan::local` ring.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let rendezvous = ctx.pick(MESSAGES.0, MESSAGES.1);
    let buffered = ctx.pick(QUICK_BUFFERED, MESSAGES.1);
    // --full: a million messages a sample, as the 2012 benchmark ran; three samples, since one on this
    // shared machine moved the rendezvous rings' ratios by 1.3x from run to run.
    let samples = ctx.samples(3, 3);
    for kind in [Kind::Bounded1, Kind::Unbounded, Kind::Bounded0] {
        let total = match kind {
            Kind::Bounded0 => rendezvous,
            _ => buffered,
        };
        for n in TASKS {
            let case = Case::new(format!("ring_{}_{n}", kind.label())).tasks(n as u64);
            let mut subjects = vec![ring_runner::<Courier>(kind, n)];
            if kind != Kind::Bounded0 {
                subjects.push((
                    "courier-local",
                    Box::new(move |m| Some(local_ring(kind, n, m / n))),
                ));
            }
            subjects.push(ring_runner::<Crossbeam>(kind, n));
            subjects.push(ring_runner::<Flume>(kind, n));
            subjects.push(ring_runner::<StdMpsc>(kind, n));
            if kind == Kind::Bounded0 {
                subjects.push((FLOOR, Box::new(move |m| futex_ring(n, m / n))));
            }
            measure_interleaved(ctx, &case, subjects, samples, total / n * n);
        }
    }
    ctx.note(format!(
        "{buffered} messages per sample ({rendezvous} on bounded0), {samples} sample(s) after a warm-up, subjects taking turns; N tasks = N threads; \
         buffered rings circulate N messages at once (send, then receive), the bounded0 ring one"
    ));
    ctx.note(
        "courier-local: the same ring on chan::local channels inside one thread (a state machine)",
    );
    ctx.note(
        "bounded0 floor: the same ring of threads with a bare futex hand-off per hop (what a \
         channel pays whose recipient has parked); courier can beat it only by catching recipients \
         before they park",
    );
    super::ring_fiber::run(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subject completes every ring shape (a smoke test: timings are not checked).
    #[test]
    fn every_ring_completes() {
        for kind in [Kind::Bounded1, Kind::Unbounded, Kind::Bounded0] {
            for n in [2, 5] {
                assert!(thread_ring::<Courier>(kind, n, 200).is_some());
                assert!(thread_ring::<Crossbeam>(kind, n, 200).is_some());
                assert!(thread_ring::<Flume>(kind, n, 200).is_some());
                assert!(thread_ring::<StdMpsc>(kind, n, 200).is_some());
            }
        }
        for n in [2, 5] {
            assert!(futex_ring(n, 200).is_some());
        }
        local_ring(Kind::Bounded1, 5, 200);
        local_ring(Kind::Unbounded, 5, 200);
    }
}
