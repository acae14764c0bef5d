//! Property tests of `chan`: every flavor against a `VecDeque` model (single thread), and
//! random concurrent plans of try/blocking/timed operations and disconnects (threads), checking
//! per-sender FIFO order, no loss, no duplication and exact drop counts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use courier::chan::{self, Receiver, Sender, TryRecvError, TrySendError};
use proptest::prelude::*;

/// A message that counts its drops.
#[derive(Debug)]
struct Msg {
    producer: usize,
    seq: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Msg {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug)]
enum Flavor {
    Bounded(usize),
    Unbounded,
}

fn flavor() -> impl Strategy<Value = Flavor> {
    prop_oneof![
        (1usize..5).prop_map(Flavor::Bounded),
        Just(Flavor::Unbounded)
    ]
}

fn make<T>(f: Flavor) -> (Sender<T>, Receiver<T>) {
    match f {
        Flavor::Bounded(n) => chan::bounded(n),
        Flavor::Unbounded => chan::unbounded(),
    }
}

// ===== single thread, against a model =====

#[derive(Clone, Debug)]
enum Op {
    TrySend,
    TryRecv,
    CloneSender,
    DropSender,
    CloneReceiver,
    DropReceiver,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::TrySend),
        6 => Just(Op::TryRecv),
        1 => Just(Op::CloneSender),
        1 => Just(Op::DropSender),
        1 => Just(Op::CloneReceiver),
        1 => Just(Op::DropReceiver),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 8 } else { 256 }, ..ProptestConfig::default() })]

    #[test]
    fn matches_a_vecdeque(f in flavor(), ops in prop::collection::vec(op(), 0..200)) {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = make::<Msg>(f);
        let mut txs = vec![tx];
        let mut rxs = vec![rx];
        let cap = match f { Flavor::Bounded(n) => n, Flavor::Unbounded => usize::MAX };
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut next = 0u64;
        let mut created = 0usize;
        let mut senders_gone = false;
        let mut receivers_gone = false;
        for op in ops {
            match op {
                Op::TrySend => {
                    let Some(tx) = txs.first() else { continue };
                    created += 1;
                    let m = Msg { producer: 0, seq: next, drops: drops.clone() };
                    match tx.try_send(m) {
                        Ok(()) => {
                            prop_assert!(!receivers_gone && model.len() < cap);
                            model.push_back(next);
                        }
                        Err(TrySendError::Full(m)) => {
                            prop_assert!(!receivers_gone && model.len() == cap);
                            prop_assert_eq!(m.seq, next);
                        }
                        Err(TrySendError::Disconnected(m)) => {
                            prop_assert!(receivers_gone);
                            prop_assert_eq!(m.seq, next);
                        }
                    }
                    next += 1;
                }
                Op::TryRecv => {
                    let Some(rx) = rxs.first() else { continue };
                    match rx.try_recv() {
                        Ok(m) => prop_assert_eq!(Some(m.seq), model.pop_front()),
                        Err(TryRecvError::Empty) => prop_assert!(model.is_empty() && !senders_gone),
                        Err(TryRecvError::Disconnected) => prop_assert!(model.is_empty() && senders_gone),
                    }
                }
                Op::CloneSender => if let Some(tx) = txs.first() { txs.push(tx.clone()) },
                Op::CloneReceiver => if let Some(rx) = rxs.first() { rxs.push(rx.clone()) },
                Op::DropSender => {
                    txs.pop();
                    senders_gone |= txs.is_empty();
                }
                Op::DropReceiver => {
                    rxs.pop();
                    if rxs.is_empty() && !receivers_gone {
                        receivers_gone = true;
                        // The unbounded flavor drops its messages as soon as the last receiver
                        // leaves; the bounded one when the channel itself goes away.
                        if matches!(f, Flavor::Unbounded) {
                            model.clear();
                        }
                    }
                }
            }
            if let Some(rx) = rxs.first() {
                prop_assert_eq!(rx.len(), model.len());
            }
            // Every message not in the channel has been dropped exactly once.
            if !receivers_gone {
                prop_assert_eq!(drops.load(Ordering::SeqCst), created - model.len());
            }
        }
        drop(txs);
        drop(rxs);
        prop_assert_eq!(drops.load(Ordering::SeqCst), created);
    }
}

// ===== threads: random plans =====

#[derive(Clone, Copy, Debug)]
enum SendKind {
    Blocking,
    SpinTry,
    Timed,
}

#[derive(Clone, Copy, Debug)]
enum RecvKind {
    Blocking,
    SpinTry,
    Timed,
}

