//! The sending end, and the route each message takes.
//!
//! # Routes (ipc-channel PR #68's techniques, and beyond)
//! * A message that fits one packet (header + payload ≤ [`Transport::max_packet`])
//!   is **one `sendmsg`** whose iovec gathers the header and the caller's
//!   slices: no staging copy. Below [`SMALL`] bytes the header and payload
//!   are instead copied into one stack buffer and sent with `send(2)`: the
//!   kernel's iovec path costs more than copying that much.
//! * Descriptors never ride on a data packet: they follow it in a tagged
//!   descriptor packet (`sendmsg` with `SCM_RIGHTS`), so no control message
//!   is built for the messages that carry none, and the receiver's data path
//!   needs no control buffer.
//! * A message too large for one packet is, by default
//!   ([`LargeMessages::SharedMemory`]), copied once into a pooled, sealed
//!   memfd region and the region's descriptor is sent ([`shm`]); from
//!   [`shm::STREAM_MIN`] up, the header goes first and the receiver copies
//!   the payload out while it is written (`shm`'s streaming). Once the
//!   receiver holds a region, a message in it is a bare header naming the
//!   region ([`Body::Kept`]): no descriptor, and no kernel copy of the
//!   payload. From [`SMALL`] bytes up to one packet, a message goes that way
//!   too when a held region is free (two `memcpy`s beat the kernel's copy
//!   through the socket buffer there), and by socket otherwise. A sender
//!   whose regions in flight (sent, not yet copied out) reach
//!   [`Config::max_region_bytes_in_flight`] fragments its large messages
//!   instead, which waits for the receiver: back-pressure.
//! * Otherwise ([`LargeMessages::Fragments`]) it is **fragmented** without a
//!   failed first try ([`super::frag`]).
//!
//! [`Os`] is the platform ([`crate::ipc::platform`]): every packet goes
//! through [`Transport::send`] (which waits for room), or, the first packet
//! of a message, [`Transport::try_send`] or [`Transport::try_send_small`]
//! ([`OsSender::first_packet`]).
//!
//! # Waiting for room
//! A send waits for room in the socket's send buffer only for its message's
//! first packet, and as long as its [`Wait`] allows: `Block` without end,
//! `Poll` not at all, `Until` to a deadline. If none came, nothing was sent
//! ([`SendError::Full`]). Once the first packet is out the message is
//! committed and its later packets (the descriptor packet, a fragmented
//! message's rest) are sent whatever the wait, so that no message is ever
//! half sent. A send that may not wait for ever sends the first packet only
//! when the send buffer has room for the packets before the last as well
//! (the kernel takes a packet while the bytes queued are below the buffer,
//! however large the packet), so that they never wait for the receiver;
//! see [`OsSender::first_packet`] for the two cases where they still may.
//! Regions in flight at [`Config::max_region_bytes_in_flight`] are full,
//! too, for such a send: it does not fall back to fragments.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::ring::{Writer, PAYLOAD_MAX, RECORD_MAX};
use super::tag::random_tag;
use super::{SendError, Wait};
use crate::buf::IoIter;
use crate::ipc::config::{Config, LargeMessages};
use crate::ipc::platform::{BorrowedFd, Os, OwnedFd, Transport, FDS_PER_PACKET};
use crate::ipc::shm::{self, Pool, Route, Take};
use crate::ipc::wire::{Body, FdPacket, Header, FD_PACKET_LEN, HEADER_LEN, KINDS, MAX_FDS};

mod ring_send;

