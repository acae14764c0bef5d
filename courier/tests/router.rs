//! `courier::router`: the router semantics ipc-channel's users rely on
//! (typed and one-shot routes, callbacks dropped with their senders,
//! forwarding into channels, shutdown), and what courier adds (malformed
//! messages reach the callback, a panicking callback loses only its route).
//!
//! Every test runs its own `RouterProxy` (but the one on the global
//! `ROUTER`), holds `fd_check` (so the tests run one at a time and each
//! ends with as many descriptors open as it began with), and runs under a
//! watchdog: a lost message fails the test instead of hanging it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use courier::chan::{self, RecvTimeoutError};
use courier::ipc::{self, IpcBytesSender, IpcError, IpcReceiver, IpcSender, WireError};
use courier::router::{RouterProxy, ROUTER};
use serde::{Deserialize, Serialize};

mod common;
mod watchdog;
use common::fd_check;
use common::wire::{header, raw_send, seqpacket_pair};
use watchdog::with_watchdog;

/// Longest wait for one message: far above what any needs, so that only a
/// lost one reaches it.
const WAIT: Duration = Duration::from_secs(10);

/// Runs `body` holding the descriptor check, under a watchdog.
fn run(name: &str, body: impl FnOnce() + Send + 'static) {
    // The global router lives as long as the process: started before any
    // count is taken (a test may start it while another holds the check).
    LazyLock::force(&ROUTER);
    let _fds = fd_check();
    with_watchdog(name, Duration::from_secs(60), body);
}

/// Receives one message or fails the test.
fn recv<T>(rx: &chan::Receiver<T>) -> T {
    rx.recv_timeout(WAIT).expect("no message from the router")
}

/// Asserts that every sender of `rx` is gone (the route holding it was
/// dropped) and no message is left.
fn assert_disconnected<T: std::fmt::Debug>(rx: &chan::Receiver<T>) {
    match rx.recv_timeout(WAIT) {
        Err(RecvTimeoutError::Disconnected) => {}
        Err(RecvTimeoutError::Timeout) => panic!("the route's callback was not dropped"),
        Ok(extra) => panic!("unexpected message {extra:?}"),
    }
}

/// Sets a flag when dropped: captured by a callback, it shows when the
/// callback was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Uses `value` (so that a `move` closure captures it whole).
fn keep<T>(value: &T) {
    std::hint::black_box(value);
}

/// Waits until `done` holds, or fails the test with `what`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn drop_flag() -> (DropFlag, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    (DropFlag(Arc::clone(&flag)), flag)
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    x: i32,
    y: i32,
    label: String,
}

// ===== routes =====

/// ipc-channel 0.23's router as a program written for it names it: these
/// compile only if the paths, signatures and auto traits are the same.
#[test]
fn names_and_signatures_are_ipc_channels() {
    use courier::ipc::IpcMessage;
    use courier::router::{
        RouterMultiHandler, RouterOneShotHandler, TypedRouterMultiHandler,
        TypedRouterOneShotHandler,
    };
    use courier::SerDeError;

    let _: fn() -> RouterProxy = RouterProxy::new;
    let _: fn(&RouterProxy, IpcReceiver<u32>, TypedRouterMultiHandler<u32>) =
        RouterProxy::add_typed_route::<u32>;
    let _: fn(&RouterProxy, IpcReceiver<u32>, TypedRouterOneShotHandler<u32>) =
        RouterProxy::add_typed_one_shot_route::<u32>;
    let _: fn(&RouterProxy) = RouterProxy::shutdown;
    #[cfg(feature = "crossbeam-channel")]
    {
        let _: fn(&RouterProxy, IpcReceiver<u32>, crossbeam_channel::Sender<u32>) =
            RouterProxy::route_ipc_receiver_to_crossbeam_sender::<u32>;
        let _: fn(&RouterProxy, IpcReceiver<u32>) -> crossbeam_channel::Receiver<u32> =
            RouterProxy::route_ipc_receiver_to_new_crossbeam_receiver::<u32>;
    }
    let _: &'static LazyLock<RouterProxy> = &ROUTER;
    let _: RouterMultiHandler = Box::new(|_: IpcMessage| {});
    let _: RouterOneShotHandler = Box::new(|_: IpcMessage| {});
    let _: TypedRouterMultiHandler<u8> = Box::new(|_: Result<u8, SerDeError>| {});
    let _: TypedRouterOneShotHandler<u8> = Box::new(|_: Result<u8, SerDeError>| {});
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<RouterProxy>();
}

