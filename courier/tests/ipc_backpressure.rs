//! Backpressure on `ipc` senders: `try_send` and `send_timeout` on a full
//! channel hand the message back with nothing of it sent, and a blocking
//! `send` from a fiber parks the fiber, not its worker.
//!
//! Every test holds the binary's serial lock ([`fd_check`]): the tests fill
//! socket buffers and change the process's settings, and each checks that
//! no descriptor is left open.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use courier::fiber;
use courier::ipc::{self, IpcSender, SendTimeoutError, TryRecvError, TrySendError};

mod common;
mod watchdog;
use common::{fd_check, with_config};
use watchdog::with_watchdog;

const LIMIT: Duration = Duration::from_secs(60);

/// Sends `make(i)` for `i = 0, 1, …` with `try_send` until the channel is
/// full; checks that the message handed back is the one passed, and
/// returns how many went.
fn fill<T, F>(tx: &IpcSender<T>, make: F) -> u64
where
    T: serde::Serialize + PartialEq + std::fmt::Debug,
    F: Fn(u64) -> T,
{
    let mut sent = 0;
    loop {
        match tx.try_send(make(sent)) {
            Ok(()) => sent += 1,
            Err(TrySendError::Full(back)) => {
                assert_eq!(back, make(sent), "Full hands back the message passed");
                return sent;
            }
            Err(e) => panic!("try_send failed: {e}"),
        }
        assert!(sent < 1_000_000, "a channel without a reader never filled");
    }
}

#[test]
fn try_send_fills_the_channel_and_hands_the_message_back() {
    let _check = fd_check();
    with_watchdog("try_send fill", LIMIT, || {
        let (tx, rx) = ipc::channel::<(u64, String)>().unwrap();
        let make = |i: u64| (i, format!("message {i}"));
        let first = fill(&tx, make);
        assert!(first > 0);
        // Still full: nothing was sent by the refused try.
        assert!(tx.try_send(make(first)).unwrap_err().is_full());

        // The reader drains most of it: room again.
        let mut next = 0;
        while next < first - first / 8 {
            assert_eq!(rx.recv().unwrap(), make(next));
            next += 1;
        }
        let second = fill(&tx, |i| make(first + i));
        assert!(second > 0, "no room after the reader drained");

        // Every message arrives exactly once, in order.
        let total = first + second;
        while next < total {
            assert_eq!(rx.recv().unwrap(), make(next));
            next += 1;
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    });
}

#[test]
fn bytes_try_send_fills_the_channel() {
    let _check = fd_check();
    with_watchdog("bytes try_send fill", LIMIT, || {
        let (tx, rx) = ipc::bytes_channel().unwrap();
        let mut sent = 0u32;
        loop {
            match tx.try_send(&sent.to_le_bytes()) {
                Ok(()) => sent += 1,
                Err(TrySendError::Full(())) => break,
                Err(e) => panic!("try_send failed: {e}"),
            }
        }
        assert!(sent > 0);
        let started = Instant::now();
        let timeout = Duration::from_millis(100);
        let e = tx.send_timeout(b"late", timeout).unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        assert!(started.elapsed() >= timeout);
        for i in 0..sent {
            assert_eq!(rx.recv().unwrap(), i.to_le_bytes());
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        tx.try_send(b"room again").unwrap();
        assert_eq!(rx.recv().unwrap(), b"room again");
    });
}

/// The gathered sends wait, or not, as the plain ones: a message of parts
/// goes whole when there is room, and `Full` or `Timeout` sends nothing.
#[test]
fn vectored_sends_fill_the_channel_whole_or_not_at_all() {
    use std::io::IoSlice;
    let _check = fd_check();
    with_watchdog("vectored try_send fill", LIMIT, || {
        let (tx, rx) = ipc::bytes_channel().unwrap();
        let mut sent = 0u32;
        loop {
            let n = sent.to_le_bytes();
            match tx.try_send_vectored(&[IoSlice::new(b"part:"), IoSlice::new(&n)]) {
                Ok(()) => sent += 1,
                Err(TrySendError::Full(())) => break,
                Err(e) => panic!("try_send_vectored failed: {e}"),
            }
        }
        assert!(sent > 0);
        let timeout = Duration::from_millis(50);
        let parts = [IoSlice::new(b"late"), IoSlice::new(b"!")];
        let e = tx.send_vectored_timeout(&parts, timeout).unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        for i in 0..sent {
            let mut want = b"part:".to_vec();
            want.extend_from_slice(&i.to_le_bytes());
            assert_eq!(rx.recv().unwrap(), want);
        }
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        tx.send_vectored_timeout(&parts, timeout).unwrap();
        assert_eq!(rx.recv().unwrap(), b"late!");
    });
}

#[test]
fn send_timeout_on_a_full_channel_times_out_with_the_message() {
    let _check = fd_check();
    with_watchdog("send_timeout", LIMIT, || {
        let (tx, rx) = ipc::channel::<u64>().unwrap();
        let sent = fill(&tx, |i| i);
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        match tx.send_timeout(sent, timeout) {
            Err(SendTimeoutError::Timeout(back)) => assert_eq!(back, sent),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() >= timeout);

        // With a reader draining meanwhile, the same send goes through.
        let reader = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            (0..=sent).map(|_| rx.recv().unwrap()).collect::<Vec<_>>()
        });
        tx.send_timeout(sent, Duration::from_secs(30)).unwrap();
        let got = reader.join().unwrap();
        assert_eq!(got, (0..=sent).collect::<Vec<_>>());
    });
}