/// Most iovec entries one `sendmsg` takes (`IOV_MAX` on Linux).
pub(super) const IOV_MAX: usize = 1024;
/// Messages up to this size without descriptors are copied behind the
/// header into one stack buffer and sent with `send(2)`: a gather costs the
/// kernel's `msghdr` path (copying in and checking the iovec array, about
/// 100 ns here), more than copying this many bytes.
const SMALL: usize = Os::SMALL_MAX;
/// Gathers of fewer parts than this build their iovec on the stack.
const STACK_IOV: usize = 8;
/// How often a timed send looks again for room that no readiness announces:
/// regions the receiver frees (in shared memory), or a send buffer that
/// polls writable but has too little room for a message's first packets.
const NAP: Duration = Duration::from_millis(1);
/// A sender sets up its ring on this send (so a channel that carries one
/// message, a reply, never pays for one).
const RING_AFTER: u32 = 2;
/// What a data packet's send returns when the ring came between the
/// choice of route and the send, and the packet is too large for it:
/// nothing was sent, choose again.
const REPLAN: Errno = Errno::XDEV;
/// [`SenderInner::ring_state`]: no ring, ever (turned off).
const RING_OFF: u8 = 0;
/// No ring yet.
const RING_PENDING: u8 = 1;
/// Every data packet goes through the ring.
const RING_ON: u8 = 2;

/// At least what the kernel charges a send buffer for a packet of `len`
/// bytes: the bytes, rounded up by its allocator (at most doubled), and
/// the `sk_buff` and `skb_shared_info` around them (under 1 KiB).
fn charge(len: usize) -> usize {
    len.saturating_mul(2).saturating_add(4096)
}

/// What a message's packets before its last are charged ([`charge`]): a
/// first packet of `first` bytes, then `fds` descriptors in packets of
/// [`FDS_PER_PACKET`]; `0` without descriptors (a message of one packet).
pub(super) fn ahead(first: usize, fds: usize) -> usize {
    match fds.div_ceil(FDS_PER_PACKET) {
        0 => 0,
        packets => charge(first).saturating_add((packets - 1) * charge(FD_PACKET_LEN)),
    }
}

/// Why an inline send failed, and whether anything went out.
enum Inline {
    /// The data packet was too large for the kernel to allocate, or for the
    /// socket's send buffer; nothing was sent.
    DataNoBufs,
    /// The data packet failed; nothing was sent.
    Data(Errno),
    /// The data packet went out, its descriptor packet failed.
    Fds(Errno),
}

// ===== OsSender =====

/// The sending end of a channel. Clones share the socket: each message is
/// one packet (or one first packet), which the kernel delivers atomically,
/// so clones on different threads never interleave.
#[derive(Clone, Debug)]
pub(crate) struct OsSender {
    inner: Arc<SenderInner>,
}

#[derive(Debug)]
pub(super) struct SenderInner {
    pub(super) fd: OwnedFd,
    /// Regions for this destination's large payloads. A region is only ever
    /// reused for the receiver it was sent to, so a receiver that keeps one
    /// and marks it free early can see or spoil only its own messages.
    pub(super) pool: Pool,
    /// `RING_OFF`, `RING_PENDING` or `RING_ON`.
    ring_state: AtomicU8,
    /// Whether the receiver took the ring on: data packets go through it,
    /// and a full ring (not the socket) is what a send waits for.
    ring_live: AtomicBool,
    /// The ring, once set up. Every data packet is sent under this lock
    /// until the ring exists and then through it, so that no message of a
    /// thread that saw no ring yet can overtake, on the socket, one it sent
    /// before through the ring (the receiver reads the rings first).
    ring: Mutex<RingSend>,
}

#[derive(Debug, Default)]
struct RingSend {
    writer: Option<Writer>,
    sends: u32,
    /// The tag of the ring's announcement, which marks the switch to it.
    tag: u64,
    /// Whether the mark of the switch went: records wait for it.
    marked: bool,
}

/// A sender with a ring looks at its socket every this many records: a
/// receiver that died without taking the ring, or was killed, makes no
/// other sign until the ring is full.
const RING_CHECK_EVERY: u32 = 1024;

