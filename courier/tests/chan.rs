//! Behaviour of every `chan` flavor through the public API: one suite, run against each
//! constructor, so that every flavor keeps the same contract.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod watchdog;
use watchdog::with_watchdog;

use courier::chan::{
    self, Receiver, RecvError, RecvTimeoutError, Select, SendError, SendTimeoutError, Sender,
    TryRecvError, TrySendError,
};

/// Small under Miri, meaningful otherwise.
const N: usize = if cfg!(miri) { 50 } else { 10_000 };

/// Every buffered constructor, by name (rendezvous has its own tests: it never buffers).
/// A channel's two ends.
type Pair<T> = (Sender<T>, Receiver<T>);

fn buffered<T>() -> Vec<(&'static str, Pair<T>)> {
    vec![
        ("bounded(1)", chan::bounded(1)),
        ("bounded(3)", chan::bounded(3)),
        ("bounded(64)", chan::bounded(64)),
        ("unbounded", chan::unbounded()),
    ]
}

/// Every constructor, rendezvous included.
fn all<T>() -> Vec<(&'static str, Pair<T>)> {
    let mut v = buffered();
    v.push(("bounded(0)", chan::bounded(0)));
    v
}

/// Counts drops, to prove each message is dropped exactly once.
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn try_ops_and_capacity() {
    for (name, (tx, rx)) in buffered::<u32>() {
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "{name}");
        assert!(tx.is_empty() && rx.is_empty(), "{name}");
        tx.try_send(1).unwrap();
        assert_eq!(tx.len(), 1, "{name}");
        assert_eq!(rx.try_recv(), Ok(1), "{name}");
        match tx.capacity() {
            Some(cap) => {
                for i in 0..cap as u32 {
                    tx.try_send(i).unwrap();
                }
                assert!(tx.is_full(), "{name}");
                assert_eq!(tx.len(), cap, "{name}");
                assert_eq!(tx.try_send(99), Err(TrySendError::Full(99)), "{name}");
                assert_eq!(rx.try_iter().count(), cap, "{name}");
            }
            None => {
                for i in 0..100 {
                    tx.try_send(i).unwrap();
                }
                assert_eq!(rx.len(), 100, "{name}");
                assert_eq!(
                    rx.try_iter().collect::<Vec<_>>(),
                    (0..100).collect::<Vec<_>>()
                );
            }
        }
        assert!(rx.is_empty(), "{name}");
    }
    let (tx, rx) = chan::bounded::<u32>(0);
    assert_eq!(tx.capacity(), Some(0));
    assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(chan::unbounded::<u8>().0.capacity(), None);
}

#[test]
fn fifo_single_thread_across_blocks() {
    // 100 messages cross several 31-slot blocks of the unbounded flavor and wrap the rings.
    for (name, (tx, rx)) in buffered::<usize>() {
        for round in 0..10 {
            let burst = tx.capacity().unwrap_or(100).min(100);
            for i in 0..burst {
                tx.send(round * 1000 + i).unwrap();
            }
            for i in 0..burst {
                assert_eq!(rx.recv(), Ok(round * 1000 + i), "{name}");
            }
        }
    }
}

#[test]
fn disconnect_by_senders_drains_then_fails() {
    for (name, (tx, rx)) in buffered::<u32>() {
        tx.send(7).unwrap();
        let tx2 = tx.clone();
        drop(tx);
        assert!(!rx.is_disconnected(), "{name}");
        drop(tx2);
        assert!(rx.is_disconnected(), "{name}");
        assert_eq!(rx.recv(), Ok(7), "{name}");
        assert_eq!(rx.recv(), Err(RecvError), "{name}");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{name}");
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Disconnected),
            "{name}"
        );
    }
    let (tx, rx) = chan::bounded::<u32>(0);
    drop(tx);
    assert_eq!(rx.recv(), Err(RecvError));
}

#[test]
fn disconnect_by_receivers_hands_message_back() {
    for (name, (tx, rx)) in all::<String>() {
        let rx2 = rx.clone();
        drop(rx);
        drop(rx2);
        assert!(tx.is_disconnected(), "{name}");
        let err = tx.send("lost".to_string()).unwrap_err();
        assert_eq!(err.into_inner(), "lost", "{name}");
        assert_eq!(
            tx.try_send("x".into()),
            Err(TrySendError::Disconnected("x".into())),
            "{name}"
        );
        assert!(matches!(
            tx.send_timeout("y".into(), Duration::from_millis(1)),
            Err(SendTimeoutError::Disconnected(m)) if m == "y"
        ));
    }
}

#[test]
fn errors_debug_without_t_debug() {
    struct Opaque;
    let (tx, rx) = chan::bounded::<Opaque>(1);
    drop(rx);
    let e = tx.send(Opaque).unwrap_err();
    assert_eq!(format!("{e:?}"), "SendError { .. }");
    assert_eq!(format!("{e}"), "sending on a disconnected channel");
    let e = tx.try_send(Opaque).unwrap_err();
    assert_eq!(format!("{e:?}"), "Disconnected(..)");
    assert!(e.is_disconnected());
    // Errors are std errors (`?` into Box<dyn Error>).
    let boxed: Box<dyn std::error::Error> = Box::new(SendError(Opaque));
    assert!(boxed.to_string().contains("disconnected"));
}

