//! The Linux transport: `SOCK_SEQPACKET` socketpairs plus sealed memfd regions.
//!
//! The wire format (header, descriptor packets) is in [`crate::ipc::wire`].
//!
//! # Sending (ipc-channel PR #68's techniques, and beyond)
//! * A message that fits one packet (header + payload ≤ [`socket::max_packet`])
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
//!   failed first try: the first packet carries the header (announcing the
//!   total) and the first part; the rest follows over a socketpair created
//!   for this message alone, whose receiving end travels in the descriptor
//!   packet. Fragments of concurrent senders therefore never interleave
//!   (ipc-channel's earlier design re-queued fragments on the shared socket
//!   and deadlocked, servo/ipc-channel#34). Fragment payloads are multiples
//!   of 8 bytes. `ENOBUFS` (the kernel could not allocate a packet that
//!   large) halves the packet size and retries, down to 2 KiB, and so does
//!   `EMSGSIZE`: packets are sized for this process's default send buffer
//!   ([`socket::max_packet`]), and an end made from a descriptor may have a
//!   smaller one.
//!
//! # Receiving
//! Each receiver predicts the next message's size from the last one.
//! * Expected small (≤ [`SCATTER_MIN`]): one plain `recv(2)` of the whole
//!   packet into the thread's scratch area, then the payload is copied into
//!   the destination. Plain `recv` is the cheapest read the kernel offers
//!   (`recvmsg` with an iovec and a control buffer costs ~16% more for 64
//!   bytes), and copying a few hundred bytes costs less than the difference.
//! * Expected larger: one `recvmsg` scatters the packet into the header,
//!   then **straight into the destination's spare capacity**, then into the
//!   scratch area, touched only if the message outgrew the prediction.
//! * After a header that announces descriptors, packets are read with a
//!   control buffer until the announced descriptor packet arrives; messages
//!   that arrive meanwhile wait in order behind the one that is incomplete.
//!
//! Nothing is zero-filled, and a small message never allocates a buffer the
//! size of the socket buffer. The header's total is checked against the
//! receiver's limit before anything is allocated; the rest of a fragmented
//! message is received directly into the final buffer.
#![allow(unsafe_code)]

pub(crate) mod poller;
pub(crate) mod shm;
pub(crate) mod socket;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use serde::{Deserialize, Serialize};

use self::shm::{KeptRegion, MapCache, PausedCopy, Pool, Progress, Route, Span, Stream, Take};
use crate::buf::{fill_spare, IoIter, RawIoVec, UbufMut};
use crate::fiber::Interest;
use crate::ipc::config::{Config, LargeMessages};
use crate::ipc::err::WireError;
use crate::ipc::handles::Descriptor;
use crate::ipc::split::Layout;
use crate::ipc::wire::{
    Body, FdKind, FdPacket, Header, PacketKind, FD_PACKET_LEN, HEADER_LEN, MAX_FDS,
};

/// Most iovec entries one `sendmsg` takes (`IOV_MAX` on Linux).
const IOV_MAX: usize = 1024;
/// Messages up to this size without descriptors are copied behind the
/// header into one stack buffer and sent with `send(2)`: a gather costs the
/// kernel's `msghdr` path (copying in and checking the iovec array, about
/// 100 ns here), more than copying this many bytes.
const SMALL: usize = socket::SMALL_MAX;
/// Gathers of fewer parts than this build their iovec on the stack.
const STACK_IOV: usize = 8;
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
    /// The peer sent a malformed message; it was dropped. For a refused
    /// data packet, its header (to drop its descriptors when they come).
    Wire(WireError, Option<Header>),
    /// The socket failed.
    Io(std::io::Error),
}

impl From<WireError> for RecvError {
    fn from(e: WireError) -> Self {
        RecvError::Wire(e, None)
    }
}

impl From<Errno> for RecvError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::AGAIN => RecvError::Empty,
            // (`NOTCONN`: a socket that was never connected, which no
            // message can ever reach; ends are checked for it, but an end
            // made from a raw descriptor is the caller's word.)
            Errno::CONNRESET | Errno::NOTCONN => RecvError::Disconnected,
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

/// A fresh tag for a message with descriptors, from the kernel's generator:
/// unique across threads and processes, and unguessable by another sender on
/// the same channel (so it cannot slip its descriptors into someone else's
/// message), even one that receives this thread's other messages: tags are
/// independent random numbers, not a stream an observer could extrapolate.
///
/// Each thread keeps a pool of [`TAG_POOL`] tags filled by one `getrandom`
/// call: asking the kernel for every tag cost one system call per message
/// (~0.3 µs). A forked child inherits its parent's pools, so `fork` bumps
/// [`FORKS`] and a pool filled before the last fork is refilled: parent and
/// child never share tags.
fn random_tag() -> u64 {
    TAGS.with_borrow_mut(|pool| {
        let forks = FORKS.load(Ordering::Relaxed);
        if pool.left == 0 || pool.filled_at != Some(forks) {
            watch_forks();
            kernel_random(&mut pool.tags);
            pool.left = pool.tags.len();
            pool.filled_at = Some(forks);
        }
        pool.left -= 1;
        pool.tags[pool.left]
    })
}

/// Tags drawn from the kernel at once.
const TAG_POOL: usize = 32;

/// A thread's unused tags.
struct TagPool {
    tags: [u64; TAG_POOL],
    /// Tags not handed out yet: `tags[..left]`.
    left: usize,
    /// The [`FORKS`] count when the pool was filled.
    filled_at: Option<u64>,
}

thread_local! {
    static TAGS: RefCell<TagPool> = const {
        RefCell::new(TagPool {
            tags: [0; TAG_POOL],
            left: 0,
            filled_at: None,
        })
    };
}

/// Forks this process has seen since tags were first drawn (in the child of
/// each fork, one more than in its parent).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Forks this process has seen (see [`FORKS`]); watched from the first call.
pub(crate) fn forks() -> u64 {
    watch_forks();
    FORKS.load(Ordering::Relaxed)
}

/// Registers the `fork` hook that bumps [`FORKS`] in the child, once.
fn watch_forks() {
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    static WATCHING: Once = Once::new();
    WATCHING.call_once(|| {
        // SAFETY: `in_child` only does an atomic add, which is
        // async-signal-safe (what a handler run in a forked child may do).
        let failed = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        // Only for lack of memory; a child could then hand out the rest of
        // its parent's pool (the same tags as the parent, until refilled).
        debug_assert_eq!(failed, 0, "pthread_atfork failed");
    });
}

/// Fills `out` from the kernel's generator.
fn kernel_random(out: &mut [u64; TAG_POOL]) {
    let mut bytes = [0u8; TAG_POOL * 8];
    let mut filled = 0;
    while filled < bytes.len() {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            // No kernel generator (pre-3.17): fall back to std's random seeds.
            Err(_) => {
                out.iter_mut().for_each(|tag| *tag = fallback_random());
                return;
            }
        }
    }
    for (tag, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        *tag = u64::from_le_bytes(chunk.try_into().expect("8-byte chunks"));
    }
}

fn fallback_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
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
struct SenderInner {
    fd: OwnedFd,
    /// Regions for this destination's large payloads. A region is only ever
    /// reused for the receiver it was sent to, so a receiver that keeps one
    /// and marks it free early can see or spoil only its own messages.
    pool: Pool,
}

