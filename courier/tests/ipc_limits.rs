//! What a hostile peer cannot make a receiver (or a sender) do: each test
//! is an attack written against the wire format, and checks that it ends in
//! a typed error with the process's memory, stack and descriptors intact.
//!
//! Every test holds the binary's serial lock ([`fd_check`]): they read the
//! process's address space and descriptor count, and change its settings.

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use courier::ipc::{
    self, IpcBytesReceiver, IpcBytesSender, IpcError, IpcReceiver, IpcSender, TryRecvError,
    WireError,
};
use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::net::{self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, SocketFlags};
use rustix::net::{RecvFlags, SocketType};
use serde::{Deserialize, Serialize};

mod common;
mod watchdog;
use common::wire::{fd_packet, header, raw_send, seqpacket_pair, wire_error};
use common::{fd_check, with_config};
use watchdog::with_watchdog;

/// The process's address space, in bytes (`VmSize`).
fn address_space() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// The decoding error's precise cause, for a typed receive.
fn decode_fault(e: &IpcError) -> Option<WireError> {
    match e {
        IpcError::SerializationError(e) => e.wire_error(),
        _ => None,
    }
}

/// A typed receiver and a raw bytes sender on one channel: the sender
/// writes whatever bytes a hostile peer would, as a well-formed message.
fn typed_pair<T>() -> (IpcBytesSender, IpcReceiver<T>)
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    let (raw, end) = seqpacket_pair();
    (
        IpcBytesSender::try_from(raw).unwrap(),
        IpcReceiver::try_from(end).unwrap(),
    )
}

/// A postcard varint.
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

// ===== waiting messages =====

/// After one large message, a bytes receiver sizes its next buffer as that
/// message; a header that announces descriptors and never sends them used
/// to keep that whole buffer while it waited (64 MiB of address space a
/// 40-byte header, here).
#[test]
fn headers_waiting_for_descriptors_keep_only_their_bytes() {
    let _check = fd_check();
    let (raw, end) = seqpacket_pair();
    let rx = IpcBytesReceiver::try_from(end).unwrap();
    let tx = IpcBytesSender::try_from(raw.try_clone().unwrap()).unwrap();
    let large = vec![7u8; 64 << 20];
    tx.send(&large).unwrap();
    assert_eq!(rx.recv().unwrap().len(), large.len());
    drop(large);

    let before = address_space();
    for tag in 1..=32u64 {
        let mut packet = header(0, 1, 5, 0, tag);
        packet.extend_from_slice(b"hello");
        raw_send(&raw, &packet, &[]);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    }
    let grown = address_space().saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "32 waiting headers took {} MiB of address space",
        grown >> 20
    );
    // The receiver still works.
    tx.send(b"after").unwrap();
    assert_eq!(rx.recv().unwrap(), b"after");
}

/// A descriptor packet that claims another count than its header is the
/// packet's lie, reported as such (not as a count mismatch of equal counts).
#[test]
fn a_descriptor_packet_that_miscounts_is_a_bad_header() {
    let _check = fd_check();
    let (raw, end) = seqpacket_pair();
    let rx = IpcBytesReceiver::try_from(end).unwrap();
    let (a, b) = seqpacket_pair();
    let mut packet = header(0, 2, 3, 0, 9);
    packet.extend_from_slice(b"abc");
    raw_send(&raw, &packet, &[]);
    raw_send(&raw, &fd_packet(5, 9), &[a.as_fd(), b.as_fd()]);
    let e = match rx.recv() {
        Err(IpcError::Io(e)) => e,
        other => panic!("expected a wire error, got {other:?}"),
    };
    assert!(
        matches!(wire_error(&e), Some(WireError::BadHeader(_))),
        "{e}"
    );
    IpcBytesSender::try_from(raw)
        .unwrap()
        .send(b"next")
        .unwrap();
    assert_eq!(rx.recv().unwrap(), b"next");
}

// ===== channel ends =====