#[test]
fn a_dropped_receiver_is_disconnected_with_the_message() {
    let _check = fd_check();
    with_watchdog("disconnected", LIMIT, || {
        let (tx, rx) = ipc::channel::<String>().unwrap();
        drop(rx);
        match tx.try_send("kept".to_owned()) {
            Err(TrySendError::Disconnected(back)) => assert_eq!(back, "kept"),
            other => panic!("expected Disconnected, got {other:?}"),
        }
        match tx.send_timeout("kept".to_owned(), Duration::from_secs(1)) {
            Err(SendTimeoutError::Disconnected(back)) => assert_eq!(back, "kept"),
            other => panic!("expected Disconnected, got {other:?}"),
        }

        // Also a receiver dropped while the channel is full.
        let (tx, rx) = ipc::bytes_channel().unwrap();
        while tx.try_send(b"filler").is_ok() {}
        drop(rx);
        assert!(tx.try_send(b"after").unwrap_err().is_disconnected());
        let e = tx
            .send_timeout(b"after", Duration::from_secs(1))
            .unwrap_err();
        assert!(e.is_disconnected(), "{e:?}");
    });
}

/// A message with a channel inside is a data packet and a descriptor
/// packet. Filled with messages of several sizes (each size meets the end
/// of the send buffer at another point of the pair), the channel is full
/// either before a message or after it, never between its two packets: no
/// `try_send` waits, and every message arrives whole.
#[test]
fn messages_with_channels_are_sent_whole_or_not_at_all() {
    let _check = fd_check();
    with_watchdog("channels", LIMIT, || {
        let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
        let (tx, rx) = ipc::channel::<(u64, String, IpcSender<u64>)>().unwrap();
        for round in 0..12 {
            let pad = "x".repeat(round * 157);
            let mut sent = 0;
            let back = loop {
                match tx.try_send((sent, pad.clone(), reply_tx.clone())) {
                    Ok(()) => sent += 1,
                    Err(TrySendError::Full(back)) => break back,
                    Err(e) => panic!("try_send failed: {e}"),
                }
            };
            assert!(sent > 0);
            // The message handed back is whole, its sender usable.
            assert_eq!((back.0, &back.1), (sent, &pad));
            back.2.send(u64::MAX).unwrap();
            assert_eq!(reply_rx.recv().unwrap(), u64::MAX);
            drop(back);

            // Every message that went arrives whole, with its channel, once.
            for i in 0..sent {
                let (n, got, reply) = rx.recv().unwrap();
                assert_eq!((n, &got), (i, &pad));
                reply.send(n).unwrap();
                assert_eq!(reply_rx.recv().unwrap(), i);
            }
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        }
    });
}

#[test]
fn large_messages_are_sent_whole_or_not_at_all() {
    let _check = fd_check();
    with_watchdog("large", LIMIT, || {
        // Regions in flight bounded to 8 MiB: the 1 MiB messages find the
        // channel full there, if the socket does not first.
        with_config(
            |c| c.max_region_bytes_in_flight = 8 << 20,
            || {
                const MIB: usize = 1 << 20;
                let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
                let make = |i: u64| vec![i as u8; MIB];
                let sent = fill(&tx, make);
                assert!(sent > 0);
                for i in 0..sent {
                    let got = rx.recv().unwrap();
                    assert!(got == make(i), "message {i} is not whole");
                }
                assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));

                // Bytes channels too, and with the reader gone the message
                // is handed back as disconnected.
                let (tx, rx) = ipc::bytes_channel().unwrap();
                let payload = vec![0xa5u8; MIB];
                let mut sent = 0;
                while tx.try_send(&payload).is_ok() {
                    sent += 1;
                }
                assert!(sent > 0);
                let started = Instant::now();
                let e = tx
                    .send_timeout(&payload, Duration::from_millis(100))
                    .unwrap_err();
                assert!(e.is_timeout(), "{e:?}");
                assert!(started.elapsed() >= Duration::from_millis(100));
                // A reader that drains meanwhile lets the timed send through.
                let reader = thread::spawn(move || {
                    thread::sleep(Duration::from_millis(50));
                    let whole = (0..=sent).all(|_| rx.recv().unwrap().iter().all(|&b| b == 0xa5));
                    (rx, whole)
                });
                tx.send_timeout(&payload, Duration::from_secs(30)).unwrap();
                let (rx, whole) = reader.join().unwrap();
                assert!(whole, "a message is not whole");
                assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
                tx.try_send(&payload).unwrap();
                assert!(rx.recv().unwrap() == payload);
                drop(rx);
                assert!(tx.try_send(&payload).unwrap_err().is_disconnected());
            },
        )
    });
}

