//! In-process behaviour of `courier::ipc`: the typed API that ipc-channel's
//! users rely on, the bytes API, size classes (inline, fragmented, shared
//! memory), disconnection, and a hostile peer writing raw packets.
//!
//! Every test holds an `FdCheck`: the tests run one at a time, and the process's descriptor count
//! is the same before and after it (`/proc/self/fd`), so a leak anywhere
//! shows up in the test that caused it.

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use courier::ipc::{
    self, IpcBytesReceiver, IpcBytesSender, IpcError, IpcMessage, IpcOneShotServer, IpcReceiver,
    IpcSender, LargeMessages, OpaqueIpcReceiver, TryRecvError, WireError,
};
use rustix::net::{self, AddressFamily, SendFlags, SocketFlags, SocketType};
use serde::{Deserialize, Serialize};

mod common;
use common::wire::{fd_packet, header, raw_send, seqpacket_pair, wire_error};
use common::{fd_check, open_fds, with_config};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Unit,
    Point { x: i64, y: i64 },
    Named(String, Vec<u32>),
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Blob {
    id: u32,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
}

#[test]
fn typed_values_roundtrip() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Shape>().unwrap();
    let shapes = [
        Shape::Unit,
        Shape::Point { x: -1, y: i64::MAX },
        Shape::Named("ü".repeat(100), (0..1000).collect()),
    ];
    for shape in &shapes {
        tx.send(shape.clone()).unwrap();
    }
    for shape in &shapes {
        assert_eq!(&rx.recv().unwrap(), shape);
    }
    let (tx, rx) = ipc::channel::<()>().unwrap();
    tx.send(()).unwrap();
    rx.recv().unwrap();
}

#[test]
fn every_size_class_roundtrips() {
    let _check = fd_check();
    // Inline, around the header and alignment edges, one full packet, shared memory.
    let sizes = [
        0,
        1,
        7,
        8,
        9,
        31,
        32,
        33,
        4095,
        4096,
        7167,
        7168,
        7169,
        65535,
        65536,
        65537,
        200_000,
        1 << 20,
        3 << 20,
    ];
    let (tx, rx) = ipc::bytes_channel().unwrap();
    let (ttx, trx) = ipc::channel::<Vec<u8>>().unwrap();
    let (btx, brx) = ipc::channel::<Blob>().unwrap();
    for &size in &sizes {
        let data = pattern(size, size as u8);
        tx.send(&data).unwrap();
        assert_eq!(rx.recv().unwrap(), data, "bytes, {size} B");
        ttx.send(data.clone()).unwrap();
        assert_eq!(trx.recv().unwrap(), data, "typed, {size} B");
        btx.send(Blob {
            id: size as u32,
            bytes: data.clone(),
        })
        .unwrap();
        assert_eq!(
            brx.recv().unwrap(),
            Blob {
                id: size as u32,
                bytes: data
            },
            "serde_bytes, {size} B"
        );
    }
    // Sizes that go down, then up again: the receive buffer adapts.
    for &size in sizes.iter().rev().chain(&sizes) {
        let data = pattern(size, 3);
        tx.send(&data).unwrap();
        assert_eq!(rx.recv().unwrap(), data);
    }
}

/// Byte strings around other fields and channels: the first large one
/// goes straight from the caller's memory (a second walk), the rest copied.
#[derive(Debug, Serialize, Deserialize)]
struct Mixed {
    head: String,
    #[serde(with = "serde_bytes")]
    first: Vec<u8>,
    reply: IpcSender<u32>,
    #[serde(with = "serde_bytes")]
    second: Vec<u8>,
    tail: Vec<u16>,
}

#[test]
fn large_byte_strings_around_channels_and_fields() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Mixed>().unwrap();
    for (first, second) in [(4096, 0), (2048, 9000), (100_000, 3), (3 << 20, 1 << 20)] {
        let (reply_tx, reply_rx) = ipc::channel::<u32>().unwrap();
        tx.send(Mixed {
            head: "h".repeat(first % 7),
            first: pattern(first, 1),
            reply: reply_tx,
            second: pattern(second, 2),
            tail: (0..100).collect(),
        })
        .unwrap();
        let got = rx.recv().unwrap();
        assert_eq!(got.head, "h".repeat(first % 7));
        assert_eq!(got.first, pattern(first, 1), "{first}");
        assert_eq!(got.second, pattern(second, 2), "{second}");
        assert_eq!(got.tail, (0..100).collect::<Vec<u16>>());
        got.reply.send(first as u32).unwrap();
        assert_eq!(reply_rx.recv().unwrap(), first as u32);
    }
}

/// A receiver predicts where a message's large byte string sits from the
/// last message and receives it into a buffer of its own; every way the
/// prediction can go wrong still delivers the message whole.
#[test]
fn byte_strings_received_apart_survive_every_change_of_layout() {
    #[derive(Debug, Serialize, Deserialize)]
    struct Frame {
        name: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        reply: Option<IpcSender<u32>>,
        seq: u32,
    }
    // The same with a plain `Vec<u8>`, which courier reads and writes as a
    // byte string too (`ipc::bytes_seq`).
    #[derive(Debug, Serialize, Deserialize)]
    struct PlainFrame {
        name: String,
        data: Vec<u8>,
        reply: Option<IpcSender<u32>>,
        seq: u32,
    }
    let _check = fd_check();
    // (bytes before the string, string length, with a channel); strings
    // above the plain-`recv` line (7 KiB), so that they arrive split.
    let plan = [
        (1, 9000, false),
        (1, 9000, false),
        (1, 9000, false),
        (40, 9000, false),
        (40, 9001, false),
        (40, 300_000, false),
        (40, 300_000, false),
        (3, 300_000, false),
        (3, 8999, true),
        (3, 8999, false),
        (3, 100, false),
        (3, 70_000, false),
        (3, 70_000, false),
        (5000, 70_000, false),
        (5000, 70_000, false),
    ];
    macro_rules! run_plan {
        ($frame:ident) => {{
            let (tx, rx) = ipc::channel::<$frame>().unwrap();
            for (seq, &(name, len, with_channel)) in plan.iter().enumerate() {
                let (reply, reply_rx) = ipc::channel::<u32>().unwrap();
                tx.send($frame {
                    name: "n".repeat(name),
                    data: pattern(len, seq as u8),
                    reply: with_channel.then_some(reply),
                    seq: seq as u32,
                })
                .unwrap();
                let got = rx.recv().unwrap();
                let what = format!("{} message {seq}", stringify!($frame));
                assert_eq!(got.name.len(), name, "{what}");
                assert_eq!(got.data, pattern(len, seq as u8), "{what}");
                assert_eq!(got.seq, seq as u32);
                if let Some(reply) = got.reply {
                    reply.send(7).unwrap();
                    assert_eq!(reply_rx.recv().unwrap(), 7);
                }
            }
        }};
    }
    run_plan!(Frame);
    run_plan!(PlainFrame);
}

#[test]
fn byte_sequences_of_every_shape_roundtrip() {
    let _check = fd_check();
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Shapes {
        plain: Vec<u8>,
        nested: Vec<Vec<u8>>,
        boxed: Box<[u8]>,
        maybe: Option<Vec<u8>>,
        deque: std::collections::VecDeque<u8>,
        wide: Vec<u16>,
        array: [u8; 5],
        map: HashMap<u8, Vec<u8>>,
    }
    let (tx, rx) = ipc::channel::<Shapes>().unwrap();
    for (i, len) in [0, 1, 127, 128, 3000, 20_000, 300_000]
        .into_iter()
        .enumerate()
    {
        let shapes = Shapes {
            plain: pattern(len, i as u8),
            nested: vec![pattern(len / 2, 1), Vec::new(), pattern(len / 3, 2)],
            boxed: pattern(len / 4, 3).into_boxed_slice(),
            maybe: (i % 2 == 0).then(|| pattern(len, 4)),
            deque: pattern(len / 5, 5).into(),
            wide: (0..len / 7).map(|x| (x as u16).wrapping_mul(3)).collect(),
            array: [1, 2, 3, 4, 5],
            map: HashMap::from([(1, pattern(len / 6, 6)), (2, Vec::new())]),
        };
        let sent = Shapes {
            plain: shapes.plain.clone(),
            nested: shapes.nested.clone(),
            boxed: shapes.boxed.clone(),
            maybe: shapes.maybe.clone(),
            deque: shapes.deque.clone(),
            wide: shapes.wide.clone(),
            array: shapes.array,
            map: shapes.map.clone(),
        };
        tx.send(sent).unwrap();
        assert_eq!(rx.recv().unwrap(), shapes, "length {len}");
    }
}

