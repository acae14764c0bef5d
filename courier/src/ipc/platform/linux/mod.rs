//! The Linux transport: `SOCK_SEQPACKET` socketpairs plus sealed memfd regions.
//!
//! # Sending (seed 000, and beyond)
//! * A message that fits one packet (header + payload ≤ [`socket::max_packet`],
//!   and below the shared-memory threshold) is **one `sendmsg`** whose iovec
//!   gathers the header and the caller's slices: no staging copy, and no
//!   control message unless descriptors travel.
//! * A message too large for one packet is, by default
//!   ([`LargeMessages::SharedMemory`]), copied once into a pooled, sealed
//!   memfd region and the region's descriptor is sent ([`shm`]).
//! * Otherwise ([`LargeMessages::Fragments`]) it is **fragmented** without a
//!   failed first try: the first packet carries the header (announcing the
//!   total) and the first part; the rest follows over a socketpair created
//!   for this message alone, whose receiving end travels with the first
//!   packet. Fragments of concurrent senders therefore never interleave
//!   (ipc-channel's earlier design re-queued fragments on the shared socket
//!   and deadlocked, servo/ipc-channel#34). Fragment payloads are multiples
//!   of 8 bytes. `ENOBUFS` (the kernel could not allocate a packet that
//!   large) halves the packet size and retries, down to 2 KiB.
//!
//! # Receiving
//! One `recvmsg` scatters the packet into the header, then **straight into
//! the destination buffer's spare capacity**, then into a per-thread overflow
//! area that is only touched if the message is larger than the destination
//! expected. Nothing is zero-filled, and a small message never allocates a
//! buffer the size of the socket buffer. The header's total is checked
//! against the receiver's limit before anything is allocated; the rest of a
//! fragmented message is received directly into the final buffer.
#![allow(unsafe_code)]

pub(crate) mod shm;
pub(crate) mod socket;

use std::cell::RefCell;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use self::shm::{MapCache, POOL};
use self::socket::{Packet, RecvIoVec};
use crate::ipc::config::{Config, LargeMessages};
use crate::ipc::err::WireError;
use crate::ipc::wire::{Body, FdKind, Header, HEADER_LEN, MAX_FDS};

/// Most iovec entries one `sendmsg` takes (`IOV_MAX` on Linux).
const IOV_MAX: usize = 1024;
/// Messages up to this size without descriptors are copied behind the
/// header into one stack buffer and sent with `send(2)`: a gather costs the
/// kernel's `msghdr` path (copying in and checking the iovec array, about
/// 100 ns here), more than copying this many bytes.
const SMALL: usize = socket::SMALL_MAX;
/// `ENOBUFS` halving stops here: below it the error is reported.
const MIN_PACKET: usize = 2048;

/// Why a send failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The receiving end is closed (`EPIPE`/`ECONNRESET`).
    Disconnected,
    /// Any other failure.
    Io(std::io::Error),
}

impl From<Errno> for SendError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN => SendError::Disconnected,
            e => SendError::Io(e.into()),
        }
    }
}

/// Why a receive failed.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// Non-blocking or timed receive: nothing arrived in time.
    Empty,
    /// Every sender is gone and the queue is empty.
    Disconnected,
    /// The peer sent a malformed message; it was dropped.
    Wire(WireError),
    /// The socket failed.
    Io(std::io::Error),
}

impl From<WireError> for RecvError {
    fn from(e: WireError) -> Self {
        RecvError::Wire(e)
    }
}

impl From<Errno> for RecvError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::AGAIN => RecvError::Empty,
            Errno::CONNRESET => RecvError::Disconnected,
            e => RecvError::Io(e.into()),
        }
    }
}

/// How long a receive may wait.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    Block,
    Poll,
    Until(Instant),
}

/// `(sender, receiver)` of a new channel.
pub(crate) fn channel() -> std::io::Result<(OsSender, OsReceiver)> {
    let (tx, rx) = socket::pair()?;
    Ok((OsSender::from_fd(tx), OsReceiver::from_fd(rx)))
}

/// Releases the regions the process keeps for reusing large payloads.
pub(crate) fn trim_region_pool() {
    POOL.trim();
}

// ===== OsSender =====

/// The sending end of a channel. Clones share the socket: each message is
/// one packet (or one first packet), which the kernel delivers atomically,
/// so clones on different threads never interleave.
#[derive(Clone, Debug)]
pub(crate) struct OsSender {
    fd: Arc<OwnedFd>,
}

