//! `courier::asynch`: IPC receivers as streams, under tokio.
//!
//! Every test that waits on a stream does so within a time limit (a lost
//! wake-up fails it instead of hanging). The cross-process test re-executes this binary
//! (`/proc/self/exe`), as `ipc_xprocess.rs` does.
#![cfg(feature = "async")]

use std::collections::HashSet;
use std::future::Future;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use courier::asynch::IpcStream;
use courier::ipc::{self, Config, IpcOneShotServer, IpcReceiver, IpcSender, LargeMessages};
use futures_core::stream::FusedStream;
use futures_core::Stream;
use futures_util::StreamExt;
use serde_bytes::ByteBuf;

mod common;
mod watchdog;
use common::wire::{fd_packet, header, raw_send, seqpacket_pair};
use watchdog::with_watchdog;

const ROLE: &str = "COURIER_ASYNCH_ROLE";
const SERVER: &str = "COURIER_ASYNCH_SERVER";

/// The longest any test may take.
const LIMIT: Duration = Duration::from_secs(30);

/// Runs `test` within [`LIMIT`].
async fn limited<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(LIMIT, test)
        .await
        .expect("the stream stalled (a lost wake-up?)")
}

/// The number of descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Polls `stream` once, with a waker that does nothing.
fn poll_once<S: Stream + Unpin>(stream: &mut S) -> Poll<Option<S::Item>> {
    Pin::new(stream).poll_next(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_stream_is_send_sync_unpin_and_fused() {
    fn check<S: Stream + FusedStream + Send + Sync + Unpin>() {}
    check::<IpcStream<u64>>();
    check::<IpcStream<String>>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_arrive_in_order() {
    const N: u64 = 20_000;
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let sender = thread::spawn(move || {
        for n in 0..N {
            tx.send(n).unwrap();
        }
    });
    let mut stream = rx.to_stream();
    limited(async {
        for n in 0..N {
            assert_eq!(stream.next().await.unwrap().unwrap(), n);
        }
        assert!(stream.next().await.is_none());
    })
    .await;
    sender.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnection_ends_the_stream_for_good() {
    let (tx, rx) = ipc::channel::<String>().unwrap();
    let mut stream = rx.to_stream();
    tx.send("one".to_owned()).unwrap();
    tx.send("two".to_owned()).unwrap();
    let late = tx.clone();
    drop(tx);
    limited(async {
        assert_eq!(stream.next().await.unwrap().unwrap(), "one");
        assert_eq!(stream.next().await.unwrap().unwrap(), "two");
        assert!(!stream.is_terminated());
        // A sender is left: the stream waits, and the last sender's drop
        // (from another thread, while the stream waits) wakes it.
        let dropper = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            drop(late);
        });
        assert!(stream.next().await.is_none());
        assert!(stream.is_terminated());
        assert!(stream.next().await.is_none());
        assert!(stream.is_terminated());
        dropper.join().unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_before_the_stream_come_first() {
    let (tx, rx) = ipc::channel::<u32>().unwrap();
    for n in 0..5 {
        tx.send(n).unwrap();
    }
    drop(tx);
    let got: Vec<u32> = limited(rx.to_stream().map(Result::unwrap).collect()).await;
    assert_eq!(got, [0, 1, 2, 3, 4]);
}

/// `next()` races a short timer many times while a sender sends slowly: a
/// `next()` future dropped by the timer's win must take no message with it.
/// The sender's pauses are three times tokio's timer tick (a millisecond:
/// a shorter sleep still waits for the next tick), so the timer wins in
/// every pause however the threads are scheduled; between pauses, messages
/// race it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_next_future_loses_no_message() {
    const N: u64 = 300;
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let sender = thread::spawn(move || {
        for n in 0..N {
            tx.send(n).unwrap();
            if n % 20 == 0 {
                thread::sleep(Duration::from_millis(3));
            }
        }
    });
    let mut stream = rx.to_stream();
    let mut got = Vec::new();
    let mut timer_won = 0;
    limited(async {
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(n) => got.push(n.unwrap()),
                    None => break,
                },
                () = tokio::time::sleep(Duration::from_millis(1)) => timer_won += 1,
            }
        }
    })
    .await;
    sender.join().unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    assert!(timer_won > 0, "the race never dropped a next() future");
}

/// A message of the wrong type is an error; the stream goes on after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_does_not_decode_is_an_error() {
    let (tx, rx) = ipc::channel::<u32>().unwrap();
    let wrong: IpcSender<u64> = tx.clone().to_opaque().to();
    let mut stream = rx.to_stream();
    wrong.send(u64::MAX).unwrap();
    tx.send(7).unwrap();
    drop((tx, wrong));
    limited(async {
        assert!(stream.next().await.unwrap().is_err());
        assert_eq!(stream.next().await.unwrap().unwrap(), 7);
        assert!(stream.next().await.is_none());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_wait_at_once_on_one_runtime() {
    const STREAMS: u64 = 64;
    const EACH: u64 = 200;
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for id in 0..STREAMS {
        let (tx, rx) = ipc::channel::<(u64, u64)>().unwrap();
        senders.push(tx);
        let mut stream = rx.to_stream();
        tasks.push(tokio::spawn(async move {
            let mut next = 0;
            while let Some(message) = stream.next().await {
                assert_eq!(message.unwrap(), (id, next));
                next += 1;
            }
            next
        }));
    }
    // One thread feeds every channel in turn, slowly enough that the
    // streams keep finding their sockets empty and waiting.
    let feeder = thread::spawn(move || {
        for n in 0..EACH {
            for (id, tx) in senders.iter().enumerate() {
                tx.send((id as u64, n)).unwrap();
            }
            if n % 20 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
    });
    limited(async {
        for task in tasks {
            assert_eq!(task.await.unwrap(), EACH);
        }
    })
    .await;
    feeder.join().unwrap();
}

/// Messages too large for one packet: through a shared-memory region, and
/// fragmented over a socket of their own, whose rest the stream's socket
/// does not announce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_arrive_whole() {
    let before = Config::global();
    for large in [LargeMessages::SharedMemory, LargeMessages::Fragments] {
        Config::set_global(Config {
            large_messages: large,
            ..before
        });
        let (tx, rx) = ipc::channel::<ByteBuf>().unwrap();
        let sender = thread::spawn(move || {
            for n in 0..6u8 {
                let len = (1 << 20) + usize::from(n) * 4099;
                tx.send(ByteBuf::from(vec![n; len])).unwrap();
                thread::sleep(Duration::from_millis(2));
            }
        });
        let got: Vec<ByteBuf> = limited(rx.to_stream().map(Result::unwrap).collect()).await;
        sender.join().unwrap();
        assert_eq!(got.len(), 6, "{large:?}");
        for (n, message) in got.iter().enumerate() {
            assert_eq!(message.len(), (1 << 20) + n * 4099, "{large:?}");
            assert!(message.iter().all(|&b| usize::from(b) == n), "{large:?}");
        }
    }
    Config::set_global(before);
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "count" => count(),
        "fds" => dropped_streams_leave_no_descriptor(),
        _ => panic!("unknown role {role}"),
    }
    std::process::exit(0);
}

/// This test binary, to run the child role `role`.
fn child(role: &str) -> Command {
    let mut command = common::child_command(&[(ROLE, role)]);
    command.stdout(Stdio::null());
    command
}

/// Child role `count`: connects to the parent's server and sends 0..5,000.
fn count() {
    let server = std::env::var(SERVER).expect("server name");
    let tx = IpcSender::<u64>::connect(server).unwrap();
    for n in 0..5_000 {
        tx.send(n).unwrap();
        if n % 500 == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_from_another_process() {
    let (server, name) = IpcOneShotServer::<u64>::new().unwrap();
    let mut child = child("count").env(SERVER, name).spawn().unwrap();
    let (rx, first) = tokio::task::spawn_blocking(move || server.accept_timeout(LIMIT))
        .await
        .unwrap()
        .expect("the child connects");
    assert_eq!(first, 0);
    let mut stream = rx.to_stream();
    limited(async {
        for n in 1..5_000 {
            assert_eq!(stream.next().await.unwrap().unwrap(), n);
        }
        // The child exits: its sender closes with it.
        assert!(stream.next().await.is_none());
    })
    .await;
    assert!(child.wait().unwrap().success());
}

/// Streams that wait, or are woken, and are then dropped leave no
/// descriptor open, and their sockets close: the senders see the receivers
/// gone. Counted in a child process of its own, where no other test opens
/// descriptors meanwhile.
#[test]
fn dropped_streams_close_their_sockets() {
    let status = child("fds").status().unwrap();
    assert!(status.success(), "the child found a leak: {status}");
}

/// Child role `fds`: the body of [`dropped_streams_close_their_sockets`].
fn dropped_streams_leave_no_descriptor() {
    // The reactor's own descriptors, opened once per process.
    let (_tx, rx) = ipc::channel::<u64>().unwrap();
    let mut warm = rx.to_stream();
    assert!(poll_once(&mut warm).is_pending());
    drop(warm);
    let before = open_fds();
    let mut senders = Vec::new();
    for k in 0..32 {
        let (tx, rx) = ipc::channel::<u64>().unwrap();
        let mut stream = rx.to_stream();
        // Registered and armed; half of them then woken by a message
        // (which the reactor may be handling as the stream goes); dropped.
        assert!(poll_once(&mut stream).is_pending());
        if k % 2 == 0 {
            tx.send(0).unwrap();
        }
        drop(stream);
        senders.push(tx);
    }
    for tx in &senders {
        assert!(tx.send(1).is_err());
    }
    drop(senders);
    let after = open_fds();
    assert!(after <= before, "{after} descriptors open, {before} before");
}

/// The waker that matters is the last poll's: a stream moved between tasks
/// (polled by one, then by another) wakes the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_poll_s_waker_is_woken() {
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let mut stream = rx.to_stream();
    assert!(poll_once(&mut stream).is_pending());
    let task = tokio::spawn(async move { stream.next().await.unwrap().unwrap() });
    tokio::time::sleep(Duration::from_millis(20)).await;
    tx.send(42).unwrap();
    assert_eq!(limited(task).await.unwrap(), 42);
}

/// Bursts sent while the stream waits: each message of a burst comes out
/// once, and after the burst the stream finds nothing and waits again (its
/// socket armed anew after every wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_of_a_burst_comes_out() {
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let mut stream = rx.to_stream();
    let mut seen = HashSet::new();
    limited(async {
        for round in 0..50u64 {
            for k in 0..20 {
                tx.send(round * 20 + k).unwrap();
            }
            for _ in 0..20 {
                assert!(seen.insert(stream.next().await.unwrap().unwrap()));
            }
            assert!(poll_once(&mut stream).is_pending());
        }
    })
    .await;
    assert_eq!(seen.len(), 1000);
}

/// A malformed message from a peer is an error naming the fault; the
/// stream goes on with the messages after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_message_is_an_error() {
    let (ours, raw) = seqpacket_pair();
    let rx = IpcReceiver::<u32>::try_from(ours).unwrap();
    let tx = IpcSender::<u32>::try_from(raw.try_clone().unwrap()).unwrap();
    let mut stream = rx.to_stream();
    limited(async {
        raw_send(&raw, b"not a courier packet", &[]);
        let err = stream.next().await.unwrap().unwrap_err();
        assert!(err.wire_error().is_some(), "{err}");
        tx.send(9).unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), 9);
    })
    .await;
}