/// A `Serialize` impl that itself sends a message with a channel inside,
/// while the message it belongs to carries channels and a large byte string
/// (so it is walked twice): each message gets exactly its own channels.
#[test]
fn a_send_from_inside_a_serialize_impl_keeps_the_tables_apart() {
    struct Announcing {
        side: IpcSender<(u32, IpcSender<u32>)>,
        calls: std::cell::Cell<u32>,
    }
    impl Serialize for Announcing {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let walk = self.calls.get() + 1;
            self.calls.set(walk);
            let (tx, rx) = ipc::channel::<u32>().unwrap();
            self.side.send((walk, tx)).unwrap();
            // The nested send's channel must not leak into this message.
            drop(rx);
            (walk, serde_bytes::Bytes::new(&[5; 4096])).serialize(serializer)
        }
    }
    let _check = fd_check();
    let (side_tx, side_rx) = ipc::channel::<(u32, IpcSender<u32>)>().unwrap();
    let (tx, rx) =
        ipc::channel::<(IpcSender<u8>, (u32, serde_bytes::ByteBuf), IpcSender<u8>)>().unwrap();
    let (a_tx, a_rx) = ipc::channel::<u8>().unwrap();
    let (b_tx, b_rx) = ipc::channel::<u8>().unwrap();
    let announcing = Announcing {
        side: side_tx,
        calls: Default::default(),
    };
    let typed = IpcSender::<(IpcSender<u8>, &Announcing, IpcSender<u8>)>::try_from(
        tx.as_fd().try_clone_to_owned().unwrap(),
    )
    .unwrap();
    typed.send((a_tx, &announcing, b_tx)).unwrap();
    let (a, (walk, bytes), b) = rx.recv().unwrap();
    // Sent from inside the second walk, around the first walk's bytes.
    assert_eq!(walk, 1);
    assert_eq!(announcing.calls.get(), 2);
    assert_eq!(bytes.into_vec(), vec![5; 4096]);
    a.send(1).unwrap();
    b.send(2).unwrap();
    assert_eq!((a_rx.recv().unwrap(), b_rx.recv().unwrap()), (1, 2));
    // One nested message per walk, each with its own working channel.
    for expected in 1..=2 {
        let (walk, reply) = side_rx.recv().unwrap();
        assert_eq!(walk, expected);
        assert!(reply.send(0).is_err(), "its receiver was dropped");
    }
}

/// A `Serialize` impl that panics after a channel end was written: the
/// duplicate descriptor is closed and the thread's table is clean again.
#[test]
fn a_panicking_serialize_impl_leaves_no_descriptor_behind() {
    struct Boom(IpcSender<u8>);
    impl Serialize for Boom {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let _ = self.0.serialize(serializer);
            panic!("boom");
        }
    }
    let _check = fd_check();
    let (tx, _rx) = ipc::channel::<u8>().unwrap();
    let (inner, _inner_rx) = ipc::channel::<u8>().unwrap();
    let boom = IpcSender::<Boom>::try_from(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| boom.send(Boom(inner))));
    assert!(sent.is_err());
    // Outside a send, a channel end cannot be serialized: the table is idle.
    let (outside, outside_rx) = ipc::channel::<u8>().unwrap();
    assert!(postcard::to_allocvec(&outside).is_err());
    // And the next send works, with its own channels only.
    let (carrier_tx, carrier_rx) = ipc::channel::<IpcSender<u8>>().unwrap();
    carrier_tx.send(outside).unwrap();
    carrier_rx.recv().unwrap().send(9).unwrap();
    assert_eq!(outside_rx.recv().unwrap(), 9);
}

/// Serializes differently on every walk: a counter, and that many bytes
/// more of the counter's value.
struct Shifty(std::cell::Cell<u8>);

impl Serialize for Shifty {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let walk = self.0.get() + 1;
        self.0.set(walk);
        let bytes = vec![walk; 4096 + usize::from(walk)];
        (walk, serde_bytes::Bytes::new(&bytes)).serialize(serializer)
    }
}

#[test]
fn a_value_that_serializes_differently_each_time_arrives_whole() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(u8, serde_bytes::ByteBuf)>().unwrap();
    let shifty = IpcSender::<Shifty>::try_from(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    shifty.send(Shifty(Default::default())).unwrap();
    let (walk, bytes) = rx.recv().unwrap();
    // The second walk differed at the byte string: the third was sent.
    assert_eq!(walk, 3);
    assert_eq!(bytes.into_vec(), vec![3; 4099]);

    // The same output on every walk: sent from inside the second.
    struct Steady(std::cell::Cell<u8>);
    impl Serialize for Steady {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            self.0.set(self.0.get() + 1);
            (9u8, serde_bytes::Bytes::new(&[9; 5000])).serialize(serializer)
        }
    }
    let walks = Steady(Default::default());
    let steady = IpcSender::<&Steady>::try_from(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    steady.send(&walks).unwrap();
    assert_eq!(walks.0.get(), 2);
    assert_eq!(rx.recv().unwrap().1.into_vec(), vec![9; 5000]);
}

/// A value whose later walk meets its channel ends in another order (as a
/// `Mutex`-guarded list edited between walks would) is refused, not sent with
/// one end in another's place.
#[test]
fn a_value_whose_channels_move_between_walks_is_refused() {
    struct Swapping {
        walks: std::cell::Cell<u8>,
        a: IpcSender<u8>,
        b: IpcSender<u8>,
    }
    impl Serialize for Swapping {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let walk = self.walks.get() + 1;
            self.walks.set(walk);
            let (first, second) = if walk == 1 {
                (&self.a, &self.b)
            } else {
                (&self.b, &self.a)
            };
            // A byte string long enough to go from the caller's memory, which
            // is what makes a second walk.
            (first, second, serde_bytes::Bytes::new(&[7; 5000])).serialize(serializer)
        }
    }
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(IpcSender<u8>, IpcSender<u8>, serde_bytes::ByteBuf)>().unwrap();
    let (a, a_rx) = ipc::channel::<u8>().unwrap();
    let (b, b_rx) = ipc::channel::<u8>().unwrap();
    let swapping =
        IpcSender::<&Swapping>::try_from(tx.as_fd().try_clone_to_owned().unwrap()).unwrap();
    let value = Swapping {
        walks: Default::default(),
        a,
        b,
    };
    assert!(matches!(
        swapping.send(&value),
        Err(IpcError::SerializationError(_))
    ));
    assert!(value.walks.get() >= 2);
    assert!(
        matches!(rx.try_recv(), Err(TryRecvError::Empty)),
        "nothing sent"
    );
    // The same ends in the same order on every walk go through.
    let steady = IpcSender::<(&IpcSender<u8>, &IpcSender<u8>, &serde_bytes::Bytes)>::try_from(
        tx.as_fd().try_clone_to_owned().unwrap(),
    )
    .unwrap();
    steady
        .send((&value.a, &value.b, serde_bytes::Bytes::new(&[7; 5000])))
        .unwrap();
    let (a2, b2, bytes) = rx.recv().unwrap();
    a2.send(1).unwrap();
    b2.send(2).unwrap();
    assert_eq!((a_rx.recv().unwrap(), b_rx.recv().unwrap()), (1, 2));
    assert_eq!(bytes.len(), 5000);
}