/// A receiver that times out on an empty unbounded channel gives up the positions it claimed
/// ahead of the senders (`flavors::list`): the channel still counts as empty, and the next
/// messages skip those positions and arrive in order.
#[test]
fn unbounded_receiver_that_gives_up_leaves_nothing_behind() {
    let (tx, rx) = chan::unbounded::<u32>();
    tx.send(0).unwrap();
    assert_eq!(rx.recv(), Ok(0));
    for _ in 0..3 {
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Timeout)
        );
        assert_eq!(rx.len(), 0);
        assert!(rx.is_empty());
    }
    for i in 1..=40 {
        tx.send(i).unwrap();
    }
    assert_eq!(rx.len(), 40);
    assert_eq!(rx.try_recv(), Ok(1));
    for i in 2..=40 {
        assert_eq!(rx.recv(), Ok(i));
    }
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    drop(tx);
    assert_eq!(rx.recv(), Err(RecvError));
}

#[test]
fn timeouts_expire() {
    for (name, (tx, rx)) in all::<u32>() {
        let start = Instant::now();
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout),
            "{name}"
        );
        assert!(start.elapsed() >= Duration::from_millis(20), "{name}");
        assert_eq!(
            rx.recv_deadline(Instant::now()),
            Err(RecvTimeoutError::Timeout),
            "{name}"
        );
        if let Some(cap) = tx.capacity() {
            for i in 0..cap as u32 {
                tx.send(i).unwrap();
            }
            assert_eq!(
                tx.send_timeout(9, Duration::from_millis(10)),
                Err(SendTimeoutError::Timeout(9)),
                "{name}"
            );
        }
    }
}

#[test]
fn blocking_wakes_across_threads() {
    for (name, (tx, rx)) in all::<usize>() {
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            for i in 0..100 {
                tx.send(i).unwrap();
            }
        });
        // The receiver parks (the sender sleeps first), then is woken.
        for i in 0..100 {
            assert_eq!(rx.recv(), Ok(i), "{name}");
        }
        t.join().unwrap();
        assert_eq!(rx.recv(), Err(RecvError), "{name}");
    }
}

#[test]
fn blocked_sender_wakes_on_receive_and_on_disconnect() {
    for (name, (tx, rx)) in [
        ("bounded(1)", chan::bounded(1)),
        ("bounded(0)", chan::bounded(0)),
    ] {
        if tx.capacity() == Some(1) {
            tx.send(0u32).unwrap();
        }
        let t = thread::spawn(move || tx.send(1));
        thread::sleep(Duration::from_millis(5));
        drop(rx); // the parked sender must fail, with its message
        assert_eq!(t.join().unwrap(), Err(SendError(1)), "{name}");
    }
}

#[test]
fn rendezvous_pairs_exactly() {
    let (tx, rx) = chan::bounded::<usize>(0);
    let t = thread::spawn(move || {
        for i in 0..N {
            tx.send(i).unwrap();
        }
    });
    for i in 0..N {
        assert_eq!(rx.recv(), Ok(i));
    }
    t.join().unwrap();
}

#[test]
fn dropping_a_channel_drops_queued_messages_once() {
    for (name, (tx, rx)) in buffered::<Counted>() {
        let drops = Arc::new(AtomicUsize::new(0));
        let n = tx.capacity().unwrap_or(70).min(70);
        for _ in 0..n {
            tx.send(Counted(drops.clone())).unwrap();
        }
        drop(rx.recv().unwrap());
        assert_eq!(drops.load(Ordering::SeqCst), 1, "{name}");
        drop(tx);
        drop(rx);
        assert_eq!(drops.load(Ordering::SeqCst), n, "{name}");
    }
    // Receivers gone first: the message handed back by a failed send is the caller's.
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = chan::unbounded();
    tx.send(Counted(drops.clone())).unwrap();
    drop(rx);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    let back = tx.send(Counted(drops.clone())).unwrap_err().into_inner();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    drop(back);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

/// A message whose drop counts, and panics if told to.
struct Bomb {
    drops: Arc<AtomicUsize>,
    explodes: bool,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.explodes {
            panic!("a message's drop panics (on purpose)");
        }
    }
}

#[test]
fn a_message_whose_drop_panics_does_not_keep_the_others_from_being_dropped() {
    let bombs = |drops: &Arc<AtomicUsize>, tx: &Sender<Bomb>, n: usize| {
        for i in 0..n {
            let explodes = i == n / 2;
            tx.send(Bomb {
                drops: drops.clone(),
                explodes,
            })
            .unwrap();
        }
    };
    // The last handle drops the channel, and the panic surfaces there.
    for (name, (tx, rx)) in buffered::<Bomb>() {
        let drops = Arc::new(AtomicUsize::new(0));
        let n = tx.capacity().unwrap_or(70).min(70);
        bombs(&drops, &tx, n);
        drop(tx);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
        assert!(dropped.is_err(), "{name}: the panic reaches the caller");
        assert_eq!(
            drops.load(Ordering::SeqCst),
            n,
            "{name}: every message dropped once"
        );
    }
    // Unbounded, receivers first: the last receiver drops the messages while a sender is alive
    // (three blocks' worth), and the channel stays usable.
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = chan::unbounded();
    bombs(&drops, &tx, 70);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rx)));
    assert!(dropped.is_err());
    assert_eq!(drops.load(Ordering::SeqCst), 70);
    let back = tx
        .send(Bomb {
            drops: drops.clone(),
            explodes: false,
        })
        .unwrap_err()
        .into_inner();
    drop(back);
    assert!(tx.is_empty());
    drop(tx);
    assert_eq!(drops.load(Ordering::SeqCst), 71);
}

#[test]
fn iterators() {
    let (tx, rx) = chan::unbounded();
    for i in 0..5 {
        tx.send(i).unwrap();
    }
    assert_eq!(rx.try_iter().take(2).collect::<Vec<_>>(), [0, 1]);
    drop(tx);
    assert_eq!((&rx).into_iter().collect::<Vec<_>>(), [2, 3, 4]);
    let (tx, rx) = chan::bounded(2);
    let t = thread::spawn(move || (0..10).for_each(|i| tx.send(i).unwrap()));
    assert_eq!(rx.into_iter().sum::<i32>(), 45);
    t.join().unwrap();
}