#[test]
fn typed_route_gets_every_message_in_order_then_is_dropped() {
    run("typed_route", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<Point>().unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(
            rx,
            Box::new(move |point| out_tx.send(point.unwrap()).unwrap()),
        );
        for i in 0..100 {
            tx.send(Point {
                x: i,
                y: -i,
                label: format!("p{i}"),
            })
            .unwrap();
        }
        for i in 0..100 {
            let point = recv(&out_rx);
            assert_eq!((point.x, point.y, point.label), (i, -i, format!("p{i}")));
        }
        drop(tx);
        assert_disconnected(&out_rx);
    });
}

#[test]
fn one_shot_route_gets_the_first_message_only() {
    run("one_shot_route", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        let (flag, dropped) = drop_flag();
        router.add_typed_one_shot_route(
            rx,
            Box::new(move |n| {
                let _flag = flag;
                out_tx.send(n.unwrap()).unwrap();
            }),
        );
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!(recv(&out_rx), 1);
        // Called once, and consumed by the call.
        assert_disconnected(&out_rx);
        assert!(dropped.load(Ordering::SeqCst));
        // As ipc-channel's: later messages are dropped, and the senders are
        // not told (the receiver stays until they are gone).
        tx.send(3).unwrap();
        drop(tx);
        router.shutdown();
    });
}

#[test]
fn callbacks_are_dropped_once_every_cloned_sender_is_gone() {
    run("cloned_senders", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<u64>().unwrap();
        let clones: Vec<IpcSender<u64>> = (0..4).map(|_| tx.clone()).collect();
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(rx, Box::new(move |n| out_tx.send(n.unwrap()).unwrap()));
        drop(tx);
        for (i, clone) in clones.into_iter().enumerate() {
            clone.send(i as u64).unwrap();
            assert_eq!(recv(&out_rx), i as u64);
            drop(clone);
            if i < 3 {
                // Clones are left: the route is alive.
                assert!(matches!(
                    out_rx.recv_timeout(Duration::from_millis(20)),
                    Err(RecvTimeoutError::Timeout)
                ));
            }
        }
        assert_disconnected(&out_rx);
        // A sender moved through another channel counts as well.
        let (tx, rx) = ipc::channel::<u64>().unwrap();
        let (carrier_tx, carrier_rx) = ipc::channel::<IpcSender<u64>>().unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(rx, Box::new(move |n| out_tx.send(n.unwrap()).unwrap()));
        carrier_tx.send(tx.clone()).unwrap();
        drop(tx);
        let moved = carrier_rx.recv().unwrap();
        moved.send(9).unwrap();
        assert_eq!(recv(&out_rx), 9);
        drop(moved);
        assert_disconnected(&out_rx);
    });
}

#[test]
fn hundred_receivers_into_one_chan_channel() {
    run("hundred_receivers", || {
        const ROUTES: u32 = 100;
        const EACH: u32 = 50;
        let router = RouterProxy::new();
        let (out_tx, out_rx) = chan::unbounded::<(u32, u32)>();
        let senders: Vec<IpcSender<(u32, u32)>> = (0..ROUTES)
            .map(|_| {
                let (tx, rx) = ipc::channel().unwrap();
                router.route_ipc_receiver_to_chan_sender(rx, out_tx.clone());
                tx
            })
            .collect();
        drop(out_tx);
        for seq in 0..EACH {
            for (route, tx) in senders.iter().enumerate() {
                tx.send((route as u32, seq)).unwrap();
            }
        }
        let mut next = vec![0u32; ROUTES as usize];
        for _ in 0..ROUTES * EACH {
            let (route, seq) = recv(&out_rx);
            assert_eq!(seq, next[route as usize], "route {route} out of order");
            next[route as usize] += 1;
        }
        assert!(next.iter().all(|&n| n == EACH));
        // The channel disconnects once the last route is gone.
        let mut senders = senders;
        let last = senders.pop().unwrap();
        drop(senders);
        assert!(matches!(
            out_rx.recv_timeout(Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout)
        ));
        drop(last);
        assert_disconnected(&out_rx);
    });
}

