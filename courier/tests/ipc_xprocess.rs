//! `courier::ipc` between real processes.
//!
//! The test binary re-executes itself (`/proc/self/exe`) to run a child
//! role: the child runs only the `child_entry` test, which reads its role
//! from `COURIER_CHILD_ROLE`, connects to the parent's one-shot server named
//! in `COURIER_SERVER`, and serves requests. No `fork` of the threaded test
//! harness is involved.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier::ipc::{
    self, IpcBytesReceiver, IpcBytesSender, IpcError, IpcOneShotServer, IpcReceiver,
    IpcReceiverSet, IpcSelectionResult, IpcSender, IpcSharedMemory, TryRecvError, TrySelectError,
};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

const ROLE: &str = "COURIER_CHILD_ROLE";
const SERVER: &str = "COURIER_SERVER";
const PATIENCE: Duration = Duration::from_secs(60);

/// What the parent asks of a child.
#[derive(Serialize, Deserialize)]
enum Request {
    /// Hash `data` and reply with the hash.
    Hash {
        data: ByteBuf,
        reply: IpcSender<u64>,
    },
    /// Produce `len` bytes of `pattern(len, seed)` on `to`.
    Produce {
        len: usize,
        seed: u64,
        to: IpcBytesSender,
    },
    /// Send `(id, 0..count)` on `to`.
    Stream {
        id: u32,
        count: u32,
        to: IpcSender<(u32, u32)>,
    },
    /// Receive numbers on `from` and send each plus one on `to`, until `from` disconnects.
    Forward {
        from: IpcReceiver<u64>,
        to: IpcSender<u64>,
    },
    /// Send `values` on `to`.
    Emit {
        values: Vec<u64>,
        to: IpcSender<u64>,
    },
    /// Reply with the hash of `region`, then flip its first byte in place
    /// and send back a new region of `len` bytes of `fill`, and `region`.
    Shared {
        region: IpcSharedMemory,
        len: usize,
        fill: u8,
        reply: IpcSender<(u64, IpcSharedMemory, IpcSharedMemory)>,
    },
    /// Receive `count` byte messages on `from` and reply with the hash of each.
    Drain {
        from: IpcBytesReceiver,
        count: u32,
        reply: IpcSender<u64>,
    },
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let server = std::env::var(SERVER).expect("server name");
    assert_eq!(role, "serve");
    let (tx, rx) = ipc::channel::<Request>().unwrap();
    IpcSender::<IpcSender<Request>>::connect(server)
        .unwrap()
        .send(tx)
        .unwrap();
    loop {
        match rx.recv() {
            Ok(Request::Hash { data, reply }) => reply.send(hash(&data)).unwrap(),
            Ok(Request::Produce { len, seed, to }) => to.send(&pattern(len, seed)).unwrap(),
            Ok(Request::Stream { id, count, to }) => {
                for seq in 0..count {
                    if to.send((id, seq)).is_err() {
                        break;
                    }
                }
            }
            Ok(Request::Forward { from, to }) => {
                while let Ok(v) = from.recv() {
                    to.send(v + 1).unwrap();
                }
            }
            Ok(Request::Emit { values, to }) => {
                for v in values {
                    to.send(v).unwrap();
                }
            }
            Ok(Request::Shared {
                mut region,
                len,
                fill,
                reply,
            }) => {
                let h = hash(&region);
                // SAFETY: the parent does not touch the region until it has
                // the reply, sent after this write.
                unsafe { region.deref_mut()[0] ^= 0xFF };
                let fresh = IpcSharedMemory::from_byte(fill, len);
                reply.send((h, fresh, region)).unwrap();
            }
            Ok(Request::Drain { from, count, reply }) => {
                for _ in 0..count {
                    reply.send(hash(&from.recv().unwrap())).unwrap();
                }
            }
            Err(IpcError::Disconnected) => break,
            Err(e) => panic!("child: {e}"),
        }
    }
    std::process::exit(0);
}