impl OsSender {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsSender {
            inner: Arc::new(SenderInner {
                fd,
                pool: Pool::default(),
            }),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Sends `parts` (gathered, in order) with `channels` attached.
    pub(crate) fn send(
        &self,
        parts: &[IoSlice<'_>],
        channels: &[BorrowedFd<'_>],
    ) -> Result<(), SendError> {
        if channels.len() >= MAX_FDS {
            return Err(SendError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a message carries at most {} channels", MAX_FDS - 1),
            )));
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let inline_max = (socket::max_packet() - HEADER_LEN) & !7;
        let regions = Config::large_messages_now() == LargeMessages::SharedMemory;
        if total <= inline_max && parts.len() < IOV_MAX {
            // Past the stack packet, a region the receiver holds beats the
            // kernel's copy (two `memcpy`s and a header-sized packet): use
            // one if there is one, but pass no descriptor for these sizes.
            if regions && total > SMALL && channels.is_empty() {
                if let Some(sent) = self.send_region(parts, total, channels, Take::Kept) {
                    return sent;
                }
            }
            match self.send_inline(parts, total, channels) {
                Err(Inline::DataNoBufs) => {}
                Err(Inline::Data(e) | Inline::Fds(e)) => return Err(e.into()),
                Ok(()) => return Ok(()),
            }
            // The kernel could not allocate one packet this large (and sent
            // nothing): fragment, in smaller packets.
            return self.send_fragmented(parts, total, channels, inline_max / 2);
        }
        if regions {
            if let Some(sent) = self.send_region(parts, total, channels, Take::Any) {
                return sent;
            }
        }
        self.send_fragmented(parts, total, channels, socket::max_packet())
    }

    fn send_inline(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
    ) -> Result<(), Inline> {
        let tag = if channels.is_empty() { 0 } else { random_tag() };
        let header = Header::new(Body::Inline, total, channels.len(), tag).encode();
        let sent = if total <= SMALL {
            socket::send_small(self.fd(), &header, parts, total)
        } else if parts.len() < STACK_IOV {
            // Small gathers, the common case, stay on the stack.
            let mut iov = [IoSlice::new(&[]); STACK_IOV];
            iov[0] = IoSlice::new(&header);
            let n = IoIter::slices(parts).io_slices(&mut iov[1..]);
            socket::send(self.fd(), &iov[..=n], &[])
        } else {
            // At most `IOV_MAX` parts reach here (`send` checks).
            let mut iov = vec![IoSlice::new(&[]); parts.len() + 1];
            iov[0] = IoSlice::new(&header);
            let n = IoIter::slices(parts).io_slices(&mut iov[1..]);
            socket::send(self.fd(), &iov[..=n], &[])
        };
        match sent {
            Ok(_) => self.send_fds(channels, None, tag).map_err(Inline::Fds),
            Err(Errno::NOBUFS | Errno::MSGSIZE) => Err(Inline::DataNoBufs),
            Err(e) => Err(Inline::Data(e)),
        }
    }

    /// Sends the descriptor packet of the message tagged `tag`: `channels`,
    /// then `carrier`. Nothing to send without descriptors.
    #[inline]
    fn send_fds(
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
        // On the stack: `send` checked `channels.len() < MAX_FDS`. The rest
        // of the array holds our own socket as a filler and is never sent.
        let mut fds = [self.fd(); MAX_FDS];
        fds[..channels.len()].copy_from_slice(channels);
        let mut count = channels.len();
        if let Some(carrier) = carrier {
            fds[count] = carrier;
            count += 1;
        }
        let packet = FdPacket { count, tag }.encode();
        socket::send(self.fd(), &[IoSlice::new(&packet)], &fds[..count]).map(drop)
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
    ) -> Option<Result<(), SendError>> {
        let pool = &self.inner.pool;
        let (mut region, route, skew) = match pool.take(parts, total, take) {
            Ok(Some(taken)) => taken,
            Ok(None) => return None,
            Err(e) => return Some(Err(e.into())),
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
                let sent = socket::send_small(self.fd(), &header, &[], 0);
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
                socket::send(self.fd(), &[IoSlice::new(&header)], &[])
                    .and_then(|_| self.send_fds(channels, Some(region.fd()), tag))
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

    fn send_fragmented(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        packet: usize,
    ) -> Result<(), SendError> {
        let (carrier_tx, carrier_rx) = socket::pair()?;
        let tag = random_tag();
        let header = Header::new(Body::Fragmented, total, channels.len(), tag).encode();

        let mut rest = IoIter::slices(parts);
        let mut packet = packet & !7;
        let mut iov = Vec::new();
        // First packet: header + first part, on the channel itself.
        loop {
            iov.clear();
            iov.push(IoSlice::new(&header));
            let len = next_bytes(&rest, (packet - HEADER_LEN) & !7, &mut iov);
            match socket::send(self.fd(), &iov, &[]) {
                Ok(_) => {
                    rest.advance(len);
                    break;
                }
                Err(Errno::NOBUFS | Errno::MSGSIZE) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(e) => return Err(e.into()),
            }
        }
        self.send_fds(channels, Some(carrier_rx.as_fd()), tag)?;
        // The receiver holds its own copy of the carrier now.
        drop(carrier_rx);
        // The rest: on the dedicated socket, blocking until the receiver reads.
        while rest.remaining() > 0 {
            iov.clear();
            let len = next_bytes(&rest, packet & !7, &mut iov);
            match socket::send(carrier_tx.as_fd(), &iov, &[]) {
                Ok(_) => rest.advance(len),
                Err(Errno::NOBUFS | Errno::MSGSIZE) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(Errno::PIPE | Errno::CONNRESET) => return Err(self.carrier_closed()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The receiver closed a message's carrier before its end: it refused
    /// the message (over its size limit) or gave up on it (its fragments
    /// took longer than the fragment timeout), or it is gone altogether,
    /// which only the last case makes a `Disconnected`.
    #[cold]
    fn carrier_closed(&self) -> SendError {
        // A socket whose peer is closed always polls as hung up.
        let mut fds = [PollFd::new(&self.inner.fd, PollFlags::empty())];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&now)) {
            Ok(_) if fds[0].revents().contains(PollFlags::HUP) => SendError::Disconnected,
            _ => SendError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the receiver gave this message up before its end \
                 (over its size limit, or past its fragment timeout)",
            )),
        }
    }
}

/// Appends iovec entries for the next `max` bytes of `src` (fewer at its
/// end, or when `IOV_MAX` entries are reached) to `iov`, without copying or
/// advancing `src`; returns how many bytes they cover.
fn next_bytes<'a>(src: &IoIter<'a>, max: usize, iov: &mut Vec<IoSlice<'a>>) -> usize {
    let mut walk = src.clone();
    let mut len = 0;
    while len < max && iov.len() < IOV_MAX {
        let chunk = walk.chunk();
        if chunk.is_empty() {
            break;
        }
        let n = chunk.len().min(max - len);
        iov.push(IoSlice::new(&chunk[..n]));
        walk.advance(n);
        len += n;
    }
    len
}

// ===== OsReceiver =====

/// The receiving end of a channel.
#[derive(Debug)]
pub(crate) struct OsReceiver {
    fd: OwnedFd,
    /// Payload length of the last message: how large the next is expected
    /// to be, which sizes the buffer.
    guess: Cell<usize>,
    /// Payload bytes the last message's data packet carried: how large the
    /// next packet is expected to be, which picks the read path (a region's
    /// message is a bare header, however large its payload).
    packet_guess: Cell<usize>,
    state: RefCell<RecvState>,
}

/// A message whose data packet arrived and whose descriptors have not.
#[derive(Debug)]
struct Waiting {
    header: Header,
    /// The payload bytes of the data packet.
    data: Vec<u8>,
    since: Instant,
}

/// A message complete but not yet handed out.
#[derive(Debug)]
struct Ready {
    header: Header,
    data: Vec<u8>,
    fds: Vec<OwnedFd>,
    /// Set if a receive began to fetch the part of the payload carried
    /// elsewhere and returned before it all came (see `OsReceiver::finish`).
    resume: Option<Resume>,
}

impl Ready {
    /// This message as it travels with its receiver to another process. One
    /// whose fetch a receive put aside goes as it was before the fetch
    /// began, less what the fetch consumed: fragments with the bytes so far
    /// (the carrier goes along), a region message without them (its region
    /// goes along, by the descriptor kept for this or as a region the
    /// receiver holds, and is copied again).
    fn park(self) -> Option<Parked> {
        let Ready {
            header,
            data,
            mut fds,
            resume,
        } = self;
        let Some(resume) = resume else {
            return Some(Parked::new(header, data, fds));
        };
        match header.body {
            Body::Inline | Body::Fragmented => Some(Parked::new(header, data, fds)),
            Body::Kept => Some(Parked::new(header, Vec::new(), fds)),
            Body::SharedMemory => {
                // Always kept for a copy that may pause (`shm::hold`).
                let fd = resume.copy.and_then(|copy| copy.fd);
                debug_assert!(fd.is_some(), "a paused region copy without its descriptor");
                fds.push(fd?);
                Some(Parked::new(header, Vec::new(), fds))
            }
        }
    }
}

/// How far the fetch of a message's payload got before its receive had to
/// return: a carrier's fragments (the carrier is back among the message's
/// descriptors, the bytes so far in its data) or a streamed region's copy.
#[derive(Debug)]
struct Resume {
    /// What is left of the fragment timeout. It runs only while receives
    /// wait for the rest: a message that came whole while the application
    /// was away is not failed for the time it took to come back, and a peer
    /// that stops or creeps still uses it up, in a set's reads as in a
    /// blocking receive.
    budget: Duration,
    /// When a receive last got some of it (or when the receive that began
    /// the fetch began, if none has). A message
    /// put aside fails, however much budget it has left, when a receive that
    /// may not block gets none of it a whole fragment timeout after that: a
    /// stalled message at the head of a rarely polled receiver must not hold
    /// back the messages of the channel's other senders for thousands of
    /// polls, while a sender that is slow but keeps going is never cut off.
    last_got: Instant,
    /// When the receive that put it aside returned.
    paused_at: Instant,
    /// Whether that receive got no byte of it: a set then reads it again
    /// only after a slice (`OsReceiver::due`), and without spinning first.
    stalled: bool,
    /// The region's copy, for a payload in shared memory. If the receiver
    /// moves to another process, the message goes along and is copied there
    /// from the start (the copy so far reads a mapping of this process): a
    /// message that brought the region's descriptor takes it along
    /// (`PausedCopy::fd`), a kept message finds its region among the held
    /// ones that move with the receiver.
    copy: Option<PausedCopy>,
    /// The byte string copied so far to a buffer of its own, and where it
    /// sits in the payload (`PausedCopy::split`).
    string: Option<(Layout, Vec<u8>)>,
}

/// `d` from now, or a century if that is past what an `Instant` holds (a
/// fragment timeout may be set as long as `u64::MAX` milliseconds).
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}

/// How long a receive that may not block (`try_recv`, a receiver set's
/// read) waits for the rest of a message whose payload is still arriving
/// (fragments, or a streamed region) before it returns empty-handed and
/// leaves the fetch to the next receive, which goes on where it stopped.
/// A peer that starts a message and never finishes it holds such a
/// receive, and a set's select, this long at a time, not the fragment
/// timeout's 30 s; the message itself still fails at that timeout.
const FETCH_SLICE: Duration = Duration::from_millis(1);

/// What a receiver keeps between calls.
#[derive(Debug, Default)]
struct RecvState {
    /// Mappings of the regions large payloads arrived in.
    regions: MapCache,
    /// Messages whose descriptor packet has not arrived. They never hold up
    /// other messages: per-sender order needs no waiting, because a sender
    /// sends a message's descriptor packet before its next data packet, so
    /// anything that arrives meanwhile comes from another sender.
    waiting: Vec<Waiting>,
    /// Messages completed by a descriptor packet, in completion order.
    ready: VecDeque<Ready>,
    /// Tags of messages refused after their data packet: their descriptor
    /// packets are dropped quietly when they come.
    refused: VecDeque<u64>,
}

/// A byte string to receive into a buffer of its own (see `ipc::split`):
/// where it is predicted to sit in the payload, and the buffer.
pub(crate) struct Split<'a> {
    pub layout: Layout,
    pub string: &'a mut Vec<u8>,
}

/// A predicted byte string is received into its own buffer only if at most
/// this many payload bytes come before it (they pass through the scratch
/// area and are copied).
const MAX_SPLIT_HEAD: usize = 4096;

/// What a receiver had read off its socket but not handed out, when it is
/// sent to another process: it travels inside the message that carries the
/// receiver, so that moving a receiver mid-stream loses nothing. Messages
/// still waiting for their descriptor packet keep waiting at the new owner
/// (the packet arrives on the socket, which moved too); completed ones carry
/// their descriptors along, and so do the regions that messages still on
/// the socket may name (`shm`'s kept regions).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Backlog {
    waiting: Vec<Parked>,
    ready: Vec<Parked>,
    refused: Vec<u64>,
    regions: Vec<ParkedRegion>,
}