#[test]
fn same_channel_and_debug() {
    let (tx, rx) = chan::unbounded::<u8>();
    let (tx2, _rx2) = chan::unbounded::<u8>();
    assert!(tx.same_channel(&tx.clone()));
    assert!(!tx.same_channel(&tx2));
    assert!(rx.same_channel(&rx.clone()));
    assert_eq!(format!("{tx:?} {rx:?}"), "Sender { .. } Receiver { .. }");
}

// ===== select =====

#[test]
fn select_picks_the_ready_receiver() {
    let (tx1, rx1) = chan::unbounded::<u32>();
    let (tx2, rx2) = chan::bounded::<u32>(1);
    let (_tx3, rx3) = chan::bounded::<u32>(0);
    tx2.send(2).unwrap();
    let mut sel = Select::new();
    let i1 = sel.recv(&rx1);
    let i2 = sel.recv(&rx2);
    let i3 = sel.recv(&rx3);
    let op = sel.select();
    assert_eq!(op.index(), i2);
    assert_eq!(op.recv(&rx2), Ok(2));
    assert!(sel.try_select().is_err());
    tx1.send(1).unwrap();
    let op = sel.select_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(op.index(), i1);
    assert_eq!(op.recv(&rx1), Ok(1));
    assert!(sel.select_timeout(Duration::from_millis(10)).is_err());
    let _ = i3;
}

#[test]
fn select_over_a_oneshot_and_a_channel() {
    // Ready at once: the oneshot's message wins over an empty channel.
    let (_jobs_tx, jobs) = chan::unbounded::<u32>();
    let (reply_tx, reply) = chan::oneshot::<&str>();
    reply_tx.send("done").unwrap();
    let mut sel = Select::new();
    let j = sel.recv(&jobs);
    let r = sel.recv(&reply);
    let op = sel.select();
    assert_eq!(op.index(), r);
    assert_eq!(op.recv(&reply), Ok("done"));
    // Taken: the oneshot stays ready, with an error (as `recv` would give).
    let op = sel.select_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(op.index(), r);
    assert_eq!(op.recv(&reply), Err(RecvError));
    let _ = j;

    // Blocking: woken by a send from another thread, and by the sender's drop.
    for send in [true, false] {
        let (tx, rx) = chan::oneshot::<u32>();
        let (_keep, idle) = chan::bounded::<u32>(0);
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            if send {
                tx.send(7).unwrap();
            }
        });
        let mut sel = Select::new();
        sel.recv(&idle);
        let i = sel.recv(&rx);
        let op = sel.select_timeout(Duration::from_secs(20)).expect("woken");
        assert_eq!(op.index(), i);
        let expect = if send { Ok(7) } else { Err(RecvError) };
        assert_eq!(op.recv(&rx), expect);
        t.join().unwrap();
    }

    // `ready` watches a oneshot too, and `select!` takes one.
    let (tx, rx) = chan::oneshot::<u32>();
    let mut sel = Select::new();
    let i = sel.recv(&rx);
    assert!(sel.try_ready().is_err());
    let t = thread::spawn(move || tx.send(3).unwrap());
    assert_eq!(sel.ready_timeout(Duration::from_secs(20)), Ok(i));
    t.join().unwrap();
    let got = courier::select! {
        recv(rx) -> msg => msg,
        default(Duration::from_secs(5)) => Err(RecvError),
    };
    assert_eq!(got, Ok(3));
}

#[test]
fn select_blocks_until_a_peer_arrives() {
    for kind in ["bounded(0)", "bounded(1)", "unbounded"] {
        let make = || match kind {
            "bounded(0)" => chan::bounded::<u32>(0),
            "bounded(1)" => chan::bounded::<u32>(1),
            _ => chan::unbounded::<u32>(),
        };
        let (tx1, rx1) = make();
        let (tx2, rx2) = make();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            tx2.send(22).unwrap();
            tx1
        });
        let mut sel = Select::new();
        let _i1 = sel.recv(&rx1);
        let i2 = sel.recv(&rx2);
        let op = sel.select();
        assert_eq!(op.index(), i2, "{kind}");
        assert_eq!(op.recv(&rx2), Ok(22), "{kind}");
        drop(t.join().unwrap());
    }
}

#[test]
fn select_send_to_a_waiting_receiver() {
    let (tx, rx) = chan::bounded::<u32>(0);
    let (tx_full, _rx_full) = chan::bounded::<u32>(1);
    tx_full.send(0).unwrap();
    let t = thread::spawn(move || rx.recv());
    let mut sel = Select::new();
    let _full = sel.send(&tx_full);
    let i = sel.send(&tx);
    let op = sel.select();
    assert_eq!(op.index(), i);
    op.send(&tx, 5).unwrap();
    assert_eq!(t.join().unwrap(), Ok(5));
}

#[test]
fn select_sees_disconnection() {
    let (tx, rx) = chan::bounded::<u32>(0);
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(5));
        drop(tx);
    });
    let mut sel = Select::new();
    let i = sel.recv(&rx);
    let op = sel.select();
    assert_eq!(op.index(), i);
    assert_eq!(op.recv(&rx), Err(RecvError));
    t.join().unwrap();
}

#[test]
fn select_send_and_recv_on_one_rendezvous_does_not_match_itself() {
    let (tx, rx) = chan::bounded::<u32>(0);
    let mut sel = Select::new();
    sel.send(&tx);
    sel.recv(&rx);
    assert!(sel.select_timeout(Duration::from_millis(20)).is_err());
}

