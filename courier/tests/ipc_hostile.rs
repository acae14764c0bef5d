//! A hostile peer, generated: random sequences of packets (garbage, and
//! headers and descriptor packets with random fields, some with descriptors
//! attached: pipes, or sealed memfds that pass for payload regions, so that
//! regions get held and named by later headers) written raw into a
//! receiver's socket. Whatever arrives, the
//! receiver must return values or typed errors (never panic or hang), close
//! every descriptor it was sent, and still deliver a well-formed message
//! sent after the storm.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use courier::ipc::{
    self, IpcBytesReceiver, IpcError, IpcReceiver, IpcReceiverSet, IpcSelectionResult, IpcSender,
    IpcSharedMemory, TryRecvError, TrySelectError,
};
use proptest::prelude::*;
use rustix::net::{
    self, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags,
    SocketType,
};

mod common;
use common::fd_check;

/// One packet the hostile peer writes.
#[derive(Clone, Debug)]
enum Packet {
    Garbage(Vec<u8>),
    Header {
        body: u8,
        nfds: u8,
        total: u64,
        kinds: u128,
        tag: u64,
        payload: Vec<u8>,
    },
    Fds {
        count: u32,
        tag: u64,
    },
    /// A well-formed region message (its header, then its descriptor packet
    /// with a fresh sealed memfd): the receiver comes to hold the region.
    Region {
        total: u64,
        tag: u64,
    },
    /// A well-formed header naming a held region by `tag`.
    Kept {
        total: u64,
        tag: u64,
    },
}

impl Packet {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Packet::Garbage(bytes) => bytes.clone(),
            Packet::Header {
                body,
                nfds,
                total,
                kinds,
                tag,
                payload,
            } => {
                let mut b = Vec::new();
                b.extend_from_slice(&0xC0C0_5201u32.to_le_bytes());
                b.extend_from_slice(&[*body, *nfds, 0, 0]);
                b.extend_from_slice(&total.to_le_bytes());
                b.extend_from_slice(&kinds.to_le_bytes());
                b.extend_from_slice(&tag.to_le_bytes());
                b.extend_from_slice(payload);
                b
            }
            Packet::Fds { count, tag } => {
                let mut b = Vec::new();
                b.extend_from_slice(&0xC0C0_5202u32.to_le_bytes());
                b.extend_from_slice(&count.to_le_bytes());
                b.extend_from_slice(&tag.to_le_bytes());
                b
            }
            &Packet::Region { total, tag } => Packet::Header {
                body: 2,
                nfds: 1,
                total,
                kinds: 3,
                tag,
                payload: Vec::new(),
            }
            .bytes(),
            &Packet::Kept { total, tag } => Packet::Header {
                body: 3,
                nfds: 0,
                total,
                kinds: 0,
                tag,
                payload: Vec::new(),
            }
            .bytes(),
        }
    }

    /// Writes the packet (two, for a region) into `raw`, with `attach`
    /// descriptors: regions or pipes.
    fn send(&self, raw: &OwnedFd, attach: u8, regions: bool) {
        send_raw(raw, &self.bytes(), attach, regions);
        if let &Packet::Region { tag, .. } = self {
            let fds = Packet::Fds { count: 1, tag };
            send_raw(raw, &fds.bytes(), 1, true);
        }
    }
}

fn packet() -> impl Strategy<Value = (Packet, u8, bool)> {
    let small_tag = 0u64..4;
    let garbage = proptest::collection::vec(any::<u8>(), 0..64).prop_map(Packet::Garbage);
    let header = (
        0u8..4,
        0u8..4,
        0u64..64,
        // Mostly kinds that fit the descriptor count: none, or one carrier.
        prop_oneof![Just(0u128), Just(3u128), 0u128..256],
        small_tag.clone(),
        proptest::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(body, nfds, total, kinds, tag, payload)| Packet::Header {
            body,
            nfds,
            total,
            kinds,
            tag,
            payload,
        });
    let fds = (0u32..4, small_tag.clone()).prop_map(|(count, tag)| Packet::Fds { count, tag });
    let region =
        (0u64..64, small_tag.clone()).prop_map(|(total, tag)| Packet::Region { total, tag });
    // Some past what a 256 KiB region holds.
    let kept = (0u64..(300 << 10), small_tag).prop_map(|(total, tag)| Packet::Kept { total, tag });
    // Each packet comes with 0..3 descriptors attached, pipes or regions.
    (
        prop_oneof![garbage, header, fds, region, kept],
        0u8..3,
        any::<bool>(),
    )
}

