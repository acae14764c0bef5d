//! The transport contract between the portable `ipc` layer and an OS.
//!
//! Everything above this module (the wire format, the routes a message
//! takes, fragmentation, the region protocol, serialization) is written once
//! against the traits below; a platform implements them with its system
//! calls and nothing else. The Linux implementation is [`linux`]; an
//! in-process twin (`twin`, memory only, for tests) implements the same
//! traits, and one conformance suite (`conformance`) runs against both, as
//! ipc-channel's `src/platform/test.rs` runs against each of its platforms.
//!
//! # Required types and functions
//!
//! * [`Transport`]: reliable, ordered, connected **packets** between the two
//!   ends of a pair, each packet delivered whole or not at all (never
//!   interleaved with another sender's), able to carry descriptors, with
//!   peer hang-up observable (a read of zero bytes once the queue is
//!   drained; [`Transport::hung_up`]) and a send to a closed peer an error
//!   (`EPIPE`/`ECONNRESET`), never a signal. Receives never zero-fill: they
//!   write into spare capacity ([`RawIoVec`], `MaybeUninit`).
//! * [`Memory`]: sealed **regions** of shared memory that travel as
//!   descriptors, their shared mappings ([`RegionMap`]), and a futex on a
//!   word of a mapping.
//! * [`Process`]: the kernel's random generator, a hook run in the child of
//!   a `fork`, and a one-shot **listener** a client connects to by name.
//! * [`Poller`]: `new()`, `add(fd, key)`, `remove(fd)`, `wait(deadline,
//!   keys)`: waiting for any of many receivers (an `IpcReceiverSet`).
//!
//! Errors are rustix's [`Errno`] (a `Copy` `u16`), converted to
//! `io::Error` only at the public boundary. Descriptors are owned values
//! ([`Transport::Fd`]): a received one is owned before anything can fail,
//! so `?` never leaks one.
//!
//! Nothing here names the serialization layer (`handles`, `split`,
//! `bytes_seq`) or the wire format: a platform moves bytes and descriptors,
//! and `ipc::transport` decides what they mean.

use std::fmt;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::buf::RawIoVec;

#[cfg(test)]
mod conformance;
#[cfg(target_os = "linux")]
pub(crate) mod linux;
#[cfg(test)]
pub(crate) mod twin;

#[cfg(target_os = "linux")]
pub(crate) use linux::{epoll::Poller, memfd::Mapping, Linux as Os};

/// The platform's owned descriptor ([`Transport::Fd`]): what the portable
/// layers hold, receive and pass on.
pub(crate) type OwnedFd = <Os as Transport>::Fd;
/// The platform's borrowed descriptor ([`Transport::BorrowedFd`]).
pub(crate) type BorrowedFd<'a> = <Os as Transport>::BorrowedFd<'a>;

#[cfg(not(target_os = "linux"))]
compile_error!(
    "courier::ipc has no transport for this target: implement the traits of \
     `ipc::platform` (Transport, Memory, Process) and a `Poller` for it, \
     beside `ipc/platform/linux/`"
);

/// The most descriptors one packet carries: Linux's `SCM_MAX_FD` (the kernel
/// refuses more in one `SCM_RIGHTS` message with `EINVAL`; a test in
/// `linux::socket` checks it on the running kernel). The receiver's control
/// buffer is sized for that many; a message of more sends them in several
/// packets (see the wire format).
pub(crate) const FDS_PER_PACKET: usize = 253;

/// The longest header [`Transport::try_send_small`] puts before a small payload.
pub(crate) const SMALL_HEAD: usize = 64;

/// What one receive of a packet delivered.
pub(crate) struct Packet<Fd> {
    /// Bytes written into the buffers, in order.
    pub len: usize,
    /// Descriptors that came with the packet, already owned: dropping the
    /// packet closes them.
    pub fds: Vec<Fd>,
    /// The packet was longer than the buffers (`MSG_TRUNC`); the rest is lost.
    pub truncated: bool,
    /// Descriptors were dropped for lack of room (`MSG_CTRUNC`).
    pub control_truncated: bool,
}

/// Connected packet endpoints that carry bytes and descriptors.
///
/// Implementors promise, for the two ends of one [`pair`](Self::pair):
/// * packets arrive in the order sent, each whole, with its descriptors;
/// * a receive with `dontwait` (or a peek) on an empty queue is
///   `Err(EAGAIN)`; without it, it waits for a packet or for the peer to go;
/// * once the peer is closed (every duplicate of its descriptor) and the
///   queue is drained, a receive returns a packet of length 0, and
///   [`hung_up`](Self::hung_up) is `true`; a send to it fails with `EPIPE`
///   or `ECONNRESET`;
/// * a send without waiting ([`try_send`](Self::try_send)) is `EAGAIN`
///   when the queue has no room, and then sends nothing;
/// * a packet longer than the buffers is cut (`truncated`, the rest lost),
///   and [`recv_whole`](Self::recv_whole) returns its whole length;
/// * a packet carries up to [`FDS_PER_PACKET`] descriptors, received whole
///   by one read with `control`; more is refused (`ETOOMANYREFS`) and
///   nothing is sent;
/// * descriptors of a packet read without `control` are closed, never
///   leaked; a packet longer than [`max_packet`](Self::max_packet) is
///   refused (`EMSGSIZE`, or `ENOBUFS` when memory is short) and nothing
///   is sent.
pub(crate) trait Transport {
    /// An owned descriptor (a channel end, a region): closed on drop.
    type Fd: fmt::Debug + Send + Sync;
    /// A borrowed descriptor.
    type BorrowedFd<'a>: Copy;