#[test]
fn select_rendezvous_both_sides_select() {
    // A selecting sender meets a selecting receiver: heap packets on both registrations.
    let (tx, rx) = chan::bounded::<usize>(0);
    let t = thread::spawn(move || {
        for i in 0..200 {
            let mut sel = Select::new();
            sel.send(&tx);
            sel.select().send(&tx, i).unwrap();
        }
    });
    for i in 0..200 {
        let mut sel = Select::new();
        sel.recv(&rx);
        assert_eq!(sel.select().recv(&rx), Ok(i));
    }
    t.join().unwrap();
}

// ===== Select::ready =====

#[test]
fn ready_names_a_ready_operation_and_takes_nothing() {
    let (tx1, rx1) = chan::unbounded::<u32>();
    let (tx2, rx2) = chan::bounded::<u32>(1);
    let (_tx3, rx3) = chan::bounded::<u32>(0);
    let mut sel = Select::new();
    let i1 = sel.recv(&rx1);
    let i2 = sel.recv(&rx2);
    sel.recv(&rx3);
    assert!(sel.try_ready().is_err());
    assert!(sel.ready_timeout(Duration::from_millis(10)).is_err());
    tx2.send(2).unwrap();
    assert_eq!(sel.try_ready(), Ok(i2));
    assert_eq!(sel.ready(), i2);
    // Asking did not take the message.
    assert_eq!(rx2.try_recv(), Ok(2));
    tx1.send(1).unwrap();
    assert_eq!(sel.ready_timeout(Duration::from_secs(5)), Ok(i1));
    assert_eq!(rx1.try_recv(), Ok(1));
    assert!(sel.try_ready().is_err());
}

#[test]
fn ready_on_senders_means_room_or_a_waiting_receiver() {
    let (tx_full, rx_full) = chan::bounded::<u32>(1);
    tx_full.send(0).unwrap();
    let (tx0, rx0) = chan::bounded::<u32>(0);
    let (tx_unbounded, _rx_unbounded) = chan::unbounded::<u32>();
    let mut sel = Select::new();
    let full = sel.send(&tx_full);
    let rendezvous = sel.send(&tx0);
    assert!(sel.try_ready().is_err());
    // A receiver arrives on the rendezvous channel.
    let t = thread::spawn(move || (rx0.recv(), rx0));
    assert_eq!(sel.ready(), rendezvous);
    tx0.send(9).unwrap();
    let (got, _rx0) = t.join().unwrap(); // kept: a disconnected channel is ready too
    assert_eq!(got, Ok(9));
    // Room appears in the full channel.
    assert_eq!(rx_full.recv(), Ok(0));
    assert_eq!(sel.ready(), full);
    // An unbounded sender is always ready.
    let mut sel = Select::new();
    let i = sel.send(&tx_unbounded);
    assert_eq!(sel.try_ready(), Ok(i));
}

#[test]
fn ready_blocks_until_a_peer_arrives_or_leaves() {
    for (kind, (tx, rx)) in all::<u32>() {
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            tx.send(7).unwrap();
            tx
        });
        let mut sel = Select::new();
        let i = sel.recv(&rx);
        assert_eq!(sel.ready(), i, "{kind}");
        assert_eq!(rx.recv(), Ok(7), "{kind}");
        let tx = t.join().unwrap();
        // Disconnection counts as ready.
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            drop(tx);
        });
        assert_eq!(sel.ready(), i, "{kind}");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{kind}");
        t.join().unwrap();
    }
}

/// A thread waiting in `ready` only watches: a blocked receiver of the same channel still gets
/// the wake-up for a message; the watcher (which may find it taken and wait on) sees a change.
#[test]
fn ready_takes_no_wake_up_from_a_blocked_receiver() {
    for (kind, (tx, rx)) in buffered::<u32>() {
        let rx2 = rx.clone();
        let (done_tx, done) = std::sync::mpsc::channel();
        thread::spawn(move || done_tx.send(rx2.recv()));
        let rx3 = rx.clone();
        let watcher = thread::spawn(move || {
            let mut sel = Select::new();
            let i = sel.recv(&rx3);
            sel.ready() == i
        });
        // Let both wait.
        thread::sleep(Duration::from_millis(20));
        tx.send(3).unwrap();
        // A stolen wake-up would leave the receiver asleep with the message in the channel.
        let got = done.recv_timeout(Duration::from_secs(20));
        assert_eq!(got, Ok(Ok(3)), "{kind}");
        tx.send(4).unwrap();
        assert!(watcher.join().unwrap(), "{kind}");
        assert_eq!(rx.try_recv(), Ok(4), "{kind}");
    }
}

// ===== oneshot, local =====

/// `select!`: the arm of the ready operation runs, with its result bound by the pattern.
#[test]
fn select_macro_runs_the_ready_arm() {
    let (tx1, rx1) = chan::unbounded::<u32>();
    let (tx2, rx2) = chan::bounded::<u32>(1);
    tx2.send(2).unwrap();
    let got = courier::select! {
        recv(rx1) -> msg => ("rx1", msg),
        recv(rx2) -> msg => ("rx2", msg),
    };
    assert_eq!(got, ("rx2", Ok(2)));
    // Block bodies without commas, and a send arm whose message is built only if chosen.
    let built = AtomicUsize::new(0);
    let (full, _keep) = chan::bounded::<u32>(1);
    full.send(0).unwrap();
    let sent = courier::select! {
        send(full, { built.fetch_add(1, Ordering::SeqCst); 9 }) -> res => { res.is_ok() }
        send(tx1, { built.fetch_add(1, Ordering::SeqCst); 1 }) -> res => { res.unwrap(); true }
    };
    assert!(sent);
    assert_eq!(
        built.load(Ordering::SeqCst),
        1,
        "only the chosen arm builds its message"
    );
    assert_eq!(rx1.try_recv(), Ok(1));
}

