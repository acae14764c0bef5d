//! loom models of the lock-free send/recv paths and of the park/wake and disconnect protocol.
//!
//! Run with `scripts/loom.sh` (`RUSTFLAGS="--cfg loom"`, a bounded preemption count). Under
//! loom the unbounded flavor's blocks hold 2 messages, so three messages cross a block boundary,
//! and operations never spin (every wait registers and parks), so the models exercise the
//! register / re-check / park / claim / unpark steps on every path.
#![cfg(loom)]

use courier::chan::{self, RecvError, SendError, TryRecvError};
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A model with a preemption bound unless the caller set one (`LOOM_MAX_PREEMPTIONS`).
fn model(f: impl Fn() + Sync + Send + 'static) {
    model_with_branches(5_000, f);
}

/// [`model`] allowing `max_branches` scheduling decisions per execution (three threads
/// waiting on each other's in-flight operations need more).
fn model_with_branches(max_branches: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    // Waits for a preempted peer (a sender between its claim and its write) spin through
    // scheduling points; allow the paths they make.
    b.max_branches = max_branches;
    b.check(f);
}

/// A message that counts its drops (a plain std atomic: the count is read after the model's
/// threads have joined, so it needs no modelling).
struct D(Arc<AtomicUsize>);

impl Drop for D {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
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

/// Three messages through two slots: the ring's lap wraps while the sender waits for room.
#[test]
fn bounded2_wraps_its_lap() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(2);
        let t = thread::spawn(move || {
            for i in 0..3 {
                tx.send(i).unwrap();
            }
        });
        for i in 0..3 {
            assert_eq!(rx.recv(), Ok(i));
        }
        t.join().unwrap();
    });
}

/// `bounded_recv_wakes_on_send_or_disconnect` over capacity one (`flavors/one.rs`), whose
/// slot's state word carries the whole state and the disconnect mark.
#[test]
fn bounded1_recv_wakes_on_send_or_disconnect() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        let t = thread::spawn(move || {
            tx.send(7).unwrap();
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

/// The same over two slots (`flavors/array.rs`): the blocked sender waits with its message in a
/// hand-off packet, which the disconnection hands back.
#[test]
fn bounded2_blocked_sender_fails_when_receiver_leaves() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(2);
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        let t = thread::spawn(move || tx.send(2));
        drop(rx);
        assert_eq!(t.join().unwrap(), Err(SendError(2)));
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

/// Two senders fill one (loom-sized, two-slot) block and two receivers empty it: the reader of
/// the last slot retires the block, possibly while the other slot's sender has claimed it but
/// not written it yet, or while that slot's receiver, having claimed it ahead, gives it up.
#[test]
fn unbounded_block_retires_behind_a_slow_sender() {
    model(|| {
        let (tx, rx) = chan::unbounded::<u32>();
        let (tx2, rx2) = (tx.clone(), rx.clone());
        let sender = thread::spawn(move || tx2.send(2).unwrap());
        let receiver = thread::spawn(move || rx2.recv().unwrap());
        tx.send(1).unwrap();
        let mine = rx.recv().unwrap();
        let theirs = receiver.join().unwrap();
        sender.join().unwrap();
        assert_eq!(mine + theirs, 3);
    });
}

/// A blocking receiver claims the next position before any sender has (`flavors::list`,
/// "Receivers that claim ahead"); under loom it gives the position up at once unless the
/// message is already there. The sender that then finds its slot abandoned takes the message
/// back and sends it at the next position, and whichever of that sender and the reader of the
/// block's last slot finishes last frees the block. (Two messages first, so that the claim is
/// at the first slot of the second block: loom blocks hold two, and the last slot is never
/// claimed ahead.)
#[test]
fn unbounded_abandoned_position_is_skipped_in_order() {
    model(|| {
        let (tx, rx) = chan::unbounded::<u32>();
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(rx.try_recv(), Ok(1));
        let t = thread::spawn(move || {
            tx.send(2).unwrap();
            tx.send(3).unwrap();
        });
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(rx.recv(), Ok(3));
        assert_eq!(rx.recv(), Err(RecvError));
        t.join().unwrap();
    });
}

/// The last receiver gives up a position it claimed ahead and leaves, while a sender claims that
/// position: the sender finds it abandoned and takes its message back while the leaving
/// receiver discards what is left, and the block is freed once, after both are done with it.
/// The message is received, or handed back to the sender, and dropped exactly once.
#[test]
fn unbounded_receiver_leaves_after_giving_up_a_position() {
    use std::time::Duration;
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::unbounded::<D>();
        // As above: the claim ahead is then at the first slot of the second block.
        for _ in 0..2 {
            tx.send(D(drops.clone())).unwrap();
            drop(rx.try_recv().unwrap());
        }
        let d2 = drops.clone();
        let t = thread::spawn(move || {
            if let Err(e) = tx.send(D(d2)) {
                drop(e.into_inner());
            }
        });
        // A deadline already passed (which under loom still claims ahead, as a deadline
        // that passes during the claim does): give the position up unless the message is
        // there.
        drop(rx.recv_timeout(Duration::ZERO));
        drop(rx);
        t.join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 3);
    });
}