    /// Messages up to this size are sent through one stack buffer by
    /// [`try_send_small`](Self::try_send_small) and read whole by
    /// [`recv_whole`](Self::recv_whole), where the plain calls cost less
    /// than the gathering ones.
    const SMALL_MAX: usize;

    /// Borrows `fd`.
    fn borrow(fd: &Self::Fd) -> Self::BorrowedFd<'_>;
    /// Takes back an emptied vector that held received descriptors, for a
    /// later [`recv`](Self::recv) on this thread to fill: a message of
    /// descriptors then costs no allocation for them. The default lets it
    /// go.
    fn recycle_fds(fds: Vec<Self::Fd>) {
        drop(fds);
    }
    /// Two connected ends.
    fn pair() -> Result<(Self::Fd, Self::Fd), Errno>;
    /// The longest packet this process's ends take (probed once).
    fn max_packet() -> usize;
    /// Sends one packet gathered from `iov`, with `fds` attached (no
    /// control message when there are none); the bytes sent. Waits while
    /// the peer's queue has no room (a fiber parks on its worker's
    /// reactor).
    fn send(
        fd: Self::BorrowedFd<'_>,
        iov: &[IoSlice<'_>],
        fds: &[Self::BorrowedFd<'_>],
    ) -> Result<usize, Errno>;
    /// As [`send`](Self::send), without waiting: `EAGAIN`, with nothing
    /// sent, when the queue has no room for the packet now.
    fn try_send(
        fd: Self::BorrowedFd<'_>,
        iov: &[IoSlice<'_>],
        fds: &[Self::BorrowedFd<'_>],
    ) -> Result<usize, Errno>;
    /// Sends `header ++ parts` (`total` bytes of parts, at most
    /// [`SMALL_MAX`](Self::SMALL_MAX); a header of at most [`SMALL_HEAD`])
    /// as one packet without descriptors, through one stack buffer, without
    /// waiting: `EAGAIN`, with nothing sent, when the queue has no room.
    fn try_send_small<const H: usize>(
        fd: Self::BorrowedFd<'_>,
        header: &[u8; H],
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Errno>;
    /// Waits until `fd` has room for a packet (or is hung up), or
    /// `deadline` passes (`false`; `None`: no deadline). A fiber waits on
    /// its worker's reactor.
    fn wait_writable(fd: Self::BorrowedFd<'_>, deadline: Option<Instant>) -> io::Result<bool>;
    /// The bytes sent from `fd` and not yet received, as the platform
    /// counts them against its send buffer, and that buffer's size: a
    /// packet is taken while the first is below the second.
    fn send_queue(fd: Self::BorrowedFd<'_>) -> Result<(usize, usize), Errno>;
    /// Receives one packet scattered over `iov`, with its descriptors if
    /// `control` (else they are closed), without waiting if `dontwait`.
    fn recv(
        fd: Self::BorrowedFd<'_>,
        iov: &mut [RawIoVec<'_>],
        control: bool,
        dontwait: bool,
    ) -> Result<Packet<Self::Fd>, Errno>;
    /// Receives one packet into `buf`, closing its descriptors; returns its
    /// whole length, more than `buf.len()` if it did not fit.
    fn recv_whole(
        fd: Self::BorrowedFd<'_>,
        buf: &mut [MaybeUninit<u8>],
        dontwait: bool,
    ) -> Result<usize, Errno>;
    /// Copies the start of the next packet into `buf`, leaving it queued,
    /// without waiting; the bytes copied.
    fn peek<'b>(
        fd: Self::BorrowedFd<'_>,
        buf: &'b mut [MaybeUninit<u8>],
    ) -> Result<&'b [u8], Errno>;
    /// Waits until `fd` is readable or hung up (`true`), or `deadline`
    /// passes (`false`). A fiber waits on its worker's reactor.
    fn wait_readable(fd: Self::BorrowedFd<'_>, deadline: Instant) -> io::Result<bool>;
    /// Whether the peer is gone (closed). Never waits.
    fn hung_up(fd: Self::BorrowedFd<'_>) -> bool;
    /// Whether the peer has stopped writing, or the question failed. Never
    /// waits.
    fn read_hung_up(fd: Self::BorrowedFd<'_>) -> bool;
    /// The bytes of every packet queued at `fd`.
    fn queued(fd: Self::BorrowedFd<'_>) -> Result<usize, Errno>;
    /// Checks that `fd` can be a channel end (a connected endpoint of this
    /// transport); the error says what it is instead.
    fn check_channel_end(fd: Self::BorrowedFd<'_>) -> Result<(), &'static str>;
    /// Which endpoint `fd` is: the same for every duplicate of it.
    fn identity(fd: Self::BorrowedFd<'_>) -> Option<(u64, u64)>;
    /// A duplicate of `fd` (close-on-exec): one more descriptor of the
    /// same endpoint or region.
    fn duplicate(fd: Self::BorrowedFd<'_>) -> Result<Self::Fd, Errno>;
}

/// A shared mapping of a region, unmapped on drop.
pub(crate) trait RegionMap: Send {
    /// The first byte (page-aligned, never null).
    fn as_ptr(&self) -> *mut u8;
    /// The first byte, as a `NonNull`.
    fn non_null(&self) -> NonNull<u8>;
    /// The mapped length in bytes.
    fn len(&self) -> usize;
    /// Frees the pages of the whole mapping (they read back as zeros).
    fn punch(&self);
}

/// Sealed shared-memory regions that travel as descriptors.
///
/// Implementors promise: every mapping of one region shows the same bytes;
/// a sealed region's size never changes again, so a mapping within it
/// stays valid; [`futex_wait`](Self::futex_wait) returns when woken, when
/// the word no longer holds `expected`, at the timeout, or spuriously (its
/// caller always looks again).
pub(crate) trait Memory: Transport {
    /// A mapping.
    type Mapping: RegionMap;

    /// A new, unsealed region of `len` bytes reading as zeros.
    fn create_region(name: &str, len: usize) -> Result<Self::Fd, Errno>;
    /// Seals the region's size for good.
    fn seal(fd: Self::BorrowedFd<'_>) -> Result<(), Errno>;
    /// Whether the region's size is sealed; an error for anything that is
    /// not a region.
    fn sealed(fd: Self::BorrowedFd<'_>) -> Result<bool, Errno>;
    /// The region's size, and which region it is (the same for every
    /// descriptor of it).
    fn stat(fd: Self::BorrowedFd<'_>) -> Result<(u64, (u64, u64)), Errno>;
    /// Whether the region is of a kind whose sealed size does not protect a
    /// mapping (hugetlbfs on Linux).
    fn on_hugetlbfs(fd: Self::BorrowedFd<'_>) -> Result<bool, Errno>;
    /// Allocates the pages of the first `len` bytes now (a shortage is an
    /// error here, not a fault at the first write).
    fn allocate(fd: Self::BorrowedFd<'_>, len: usize) -> Result<(), Errno>;
    /// Appends `bytes` at the descriptor's offset, growing the region.
    fn write_all(fd: Self::BorrowedFd<'_>, bytes: &[u8]) -> Result<(), Errno>;
    /// Whether `a` and `b` are one open region (`false` if unknown).
    fn same_file(a: Self::BorrowedFd<'_>, b: Self::BorrowedFd<'_>) -> bool;
    /// Maps the first `len` bytes of the region, readable and writable.
    fn map(fd: Self::BorrowedFd<'_>, len: usize) -> Result<Self::Mapping, Errno>;
    /// Waits while `word` (in a mapping) holds `expected`, at most `timeout`.
    fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration);
    /// Wakes up to `n` waiters on `word`.
    fn futex_wake(word: &AtomicU32, n: u32);
    /// Whether this thread may run on more than one CPU.
    fn smp() -> bool;
    /// The CPU this thread runs on now, if the platform says (a hint: it
    /// may have moved by the time the caller looks).
    fn current_cpu() -> Option<u32>;
}

/// What a process needs of its OS besides channels and regions.
pub(crate) trait Process: Transport {
    /// A listening endpoint a client connects to by name.
    type Listener: fmt::Debug + Send + Sync;

    /// Fills `out` from the kernel's random generator.
    fn fill_random(out: &mut [u8]) -> Result<(), Errno>;
    /// Runs `hook` in the child of every later `fork` (`false` if it could
    /// not be registered). `hook` must be async-signal-safe.
    fn on_fork_in_child(hook: extern "C" fn()) -> bool;
    /// A new listener and its name.
    fn listen() -> io::Result<(Self::Listener, String)>;
    /// Accepts one client, waiting until `deadline` at most (`None`: no
    /// limit); `Ok(None)` if the deadline came first.
    fn accept(listener: &Self::Listener, deadline: Option<Instant>)
        -> io::Result<Option<Self::Fd>>;
    /// Connects to the listener named `name`.
    fn connect(name: &str) -> io::Result<Self::Fd>;
}