/// A message that waits in the receiver's memory for its descriptor packet
/// (sent late, as by a slow sender) comes out when the packet arrives while
/// the stream waits; the messages around it are not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_completed_while_the_stream_waits_comes_out() {
    let (ours, raw) = seqpacket_pair();
    let rx = IpcReceiver::<u32>::try_from(ours).unwrap();
    let tx = IpcSender::<u32>::try_from(raw.try_clone().unwrap()).unwrap();
    let mut stream = rx.to_stream();
    // The message 5, announcing one descriptor (a channel end) that is not
    // sent yet, then the message 6.
    let tag = 0x5eed;
    let mut packet = header(0, 1, 1, 0, tag);
    packet.push(5);
    raw_send(&raw, &packet, &[]);
    tx.send(6).unwrap();
    limited(async {
        assert_eq!(stream.next().await.unwrap().unwrap(), 6);
        assert!(poll_once(&mut stream).is_pending());
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            let (end, _other) = ipc::channel::<u8>().unwrap();
            raw_send(&raw, &fd_packet(1, tag), &[end.as_fd()]);
            raw
        });
        // Delivered (its spare descriptor closed), or refused: either way
        // the stream wakes for it.
        assert!(stream.next().await.is_some());
        let _raw = late.join().unwrap();
        tx.send(7).unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), 7);
    })
    .await;
}