fn unconnected_socket() -> OwnedFd {
    net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

fn listening_socket() -> (OwnedFd, std::path::PathBuf) {
    let fd = unconnected_socket();
    let dir = std::env::temp_dir().join(format!("courier-limits-{}", std::process::id()));
    let _ = std::fs::create_dir(&dir);
    let path = dir.join("listen");
    let _ = std::fs::remove_file(&path);
    net::bind(&fd, &net::SocketAddrUnix::new(&path).unwrap()).unwrap();
    net::listen(&fd, 1).unwrap();
    (fd, path)
}

/// An unconnected or listening `SOCK_SEQPACKET` socket is of the right type
/// but can never carry a message: refused as a channel end when it arrives
/// in a message, by name, and when an end is made from it.
#[test]
fn sockets_that_are_not_connected_are_refused_as_channel_ends() {
    let _check = fd_check();
    let (listener, path) = listening_socket();
    let (raw, end) = seqpacket_pair();
    let rx = IpcReceiver::<IpcSender<u8>>::try_from(end).unwrap();
    for (tag, bogus) in [(1, unconnected_socket()), (2, listener)] {
        // A message of one channel end, descriptor 0, as a peer writes it.
        let mut packet = header(0, 1, 1, 0, tag);
        packet.push(0);
        raw_send(&raw, &packet, &[]);
        raw_send(&raw, &fd_packet(1, tag), &[bogus.as_fd()]);
        let e = rx.recv().expect_err("a socket that is no channel end");
        assert!(
            matches!(decode_fault(&e), Some(WireError::BadDescriptor(_))),
            "{e}"
        );
        let refused = IpcSender::<u8>::try_from(bogus).expect_err("not an end");
        assert!(refused.to_string().contains("not connected"), "{refused}");
        drop(refused.into_fd());
    }
    // A real end still goes through.
    let (inner_tx, inner_rx) = ipc::channel::<u8>().unwrap();
    let tx = IpcSender::<IpcSender<u8>>::try_from(raw).unwrap();
    tx.send(inner_tx).unwrap();
    rx.recv().unwrap().send(5).unwrap();
    assert_eq!(inner_rx.recv().unwrap(), 5);
    let _ = std::fs::remove_file(&path);
}

/// Any other descriptor is refused as an end, saying what it is not.
#[test]
fn an_end_made_from_a_descriptor_is_checked() {
    let _check = fd_check();
    let (read, _write) = rustix::pipe::pipe().unwrap();
    let e = IpcBytesReceiver::try_from(read).expect_err("a pipe");
    assert!(e.to_string().contains("not a SOCK_SEQPACKET socket"), "{e}");
    let stream = net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    assert!(IpcBytesSender::try_from(stream).is_err());
    let (a, b) = seqpacket_pair();
    let tx = IpcBytesSender::try_from(a).unwrap();
    let rx = IpcBytesReceiver::try_from(b).unwrap();
    tx.send(b"checked").unwrap();
    assert_eq!(rx.recv().unwrap(), b"checked");
}

/// Connecting to a server that is not there names it.
#[test]
fn a_failed_connect_names_the_server() {
    let _check = fd_check();
    let name = "/nonexistent/courier-server".to_owned();
    let e = IpcSender::<u8>::connect(name).expect_err("no such server");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(e.to_string().contains("/nonexistent/courier-server"), "{e}");
}

// ===== decoding: depth =====

#[derive(Debug, Serialize, Deserialize)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

impl Tree {
    fn depth(&self) -> usize {
        let mut depth = 0;
        let mut at = self;
        while let Tree::Node(next) = at {
            depth += 1;
            at = next;
        }
        depth
    }
}

impl Drop for Tree {
    /// Iterative, so that dropping a deep tree cannot overflow the stack.
    fn drop(&mut self) {
        let mut next = match self {
            Tree::Node(child) => std::mem::replace(&mut **child, Tree::Leaf),
            Tree::Leaf => return,
        };
        while let Tree::Node(child) = &mut next {
            next = std::mem::replace(&mut **child, Tree::Leaf);
        }
    }
}

/// `levels` nodes deep, in postcard: variant `Node` (1) per level, then `Leaf` (0).
fn deep_tree(levels: usize) -> Vec<u8> {
    let mut bytes = vec![1u8; levels];
    bytes.push(0);
    bytes
}

/// A 200 KB message of a recursive type 200,000 levels deep overflowed
/// the receiving thread's stack (2 MiB, as a spawned thread's) and aborted
/// the process; it is now refused at the depth limit.
#[test]
fn a_message_nested_past_the_depth_limit_is_refused() {
    let _check = fd_check();
    let receiver = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let (tx, rx) = typed_pair::<Tree>();
            tx.send(&deep_tree(200_000)).unwrap();
            let e = rx.recv().expect_err("200,000 levels");
            assert_eq!(decode_fault(&e), Some(WireError::TooDeep { limit: 128 }));
            // Within the limit, and past the default once it is raised.
            tx.send(&deep_tree(100)).unwrap();
            assert_eq!(rx.recv().unwrap().depth(), 100);
            with_config(
                |c| c.max_decode_depth = 1000,
                || {
                    tx.send(&deep_tree(900)).unwrap();
                    assert_eq!(rx.recv().unwrap().depth(), 900);
                },
            );
        })
        .unwrap();
    receiver.join().unwrap();
}