#[test]
fn select_macro_defaults() {
    let (tx, rx) = chan::unbounded::<u32>();
    let now = courier::select! {
        recv(rx) -> msg => msg.ok(),
        default => None,
    };
    assert_eq!(now, None);
    let start = Instant::now();
    let later = courier::select! {
        recv(rx) -> msg => msg.ok(),
        default(Duration::from_millis(20)) => None,
    };
    assert_eq!(later, None);
    assert!(start.elapsed() >= Duration::from_millis(20));
    tx.send(5).unwrap();
    let ready = courier::select! {
        recv(rx) -> msg => msg.ok(),
        default(Duration::from_secs(5)) => None,
    };
    assert_eq!(ready, Some(5));
}

#[test]
fn select_macro_waits_and_sees_disconnection() {
    let (tx1, rx1) = chan::bounded::<u32>(0);
    let (tx2, rx2) = chan::bounded::<u32>(0);
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(5));
        tx2.send(22).unwrap();
        drop(tx1);
    });
    let mut seen = Vec::new();
    // Control flow inside the arms is the caller's: `break` leaves the loop.
    loop {
        courier::select! {
            recv(rx1) -> msg => match msg {
                Ok(v) => seen.push(v),
                Err(RecvError) => break,
            },
            recv(rx2) -> msg => match msg {
                Ok(v) => seen.push(v),
                Err(RecvError) => break,
            },
        }
    }
    assert_eq!(seen, [22]);
    t.join().unwrap();
    // A send to a channel whose receivers are gone hands the message back.
    let (tx, rx) = chan::unbounded::<u32>();
    drop(rx);
    let back = courier::select! {
        send(tx, 3) -> res => res,
    };
    assert_eq!(back, Err(SendError(3)));
}

/// Bodies that leave (`break`, `continue`, `return`), in every kind of arm, `default` ones
/// included, compile without a warning: the macro never puts a body where code follows it.
#[deny(warnings)]
fn sum_then_leave(rx: &Receiver<u32>, tx: &Sender<u32>) -> u32 {
    let mut sum = 0;
    loop {
        courier::select! {
            recv(rx) -> msg => sum += msg.unwrap(),
            default(Duration::from_millis(1)) => break,
        }
    }
    loop {
        courier::select! {
            recv(rx) -> _msg => { if sum > 100 { continue } break }
            default => if sum > 100 { continue } else { break },
        }
    }
    for i in 0.. {
        courier::select! {
            send(tx, i) -> res => { res.unwrap(); continue }
            default(Duration::from_millis(1)) => return sum,
        }
    }
    unreachable!("the loop above returns")
}

#[test]
fn select_macro_bodies_may_leave_the_loop_or_the_function() {
    let (tx, rx) = chan::bounded::<u32>(2);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    // Sums what is queued, finds nothing more, fills the channel (two sends) and returns.
    assert_eq!(sum_then_leave(&rx, &tx), 3);
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), [0, 1]);
    // A value out of a loop, through `break` in a body.
    tx.send(0).unwrap();
    tx.send(7).unwrap();
    let got = loop {
        courier::select! {
            recv(rx) -> msg => match msg { Ok(0) => continue, msg => break msg },
        }
    };
    assert_eq!(got, Ok(7));
}

#[test]
fn oneshot_delivers_once() {
    let (tx, rx) = chan::oneshot();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(5));
        tx.send(5u32).unwrap();
    });
    assert_eq!(rx.recv(), Ok(5));
    assert_eq!(rx.recv(), Err(RecvError));
    t.join().unwrap();

    let (tx, rx) = chan::oneshot::<u32>();
    drop(tx);
    assert_eq!(rx.recv(), Err(RecvError));

    let (tx, rx) = chan::oneshot::<String>();
    drop(rx);
    assert_eq!(tx.send("back".into()).unwrap_err().0, "back");

    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = chan::oneshot();
    tx.send(Counted(drops.clone())).unwrap();
    assert!(rx.is_ready());
    drop(rx);
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    let (_tx, rx) = chan::oneshot::<u8>();
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(5)),
        Err(RecvTimeoutError::Timeout)
    );
}

/// Receivers sharing one oneshot end (`&Receiver` is `Sync`), both parked: the message wakes
/// both, one takes it and the other learns it is gone. (One wake-up left the other parked for
/// good: the state never returns to empty.)
#[test]
fn a_oneshot_wakes_every_parked_receiver() {
    with_watchdog("oneshot receivers", Duration::from_secs(30), || {
        for _ in 0..20 {
            let (tx, rx) = chan::oneshot::<u32>();
            let got: Vec<_> = thread::scope(|s| {
                let receivers: Vec<_> = (0..2).map(|_| s.spawn(|| rx.recv())).collect();
                // Let both reach their park (a test of wake-ups, not of timing: any
                // interleaving must end).
                thread::sleep(Duration::from_millis(2));
                tx.send(7).unwrap();
                receivers.into_iter().map(|r| r.join().unwrap()).collect()
            });
            assert!(
                got.contains(&Ok(7)) && got.contains(&Err(RecvError)),
                "{got:?}"
            );
        }
    });
}

/// A selected send that is forgotten (safe code may `mem::forget` it) leaves a reserved slot
/// unwritten: dropping the channel must not drop it as a message.
#[test]
fn a_forgotten_selected_send_leaves_nothing_to_drop() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = chan::bounded::<Counted>(4);
    tx.send(Counted(drops.clone())).unwrap();
    {
        let mut sel = Select::new();
        sel.send(&tx);
        std::mem::forget(sel.select());
    }
    tx.send(Counted(drops.clone())).unwrap();
    drop(tx);
    drop(rx);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        2,
        "each message dropped once, and only those"
    );
}

