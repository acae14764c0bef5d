//! A hostile peer's tools: raw sockets and hand-made packets of
//! `courier::ipc`'s wire format. (Not every test binary uses all of them.)
#![allow(dead_code)]

use std::os::fd::OwnedFd;

use courier::ipc::WireError;
use rustix::net::{
    self, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags,
    SocketType,
};

/// A `SOCK_SEQPACKET` socketpair: one end for a courier receiver, the other
/// for the test to write raw packets into.
pub fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// A data packet's 40-byte header, as `courier::ipc`'s wire format lays it
/// out: `body` 0 is inline; `nfds` descriptors announced, of `kinds`;
/// `total` payload bytes; `tag` names the message's descriptor packet.
pub fn header(body: u8, nfds: u8, total: u64, kinds: u128, tag: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(40);
    h.extend_from_slice(&0xC0C0_5201u32.to_le_bytes());
    h.extend_from_slice(&[body, nfds, 0, 0]);
    h.extend_from_slice(&total.to_le_bytes());
    h.extend_from_slice(&kinds.to_le_bytes());
    h.extend_from_slice(&tag.to_le_bytes());
    h
}

/// The peer's fault inside an I/O error, if that is what it is.
pub fn wire_error(e: &std::io::Error) -> Option<WireError> {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<WireError>())
        .copied()
}

/// The header of a message of more than 64 descriptors: `nfds` is 255
/// and the count takes the place of the kinds (all implicit).
pub fn header_many(body: u8, count: u32, total: u64, tag: u64) -> Vec<u8> {
    header(body, 0xFF, total, u128::from(count), tag)
}

/// Descriptor packet `index` (from 0) of the message `tag`, naming `count`
/// descriptors.
pub fn fd_packet_at(count: u16, index: u16, tag: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(16);
    p.extend_from_slice(&0xC0C0_5202u32.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p.extend_from_slice(&index.to_le_bytes());
    p.extend_from_slice(&tag.to_le_bytes());
    p
}

/// A descriptor packet naming `count` descriptors of the message `tag`.
pub fn fd_packet(count: u32, tag: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(16);
    p.extend_from_slice(&0xC0C0_5202u32.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p.extend_from_slice(&tag.to_le_bytes());
    p
}

/// Sends `bytes` as one packet on `fd`, with `fds` attached.
pub fn raw_send(fd: &OwnedFd, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    net::sendmsg(
        fd,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
}