// ===== decoding: allocation =====

/// `Vec<Vec<u8>>` of empty elements: one byte each on the wire, 24 in
/// memory. A 4 MiB message of them decoded to 96 MiB and more; it is now
/// refused at its decoding budget (8 times its size, 32 MiB).
#[test]
fn a_message_that_decodes_past_its_budget_is_refused() {
    let _check = fd_check();
    let (tx, rx) = typed_pair::<Vec<Vec<u8>>>();
    let n = 4 << 20;
    let mut bytes = Vec::new();
    varint(n, &mut bytes);
    bytes.resize(bytes.len() + n as usize, 0);
    tx.send(&bytes).unwrap();
    let Err(e) = rx.recv() else {
        panic!("a message past its budget was decoded")
    };
    let budget = 8 * bytes.len() as u64;
    assert_eq!(
        decode_fault(&e),
        Some(WireError::DecodeBudget { limit: budget })
    );
    // Raised, the budget lets it through.
    with_config(
        |c| c.decode_budget_factor = 64,
        || {
            tx.send(&bytes).unwrap();
            assert_eq!(rx.recv().unwrap().len(), n as usize);
        },
    );
    // An ordinary message of many small strings stays well within.
    let (tx, rx) = ipc::channel::<Vec<String>>().unwrap();
    let words: Vec<String> = (0..100_000).map(|i| format!("word{i}")).collect();
    tx.send(words.clone()).unwrap();
    assert_eq!(rx.recv().unwrap(), words);
}

/// Ten bytes claiming 2^60 zero-sized elements kept a receiver at full CPU
/// (every element is free to decode, and postcard trusts the count); each
/// element is now charged, and the message fails within its budget.
#[test]
fn a_claimed_count_of_zero_sized_elements_is_not_trusted() {
    let _check = fd_check();
    with_watchdog("2^60 units", Duration::from_secs(30), || {
        let (tx, rx) = typed_pair::<HashSet<()>>();
        let mut bytes = Vec::new();
        varint(1 << 60, &mut bytes);
        tx.send(&bytes).unwrap();
        let Err(e) = rx.recv() else {
            panic!("2^60 elements were decoded")
        };
        assert!(
            matches!(decode_fault(&e), Some(WireError::DecodeBudget { .. })),
            "{e}"
        );
        let (tx, rx) = typed_pair::<Vec<()>>();
        let mut bytes = Vec::new();
        varint(1000, &mut bytes);
        tx.send(&bytes).unwrap();
        assert_eq!(rx.recv().unwrap().len(), 1000);
    });
}

// ===== regions =====

/// A sealed, sparse memfd of `len` bytes: it passes for a payload region.
fn sparse_region(len: u64) -> OwnedFd {
    let fd = fs::memfd_create("hostile", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&fd, len).unwrap();
    fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).unwrap();
    fd
}