/// A panic between a select and its completion unwinds normally when the operation holds no
/// reservation (a local end's, or a disconnected channel's); a `select!` send arm's message
/// expression is evaluated only once the arm is chosen.
#[test]
fn a_panic_before_an_unreserved_completion_unwinds() {
    fn message() -> u32 {
        panic!("the message could not be made")
    }
    let (local_tx, _local_rx) = chan::local::channel::<u32>();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        courier::select! {
            send(local_tx, message()) -> _res => (),
        }
    }));
    assert!(caught.is_err());
    let (tx, rx) = chan::bounded::<u32>(1);
    drop(rx);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        courier::select! {
            send(tx, message()) -> _res => (),
        }
    }));
    assert!(caught.is_err());
}

#[test]
fn local_channel_semantics() {
    let (tx, rx) = chan::local::bounded(2);
    tx.try_send(1).unwrap();
    tx.send(2).unwrap();
    assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
    assert_eq!(rx.len(), 2);
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), [1, 2]);
    let tx2 = tx.clone();
    drop(tx);
    tx2.send(4).unwrap();
    drop(tx2);
    assert_eq!(rx.recv(), Ok(4));
    assert_eq!(rx.recv(), Err(RecvError));

    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = chan::local::channel();
    tx.send(Counted(drops.clone())).unwrap();
    tx.send(Counted(drops.clone())).unwrap();
    drop(rx);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    assert!(tx.send(Counted(drops.clone())).is_err());
}

/// The rest of the local API, outside a task: timed operations sleep until their deadline and
/// time out (handing a message back), `iter` ends at disconnection, and the state queries.
#[test]
fn local_timed_operations_and_queries() {
    let (tx, rx) = chan::local::bounded(1);
    assert!(tx.same_channel(&tx.clone()) && rx.same_channel(&rx.clone()));
    assert!(!tx.same_channel(&chan::local::bounded(1).0));
    assert!(!tx.is_full() && !rx.is_disconnected() && !tx.is_disconnected());

    let start = Instant::now();
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(10)),
        Err(RecvTimeoutError::Timeout)
    );
    assert!(start.elapsed() >= Duration::from_millis(10));

    tx.send_timeout(1, Duration::from_millis(10)).unwrap();
    assert!(tx.is_full() && rx.is_full());
    let start = Instant::now();
    assert_eq!(
        tx.send_deadline(2, Instant::now() + Duration::from_millis(10)),
        Err(SendTimeoutError::Timeout(2))
    );
    assert!(start.elapsed() >= Duration::from_millis(10));
    assert_eq!(rx.recv_deadline(Instant::now()), Ok(1));

    tx.send(3).unwrap();
    drop(tx);
    assert!(rx.is_disconnected());
    assert_eq!(rx.iter().collect::<Vec<_>>(), [3]);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(60)),
        Err(RecvTimeoutError::Disconnected)
    );

    // Both `IntoIterator`s: by reference, then by value.
    let (tx, rx) = chan::local::channel();
    (1..=3).for_each(|v| tx.send(v).unwrap());
    drop(tx);
    let mut got: Vec<_> = (&rx).into_iter().take(1).collect();
    got.extend(rx);
    assert_eq!(got, [1, 2, 3]);

    let (tx, rx) = chan::local::channel::<u8>();
    drop(rx);
    assert!(tx.is_disconnected());
    assert_eq!(
        tx.send_timeout(4, Duration::from_secs(60)),
        Err(SendTimeoutError::Disconnected(4))
    );
}

/// A local receiver in a `Select` outside a task: chosen when ready, with a thread-safe
/// receiver beside it; a timed select over it alone times out.
#[test]
fn local_receivers_in_a_select_outside_a_task() {
    let (local_tx, local_rx) = chan::local::channel::<u8>();
    let (tx, rx) = chan::unbounded::<u8>();
    let mut sel = Select::new();
    let local = sel.recv(&local_rx);
    let shared = sel.recv(&rx);
    assert!(sel.try_select().is_err());
    local_tx.send(7).unwrap();
    let oper = sel.select();
    assert_eq!(oper.index(), local);
    assert_eq!(oper.recv(&local_rx), Ok(7));
    tx.send(8).unwrap();
    let oper = sel.select();
    assert_eq!(oper.index(), shared);
    assert_eq!(oper.recv(&rx), Ok(8));

    let mut sel = Select::new();
    sel.recv(&local_rx);
    let start = Instant::now();
    assert!(sel.select_timeout(Duration::from_millis(5)).is_err());
    assert!(start.elapsed() >= Duration::from_millis(5));
    drop(local_tx);
    assert_eq!(sel.select().recv(&local_rx), Err(RecvError));
}

/// A local sender in a `Select` outside a task: chosen when its channel has room (and an
/// unbounded one always), with a thread-safe sender beside it; a timed select over a full one
/// alone times out; once the receivers are gone the select hands the message back.
#[test]
fn local_senders_in_a_select_outside_a_task() {
    let (local_tx, local_rx) = chan::local::bounded::<u8>(1);
    let (tx, rx) = chan::bounded::<u8>(1);
    let mut sel = Select::new();
    let local = sel.send(&local_tx);
    let shared = sel.send(&tx);
    let first = sel.select();
    let second_index = if first.index() == local {
        first.send(&local_tx, 1).unwrap();
        shared
    } else {
        assert_eq!(first.index(), shared);
        first.send(&tx, 1).unwrap();
        local
    };
    let second = sel.select();
    assert_eq!(second.index(), second_index);
    if second_index == local {
        second.send(&local_tx, 2).unwrap();
    } else {
        second.send(&tx, 2).unwrap();
    }
    assert!(sel.try_select().is_err(), "both channels are full");
    assert_eq!(local_rx.try_recv().unwrap() + rx.try_recv().unwrap(), 3);

    local_tx.send(3).unwrap();
    let mut sel = Select::new();
    sel.send(&local_tx);
    let start = Instant::now();
    assert!(sel.select_timeout(Duration::from_millis(5)).is_err());
    assert!(start.elapsed() >= Duration::from_millis(5));
    let mut sel = Select::new();
    let only = sel.send(&local_tx);
    assert!(sel.try_ready().is_err());
    drop(local_rx);
    assert_eq!(sel.ready(), only);
    assert_eq!(sel.select().send(&local_tx, 4), Err(SendError(4)));

    let (unbounded_tx, unbounded_rx) = chan::local::channel::<u8>();
    let mut sel = Select::new();
    sel.send(&unbounded_tx);
    for k in 0..100 {
        sel.select().send(&unbounded_tx, k).unwrap();
    }
    assert_eq!(unbounded_rx.len(), 100);
}