/// A send from a thread-local's `Drop`, run after courier's own thread-locals
/// are gone (they were first used later, so they are torn down first): a
/// plain message goes through, and a channel end in one is an error rather
/// than a panic, which would abort the process there.
#[test]
fn a_send_from_a_thread_locals_drop_goes_through() {
    type Ends = (IpcSender<Vec<u8>>, IpcSender<IpcSender<u8>>);
    struct Farewell(Option<Ends>);
    impl Drop for Farewell {
        fn drop(&mut self) {
            if let Some((tx, ends)) = self.0.take() {
                tx.send(vec![7; 100]).unwrap();
                let (end, _keep) = ipc::channel::<u8>().unwrap();
                let refused = ends.send(end);
                tx.send(vec![u8::from(matches!(
                    refused,
                    Err(IpcError::SerializationError(_))
                ))])
                .unwrap();
            }
        }
    }
    thread_local! {
        static FAREWELL: std::cell::RefCell<Farewell> =
            const { std::cell::RefCell::new(Farewell(None)) };
    }
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
    let (ends_tx, _ends_rx) = ipc::channel::<IpcSender<u8>>().unwrap();
    std::thread::spawn(move || {
        // First use of the farewell, then of courier's locals: torn down
        // in the other order.
        FAREWELL.with(|f| *f.borrow_mut() = Farewell(Some((tx.clone(), ends_tx))));
        tx.send(vec![1]).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(rx.recv().unwrap(), vec![1]);
    assert_eq!(rx.recv().unwrap(), vec![7; 100]);
    assert_eq!(rx.recv().unwrap(), vec![1], "the channel end was refused");
}

/// A receive from a thread-local's `Drop`, run after courier's own
/// thread-locals are gone: small, split and large messages all arrive (the
/// call reads into an area of its own instead of the thread's), and a
/// channel end in one is an error rather than a panic, which would abort the
/// process there.
#[test]
fn a_receive_from_a_thread_locals_drop_goes_through() {
    type Ends = (
        IpcReceiver<Vec<u8>>,
        IpcReceiver<IpcSender<u8>>,
        IpcSender<(Vec<Vec<u8>>, bool)>,
    );
    struct Farewell(Option<Ends>);
    impl Drop for Farewell {
        fn drop(&mut self) {
            if let Some((rx, ends, back)) = self.0.take() {
                let got = (0..3).map(|_| rx.recv().unwrap()).collect();
                let refused = matches!(ends.recv(), Err(IpcError::SerializationError(_)));
                back.send((got, refused)).unwrap();
            }
        }
    }
    thread_local! {
        static FAREWELL: std::cell::RefCell<Farewell> =
            const { std::cell::RefCell::new(Farewell(None)) };
    }
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
    let (ends_tx, ends_rx) = ipc::channel::<IpcSender<u8>>().unwrap();
    let (back_tx, back_rx) = ipc::channel().unwrap();
    let sent = vec![vec![1; 10], pattern(50_000, 3), pattern(3 << 20, 4)];
    tx.send(vec![0]).unwrap();
    for m in &sent {
        tx.send(m.clone()).unwrap();
    }
    let (end, _keep) = ipc::channel::<u8>().unwrap();
    ends_tx.send(end).unwrap();
    std::thread::spawn(move || {
        // First use of the farewell, then of courier's locals: torn down
        // in the other order.
        FAREWELL.with(|f| *f.borrow_mut() = Farewell(None));
        assert_eq!(rx.recv().unwrap(), vec![0]);
        FAREWELL.with(|f| *f.borrow_mut() = Farewell(Some((rx, ends_rx, back_tx))));
    })
    .join()
    .unwrap();
    assert_eq!(back_rx.recv().unwrap(), (sent, true));
}

/// A receiver that does not read holds its sender to
/// `max_region_bytes_in_flight` of regions: past it, large messages go in
/// fragments, whose send waits for the receiver (back-pressure). Every
/// message then arrives, in order.
#[test]
fn a_receiver_that_does_not_read_bounds_its_senders_regions() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LEN: usize = 3 << 20;
    const MESSAGES: usize = 16;
    let _check = fd_check();
    with_config(
        |c| c.max_region_bytes_in_flight = 16 << 20,
        || {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            let sent = std::sync::Arc::new(AtomicUsize::new(0));
            let sender = std::thread::spawn({
                let sent = sent.clone();
                move || {
                    for i in 0..MESSAGES {
                        tx.send(&pattern(LEN, i as u8)).unwrap();
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            // Until the sender stops making progress (it blocks), or is done.
            let started = Instant::now();
            let mut seen = usize::MAX;
            while sent.load(Ordering::Relaxed) != seen {
                seen = sent.load(Ordering::Relaxed);
                assert!(started.elapsed() < Duration::from_secs(20), "never settled");
                std::thread::sleep(Duration::from_millis(300));
            }
            // Regions are 4 MiB (a power of two): four in flight fit 16 MiB,
            // then one fragmented message fills the carrier and waits.
            assert!(seen <= 5, "{seen} of {MESSAGES} sent with nothing read");
            for i in 0..MESSAGES {
                assert_eq!(rx.recv().unwrap(), pattern(LEN, i as u8), "message {i}");
            }
            sender.join().unwrap();
        },
    );
}

/// The in-flight bound counts the bytes of messages, not the sizes of
/// their regions (rounded up to a power of two, and reused for smaller
/// messages): a thread that sends a 9 MiB message (a 16 MiB region) and
/// then a 2 MiB one (past one packet whatever the socket buffer), with a
/// 16 MiB bound and nothing read yet, sends both by region rather than
/// blocking on a fragmented send nobody reads.
#[test]
fn the_in_flight_bound_counts_message_bytes() {
    let _check = fd_check();
    with_config(
        |c| c.max_region_bytes_in_flight = 16 << 20,
        || {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            let (big, small) = (pattern(9 << 20, 1), pattern(2 << 20, 2));
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let sender = std::thread::spawn({
                let (big, small) = (big.clone(), small.clone());
                move || {
                    tx.send(&big).unwrap();
                    tx.send(&small).unwrap();
                    done_tx.send(()).unwrap();
                }
            });
            // (On failure the sender stays blocked until the receiver
            // below is dropped, which ends its send with an error.)
            let sent = done_rx.recv_timeout(Duration::from_secs(20));
            assert!(sent.is_ok(), "the second send blocked");
            assert_eq!(rx.recv().unwrap(), big);
            assert_eq!(rx.recv().unwrap(), small);
            sender.join().unwrap();
        },
    );
}

/// A region message the receiver refuses (over its size limit) hands its
/// region back to the sender: it is not counted in flight for good, so the
/// next large messages still go by region (here, with a bound that holds
/// one of them, the second would otherwise be fragmented, and refused
/// while its sender waits, which fails that send).
#[test]
fn a_refused_region_message_gives_its_region_back() {
    let _check = fd_check();
    with_config(
        |c| c.max_region_bytes_in_flight = 3 << 20,
        || {
            let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
            rx.set_max_message_size(1 << 20);
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let sender = std::thread::spawn(move || {
                (0..4u8)
                    .map(|i| {
                        let sent = tx.send(pattern(2 << 20, i)).map_err(|e| e.to_string());
                        go_rx.recv().unwrap();
                        sent
                    })
                    .collect::<Vec<_>>()
            });
            for i in 0..4 {
                let refused = expect_wire_error(rx.recv(), "a message over the limit");
                assert!(
                    matches!(refused, Some(WireError::TooLarge { .. })),
                    "message {i}: {refused:?}"
                );
                go_tx.send(()).unwrap();
            }
            let sent = sender.join().unwrap();
            assert!(sent.iter().all(Result::is_ok), "{sent:?}");
        },
    );
}

#[test]
fn fragmented_messages_when_regions_are_off() {
    let _check = fd_check();
    with_config(
        |c| c.large_messages = LargeMessages::Fragments,
        || {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            for size in [300_000, 1 << 20, 8 << 20] {
                let data = pattern(size, 9);
                // A message larger than the socket buffer blocks its sender
                // until the receiver reads, so send from another thread.
                let sender = {
                    let tx = tx.clone();
                    let data = data.clone();
                    std::thread::spawn(move || tx.send(&data).unwrap())
                };
                assert_eq!(rx.recv().unwrap(), data);
                sender.join().unwrap();
            }
        },
    );
}

#[test]
fn concurrent_large_senders_never_interleave() {
    let _check = fd_check();
    for large in [LargeMessages::Fragments, LargeMessages::SharedMemory] {
        with_config(
            |c| c.large_messages = large,
            || {
                let (tx, rx) = ipc::bytes_channel().unwrap();
                let senders: Vec<_> = (0..4u8)
                    .map(|id| {
                        let tx = tx.clone();
                        std::thread::spawn(move || {
                            for round in 0..3u8 {
                                tx.send(&pattern(400_000 + usize::from(id) * 1000, id ^ round))
                                    .unwrap();
                            }
                        })
                    })
                    .collect();
                for _ in 0..12 {
                    let got = rx.recv().unwrap();
                    let id = ((got.len() - 400_000) / 1000) as u8;
                    let round = (0..3u8).find(|r| got == pattern(got.len(), id ^ r));
                    assert!(
                        round.is_some(),
                        "message from sender {id} was corrupted ({large:?}, len {})",
                        got.len()
                    );
                }
                for s in senders {
                    s.join().unwrap();
                }
            },
        );
    }
}

#[test]
fn send_vectored_gathers_parts() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    let body = pattern(100_000, 1);
    let parts: Vec<IoSlice<'_>> = body.chunks(1000).map(IoSlice::new).collect();
    tx.send_vectored(&parts).unwrap();
    assert_eq!(rx.recv().unwrap(), body);
    // More parts than one iovec takes.
    let parts: Vec<IoSlice<'_>> = body.chunks(10).map(IoSlice::new).collect();
    tx.send_vectored(&parts).unwrap();
    assert_eq!(rx.recv().unwrap(), body);
    tx.send_vectored(&[
        IoSlice::new(b"head"),
        IoSlice::new(b""),
        IoSlice::new(b"tail"),
    ])
    .unwrap();
    assert_eq!(rx.recv().unwrap(), b"headtail");
}

#[test]
fn channels_travel_inside_messages() {
    let _check = fd_check();
    #[derive(Serialize, Deserialize)]
    struct Request {
        reply: IpcSender<String>,
        data: IpcReceiver<u32>,
        raw: IpcBytesSender,
    }
    let (req_tx, req_rx) = ipc::channel::<Request>().unwrap();
    let (reply_tx, reply_rx) = ipc::channel::<String>().unwrap();
    let (data_tx, data_rx) = ipc::channel::<u32>().unwrap();
    let (raw_tx, raw_rx) = ipc::bytes_channel().unwrap();
    req_tx
        .send(Request {
            reply: reply_tx,
            data: data_rx,
            raw: raw_tx,
        })
        .unwrap();
    let request = req_rx.recv().unwrap();
    data_tx.send(5).unwrap();
    assert_eq!(request.data.recv().unwrap(), 5);
    request.reply.send("pong".into()).unwrap();
    assert_eq!(reply_rx.recv().unwrap(), "pong");
    request.raw.send(b"raw").unwrap();
    assert_eq!(raw_rx.recv().unwrap(), b"raw");
    // Dropping the only transferred sender disconnects the channel.
    drop(request);
    assert!(matches!(reply_rx.recv(), Err(IpcError::Disconnected)));
    assert!(matches!(data_tx.send(1), Err(IpcError::Disconnected)));
}

#[test]
fn many_channels_in_one_message_and_a_limit() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<IpcSender<u8>>>().unwrap();
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..63).map(|_| ipc::channel::<u8>().unwrap()).unzip();
    tx.send(senders).unwrap();
    let senders = rx.recv().unwrap();
    for (i, (s, r)) in senders.iter().zip(&receivers).enumerate() {
        s.send(i as u8).unwrap();
        assert_eq!(r.recv().unwrap(), i as u8);
    }
    // One more channel end than a message may carry: an error, not a panic.
    let too_many: Vec<_> = (0..=ipc::MAX_FDS)
        .map(|_| ipc::channel::<u8>().unwrap().0)
        .collect();
    assert!(matches!(tx.send(too_many), Err(IpcError::Io(_))));
    // Channels also travel with payloads in shared memory and fragments.
    for large in [LargeMessages::SharedMemory, LargeMessages::Fragments] {
        with_config(
            |c| c.large_messages = large,
            || {
                let (tx, rx) = ipc::channel::<(IpcSender<u8>, Blob)>().unwrap();
                let (s, r) = ipc::channel::<u8>().unwrap();
                let blob = Blob {
                    id: 1,
                    bytes: pattern(300_000, 4),
                };
                let sender = std::thread::spawn(move || tx.send((s, blob)).unwrap());
                let (s, blob) = rx.recv().unwrap();
                sender.join().unwrap();
                assert_eq!(blob.bytes, pattern(300_000, 4));
                s.send(9).unwrap();
                assert_eq!(r.recv().unwrap(), 9);
            },
        );
    }
}

#[test]
fn opaque_ends_and_untyped_messages() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Shape>().unwrap();
    let tx = tx.to_opaque().to::<Shape>();
    let rx: OpaqueIpcReceiver = rx.to_opaque();
    tx.send(Shape::Point { x: 1, y: 2 }).unwrap();
    let message: IpcMessage = rx.recv().unwrap();
    assert!(!message.data().is_empty());
    assert_eq!(message.to::<Shape>().unwrap(), Shape::Point { x: 1, y: 2 });
    // A message deserialized as the wrong type is an error, not a panic.
    tx.send(Shape::Unit).unwrap();
    assert!(rx.recv().unwrap().to::<(u64, u64)>().is_err());
    let rx = rx.to::<Shape>();
    tx.send(Shape::Unit).unwrap();
    assert_eq!(rx.recv().unwrap(), Shape::Unit);
    assert_eq!(
        IpcMessage::from_data(postcard_bytes_of_u32(7))
            .to::<u32>()
            .unwrap(),
        7
    );
}

fn postcard_bytes_of_u32(v: u32) -> Vec<u8> {
    // postcard encodes a u32 as a varint; 7 fits one byte.
    assert!(v < 128);
    vec![v as u8]
}

#[test]
fn try_recv_and_timeouts() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<u8>().unwrap();
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    let start = Instant::now();
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_millis(20)),
        Err(TryRecvError::Empty)
    ));
    assert!(start.elapsed() >= Duration::from_millis(20));
    tx.send(1).unwrap();
    assert_eq!(rx.try_recv().unwrap(), 1);
    tx.send(2).unwrap();
    assert_eq!(rx.try_recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    drop(tx);
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::IpcError(IpcError::Disconnected))
    ));
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_secs(10)),
        Err(TryRecvError::IpcError(IpcError::Disconnected))
    ));

    let (tx, rx) = ipc::bytes_channel().unwrap();
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_millis(5)),
        Err(TryRecvError::Empty)
    ));
    tx.send(b"x").unwrap();
    assert_eq!(rx.try_recv_timeout(Duration::from_secs(10)).unwrap(), b"x");
}