/// One message of about 500 bytes carrying 12 receivers, each with a
/// backlog of 4 held regions naming a 256 MiB sparse memfd, mapped 48 of
/// them (12 GiB) into the receiver, each held outside every budget. The
/// regions now count against the message's budget (the receiver's size
/// limit) and the process's.
#[test]
fn regions_in_moved_receivers_backlogs_count_against_the_budget() {
    let _check = fd_check();
    let (raw, end) = seqpacket_pair();
    let rx = IpcReceiver::<Vec<IpcBytesReceiver>>::try_from(end).unwrap();
    let region = sparse_region(256 << 20);
    let mut ends = Vec::new(); // the receivers' peers, kept open
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut payload = Vec::new();
    varint(12, &mut payload);
    for _ in 0..12 {
        let (a, b) = seqpacket_pair();
        ends.push(a);
        varint(fds.len() as u64, &mut payload);
        fds.push(b);
        payload.push(1); // Some(backlog)
        payload.extend_from_slice(&[0, 0, 0]); // no waiting, ready or refused messages
        varint(4, &mut payload);
        for token in 0..4u64 {
            varint(token + 1, &mut payload);
            varint(256 << 20, &mut payload);
            varint(fds.len() as u64, &mut payload);
            fds.push(region.try_clone().unwrap());
        }
    }
    assert_eq!(fds.len(), 60);
    let before = address_space();
    let mut packet = header(0, fds.len() as u8, payload.len() as u64, 0, 77);
    packet.extend_from_slice(&payload);
    raw_send(&raw, &packet, &[]);
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    raw_send(&raw, &fd_packet(60, 77), &borrowed);
    drop(borrowed);
    drop(fds);
    let received = rx.recv();
    let grown = address_space().saturating_sub(before);
    assert!(grown <= 1 << 30, "the message mapped {} MiB", grown >> 20);
    let Err(e) = received else {
        panic!("12 GiB of regions were accepted against a 1 GiB limit")
    };
    assert!(
        matches!(decode_fault(&e), Some(WireError::TooLarge { .. })),
        "{e}"
    );
    drop(rx);
    assert!(address_space() <= before + (64 << 20));
}

/// Reads every packet queued on `raw` without waiting; returns the
/// descriptors that came with them.
fn drain_descriptors(raw: &OwnedFd) -> Vec<OwnedFd> {
    let mut got = Vec::new();
    loop {
        let mut data = [0u8; 64];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(80))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [std::io::IoSliceMut::new(&mut data)];
        match net::recvmsg(raw, &mut iov, &mut control, RecvFlags::DONTWAIT) {
            Ok(msg) if msg.bytes == 0 => return got,
            Ok(_) => {
                for message in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = message {
                        got.extend(fds);
                    }
                }
            }
            Err(_) => return got,
        }
    }
}

/// The bytes of memory allocated to the distinct files among `fds`.
fn allocated(fds: &[OwnedFd]) -> u64 {
    let mut seen = HashSet::new();
    fds.iter()
        .map(|fd| fs::fstat(fd).unwrap())
        .filter(|st| seen.insert((st.st_dev, st.st_ino)))
        .map(|st| st.st_blocks as u64 * 512)
        .sum()
}

/// The receiver's side of a region's state word (`BUSY` is bit 0).
fn clear_busy(region: &OwnedFd) {
    // SAFETY: a fresh shared mapping of the region's first page, used for
    // one atomic store to its state word and unmapped at once.
    unsafe {
        let page = rustix::mm::mmap(
            std::ptr::null_mut(),
            4096,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            region,
            0,
        )
        .unwrap();
        (*page.cast::<std::sync::atomic::AtomicU32>())
            .store(0, std::sync::atomic::Ordering::Release);
        rustix::mm::munmap(page, 4096).unwrap();
    }
}