#[derive(Clone, Debug)]
struct Plan {
    flavor: Flavor,
    /// Per producer: how it sends each of its messages.
    producers: Vec<Vec<SendKind>>,
    /// Per consumer: how it receives, and after how many messages it quits (None: to the end).
    consumers: Vec<(RecvKind, Option<usize>)>,
}

fn plan() -> impl Strategy<Value = Plan> {
    let send_kind = prop_oneof![
        Just(SendKind::Blocking),
        Just(SendKind::SpinTry),
        Just(SendKind::Timed)
    ];
    let recv_kind = prop_oneof![
        Just(RecvKind::Blocking),
        Just(RecvKind::SpinTry),
        Just(RecvKind::Timed)
    ];
    (
        flavor(),
        prop::collection::vec(prop::collection::vec(send_kind, 0..60), 1..4),
        prop::collection::vec((recv_kind, prop::option::weighted(0.3, 0usize..40)), 1..4),
    )
        .prop_map(|(flavor, producers, consumers)| Plan {
            flavor,
            producers,
            consumers,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 48 }, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_plans_keep_order_and_count(p in plan()) {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = make::<Msg>(p.flavor);
        let total: usize = p.producers.iter().map(Vec::len).sum();

        let producers: Vec<_> = p.producers.iter().cloned().enumerate().map(|(id, kinds)| {
            let tx = tx.clone();
            let drops = drops.clone();
            thread::spawn(move || {
                // Returns how many messages came back to us (receivers gone).
                let mut handed_back = 0;
                for (seq, kind) in kinds.into_iter().enumerate() {
                    let mut m = Msg { producer: id, seq: seq as u64, drops: drops.clone() };
                    let back = loop {
                        match kind {
                            SendKind::Blocking => break tx.send(m).err().map(|e| e.into_inner()),
                            SendKind::SpinTry => match tx.try_send(m) {
                                Ok(()) => break None,
                                Err(TrySendError::Full(back)) => { m = back; thread::yield_now(); }
                                Err(TrySendError::Disconnected(back)) => break Some(back),
                            },
                            SendKind::Timed => match tx.send_timeout(m, Duration::from_micros(50)) {
                                Ok(()) => break None,
                                Err(e) if e.is_timeout() => m = e.into_inner(),
                                Err(e) => break Some(e.into_inner()),
                            },
                        }
                    };
                    if let Some(back) = back {
                        assert_eq!((back.producer, back.seq), (id, seq as u64));
                        handed_back += 1;
                    }
                }
                handed_back
            })
        }).collect();
        drop(tx);

        let consumers: Vec<_> = p.consumers.iter().cloned().map(|(kind, quit_after)| {
            let rx = rx.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    if quit_after.is_some_and(|q| got.len() >= q) {
                        break;
                    }
                    let m = match kind {
                        RecvKind::Blocking => match rx.recv() { Ok(m) => m, Err(_) => break },
                        RecvKind::SpinTry => match rx.try_recv() {
                            Ok(m) => m,
                            Err(TryRecvError::Empty) => { thread::yield_now(); continue }
                            Err(TryRecvError::Disconnected) => break,
                        },
                        RecvKind::Timed => match rx.recv_timeout(Duration::from_micros(50)) {
                            Ok(m) => m,
                            Err(e) if e.is_timeout() => continue,
                            Err(_) => break,
                        },
                    };
                    got.push((m.producer, m.seq));
                }
                got
            })
        }).collect();
        drop(rx);

        let mut received: Vec<(usize, u64)> = Vec::new();
        for c in consumers {
            let got = c.join().unwrap();
            // Per-sender FIFO as each consumer saw it.
            let mut last = vec![None; p.producers.len()];
            for &(prod, seq) in &got {
                prop_assert!(last[prod].is_none_or(|l| l < seq), "producer {} out of order", prod);
                last[prod] = Some(seq);
            }
            received.extend(got);
        }
        let handed_back: usize = producers.into_iter().map(|t| t.join().unwrap()).sum();
        let n_received = received.len();
        received.sort_unstable();
        received.dedup();
        prop_assert_eq!(received.len(), n_received, "a message was received twice");
        // Everything sent was received, handed back, or is still in the channel; all of it has
        // been dropped exactly once now that every handle is gone.
        prop_assert!(n_received + handed_back <= total);
        prop_assert_eq!(drops.load(Ordering::SeqCst), total);
        if p.consumers.iter().all(|c| c.1.is_none()) {
            prop_assert_eq!(n_received, total);
        }
    }
}