/// A child process serving requests, and its request channel.
struct Peer {
    child: Child,
    requests: IpcSender<Request>,
}

fn spawn_peer() -> Peer {
    let (server, name) = IpcOneShotServer::<IpcSender<Request>>::new().unwrap();
    let child = Command::new("/proc/self/exe")
        .args([
            "child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(ROLE, "serve")
        .env(SERVER, name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (_rx, requests) = server.accept_timeout(PATIENCE).expect("child connects");
    Peer { child, requests }
}

impl Peer {
    /// Ends the child cleanly: dropping its request channel makes it exit.
    fn finish(mut self) {
        drop(self.requests);
        assert!(self.child.wait().unwrap().success());
    }
}

/// Word-wise FNV-1a: fast enough for 256 MiB in a debug build.
fn hash(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(0x0100_0000_01b3);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Zeroes with every 4 KiB block stamped with its index and `seed`, so that
/// a lost, repeated or misplaced block changes the hash.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    for (i, block) in data.chunks_mut(4096).enumerate() {
        let stamp = (i as u64 ^ seed.rotate_left(32)).to_le_bytes();
        let n = block.len().min(8);
        block[..n].copy_from_slice(&stamp[..n]);
        if let Some(last) = block.last_mut() {
            *last = i as u8;
        }
    }
    data
}

mod common;
use common::fd_check;

#[test]
fn bootstrap_and_large_payloads_by_hash() {
    let _check = fd_check();
    let peer = spawn_peer();
    let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
    let (bytes_tx, bytes_rx) = ipc::bytes_channel().unwrap();
    for (len, seed) in [(0, 1), (100, 2), (8 << 20, 3), (256 << 20, 4)] {
        let data = pattern(len, seed);
        let expected = hash(&data);
        peer.requests
            .send(Request::Hash {
                data: ByteBuf::from(data),
                reply: reply_tx.clone(),
            })
            .unwrap();
        assert_eq!(
            reply_rx.try_recv_timeout(PATIENCE).unwrap(),
            expected,
            "parent -> child, {len} B"
        );
        peer.requests
            .send(Request::Produce {
                len,
                seed,
                to: bytes_tx.clone(),
            })
            .unwrap();
        let got = bytes_rx.try_recv_timeout(PATIENCE).unwrap();
        assert_eq!(
            (got.len(), hash(&got)),
            (len, expected),
            "child -> parent, {len} B"
        );
    }
    peer.finish();
}

#[test]
fn large_payloads_fragmented_across_processes() {
    let _check = fd_check();
    // The child inherits the default configuration (regions on); this
    // process sends with regions off, so its large messages are fragmented.
    let saved = ipc::Config::global();
    ipc::Config::set_global(ipc::Config {
        large_messages: ipc::LargeMessages::Fragments,
        ..saved
    });
    let peer = spawn_peer();
    let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
    for len in [300_000, 8 << 20] {
        let data = pattern(len, 5);
        let expected = hash(&data);
        peer.requests
            .send(Request::Hash {
                data: ByteBuf::from(data),
                reply: reply_tx.clone(),
            })
            .unwrap();
        assert_eq!(reply_rx.try_recv_timeout(PATIENCE).unwrap(), expected);
    }
    ipc::Config::set_global(saved);
    peer.finish();
}

#[test]
fn senders_and_receivers_cross_three_processes() {
    let _check = fd_check();
    let forwarder = spawn_peer();
    let emitter = spawn_peer();
    let (middle_tx, middle_rx) = ipc::channel::<u64>().unwrap();
    let (out_tx, out_rx) = ipc::channel::<u64>().unwrap();
    // The forwarder gets a receiver, the emitter the matching sender: the
    // numbers go emitter -> forwarder -> here, never through this process's ends.
    forwarder
        .requests
        .send(Request::Forward {
            from: middle_rx,
            to: out_tx,
        })
        .unwrap();
    emitter
        .requests
        .send(Request::Emit {
            values: (0..100).collect(),
            to: middle_tx,
        })
        .unwrap();
    for v in 0..100 {
        assert_eq!(out_rx.try_recv_timeout(PATIENCE).unwrap(), v + 1);
    }
    emitter.finish();
    // The emitter held the last sender of the middle channel: the forwarder
    // sees the disconnection and drops its sender, so ours disconnects too.
    assert!(matches!(
        out_rx.try_recv_timeout(PATIENCE),
        Err(TryRecvError::IpcError(IpcError::Disconnected))
    ));
    forwarder.finish();
}

#[test]
fn a_receiver_moved_to_another_process_keeps_its_regions() {
    let _check = fd_check();
    let child = spawn_peer();
    let (tx, rx) = ipc::bytes_channel().unwrap();
    // Here the receiver comes to hold the sender's region (a channel's first
    // few messages of this size go by socket); the next messages name it
    // instead of passing it, and are still unread when it moves.
    for i in 100..104 {
        let data = pattern(64 << 10, i);
        tx.send(&data).unwrap();
        assert_eq!(rx.recv().unwrap(), data);
    }
    let sizes = [
        60_000,
        60_000,
        300_000,
        20_000,
        9000,
        2 << 20,
        50_000,
        50_000,
    ];
    let messages: Vec<Vec<u8>> = (1..).zip(sizes).map(|(i, n)| pattern(n, i)).collect();
    let (half, rest) = messages.split_at(3);
    for data in half {
        tx.send(data).unwrap();
    }
    let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
    child
        .requests
        .send(Request::Drain {
            from: rx,
            count: messages.len() as u32,
            reply: reply_tx,
        })
        .unwrap();
    // And once it has moved, the child's receiver holds regions of its own.
    for data in rest {
        tx.send(data).unwrap();
    }
    for (i, data) in messages.iter().enumerate() {
        let got = reply_rx.try_recv_timeout(PATIENCE).unwrap();
        assert_eq!(got, hash(data), "message {i} ({} bytes)", data.len());
    }
    child.finish();
}

#[test]
fn eight_concurrent_senders_keep_per_sender_order() {
    let _check = fd_check();
    const SENDERS: u32 = 8;
    const TOTAL: u32 = 100_000;
    let peers: Vec<Peer> = (0..SENDERS).map(|_| spawn_peer()).collect();
    let (tx, rx) = ipc::channel::<(u32, u32)>().unwrap();
    for (id, peer) in peers.iter().enumerate() {
        peer.requests
            .send(Request::Stream {
                id: id as u32,
                count: TOTAL / SENDERS,
                to: tx.clone(),
            })
            .unwrap();
    }
    drop(tx);
    let mut next: HashMap<u32, u32> = HashMap::new();
    for _ in 0..TOTAL {
        let (id, seq) = rx.try_recv_timeout(PATIENCE).unwrap();
        let expected = next.entry(id).or_default();
        assert_eq!(seq, *expected, "sender {id} out of order");
        *expected += 1;
    }
    assert!(next.values().all(|&n| n == TOTAL / SENDERS));
    // Every sender is gone once the children finished.
    for peer in peers {
        peer.finish();
    }
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

#[test]
fn a_killed_peer_gives_disconnected() {
    let _check = fd_check();
    let mut peer = spawn_peer();
    let (tx, rx) = ipc::channel::<(u32, u32)>().unwrap();
    peer.requests
        .send(Request::Stream {
            id: 0,
            count: u32::MAX,
            to: tx,
        })
        .unwrap();
    for seq in 0..1000 {
        assert_eq!(rx.try_recv_timeout(PATIENCE).unwrap(), (0, seq));
    }
    peer.child.kill().unwrap();
    peer.child.wait().unwrap();
    // What was queued drains, then the death shows, within bounded time.
    let mut drained = 0u64;
    loop {
        match rx.try_recv_timeout(PATIENCE) {
            Ok(_) => drained += 1,
            Err(TryRecvError::IpcError(IpcError::Disconnected)) => break,
            Err(e) => panic!("expected Disconnected after {drained} messages, got {e:?}"),
        }
    }
    // And sending to the dead child fails instead of hanging or raising SIGPIPE.
    let (reply, _r) = ipc::channel().unwrap();
    assert!(matches!(
        peer.requests.send(Request::Hash {
            data: ByteBuf::from(vec![1]),
            reply
        }),
        Err(IpcError::Disconnected)
    ));
}

#[test]
fn a_receiver_set_sees_each_channel_of_a_killed_peer_close() {
    let _check = fd_check();
    let mut peer = spawn_peer();
    let mut set = IpcReceiverSet::new().unwrap();
    // Two finite streams, then an endless one, all from the child; and one
    // channel whose sender this process keeps.
    let mut ids = Vec::new();
    for (id, count) in [(1, 100), (2, 100), (0, u32::MAX)] {
        let (tx, rx) = ipc::channel::<(u32, u32)>().unwrap();
        ids.push(set.add(rx).unwrap());
        peer.requests
            .send(Request::Stream { id, count, to: tx })
            .unwrap();
    }
    let (_kept_tx, kept_rx) = ipc::channel::<(u32, u32)>().unwrap();
    set.add(kept_rx).unwrap();
    let stream_of = |set_id: u64| [1, 2, 0][ids.iter().position(|&i| i == set_id).unwrap()];
    let mut next = HashMap::from([(0u32, 0u32), (1, 0), (2, 0)]);
    let mut closed = Vec::new();
    let mut killed = false;
    while closed.len() < 3 {
        let results = match set.try_select_timeout(PATIENCE) {
            Ok(results) => results,
            Err(TrySelectError::Empty) => panic!("no result within {PATIENCE:?}"),
            Err(TrySelectError::IoError(e)) => panic!("{e}"),
        };
        for result in results {
            match result {
                IpcSelectionResult::MessageReceived(set_id, message) => {
                    let (stream, seq) = message.to::<(u32, u32)>().unwrap();
                    assert_eq!(stream, stream_of(set_id));
                    assert_eq!(seq, next[&stream], "stream {stream}'s order");
                    *next.get_mut(&stream).unwrap() += 1;
                }
                IpcSelectionResult::ChannelClosed(set_id) => closed.push(stream_of(set_id)),
            }
        }
        if !killed && next[&0] >= 1000 && next[&1] == 100 && next[&2] == 100 {
            peer.child.kill().unwrap();
            peer.child.wait().unwrap();
            killed = true;
        }
    }
    assert!(
        killed,
        "the endless stream closed before the child was killed"
    );
    closed.sort();
    assert_eq!(closed, [0, 1, 2]);
    assert_eq!((next[&1], next[&2]), (100, 100));
    // The channel whose sender is still here stays in the set, quiet.
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
}

#[test]
fn shared_memory_between_processes_is_one_memory() {
    let _check = fd_check();
    let peer = spawn_peer();
    let (reply_tx, reply_rx) = ipc::channel().unwrap();
    let data = pattern(3 << 20, 9);
    let region = IpcSharedMemory::from_bytes(&data);
    peer.requests
        .send(Request::Shared {
            region: region.clone(),
            len: 5 << 20,
            fill: 0x5A,
            reply: reply_tx,
        })
        .unwrap();
    let (h, fresh, back) = reply_rx.try_recv_timeout(PATIENCE).unwrap();
    assert_eq!(h, hash(&data), "the child read the parent's bytes");
    assert_eq!(region[0], data[0] ^ 0xFF, "the child's write shows here");
    assert_eq!(back, region);
    assert_eq!(fresh.len(), 5 << 20);
    assert!(fresh.iter().all(|&b| b == 0x5A));
    peer.finish();
    // Dropped regions stay mapped for a while (bounded): let go of them
    // before the descriptors are counted.
    drop((region, fresh, back));
    IpcSharedMemory::unmap_dropped();
}
