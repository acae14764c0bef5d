//! `select_rx` from the `chan` suite, courier against crossbeam-channel in one process, taking
//! turns: four senders, each on its own channel, and one receiver selecting over the four; every
//! thread released by one barrier, the span from the first start to the last end.
//!
//! `select_ab [capacity] [messages] [rounds]` (default 1, 100,000, 7). `AB_ONLY=<subject>` runs
//! that subject alone (to profile it); `AB_ACTIVE=n` gives only the first `n` channels a sender
//! (the receiver still selects over all four). Prints each subject's ns per message, sorted.

use std::sync::{Arc, Barrier};
use std::time::Instant;

const SENDERS: usize = 4;

/// The operations a subject offers, so that one driver runs them all.
trait Subject {
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    fn make(cap: usize) -> (Self::Tx, Self::Rx);
    fn send(tx: &Self::Tx, v: usize);
    fn select_recv(rxs: &[Self::Rx]) -> usize;
}

struct Courier;
struct Crossbeam;

impl Subject for Courier {
    type Tx = courier::chan::Sender<usize>;
    type Rx = courier::chan::Receiver<usize>;
    fn make(cap: usize) -> (Self::Tx, Self::Rx) {
        courier::chan::bounded(cap)
    }
    fn send(tx: &Self::Tx, v: usize) {
        tx.send(v).unwrap();
    }
    fn select_recv(rxs: &[Self::Rx]) -> usize {
        let mut sel = courier::chan::Select::new();
        for rx in rxs {
            sel.recv(rx);
        }
        let op = sel.select();
        let i = op.index();
        op.recv(&rxs[i]).unwrap()
    }
}

impl Subject for Crossbeam {
    type Tx = crossbeam_channel::Sender<usize>;
    type Rx = crossbeam_channel::Receiver<usize>;
    fn make(cap: usize) -> (Self::Tx, Self::Rx) {
        crossbeam_channel::bounded(cap)
    }
    fn send(tx: &Self::Tx, v: usize) {
        tx.send(v).unwrap();
    }
    fn select_recv(rxs: &[Self::Rx]) -> usize {
        let mut sel = crossbeam_channel::Select::new();
        for rx in rxs {
            sel.recv(rx);
        }
        let op = sel.select();
        let i = op.index();
        op.recv(&rxs[i]).unwrap()
    }
}

/// ns per message.
fn run<S: Subject>(cap: usize, messages: usize, active: usize) -> f64 {
    let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..SENDERS).map(|_| S::make(cap)).unzip();
    // The idle channels stay connected (a select would take their disconnection).
    let idle = txs.split_off(active);
    let per_sender = messages / active;
    let gate = Arc::new(Barrier::new(active + 1));
    let senders: Vec<_> = txs
        .into_iter()
        .map(|tx| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.wait();
                let start = Instant::now();
                for i in 0..per_sender {
                    S::send(&tx, i);
                }
                // Connected until the receiver is done (a select sees no disconnection).
                (start, tx)
            })
        })
        .collect();
    let receiver = std::thread::spawn(move || {
        gate.wait();
        let mut sum = 0;
        for _ in 0..per_sender * active {
            sum += S::select_recv(&rxs);
        }
        std::hint::black_box(sum);
        Instant::now()
    });
    let end = receiver.join().unwrap();
    drop(idle);
    let first = senders
        .into_iter()
        .map(|t| t.join().unwrap().0)
        .min()
        .unwrap();
    (end - first).as_nanos() as f64 / (per_sender * active) as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cap: usize = args.next().map_or(1, |c| c.parse().expect("capacity"));
    let messages: usize = args
        .next()
        .map_or(100_000, |m| m.parse().expect("messages"));
    let rounds: usize = args.next().map_or(7, |r| r.parse().expect("rounds"));
    assert!(
        cap > 0 && messages >= SENDERS,
        "capacity >= 1, messages >= {SENDERS}"
    );
    let active = std::env::var("AB_ACTIVE")
        .ok()
        .map_or(SENDERS, |a| a.parse().expect("AB_ACTIVE"));
    assert!(
        (1..=SENDERS).contains(&active),
        "1 <= AB_ACTIVE <= {SENDERS}"
    );
    let only = std::env::var("AB_ONLY").ok();
    let runs = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        if runs("courier") {
            ours.push(run::<Courier>(cap, messages, active) as u64);
        }
        if runs("crossbeam-channel") {
            theirs.push(run::<Crossbeam>(cap, messages, active) as u64);
        }
    }
    for (name, v) in [("courier", &mut ours), ("crossbeam-channel", &mut theirs)] {
        if !v.is_empty() {
            v.sort_unstable();
            println!("{name:<18}{v:?}");
        }
    }
}