impl OsSender {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsSender {
            inner: Arc::new(SenderInner {
                fd,
                pool: Pool::default(),
                ring_state: AtomicU8::new(match Config::ring_now() {
                    true => RING_PENDING,
                    false => RING_OFF,
                }),
                ring: Mutex::default(),
                ring_live: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        Os::borrow(&self.inner.fd)
    }

    /// Turns the ring off for this sender and its clones, if it has none
    /// yet (see [`IpcSender::without_ring`](crate::ipc::IpcSender)).
    pub(crate) fn without_ring(&self) {
        let _ = self.inner.ring_state.compare_exchange(
            RING_PENDING,
            RING_OFF,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Sends `parts` (gathered, in order) with `channels` attached, waiting
    /// for room as long as it takes.
    pub(crate) fn send(
        &self,
        parts: &[IoSlice<'_>],
        channels: &[BorrowedFd<'_>],
    ) -> Result<(), SendError> {
        self.send_wait(parts, channels, Wait::Block)
    }

    /// Sends `parts` (gathered, in order) with `channels` attached, waiting
    /// for room for the first packet as `wait` allows:
    /// [`SendError::Full`], with nothing sent, if there was none in time
    /// (see the module docs).
    pub(crate) fn send_wait(
        &self,
        parts: &[IoSlice<'_>],
        channels: &[BorrowedFd<'_>],
        wait: Wait,
    ) -> Result<(), SendError> {
        if channels.len() > MAX_FDS {
            return Err(SendError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a message carries at most {MAX_FDS} descriptors"),
            )));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // The steady state of small messages: a record (and the descriptors'
        // packet, if any), nothing else.
        // (A send that may not wait takes the general route with descriptors:
        // it looks for the socket's room for their packet first.)
        if total <= PAYLOAD_MAX
            && (channels.is_empty() || matches!(wait, Wait::Block))
            && self.inner.ring_state.load(Ordering::Acquire) == RING_ON
        {
            if let Some(sent) = self.try_record(parts, total, channels) {
                return sent;
            }
        }
        loop {
            let ring = self.ring_ready();
            match self.send_routed(parts, total, channels, wait, ring) {
                Err(SendError::Io(e)) if !ring && Errno::from_io_error(&e) == Some(REPLAN) => {}
                sent => return sent,
            }
        }
    }

    /// `send_wait` on the route a message of `total` bytes takes, through
    /// the ring if `ring` (then a payload too large for a record goes by
    /// region or fragments, its header through the ring).
    fn send_routed(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        wait: Wait,
        ring: bool,
    ) -> Result<(), SendError> {
        let (inline_max, packet_max) = match ring {
            true => (PAYLOAD_MAX, RECORD_MAX - 8),
            false => ((Os::max_packet() - HEADER_LEN) & !7, Os::max_packet()),
        };
        let regions = Config::large_messages_now() == LargeMessages::SharedMemory;
        if ring && total > inline_max && total <= (Os::max_packet() - HEADER_LEN) & !7 {
            // Too large for a record, small enough for one packet (which
            // the socket can no longer carry: see `ring`'s order): a region
            // the receiver holds, within the process's budget of them, as
            // without a ring; else a region for this message alone. Its
            // header takes the ring.
            for take in [Take::Kept, Take::Once] {
                if let Some(sent) = self.send_region(parts, total, channels, take, wait) {
                    return sent;
                }
            }
            return self.send_fragmented(parts, total, channels, packet_max, wait);
        }
        if total <= inline_max && parts.len() < IOV_MAX {
            // Past the stack packet, a region the receiver holds beats the
            // kernel's copy (two `memcpy`s and a header-sized packet): use
            // one if there is one, but pass no descriptor for these sizes.
            // (A ring's one copy each way beats both.)
            if !ring && regions && total > SMALL && channels.is_empty() {
                if let Some(sent) = self.send_region(parts, total, channels, Take::Kept, wait) {
                    return sent;
                }
            }
            match self.send_inline(parts, total, channels, wait) {
                Err(Inline::DataNoBufs) => {}
                Err(Inline::Data(e) | Inline::Fds(e)) => return Err(e.into()),
                Ok(()) => return Ok(()),
            }
            // The kernel could not allocate one packet this large (and sent
            // nothing): fragment, in smaller packets.
            return self.send_fragmented(parts, total, channels, inline_max / 2, wait);
        }
        if regions {
            if let Some(sent) = self.send_region_waiting(parts, total, channels, wait) {
                return sent;
            }
        }
        self.send_fragmented(parts, total, channels, packet_max, wait)
    }

    /// A data packet through the socket, without waiting.
    #[inline]
    fn try_socket(
        &self,
        header: &[u8; HEADER_LEN],
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Errno> {
        if total <= SMALL {
            Os::try_send_small(self.fd(), header, parts, total)
        } else if parts.len() < STACK_IOV {
            // Small gathers, the common case, stay on the stack.
            let mut iov = [IoSlice::new(&[]); STACK_IOV];
            iov[0] = IoSlice::new(header);
            let n = IoIter::slices(parts).io_slices(&mut iov[1..]);
            Os::try_send(self.fd(), &iov[..=n], &[])
        } else {
            // At most `IOV_MAX` parts reach here (`send` checks).
            let mut iov = vec![IoSlice::new(&[]); parts.len() + 1];
            iov[0] = IoSlice::new(header);
            let n = IoIter::slices(parts).io_slices(&mut iov[1..]);
            Os::try_send(self.fd(), &iov[..=n], &[])
        }
    }

    /// [`send_region`](Self::send_region) for a large message, any region:
    /// `None` (fragment it) if the regions in flight are at their bound
    /// and the send blocks. A send that may not wait for ever finds the
    /// channel full instead, and a timed one looks again until its deadline
    /// (no readiness announces a region the receiver frees).
    fn send_region_waiting(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        wait: Wait,
    ) -> Option<Result<(), SendError>> {
        loop {
            if let Some(sent) = self.send_region(parts, total, channels, Take::Any, wait) {
                return Some(sent);
            }
            match wait {
                Wait::Block => return None,
                Wait::Poll => return Some(Err(SendError::Full)),
                Wait::Until(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Some(Err(SendError::Full));
                    }
                    crate::fiber::sleep_until(deadline.min(now + NAP));
                }
            }
        }
    }

    /// Sends a message's first packet with `try_send` (which never waits),
    /// waiting for room as `wait` allows; `ahead` is what the message's
    /// packets before its last are charged ([`ahead`]; `0` for a message
    /// of one packet). `EAGAIN` if no room came in time: nothing was sent.
    ///
    /// A send that may not wait for ever (`Poll`, `Until`) sends only when
    /// the bytes queued plus `ahead` stay below the send buffer, so that
    /// the later packets are taken at once too. Two cases still wait after
    /// the first packet: another sender on the same socket (a clone) takes
    /// the room between the look and the send; or the queue is empty yet
    /// too small for `ahead` (a payload near the packet limit that carries
    /// channels), which is sent anyway, or it never could be, and whose
    /// descriptor packet then waits for the receiver to read the first.
    pub(super) fn first_packet(
        &self,
        wait: Wait,
        ahead: usize,
        mut try_send: impl FnMut() -> Result<usize, Errno>,
    ) -> Result<usize, Errno> {
        let mut nap = Duration::from_micros(10);
        loop {
            let room = match wait {
                Wait::Block => true,
                _ if ahead == 0 => true,
                _ => {
                    let (queued, size) = Os::send_queue(self.fd())?;
                    queued == 0 || queued.saturating_add(ahead) < size
                }
            };
            if room {
                match try_send() {
                    Err(Errno::AGAIN) => {}
                    sent => return sent,
                }
            }
            let ring_live = self.inner.ring_live.load(Ordering::Relaxed);
            if room && ring_live && Os::hung_up(self.fd()) {
                // A full ring whose receiver is gone (it may never have
                // taken the ring, so only the socket can tell).
                return Err(Errno::PIPE);
            }
            let deadline = match wait {
                Wait::Block => None,
                Wait::Poll => return Err(Errno::AGAIN),
                Wait::Until(deadline) => Some(deadline),
            };
            if room && ring_live {
                // The ring is full (the socket's room is no measure of it).
                self.wait_ring_room(deadline, &mut nap)?;
                continue;
            }
            let writable = Os::wait_writable(self.fd(), deadline)
                .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
            if !writable {
                return Err(Errno::AGAIN);
            }
            if let (false, Some(deadline)) = (room, deadline) {
                // Writable (a quarter of the buffer queued, or less), yet
                // maybe too full for `ahead`: look again after a nap.
                crate::fiber::sleep_until(deadline.min(Instant::now() + NAP));
            }
        }
    }

    fn send_inline(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        wait: Wait,
    ) -> Result<(), Inline> {
        let tag = if channels.is_empty() { 0 } else { random_tag() };
        let header = Header::new(Body::Inline, total, channels.len(), tag).encode();
        let ahead = ahead(HEADER_LEN + total, channels.len());
        let plain = channels.is_empty();
        let fds = Fds::new(channels, None, tag);
        let sent = self.first_packet(wait, ahead, || {
            self.try_data(&header, parts, total, plain, &fds)
        });
        match sent {
            Ok(_) => fds.finish(self).map_err(Inline::Fds),
            Err(Errno::NOBUFS | Errno::MSGSIZE) => Err(Inline::DataNoBufs),
            Err(e) => Err(Inline::Data(e)),
        }
    }

    /// Sends the descriptor packets of the message tagged `tag`: `channels`,
    /// then `carrier`, [`FDS_PER_PACKET`] a packet. Nothing to send without
    /// descriptors.
    #[inline]
    pub(super) fn send_fds(
        &self,
        channels: &[BorrowedFd<'_>],
        carrier: Option<BorrowedFd<'_>>,
        tag: u64,
    ) -> Result<(), Errno> {
        if channels.is_empty() && carrier.is_none() {
            return Ok(());
        }
        self.send_fd_packet(channels, carrier, tag)
    }

    #[cold]
    fn send_fd_packet(
        &self,
        channels: &[BorrowedFd<'_>],
        carrier: Option<BorrowedFd<'_>>,
        tag: u64,
    ) -> Result<(), Errno> {
        // Every packet but the last full (`FdPacket::expected`), in order;
        // `send` checked `channels.len() <= MAX_FDS`, so `index` fits a `u16`.
        let mut rest = channels;
        let mut index = 0;
        while rest.len() + usize::from(carrier.is_some()) > FDS_PER_PACKET {
            let (now, later) = rest.split_at(FDS_PER_PACKET);
            self.send_fd_chunk(now, None, index, tag)?;
            (rest, index) = (later, index + 1);
        }
        self.send_fd_chunk(rest, carrier, index, tag)
    }

    /// Sends descriptor packet `index` of the message `tag`: `channels`,
    /// then `carrier` (at most [`FDS_PER_PACKET`] in all).
    fn send_fd_chunk(
        &self,
        channels: &[BorrowedFd<'_>],
        carrier: Option<BorrowedFd<'_>>,
        index: usize,
        tag: u64,
    ) -> Result<(), Errno> {
        let count = channels.len() + usize::from(carrier.is_some());
        let packet = FdPacket { count, index, tag }.encode();
        let packet = [IoSlice::new(&packet)];
        match carrier {
            None => Os::send(self.fd(), &packet, channels),
            // Gathered on the stack when short (the rest of the array holds
            // our own socket as a filler and is never sent), else on the
            // heap, beside a payload too large for a packet.
            Some(carrier) if count <= KINDS => {
                let mut fds = [self.fd(); KINDS];
                fds[..channels.len()].copy_from_slice(channels);
                fds[channels.len()] = carrier;
                Os::send(self.fd(), &packet, &fds[..count])
            }
            Some(carrier) => {
                let mut fds = channels.to_vec();
                fds.push(carrier);
                Os::send(self.fd(), &packet, &fds)
            }
        }
        .map(drop)
    }

    /// Sends the payload in a region of the pool, one that `take` allows:
    /// named, if the receiver holds it and there are no channels, else by
    /// its descriptor. `None` if `take` allowed no region.
    fn send_region(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        take: Take,
        wait: Wait,
    ) -> Option<Result<(), SendError>> {
        let pool = &self.inner.pool;
        let (mut region, route, skew) = match pool.take(parts, total, take) {
            Ok(Some(taken)) => taken,
            Ok(None) => return None,
            // (Not through `SendError::from`, where `EAGAIN` is a full
            // socket: `mmap` may say that too.)
            Err(e) => return Some(Err(SendError::Io(e.into()))),
        };
        // A large payload is announced first and written after, while the
        // receiver copies it out (`shm`'s streaming).
        let streamed = total >= shm::STREAM_MIN;
        match streamed {
            true => region.open_stream(),
            false => region.fill(parts, skew, total, false),
        }
        let sent = match route {
            Route::Kept(token) if channels.is_empty() => {
                let header = Header::new(Body::Kept, total, 0, token)
                    .in_region(skew, streamed)
                    .encode();
                let none = Fds::new(&[], None, 0);
                let sent =
                    self.first_packet(wait, 0, || self.try_data(&header, &[], 0, false, &none));
                if sent.is_err() {
                    region.unclaim();
                }
                sent.map(drop)
            }
            // Held, but channels need a descriptor packet anyway: sending
            // the region's descriptor too makes this tag its new token.
            Route::Kept(_) | Route::Descriptor => {
                if matches!(route, Route::Kept(_)) {
                    region.unhold();
                }
                let tag = random_tag();
                region.set_token(tag);
                let header = Header::new(Body::SharedMemory, total, channels.len(), tag)
                    .in_region(skew, streamed)
                    .encode();
                let ahead = ahead(HEADER_LEN, channels.len() + 1);
                let fds = Fds::new(channels, Some(region.fd()), tag);
                self.first_packet(wait, ahead, || self.try_data(&header, &[], 0, false, &fds))
                    .and_then(|_| fds.finish(self))
            }
        };
        match &sent {
            Ok(()) if streamed => region.fill(parts, skew, total, true),
            Ok(()) => {}
            Err(e) => {
                // The descriptor never reached the receiver, or the kept
                // message was unclaimed above: the region is not in flight.
                if route == Route::Descriptor || !channels.is_empty() {
                    region.abandon(Route::Descriptor);
                }
                if matches!(*e, Errno::PIPE | Errno::CONNRESET) {
                    // The receiver is gone: nothing in flight will be read.
                    pool.forget_sent();
                }
            }
        }
        pool.put(region);
        Some(sent.map_err(SendError::from))
    }
}

/// The descriptors of a message being sent, tagged `tag`: through the ring,
/// sent right after the record, under the ring's lock; else after the data
/// packet, by [`Fds::finish`].
pub(super) struct Fds<'a> {
    channels: &'a [BorrowedFd<'a>],
    carrier: Option<BorrowedFd<'a>>,
    tag: u64,
    /// What sending them under the ring's lock came to, if it did.
    sent: std::cell::Cell<Option<Result<(), Errno>>>,
}

impl<'a> Fds<'a> {
    pub(super) fn new(
        channels: &'a [BorrowedFd<'a>],
        carrier: Option<BorrowedFd<'a>>,
        tag: u64,
    ) -> Self {
        Fds {
            channels,
            carrier,
            tag,
            sent: std::cell::Cell::new(None),
        }
    }

    /// Sends them now (the record is written).
    fn send_now(&self, sender: &OsSender) {
        let sent = sender.send_fds(self.channels, self.carrier, self.tag);
        self.sent.set(Some(sent));
    }

    /// Sends them if the data packet went without them (by socket): the
    /// outcome, either way.
    pub(super) fn finish(&self, sender: &OsSender) -> Result<(), Errno> {
        match self.sent.take() {
            Some(sent) => sent,
            None => sender.send_fds(self.channels, self.carrier, self.tag),
        }
    }
}