impl OsSender {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsSender { fd: Arc::new(fd) }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Sends `parts` (gathered, in order) with `channels` attached.
    pub(crate) fn send(&self, parts: &[IoSlice<'_>], channels: &[BorrowedFd<'_>]) -> Result<(), SendError> {
        if channels.len() >= MAX_FDS {
            return Err(SendError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a message carries at most {} channels", MAX_FDS - 1),
            )));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let inline_max = (socket::max_packet() - HEADER_LEN) & !7;
        if total <= inline_max && parts.len() < IOV_MAX {
            match self.send_inline(parts, total, channels) {
                Err(Errno::NOBUFS) => {}
                other => return other.map_err(SendError::from),
            }
            // The kernel could not allocate one packet this large: fragment.
            return self.send_fragmented(parts, total, channels, inline_max / 2);
        }
        if Config::large_messages_now() == LargeMessages::SharedMemory {
            return self.send_shm(parts, total, channels);
        }
        self.send_fragmented(parts, total, channels, socket::max_packet())
    }

    fn send_inline(&self, parts: &[IoSlice<'_>], total: usize, channels: &[BorrowedFd<'_>]) -> Result<(), Errno> {
        let header = Header::new(Body::Inline, total, channels.len()).encode();
        if channels.is_empty() && total <= SMALL {
            return socket::send_small(self.fd(), &header, parts, total).map(drop);
        }
        // Small gathers, the common case, stay on the stack.
        const STACK: usize = 8;
        if parts.len() < STACK {
            let mut iov = [IoSlice::new(&[]); STACK];
            iov[0] = IoSlice::new(&header);
            iov[1..=parts.len()].copy_from_slice(parts);
            socket::send(self.fd(), &iov[..=parts.len()], channels)?;
        } else {
            let mut iov = Vec::with_capacity(parts.len() + 1);
            iov.push(IoSlice::new(&header));
            iov.extend_from_slice(parts);
            socket::send(self.fd(), &iov, channels)?;
        }
        Ok(())
    }

    fn send_shm(&self, parts: &[IoSlice<'_>], total: usize, channels: &[BorrowedFd<'_>]) -> Result<(), SendError> {
        let region = POOL.take_filled(parts, total)?;
        let header = Header::new(Body::SharedMemory, total, channels.len()).encode();
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(channels.len() + 1);
        fds.extend_from_slice(channels);
        fds.push(region.fd());
        let sent = socket::send(self.fd(), &[IoSlice::new(&header)], &fds);
        drop(fds);
        POOL.put(region);
        sent?;
        Ok(())
    }

    fn send_fragmented(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        packet: usize,
    ) -> Result<(), SendError> {
        let (carrier_tx, carrier_rx) = socket::pair()?;
        let header = Header::new(Body::Fragmented, total, channels.len()).encode();
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(channels.len() + 1);
        fds.extend_from_slice(channels);
        fds.push(carrier_rx.as_fd());

        let mut cursor = Gather::new(parts);
        let mut packet = packet & !7;
        let mut iov = Vec::new();
        // First packet: header + first part, on the channel itself.
        loop {
            iov.clear();
            iov.push(IoSlice::new(&header));
            let len = cursor.take((packet - HEADER_LEN) & !7, &mut iov);
            match socket::send(self.fd(), &iov, &fds) {
                Ok(_) => {
                    cursor.advance(len);
                    break;
                }
                Err(Errno::NOBUFS) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(e) => return Err(e.into()),
            }
        }
        drop(fds);
        drop(carrier_rx); // the receiver holds its own copy now
                          // The rest: on the dedicated socket, blocking until the receiver reads.
        while cursor.remaining() > 0 {
            iov.clear();
            let len = cursor.take(packet & !7, &mut iov);
            match socket::send(carrier_tx.as_fd(), &iov, &[]) {
                Ok(_) => cursor.advance(len),
                Err(Errno::NOBUFS) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// A cursor over gathered slices that hands out the next `n` bytes as
/// iovec entries without copying.
struct Gather<'a> {
    parts: &'a [IoSlice<'a>],
    /// Index of the current part and offset into it.
    at: (usize, usize),
    remaining: usize,
}

impl<'a> Gather<'a> {
    fn new(parts: &'a [IoSlice<'a>]) -> Self {
        Gather { parts, at: (0, 0), remaining: parts.iter().map(|p| p.len()).sum() }
    }

    fn remaining(&self) -> usize {
        self.remaining
    }

    /// Appends entries for up to `max` bytes to `out`; returns their length.
    fn take(&self, max: usize, out: &mut Vec<IoSlice<'a>>) -> usize {
        let (mut i, mut off) = self.at;
        let mut len = 0;
        while len < max && i < self.parts.len() && out.len() < IOV_MAX {
            let part: &'a [u8] = &self.parts[i];
            let n = (part.len() - off).min(max - len);
            if n > 0 {
                out.push(IoSlice::new(&part[off..off + n]));
            }
            len += n;
            off += n;
            if off == part.len() {
                i += 1;
                off = 0;
            }
        }
        len
    }

    fn advance(&mut self, mut n: usize) {
        self.remaining -= n;
        let (mut i, mut off) = self.at;
        while n > 0 {
            let step = (self.parts[i].len() - off).min(n);
            n -= step;
            off += step;
            if off == self.parts[i].len() {
                i += 1;
                off = 0;
            }
        }
        while i < self.parts.len() && self.parts[i].is_empty() {
            i += 1;
        }
        self.at = (i, off);
    }
}

