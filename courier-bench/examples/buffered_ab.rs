//! Buffered channels with room for every message, courier against crossbeam-channel and
//! std's `sync_channel` in one process, taking turns: the A/B behind BENCHMARKS.md's session 9
//! figures for `spsc_boundedN` and `mpsc_boundedN`.
//!
//! `buffered_ab [senders] [rounds]` (default 1 sender, 7 rounds): `senders` threads send
//! 100,000 messages in all (a channel of that capacity) to one receiver on the main thread. Prints each subject's ns per
//! message, sorted.

use std::time::Instant;

const MESSAGES: usize = 100_000;

/// ns per message through `make()`'s channel.
fn run<S, R>(
    senders: usize,
    make: impl FnOnce() -> (S, R),
    send: fn(&S, usize),
    recv: fn(&R) -> usize,
) -> f64
where
    S: Clone + Send + 'static,
{
    let (tx, rx) = make();
    let start = Instant::now();
    let threads: Vec<_> = (0..senders)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..MESSAGES / senders {
                    send(&tx, i);
                }
            })
        })
        .collect();
    drop(tx);
    let mut sum = 0;
    for _ in 0..MESSAGES / senders * senders {
        sum += recv(&rx);
    }
    for t in threads {
        t.join().unwrap();
    }
    std::hint::black_box(sum);
    start.elapsed().as_nanos() as f64 / MESSAGES as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let senders: usize = args.next().map_or(1, |s| s.parse().expect("senders"));
    let rounds: usize = args.next().map_or(7, |r| r.parse().expect("rounds"));
    let mut figures = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        figures[0].push(run(
            senders,
            || courier::chan::bounded(MESSAGES),
            |tx: &courier::chan::Sender<usize>, v| tx.send(v).unwrap(),
            |rx: &courier::chan::Receiver<usize>| rx.recv().unwrap(),
        ) as u64);
        figures[1].push(run(
            senders,
            || crossbeam_channel::bounded(MESSAGES),
            |tx: &crossbeam_channel::Sender<usize>, v| tx.send(v).unwrap(),
            |rx: &crossbeam_channel::Receiver<usize>| rx.recv().unwrap(),
        ) as u64);
        figures[2].push(run(
            senders,
            || std::sync::mpsc::sync_channel(MESSAGES),
            |tx: &std::sync::mpsc::SyncSender<usize>, v| tx.send(v).unwrap(),
            |rx: &std::sync::mpsc::Receiver<usize>| rx.recv().unwrap(),
        ) as u64);
    }
    for (name, v) in ["courier", "crossbeam-channel", "std-mpsc"]
        .iter()
        .zip(&mut figures)
    {
        v.sort_unstable();
        println!("{name:<18}{v:?}");
    }
}