/// A waker that unparks a thread.
struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The smallest executor: polls `future` on this thread, parking between
/// polls until its waker is woken.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

/// The stream needs nothing of tokio: under a thread-parking executor
/// it waits and wakes the same way.
#[test]
fn a_stream_needs_no_particular_runtime() {
    const N: u64 = 2_000;
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let sender = thread::spawn(move || {
        for n in 0..N {
            tx.send(n).unwrap();
            if n % 100 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
    });
    with_watchdog("a_stream_needs_no_particular_runtime", LIMIT, move || {
        let got: Vec<u64> = block_on(rx.to_stream().map(Result::unwrap).collect());
        assert_eq!(got, (0..N).collect::<Vec<_>>());
    });
    sender.join().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn many_messages_arrive_in_order_on_a_current_thread_runtime() {
    const N: u64 = 5_000;
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let sender = thread::spawn(move || {
        for n in 0..N {
            tx.send(n).unwrap();
        }
    });
    let got: Vec<u64> = limited(rx.to_stream().map(Result::unwrap).collect()).await;
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    sender.join().unwrap();
}

/// Streams made, armed, woken and dropped while their messages are in
/// flight, many at a time: each gets what was sent before it was dropped,
/// in order, and nothing goes wrong in the reactor for the ones dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_come_and_go_while_messages_fly() {
    limited(async {
        for _round in 0..20 {
            let mut tasks = Vec::new();
            let mut senders = Vec::new();
            for k in 0..16u64 {
                let (tx, rx) = ipc::channel::<u64>().unwrap();
                let sender = thread::spawn(move || {
                    for n in 0.. {
                        if tx.send(n).is_err() {
                            return;
                        }
                        if n % 8 == 0 {
                            thread::yield_now();
                        }
                    }
                });
                let mut stream = rx.to_stream();
                tasks.push(tokio::spawn(async move {
                    // Take a few, then drop the stream mid-flight.
                    for n in 0..(k * 7) {
                        assert_eq!(stream.next().await.unwrap().unwrap(), n);
                    }
                }));
                senders.push(sender);
            }
            for task in tasks {
                task.await.unwrap();
            }
            // Every stream is gone: every sender sees it and ends.
            for sender in senders {
                sender.join().unwrap();
            }
        }
    })
    .await;
}