/// A held region of a [`Backlog`] (see [`KeptRegion`]).
#[derive(Debug, Serialize, Deserialize)]
struct ParkedRegion {
    token: u64,
    len: u64,
    fd: Descriptor,
}

/// One message of a [`Backlog`], its header in wire form.
#[derive(Debug, Serialize, Deserialize)]
struct Parked {
    #[serde(with = "serde_bytes")]
    header: Vec<u8>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    fds: Vec<Descriptor>,
}

impl Parked {
    fn new(header: Header, data: Vec<u8>, fds: Vec<OwnedFd>) -> Self {
        Parked {
            header: header.encode().to_vec(),
            data,
            fds: fds.into_iter().map(Descriptor).collect(),
        }
    }

    /// The header, checked as if it had just arrived: a backlog is as
    /// untrusted as the socket it came from.
    fn header(&self, limit: u64) -> Result<Header, RecvError> {
        let bytes = <&[u8; HEADER_LEN]>::try_from(self.header.as_slice())
            .map_err(|_| WireError::BadHeader("short packet"))?;
        check(Header::decode(bytes)?, self.data.len(), limit)
    }
}

/// Messages a receiver keeps waiting for their descriptors; past this, the
/// oldest is given up (a peer announcing descriptors it never sends cannot
/// make the receiver hold more: each keeps at most one packet's bytes, so
/// 64 of them about 13 MiB with Linux's default socket buffer).
const MAX_WAITING: usize = 64;

/// The bytes a message that waits for its descriptors keeps: `dst` itself
/// (the usual case: no copy, and the buffer comes back with the message),
/// unless its capacity is far beyond its length; then a copy of its bytes,
/// and `dst` keeps its capacity for the next read.
fn waiting_data(dst: &mut Vec<u8>) -> Result<Vec<u8>, RecvError> {
    if dst.capacity() <= dst.len().max(4096).saturating_mul(2) {
        return Ok(std::mem::take(dst));
    }
    let mut data = Vec::new();
    data.try_reserve_exact(dst.len())
        .map_err(|_| WireError::OutOfMemory {
            requested: dst.len() as u64,
        })?;
    data.extend_from_slice(dst);
    dst.clear();
    Ok(data)
}
/// How long a message may wait for its descriptor packet (its sender died
/// between the two sends, or never meant to send it).
const DESCRIPTOR_WAIT: Duration = Duration::from_secs(10);
/// Tags of refused messages remembered.
const MAX_REFUSED: usize = 16;
/// How long a receive that refused a message with descriptors waits for its
/// descriptor packet (normally sent right after the message).
const REFUSED_WAIT: Duration = Duration::from_millis(5);
/// Messages expected to be at most this large are read with plain `recv(2)`
/// into the thread's scratch area and copied out (cheaper than the
/// `recvmsg` path below this size); larger ones are scattered by `recvmsg`
/// straight into the destination. The same line as the sender's
/// [`SMALL`], and for the same reason (see [`socket::SMALL_MAX`]).
const SCATTER_MIN: usize = socket::SMALL_MAX;

/// What one read delivered.
enum Read {
    /// A data packet (checked against the limit and its own length); its
    /// payload is in the destination buffer, less the byte string split off
    /// into its own buffer if the flag is set (see [`Split`]).
    Data(Header, bool),
    /// A descriptor packet, and whether the kernel dropped some of its
    /// descriptors for lack of room (`MSG_CTRUNC`).
    Fds(FdPacket, Vec<OwnedFd>, bool),
    /// A packet to skip: the descriptor packet of a message we refused,
    /// read without a control buffer (the kernel closed its descriptors).
    Skip,
}

thread_local! {
    /// Where packets land that the destination had no room for, and where
    /// small messages are read whole. Allocated on first use, never
    /// initialised: the kernel writes only what arrives, so only pages that
    /// ever held data become resident.
    ///
    /// It has no destructor, so a receive can always reach it, also from
    /// another thread-local's `Drop` at thread exit; [`SCRATCH_OWNER`] frees
    /// the buffer instead.
    static SCRATCH: RefCell<ManuallyDrop<Vec<u8>>> =
        const { RefCell::new(ManuallyDrop::new(Vec::new())) };
    /// Frees [`SCRATCH`]'s buffer when the thread's locals are torn down.
    /// Touched when the buffer is allocated, so that it is registered for
    /// that; once it is gone, a receive that finds no buffer uses one of
    /// its own for that call, which nothing would free otherwise.
    static SCRATCH_OWNER: ScratchOwner = const { ScratchOwner };
}

/// See [`SCRATCH_OWNER`].
struct ScratchOwner;

impl Drop for ScratchOwner {
    fn drop(&mut self) {
        let _ = SCRATCH.with(|scratch| {
            scratch
                .try_borrow_mut()
                .map(|mut scratch| drop(std::mem::take(&mut **scratch)))
        });
    }
}