/// A blocking `send` into a full channel from a fiber parks that fiber:
/// another fiber of the same (single) worker keeps running, and drains the
/// channel, which lets the send through.
#[test]
fn a_fiber_blocked_in_send_lets_its_worker_run() {
    let _check = fd_check();
    with_watchdog("fiber send", LIMIT, || {
        let rt = fiber::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let (tx, rx) = ipc::channel::<u64>().unwrap();
            let sent = fill(&tx, |i| i);
            let done = Arc::new(AtomicBool::new(false));
            let sender = {
                let done = done.clone();
                fiber::spawn(move || {
                    tx.send(sent).unwrap();
                    done.store(true, Ordering::SeqCst);
                })
            };
            // This fiber runs while the other waits to send.
            for _ in 0..10 {
                fiber::sleep(Duration::from_millis(5));
                assert!(!done.load(Ordering::SeqCst), "sent into a full channel");
            }
            for i in 0..=sent {
                assert_eq!(rx.recv().unwrap(), i);
            }
            sender.join().unwrap();
            assert!(done.load(Ordering::SeqCst));
        });
    });
}

/// While one fiber waits in a send (its channel full, its message carrying a
/// channel end), the other fibers of its worker send too, messages with and
/// without channel ends: each message arrives whole with its own ends, and
/// the waiting send completes once there is room.
#[test]
fn fibers_of_a_worker_send_while_one_waits_for_room() {
    let _check = fd_check();
    with_watchdog("fibers send beside a waiting send", LIMIT, || {
        let rt = fiber::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let (tx, rx) = ipc::channel::<(u64, IpcSender<u64>)>().unwrap();
            let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
            let mut sent = 0u64;
            loop {
                match tx.try_send((sent, reply_tx.clone())) {
                    Ok(()) => sent += 1,
                    Err(TrySendError::Full(_)) => break,
                    Err(e) => panic!("try_send failed: {e}"),
                }
            }
            // A blocking send may find room `try_send` did not count on:
            // the waiting fiber sends more than any buffer holds.
            const MORE: u64 = 2_000;
            let waiter = {
                let reply_tx = reply_tx.clone();
                fiber::spawn(move || {
                    for n in sent..sent + MORE {
                        tx.send((n, reply_tx.clone())).unwrap();
                    }
                })
            };
            // The waiting fiber parks inside a send; these run meanwhile.
            fiber::sleep(Duration::from_millis(20));
            assert!(!waiter.is_finished(), "sent more than a channel holds");
            let (plain_tx, plain_rx) = ipc::channel::<String>().unwrap();
            let (ends_tx, ends_rx) = ipc::channel::<(u64, IpcSender<u64>)>().unwrap();
            let others: Vec<_> = (0..4u64)
                .map(|i| {
                    let (plain_tx, ends_tx) = (plain_tx.clone(), ends_tx.clone());
                    let reply_tx = reply_tx.clone();
                    fiber::spawn(move || {
                        plain_tx.send(format!("plain {i}")).unwrap();
                        ends_tx.send((100 + i, reply_tx)).unwrap();
                    })
                })
                .collect();
            for other in others {
                other.join().unwrap();
            }
            let mut plain: Vec<String> = (0..4).map(|_| plain_rx.recv().unwrap()).collect();
            plain.sort();
            assert_eq!(plain, ["plain 0", "plain 1", "plain 2", "plain 3"]);
            for _ in 0..4 {
                let (n, end) = ends_rx.recv().unwrap();
                end.send(n).unwrap();
            }
            let mut replies: Vec<u64> = (0..4).map(|_| reply_rx.recv().unwrap()).collect();
            replies.sort_unstable();
            assert_eq!(replies, [100, 101, 102, 103]);
            // Room: the waiting sends complete, their ends with them.
            for i in 0..sent + MORE {
                let (n, end) = rx.recv().unwrap();
                assert_eq!(n, i);
                end.send(n).unwrap();
                assert_eq!(reply_rx.recv().unwrap(), i);
            }
            waiter.join().unwrap();
        });
    });
}