/// A receiver that keeps every region's descriptor and says it is done with
/// all but the newest two made its sender allocate a region per message:
/// 400 MiB for 100 messages of 4 MiB against a 32 MiB bound. A region the
/// sender lets go of now has its pages freed, whoever keeps it.
#[test]
fn a_receiver_that_forges_its_progress_cannot_make_its_sender_allocate() {
    let _check = fd_check();
    with_config(
        |c| c.max_region_bytes_in_flight = 32 << 20,
        || {
            let (raw, end) = seqpacket_pair();
            let tx = IpcBytesSender::try_from(end).unwrap();
            let message = vec![3u8; 4 << 20];
            let mut kept: Vec<OwnedFd> = Vec::new();
            for _ in 0..100 {
                tx.send(&message).unwrap();
                kept.extend(drain_descriptors(&raw));
                let newest = kept.len().saturating_sub(2);
                kept[..newest].iter().for_each(clear_busy);
            }
            drop(tx);
            let held = allocated(&kept);
            assert!(
                held <= 64 << 20,
                "the sender's regions kept by its receiver hold {} MiB",
                held >> 20
            );
        },
    );
}

/// Sent by a receiver's peer: its sending and its descriptors still work.
#[test]
fn an_honest_receiver_still_reads_every_region_message() {
    let _check = fd_check();
    with_config(
        |c| c.max_region_bytes_in_flight = 32 << 20,
        || {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            for round in 0..3u8 {
                // More in flight than the pool keeps: regions are let go of,
                // freed once read, and the messages arrive whole.
                let messages: Vec<Vec<u8>> = (0..6u8)
                    .map(|i| vec![round.wrapping_mul(7).wrapping_add(i); (1 << 20) + i as usize])
                    .collect();
                for m in &messages {
                    tx.send(m).unwrap();
                }
                for m in &messages {
                    assert_eq!(&rx.recv().unwrap(), m);
                }
            }
        },
    );
}

// ===== descriptors =====

/// Every descriptor this process has open that `before` did not list.
fn new_fds(before: &HashSet<String>) -> Vec<(String, bool)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            if before.contains(&name) {
                return None;
            }
            let fd: i32 = name.parse().ok()?;
            // SAFETY: borrowed for one `fcntl` while the descriptor is open
            // (the caller holds every object that owns one).
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let flags = rustix::io::fcntl_getfd(fd).ok()?;
            Some((name, flags.contains(rustix::io::FdFlags::CLOEXEC)))
        })
        .collect()
}

/// Every descriptor courier makes or receives is close-on-exec, so that a
/// child process started meanwhile by any thread inherits none of them:
/// sockets, one-shot listeners and their connections, payload regions on
/// both sides (passed and held), fragment carriers, shared memory, and ends
/// received in messages.
#[test]
fn every_descriptor_courier_creates_or_receives_is_close_on_exec() {
    let _check = fd_check();
    let before: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let (server, name) = ipc::IpcOneShotServer::<IpcSender<Vec<u8>>>::new().unwrap();
    let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
    IpcSender::<IpcSender<Vec<u8>>>::connect(name)
        .unwrap()
        .send(tx)
        .unwrap();
    let (bootstrap, tx) = server.accept().unwrap();
    // Regions (medium messages held, a large one passed), then fragments.
    for len in [20_000, 20_000, 20_000, 3 << 20] {
        tx.send(vec![1; len]).unwrap();
        assert_eq!(rx.recv().unwrap().len(), len);
    }
    let (btx, brx) = ipc::bytes_channel().unwrap();
    with_config(
        |c| c.large_messages = ipc::LargeMessages::Fragments,
        || {
            let big = vec![2u8; 1 << 20];
            let sender = std::thread::spawn(move || btx.send(&big).map(|()| btx));
            assert_eq!(brx.recv().unwrap().len(), 1 << 20);
            sender.join().unwrap().unwrap()
        },
    );
    let (stx, srx) = ipc::channel::<(ipc::IpcSharedMemory, IpcBytesReceiver)>().unwrap();
    let (_inner_tx, inner_rx) = ipc::bytes_channel().unwrap();
    stx.send((ipc::IpcSharedMemory::from_bytes(&[3; 10_000]), inner_rx))
        .unwrap();
    let received = srx.recv().unwrap();
    let open = new_fds(&before);
    assert!(open.len() >= 8, "only {} new descriptors", open.len());
    let inheritable: Vec<_> = open.iter().filter(|(_, cloexec)| !cloexec).collect();
    assert!(inheritable.is_empty(), "not close-on-exec: {inheritable:?}");
    drop((bootstrap, received, rx, tx));
    ipc::IpcSharedMemory::unmap_dropped();
}