#[test]
fn flood_keeps_each_routes_order() {
    run("flood", || {
        const MESSAGES: u64 = 100_000;
        let router = RouterProxy::new();
        let (out_tx, out_rx) = chan::unbounded::<(u8, u64)>();
        let threads: Vec<_> = (0..2u8)
            .map(|route| {
                let (tx, rx) = ipc::channel::<(u8, u64)>().unwrap();
                router.route_ipc_receiver_to_chan_sender(rx, out_tx.clone());
                std::thread::spawn(move || {
                    for i in 0..MESSAGES / 2 {
                        tx.send((route, i)).unwrap();
                    }
                })
            })
            .collect();
        drop(out_tx);
        let mut next = [0u64; 2];
        for _ in 0..MESSAGES {
            let (route, i) = recv(&out_rx);
            assert_eq!(i, next[route as usize]);
            next[route as usize] += 1;
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_disconnected(&out_rx);
    });
}

#[test]
fn large_payload() {
    run("large_payload", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
        let out_rx = router.route_ipc_receiver_to_new_chan_receiver(rx);
        let payload: Vec<u8> = (0..16 << 20)
            .map(|i: u32| (i * 7 + (i >> 12)) as u8)
            .collect();
        tx.send(payload.clone()).unwrap();
        tx.send(vec![1, 2, 3]).unwrap();
        assert!(recv(&out_rx) == payload);
        assert_eq!(recv(&out_rx), [1, 2, 3]);
        drop(tx);
        assert_disconnected(&out_rx);
    });
}