/// A receiver whose position holds a message, or will once its sender writes it (`HAS_NEXT`:
/// `tail` is in a later block), claims it without reading `tail` (`Claim::Filled`, the inline
/// receive path) and waits for the write if the sender has not finished it. Loom blocks hold
/// two messages: the positions 2 and 3 are claimed by two senders racing each other and the
/// receiver, and reading the last slot of the first block sees the third block linked (so
/// `HAS_NEXT` is set for position 2) when the sender of position 3 got there first.
#[test]
fn unbounded_claims_a_filled_position_while_its_sender_writes() {
    model(|| {
        let (tx, rx) = chan::unbounded::<u32>();
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        let tx2 = tx.clone();
        let s1 = thread::spawn(move || tx.send(10).unwrap());
        let s2 = thread::spawn(move || tx2.send(20).unwrap());
        assert_eq!(rx.recv(), Ok(0));
        assert_eq!(rx.recv(), Ok(1));
        let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort_unstable();
        assert_eq!(got, [10, 20]);
        assert_eq!(rx.recv(), Err(RecvError));
        s1.join().unwrap();
        s2.join().unwrap();
    });
}

/// Two receivers, two messages, and the sender stays connected until both receivers have one
/// (so a disconnect cannot paper over a lost wake-up): a receiver that parks must be woken for
/// a message even when the other one was polling as it arrived.
fn two_receivers_each_get_one(make: fn() -> (chan::Sender<u32>, chan::Receiver<u32>)) {
    model_with_branches(20_000, move || {
        let (tx, rx) = make();
        let rx2 = rx.clone();
        // The receivers are spawned and the sender is this thread, which never waits on the
        // channel: loom lets a late `unpark` of a thread wake it from a `join` (a real thread
        // would ignore it), so the joining thread must not have been a waiter.
        let t1 = thread::spawn(move || rx.recv().unwrap());
        let t2 = thread::spawn(move || rx2.recv().unwrap());
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        let got = t1.join().unwrap() + t2.join().unwrap();
        assert_eq!(got, 3);
        drop(tx);
    });
}

#[test]
fn unbounded_two_receivers_each_get_one() {
    two_receivers_each_get_one(chan::unbounded);
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

/// Two threads receive from one oneshot end: the message must wake both (one gets it, the
/// other finds it taken), whichever has parked when it comes.
#[test]
fn oneshot_wakes_every_receiver() {
    model_with_branches(20_000, || {
        // The receivers are spawned and the main thread sends: a receiver may be unparked
        // after it has returned, and loom (unlike std, which keeps a token) fails a thread
        // that an `unpark` reaches while it waits in `join`.
        let (tx, rx) = chan::oneshot::<u32>();
        let rx = Arc::new(rx);
        let receivers: Vec<_> = (0..2)
            .map(|_| {
                let rx = Arc::clone(&rx);
                thread::spawn(move || rx.recv())
            })
            .collect();
        assert!(tx.send(3).is_ok());
        let mut got: Vec<_> = receivers.into_iter().map(|r| r.join().unwrap()).collect();
        got.sort_by_key(|r| r.is_err());
        assert_eq!(got, [Ok(3), Err(RecvError)]);
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

#[test]
fn select_ready_wakes_on_send() {
    model(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        // The watcher is spawned: see `two_receivers_each_get_one` on loom and `join`.
        let t = thread::spawn(move || {
            let mut sel = chan::Select::new();
            let i = sel.recv(&rx);
            assert_eq!(sel.ready(), i);
            drop(sel);
            rx.try_recv()
        });
        tx.send(1).unwrap();
        assert_eq!(t.join().unwrap(), Ok(1));
    });
}
