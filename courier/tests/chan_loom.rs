//! loom models of the lock-free send/recv paths and of the park/wake and disconnect protocol.
//!
//! Run with `scripts/loom.sh` (`RUSTFLAGS="--cfg loom"`, a bounded preemption count). Under
//! loom the unbounded flavor's blocks hold 2 messages, so three messages cross a block boundary,
//! and operations never spin (every wait registers and parks), so the models exercise the
//! register / re-check / park / claim / unpark steps on every path.
#![cfg(loom)]

use courier::chan::{self, RecvError, SendError, TryRecvError};
use loom::thread;

/// A model with a preemption bound unless the caller set one (`LOOM_MAX_PREEMPTIONS`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    // Waits for a preempted peer (a sender between its claim and its write) spin through
    // scheduling points; allow the paths they make.
    b.max_branches = 5_000;
    b.check(f);
}

#[test]
fn bounded1_send_blocks_until_recv() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        let t = thread::spawn(move || {
            tx.send(1).unwrap();
            tx.send(2).unwrap(); // waits for room unless the receiver was quick
        });
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Ok(2));
        t.join().unwrap();
    });
}

#[test]
fn bounded_recv_wakes_on_send_or_disconnect() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(2);
        let t = thread::spawn(move || {
            tx.send(7).unwrap();
            // dropping `tx` disconnects
        });
        assert_eq!(rx.recv(), Ok(7));
        assert_eq!(rx.recv(), Err(RecvError));
        t.join().unwrap();
    });
}

#[test]
fn bounded_blocked_sender_fails_when_receiver_leaves() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        tx.send(0).unwrap();
        let t = thread::spawn(move || tx.send(1));
        drop(rx);
        assert_eq!(t.join().unwrap(), Err(SendError(1)));
    });
}

#[test]
fn bounded_two_senders_no_loss() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        let tx2 = tx.clone();
        let a = thread::spawn(move || tx.send(1).unwrap());
        let b = thread::spawn(move || tx2.send(2).unwrap());
        let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        assert_eq!(rx.recv(), Err(RecvError));
        a.join().unwrap();
        b.join().unwrap();
    });
}

#[test]
fn unbounded_crosses_blocks_in_order() {
    model(|| {
        let (tx, rx) = chan::unbounded::<u32>();
        let t = thread::spawn(move || {
            for i in 0..3 {
                tx.send(i).unwrap();
            }
        });
        for i in 0..3 {
            assert_eq!(rx.recv(), Ok(i));
        }
        assert_eq!(rx.recv(), Err(RecvError));
        t.join().unwrap();
    });
}

#[test]
fn unbounded_receiver_drop_discards_while_sending() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct D(Arc<AtomicUsize>);
    impl Drop for D {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::unbounded::<D>();
        let d2 = drops.clone();
        let t = thread::spawn(move || {
            let mut failed = 0;
            for _ in 0..3 {
                if let Err(e) = tx.send(D(d2.clone())) {
                    drop(e.into_inner());
                    failed += 1;
                }
            }
            failed
        });
        drop(rx);
        t.join().unwrap();
        // Every message, delivered or handed back, was dropped exactly once.
        assert_eq!(drops.load(Ordering::SeqCst), 3);
    });
}

#[test]
fn unbounded_two_receivers_split_messages() {
    model(|| {
        let (tx, rx) = chan::unbounded::<u32>();
        let rx2 = rx.clone();
        let t = thread::spawn(move || rx2.recv().ok());
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        let mine: Vec<u32> = rx.iter().collect();
        let theirs = t.join().unwrap();
        let mut all: Vec<u32> = mine.into_iter().chain(theirs).collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
    });
}

#[test]
fn rendezvous_hand_off() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(0);
        let t = thread::spawn(move || tx.send(5));
        assert_eq!(rx.recv(), Ok(5));
        assert_eq!(t.join().unwrap(), Ok(()));
    });
}

#[test]
fn rendezvous_disconnect_wakes_receiver() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(0);
        let t = thread::spawn(move || drop(tx));
        assert_eq!(rx.recv(), Err(RecvError));
        t.join().unwrap();
    });
}

#[test]
fn oneshot_send_recv_and_drop() {
    model(|| {
        let (tx, rx) = chan::oneshot::<u32>();
        let t = thread::spawn(move || tx.send(3).is_ok());
        let got = rx.recv();
        assert!(t.join().unwrap());
        assert_eq!(got, Ok(3));
    });
    model(|| {
        let (tx, rx) = chan::oneshot::<u32>();
        let t = thread::spawn(move || drop(tx));
        assert_eq!(rx.recv(), Err(RecvError));
        t.join().unwrap();
    });
}

#[test]
fn select_over_two_receivers() {
    model(|| {
        let (tx1, rx1) = chan::bounded::<u32>(1);
        let (tx2, rx2) = chan::unbounded::<u32>();
        let t = thread::spawn(move || {
            tx2.send(2).unwrap();
            drop(tx1);
        });
        let mut sel = chan::Select::new();
        let i1 = sel.recv(&rx1);
        let i2 = sel.recv(&rx2);
        let op = sel.select();
        if op.index() == i1 {
            assert_eq!(op.recv(&rx1), Err(RecvError)); // disconnected first
        } else {
            assert_eq!(op.index(), i2);
            assert_eq!(op.recv(&rx2), Ok(2));
        }
        t.join().unwrap();
        assert!(matches!(rx1.try_recv(), Err(TryRecvError::Disconnected)));
    });
}