#[cfg(feature = "crossbeam-channel")]
#[test]
fn global_router_forwards_into_crossbeam_and_chan() {
    run("global_router", || {
        let (tx, rx) = ipc::channel::<String>().unwrap();
        let crossbeam_rx = ROUTER.route_ipc_receiver_to_new_crossbeam_receiver(rx);
        let (tx2, rx2) = ipc::channel::<String>().unwrap();
        let chan_rx = ROUTER.route_ipc_receiver_to_new_chan_receiver(rx2);
        tx.send("to crossbeam".to_owned()).unwrap();
        tx2.send("to chan".to_owned()).unwrap();
        assert_eq!(crossbeam_rx.recv_timeout(WAIT).unwrap(), "to crossbeam");
        assert_eq!(recv(&chan_rx), "to chan");
        drop((tx, tx2));
        assert!(matches!(
            crossbeam_rx.recv_timeout(WAIT),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
        assert_disconnected(&chan_rx);
    });
}

#[test]
fn a_route_may_add_routes_from_its_callback() {
    run("nested_routes", || {
        let router = Arc::new(RouterProxy::new());
        let (tx, rx) = ipc::channel::<IpcReceiver<u32>>().unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        let inner = Arc::clone(&router);
        router.add_typed_route(
            rx,
            Box::new(move |receiver| {
                inner.route_ipc_receiver_to_chan_sender(receiver.unwrap(), out_tx.clone());
            }),
        );
        let (inner_tx, inner_rx) = ipc::channel::<u32>().unwrap();
        tx.send(inner_rx).unwrap();
        inner_tx.send(5).unwrap();
        assert_eq!(recv(&out_rx), 5);
        drop((tx, inner_tx));
        assert_disconnected(&out_rx);
        // The proxy held by the callback is dropped with it.
        wait_until("the callback was not dropped", || {
            Arc::strong_count(&router) == 1
        });
        router.shutdown();
    });
}

// ===== shutdown =====

#[test]
fn shutdown_waits_and_drops_later_routes() {
    run("shutdown", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let (flag, dropped) = drop_flag();
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(
            rx,
            Box::new(move |n| {
                keep(&flag);
                out_tx.send(n.unwrap()).unwrap();
            }),
        );
        tx.send(1).unwrap();
        assert_eq!(recv(&out_rx), 1);
        router.shutdown();
        // Waited for: the callback is gone and the receiver closed when
        // `shutdown` returns.
        assert!(dropped.load(Ordering::SeqCst));
        assert!(matches!(tx.send(2), Err(IpcError::Disconnected)));
        // A route added afterwards is dropped at once, receiver and all.
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let (flag, dropped) = drop_flag();
        router.add_typed_route(rx, Box::new(move |_| keep(&flag)));
        assert!(dropped.load(Ordering::SeqCst));
        assert!(matches!(tx.send(3), Err(IpcError::Disconnected)));
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let forwarded = router.route_ipc_receiver_to_new_chan_receiver(rx);
        assert!(matches!(
            forwarded.try_recv(),
            Err(chan::TryRecvError::Disconnected)
        ));
        assert!(matches!(tx.send(4), Err(IpcError::Disconnected)));
        // Again, and from other threads at once: the same as once.
        router.shutdown();
        let router = Arc::new(router);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let router = Arc::clone(&router);
                std::thread::spawn(move || router.shutdown())
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    });
}

#[test]
fn concurrent_shutdowns_all_wait_for_the_router() {
    run("concurrent_shutdowns", || {
        let router = Arc::new(RouterProxy::new());
        let live = Arc::new(AtomicUsize::new(0));
        // Routes whose callbacks take a while to drop: every shutdown must
        // return only after all of them are dropped.
        struct SlowDrop(Arc<AtomicUsize>);
        impl Drop for SlowDrop {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(20));
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let mut senders = Vec::new();
        let (ack_tx, ack_rx) = chan::unbounded();
        for _ in 0..5 {
            let (tx, rx) = ipc::channel::<()>().unwrap();
            live.fetch_add(1, Ordering::SeqCst);
            let slow = SlowDrop(Arc::clone(&live));
            let ack_tx = ack_tx.clone();
            router.add_typed_route(
                rx,
                Box::new(move |_| {
                    keep(&slow);
                    ack_tx.send(()).unwrap();
                }),
            );
            tx.send(()).unwrap();
            senders.push(tx);
        }
        for _ in 0..5 {
            recv(&ack_rx);
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (router, live) = (Arc::clone(&router), Arc::clone(&live));
                std::thread::spawn(move || {
                    router.shutdown();
                    assert_eq!(live.load(Ordering::SeqCst), 0);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    });
}

#[test]
fn shutdown_from_a_callback_does_not_wait_for_itself() {
    run("shutdown_from_callback", || {
        let router = Arc::new(RouterProxy::new());
        let (tx, rx) = ipc::channel::<()>().unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        let inner = Arc::clone(&router);
        router.add_typed_route(
            rx,
            Box::new(move |_| {
                inner.shutdown();
                out_tx.send(()).unwrap();
            }),
        );
        tx.send(()).unwrap();
        recv(&out_rx);
        assert_disconnected(&out_rx);
        // The callback (holding a proxy) is dropped by the stopping router.
        wait_until("the callback was not dropped", || {
            Arc::strong_count(&router) == 1
        });
        router.shutdown();
    });
}

// ===== faults =====

#[test]
fn malformed_messages_reach_the_callback_as_errors() {
    run("malformed", || {
        let router = RouterProxy::new();
        // One channel, three ways in: bytes that are no `Point`, raw
        // packets that are no message at all, and a well-formed `Point`.
        let (ours, theirs) = seqpacket_pair();
        let typed_tx = IpcSender::<Point>::try_from(ours.try_clone().unwrap()).unwrap();
        let bytes_tx = IpcBytesSender::try_from(ours.try_clone().unwrap()).unwrap();
        let rx = IpcReceiver::<Point>::try_from(theirs).unwrap();
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(rx, Box::new(move |point| out_tx.send(point).unwrap()));

        // A string's length prefix, then too few bytes for it.
        bytes_tx.send(&[2, 4, 250, 3]).unwrap();
        let err = recv(&out_rx).unwrap_err();
        assert_eq!(err.wire_error(), None, "{err}");

        // A packet shorter than any header.
        raw_send(&ours, b"garbage", &[]);
        let err = recv(&out_rx).unwrap_err();
        assert!(
            matches!(err.wire_error(), Some(WireError::BadHeader(_))),
            "{err}"
        );

        // A header that claims more than it brings.
        let mut claim = header(0, 0, 1 << 20, 0, 0);
        claim.extend_from_slice(b"short");
        raw_send(&ours, &claim, &[]);
        assert!(recv(&out_rx).unwrap_err().wire_error().is_some());

        // The channel goes on.
        let point = Point {
            x: 1,
            y: 2,
            label: "after".to_owned(),
        };
        typed_tx.send(point).unwrap();
        assert_eq!(recv(&out_rx).unwrap().label, "after");
        drop((typed_tx, bytes_tx, ours));
        assert_disconnected(&out_rx);
    });
}

#[test]
fn a_message_past_the_receivers_limit_reaches_the_callback_as_an_error() {
    run("size_limit", || {
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
        // The route keeps the receiver's own limit.
        rx.set_max_message_size(1024);
        let (out_tx, out_rx) = chan::unbounded();
        router.add_typed_route(
            rx,
            Box::new(move |bytes| out_tx.send(bytes.map(|b| b.len())).unwrap()),
        );
        tx.send(vec![7; 4096]).unwrap();
        tx.send(vec![7; 16]).unwrap();
        let err = recv(&out_rx).unwrap_err();
        assert!(
            matches!(err.wire_error(), Some(WireError::TooLarge { .. })),
            "{err}"
        );
        assert_eq!(recv(&out_rx).unwrap(), 16);
        drop(tx);
        assert_disconnected(&out_rx);
    });
}

#[cfg(feature = "crossbeam-channel")]
#[test]
fn forwarding_routes_drop_malformed_messages() {
    run("malformed_forwarded", || {
        let router = RouterProxy::new();
        let (ours, theirs) = seqpacket_pair();
        let typed_tx = IpcSender::<u64>::try_from(ours.try_clone().unwrap()).unwrap();
        let bytes_tx = IpcBytesSender::try_from(ours).unwrap();
        let rx = IpcReceiver::<u64>::try_from(theirs).unwrap();
        let forwarded = router.route_ipc_receiver_to_new_chan_receiver(rx);
        let (cb_ours, cb_theirs) = seqpacket_pair();
        let cb_bytes_tx = IpcBytesSender::try_from(cb_ours).unwrap();
        let cb_rx = IpcReceiver::<u64>::try_from(cb_theirs).unwrap();
        let crossbeam = router.route_ipc_receiver_to_new_crossbeam_receiver(cb_rx);
        // A varint longer than any u64's.
        let overlong = [0xff; 11];
        bytes_tx.send(&overlong).unwrap();
        typed_tx.send(7).unwrap();
        cb_bytes_tx.send(&overlong).unwrap();
        // ipc-channel's forwarding panics the router here; courier's drops
        // the message and goes on.
        assert_eq!(recv(&forwarded), 7);
        drop((typed_tx, bytes_tx, cb_bytes_tx));
        assert_disconnected(&forwarded);
        assert!(matches!(
            crossbeam.recv_timeout(WAIT),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        ));
    });
}

#[test]
fn a_panicking_callback_loses_its_route_only() {
    run("panicking_callback", || {
        let router = RouterProxy::new();
        let (bad_tx, bad_rx) = ipc::channel::<u32>().unwrap();
        let (good_tx, good_rx) = ipc::channel::<u32>().unwrap();
        let (flag, dropped) = drop_flag();
        let (seen_tx, seen_rx) = chan::unbounded();
        router.add_typed_route(
            bad_rx,
            Box::new(move |n| {
                keep(&flag);
                let n = n.unwrap();
                seen_tx.send(n).unwrap();
                if n == 13 {
                    panic!("a route's callback panics (as this test means it to)");
                }
            }),
        );
        let forwarded = router.route_ipc_receiver_to_new_chan_receiver(good_rx);
        bad_tx.send(1).unwrap();
        bad_tx.send(13).unwrap();
        assert_eq!(recv(&seen_rx), 1);
        assert_eq!(recv(&seen_rx), 13);
        // The route is removed: its callback dropped, its receiver closed.
        assert_disconnected(&seen_rx);
        assert!(dropped.load(Ordering::SeqCst));
        wait_until("the route's receiver is open", || bad_tx.send(2).is_err());
        // The others go on, and new routes are served.
        good_tx.send(42).unwrap();
        assert_eq!(recv(&forwarded), 42);
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let more = router.route_ipc_receiver_to_new_chan_receiver(rx);
        tx.send(43).unwrap();
        assert_eq!(recv(&more), 43);
        drop((good_tx, tx));
        assert_disconnected(&forwarded);
        assert_disconnected(&more);
    });
}

#[test]
fn a_callback_that_panics_when_dropped_does_not_stop_the_router() {
    run("panicking_drop", || {
        struct PanicOnDrop;
        impl Drop for PanicOnDrop {
            fn drop(&mut self) {
                panic!("a callback's capture panics when dropped (as this test means it to)");
            }
        }
        let router = RouterProxy::new();
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let bomb = PanicOnDrop;
        router.add_typed_route(rx, Box::new(move |_| keep(&bomb)));
        drop(tx);
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let forwarded = router.route_ipc_receiver_to_new_chan_receiver(rx);
        tx.send(8).unwrap();
        assert_eq!(recv(&forwarded), 8);
        drop(tx);
        assert_disconnected(&forwarded);
        router.shutdown();
    });
}