#[test]
fn disconnection_both_ways() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<u32>().unwrap();
    let tx2 = tx.clone();
    tx.send(1).unwrap();
    drop(tx);
    tx2.send(2).unwrap();
    drop(tx2);
    // Queued messages come first, then the disconnection, every time.
    assert_eq!(rx.recv().unwrap(), 1);
    assert_eq!(rx.recv().unwrap(), 2);
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));

    let (tx, rx) = ipc::channel::<u32>().unwrap();
    drop(rx);
    assert!(matches!(tx.send(1), Err(IpcError::Disconnected)));
    let (tx, rx) = ipc::bytes_channel().unwrap();
    drop(rx);
    assert_eq!(
        tx.send(b"x").unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
    assert_eq!(
        tx.send(&pattern(1 << 20, 0)).unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
}

#[test]
fn size_limit_is_checked_before_allocating() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    rx.set_max_message_size(1000);
    tx.send(&pattern(1001, 0)).unwrap();
    tx.send(&pattern(200_000, 0)).unwrap();
    tx.send(&pattern(1000, 0)).unwrap();
    for _ in 0..2 {
        match rx.recv() {
            Err(IpcError::Io(e)) => assert!(matches!(
                wire_error(&e),
                Some(WireError::TooLarge { limit: 1000, .. })
            )),
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }
    assert_eq!(rx.recv().unwrap(), pattern(1000, 0));
}

#[test]
fn one_shot_server_in_process() {
    let _check = fd_check();
    let (server, name) = IpcOneShotServer::<(String, IpcSender<u8>)>::new().unwrap();
    let (tx, rx) = ipc::channel::<u8>().unwrap();
    let client = IpcSender::<(String, IpcSender<u8>)>::connect(name.clone()).unwrap();
    client.send(("hi".into(), tx)).unwrap();
    let (server_rx, (greeting, reply)) = server.accept().unwrap();
    assert_eq!(greeting, "hi");
    reply.send(3).unwrap();
    assert_eq!(rx.recv().unwrap(), 3);
    client
        .send(("again".into(), ipc::channel().unwrap().0))
        .unwrap();
    assert_eq!(server_rx.recv().unwrap().0, "again");
    // The rendezvous socket is gone once the server is consumed.
    assert!(!std::path::Path::new(&name).exists());

    let (server, _name) = IpcOneShotServer::<u8>::new().unwrap();
    match server.accept_timeout(Duration::from_millis(20)) {
        Err(IpcError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn senders_are_sync_and_receivers_are_send() {
    fn sync<T: Sync + Send>() {}
    fn send<T: Send>() {}
    sync::<IpcSender<Shape>>();
    sync::<IpcBytesSender>();
    send::<IpcReceiver<Shape>>();
    send::<IpcBytesReceiver>();
}

#[test]
fn many_threads_share_one_sender() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(u8, u32)>().unwrap();
    let threads: Vec<_> = (0..4u8)
        .map(|id| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for seq in 0..2000 {
                    tx.send((id, seq)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut next: HashMap<u8, u32> = HashMap::new();
    let mut count = 0;
    while let Ok((id, seq)) = rx.recv() {
        let expected = next.entry(id).or_default();
        assert_eq!(seq, *expected, "per-sender order");
        *expected += 1;
        count += 1;
    }
    assert_eq!(count, 8000);
    for t in threads {
        t.join().unwrap();
    }
}

// ===== a hostile peer =====

/// A bytes receiver and the raw socket that feeds it.
fn raw_pair() -> (OwnedFd, IpcBytesReceiver) {
    let (a, b) = seqpacket_pair();
    (a, IpcBytesReceiver::try_from(b).unwrap())
}

fn expect_wire_error<T: std::fmt::Debug>(
    result: Result<T, IpcError>,
    what: &str,
) -> Option<WireError> {
    match result {
        Err(IpcError::Io(e)) => wire_error(&e),
        other => panic!("{what}: expected an I/O error, got {other:?}"),
    }
}

#[test]
fn garbage_gives_typed_errors_and_the_channel_survives() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let (pipe_r, pipe_w) = rustix::pipe::pipe().unwrap();
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");
    let mut claims_more = header(0, 0, 10, 0, 0);
    claims_more.extend_from_slice(b"abc");
    // (packets, each with its descriptors; what they are; what the receiver
    // must say)
    type Case<'a> = (
        Vec<(Vec<u8>, Vec<std::os::fd::BorrowedFd<'a>>)>,
        &'static str,
        WireError,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            vec![(b"short".to_vec(), vec![])],
            "short packet",
            WireError::BadHeader("bad magic"),
        ),
        (
            vec![(vec![0xff; 64], vec![])],
            "bad magic",
            WireError::BadHeader("bad magic"),
        ),
        (
            vec![(header(7, 0, 0, 0, 0), vec![])],
            "unknown body",
            WireError::BadHeader("unknown body"),
        ),
        (
            vec![(claims_more, vec![])],
            "length mismatch",
            WireError::Truncated,
        ),
        (
            vec![(header(0, 0, 1 << 40, 0, 0), vec![])],
            "huge claim",
            WireError::TooLarge {
                claimed: 1 << 40,
                limit: 1 << 30,
            },
        ),
        (
            vec![(header(1, 0, 1 << 20, 0, 0), vec![])],
            "fragmented without carrier",
            WireError::BadHeader("carrier descriptor missing"),
        ),
        (
            vec![(header(2, 0, 1 << 20, 0, 0), vec![])],
            "region without carrier",
            WireError::BadHeader("carrier descriptor missing"),
        ),
        (
            vec![(header(3, 0, 100, 0, 0x5eed), vec![])],
            "a kept region nobody sent",
            WireError::BadRegion,
        ),
        (
            vec![(header(3, 1, 100, 0, 0x5eed), vec![])],
            "a kept region with descriptors",
            WireError::BadHeader("descriptors with a kept region"),
        ),
        (
            vec![(
                header(3, 0, 3, 0, 0x5eed)
                    .into_iter()
                    .chain(*b"abc")
                    .collect(),
                vec![],
            )],
            "a kept region with inline bytes",
            WireError::Truncated,
        ),
        (
            vec![(fd_packet(1, 5), vec![pipe_r.as_fd()])],
            "descriptors nobody announced",
            WireError::BadHeader("descriptor packet without a message"),
        ),
        (
            vec![
                (header(2, 1, 100, 3, 6), vec![]),
                (fd_packet(1, 6), vec![pipe_r.as_fd()]),
            ],
            "a pipe posing as a region",
            WireError::BadRegion,
        ),
        (
            vec![
                (header(1, 1, 1 << 20, 3, 7), vec![]),
                (fd_packet(1, 7), vec![pipe_r.as_fd()]),
            ],
            "a pipe posing as a fragment socket",
            WireError::Truncated,
        ),
        (
            vec![
                (header(0, 1, 0, 0, 8), vec![]),
                (fd_packet(2, 8), vec![pipe_r.as_fd(), pipe_w.as_fd()]),
            ],
            "more descriptors than announced",
            WireError::UnexpectedFds {
                announced: 1,
                received: 2,
            },
        ),
        (
            vec![
                (header(0, 2, 0, 0, 9), vec![]),
                (fd_packet(9, 10), vec![pipe_r.as_fd()]),
            ],
            "descriptors for another message",
            WireError::BadHeader("descriptor packet for no message"),
        ),
    ];
    for (packets, what, expected) in &cases {
        for (bytes, fds) in packets {
            raw_send(&raw, bytes, fds);
        }
        let err = expect_wire_error(rx.recv(), what);
        assert_eq!(err, Some(*expected), "{what}");
        if *what == "descriptors for another message" {
            // The message still waits for its own descriptors: give up on it
            // by sending them wrongly counted.
            raw_send(&raw, &fd_packet(1, 9), &[pipe_r.as_fd()]);
            assert_eq!(
                expect_wire_error(rx.recv(), what),
                Some(WireError::UnexpectedFds {
                    announced: 2,
                    received: 1
                })
            );
        }
        // The channel still works after each bad message.
        raw_send(&raw, &inline_ok, &[]);
        assert_eq!(rx.recv().unwrap(), b"abc", "{what}");
    }
    // Descriptors attached to a data packet are closed unread; the message
    // itself is fine.
    raw_send(&raw, &inline_ok, &[pipe_r.as_fd(), pipe_w.as_fd()]);
    assert_eq!(rx.recv().unwrap(), b"abc");
    drop((pipe_r, pipe_w));
}

/// A peer that makes its own regions and plays every trick with their
/// state word: each of its messages is read or refused on its own, and an
/// honest sender to the same receiver keeps getting through.
/// A region on hugetlbfs is refused: sealing it against shrinking does not stop its owner from
/// punching holes, and a hole in the receiver's mapping can raise `SIGBUS`. (Skipped where the
/// kernel makes no huge page memfds; without a huge page pool the mapping fails anyway, so
/// only a machine with one tells the check from that.)
#[test]
fn a_region_on_hugetlbfs_is_refused() {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    const HUGE: u64 = 2 << 20;
    let _check = fd_check();
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB;
    let Ok(fd) = fs::memfd_create("huge", flags) else {
        eprintln!("no hugetlbfs memfds here: skipped");
        return;
    };
    fs::ftruncate(&fd, HUGE).unwrap();
    fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    let (raw, rx) = raw_pair();
    raw_send(&raw, &header(2, 1, 1000, 3, 7), &[]);
    raw_send(&raw, &fd_packet(1, 7), &[fd.as_fd()]);
    assert_eq!(
        expect_wire_error(rx.recv(), "hugetlbfs region"),
        Some(WireError::BadRegion)
    );
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");
    raw_send(&raw, &inline_ok, &[]);
    assert_eq!(rx.recv().unwrap(), b"abc");
}

#[test]
fn a_hostile_region_owner_cannot_spoil_the_receiver() {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    use rustix::io::{pread, pwrite};
    const REGION: u64 = 256 << 10;
    const PAYLOAD: u64 = 64; // where the payload starts in a region
    let region = |fill: u8, len: usize| {
        let fd =
            fs::memfd_create("hostile", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        fs::ftruncate(&fd, REGION).unwrap();
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        pwrite(&fd, &vec![fill; len], PAYLOAD).unwrap();
        fd
    };
    let state = |fd: &OwnedFd| {
        let mut word = [0u8; 4];
        pread(fd, &mut word, 0).unwrap();
        u32::from_le_bytes(word)
    };
    let set_state = |fd: &OwnedFd, v: u32| pwrite(fd, &v.to_le_bytes(), 0).map(drop).unwrap();
    // A region message: header (shared memory, one carrier descriptor), then
    // its descriptor packet.
    let send_region = |raw: &OwnedFd, fd: &OwnedFd, total: u64, tag: u64| {
        raw_send(raw, &header(2, 1, total, 3, tag), &[]);
        raw_send(raw, &fd_packet(1, tag), &[fd.as_fd()]);
    };
    let kept =
        |raw: &OwnedFd, total: u64, tag: u64| raw_send(raw, &header(3, 0, total, 0, tag), &[]);

    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let honest = IpcBytesSender::try_from(raw.try_clone().unwrap()).unwrap();
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");

    // A new region of `len` bytes of `fill`, sent and read.
    let deliver = |fill: u8, len: usize, tag: u64| {
        let fd = region(fill, len);
        send_region(&raw, &fd, len as u64, tag);
        assert_eq!(rx.recv().unwrap(), vec![fill; len], "region {tag}");
        fd
    };

    // The receiver holds a region it was sent, and says so in it.
    let first = deliver(1, 1000, 11);
    assert_eq!(state(&first), 2, "held");
    // Named again, after its owner rewrote it: the new bytes, copied out once.
    pwrite(&first, &[9; 500], PAYLOAD).unwrap();
    kept(&raw, 500, 11);
    assert_eq!(rx.recv().unwrap(), vec![9; 500]);
    // Named with a skew: the payload is read from that far in ...
    pwrite(&first, &[5; 300], PAYLOAD + 63).unwrap();
    let mut skewed = header(3, 0, 300, 0, 11);
    skewed[6] = 63;
    raw_send(&raw, &skewed, &[]);
    assert_eq!(rx.recv().unwrap(), vec![5; 300]);
    // ... and a skew that takes it past the mapping is refused.
    let mut skewed = header(3, 0, REGION - PAYLOAD, 0, 11);
    skewed[6] = 1;
    raw_send(&raw, &skewed, &[]);
    assert_eq!(
        expect_wire_error(rx.recv(), "skewed past the mapping"),
        Some(WireError::BadRegion)
    );
    // Named for more than the receiver mapped: refused, the channel goes on.
    kept(&raw, REGION, 11);
    assert_eq!(
        expect_wire_error(rx.recv(), "past the mapping"),
        Some(WireError::BadRegion)
    );
    raw_send(&raw, &inline_ok, &[]);
    assert_eq!(rx.recv().unwrap(), b"abc");
    // Named for a length whose end overflows, to a receiver without a limit.
    rx.set_max_message_size(u64::MAX);
    kept(&raw, u64::MAX - 63, 11);
    assert_eq!(
        expect_wire_error(rx.recv(), "overflowing"),
        Some(WireError::BadRegion)
    );
    rx.set_max_message_size(1 << 30);

    // Every region it holds marked busy by its owner: the receiver cannot let
    // go of any, so the next region is read once and kept nowhere ...
    let mut pinned = vec![first];
    pinned.extend((21..24u64).map(|tag| deliver(tag as u8, 100, tag)));
    for fd in &pinned {
        set_state(fd, 3);
    }
    let extra = deliver(7, 5000, 31);
    assert_eq!(state(&extra), 0, "not held: free for its owner");
    kept(&raw, 10, 31);
    assert_eq!(
        expect_wire_error(rx.recv(), "not held"),
        Some(WireError::BadRegion)
    );
    // ... and an honest sender's large and medium messages still arrive whole.
    for i in 0..4u8 {
        for len in [300_000, 20_000] {
            let data = pattern(len, i);
            honest.send(&data).unwrap();
            assert_eq!(
                rx.recv().unwrap(),
                data,
                "honest message {i} of {len} bytes"
            );
        }
    }
    // Let go by their owner: held regions are let go for new ones again.
    for fd in &pinned {
        set_state(fd, 2);
    }
    let last = deliver(8, 100, 41);
    assert_eq!(state(&last), 2, "held again");
    drop(rx);
}

/// A streamed region message is read as its region fills, whoever fills
/// it; one whose sender goes before the end is an error as soon as no
/// sender is left, not a hang (nor a wait of the fragment timeout).
#[test]
fn a_streamed_payload_is_read_as_it_fills_and_a_gone_sender_ends_it() {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    use rustix::io::pwrite;
    const PAYLOAD: u64 = 64; // where the payload starts in a region
    const FILLED: u64 = 16; // where the region says how far it is filled
    const LEN: usize = 3 << 20;
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let region = {
        let fd =
            fs::memfd_create("stream", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        fs::ftruncate(&fd, 4 << 20).unwrap();
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        fd
    };
    // Shared memory, one carrier, skew 0, streamed.
    let mut streamed = header(2, 1, LEN as u64, 3, 77);
    streamed[7] = 1;
    raw_send(&raw, &streamed, &[]);
    raw_send(&raw, &fd_packet(1, 77), &[region.as_fd()]);
    let data = pattern(LEN, 7);
    let filler = std::thread::spawn({
        let region = region.try_clone().unwrap();
        let data = data.clone();
        move || {
            // Half, then the rest, with no futex wake: the receiver's
            // periodic look must find them.
            for (from, to) in [(0, LEN / 2), (LEN / 2, LEN)] {
                std::thread::sleep(Duration::from_millis(30));
                pwrite(&region, &data[from..to], PAYLOAD + from as u64).unwrap();
                pwrite(&region, &(to as u64).to_le_bytes(), FILLED).unwrap();
            }
        }
    });
    assert_eq!(rx.recv().unwrap(), data);
    filler.join().unwrap();

    // Named again by a peer that creeps (a byte a millisecond): the stream
    // fails at the fragment timeout, progress or not.
    pwrite(&region, &0u64.to_le_bytes(), FILLED).unwrap();
    let mut creeping = header(3, 0, 1 << 20, 0, 77);
    creeping[7] = 1;
    raw_send(&raw, &creeping, &[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creeper = std::thread::spawn({
        let (region, stop) = (region.try_clone().unwrap(), stop.clone());
        move || {
            for filled in 1u64.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                pwrite(&region, &filled.to_le_bytes(), FILLED).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let started = Instant::now();
    let crept = with_config(
        |c| c.fragment_timeout = Duration::from_secs(1),
        || expect_wire_error(rx.recv(), "a creeping stream"),
    );
    assert_eq!(crept, Some(WireError::FragmentTimeout));
    assert!(started.elapsed() < Duration::from_secs(10), "bounded");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    creeper.join().unwrap();

    // The same region named again, streamed, never filled: its sender goes.
    pwrite(&region, &0u64.to_le_bytes(), FILLED).unwrap();
    let mut kept = header(3, 0, 1000, 0, 77);
    kept[7] = 1;
    raw_send(&raw, &kept, &[]);
    let started = Instant::now();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(raw);
    });
    assert_eq!(
        expect_wire_error(rx.recv(), "a stream whose sender went"),
        Some(WireError::Truncated)
    );
    assert!(started.elapsed() < Duration::from_secs(5), "no long wait");
    closer.join().unwrap();
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

/// A receiver that moves while a hostile owner pins a region of an odd size
/// (not a whole number of pages) moves whole: the region comes along.
#[test]
fn a_receiver_moves_whole_past_a_pinned_region_of_odd_size() {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    use rustix::io::pwrite;
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let (carrier_tx, carrier_rx) = ipc::channel::<IpcBytesReceiver>().unwrap();
    let odd = fs::memfd_create("odd", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&odd, 100_001).unwrap();
    fs::fcntl_add_seals(&odd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    pwrite(&odd, &[5; 1000], 64).unwrap();
    raw_send(&raw, &header(2, 1, 1000, 3, 77), &[]);
    raw_send(&raw, &fd_packet(1, 77), &[odd.as_fd()]);
    assert_eq!(rx.recv().unwrap(), vec![5; 1000]);
    // Pinned (held, and busy as if a kept message were on its way), then a
    // kept message and a plain one, both still on the socket when it moves.
    pwrite(&odd, &3u32.to_le_bytes(), 0).unwrap();
    raw_send(&raw, &header(3, 0, 900, 0, 77), &[]);
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");
    raw_send(&raw, &inline_ok, &[]);
    carrier_tx.send(rx).unwrap();
    let rx = carrier_rx.recv().unwrap();
    assert_eq!(rx.recv().unwrap(), vec![5; 900]);
    assert_eq!(rx.recv().unwrap(), b"abc");
}

#[test]
fn oversized_packets_and_descriptor_floods() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    // A peer with a larger send buffer sends a packet longer than ours can be.
    net::sockopt::set_socket_send_buffer_size(&raw, 4 << 20).unwrap();
    let mut big = header(0, 0, (1 << 20) - 40, 0, 0);
    big.resize(1 << 20, 7);
    raw_send(&raw, &big, &[]);
    assert_eq!(
        expect_wire_error(rx.recv(), "oversized"),
        Some(WireError::Truncated)
    );
    // More descriptors in a packet than its message announced: the receiver
    // reports it and closes them all.
    let pipes: Vec<_> = (0..40).map(|_| rustix::pipe::pipe().unwrap()).collect();
    let fds: Vec<_> = pipes
        .iter()
        .flat_map(|(a, b)| [a.as_fd(), b.as_fd()])
        .collect();
    raw_send(&raw, &header(0, 64, 0, 0, 11), &[]);
    raw_send(&raw, &fd_packet(80, 11), &fds);
    assert_eq!(
        expect_wire_error(rx.recv(), "flood"),
        Some(WireError::UnexpectedFds {
            announced: 64,
            received: 80
        })
    );
    drop(fds);
    drop(pipes);
    raw_send(&raw, &header(0, 0, 0, 0, 0), &[]);
    assert_eq!(rx.recv().unwrap(), b"");
    // Announced descriptors that never come, then the peer hangs up: the
    // message fails, then the channel reports the disconnection.
    raw_send(&raw, &header(0, 1, 0, 0, 12), &[]);
    drop(raw);
    assert_eq!(
        expect_wire_error(rx.recv(), "hang-up"),
        Some(WireError::Truncated)
    );
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

/// Sender A's data packet announces a descriptor; before A's descriptor packet, sender B's
/// plain message arrives. B is delivered at once, A when its descriptor comes, even to a
/// receiver that comes back only `late` after it came.
fn b_passes_while_a_waits(late: Duration) {
    let _check = fd_check();
    let (raw, rx) = {
        let (a, b) = net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        (
            a,
            IpcReceiver::<(u8, Option<IpcBytesSender>)>::try_from(b).unwrap(),
        )
    };
    let (tx_a, rx_a) = ipc::bytes_channel().unwrap();
    let mut a = header(0, 1, 3, 0, 100);
    a.extend_from_slice(&[1, 1, 0]); // (1u8, Some(channel index 0))
    let mut b = header(0, 0, 2, 0, 0);
    b.extend_from_slice(&[2, 0]); // (2u8, None)
    raw_send(&raw, &a, &[]);
    assert!(
        matches!(rx.try_recv(), Err(TryRecvError::Empty)),
        "A has no descriptor yet"
    );
    raw_send(&raw, &b, &[]);
    assert!(
        matches!(rx.recv().unwrap(), (2, None)),
        "B does not wait for A"
    );
    raw_send(&raw, &fd_packet(1, 100), &[tx_a.as_fd()]);
    std::thread::sleep(late);
    let (n, sender) = rx.recv().unwrap();
    assert_eq!(n, 1);
    sender.unwrap().send(b"to a").unwrap();
    assert_eq!(rx_a.recv().unwrap(), b"to a");
}

#[test]
fn complete_messages_never_wait_behind_incomplete_ones() {
    b_passes_while_a_waits(Duration::ZERO);
}

/// A message whose descriptors are already queued is not given up because its receiver came
/// back late: only a socket read dry says the descriptors are missing (the give-up wait is 10
/// s, so the receiver here is busy with B for longer).
#[test]
fn a_slow_receiver_still_gets_a_message_whose_descriptors_are_queued() {
    b_passes_while_a_waits(Duration::from_millis(10_500));
}

#[test]
fn announced_descriptors_that_never_come_are_bounded() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    // 65 messages announce descriptors and never send them: the oldest is
    // given up, so a peer cannot make the receiver hold more.
    for tag in 0..65u64 {
        raw_send(&raw, &header(0, 1, 0, 0, 1000 + tag), &[]);
    }
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");
    raw_send(&raw, &inline_ok, &[]);
    assert_eq!(
        expect_wire_error(rx.recv(), "too many waiting"),
        Some(WireError::DescriptorsMissing)
    );
    assert_eq!(rx.recv().unwrap(), b"abc");
    // The given-up message's descriptors, if they come late, are dropped quietly.
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    raw_send(&raw, &fd_packet(1, 1000), &[pipe_r.as_fd()]);
    raw_send(&raw, &inline_ok, &[]);
    assert_eq!(rx.recv().unwrap(), b"abc");
    drop(pipe_r);
}

/// A message whose descriptors never come is given up when its wait (10 s)
/// runs out, also inside a longer timed receive: the receive wakes for it,
/// rather than sleeping to its own deadline and saying `Empty`.
#[test]
fn missing_descriptors_expire_inside_a_longer_timed_receive() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    raw_send(&raw, &header(0, 1, 0, 0, 4242), &[]);
    let started = Instant::now();
    match rx.try_recv_timeout(Duration::from_secs(120)) {
        Err(TryRecvError::IpcError(IpcError::Io(e))) => {
            assert_eq!(wire_error(&e), Some(WireError::DescriptorsMissing));
        }
        other => panic!("expected DescriptorsMissing, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(60)).contains(&waited),
        "given up after {waited:?}"
    );
}

#[test]
fn empty_packets_are_not_the_end_of_the_stream() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    raw_send(&raw, &[], &[]);
    assert_eq!(
        expect_wire_error(rx.recv(), "empty"),
        Some(WireError::BadHeader("empty packet"))
    );
    let mut inline_ok = header(0, 0, 3, 0, 0);
    inline_ok.extend_from_slice(b"abc");
    raw_send(&raw, &inline_ok, &[]);
    assert_eq!(rx.recv().unwrap(), b"abc");
    drop(raw);
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
    // An empty packet, a message, and the peer gone: the message still arrives.
    let (raw, rx) = raw_pair();
    raw_send(&raw, &[], &[]);
    raw_send(&raw, &inline_ok, &[]);
    drop(raw);
    assert_eq!(
        expect_wire_error(rx.recv(), "empty, then gone"),
        Some(WireError::BadHeader("empty packet"))
    );
    assert_eq!(rx.recv().unwrap(), b"abc");
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
    // Two empty packets, a message, and the peer gone: the message still
    // arrives (a peek at the next packet alone would see only emptiness).
    let (raw, rx) = raw_pair();
    raw_send(&raw, &[], &[]);
    raw_send(&raw, &[], &[]);
    raw_send(&raw, &inline_ok, &[]);
    drop(raw);
    for _ in 0..2 {
        assert_eq!(
            expect_wire_error(rx.recv(), "two empty, then gone"),
            Some(WireError::BadHeader("empty packet"))
        );
    }
    assert_eq!(rx.recv().unwrap(), b"abc");
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

#[test]
fn a_refused_large_message_leaves_no_trace() {
    let _check = fd_check();
    // Above one packet the payload travels in a region whose descriptor
    // follows the header; refusing the header must drop that packet quietly.
    let (tx, rx) = ipc::bytes_channel().unwrap();
    rx.set_max_message_size(1000);
    tx.send(&pattern(1 << 20, 1)).unwrap();
    tx.send(b"small").unwrap();
    assert!(matches!(
        expect_wire_error(rx.recv(), "refused"),
        Some(WireError::TooLarge { .. })
    ));
    assert_eq!(rx.recv().unwrap(), b"small");
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
}

#[test]
fn kept_regions_carry_medium_and_large_messages_in_order() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    // One at a time: after the first, each goes through the region the
    // receiver holds, and its size keeps changing under it.
    let sizes = [
        7 * 1024 + 1,
        16 << 10,
        64 << 10,
        100_000,
        300_000,
        1 << 20,
        9000,
    ];
    for (i, &size) in sizes.iter().cycle().take(3 * sizes.len()).enumerate() {
        let data = pattern(size, i as u8);
        tx.send(&data).unwrap();
        assert_eq!(rx.recv().unwrap(), data, "message {i} of {size} bytes");
    }
    // Many in flight: the held region is busy, so the rest go by socket or
    // by new regions, and all arrive whole and in order.
    // (From another thread: what goes by socket blocks once its buffer is full.)
    let sent: Vec<Vec<u8>> = (0..24u8)
        .map(|i| pattern([20_000, 70_000, 400_000][usize::from(i % 3)], i))
        .collect();
    let sender = {
        let (tx, sent) = (tx.clone(), sent.clone());
        std::thread::spawn(move || sent.iter().for_each(|data| tx.send(data).unwrap()))
    };
    for (i, data) in sent.iter().enumerate() {
        assert_eq!(&rx.recv().unwrap(), data, "pipelined message {i}");
    }
    sender.join().unwrap();
    // A typed message with a `serde_bytes` field takes the same path.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Blob {
        id: u32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    }
    let (ttx, trx) = ipc::channel::<Blob>().unwrap();
    for i in 0..6 {
        let blob = Blob {
            id: i,
            data: pattern(32 << 10, i as u8),
        };
        ttx.send(Blob { ..blob }).unwrap();
        let got = trx.recv().unwrap();
        assert_eq!(got.id, i);
        assert_eq!(got.data, pattern(32 << 10, i as u8));
    }
}

#[test]
fn many_channels_keep_a_bounded_number_of_region_descriptors() {
    let _check = fd_check();
    let before = open_fds();
    let channels: Vec<_> = (0..150).map(|_| ipc::bytes_channel().unwrap()).collect();
    let sockets = open_fds() - before;
    // Medium messages, enough on each channel for a region to be made and held.
    for (i, (tx, rx)) in channels.iter().enumerate() {
        for j in 0..4 {
            let data = pattern(20_000, (i + j) as u8);
            tx.send(&data).unwrap();
            assert_eq!(rx.recv().unwrap(), data, "channel {i}, message {j}");
        }
    }
    // Each side keeps at most 64 region descriptors for them; the channels
    // past that carry their medium messages by socket.
    // (Besides the receivers' rings, one a channel.)
    let regions = open_fds() - before - sockets - common::ring_fds();
    assert!(
        regions <= 2 * 64,
        "{regions} region descriptors for 150 channels"
    );
    assert!(regions >= 2, "regions are used at all");
}

#[test]
fn a_receiver_moved_with_kept_messages_in_flight_reads_them() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    let (carrier_tx, carrier_rx) = ipc::channel::<IpcBytesReceiver>().unwrap();
    // The receiver comes to hold a region (a channel's first few messages of
    // this size go by socket) ...
    for i in 0..4 {
        tx.send(&pattern(64 << 10, i)).unwrap();
        assert_eq!(rx.recv().unwrap(), pattern(64 << 10, i));
    }
    // ... which the next message names, still unread when the receiver moves.
    let in_flight: Vec<Vec<u8>> = (1..4).map(|i| pattern(60_000, i)).collect();
    for data in &in_flight {
        tx.send(data).unwrap();
    }
    carrier_tx.send(rx).unwrap();
    let rx = carrier_rx.recv().unwrap();
    for (i, data) in in_flight.iter().enumerate() {
        assert_eq!(&rx.recv().unwrap(), data, "in-flight message {i}");
    }
    // The moved receiver holds the region again, or lets its sender pass it anew.
    for i in 4..10 {
        tx.send(&pattern(50_000, i)).unwrap();
        assert_eq!(rx.recv().unwrap(), pattern(50_000, i), "message {i}");
    }
    // Moved again with nothing in flight: nothing needs to travel.
    carrier_tx.send(rx).unwrap();
    let rx = carrier_rx.recv().unwrap();
    tx.send(&pattern(50_000, 10)).unwrap();
    assert_eq!(rx.recv().unwrap(), pattern(50_000, 10));
}

#[test]
fn a_refused_kept_message_frees_its_region() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    for i in 0..4 {
        tx.send(&pattern(64 << 10, 0)).unwrap();
        assert_eq!(rx.recv().unwrap(), pattern(64 << 10, 0), "message {i}");
    }
    rx.set_max_message_size(1000);
    tx.send(&pattern(64 << 10, 1)).unwrap();
    assert!(matches!(
        expect_wire_error(rx.recv(), "refused"),
        Some(WireError::TooLarge { .. })
    ));
    rx.set_max_message_size(1 << 30);
    for i in 2..6 {
        tx.send(&pattern(64 << 10, i)).unwrap();
        assert_eq!(rx.recv().unwrap(), pattern(64 << 10, i));
    }
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
}

#[test]
fn a_refused_fragmented_message_fails_its_send_not_the_channel() {
    let _check = fd_check();
    with_config(
        |c| c.large_messages = LargeMessages::Fragments,
        || {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            rx.set_max_message_size(1000);
            // Larger than the socket buffer: the sender blocks on the
            // carrier until the receiver refuses the message and closes it.
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let sender = std::thread::spawn(move || {
                let refused = tx.send(&pattern(8 << 20, 4));
                done_tx.send(()).unwrap();
                (refused, tx)
            });
            // Let the sender queue the message's descriptor packet (it
            // follows the first packet at once).
            std::thread::sleep(Duration::from_millis(50));
            assert!(matches!(
                expect_wire_error(rx.recv(), "refused"),
                Some(WireError::TooLarge { .. })
            ));
            // The refusing receive dropped the descriptor packet, closing
            // the receiver's copy of the carrier: the sender is released
            // without another receive.
            done_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the refused sender was not released");
            let (refused, tx) = sender.join().unwrap();
            assert_eq!(
                refused.unwrap_err().kind(),
                std::io::ErrorKind::ConnectionAborted
            );
            // The channel itself is fine.
            tx.send(b"small").unwrap();
            assert_eq!(rx.recv().unwrap(), b"small");
            drop(rx);
            let gone = tx.send(b"gone").unwrap_err();
            assert_eq!(gone.kind(), std::io::ErrorKind::BrokenPipe);
        },
    );
}

#[test]
fn a_fragmented_message_may_fit_its_first_packet() {
    let _check = fd_check();
    // What a sender produces when `ENOBUFS` made it fragment a small message.
    let (raw, rx) = raw_pair();
    let (carrier, _peer) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let mut first = header(1, 1, 3, 3, 77);
    first.extend_from_slice(b"abc");
    raw_send(&raw, &first, &[]);
    raw_send(&raw, &fd_packet(1, 77), &[carrier.as_fd()]);
    assert_eq!(rx.recv().unwrap(), b"abc");
}

/// A peer that keeps feeding a fragmented message's carrier one byte at a
/// time meets the fragment timeout (one second here), where the 64 MiB it
/// announced would take minutes. The receiver checks the deadline on every
/// carrier packet, not only when the carrier runs dry: a peer that kept it
/// full would otherwise never be timed. (On two CPUs one writing thread does
/// not outpace the reader, so this also passed before that check: it bounds
/// the wait, the check itself comes from reading the loop.)
#[test]
fn a_carrier_that_trickles_meets_the_fragment_timeout() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let (carrier, peer) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    raw_send(&raw, &header(1, 1, 64 << 20, 3, 78), &[]);
    raw_send(&raw, &fd_packet(1, 78), &[carrier.as_fd()]);
    drop(carrier); // the receiver's copy is the only one left
    let trickler = std::thread::spawn(move || loop {
        match net::send(&peer, b"x", SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
            Ok(_) => {}
            Err(rustix::io::Errno::AGAIN) => std::thread::yield_now(),
            Err(_) => break, // the receiver gave the message up
        }
    });
    let started = Instant::now();
    let trickled = with_config(
        |c| c.fragment_timeout = Duration::from_secs(1),
        || expect_wire_error(rx.recv(), "a trickling carrier"),
    );
    assert_eq!(trickled, Some(WireError::FragmentTimeout));
    assert!(started.elapsed() < Duration::from_secs(10), "bounded");
    trickler.join().unwrap();
}

/// A descriptor that is not a courier channel socket, sent where a channel
/// end should be, fails the message when it is read (and is closed), rather
/// than at the end's first use.
#[test]
fn a_pipe_sent_as_a_channel_end_fails_the_message() {
    let _check = fd_check();
    let (a, b) = seqpacket_pair();
    let rx = IpcReceiver::<IpcSender<u8>>::try_from(b).unwrap();
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let mut message = header(0, 1, 1, 0, 1);
    message.push(0);
    raw_send(&a, &message, &[]);
    raw_send(&a, &fd_packet(1, 1), &[pipe_r.as_fd()]);
    drop(pipe_r);
    assert!(matches!(rx.recv(), Err(IpcError::SerializationError(_))));
    let rx = IpcReceiver::<IpcBytesReceiver>::try_from(rx_fd(rx)).unwrap();
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let mut message = header(0, 1, 2, 0, 2);
    message.extend_from_slice(&[0, 0]); // index 0, no backlog
    raw_send(&a, &message, &[]);
    raw_send(&a, &fd_packet(1, 2), &[pipe_r.as_fd()]);
    drop(pipe_r);
    assert!(matches!(rx.recv(), Err(IpcError::SerializationError(_))));
    // A real channel end still goes through.
    let (tx, _keep) = ipc::channel::<u8>().unwrap();
    let rx = IpcReceiver::<IpcSender<u8>>::try_from(rx_fd(rx)).unwrap();
    let mut message = header(0, 1, 1, 0, 3);
    message.push(0);
    raw_send(&a, &message, &[]);
    raw_send(&a, &fd_packet(1, 3), &[tx.as_fd()]);
    assert!(rx.recv().is_ok());
}

#[test]
fn typed_receiver_rejects_bad_channel_indices() {
    let _check = fd_check();
    // A message that names channel index 5 while carrying one descriptor.
    let (a, b) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let rx = IpcReceiver::<IpcSender<u8>>::try_from(b).unwrap();
    let (spare, _keep) = ipc::channel::<u8>().unwrap();
    let mut message = header(0, 1, 1, 0, 1);
    message.push(5);
    raw_send(&a, &message, &[]);
    raw_send(&a, &fd_packet(1, 1), &[spare.as_fd()]);
    assert!(matches!(rx.recv(), Err(IpcError::SerializationError(_))));
    // The same index twice.
    let rx = IpcReceiver::<(IpcSender<u8>, IpcSender<u8>)>::try_from(rx_fd(rx)).unwrap();
    let mut message = header(0, 1, 2, 0, 2);
    message.extend_from_slice(&[0, 0]);
    raw_send(&a, &message, &[]);
    raw_send(&a, &fd_packet(1, 2), &[spare.as_fd()]);
    assert!(matches!(rx.recv(), Err(IpcError::SerializationError(_))));
}

fn rx_fd<T>(rx: IpcReceiver<T>) -> OwnedFd {
    rx.as_fd().try_clone_to_owned().unwrap()
}

/// A field whose `Deserialize` panics (on purpose).
#[derive(Debug)]
struct PanicsOnRead;

impl Serialize for PanicsOnRead {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(0)
    }
}

impl<'de> Deserialize<'de> for PanicsOnRead {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u8::deserialize(d)?;
        panic!("a Deserialize impl panics (on purpose)");
    }
}

/// A `Deserialize` impl that panics before the channel ends after it are read: their
/// descriptors are closed, not kept in the thread's table, and the channel goes on.
#[test]
fn a_panicking_deserialize_leaks_no_descriptor() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(PanicsOnRead, IpcBytesSender)>().unwrap();
    let (carried, _carried_rx) = ipc::bytes_channel().unwrap();
    tx.send((PanicsOnRead, carried)).unwrap();
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rx.recv()));
    assert!(read.is_err(), "the panic reaches the caller");
    let (tx2, rx2) = ipc::channel::<u8>().unwrap();
    tx2.send(7).unwrap();
    assert_eq!(rx2.recv().unwrap(), 7);
}

/// A receiver dropped while it holds regions lets go of them: one rebuilt from a duplicate of
/// its socket gets the next large messages whole (their senders pass the descriptors again),
/// not `BadRegion` for a region it never held.
#[test]
fn a_receiver_rebuilt_from_a_duplicate_descriptor_gets_large_messages() {
    let _check = fd_check();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    for round in 0..3 {
        let big = pattern(64 << 10, round);
        tx.send(&big).unwrap();
        assert_eq!(rx.recv().unwrap(), big, "round {round}");
    }
    let duplicate = rx.as_fd().try_clone_to_owned().unwrap();
    drop(rx);
    let rx = IpcBytesReceiver::try_from(duplicate).unwrap();
    for round in 3..6 {
        let big = pattern(64 << 10, round);
        tx.send(&big).unwrap();
        assert_eq!(rx.recv().unwrap(), big, "round {round}, rebuilt receiver");
    }
}
