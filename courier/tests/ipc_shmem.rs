//! `courier::ipc::IpcSharedMemory`: regions inside messages, and regions a
//! hostile peer hands over.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use courier::ipc::{self, IpcError, IpcReceiver, IpcSharedMemory, TryRecvError};
use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::net::{self, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde::{Deserialize, Serialize};

mod common;
use common::FdCheck;

/// `common::fd_check`, which also lets go of the dropped regions courier
/// keeps mapped (bounded, but open descriptors all the same) before it
/// counts.
fn fd_check() -> impl Drop {
    struct Unmapped(#[allow(dead_code)] FdCheck);
    impl Drop for Unmapped {
        fn drop(&mut self) {
            IpcSharedMemory::unmap_dropped();
        }
    }
    Unmapped(common::fd_check())
}
use common::wire::{header, seqpacket_pair};

#[test]
fn regions_arrive_with_their_bytes_and_empty_ones_with_none() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<IpcSharedMemory>>().unwrap();
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let regions = vec![
        IpcSharedMemory::from_bytes(&bytes),
        IpcSharedMemory::from_bytes(&[]),
        IpcSharedMemory::from_byte(0, 10_000),
        IpcSharedMemory::from_byte(0xA5, 4097),
        IpcSharedMemory::from_byte(1, 0),
        IpcSharedMemory::from_byte(0x5A, 200_001), // written in chunks of 64 KiB
    ];
    tx.send(regions.clone()).unwrap();
    let got = rx.recv().unwrap();
    assert_eq!(got, regions);
    assert_eq!(&got[0][..], &bytes[..]);
    assert!(got[1].is_empty() && got[4].is_empty());
    assert!(got[2].iter().all(|&b| b == 0) && got[2].len() == 10_000);
    assert!(got[3].iter().all(|&b| b == 0xA5) && got[3].len() == 4097);
    assert!(got[5].iter().all(|&b| b == 0x5A) && got[5].len() == 200_001);
    assert_eq!(got[0].clone().take().unwrap(), bytes);
    assert_eq!(IpcSharedMemory::default().take(), Some(Vec::new()));
}

#[test]
fn every_copy_maps_the_same_memory() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<IpcSharedMemory>().unwrap();
    let mut original = IpcSharedMemory::from_byte(0, 8192);
    tx.send(original.clone()).unwrap();
    let received = rx.recv().unwrap();
    // SAFETY: no reference into the region is in use while this one is.
    unsafe { original.deref_mut()[8191] = 42 };
    assert_eq!(
        received[8191], 42,
        "a write shows through the received copy"
    );
    let clone = received.clone();
    tx.send(received).unwrap();
    let mut again = rx.recv().unwrap();
    // SAFETY: as above.
    unsafe { again.deref_mut()[0] = 7 };
    assert_eq!((original[0], clone[0]), (7, 7));
}

#[test]
fn a_region_outside_a_send_is_an_error_not_a_panic() {
    // Its region (a descriptor, kept mapped once dropped) must not land in
    // another test's count.
    let _check = fd_check();
    let region = IpcSharedMemory::from_bytes(b"not for postcard");
    assert!(postcard::to_allocvec(&region).is_err());
    // An empty one has no descriptor, so it serializes anywhere.
    let empty = postcard::to_allocvec(&IpcSharedMemory::default()).unwrap();
    let back: IpcSharedMemory = postcard::from_bytes(&empty).unwrap();
    assert!(back.is_empty());
}

#[derive(Serialize, Deserialize, Debug)]
struct Two(IpcSharedMemory, IpcSharedMemory);

#[test]
fn the_receivers_limit_covers_the_regions_of_a_message() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Two>().unwrap();
    rx.set_max_message_size(100_000);
    let small = IpcSharedMemory::from_byte(1, 40_000);
    tx.send(Two(small.clone(), small.clone())).unwrap();
    assert_eq!(rx.recv().unwrap().1, small, "80 KB of regions fit 100 KB");
    let large = IpcSharedMemory::from_byte(2, 60_000);
    tx.send(Two(large.clone(), large.clone())).unwrap();
    assert!(matches!(rx.recv(), Err(IpcError::SerializationError(_))));
    // The refused message's descriptors are closed (fd_check), and the
    // channel goes on.
    tx.send(Two(small.clone(), IpcSharedMemory::default()))
        .unwrap();
    assert_eq!(rx.recv().unwrap().0, small);
}

/// A sealed memfd of `len` bytes, with `seals`.
fn memfd(len: u64, seals: SealFlags) -> OwnedFd {
    let fd = fs::memfd_create("hostile", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&fd, len).unwrap();
    fs::fcntl_add_seals(&fd, seals).unwrap();
    fd
}

/// A raw socket for the test to write packets into, and a courier receiver
/// of `T` on its other end.
fn raw_pair<T>() -> (OwnedFd, IpcReceiver<T>) {
    let (raw, theirs) = seqpacket_pair();
    (raw, IpcReceiver::try_from(theirs).unwrap())
}

/// The file `fd` refers to, opened again read-only (a new open file).
fn reopen_read_only(fd: &OwnedFd) -> OwnedFd {
    fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd)),
        fs::OFlags::RDONLY | fs::OFlags::CLOEXEC,
        fs::Mode::empty(),
    )
    .unwrap()
}

/// Sends, as a hostile peer would, a message holding one region: the
/// encoding of a present `IpcSharedMemory` (descriptor 0), then `fd`.
fn send_region(raw: &OwnedFd, fd: &OwnedFd, tag: u64) {
    // postcard: `Some` (1), then index 0 (a varint).
    send_message(raw, &[1, 0], &[fd], tag);
}