/// `select!` (and `Select`) take references to ends, as crossbeam's do (the macro borrows
/// each channel expression, so a `&Sender` argument arrives as `&&Sender`), and local ends
/// beside thread-safe ones.
#[test]
fn select_takes_references_to_ends_and_local_ends() {
    fn pick(rx: &Receiver<u32>, tx: &Sender<u32>, local_tx: &chan::local::Sender<u32>) -> u32 {
        courier::select! {
            recv(rx) -> msg => msg.unwrap(),
            send(tx, 5) -> res => { res.unwrap(); 100 }
            send(local_tx, 6) -> res => { res.unwrap(); 200 }
        }
    }
    let (in_tx, rx) = chan::bounded::<u32>(1);
    let (tx, out_rx) = chan::bounded::<u32>(1);
    let (local_tx, local_rx) = chan::local::bounded::<u32>(1);
    tx.send(0).unwrap();
    local_tx.send(0).unwrap();
    in_tx.send(7).unwrap();
    assert_eq!(pick(&rx, &tx, &local_tx), 7, "only the receive is ready");
    assert_eq!(local_rx.try_recv(), Ok(0));
    assert_eq!(
        pick(&rx, &tx, &local_tx),
        200,
        "only the local send is ready"
    );
    assert_eq!(local_rx.try_recv(), Ok(6));
    local_tx.send(0).unwrap();
    assert_eq!(out_rx.try_recv(), Ok(0));
    assert_eq!(
        pick(&rx, &tx, &local_tx),
        100,
        "only the thread-safe send is ready"
    );
    assert_eq!(out_rx.try_recv(), Ok(5));

    let rx_ref = &rx;
    let mut sel = Select::new();
    let i = sel.recv(&rx_ref);
    in_tx.send(8).unwrap();
    let oper = sel.select();
    assert_eq!(oper.index(), i);
    assert_eq!(
        oper.recv(&rx),
        Ok(8),
        "the reference's operation is the end's"
    );
}

#[test]
#[should_panic(expected = "would block the thread forever")]
fn a_select_over_full_local_senders_only_outside_a_task_panics_instead_of_deadlocking() {
    let (tx, _rx) = chan::local::bounded::<u8>(1);
    tx.send(0).unwrap();
    let mut sel = Select::new();
    sel.send(&tx);
    let _ = sel.select();
}

#[test]
#[should_panic(expected = "would block the thread forever")]
fn a_select_over_local_receivers_only_outside_a_task_panics_instead_of_deadlocking() {
    let (_tx, rx) = chan::local::channel::<u8>();
    let mut sel = Select::new();
    sel.recv(&rx);
    let _ = sel.select();
}

#[test]
#[should_panic(expected = "would block the thread forever")]
fn local_blocking_outside_a_task_panics_instead_of_deadlocking() {
    let (_tx, rx) = chan::local::channel::<u8>();
    let _ = rx.recv();
}

// ===== timers: never, after, at, tick =====

/// Selects over `timer` beside a channel that never delivers, and receives the timer's message.
fn select_beside_silence(timer: &Receiver<Instant>) -> Instant {
    let (_silent_tx, silent) = chan::unbounded::<Instant>();
    let mut sel = Select::new();
    sel.recv(&silent);
    let at = sel.recv(timer);
    let op = sel.select();
    assert_eq!(op.index(), at, "only the timer can become ready");
    op.recv(timer).unwrap()
}

#[test]
fn never_delivers_nothing_and_is_never_disconnected() {
    let rx = chan::never::<u32>();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    let start = Instant::now();
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(5)),
        Err(RecvTimeoutError::Timeout)
    );
    assert!(start.elapsed() >= Duration::from_millis(5));
    assert!(!rx.is_disconnected());
    assert!(rx.is_empty());
    assert_eq!(rx.len(), 0);
    assert_eq!(rx.capacity(), Some(0));
    assert!(rx.same_channel(&chan::never()));
    assert!(!rx.same_channel(&chan::unbounded().1));
    assert_eq!(rx.try_iter().count(), 0);

    let mut sel = Select::new();
    sel.recv(&rx);
    assert!(sel.try_select().is_err());
    assert!(sel.select_timeout(Duration::from_millis(5)).is_err());
    assert!(sel.try_ready().is_err());
    assert!(sel.ready_timeout(Duration::from_millis(5)).is_err());
    let got = courier::select! {
        recv(rx) -> _msg => "message",
        default(Duration::from_millis(5)) => "timeout",
    };
    assert_eq!(got, "timeout");
}