// ===== OsReceiver =====

/// The receiving end of a channel.
#[derive(Debug)]
pub(crate) struct OsReceiver {
    fd: OwnedFd,
    regions: RefCell<MapCache>,
}

impl std::fmt::Debug for MapCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapCache")
    }
}

thread_local! {
    /// Where the part of a packet lands that the destination had no room
    /// for. Allocated on first use, never initialised: the kernel writes only
    /// what arrives, so only pages that ever held overflow become resident.
    static OVERFLOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl OsReceiver {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsReceiver { fd, regions: RefCell::new(MapCache::default()) }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Receives one message: its payload replaces the contents of `dst` (the
    /// spare capacity of which is used as the receive buffer), and its
    /// channel descriptors are returned in order.
    pub(crate) fn recv_into(&self, dst: &mut Vec<u8>, wait: Wait, limit: u64) -> Result<Vec<OwnedFd>, RecvError> {
        let dontwait = match wait {
            Wait::Block => false,
            Wait::Poll => true,
            Wait::Until(deadline) => {
                wait_readable(self.fd(), deadline)?;
                true
            }
        };
        dst.clear();
        let mut header = [MaybeUninit::<u8>::uninit(); HEADER_LEN];
        let packet_room = socket::max_packet() - HEADER_LEN;
        let (packet, header) = OVERFLOW.with(|overflow| {
            let mut overflow_buf = overflow.borrow_mut();
            let spare = dst.spare_capacity_mut();
            let spare_len = spare.len();
            let need = packet_room.saturating_sub(spare_len);
            if overflow_buf.capacity() < need {
                *overflow_buf = Vec::with_capacity(packet_room);
            }
            let overflow = overflow_buf.spare_capacity_mut();
            let mut iov = [RecvIoVec::new(&mut header), RecvIoVec::new(spare), RecvIoVec::new(&mut overflow[..need])];
            let packet = socket::recv(self.fd(), &mut iov, dontwait)?;
            let header = self.check_packet(&packet, &header)?;
            let inline = packet.len - HEADER_LEN;
            let in_dst = inline.min(spare_len);
            // SAFETY: `recvmsg` wrote `inline` payload bytes after the header,
            // the first `in_dst` of them into `dst`'s spare capacity.
            unsafe { dst.set_len(in_dst) };
            if inline > in_dst {
                let extra = &overflow[..inline - in_dst];
                dst.reserve(extra.len());
                // SAFETY: the kernel wrote the first `inline - in_dst` bytes
                // of the overflow area (the rest of the packet); `reserve`
                // made room for them in `dst`; the buffers are distinct.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        extra.as_ptr().cast::<u8>(),
                        dst.spare_capacity_mut().as_mut_ptr().cast::<u8>(),
                        extra.len(),
                    );
                    dst.set_len(inline);
                }
            }
            Ok::<_, RecvError>((packet, header))
        })?;
        let Packet { len, mut fds, .. } = packet;
        let inline = len - HEADER_LEN;
        if header.total > limit {
            return Err(WireError::TooLarge { claimed: header.total, limit }.into());
        }
        // Fits in memory: `limit` is at most what the caller accepts.
        let total = usize::try_from(header.total).map_err(|_| WireError::TooLarge { claimed: header.total, limit })?;
        match header.body {
            Body::Inline if total == inline => {}
            Body::Inline => return Err(WireError::Truncated.into()),
            Body::Fragmented if total > inline => {
                let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                recv_fragments(&carrier, dst, total)?;
            }
            Body::Fragmented => return Err(WireError::BadHeader("fragmented message fits one packet").into()),
            Body::SharedMemory if inline == 0 => {
                let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                self.regions.borrow_mut().copy_out(&carrier, total, dst)?;
            }
            Body::SharedMemory => return Err(WireError::BadHeader("inline bytes with a region").into()),
        }
        debug_assert!(fds.iter().enumerate().all(|(i, _)| header.kind(i) == FdKind::Channel));
        Ok(fds)
    }

    /// Turns a raw packet into a validated header, or the error it deserves.
    fn check_packet(&self, packet: &Packet, header: &[MaybeUninit<u8>; HEADER_LEN]) -> Result<Header, RecvError> {
        if packet.len == 0 && packet.fds.is_empty() && !packet.truncated {
            // End of stream: every sender is closed and the queue is drained.
            return Err(RecvError::Disconnected);
        }
        if packet.control_truncated {
            return Err(WireError::ControlTruncated.into());
        }
        if packet.truncated {
            return Err(WireError::Truncated.into());
        }
        if packet.len < HEADER_LEN {
            return Err(WireError::BadHeader("packet shorter than a header").into());
        }
        // SAFETY: `packet.len >= HEADER_LEN`, and the header iovec came
        // first, so the kernel initialised all of it.
        let bytes: [u8; HEADER_LEN] = unsafe { std::mem::transmute_copy(header) };
        Ok(Header::decode(&bytes, packet.fds.len())?)
    }
}