/// Runs `f` on the thread's scratch area, one packet long (see [`SCRATCH`]),
/// starting at a page boundary.
///
/// The kernel copies a packet out with `rep movsb`, which on this AMD Zen 3
/// guest runs ~17x slower for 4-256 KiB when the destination lies 1-31 bytes
/// past the source modulo 4 KiB (`courier-bench iter --case memcpy`; the
/// design note on the memcpy placement under `docs/`). A packet of a few KiB
/// starts at a page boundary in the kernel, and a `Vec` of a packet's size
/// is `mmap`ed by malloc, 16 bytes past one: exactly that distance.
/// `courier-bench ipc --case sendrecv_4k`, bytes, a malloc'd area against a
/// page-aligned one, the two builds in turn: 6.7-7.0 µs against 4.5-4.6
/// (ipc-channel 5.0-5.2); in a faster minute 4.8-4.9 against 3.4
/// (ipc-channel 3.9).
///
/// A receive from a thread-local's destructor, once [`SCRATCH_OWNER`] has
/// freed the thread's area, uses an area of its own for that one call.
#[inline]
fn with_scratch<R>(f: impl FnOnce(&mut [MaybeUninit<u8>]) -> R) -> R {
    SCRATCH.with_borrow_mut(|scratch| {
        // One call of `f` whichever area it gets: a second call site (for
        // the area of its own) kept `f` out of line, ~35 instructions a
        // small receive (callgrind, `floor_ab courier 64`).
        let room = socket::max_packet();
        let mut own = Vec::new();
        let area = match scratch.capacity() >= room + PAGE {
            true => &mut **scratch,
            false => grow_scratch(&mut own, scratch, room + PAGE),
        };
        let spare = area.spare_capacity_mut();
        let skip = spare.as_ptr().addr().next_multiple_of(PAGE) - spare.as_ptr().addr();
        f(&mut spare[skip..skip + room])
    })
}

/// The area for a receive that found the thread's too short (or freed):
/// the thread's, grown to `len`, while [`SCRATCH_OWNER`] can still free it,
/// else `own`, for this call only.
#[cold]
fn grow_scratch<'a>(own: &'a mut Vec<u8>, scratch: &'a mut Vec<u8>, len: usize) -> &'a mut Vec<u8> {
    let area = match SCRATCH_OWNER.try_with(|_| ()) {
        Ok(()) => scratch,
        Err(_) => own,
    };
    *area = Vec::with_capacity(len);
    area
}

/// A page: the scratch area starts on one.
const PAGE: usize = 4096;

impl OsReceiver {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsReceiver {
            fd,
            guess: Cell::new(0),
            packet_guess: Cell::new(0),
            state: RefCell::new(RecvState::default()),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// When this receiver must be read again even if its socket stays quiet:
    /// now, if a message is complete and not yet handed out; when the oldest
    /// message still waiting for its descriptors expires (a read that finds
    /// the socket dry then reports it); `None` if nothing is held. For a
    /// receiver set, which otherwise waits for its sockets alone.
    pub(crate) fn due(&self) -> Option<Instant> {
        let state = self.state.borrow();
        if let Some(first) = state.ready.front() {
            return Some(match &first.resume {
                // A message whose rest is late: not before a slice has passed.
                Some(r) if r.stalled => r.paused_at + FETCH_SLICE,
                _ => Instant::now(),
            });
        }
        state
            .waiting
            .iter()
            .map(|m| m.since + DESCRIPTOR_WAIT)
            .min()
    }

    /// Takes the messages read off the socket but not handed out, to send
    /// them along with this receiver; `None` in the usual case of none.
    pub(crate) fn take_backlog(&self) -> Option<Backlog> {
        let mut state = self.state.borrow_mut();
        let regions = state.regions.take_kept();
        if state.waiting.is_empty()
            && state.ready.is_empty()
            && state.refused.is_empty()
            && regions.is_empty()
        {
            return None;
        }
        let mut waiting = std::mem::take(&mut state.waiting);
        waiting.sort_by_key(|m| m.since);
        Some(Backlog {
            waiting: waiting
                .into_iter()
                .map(|m| Parked::new(m.header, m.data, Vec::new()))
                .collect(),
            ready: state.ready.drain(..).filter_map(Ready::park).collect(),
            refused: state.refused.drain(..).collect(),
            regions: regions
                .into_iter()
                .map(|r| ParkedRegion {
                    token: r.token,
                    len: r.len,
                    fd: Descriptor(r.fd),
                })
                .collect(),
        })
    }