/// A sealed memfd of 256 KiB, as a sender's payload region.
fn region() -> OwnedFd {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    let fd = fs::memfd_create("storm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&fd, 256 << 10).unwrap();
    fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    fd
}

fn send_raw(fd: &OwnedFd, bytes: &[u8], attach: u8, regions: bool) {
    let owned: Vec<OwnedFd> = (0..attach)
        .map(|_| match regions {
            true => region(),
            false => rustix::pipe::pipe().unwrap().0,
        })
        .collect();
    let fds: Vec<_> = owned.iter().map(|fd| fd.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    // A packet the kernel refuses (none here are) would just not arrive.
    let _ = net::sendmsg(
        fd,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    );
}

/// Drains the receiver without blocking; every outcome must be typed.
fn drain<T>(mut next: impl FnMut() -> Result<T, TryRecvError>) {
    for _ in 0..200 {
        match next() {
            Ok(_)
            | Err(TryRecvError::IpcError(IpcError::Io(_) | IpcError::SerializationError(_))) => {}
            Err(TryRecvError::Empty) | Err(TryRecvError::IpcError(IpcError::Disconnected)) => {
                return
            }
        }
    }
}

/// A well-formed inline message of `payload`, no descriptors.
fn good(payload: &[u8]) -> Vec<u8> {
    Packet::Header {
        body: 0,
        nfds: 0,
        total: payload.len() as u64,
        kinds: 0,
        tag: 0,
        payload: payload.to_vec(),
    }
    .bytes()
}

/// What a receiver set handed out from a good and a hostile channel.
#[derive(Default)]
struct Seen {
    /// The good channel's messages.
    received: Vec<u32>,
    /// The well-formed message sent on the hostile socket after the storm.
    delivered: bool,
    /// The hostile channel closed.
    closed: bool,
}

impl Seen {
    fn take(&mut self, results: Vec<IpcSelectionResult>, good: u64, hostile: u64) {
        for result in results {
            match result {
                IpcSelectionResult::MessageReceived(id, m) if id == good => {
                    self.received.push(m.to::<u32>().unwrap())
                }
                IpcSelectionResult::MessageReceived(_, m) => {
                    self.delivered |= m.data() == b"still here"
                }
                IpcSelectionResult::ChannelClosed(id) => {
                    assert_eq!(id, hostile, "only the hostile channel closes");
                    self.closed = true;
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::default())] // 256 cases; PROPTEST_CASES=N for a deeper search

    #[test]
    fn bytes_receiver_survives_any_packet_sequence(packets in proptest::collection::vec(packet(), 1..12)) {
        let check = fd_check();
        {
            let (raw, theirs) =
                net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
            let rx = IpcBytesReceiver::try_from(theirs).unwrap();
            for (p, attach, regions) in &packets {
                p.send(&raw, *attach, *regions);
                drain(|| rx.try_recv());
            }
            // A well-formed message still gets through, unless the storm left
            // messages waiting for descriptors ahead of it (then it queues
            // behind them; hang up to flush them as errors).
            send_raw(&raw, &good(b"still here"), 0, false);
            drop(raw);
            let mut delivered = false;
            for _ in 0..100 {
                match rx.try_recv() {
                    Ok(m) => delivered |= m == b"still here",
                    Err(TryRecvError::IpcError(IpcError::Disconnected)) => break,
                    Err(TryRecvError::Empty) => panic!("a closed channel must not be empty"),
                    Err(_) => {}
                }
            }
            prop_assert!(delivered, "the good message was lost");
        }
        drop(check); // asserts that every descriptor sent was closed
    }

    #[test]
    fn typed_receiver_survives_any_packet_sequence(packets in proptest::collection::vec(packet(), 1..12)) {
        let check = fd_check();
        {
            let (raw, theirs) =
                net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
            let rx = IpcReceiver::<(u8, Option<IpcSender<u8>>)>::try_from(theirs).unwrap();
            for (p, attach, regions) in &packets {
                p.send(&raw, *attach, *regions);
                drain(|| rx.try_recv());
            }
            drop(raw);
            drain(|| rx.try_recv());
        }
        drop(check); // asserts that every descriptor sent was closed
    }

    #[test]
    fn shared_memory_receiver_survives_any_packet_sequence(packets in proptest::collection::vec(packet(), 1..12)) {
        let check = fd_check();
        {
            let (raw, theirs) =
                net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
            let rx = IpcReceiver::<(u8, IpcSharedMemory)>::try_from(theirs).unwrap();
            for (p, attach, regions) in &packets {
                p.send(&raw, *attach, *regions);
                drain(|| rx.try_recv().map(|(_, region)| region.iter().step_by(4096).count()));
            }
            drop(raw);
            drain(|| rx.try_recv());
        }
        // Regions that arrived whole were dropped, and stay mapped until let go of.
        IpcSharedMemory::unmap_dropped();
        drop(check); // asserts that every descriptor sent was closed
    }

    #[test]
    fn receiver_set_survives_any_packet_sequence(packets in proptest::collection::vec(packet(), 1..12)) {
        let check = fd_check();
        {
            let (raw, theirs) =
                net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
            let (good_tx, good_rx) = ipc::channel::<u32>().unwrap();
            let mut set = IpcReceiverSet::new().unwrap();
            let hostile = set.add(IpcReceiver::<(u8, Option<IpcSender<u8>>)>::try_from(theirs).unwrap()).unwrap();
            let good_id = set.add(good_rx).unwrap();
            let mut sent = 0;
            let mut seen = Seen::default();
            for (p, attach, regions) in &packets {
                p.send(&raw, *attach, *regions);
                good_tx.send(sent).unwrap();
                sent += 1;
                // Every outcome is a result or a typed error, and ends.
                for _ in 0..200 {
                    match set.try_select() {
                        Ok(results) => seen.take(results, good_id, hostile),
                        Err(TrySelectError::IoError(_)) => {}
                        Err(TrySelectError::Empty) => break,
                    }
                }
            }
            send_raw(&raw, &good(b"still here"), 0, false);
            drop(raw);
            for _ in 0..500 {
                if seen.closed {
                    break;
                }
                match set.try_select_timeout(std::time::Duration::from_secs(5)) {
                    Ok(results) => seen.take(results, good_id, hostile),
                    Err(TrySelectError::IoError(_)) => {}
                    Err(TrySelectError::Empty) => panic!("a hung-up channel must not be empty"),
                }
            }
            prop_assert!(seen.closed, "the hostile channel never closed");
            prop_assert!(seen.delivered, "the good message on the hostile channel was lost");
            prop_assert_eq!(seen.received, (0..sent).collect::<Vec<_>>(), "the good channel lost messages");
        }
        drop(check); // asserts that every descriptor sent was closed
    }
}