/// Receives the rest of a fragmented message from its dedicated socket,
/// straight into `dst`'s spare capacity, until `dst.len() == total`.
fn recv_fragments(carrier: &OwnedFd, dst: &mut Vec<u8>, total: usize) -> Result<(), RecvError> {
    let timeout = Config::global().fragment_timeout;
    // A live peer that stops sending must not hang us forever.
    net::sockopt::set_socket_timeout(carrier, net::sockopt::Timeout::Recv, Some(timeout))
        .map_err(|e| RecvError::Io(e.into()))?;
    dst.reserve_exact(total - dst.len());
    while dst.len() < total {
        let want = total - dst.len();
        let spare = &mut dst.spare_capacity_mut()[..want];
        let packet = match socket::recv(carrier.as_fd(), &mut [RecvIoVec::new(spare)], false) {
            Ok(packet) => packet,
            Err(Errno::AGAIN) => return Err(WireError::FragmentTimeout.into()),
            Err(e) => return Err(e.into()),
        };
        if packet.len == 0 || packet.truncated || !packet.fds.is_empty() {
            // The stream ended early, overran the total, or carried descriptors.
            return Err(WireError::Truncated.into());
        }
        // SAFETY: the kernel wrote `packet.len <= want` bytes into the spare
        // capacity that starts at `dst.len()`.
        unsafe { dst.set_len(dst.len() + packet.len) };
    }
    Ok(())
}

/// Waits until `fd` is readable (or hung up), or `deadline` passes.
fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> Result<(), RecvError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec::try_from(left).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Err(RecvError::Empty),
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(RecvError::Io(e.into())),
        }
    }
}

// ===== One-shot server =====

/// A listening `SOCK_SEQPACKET` socket at a path in a fresh private (0700)
/// directory; the name handed to the client is that path.
#[derive(Debug)]
pub(crate) struct OsOneShotServer {
    listener: OwnedFd,
    dir: PathBuf,
    path: PathBuf,
}

impl OsOneShotServer {
    pub(crate) fn new() -> std::io::Result<(Self, String)> {
        use std::hash::{BuildHasher, Hasher};
        use std::os::unix::fs::DirBuilderExt;
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u32(std::process::id());
        let dir = std::env::temp_dir().join(format!("courier-{:016x}", random.finish()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("socket");
        let server = Self::listen(&dir, &path);
        if server.is_err() {
            let _ = std::fs::remove_dir(&dir);
        }
        let listener = server?;
        let name = path.to_str().map(str::to_owned).ok_or(std::io::ErrorKind::InvalidFilename)?;
        Ok((OsOneShotServer { listener, dir, path }, name))
    }

    fn listen(_dir: &std::path::Path, path: &std::path::Path) -> std::io::Result<OwnedFd> {
        let fd = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        net::listen(&fd, 1)?;
        Ok(fd)
    }

    /// Accepts the client's connection, waiting at most `timeout`, and
    /// returns the connection as a receiver.
    pub(crate) fn accept(&self, timeout: Option<Duration>) -> Result<OsReceiver, RecvError> {
        if let Some(timeout) = timeout {
            wait_readable(self.listener.as_fd(), Instant::now() + timeout)?;
        }
        loop {
            match net::accept_with(&self.listener, SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(OsReceiver::from_fd(fd)),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(RecvError::Io(e.into())),
            }
        }
    }
}

impl Drop for OsOneShotServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Connects to the one-shot server named `name`.
pub(crate) fn connect(name: &str) -> std::io::Result<OsSender> {
    let fd = net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    net::connect(&fd, &SocketAddrUnix::new(name)?)?;
    Ok(OsSender::from_fd(fd))
}