    /// A receiver on `fd` that first delivers `backlog` (see
    /// [`OsReceiver::take_backlog`]), which is checked like anything else
    /// from a peer. The regions it holds are charged to `budget`, what the
    /// message that brought it may still map, and to the process's budget
    /// for held regions.
    pub(crate) fn with_backlog(
        fd: OwnedFd,
        backlog: Backlog,
        budget: &mut u64,
    ) -> Result<Self, WireError> {
        let limit = Config::max_message_size_now();
        let wire = |e: RecvError| match e {
            RecvError::Wire(e, _) => e,
            _ => WireError::BadHeader("bad backlog"),
        };
        if backlog.waiting.len() > MAX_WAITING || backlog.refused.len() > MAX_REFUSED {
            return Err(WireError::BadHeader("backlog too long"));
        }
        let mut state = RecvState::default();
        let now = Instant::now();
        for m in backlog.waiting {
            let header = m.header(limit).map_err(wire)?;
            if header.nfds == 0 || !m.fds.is_empty() {
                return Err(WireError::BadHeader("backlog: not waiting for descriptors"));
            }
            state.waiting.push(Waiting {
                header,
                data: m.data,
                since: now,
            });
        }
        for m in backlog.ready {
            let header = m.header(limit).map_err(wire)?;
            if header.nfds != m.fds.len() {
                return Err(WireError::UnexpectedFds {
                    announced: header.nfds,
                    received: m.fds.len(),
                });
            }
            state.ready.push_back(Ready {
                header,
                data: m.data,
                fds: m.fds.into_iter().map(|d| d.0).collect(),
                resume: None,
            });
        }
        state.refused.extend(backlog.refused);
        for r in backlog.regions {
            let region = KeptRegion {
                token: r.token,
                len: r.len,
                fd: r.fd.0,
            };
            // A region the process cannot hold, or that fails its checks, is
            // left out: the messages that name it fail alone (`BadRegion`),
            // not the whole receiver. One over the message's budget fails it.
            match state.regions.hold(region, budget) {
                Ok(_) | Err(WireError::BadRegion) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(OsReceiver {
            fd,
            guess: Cell::new(0),
            packet_guess: Cell::new(0),
            state: RefCell::new(state),
        })
    }

    /// The payload length of the last message received.
    pub(crate) fn last_len(&self) -> usize {
        self.guess.get()
    }

    /// Receives one message: its payload replaces the contents of `dst` (the
    /// spare capacity of which is used as the receive buffer), and its
    /// channel descriptors are returned in order.
    #[inline]
    pub(crate) fn recv_into(
        &self,
        dst: &mut Vec<u8>,
        wait: Wait,
        limit: u64,
    ) -> Result<Vec<OwnedFd>, RecvError> {
        self.recv_message(dst, None, wait, limit)
            .map(|(fds, _)| fds)
    }

    /// [`recv_into`](Self::recv_into), and with `split`, a message without
    /// channels laid out as predicted has its byte string received into
    /// `split.string` and the rest into `dst` (`true` returned): the
    /// payload is `dst[..at]`, the string, `dst[at..]`.
    pub(crate) fn recv_message(
        &self,
        dst: &mut Vec<u8>,
        mut split: Option<Split<'_>>,
        wait: Wait,
        limit: u64,
    ) -> Result<(Vec<OwnedFd>, bool), RecvError> {
        let mut state = self.state.borrow_mut();
        // The steady state of small messages takes a shorter path; anything
        // else it reads is handed to the loop as the loop's own read.
        let mut first = None;
        // A fiber never blocks its worker in the kernel: it reads without
        // waiting, and waits on its worker's reactor (`wait_readable`).
        let fiber = crate::fiber::in_fiber();
        if state.ready.is_empty()
            && state.waiting.is_empty()
            && self.packet_guess.get() <= SCATTER_MIN
        {
            let dontwait = fiber || !matches!(wait, Wait::Block);
            match self.read_plain(&state, dst, limit, dontwait) {
                Ok(()) => return Ok((Vec::new(), false)),
                Err(other) => first = Some(other),
            }
        }
        loop {
            if let Some(ready) = state.ready.pop_front() {
                *dst = ready.data;
                let Ready {
                    header,
                    fds,
                    resume,
                    ..
                } = ready;
                return self.finish(&mut state, header, dst, fds, split, resume, wait);
            }
            // Block in the kernel only when nothing waits for descriptors;
            // otherwise read without blocking (a descriptor packet normally
            // follows its message at once) and wait below, with a deadline.
            let dontwait = fiber || !matches!(wait, Wait::Block) || !state.waiting.is_empty();
            let read = match first
                .take()
                .unwrap_or_else(|| self.read(&state, dst, split.as_mut(), limit, dontwait))
            {
                Err(RecvError::Disconnected) if !state.waiting.is_empty() => {
                    // The stream ended before the announced descriptors.
                    state.waiting.clear();
                    return Err(WireError::Truncated.into());
                }
                Err(RecvError::Empty) => {
                    // Only a socket read dry tells that a waiting message's descriptors are
                    // late: a receiver that comes back after a long while may find them queued.
                    if let Some(stale) = state.expire() {
                        return Err(stale.into());
                    }
                    // Wake up in time to expire the oldest waiting message,
                    // or at the caller's deadline if that comes first.
                    let expiry = state.next_expiry();
                    let (deadline, own) = match (wait, expiry) {
                        (Wait::Poll, _) => return Err(RecvError::Empty),
                        (Wait::Until(d), Some(e)) if e < d => (e, false),
                        (Wait::Until(d), _) => (d, true),
                        (Wait::Block, Some(e)) => (e, false),
                        // (A read that consumed a packet and had nothing to
                        // return, such as late descriptors dropped quietly.)
                        (Wait::Block, None) => (Instant::now() + DESCRIPTOR_WAIT, false),
                    };
                    match wait_readable(self.fd(), deadline) {
                        Err(RecvError::Empty) if !own => continue,
                        other => other?,
                    }
                    continue;
                }
                Err(RecvError::Wire(WireError::TooLarge { claimed, limit }, Some(header))) => {
                    state.refuse(header);
                    match header.body {
                        Body::Fragmented | Body::SharedMemory => {
                            self.drop_refused(&mut state, header.tag, limit)
                        }
                        // Unpin the region for its sender.
                        Body::Kept => state.regions.skip_kept(header.tag),
                        Body::Inline => {}
                    }
                    return Err(WireError::TooLarge { claimed, limit }.into());
                }
                other => other?,
            };
            match read {
                Read::Data(header, split_off) if header.nfds == 0 => {
                    // The steady state: no descriptors, so the payload is inline
                    // or in a region we hold (`Header::decode` wants a carrier
                    // for any other body).
                    if header.body == Body::Kept {
                        let fds = Vec::new();
                        return self.finish(&mut state, header, dst, fds, split, None, wait);
                    }
                    debug_assert_eq!(header.body, Body::Inline);
                    self.guess.set(header.total as usize);
                    self.packet_guess.set(header.total as usize);
                    return Ok((Vec::new(), split_off));
                }
                Read::Data(header, _) => {
                    // It keeps the bytes of its packet only, at most one
                    // packet's worth, not the capacity of `dst`: a receive
                    // buffer is sized from the last message (up to the size
                    // limit), and each header announcing descriptors that
                    // never come would pin another one.
                    let data = waiting_data(dst)?;
                    state.waiting.push(Waiting {
                        header,
                        data,
                        since: Instant::now(),
                    });
                    if state.waiting.len() > MAX_WAITING {
                        return Err(state.give_up_oldest().into());
                    }
                }
                Read::Fds(packet, fds, truncated) => state.attach(packet, fds, truncated)?,
                Read::Skip => {}
            }
        }
    }

    /// Waits briefly for the descriptor packet of the refused message `tag`
    /// and, if it is the next packet, reads and drops it: that closes our
    /// copy of the message's carrier, so a sender blocked on the rest of a
    /// fragmented message learns at once that it was refused
    /// (`ConnectionAborted`) instead of at this receiver's next read. Any
    /// other next packet is left for the next receive (the refused packet is
    /// then dropped when it comes, as before). A sender that never sends the
    /// packet costs this receive at most [`REFUSED_WAIT`].
    #[cold]
    fn drop_refused(&self, state: &mut RecvState, tag: u64, limit: u64) {
        let deadline = Instant::now() + REFUSED_WAIT;
        let mut next = [MaybeUninit::<u8>::uninit(); FD_PACKET_LEN];
        loop {
            match socket::peek(self.fd(), &mut next) {
                Ok(len) => {
                    // SAFETY: `recv` initialised the first `len` bytes.
                    let next = unsafe { socket::assume_init(&next[..len]) };
                    let ours = PacketKind::of(next) == Ok(PacketKind::Fds)
                        && FdPacket::decode(next).is_ok_and(|p| p.tag == tag);
                    if ours {
                        // With a control buffer, so that `attach` gets the
                        // descriptors (and hands a region back to its sender)
                        // before it closes them.
                        let mut none = Vec::new();
                        let read = with_scratch(|scratch| {
                            let scratch = &mut scratch[HEADER_LEN..];
                            self.read_scatter(scratch, &mut none, limit, true, true)
                        });
                        if let Ok(Read::Fds(packet, fds, truncated)) = read {
                            let _ = state.attach(packet, fds, truncated);
                        }
                    }
                    return;
                }
                Err(Errno::AGAIN) if wait_readable(self.fd(), deadline).is_ok() => {}
                Err(_) => return,
            }
        }
    }

    /// Completes a message whose descriptors are all here: fetches the part
    /// of the payload carried elsewhere, going on from `resume` if an earlier
    /// receive began it.
    ///
    /// A receive that may not block (`wait` not `Block`) waits for a payload
    /// still arriving until its own deadline, and at least [`FETCH_SLICE`];
    /// then the message goes back to the head of the ready queue with what
    /// came so far, and the receive is `Empty`.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        state: &mut RecvState,
        header: Header,
        dst: &mut Vec<u8>,
        mut fds: Vec<OwnedFd>,
        mut split: Option<Split<'_>>,
        resume: Option<Resume>,
        wait: Wait,
    ) -> Result<(Vec<OwnedFd>, bool), RecvError> {
        let mut split_off = false;
        // `read` checked `total` against the limit and the inline bytes.
        let total = usize::try_from(header.total).map_err(|_| WireError::Truncated)?;
        let timeout = Config::global().fragment_timeout;
        let (deadline, last_got, mut paused, string, stalled) = match resume {
            Some(r) => (
                Some(after(r.budget)),
                Some(r.last_got),
                r.copy,
                r.string,
                r.stalled,
            ),
            None => (None, None, None, None, false),
        };
        // Whether a receive that got nothing ends the message (`Resume::last_got`).
        let given_up = |got: bool, now: Instant| {
            !got && last_got.is_some_and(|last| now.saturating_duration_since(last) >= timeout)
        };
        // When this receive got some of it, or what it was before.
        let last_got = |got: bool, now: Instant, entered: Instant| match got {
            true => now,
            false => last_got.unwrap_or(entered),
        };
        if let Some(copy) = &mut paused {
            // Go on with the string's own buffer if this receive predicts
            // the same string; else put the string back in its place.
            match (string, split.as_mut()) {
                (Some((layout, string)), Some(s)) if s.layout == layout => *s.string = string,
                (Some((layout, string)), _) => {
                    let at = layout.at.min(dst.len());
                    dst.splice(at..at, string);
                    copy.split = false;
                }
                (None, _) => {}
            }
            if !copy.split {
                split = None;
            }
        }
        let deadline = || deadline.unwrap_or_else(|| after(timeout));
        let pause = || match wait {
            Wait::Block => None,
            Wait::Poll => Some(Instant::now() + FETCH_SLICE),
            Wait::Until(d) => Some(d.max(Instant::now() + FETCH_SLICE)),
        };
        // Where a region's payload lies: `skew` bytes in, `total` long, and
        // for a streamed one, how long to wait for it.
        let alive = || self.senders_left();
        let span = |deadline: Option<Instant>| Span {
            skew: usize::from(header.skew),
            total,
            stream: deadline.map(|deadline| Stream {
                deadline,
                pause: pause(),
                spin: !stalled,
                alive: &alive,
            }),
        };
        let mut in_packet = total;
        let progress = match header.body {
            Body::Inline => None,
            Body::Fragmented => {
                let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                let deadline = deadline();
                let entered = deadline.checked_sub(timeout).unwrap_or(deadline);
                let before = dst.len();
                if dst.len() < total && !recv_fragments(&carrier, dst, total, deadline, pause())? {
                    let now = Instant::now();
                    let got = dst.len() > before;
                    if given_up(got, now) {
                        return Err(WireError::FragmentTimeout.into());
                    }
                    fds.push(carrier);
                    let resume = Resume {
                        budget: deadline.saturating_duration_since(now),
                        last_got: last_got(got, now, entered),
                        paused_at: now,
                        stalled: !got,
                        copy: None,
                        string: None,
                    };
                    return Err(state.put_back(header, dst, fds, resume));
                }
                None
            }
            Body::SharedMemory | Body::Kept => {
                in_packet = 0;
                // Only a streamed payload is waited for (no clock read for
                // the others, medium messages included).
                let deadline = header.streamed.then(deadline);
                // Reborrowed: a paused copy takes the string back out.
                let reborrow = split.as_mut().map(|s| Split {
                    layout: s.layout,
                    string: &mut *s.string,
                });
                let progress = match (paused, header.body) {
                    (Some(copy), _) => state.regions.resume(copy, span(deadline), dst, reborrow),
                    (None, Body::Kept) => {
                        state
                            .regions
                            .copy_kept(header.tag, span(deadline), dst, reborrow)
                    }
                    (None, _) => {
                        let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                        // Split only a message without channels (see `ipc::split`).
                        let reborrow = reborrow.filter(|_| fds.is_empty());
                        state
                            .regions
                            .copy_out(carrier, header.tag, span(deadline), dst, reborrow)
                    }
                };
                Some((progress?, deadline))
            }
        };
        match progress {
            Some((Progress::Done(split), ..)) => split_off = split,
            Some((Progress::Paused(copy), deadline)) => {
                // (Only a streamed copy pauses, so there is a deadline.)
                let deadline = deadline.unwrap_or_else(|| after(timeout));
                let entered = deadline.checked_sub(timeout).unwrap_or(deadline);
                let now = Instant::now();
                if given_up(copy.progressed, now) {
                    state.regions.give_up(copy);
                    return Err(WireError::FragmentTimeout.into());
                }
                let string =
                    (split.filter(|_| copy.split)).map(|s| (s.layout, std::mem::take(s.string)));
                let resume = Resume {
                    budget: deadline.saturating_duration_since(now),
                    last_got: last_got(copy.progressed, now, entered),
                    paused_at: now,
                    stalled: !copy.progressed,
                    copy: Some(copy),
                    string,
                };
                return Err(state.put_back(header, dst, fds, resume));
            }
            None => {}
        }
        debug_assert!((0..fds.len()).all(|i| header.kind(i) == FdKind::Channel));
        self.guess.set(total);
        self.packet_guess.set(in_packet);
        Ok((fds, split_off))
    }

    /// Whether any sender is left: the socket has not hung up.
    fn senders_left(&self) -> bool {
        let mut fds = [PollFd::new(&self.fd, PollFlags::empty())];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let hung_up =
            poll(&mut fds, Some(&now)).is_ok() && fds[0].revents().contains(PollFlags::HUP);
        !hung_up
    }

    /// Reads one packet. A data packet's payload replaces `dst`'s contents;
    /// with descriptors awaited, descriptors attached to the packet are taken.
    fn read(
        &self,
        state: &RecvState,
        dst: &mut Vec<u8>,
        split: Option<&mut Split<'_>>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        dst.clear();
        let room = socket::max_packet();
        let control = !state.waiting.is_empty();
        with_scratch(|scratch| {
            if !control && self.packet_guess.get() <= SCATTER_MIN {
                self.read_small(state, scratch, dst, limit, dontwait)
            } else if let Some(split) = split.filter(|s| {
                // A string that cannot fit one packet comes by region or
                // fragments (split there, if at all): allocate nothing for it.
                !control && s.layout.at <= MAX_SPLIT_HEAD && s.layout.at + s.layout.len <= room
            }) {
                self.read_split(scratch, dst, split, limit, dontwait)
            } else {
                self.read_scatter(&mut scratch[HEADER_LEN..], dst, limit, control, dontwait)
            }
        })
    }

    /// [`read_small`](Self::read_small) with the common case done in place:
    /// a packet holding a whole message without descriptors is copied into
    /// `dst` and done with (`Ok`); any other packet, or an error, is what
    /// `read_small` makes of it (`Err`), for `recv_message`'s loop. The
    /// loop's general path moves a `Read` and a `Header` through memory for
    /// it: this path costs a 64-byte send+receive a fifth fewer instructions
    /// (758 -> 600, `courier-bench --example floor_ab`).
    #[inline]
    fn read_plain(
        &self,
        state: &RecvState,
        dst: &mut Vec<u8>,
        limit: u64,
        dontwait: bool,
    ) -> Result<(), Result<Read, RecvError>> {
        with_scratch(|scratch| {
            let len = socket::recv_whole(self.fd(), scratch, dontwait)
                .map_err(|e| Err(RecvError::from(e)))?;
            if let Some(packet) = scratch.get(..len) {
                // SAFETY: `recv` initialised the first `len` bytes of `scratch`.
                let packet = unsafe { socket::assume_init(packet) };
                if let Some((header, payload)) = packet.split_first_chunk::<HEADER_LEN>() {
                    let total = payload.len() as u64;
                    if let Ok(h) = Header::decode(header) {
                        if h.body == Body::Inline
                            && h.nfds == 0
                            && h.total == total
                            && total <= limit
                        {
                            dst.clear();
                            dst.extend_from_slice(payload);
                            self.guess.set(payload.len());
                            self.packet_guess.set(payload.len());
                            return Ok(());
                        }
                    }
                }
            }
            Err(self.small_packet(state, scratch, len, dst, limit))
        })
    }

    /// `recv(2)` of the whole packet into `scratch`, then the payload copied
    /// into `dst`. Descriptors attached to the packet are discarded by the
    /// kernel (a data packet never legitimately has any).
    fn read_small(
        &self,
        state: &RecvState,
        scratch: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let len = socket::recv_whole(self.fd(), scratch, dontwait)?;
        self.small_packet(state, scratch, len, dst, limit)
    }

    /// The packet of `len` bytes [`read_small`](Self::read_small) received
    /// into `scratch` (`len` exceeds `scratch.len()` if it did not fit).
    fn small_packet(
        &self,
        state: &RecvState,
        scratch: &[MaybeUninit<u8>],
        len: usize,
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Read, RecvError> {
        dst.clear();
        if len == 0 {
            return Err(self.empty_packet());
        }
        if len > scratch.len() {
            return Err(WireError::Truncated.into());
        }
        // SAFETY: `recv` initialised the first `len` bytes of `scratch`.
        let packet = unsafe { socket::assume_init(&scratch[..len]) };
        if PacketKind::of(packet)? == PacketKind::Fds {
            // Its descriptors are lost (closed by the kernel): fine for a
            // refused message's, an error otherwise, since a descriptor
            // packet must follow an announcement, which switches to `recvmsg`.
            let fds = FdPacket::decode(packet)?;
            return match state.refused.contains(&fds.tag) {
                true => Ok(Read::Skip),
                false => Err(WireError::BadHeader("descriptor packet without a message").into()),
            };
        }
        let (header, payload) = packet
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(WireError::BadHeader("short packet"))?;
        let header = check(Header::decode(header)?, payload.len(), limit)?;
        dst.reserve(payload.len());
        fill_spare(dst, |room| room.copy_to_iter(payload));
        Ok(Read::Data(header, false))
    }

    /// One `recvmsg` scattering the header, then straight into `dst`'s spare
    /// capacity, then into `overflow`.
    fn read_scatter(
        &self,
        overflow: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        limit: u64,
        control: bool,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let mut header = [MaybeUninit::<u8>::uninit(); HEADER_LEN];
        let mut head = UbufMut::new(&mut header);
        let mut tail = UbufMut::new(overflow);
        let packet = fill_spare(dst, |room| {
            self.recv_scattered((&mut head, room, &mut tail), control, dontwait)
        })?;
        if packet.len == 0 && !packet.truncated {
            return Err(self.empty_packet());
        }
        if packet.truncated {
            return Err(WireError::Truncated.into());
        }
        let head = head.filled_bytes();
        match PacketKind::of(head)? {
            PacketKind::Fds => {
                let fd_packet = FdPacket::decode(head.get(..FD_PACKET_LEN).unwrap_or(head))?;
                return Ok(Read::Fds(fd_packet, packet.fds, packet.control_truncated));
            }
            // Descriptors attached to a data packet are closed unread.
            PacketKind::Data => drop(packet.fds),
        }
        let header = Header::decode(
            head.try_into()
                .map_err(|_| WireError::BadHeader("short packet"))?,
        )?;
        let header = check(header, packet.len - HEADER_LEN, limit)?;
        // The part of the packet the destination had no room for.
        dst.extend_from_slice(tail.filled_bytes());
        Ok(Read::Data(header, false))
    }

    /// One `recvmsg` scattering the header and the bytes before the predicted
    /// byte string into `scratch`, the string into its own buffer, the rest
    /// after it into `scratch`; `dst` gets the payload less the string. A
    /// packet that does not match the prediction (shorter, or with
    /// descriptors to come) is put back together in `dst`.
    fn read_split(
        &self,
        scratch: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        split: &mut Split<'_>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let Layout { at, len } = split.layout;
        let string = &mut *split.string;
        string.clear();
        string
            .try_reserve_exact(len)
            .map_err(|_| WireError::OutOfMemory {
                requested: len as u64,
            })?;
        let (front, back) = scratch.split_at_mut(HEADER_LEN + at);
        let mut front = UbufMut::new(front);
        let mut middle = UbufMut::new(&mut string.spare_capacity_mut()[..len]);
        let mut back = UbufMut::new(back);
        let packet = self.recv_scattered((&mut front, &mut middle, &mut back), false, dontwait)?;
        let in_middle = middle.filled();
        // SAFETY: `middle` (no longer used) covered the first `len` bytes of `string`'s spare
        // capacity, and its first `in_middle <= len` bytes were written.
        unsafe { string.set_len(in_middle) };
        if packet.len == 0 && !packet.truncated {
            return Err(self.empty_packet());
        }
        if packet.truncated {
            return Err(WireError::Truncated.into());
        }
        let front = front.filled_bytes();
        if PacketKind::of(front)? == PacketKind::Fds {
            let fd_packet = FdPacket::decode(front.get(..FD_PACKET_LEN).unwrap_or(front))?;
            return Ok(Read::Fds(fd_packet, packet.fds, packet.control_truncated));
        }
        let (header, head) = front
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(WireError::BadHeader("short packet"))?;
        let header = check(Header::decode(header)?, packet.len - HEADER_LEN, limit)?;
        dst.clear();
        dst.extend_from_slice(head);
        let split_off = in_middle == len && header.nfds == 0;
        if !split_off {
            dst.append(string);
        }
        dst.extend_from_slice(back.filled_bytes());
        Ok(Read::Data(header, split_off))
    }

    /// One `recvmsg` scattering the packet over `parts`, in order; each part
    /// records what the kernel wrote into it.
    fn recv_scattered(
        &self,
        (a, b, c): (&mut UbufMut<'_>, &mut UbufMut<'_>, &mut UbufMut<'_>),
        control: bool,
        dontwait: bool,
    ) -> Result<socket::Packet, Errno> {
        let packet = {
            let mut iov = [RawIoVec::EMPTY; 3];
            let mut n = a.io_vecs(&mut iov);
            n += b.io_vecs(&mut iov[n..]);
            n += c.io_vecs(&mut iov[n..]);
            socket::recv(self.fd(), &mut iov[..n], control, dontwait)?
        };
        let mut left = packet.len;
        let mut advance = |part: &mut UbufMut<'_>| {
            let here = left.min(part.remaining());
            // SAFETY: `recvmsg` wrote `packet.len` bytes into the iovec
            // entries in order (one per part with room left), so the next
            // `here` bytes of this part, up to its room, are initialised.
            unsafe { part.advance(here) };
            left -= here;
        };
        advance(a);
        advance(b);
        advance(c);
        Ok(packet)
    }

    /// A read of zero bytes: the end of the stream if the peer is gone and
    /// nothing is queued, else an empty packet (courier never sends one).
    #[cold]
    fn empty_packet(&self) -> RecvError {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN | PollFlags::RDHUP)];
        let hung_up = match poll(
            &mut fds,
            Some(&Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        ) {
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP),
            Err(_) => true,
        };
        // A peer may send empty packets and then more before it leaves: the
        // stream ends only where no byte is queued behind. `FIONREAD` on a
        // `SOCK_SEQPACKET` socket counts the bytes of every queued packet, not
        // only the next one's (which a peek would see, and a second empty
        // packet would hide the message behind it). A run of empty packets at
        // the end still reads as the end.
        let more = || !matches!(rustix::io::ioctl_fionread(self.fd()), Ok(0));
        match hung_up && !more() {
            true => RecvError::Disconnected,
            false => WireError::BadHeader("empty packet").into(),
        }
    }
}

/// Checks a data packet's header against the receiver's limit and against
/// the `inline` payload bytes that came with it, before anything is copied
/// or kept.
fn check(header: Header, inline: usize, limit: u64) -> Result<Header, RecvError> {
    if header.total > limit {
        return Err(RecvError::Wire(
            WireError::TooLarge {
                claimed: header.total,
                limit,
            },
            Some(header),
        ));
    }
    let consistent = match header.body {
        Body::Inline => header.total == inline as u64,
        Body::Fragmented => header.total >= inline as u64,
        Body::SharedMemory | Body::Kept => inline == 0,
    };
    match consistent {
        true => Ok(header),
        false => Err(WireError::Truncated.into()),
    }
}

impl RecvState {
    /// Gives the descriptors of `packet` to the waiting message it names.
    fn attach(
        &mut self,
        packet: FdPacket,
        fds: Vec<OwnedFd>,
        truncated: bool,
    ) -> Result<(), RecvError> {
        let Some(i) = self.waiting.iter().position(|m| m.header.tag == packet.tag) else {
            if let Some(i) = self.refused.iter().position(|&t| t == packet.tag) {
                self.refused.remove(i);
                // A refused region message's region (its carrier, last) goes
                // back to its sender, which counts it in flight until then.
                if let Some(carrier) = fds.last() {
                    shm::release_refused(carrier.as_fd());
                }
                return Ok(()); // dropping `fds` closes them
            }
            return Err(match truncated {
                true => WireError::ControlTruncated,
                false => WireError::BadHeader("descriptor packet for no message"),
            }
            .into());
        };
        let Waiting { header, data, .. } = self.waiting.swap_remove(i);
        if truncated {
            return Err(WireError::ControlTruncated.into());
        }
        if fds.len() != header.nfds {
            return Err(WireError::UnexpectedFds {
                announced: header.nfds,
                received: fds.len(),
            }
            .into());
        }
        if packet.count != header.nfds {
            return Err(WireError::BadHeader(
                "a descriptor packet's count contradicts its message's header",
            )
            .into());
        }
        self.ready.push_back(Ready {
            header,
            data,
            fds,
            resume: None,
        });
        Ok(())
    }