/// Sends `payload` as an inline message whose descriptor packet brings `fds`.
fn send_message(raw: &OwnedFd, payload: &[u8], fds: &[&OwnedFd], tag: u64) {
    let mut packet = header(0, fds.len() as u8, payload.len() as u64, 0, tag);
    packet.extend_from_slice(payload);
    net::send(raw, &packet, SendFlags::NOSIGNAL).unwrap();
    let mut fds_packet = Vec::new();
    fds_packet.extend_from_slice(&0xC0C0_5202u32.to_le_bytes());
    fds_packet.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    fds_packet.extend_from_slice(&tag.to_le_bytes());
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    net::sendmsg(
        raw,
        &[IoSlice::new(&fds_packet)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
}

#[test]
fn regions_a_peer_could_shrink_or_that_are_not_shared_memory_are_refused() {
    let _check = fd_check();
    let (raw, rx) = raw_pair::<IpcSharedMemory>();
    rx.set_max_message_size(1 << 20);
    let unsealed = memfd(4096, SealFlags::empty());
    let shrinkable = memfd(4096, SealFlags::GROW);
    let write_sealed = memfd(4096, SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE);
    let too_large = memfd(2 << 20, SealFlags::SHRINK | SealFlags::GROW);
    let empty = memfd(0, SealFlags::SHRINK | SealFlags::GROW);
    let pipe = rustix::pipe::pipe().unwrap().0;
    let good = memfd(4096, SealFlags::SHRINK | SealFlags::GROW);
    // The same sealed region, but a descriptor that cannot map it writable.
    let read_only = reopen_read_only(&good);
    let hostile = [
        &unsealed,
        &shrinkable,
        &write_sealed,
        &too_large,
        &empty,
        &pipe,
        &read_only,
    ];
    for (tag, fd) in hostile.iter().enumerate() {
        send_region(&raw, fd, tag as u64);
        match rx.try_recv() {
            Err(TryRecvError::IpcError(IpcError::SerializationError(_))) => {}
            other => panic!("hostile region {tag}: {other:?}"),
        }
    }
    // Nothing of them stays open here, and the channel still works.
    send_region(&raw, &good, 99);
    let mut region = rx.try_recv().unwrap();
    assert_eq!(region.len(), 4096);
    // SAFETY: the test holds no other reference into the region.
    unsafe { region.deref_mut()[0] = 3 };
    assert_eq!(region[0], 3);
    drop(raw);
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::IpcError(IpcError::Disconnected))
    ));
}

#[test]
fn an_unsealed_region_truncated_after_sending_cannot_fault_the_receiver() {
    // The attack the seal check stops: had the receiver mapped this region,
    // the truncation would make every read of it raise SIGBUS.
    let _check = fd_check();
    let (raw, rx) = raw_pair::<IpcSharedMemory>();
    let fd = memfd(1 << 20, SealFlags::empty());
    send_region(&raw, &fd, 5);
    fs::ftruncate(&fd, 0).unwrap();
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_region_that_comes_back_finds_its_mapping() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<IpcSharedMemory>().unwrap();
    let region = IpcSharedMemory::from_byte(9, 256 << 10);
    let at = region.as_ptr();
    tx.send(region).unwrap();
    let back = rx.recv().unwrap();
    assert_eq!(back.as_ptr(), at, "the dropped region's mapping, reused");
    assert!(back.iter().all(|&b| b == 9));
    // A region received while a copy is still in use maps it again.
    tx.send(back.clone()).unwrap();
    let second = rx.recv().unwrap();
    assert_ne!(second.as_ptr(), back.as_ptr());
    assert_eq!(second, back);
}

#[test]
fn the_dropped_regions_kept_are_bounded() {
    let _check = fd_check();
    let before = common::open_fds();
    let regions: Vec<_> = (0..10u8)
        .map(|i| IpcSharedMemory::from_byte(i, 64 << 10))
        .collect();
    drop(regions);
    let kept = common::open_fds() - before;
    assert!((1..=4).contains(&kept), "{kept} kept");
    IpcSharedMemory::unmap_dropped();
    assert_eq!(common::open_fds(), before);
}

#[test]
fn a_message_with_one_bad_region_is_refused_whole() {
    let _check = fd_check();
    let (raw, rx) = raw_pair::<Two>();
    let good = memfd(8192, SealFlags::SHRINK | SealFlags::GROW);
    let bad = memfd(8192, SealFlags::empty());
    // postcard: `Some(0)`, `Some(1)`.
    send_message(&raw, &[1, 0, 1, 1], &[&good, &bad], 7);
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::IpcError(IpcError::SerializationError(_)))
    ));
    // The good region was mapped, then dropped with the failed message: it
    // is parked, not leaked (`fd_check` counts after `unmap_dropped`).
}

#[test]
fn a_parked_region_is_not_reused_for_another_open_file_of_it() {
    let _check = fd_check();
    let (raw, rx) = raw_pair::<IpcSharedMemory>();
    let region = memfd(8192, SealFlags::SHRINK | SealFlags::GROW);
    send_region(&raw, &region, 1);
    // Received, dropped: parked, keyed by the file's inode.
    drop(rx.try_recv().unwrap());
    // The same inode, opened again read-only: a fresh mapping would refuse it,
    // and so must the reuse of the parked one.
    let read_only = reopen_read_only(&region);
    send_region(&raw, &read_only, 2);
    assert!(matches!(
        rx.try_recv(),
        Err(TryRecvError::IpcError(IpcError::SerializationError(_)))
    ));
    // The original open file still finds its parked mapping.
    send_region(&raw, &region, 3);
    assert_eq!(rx.try_recv().unwrap().len(), 8192);
}