/// A disconnected receiver is always ready in a select; swapped for `never()` it leaves the
/// loop, which goes on with the other channel until that one disconnects too.
#[test]
fn a_select_loop_takes_a_disconnected_receiver_out_by_swapping_in_never() {
    let (tx_a, mut rx_a) = chan::bounded::<u32>(1);
    let (tx_b, mut rx_b) = chan::unbounded::<u32>();
    drop(tx_a);
    let t = thread::spawn(move || (0..100).for_each(|i| tx_b.send(i).unwrap()));
    let (mut got, mut open, mut a_ends) = (Vec::new(), 2, 0);
    while open > 0 {
        courier::select! {
            recv(rx_a) -> msg => {
                assert_eq!(msg, Err(RecvError));
                a_ends += 1;
                rx_a = chan::never();
                open -= 1;
            }
            recv(rx_b) -> msg => match msg {
                Ok(v) => got.push(v),
                Err(RecvError) => {
                    rx_b = chan::never();
                    open -= 1;
                }
            },
        }
    }
    t.join().unwrap();
    assert_eq!(a_ends, 1, "the swapped-out arm ran once");
    assert_eq!(got, (0..100).collect::<Vec<_>>());

    // The same with the `Select` builder, rebuilt each round.
    let (tx, rx) = chan::unbounded::<u32>();
    tx.send(1).unwrap();
    drop(tx);
    let mut ends = [rx, chan::never()];
    let mut seen = Vec::new();
    for _ in 0..2 {
        let got = {
            let mut sel = Select::new();
            let first = sel.recv(&ends[0]);
            let _silent = sel.recv(&ends[1]);
            let op = sel.select();
            assert_eq!(op.index(), first);
            op.recv(&ends[0])
        };
        match got {
            Ok(v) => seen.push(v),
            Err(RecvError) => ends[0] = chan::never(),
        }
    }
    assert_eq!(seen, [1]);
    let mut sel = Select::new();
    sel.recv(&ends[0]);
    sel.recv(&ends[1]);
    assert!(sel.try_select().is_err(), "both ends are never() now");
}

#[test]
fn after_delivers_the_instant_it_was_due_once() {
    let start = Instant::now();
    let rx = chan::after(Duration::from_millis(10));
    assert!(!rx.is_disconnected());
    assert_eq!(rx.capacity(), Some(1));
    let due = rx.recv().unwrap();
    assert!(due >= start + Duration::from_millis(10));
    assert!(Instant::now() >= due);
    // Once only, and then the receiver stays connected and empty.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(5)),
        Err(RecvTimeoutError::Timeout)
    );
    assert!(rx.is_empty());
    assert!(!rx.is_disconnected());

    // Of a receiver's clones exactly one gets the message.
    let rx = chan::after(Duration::ZERO);
    let clones: Vec<_> = (0..4).map(|_| rx.clone()).collect();
    let got = std::iter::once(&rx)
        .chain(&clones)
        .filter(|rx| rx.try_recv().is_ok())
        .count();
    assert_eq!(got, 1);

    // `at`: an instant an hour away is not due; a past one is, with that instant.
    let later = chan::at(Instant::now() + Duration::from_secs(3600));
    assert_eq!(later.try_recv(), Err(TryRecvError::Empty));
    assert!(later.is_empty() && !later.is_full());
    assert_eq!(
        later.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    );
    let past = Instant::now();
    let now = chan::at(past);
    assert!(now.is_full());
    assert_eq!(now.len(), 1);
    assert_eq!(now.try_recv(), Ok(past));

    // A duration past what `Instant` holds never comes.
    assert!(chan::after(Duration::MAX).same_channel(&chan::never()));
}

#[test]
fn after_wakes_a_select_and_a_ready_when_it_is_due() {
    let start = Instant::now();
    let timer = chan::after(Duration::from_millis(10));
    assert!(select_beside_silence(&timer) >= start + Duration::from_millis(10));

    let (_silent_tx, silent) = chan::unbounded::<u32>();
    let timer = chan::after(Duration::from_millis(5));
    let mut sel = Select::new();
    sel.recv(&silent);
    let t = sel.recv(&timer);
    assert_eq!(sel.ready(), t);
    assert!(timer.try_recv().is_ok());

    // As a `select!` arm, the timer an expression of its own.
    let got = courier::select! {
        recv(silent) -> _msg => None,
        recv(chan::after(Duration::from_millis(5))) -> at => Some(at.unwrap()),
        default(Duration::from_secs(30)) => None,
    };
    assert!(got.is_some_and(|at| at >= start + Duration::from_millis(5)));
}

#[test]
fn tick_delivers_every_period_and_queues_nothing() {
    let period = Duration::from_millis(5);
    let start = Instant::now();
    let ticker = chan::tick(period);
    assert_eq!(ticker.capacity(), Some(1));
    assert!(!ticker.is_disconnected());
    let mut last = ticker.recv().unwrap();
    assert!(last >= start + period);
    for _ in 0..3 {
        let next = ticker.recv().unwrap();
        assert!(next >= last + period);
        last = next;
    }
    // Ticks nobody received are not queued: after three periods of sleep one tick is due (a
    // late one), and the next is a period after it was taken.
    thread::sleep(3 * period);
    let before = Instant::now();
    let late = ticker.try_recv().unwrap();
    assert!(late <= before);
    assert!(ticker.recv().unwrap() >= before + period);

    // In a select, beside a silent channel, and in `select!` with `recv_timeout`'s shape.
    let a = select_beside_silence(&ticker);
    let b = select_beside_silence(&ticker);
    assert!(b >= a + period);
    let got = courier::select! {
        recv(ticker) -> at => at.is_ok(),
        default(Duration::from_secs(30)) => false,
    };
    assert!(got);
    // A deadline before the next tick times out without taking it.
    let slow = chan::tick(Duration::from_secs(3600));
    assert_eq!(
        slow.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    );
    assert_eq!(slow.try_recv(), Err(TryRecvError::Empty));
    assert!(chan::tick(Duration::MAX).same_channel(&chan::never()));
}