    /// Remembers a refused message so that its descriptors are dropped.
    fn refuse(&mut self, header: Header) {
        if header.nfds > 0 {
            if self.refused.len() == MAX_REFUSED {
                self.refused.pop_front();
            }
            self.refused.push_back(header.tag);
        }
    }

    /// Puts a message whose payload is still arriving back at the head of
    /// the ready queue, with what came so far, for the next receive to go on
    /// with; the receive that put it back is `Empty`.
    #[cold]
    fn put_back(
        &mut self,
        header: Header,
        dst: &mut Vec<u8>,
        fds: Vec<OwnedFd>,
        resume: Resume,
    ) -> RecvError {
        self.ready.push_front(Ready {
            header,
            data: std::mem::take(dst),
            fds,
            resume: Some(resume),
        });
        RecvError::Empty
    }

    /// Gives up the oldest waiting message.
    fn give_up_oldest(&mut self) -> WireError {
        if let Some(i) = (0..self.waiting.len()).min_by_key(|&i| self.waiting[i].since) {
            let m = self.waiting.swap_remove(i);
            self.refuse(m.header);
        }
        WireError::DescriptorsMissing
    }

    /// When the oldest message waiting for its descriptors is given up, if
    /// any waits.
    fn next_expiry(&self) -> Option<Instant> {
        self.waiting.iter().map(|m| m.since + DESCRIPTOR_WAIT).min()
    }

