//! Buffered channels, courier against crossbeam-channel and std's `sync_channel` in one
//! process, taking turns: the `chan` suite's `spsc`, `mpsc` and `mpmc` cases with more rounds
//! and with switches, for A/B runs of one case and for profiling one subject (see
//! `docs/waiting-policy.md` for the capacity-one runs).
//!
//! `buffered_ab [senders] [rounds] [barrier]` (default 1 sender, 7 rounds): `senders` threads
//! send 100,000 messages in all (a channel of that capacity) to one receiver on the main thread,
//! or, with `barrier`, on a thread of its own released with the senders by a barrier (as the
//! `chan` suite does: the span from the first sender's start to the receiver's end). Prints each
//! subject's ns per message, sorted. `AB_ONLY=<subject>` runs that subject alone (to profile
//! it); `AB_CAP=<n>` gives the channel room for `n` messages only (`AB_CAP=unbounded`: unbounded
//! channels, std's `channel`); `AB_RECEIVERS=<n>` receives
//! on `n` threads (the extra ones released with the others, or spawned at once without
//! `barrier`); `AB_MESSAGES=<n>` sends `n` messages a round instead of 100,000.

use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Messages a round unless `AB_MESSAGES` says otherwise.
const MESSAGES: usize = 100_000;

/// ns per message through `make()`'s channel.
#[allow(clippy::too_many_arguments)]
fn run<S, R>(
    messages: usize,
    senders: usize,
    receivers: usize,
    barrier: bool,
    make: impl FnOnce() -> (S, R),
    send: fn(&S, usize),
    recv: fn(&R) -> usize,
    clone_rx: fn(&R) -> R,
) -> f64
where
    S: Clone + Send + 'static,
    R: Send + 'static,
{
    let (tx, rx) = make();
    let messages = messages / (senders * receivers) * senders * receivers;
    let gate = Arc::new(Barrier::new(senders + receivers));
    let start = Instant::now();
    let threads: Vec<_> = (0..senders)
        .map(|_| {
            let tx = tx.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                if barrier {
                    gate.wait();
                }
                let start = Instant::now();
                for i in 0..messages / senders {
                    send(&tx, i);
                }
                start
            })
        })
        .collect();
    drop(tx);
    let receive = move |rx: R, gate: Arc<Barrier>| {
        if barrier {
            gate.wait();
        }
        let mut sum = 0;
        for _ in 0..messages / receivers {
            sum += recv(&rx);
        }
        std::hint::black_box(sum);
        Instant::now()
    };
    let mut ends = Vec::new();
    let helpers: Vec<_> = (1..receivers)
        .map(|_| {
            let (rx, gate) = (clone_rx(&rx), gate.clone());
            std::thread::spawn(move || receive(rx, gate))
        })
        .collect();
    ends.push(if barrier {
        std::thread::spawn(move || receive(rx, gate))
            .join()
            .unwrap()
    } else {
        receive(rx, gate)
    });
    ends.extend(helpers.into_iter().map(|t| t.join().unwrap()));
    let starts: Vec<Instant> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Released by the barrier, the span starts with the first sender; else at the spawns.
    let first = if barrier {
        starts.into_iter().min().unwrap()
    } else {
        start
    };
    (ends.into_iter().max().unwrap() - first).as_nanos() as f64 / messages as f64
}

/// Is std's subject asked for (all subjects, or it alone)?
fn runs_std(only: &Option<String>) -> bool {
    only.as_deref().is_none_or(|o| o == "std-mpsc")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let senders: usize = args.next().map_or(1, |s| s.parse().expect("senders"));
    let rounds: usize = args.next().map_or(7, |r| r.parse().expect("rounds"));
    let barrier = args.next().is_some_and(|a| a == "barrier");
    let only = std::env::var("AB_ONLY").ok();
    let messages: usize =
        std::env::var("AB_MESSAGES").map_or(MESSAGES, |m| m.parse().expect("messages"));
    // `None`: unbounded.
    let cap: Option<usize> = match std::env::var("AB_CAP") {
        Err(_) => Some(messages),
        Ok(c) if c == "unbounded" => None,
        Ok(c) => Some(c.parse().expect("capacity or `unbounded`")),
    };
    let receivers: usize =
        std::env::var("AB_RECEIVERS").map_or(1, |r| r.parse().expect("receivers"));
    assert!(
        senders > 0 && receivers > 0 && senders * receivers <= messages,
        "one to {messages} senders times receivers"
    );
    if receivers > 1 && runs_std(&only) {
        eprintln!("std-mpsc left out: its receiver cannot be shared");
    }
    let runs = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let mut figures = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        if runs("courier") {
            figures[0].push(run(
                messages,
                senders,
                receivers,
                barrier,
                || cap.map_or_else(courier::chan::unbounded, courier::chan::bounded),
                |tx: &courier::chan::Sender<usize>, v| tx.send(v).unwrap(),
                |rx: &courier::chan::Receiver<usize>| rx.recv().unwrap(),
                courier::chan::Receiver::clone,
            ) as u64);
        }
        if runs("crossbeam-channel") {
            figures[1].push(run(
                messages,
                senders,
                receivers,
                barrier,
                || cap.map_or_else(crossbeam_channel::unbounded, crossbeam_channel::bounded),
                |tx: &crossbeam_channel::Sender<usize>, v| tx.send(v).unwrap(),
                |rx: &crossbeam_channel::Receiver<usize>| rx.recv().unwrap(),
                crossbeam_channel::Receiver::clone,
            ) as u64);
        }
        if runs("std-mpsc") && receivers == 1 {
            let recv = |rx: &std::sync::mpsc::Receiver<usize>| rx.recv().unwrap();
            let single =
                |_: &std::sync::mpsc::Receiver<usize>| unreachable!("std's receiver is single");
            figures[2].push(match cap {
                Some(cap) => run(
                    messages,
                    senders,
                    receivers,
                    barrier,
                    || std::sync::mpsc::sync_channel(cap),
                    |tx: &std::sync::mpsc::SyncSender<usize>, v| tx.send(v).unwrap(),
                    recv,
                    single,
                ),
                None => run(
                    messages,
                    senders,
                    receivers,
                    barrier,
                    std::sync::mpsc::channel,
                    |tx: &std::sync::mpsc::Sender<usize>, v| tx.send(v).unwrap(),
                    recv,
                    single,
                ),
            } as u64);
        }
    }
    for (name, v) in ["courier", "crossbeam-channel", "std-mpsc"]
        .iter()
        .zip(&mut figures)
    {
        if !v.is_empty() {
            v.sort_unstable();
            println!("{name:<18}{v:?}");
        }
    }
}