    /// Gives up one message that waited too long, if any.
    fn expire(&mut self) -> Option<WireError> {
        let i = self
            .waiting
            .iter()
            .position(|m| m.since.elapsed() >= DESCRIPTOR_WAIT)?;
        let m = self.waiting.swap_remove(i);
        self.refuse(m.header);
        Some(WireError::DescriptorsMissing)
    }
}

/// Receives the rest of a fragmented message from its dedicated socket,
/// straight into `dst`'s spare capacity, until `dst.len() == total`; `false`
/// if `pause` came first (then `dst` holds what came, to go on with).
///
/// The whole rest must arrive by `deadline` (what is left of the fragment
/// timeout), as this receiver measures it (`poll` with a deadline,
/// `MSG_DONTWAIT` reads): a socket option such as `SO_RCVTIMEO` would not
/// do, since the sender holds the same socket and could clear it.
fn recv_fragments(
    carrier: &OwnedFd,
    dst: &mut Vec<u8>,
    total: usize,
    deadline: Instant,
    pause: Option<Instant>,
) -> Result<bool, RecvError> {
    let more = total - dst.len();
    dst.try_reserve_exact(more)
        .map_err(|_| WireError::OutOfMemory {
            requested: more as u64,
        })?;
    let until = pause.map_or(deadline, |p| p.min(deadline));
    while dst.len() < total {
        let want = total - dst.len();
        let packet = fill_spare(dst, |room| {
            let mut iov = [RawIoVec::EMPTY; 1];
            let n = room.io_vecs(&mut iov);
            let packet = socket::recv(carrier.as_fd(), &mut iov[..n], false, true)?;
            // SAFETY: `recvmsg` wrote `packet.len` bytes at the start of the
            // room (at most its length).
            unsafe { room.advance(packet.len.min(room.remaining())) };
            Ok::<_, Errno>(packet)
        });
        let packet = match packet {
            Ok(packet) => packet,
            Err(Errno::AGAIN) => {
                match wait_readable(carrier.as_fd(), until) {
                    Err(RecvError::Empty) if until < deadline => return Ok(false),
                    Err(RecvError::Empty) => return Err(WireError::FragmentTimeout.into()),
                    other => other?,
                }
                continue;
            }
            // The carrier failed (a peer may pass any socket as one, even one that resets):
            // the message cannot be completed, but the channel itself is not disconnected.
            Err(_) => return Err(WireError::Truncated.into()),
        };
        if packet.len == 0 || packet.truncated || packet.len > want {
            // The stream ended early, or overran the total.
            return Err(WireError::Truncated.into());
        }
        // Checked on every packet, not only when the carrier runs dry: a
        // peer that keeps it full of one-byte packets must not stretch the
        // message past the timeout, nor a receive past its pause (a clock
        // read against a `recvmsg`).
        if dst.len() < total {
            let now = Instant::now();
            if now >= deadline {
                return Err(WireError::FragmentTimeout.into());
            }
            if pause.is_some_and(|pause| now >= pause) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Waits until `fd` is readable (or hung up), or `deadline` passes. A fiber
/// parks on its worker's reactor; a thread waits in `poll(2)`.
fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> Result<(), RecvError> {
    if crate::fiber::in_fiber() {
        return match crate::fiber::wait_fd(fd, Interest::Read, Some(deadline)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(RecvError::Empty),
            Err(e) => Err(RecvError::Io(e)),
        };
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
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
        let listener = Self::listen(&path).inspect_err(|_| {
            // `bind` may have made the socket file before `listen` failed.
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_dir(&dir);
        })?;
        // From here on, dropping the server removes the file and directory.
        let server = OsOneShotServer {
            listener,
            dir,
            path,
        };
        let name = server
            .path
            .to_str()
            .map(str::to_owned)
            .ok_or(std::io::ErrorKind::InvalidFilename)?;
        Ok((server, name))
    }

    fn listen(path: &std::path::Path) -> std::io::Result<OwnedFd> {
        let fd = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        net::listen(&fd, 1)?;
        Ok(fd)
    }

    /// Accepts the client's connection, waiting at most `timeout`, and
    /// returns the connection as a receiver.
    pub(crate) fn accept(&self, timeout: Option<Duration>) -> Result<OsReceiver, RecvError> {
        if let Some(timeout) = timeout {
            wait_readable(self.listener.as_fd(), after(timeout))?;
        } else if crate::fiber::in_fiber() {
            // A fiber waits on its reactor, not in `accept`.
            while let Err(RecvError::Empty) =
                wait_readable(self.listener.as_fd(), after(Duration::from_secs(3600)))
            {}
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
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    net::connect(&fd, &SocketAddrUnix::new(name)?)?;
    Ok(OsSender::from_fd(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scratch area starts at a page boundary and holds a whole packet,
    /// on every use (see `with_scratch`).
    #[test]
    fn the_scratch_area_is_page_aligned() {
        for _ in 0..3 {
            with_scratch(|scratch| {
                assert_eq!(scratch.as_ptr().addr() % 4096, 0);
                assert_eq!(scratch.len(), socket::max_packet());
            });
        }
    }

    /// Without the refill, a forked child's next tag would equal its
    /// parent's next tag (both take the next one of the same pool).
    #[test]
    fn a_forked_child_draws_other_tags_than_its_parent() {
        let _ = random_tag();
        let (read, write) = rustix::pipe::pipe().unwrap();
        // SAFETY: the child only draws a tag (a thread-local, an atomic
        // load, `getrandom`) and writes it to a pipe before `_exit`; it
        // takes no lock another thread could have held at the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let tag = random_tag().to_le_bytes();
            let _ = rustix::io::write(&write, &tag);
            // SAFETY: ends the child without running the parent's exit hooks.
            unsafe { libc::_exit(0) };
        }
        drop(write);
        let mut child = [0u8; 8];
        let mut got = 0;
        while got < child.len() {
            let n = rustix::io::read(&read, &mut child[got..]).unwrap();
            assert_ne!(n, 0, "the child wrote no tag");
            got += n;
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_ne!(u64::from_le_bytes(child), random_tag());
    }

    #[test]
    fn tags_do_not_repeat_within_a_thread() {
        let tags: std::collections::HashSet<u64> = (0..10_000).map(|_| random_tag()).collect();
        assert_eq!(tags.len(), 10_000);
    }

    /// A receiver moved while a message waits for its descriptor packet:
    /// the new owner completes and delivers it, in order with the rest.
    #[test]
    fn a_moved_receiver_keeps_a_message_waiting_for_its_descriptors() {
        let (tx, rx) = crate::ipc::bytes_channel().unwrap();
        // A message announcing one descriptor, whose descriptor packet is
        // held back (as if its sender were slow), then a plain one.
        let tag = 0x5eed_u64;
        let header = Header::new(Body::Inline, 5, 1, tag).encode();
        let parts = [IoSlice::new(&header), IoSlice::new(b"first")];
        socket::send(tx.os.fd(), &parts, &[]).unwrap();
        tx.send(b"second").unwrap();
        assert_eq!(rx.recv().unwrap(), b"second");
        assert_eq!(rx.os.state.borrow().waiting.len(), 1);

        // With a large byte string, so that the message is walked twice
        // (the backlog is taken on the first walk only).
        type Move = (crate::ipc::IpcBytesReceiver, serde_bytes::ByteBuf);
        let (move_tx, move_rx) = crate::ipc::channel::<Move>().unwrap();
        move_tx.send((rx, vec![7; 8192].into())).unwrap();
        let (moved, bytes) = move_rx.recv().unwrap();
        assert_eq!(bytes.into_vec(), vec![7; 8192]);

        let (spare, _spare_rx) = crate::ipc::bytes_channel().unwrap();
        let packet = FdPacket { count: 1, tag }.encode();
        socket::send(tx.os.fd(), &[IoSlice::new(&packet)], &[spare.os.fd()]).unwrap();
        tx.send(b"third").unwrap();
        assert_eq!(moved.recv().unwrap(), b"first");
        assert_eq!(moved.recv().unwrap(), b"third");
    }

    /// A backlog is checked like packets from the socket.
    #[test]
    fn a_forged_backlog_is_refused() {
        let (_, rx) = channel().unwrap();
        let forged = Backlog {
            waiting: vec![Parked {
                header: Header::new(Body::Inline, 3, 0, 7).encode().to_vec(),
                data: b"abc".to_vec(),
                fds: Vec::new(),
            }],
            ..Backlog::default()
        };
        assert!(OsReceiver::with_backlog(rx.fd, forged, &mut u64::MAX.clone()).is_err());
        let (_, rx) = channel().unwrap();
        let lying = Backlog {
            ready: vec![Parked {
                header: Header::new(Body::Inline, 9, 1, 7).encode().to_vec(),
                data: b"abc".to_vec(),
                fds: Vec::new(),
            }],
            ..Backlog::default()
        };
        assert!(OsReceiver::with_backlog(rx.fd, lying, &mut u64::MAX.clone()).is_err());
    }
}
