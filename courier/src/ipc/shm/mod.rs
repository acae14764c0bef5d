//! Sealed memfd regions that carry large payloads.
//!
//! A payload too large for one packet does not travel through the socket
//! (unless [`crate::ipc::LargeMessages::Fragments`] is chosen): the sender copies it into a memfd region and passes
//! the descriptor; the receiver copies it out. That is the same two copies
//! as the socket path, without tens of fragment syscalls, and with no second
//! thread needed for a send that is larger than the socket buffer.
//!
//! Page faults, not copies, dominate large transfers into fresh memory (8 MiB
//! costs ~0.3 ms into mapped memory and ~4.8 ms into fresh memory on this
//! machine), so regions are **reused on both sides**:
//!
//! * the sender keeps a small pool of regions ([`Pool`]); a region is free
//!   again once the receiver has copied the payload out and cleared the
//!   region's busy bit;
//! * the receiver keeps the mappings of the last few regions it saw
//!   ([`MapCache`]), so a reused region is neither mapped nor faulted in
//!   again, and says so in the region (the held state and the mapped
//!   length).
//!
//! # Kept regions: payloads without a descriptor
//! Passing the region's descriptor costs a second packet with `SCM_RIGHTS`,
//! an `fstat` and a `close`: ~2.5 µs here, more than the kernel's copy of a
//! 64 KiB packet. So once a receiver holds a region, the sender names it
//! instead: a data packet of [`Body::Kept`](crate::ipc::wire::Body::Kept)
//! whose tag is the region's **token**, the random tag of the message that
//! last carried its descriptor. Only the receiver (and the sending process)
//! saw that tag, so no other sender to the same receiver can name a region
//! that is not its own; a forked child forgets the regions of its parent's
//! pools rather than share their tokens (`Pool::lock`). A
//! message then costs one header-sized packet and two `memcpy`s, no kernel
//! copy of the payload at all, and that beats the socket from 8 KiB up
//! (`courier-bench --example framing`, the `kept` column).
//!
//! ```text
//!  region (memfd, sealed: F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
//!  +------------+---+-------------+-------------+----------+---+------+------------------+
//!  | state: u32 |   | mapped: u64 | filled: u64 | seq: u32 |   | skew | payload (`total`) |
//!  +------------+---+-------------+-------------+----------+---+------+------------------+
//!  0                8             16            24             REGION_HEADER (64)
//!
//!  state: BUSY (bit 0) a payload is in flight (set by the sender)
//!         HELD (bit 1) the receiver maps `mapped` bytes of the region and
//!                      knows its token (set and cleared by the receiver)
//! ```
//!
//! `filled` and `seq` serve streamed messages (below).
//!
//! # Streaming: large payloads are read while they are written
//! A payload of [`STREAM_MIN`] bytes or more is announced first and written
//! after, [`STREAM_CHUNK`] bytes at a time: after each chunk the sender
//! stores how far the payload is `filled` and bumps `seq`, a futex word it
//! wakes. The receiver copies out whatever is filled, spins a little for
//! more if another CPU may be filling it, then sleeps on `seq`. On two
//! CPUs the two copies overlap: 8 MiB round trips took 3.6-4.1 ms here
//! instead of 5.5-5.8. (On one CPU nothing overlaps; a sender that yielded
//! after each chunk, so that it would be copied out of the cache, measured
//! no gain and does not.) A sender that stops before the end leaves the
//! receiver waiting at most the fragment timeout
//! ([`Config::fragment_timeout`](crate::ipc::Config); then the message is
//! [`WireError::FragmentTimeout`]), or until every sender is gone (then it
//! is [`WireError::Truncated`]). The sender learns of neither: its `send`
//! returned once the payload was written. Without a
//! receiver waiting (one thread sending, then receiving) the payload is
//! whole by the time it is read, and streaming costs a `futex` wake a chunk.
//!
//! The sender sends a kept message only after turning `HELD` into
//! `HELD | BUSY` with a compare-and-swap, and the receiver lets go of a held
//! region (unmaps it) only after turning `HELD` into free the same way, so a
//! region named by a message in flight is never unmapped before the message
//! is read. A region passed by descriptor is `BUSY` without `HELD`: its
//! message brings the descriptor, so the receiver may unmap it meanwhile,
//! and a message of that kind that is never read pins nothing in the
//! receiver; a refused one's region goes back to its sender
//! ([`release_refused`]), while one given up (its descriptor never came)
//! stays counted in flight by its sender, memory and all, until the channel
//! fails (see `Sent`). A receiver that moves to another process takes the regions it
//! cannot let go of along, descriptors and all (`take_kept`). Held regions
//! and regions made for medium messages each keep a descriptor open, so a
//! process keeps at most [`MAX_KEPT_FDS`] of each; past that it falls back
//! to the socket (medium messages) or to passing the descriptor each time.
//!
//! # Trust
//! The receiver never trusts the sender's region: it checks the seals (so the
//! region cannot shrink under the mapping, which would raise `SIGBUS`) and the
//! size against the header's `skew + total` before mapping, and a kept
//! message's `skew + total` against the length it mapped itself, never the
//! `mapped` word. The `filled` word of a streamed message only decides which
//! of the sender's own bytes are copied when, and a stream that stops, or
//! creeps, fails at the fragment timeout, counted from the first receive
//! that reads it: a streaming sender can hold a blocking receive that
//! long, as a fragmented one can, and no longer; a receive that may not
//! block pauses the copy after a moment ([`Progress::Paused`]) and the next
//! receive goes on with it. A
//! sender that keeps writing into a region it sent can only corrupt the bytes
//! of its own message, which the receiver copies out once and then validates
//! like any other payload (the copy races with the peer's writes by design,
//! as in any shared-memory transport: it is a plain byte copy out of memory
//! no Rust reference points into). One that sets `HELD | BUSY` and sends
//! nothing can only keep its own regions mapped (a receiver holds at most
//! [`CACHED_MAPPINGS`]; past that, regions are copied out and let go), and
//! a moved receiver leaves behind any region it cannot map again, so only
//! the messages naming it fail.
//!
//! A sender trusts its receiver no more. The receiver can write the regions
//! it was given, but the sender reads back only the state word (atomically)
//! and the `mapped` advice, which picks a route and nothing else. What the
//! state word says decides two things, and neither lets the receiver make
//! the sender hold more memory than [`Config::max_region_bytes_in_flight`]
//! plus its pool ([`POOL_REGIONS`] regions):
//!
//! * whether a region is free to reuse: a receiver that clears `BUSY` early
//!   makes the sender overwrite the bytes it is still copying, which spoils
//!   only its own message;
//! * whether a region the pool let go of is still in flight: once it says
//!   not, the sender frees the region's pages ([`discard`]) before it lets
//!   go, so a receiver that keeps every descriptor and clears `BUSY` at once
//!   keeps holes, not the sender's memory.
//!
//! A receiver that never clears `BUSY` keeps its regions counted in flight,
//! and past the bound its sender's large messages go in fragments, which
//! wait for it to read.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::fs::{self, FallocateFlags, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{self, MapFlags, ProtFlags};
use rustix::thread::futex;

use crate::ipc::config::Config;
use crate::ipc::err::WireError;
use crate::ipc::wire::SKEW_ALIGN;

use crate::ipc::transport::Split;

/// Bytes before the payload: the state word, the mapped length and the
/// stream's two words, padded to a cache line.
pub(crate) const REGION_HEADER: usize = 64;

/// Payloads at least this large are streamed (see the module docs): past
/// the caches, where copying out while the sender copies in pays.
pub(crate) const STREAM_MIN: usize = 1 << 20;
/// What a streaming sender writes between two wake-ups: small enough to be
/// copied out of the cache, large enough that the wake-ups cost under 1%.
const STREAM_CHUNK: usize = 256 << 10;
/// How often a receiver waiting for a stream checks that a sender is left.
const STREAM_POLL: Duration = Duration::from_millis(50);
/// How long a receiver with another CPU to spare spins for the next chunk
/// before it sleeps: a few chunks' worth of `memcpy`. Waking a sleeping
/// thread on another CPU costs ~30 µs here, more than a chunk takes, so a
/// receiver that slept between chunks would lose what streaming gains.
const STREAM_SPIN: Duration = Duration::from_micros(200);

/// Whether this thread may run on more than one CPU (so a peer can run
/// while it spins). Asked when a stream has to wait, not cached: affinity
/// changes, and the question costs one system call.
fn smp() -> bool {
    rustix::thread::sched_getaffinity(None).is_ok_and(|set| set.count() > 1)
}

/// No payload in flight, and the receiver holds no mapping it may read
/// without being sent the descriptor again.
const FREE: u32 = 0;
/// A payload is in flight.
const BUSY: u32 = 1;
/// The receiver holds a mapping and knows the region's token.
const HELD: u32 = 2;

/// Regions a sender's pool keeps for reuse.
const POOL_REGIONS: usize = 2;
/// Mappings a receiver keeps for reuse.
const CACHED_MAPPINGS: usize = 4;
/// Mappings are made in whole pages.
const PAGE: usize = 4096;
/// Smallest region created, so that a range of sizes shares one region.
const MIN_REGION: usize = 256 * 1024;
/// A receiver maps a region whole if it is at most this large, so later,
/// larger messages fit the mapping it keeps; a larger region is mapped only
/// as far as the message needs (a sealed sparse file of terabytes would map
/// fine and eat the address space).
const MAP_WHOLE: usize = 64 << 20;

/// Descriptors a process keeps for regions on each side, beyond what large
/// messages always needed: its senders' regions made for medium messages
/// ([`Take::Kept`]), its receivers' held regions. Each region is a descriptor
/// (a process gets 1,024 by default), and a process with many channels must
/// not run out for them: past this many, medium messages go by socket and a
/// receiver maps a region without holding it (so its descriptor comes with
/// every message, as before kept regions).
const MAX_KEPT_FDS: usize = 64;
/// Bytes of the regions this process's receivers hold, mapped, at most. A
/// held region stays mapped while a kept message may name it, and a sender
/// can pin it so (`HELD | BUSY` with no message): past this, regions are
/// copied out and let go, as past [`MAX_KEPT_FDS`].
const MAX_HELD_BYTES: usize = 1 << 30;
/// Regions this process's senders keep for medium messages.
static SENDER_FDS: AtomicUsize = AtomicUsize::new(0);
/// Regions this process's receivers hold, and their mapped bytes.
static HELD_FDS: AtomicUsize = AtomicUsize::new(0);
static HELD_BYTES: AtomicUsize = AtomicUsize::new(0);

/// One descriptor (and, for a held region, its mapped bytes) counted
/// against the process's budget while this lives.
struct Counted {
    count: &'static AtomicUsize,
    /// Bytes counted in [`HELD_BYTES`].
    bytes: usize,
}

/// Takes `n` of `counter` if that leaves it at most `max`.
fn take_under(counter: &AtomicUsize, n: usize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
            now.checked_add(n).filter(|&after| after <= max)
        })
        .is_ok()
}

impl Counted {
    /// A place for a sender's region under the budget, if there is one left.
    fn sender() -> Option<Counted> {
        // (`then`, not `then_some`: a `Counted` made and dropped unclaimed
        // would give back a place it never took.)
        take_under(&SENDER_FDS, 1, MAX_KEPT_FDS).then(|| Counted {
            count: &SENDER_FDS,
            bytes: 0,
        })
    }

    /// A place for a held region mapping `bytes`, under both budgets.
    fn held(bytes: usize) -> Option<Counted> {
        if !take_under(&HELD_FDS, 1, MAX_KEPT_FDS) {
            return None;
        }
        if !take_under(&HELD_BYTES, bytes, MAX_HELD_BYTES) {
            HELD_FDS.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Counted {
            count: &HELD_FDS,
            bytes,
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
        if self.bytes > 0 {
            HELD_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

/// A shared mapping of a whole memfd, unmapped on drop.
///
/// A message region's mapping (`Region`, `Held`) starts with the region's
/// header, at least `REGION_HEADER` bytes; only those call the header
/// accessors (`state`, `mapped`, `filled`, `seq`, `payload`, `release`). A
/// `SharedRegion`'s mapping is the user's bytes alone, as short as one byte.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is an address range owned by this value alone, and
// moving it moves that ownership; it holds no thread-bound state. How its
// memory may be accessed is its owner's rule, not the thread's: message
// regions use raw copies and atomic header words, `IpcSharedMemory` its own.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`.
    fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, Errno> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint) aliases no
        // Rust object.
        let ptr = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Errno::NOMEM)?;
        Ok(Mapping { ptr, len })
    }

    /// The region's state word.
    fn state(&self) -> &AtomicU32 {
        // SAFETY: a message region's mapping (the only kind this is called on)
        // is page-aligned, at least `REGION_HEADER` bytes, lives as long as
        // `self`; both processes access the word only atomically.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().cast::<u32>()) }
    }

    /// How many bytes of the region the receiver maps (written by it,
    /// advice for the sender only).
    fn mapped(&self) -> &AtomicU64 {
        // SAFETY: as for `state`: bytes 8..16 of the header, aligned for
        // `u64`, only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(8).cast::<u64>()) }
    }

    /// How far a streamed payload is written (bytes from the skew on).
    fn filled(&self) -> &AtomicU64 {
        // SAFETY: as for `state`: bytes 16..24 of the header, aligned for
        // `u64`, only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(16).cast::<u64>()) }
    }

    /// Bumped with every store to `filled`: the futex word a receiver sleeps on.
    fn seq(&self) -> &AtomicU32 {
        // SAFETY: as for `state`: bytes 24..28 of the header, aligned for
        // `u32`, only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(24).cast::<u32>()) }
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: a message region's mapping (the only kind this is called
        // on) is at least a header long, so the offset is inside the mapping
        // or one past its end.
        unsafe { self.ptr.as_ptr().add(REGION_HEADER) }
    }

    /// Lets go of the region unless a kept message may be naming it
    /// (`HELD | BUSY`): a held region becomes `FREE`, so its sender passes
    /// the descriptor again next time; one not held (free, or busy with a
    /// message that brings its own descriptor) is left as it is.
    fn release(&self) -> bool {
        let state = self.state();
        let now = state.load(Ordering::Relaxed);
        if now & HELD == 0 {
            return true;
        }
        now & BUSY == 0
            && state
                .compare_exchange(now, FREE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // reference into the mapping outlives `self`.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A region owned by the sender.
pub(crate) struct Region {
    fd: OwnedFd,
    map: Mapping,
    /// The tag of the message that last carried the descriptor: the name
    /// the receiver knows the region by while it holds it.
    token: u64,
    /// Its place under [`MAX_KEPT_FDS`], for a region made for medium messages.
    _counted: Option<Counted>,
    /// Bytes of the file, from its start, whose pages are allocated.
    backed: usize,
    /// How far into the payload area the message in it reaches, since the
    /// pool handed it out: the bytes counted in flight
    /// ([`Config::max_region_bytes_in_flight`]).
    extent: usize,
}

/// How a filled region reaches the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The receiver holds the region: name it by its token.
    Kept(u64),
    /// Send the descriptor (and make the message's tag the new token).
    Descriptor,
}

impl Region {
    /// A sealed region with room for at least `payload` bytes.
    fn create(payload: usize) -> Result<Region, Errno> {
        let len = (payload + REGION_HEADER)
            .max(MIN_REGION)
            .next_power_of_two();
        let fd = fs::memfd_create(
            "courier-payload",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        fs::ftruncate(&fd, len as u64)?;
        let backed = REGION_HEADER + payload;
        fallocate(&fd, backed)?;
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::map(fd.as_fd(), len)?;
        // Claimed from the start (sent by descriptor).
        map.state().store(BUSY, Ordering::Relaxed);
        Ok(Region {
            fd,
            map,
            token: 0,
            _counted: None,
            backed,
            extent: payload,
        })
    }

    /// Allocates the file's pages up to `len` bytes, if a payload will reach
    /// further than any before (once per region and size, a comparison
    /// after that).
    fn back(&mut self, len: usize) -> Result<(), Errno> {
        if len > self.backed {
            fallocate(&self.fd, len)?;
            self.backed = len;
        }
        Ok(())
    }

    /// Gives up a claim made for a payload that cannot be written after all,
    /// or whose message could not be sent.
    pub(crate) fn abandon(&self, route: Route) {
        match route {
            Route::Kept(_) => self.unclaim(),
            // Maybe held before: `FREE` makes the next message send the
            // descriptor again, which is always right.
            Route::Descriptor => self.map.state().store(FREE, Ordering::Release),
        }
    }

    fn capacity(&self) -> usize {
        self.map.len - REGION_HEADER
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Records the tag of the message that carries the descriptor.
    pub(crate) fn set_token(&mut self, token: u64) {
        self.token = token;
    }

    /// Claims the region for a payload that reaches `extent` bytes into the
    /// payload area (its skew included): by its token if the receiver holds
    /// a mapping that covers it, else (if `take` allows) by descriptor, if
    /// no payload is in flight.
    fn claim(&self, extent: usize, take: Take) -> Option<Route> {
        if self.capacity() < extent {
            return None;
        }
        let state = self.map.state();
        // SYNC POINT: receiver's `Release` store in `MapCache::copy_from_last`
        // (or of `FREE`); after it, the receiver no longer reads the payload
        // we overwrite.
        let now = state.load(Ordering::Acquire);
        let covered = self.map.mapped().load(Ordering::Relaxed) >= (REGION_HEADER + extent) as u64;
        if now == HELD
            && covered
            && state
                .compare_exchange(HELD, HELD | BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Some(Route::Kept(self.token));
        }
        if take == Take::Kept {
            return None;
        }
        // The receiver may let go meanwhile (`HELD` -> `FREE`): read again.
        let now = state.load(Ordering::Acquire);
        let claimed = now & BUSY == 0
            && state
                .compare_exchange(now, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        claimed.then_some(Route::Descriptor)
    }

    /// Claimed as held, but sent by descriptor after all (the message carries
    /// channels): no kept message names it, so the receiver may let go of it
    /// even if this message is never read (refused, or given up).
    pub(crate) fn unhold(&self) {
        let _ = (self.map.state()).compare_exchange(
            HELD | BUSY,
            BUSY,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A kept message naming the region could not be sent: no payload is in
    /// flight after all.
    pub(crate) fn unclaim(&self) {
        let _ = self.map.state().compare_exchange(
            HELD | BUSY,
            HELD,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Copies `parts` (`total` bytes in all) into the payload area, `skew`
    /// bytes into it; if `streamed`, publishing how far every
    /// [`STREAM_CHUNK`] bytes (the receiver may be reading already).
    pub(crate) fn fill(
        &mut self,
        parts: &[IoSlice<'_>],
        skew: usize,
        total: usize,
        streamed: bool,
    ) {
        assert!(
            skew + total <= self.capacity(),
            "region too small for its payload"
        );
        let chunk = if streamed { STREAM_CHUNK } else { usize::MAX };
        let mut done = 0;
        for part in parts {
            let mut part = &part[..];
            assert!(done + part.len() <= total, "parts longer than their total");
            while !part.is_empty() {
                let n = part.len().min(chunk - done % chunk);
                // SAFETY: `skew + done + n <= skew + total <= capacity` (asserted):
                // the destination lies in the mapping's payload area; the source
                // is a live slice, which cannot overlap our mapping.
                unsafe {
                    let dst = self.map.payload().add(skew + done);
                    std::ptr::copy_nonoverlapping(part.as_ptr(), dst, n)
                };
                done += n;
                part = &part[n..];
                if streamed && done % chunk == 0 {
                    self.publish(done);
                }
            }
        }
        if streamed && done % chunk != 0 {
            self.publish(done);
        }
    }

    /// Readies the region for a streamed payload: nothing filled yet. Called
    /// before the message is sent: the `send` that announces it orders this
    /// store before the receiver's first look (the kernel's socket lock).
    pub(crate) fn open_stream(&self) {
        self.map.filled().store(0, Ordering::Release);
    }

    /// Tells the receiver that `filled` payload bytes are written.
    fn publish(&self, filled: usize) {
        // SYNC POINT: the receiver's `Acquire` in `Mapping::wait_filled`.
        self.map.filled().store(filled as u64, Ordering::Release);
        self.map.seq().fetch_add(1, Ordering::Release);
        let _ = futex::wake(self.map.seq(), futex::Flags::empty(), 1);
    }
}

/// A sender's pool of regions (one per destination: see `OsSender`).
#[derive(Default)]
pub(crate) struct Pool {
    regions: Mutex<Regions>,
    /// [`Take::Kept`] requests met by an empty pool: the first
    /// [`FIRST_REGION_AFTER`] go by socket, so that a channel carrying one
    /// or two messages (a reply channel) never pays for a region.
    kept_asks: AtomicU32,
}

/// A pool's regions, and the fork count they were made under: a forked
/// child forgets its parent's regions (both would claim them, and their
/// tokens would part ways as soon as one of them passed a descriptor again).
#[derive(Default)]
struct Regions {
    list: Vec<Region>,
    /// Regions the pool let go of while their message was in flight,
    /// watched until the receiver is done with them.
    sent: Vec<Sent>,
    forks: u64,
}

/// A region let go of by its pool (the pool keeps [`POOL_REGIONS`]) while
/// its message may be unread: its mapping, which keeps the memory alive and
/// shows the state word, and the message's extent. It is counted in flight
/// until the receiver has copied the message out or refused it (its `BUSY`
/// bit clear), or the channel fails ([`Pool::forget_sent`]); a message the
/// receiver gives up without its descriptor keeps it until then, counted,
/// which the bound limits. Then its pages are freed ([`discard`]).
struct Sent {
    map: Mapping,
    extent: usize,
}

/// Whether the message in a region is still to be copied out. A relaxed
/// load: nothing is read through the region on its account.
fn busy(map: &Mapping) -> bool {
    map.state().load(Ordering::Relaxed) & BUSY != 0
}

/// Frees the pages of a region the sender lets go of, then unmaps it:
/// `madvise(MADV_REMOVE)`, a hole punched in the whole file.
///
/// Its receiver may keep the descriptor and a mapping as long as it likes,
/// and it decides when the sender lets go of a region (its `BUSY` bit): were
/// the pages left in place, a receiver that clears the bit early and keeps
/// every descriptor would make its sender allocate a region per message,
/// none of them ever freed. Punched, the region holds no memory of the
/// sender's, whoever keeps it; a receiver that cleared the bit before it
/// was done copying reads zeros, which only spoils its own message. A
/// region the receiver writes into again is memory charged to the receiver.
///
/// # References
/// * `madvise(2)`, `MADV_REMOVE`; `fallocate(2)`, `FALLOC_FL_PUNCH_HOLE`
fn discard(map: Mapping) {
    // SAFETY: the range is exactly our own mapping, which no Rust reference
    // points into (its bytes are only copied raw, its header words read
    // through atomics): removing its pages changes what it reads, never
    // which memory is valid.
    let _ = unsafe { mm::madvise(map.ptr.as_ptr().cast(), map.len, mm::Advice::LinuxRemove) };
}

impl Regions {
    /// Payload bytes of the messages the receiver has not copied out yet
    /// (forgetting, first, the regions it is done with). Payload bytes, not
    /// regions' sizes, so that a large region reused for a small message
    /// counts as the message: the bound reads as bytes sent and not yet
    /// received.
    fn in_flight(&mut self) -> usize {
        self.prune();
        let sent: usize = self.sent.iter().map(|s| s.extent).sum();
        let pooled: usize = (self.list.iter())
            .filter(|r| busy(&r.map))
            .map(|r| r.extent)
            .sum();
        sent + pooled
    }

    /// Frees the regions let go of whose message the receiver is done with.
    fn prune(&mut self) {
        let mut i = 0;
        while i < self.sent.len() {
            match busy(&self.sent[i].map) {
                true => i += 1,
                false => discard(self.sent.swap_remove(i).map),
            }
        }
    }
}

impl Drop for Regions {
    /// The pool's regions no message is in flight in are freed (a receiver
    /// may keep them held); the others keep their messages, which the
    /// receiver may still read, and their memory until it lets go.
    fn drop(&mut self) {
        for region in std::mem::take(&mut self.list) {
            if !busy(&region.map) {
                discard(region.map);
            }
        }
        self.prune();
    }
}

impl Pool {
    /// The regions, once a fork since they were made has been dealt with.
    fn lock(&self) -> std::sync::MutexGuard<'_, Regions> {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let forks = crate::ipc::transport::tag::forks();
        if regions.forks != forks {
            regions.list.clear();
            regions.sent.clear();
            regions.forks = forks;
        }
        regions
    }
}

/// How far into a region's payload area `parts` go: so far that the second
/// part (a typed message's byte string, the bulk of it) starts on a cache
/// line, as a bytes channel's one part does (see `wire`'s `skew`).
fn skew(parts: &[IoSlice<'_>]) -> usize {
    match parts {
        [head, _, ..] => (SKEW_ALIGN - head.len() % SKEW_ALIGN) % SKEW_ALIGN,
        _ => 0,
    }
}

/// [`Take::Kept`] requests an empty pool turns down before it creates a region.
const FIRST_REGION_AFTER: u32 = 2;

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

/// Which regions [`Pool::take`] may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Any free region, or a new one.
    Any,
    /// Only a region the receiver holds, or a first region for an empty
    /// pool that has been asked a few times (so the next message finds one
    /// held): for payloads the socket carries well, which would lose by
    /// passing a descriptor every time.
    Kept,
}

impl Pool {
    /// A region with room for `parts` (`total` bytes) `skew` bytes into its
    /// payload area, to be filled ([`Region::fill`]) and sent by the route
    /// returned, and that skew; `None` if `take` allows none (or, for a
    /// medium message, none can be made). Give it back with [`Pool::put`]
    /// once it has been sent.
    pub(crate) fn take(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        take: Take,
    ) -> Result<Option<(Region, Route, usize)>, Errno> {
        let skew = skew(parts);
        // In memory, so far below `usize::MAX`.
        let extent = total + skew;
        let reused = {
            let mut guard = self.lock();
            let regions = &mut guard.list;
            let claimed = (regions.iter().enumerate())
                .find_map(|(i, r)| r.claim(extent, take).map(|route| (i, route)));
            let mut counted = None;
            if claimed.is_none() && take == Take::Kept {
                // A second region when the first is busy (in flight, or left
                // busy by a message the receiver refused); none past that.
                let streak = match regions.len() {
                    0 => self.kept_asks.fetch_add(1, Ordering::Relaxed),
                    n if n < POOL_REGIONS => FIRST_REGION_AFTER,
                    _ => 0,
                };
                if streak < FIRST_REGION_AFTER {
                    return Ok(None);
                }
                counted = Counted::sender();
                if counted.is_none() {
                    return Ok(None);
                }
            }
            if claimed.is_none() && take == Take::Any {
                // Back-pressure (see `Config::max_region_bytes_in_flight`):
                // past the bound, the message goes in fragments.
                let bound = Config::max_region_bytes_in_flight_now();
                let in_flight = guard.in_flight() as u64;
                if in_flight > 0 && in_flight.saturating_add(extent as u64) > bound {
                    return Ok(None);
                }
            }
            let regions = &mut guard.list;
            match claimed {
                Some((i, route)) => Ok((regions.swap_remove(i), route)),
                None => Err(counted),
            }
        };
        let (region, route) = match reused {
            Ok((mut region, route)) => {
                region.extent = extent;
                if let Err(e) = region.back(REGION_HEADER + extent) {
                    region.abandon(route);
                    self.put(region);
                    return match take {
                        Take::Kept => Ok(None),
                        _ => Err(e),
                    };
                }
                (region, route)
            }
            Err(counted) => {
                let mut region = match Region::create(extent) {
                    Ok(region) => region,
                    // A medium message still has the socket, whole. (A large
                    // one fails: in fragments, a thread sending to itself
                    // would block on its own receiver.)
                    Err(_) if take == Take::Kept => return Ok(None),
                    Err(e) => return Err(e),
                };
                region._counted = counted;
                (region, Route::Descriptor)
            }
        };
        Ok(Some((region, route, skew)))
    }

    /// Returns a sent region to the pool; it is reused once the receiver
    /// frees it. A full pool forgets its oldest region (the receiver may still
    /// hold it; its mapping keeps the memory alive until it is done).
    pub(crate) fn put(&self, region: Region) {
        let mut guard = self.lock();
        guard.prune();
        if guard.list.len() >= POOL_REGIONS {
            let Region { map, extent, .. } = guard.list.remove(0);
            match busy(&map) {
                // Counted, and its memory kept, until the receiver is done.
                true => guard.sent.push(Sent { map, extent }),
                false => discard(map),
            }
        }
        guard.list.push(region);
    }

    /// Frees the regions let go of: the channel failed (its receiver is
    /// gone), so none of their messages will be read.
    pub(crate) fn forget_sent(&self) {
        for sent in std::mem::take(&mut self.lock().sent) {
            discard(sent.map);
        }
    }
}

/// A region a receiver keeps mapped.
struct Held {
    /// `(st_dev, st_ino)`: the same region arriving again by descriptor.
    key: (u64, u64),
    /// The name kept messages use for it (see [`Route::Kept`]).
    token: u64,
    /// `Some` if the region is held (its state says `HELD`, and kept messages
    /// may name it): the descriptor, so the region can move with the
    /// receiver ([`MapCache::take_kept`]), and its place under the budget.
    /// `None`: mapped for reuse only, its descriptor comes with each message.
    held: Option<(OwnedFd, Counted)>,
    map: Mapping,
}

impl Held {
    /// Marks the region done with by the message copied out of it: held
    /// (the receiver keeps it, and says how far it maps it) or free.
    fn done_with(&self) {
        let map = &self.map;
        let state = match self.held {
            Some(_) => {
                map.mapped().store(map.len as u64, Ordering::Relaxed);
                HELD
            }
            None => FREE,
        };
        // SYNC POINT: sender's `Acquire` in `Region::claim`: the copy is
        // done before the sender may overwrite the payload.
        map.state().store(state, Ordering::Release);
    }

    /// Whether the receiver may unmap the region now: no message can name it.
    fn releasable(&self) -> bool {
        self.held.is_none() || self.map.release()
    }
}

/// A receiver's cache of mapped regions, most recently used last.
#[derive(Default)]
pub(crate) struct MapCache {
    entries: Vec<Held>,
}

impl std::fmt::Debug for MapCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapCache")
            .field("mapped", &self.entries.len())
            .finish()
    }
}

impl Drop for MapCache {
    fn drop(&mut self) {
        // Let go of every region no message names (`HELD` -> `FREE`), so that
        // its sender passes the descriptor again: a receiver rebuilt from a
        // duplicate of this one's socket does not hold them. A region a kept
        // message in flight names stays as it is.
        for entry in &self.entries {
            entry.releasable();
        }
    }
}

/// A region that moves with its receiver, as [`MapCache::take_kept`] gives it.
pub(crate) struct KeptRegion {
    pub token: u64,
    /// How far it was mapped (the new owner maps as far, no farther than
    /// the region is long).
    pub len: u64,
    pub fd: OwnedFd,
}

/// How a copy out of a region ended.
#[derive(Debug)]
pub(crate) enum Progress {
    /// The payload is all copied: `true` if the predicted byte string went
    /// to its own buffer.
    Done(bool),
    /// A streamed payload had not all arrived when the receive had to
    /// return ([`Stream::pause`]): what came is copied, the region stays
    /// mapped and busy, and [`MapCache::resume`] goes on.
    Paused(PausedCopy),
}

/// A streamed copy put aside (see [`Progress::Paused`]).
pub(crate) struct PausedCopy {
    /// The region (`st_dev`, `st_ino`) and the message's tag: the cache
    /// entry the copy reads, unless `own`.
    key: (u64, u64),
    token: u64,
    /// Payload bytes copied so far.
    done: usize,
    /// Whether the receive that paused it copied anything.
    pub progressed: bool,
    /// Whether the copy so far sent the predicted string to its own buffer.
    pub split: bool,
    /// The region's mapping, if the cache could not keep it.
    own: Option<Mapping>,
    /// The region's descriptor, for a message that brought one: it goes
    /// with the message if the receiver moves (`None` if it could not be
    /// kept, or for a kept message, whose region moves as held).
    pub fd: Option<OwnedFd>,
}

impl std::fmt::Debug for PausedCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PausedCopy")
            .field("done", &self.done)
            .field("split", &self.split)
            .field("cached", &self.own.is_none())
            .finish()
    }
}

/// Copies from payload byte `from` on out of a region the cache does not
/// keep (`map`, the whole region or at least `REGION_HEADER + skew + total`
/// bytes of it, checked by `copy_out`), and lets it go unless the copy
/// pauses.
#[allow(clippy::too_many_arguments)]
fn copy_once(
    map: Mapping,
    (key, token): ((u64, u64), u64),
    span: Span<'_>,
    from: usize,
    dst: &mut Vec<u8>,
    split: Option<Split<'_>>,
    fd: Option<OwnedFd>,
) -> Result<Progress, WireError> {
    // SAFETY: `copy_out` checked that `map` holds `REGION_HEADER + skew +
    // total` bytes of a region sealed against shrinking, for this span (a
    // resumed copy comes with the span it began with).
    let copied = unsafe { copy_raw(&map, span, from, dst, split) };
    if let Ok(Copied::Paused { done, split }) = copied {
        return Ok(Progress::Paused(PausedCopy {
            key,
            token,
            done,
            progressed: done > from,
            split,
            own: Some(map),
            fd,
        }));
    }
    // SYNC POINT: sender's `Acquire` in `Region::claim`.
    map.state().store(FREE, Ordering::Release);
    copied.map(Copied::into_progress)
}

/// Holds the region `fd`, mapped `len` bytes long, in `held` if the budget
/// allows; gives back what the copy keeps (`copy_from_last`'s `spare`): `fd`
/// if it is not held, and if the copy may pause, `fd` itself while a
/// duplicate is held (a duplicate that fails leaves the region unheld).
fn hold(
    held: &mut Option<(OwnedFd, Counted)>,
    fd: OwnedFd,
    len: usize,
    may_pause: bool,
) -> Option<OwnedFd> {
    let Some(counted) = Counted::held(len) else {
        return Some(fd);
    };
    if !may_pause {
        *held = Some((fd, counted));
        return None;
    }
    if let Ok(copy) = fd.try_clone() {
        *held = Some((copy, counted));
    }
    Some(fd)
}

impl MapCache {
    /// Validates the region `fd`, which came with a message tagged `token`,
    /// and appends its `total` payload bytes, `skew` bytes into the payload
    /// area, to `dst`, then marks the region free for its sender (held, if
    /// this cache keeps it). With `split`, if the payload is long enough,
    /// the predicted byte string goes to its own buffer instead (`true`
    /// returned; see `ipc::split`).
    pub(crate) fn copy_out(
        &mut self,
        fd: OwnedFd,
        token: u64,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let extent = span.extent()?;
        // Seals first, then the size: a region sealed against shrinking can
        // no longer get shorter than what we map (a size read before the
        // seals could be stale, and mapping past the end raises `SIGBUS`).
        // Asking for seals also fails at once for anything but shared memory,
        // before `fstat` could wait on, say, a FUSE daemon.
        let seals = fs::fcntl_get_seals(&fd).map_err(|_| WireError::BadRegion)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(WireError::BadRegion);
        }
        // Which region (`st_dev`, `st_ino`), and its size.
        let stat = fs::fstat(&fd).map_err(|_| WireError::BadRegion)?;
        let size = usize::try_from(stat.st_size).map_err(|_| WireError::BadRegion)?;
        if size < REGION_HEADER || size - REGION_HEADER < extent {
            return Err(WireError::BadRegion);
        }
        let need = (REGION_HEADER + extent).next_multiple_of(PAGE);
        let key = (stat.st_dev, stat.st_ino);
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            if self.entries[i].map.len >= need {
                // Seals are never removed, and a cached inode is alive (our
                // mapping holds it) so cannot be reused: checking a region
                // once, when it is first mapped, is enough.
                let mut entry = self.entries.remove(i);
                entry.token = token;
                let spare = match entry.held {
                    None => hold(&mut entry.held, fd, entry.map.len, span.may_pause()),
                    Some(_) => Some(fd),
                };
                self.entries.push(entry);
                return self.copy_from_last(span, 0, dst, split, spare);
            }
            // Mapped too short for this message: map it again below.
            drop(self.entries.remove(i));
        }
        not_hugetlbfs(fd.as_fd())?;
        let len = if size <= MAP_WHOLE { size } else { need };
        let map = Mapping::map(fd.as_fd(), len).map_err(|_| WireError::BadRegion)?;
        if self.entries.len() >= CACHED_MAPPINGS {
            // Let go of the least recently used region no message names.
            match self.entries.iter().position(Held::releasable) {
                Some(i) => drop(self.entries.remove(i)),
                // All pinned: use this region once, and keep nothing.
                None => return copy_once(map, (key, token), span, 0, dst, split, Some(fd)),
            }
        }
        let mut held = None;
        // Over the budget: mapped for reuse, not held.
        let spare = hold(&mut held, fd, map.len, span.may_pause());
        self.entries.push(Held {
            key,
            token,
            held,
            map,
        });
        self.copy_from_last(span, 0, dst, split, spare)
    }

    /// Appends the `total` payload bytes of the held region named `token`,
    /// `skew` bytes into its payload area, to `dst` (a [`Route::Kept`]
    /// message), as [`MapCache::copy_out`] does.
    pub(crate) fn copy_kept(
        &mut self,
        token: u64,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let extent = span.extent()?;
        let i = self
            .entries
            .iter()
            .position(|e| e.token == token && e.held.is_some())
            .ok_or(WireError::BadRegion)?;
        // Checked against our own mapping, never the peer's `mapped` word.
        if extent > self.entries[i].map.len.saturating_sub(REGION_HEADER) {
            self.skip_kept(token);
            return Err(WireError::BadRegion);
        }
        let held = self.entries.remove(i);
        self.entries.push(held);
        self.copy_from_last(span, 0, dst, split, None)
    }

    /// Goes on with a copy that [paused](Progress::Paused): `span` must
    /// describe the same payload as when it began (the same header), and
    /// `split` be given exactly if the copy so far used one
    /// ([`PausedCopy::split`]), with the string copied so far.
    pub(crate) fn resume(
        &mut self,
        paused: PausedCopy,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let PausedCopy {
            key,
            token,
            done,
            own,
            fd,
            ..
        } = paused;
        if let Some(map) = own {
            return copy_once(map, (key, token), span, done, dst, split, fd);
        }
        // Nothing else of this receiver's used the cache meanwhile (its
        // receives finish this message first), so the entry is still mapped;
        // checked all the same, as `copy_kept` checks a kept message.
        let extent = span.extent()?;
        let i = (self.entries.iter())
            .position(|e| {
                e.key == key
                    && e.token == token
                    && e.map.len.saturating_sub(REGION_HEADER) >= extent
            })
            .ok_or(WireError::BadRegion)?;
        let entry = self.entries.remove(i);
        self.entries.push(entry);
        self.copy_from_last(span, done, dst, split, fd)
    }

    /// A kept message naming `token` was refused: the region is free again
    /// for its sender (and still held).
    pub(crate) fn skip_kept(&mut self, token: u64) {
        if let Some(entry) = (self.entries.iter()).find(|e| e.token == token && e.held.is_some()) {
            entry.map.state().store(HELD, Ordering::Release);
        }
    }

    /// Copies out of the most recently used entry, which maps at least
    /// `REGION_HEADER + skew + total` bytes, from payload byte `from` on, and
    /// marks it held (or free, if it is only mapped) unless the copy pauses.
    /// `spare`: the descriptor the message brought, if the entry did not
    /// keep it, for a copy that pauses (`PausedCopy::fd`).
    fn copy_from_last(
        &mut self,
        span: Span<'_>,
        from: usize,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
        spare: Option<OwnedFd>,
    ) -> Result<Progress, WireError> {
        let entry = self.entries.last_mut().ok_or(WireError::BadRegion)?;
        let map = &entry.map;
        // SAFETY: every caller checked `REGION_HEADER + skew + total <=
        // map.len`, and a cached region is sealed against shrinking.
        let copied = unsafe { copy_raw(map, span, from, dst, split) };
        if let Ok(Copied::Paused { done, split }) = copied {
            // The region stays busy (the message is still being read), and
            // held if it was: a receiver that moves takes it along.
            let fd = spare;
            return Ok(Progress::Paused(PausedCopy {
                key: entry.key,
                token: entry.token,
                done,
                progressed: done > from,
                split,
                own: None,
                fd,
            }));
        }
        // (Also after a failed copy: the region is no use to this message
        // any more.)
        entry.done_with();
        copied.map(Copied::into_progress)
    }

    /// Gives up a copy that paused, for a message that failed meanwhile:
    /// the region goes back to its sender as after a failed copy.
    pub(crate) fn give_up(&mut self, paused: PausedCopy) {
        let PausedCopy {
            key, token, own, ..
        } = paused;
        match own {
            // SYNC POINT: sender's `Acquire` in `Region::claim`.
            Some(map) => map.state().store(FREE, Ordering::Release),
            None => {
                if let Some(entry) =
                    (self.entries.iter()).find(|e| e.key == key && e.token == token)
                {
                    entry.done_with();
                }
            }
        }
    }

    /// Empties the cache for a receiver that moves to another process: the
    /// regions no message can name are let go (their senders send the
    /// descriptor again), the others are returned, to travel with it.
    pub(crate) fn take_kept(&mut self) -> Vec<KeptRegion> {
        self.entries
            .drain(..)
            .filter(|e| !e.releasable())
            .filter_map(
                |Held {
                     token, held, map, ..
                 }| {
                    let (fd, _counted) = held?;
                    Some(KeptRegion {
                        token,
                        len: map.len as u64,
                        fd,
                    })
                },
            )
            .collect()
    }

    /// Holds `region` again, in the process a receiver moved to, if the
    /// process's budget for held regions allows: else `Ok(false)`, and the
    /// messages that name it fail alone ([`WireError::BadRegion`]). The
    /// region is checked as if it had just arrived, and its mapping is
    /// charged to `budget`, what the message that brought it may still map
    /// (its receiver's size limit less what came before).
    pub(crate) fn hold(&mut self, region: KeptRegion, budget: &mut u64) -> Result<bool, WireError> {
        // Seals before size, as in `copy_out`.
        let seals = fs::fcntl_get_seals(&region.fd).map_err(|_| WireError::BadRegion)?;
        not_hugetlbfs(region.fd.as_fd())?;
        let stat = fs::fstat(&region.fd).map_err(|_| WireError::BadRegion)?;
        let size = u64::try_from(stat.st_size).map_err(|_| WireError::BadRegion)?;
        let len = usize::try_from(region.len).map_err(|_| WireError::BadRegion)?;
        let sane = seals.contains(SealFlags::SHRINK | SealFlags::GROW)
            && region.len <= size
            && len > REGION_HEADER;
        if !sane {
            return Err(WireError::BadRegion);
        }
        if region.len > *budget {
            return Err(WireError::TooLarge {
                claimed: region.len,
                limit: *budget,
            });
        }
        *budget -= region.len;
        if self.entries.len() >= CACHED_MAPPINGS {
            return Ok(false);
        }
        // Counted before it is mapped: over the process's budget, it is not.
        let Some(counted) = Counted::held(len) else {
            return Ok(false);
        };
        let map = Mapping::map(region.fd.as_fd(), len).map_err(|_| WireError::BadRegion)?;
        self.entries.push(Held {
            key: (stat.st_dev, stat.st_ino),
            token: region.token,
            held: Some((region.fd, counted)),
            map,
        });
        Ok(true)
    }
}

/// Hands back to its sender the region `fd` of a message this receiver
/// refused: the message will never be copied out, and its sender counts the
/// region in flight while it is busy ([`Config::max_region_bytes_in_flight`]).
/// Anything but a sealed shared-memory region (a fragment carrier, or
/// whatever a peer sent) is left alone, as is a region not marked busy.
pub(crate) fn release_refused(fd: BorrowedFd<'_>) {
    // Seals before size, as in `MapCache::copy_out`.
    let sealed = fs::fcntl_get_seals(fd)
        .is_ok_and(|seals| seals.contains(SealFlags::SHRINK | SealFlags::GROW));
    if !sealed || not_hugetlbfs(fd).is_err() {
        return;
    }
    let long_enough = fs::fstat(fd).is_ok_and(|st| st.st_size >= PAGE as i64);
    if let (true, Ok(map)) = (long_enough, Mapping::map(fd, PAGE)) {
        // SYNC POINT: sender's `Acquire` in `Region::claim` (nothing of the
        // payload was read).
        let _ = (map.state()).compare_exchange(BUSY, FREE, Ordering::Release, Ordering::Relaxed);
    }
}

/// Refuses a region on hugetlbfs. Seals against shrinking do not stop its
/// owner from punching holes in it (`FALLOC_FL_PUNCH_HOLE`; on hugetlbfs only
/// a write seal does), and touching a hole in our mapping raises `SIGBUS`
/// once the huge page pool is empty. Only shared memory and hugetlbfs take
/// seals, so a sealed region that passes is shared memory, where a punched
/// hole reads back as zeros.
fn not_hugetlbfs(fd: BorrowedFd<'_>) -> Result<(), WireError> {
    let fs = fs::fstatfs(fd).map_err(|_| WireError::BadRegion)?;
    // `f_type`'s integer type differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let on_hugetlbfs = fs.f_type as i64 == libc::HUGETLBFS_MAGIC as i64;
    if on_hugetlbfs {
        return Err(WireError::BadRegion);
    }
    Ok(())
}

/// Where a message's payload lies in its region, and how it is written.
pub(crate) struct Span<'a> {
    /// Bytes into the payload area the payload starts (below `SKEW_ALIGN`).
    pub skew: usize,
    pub total: usize,
    /// `Some` for a streamed payload: how to wait for the rest.
    pub stream: Option<Stream<'a>>,
}

impl Span<'_> {
    /// Whether a copy of it may pause ([`Stream::pause`]).
    fn may_pause(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.pause.is_some())
    }

    /// How far into the payload area the payload reaches.
    fn extent(&self) -> Result<usize, WireError> {
        self.skew
            .checked_add(self.total)
            .ok_or(WireError::BadRegion)
    }
}

/// How a receiver waits for the rest of a streamed payload.
pub(crate) struct Stream<'a> {
    /// When to give up on it.
    pub deadline: Instant,
    /// When to stop waiting and put the copy aside
    /// ([`Progress::Paused`]); `None`: wait until the deadline. Looked at
    /// before every wait, so a peer that keeps writing a little cannot keep
    /// the receive past it either.
    pub pause: Option<Instant>,
    /// Whether to spin before sleeping (not for a copy that stalled last
    /// time: its sender is not writing).
    pub spin: bool,
    /// Whether a sender is left that could write the rest.
    pub alive: &'a dyn Fn() -> bool,
}

impl Mapping {
    /// Waits until a streamed payload of `total` bytes is filled past
    /// `done`, and returns how far (at most `total`); `None` if the stream's
    /// pause comes first.
    fn wait_filled(
        &self,
        done: usize,
        total: usize,
        stream: &Stream<'_>,
    ) -> Result<Option<usize>, WireError> {
        let mut alive = true;
        let mut spin_until = None;
        loop {
            let seq = self.seq().load(Ordering::Acquire);
            // SYNC POINT: the sender's `Release` in `Region::publish`: the
            // bytes below `filled` are written. A peer may store anything
            // here; it only decides which of its own bytes we copy.
            let filled = self.filled().load(Ordering::Acquire);
            let filled = usize::try_from(filled).unwrap_or(usize::MAX).min(total);
            // All of it there: copied whatever the clock says (the rest of
            // the copy waits for nothing).
            if filled == total && total > done {
                return Ok(Some(total));
            }
            // Then the clock, whatever the progress: a peer that creeps (a
            // byte at a time, just often enough) must outlast neither the
            // deadline nor the receive's pause.
            let now = Instant::now();
            if now >= stream.deadline {
                return Err(WireError::FragmentTimeout);
            }
            if stream.pause.is_some_and(|pause| now >= pause) {
                return Ok(None);
            }
            if filled > done {
                return Ok(Some(filled));
            }
            // Looked again after the last sender was seen gone (it may have
            // finished just before it went): nothing more will come.
            if !alive {
                return Err(WireError::Truncated);
            }
            let now = Instant::now();
            let until = *spin_until.get_or_insert_with(|| match stream.spin && smp() {
                true => now + STREAM_SPIN,
                false => now,
            });
            if now < until {
                std::hint::spin_loop();
                continue;
            }
            if now >= stream.deadline {
                return Err(WireError::FragmentTimeout);
            }
            if stream.pause.is_some_and(|pause| now >= pause) {
                return Ok(None);
            }
            alive = (stream.alive)();
            if !alive {
                continue;
            }
            let until = stream
                .pause
                .map_or(stream.deadline, |p| p.min(stream.deadline));
            let nap = until.saturating_duration_since(now).min(STREAM_POLL);
            let nap = rustix::fs::Timespec {
                tv_sec: nap.as_secs() as i64,
                tv_nsec: i64::from(nap.subsec_nanos()),
            };
            // Shared (not `PRIVATE`): the word lives in memory another
            // process maps. `EAGAIN` (`seq` moved), a timeout or `EINTR`:
            // look again.
            if crate::fiber::in_fiber() {
                // A fiber must not sleep in the kernel (its worker would):
                // it naps on its worker's timers, a little at a time.
                crate::fiber::sleep(
                    Duration::from_micros(200).min(until.saturating_duration_since(now)),
                );
                continue;
            }
            let _ = futex::wait(self.seq(), futex::Flags::empty(), seq, Some(&nap));
        }
    }
}

/// How [`copy_raw`] ended.
enum Copied {
    /// All of it: `true` if the string went to its own buffer.
    Done(bool),
    /// The stream paused after `done` payload bytes (`split`: the string so
    /// far went to its own buffer).
    Paused { done: usize, split: bool },
}

impl Copied {
    /// The progress of a copy that did not pause.
    fn into_progress(self) -> Progress {
        match self {
            Copied::Done(split) => Progress::Done(split),
            Copied::Paused { .. } => unreachable!("a paused copy is put aside first"),
        }
    }
}

/// Copies the payload of `map` that `span` describes to `dst` (with
/// `split`, the predicted string to its own buffer; `true` if so), as it is
/// written if it is streamed, from payload byte `from` on: a copy that
/// paused goes on with the same `dst`, and `split` given exactly if it used
/// one before (the string so far in its buffer).
///
/// # Safety
/// `map` must map at least `REGION_HEADER + span.skew + span.total` bytes of
/// a region sealed against shrinking.
unsafe fn copy_raw(
    map: &Mapping,
    span: Span<'_>,
    from: usize,
    dst: &mut Vec<u8>,
    split: Option<Split<'_>>,
) -> Result<Copied, WireError> {
    let Span {
        skew,
        total,
        stream,
    } = span;
    // SAFETY: `REGION_HEADER + skew` is within the mapping (the caller's promise).
    let src = unsafe { map.payload().add(skew) };
    // The sender may still write the source: we copy raw bytes, never form
    // a reference to them, and the result is validated as untrusted input.
    let fits =
        |s: &Split<'_>| (s.layout.at.checked_add(s.layout.len)).is_some_and(|end| end <= total);
    let mut split = split.filter(fits);
    // Room for all of it first: a stream arrives in pieces.
    match &mut split {
        // Going on: room was made before, but for the payload alone if the
        // string was put back in place since (`dst` then holds it too).
        _ if from > 0 => {
            if split.is_none() {
                reserve(dst, total.saturating_sub(dst.len()))?;
            }
        }
        Some(s) => {
            s.string.clear();
            reserve(s.string, s.layout.len)?;
            reserve(dst, total - s.layout.len)?;
        }
        None => reserve(dst, total)?,
    }
    let mut done = from;
    while done < total {
        let ready = match &stream {
            Some(stream) => match map.wait_filled(done, total, stream)? {
                Some(ready) => ready,
                None => {
                    let split = split.is_some();
                    return Ok(Copied::Paused { done, split });
                }
            },
            None => total,
        };
        // SAFETY: `done < ready <= total`: within the payload.
        unsafe { append_range(src, done..ready, dst, split.as_mut())? };
        done = ready;
    }
    Ok(Copied::Done(split.is_some()))
}

/// Makes room for `n` more bytes in `v`, exactly.
fn reserve(v: &mut Vec<u8>, n: usize) -> Result<(), WireError> {
    v.try_reserve_exact(n).map_err(|_| WireError::OutOfMemory {
        requested: n as u64,
    })
}

/// Appends payload bytes `range` (the payload starts at `src`) where they
/// belong: to `dst`, or with `split`, the string's to its own buffer.
///
/// # Safety
/// `src + range` must be valid for reads and not overlap the buffers.
unsafe fn append_range(
    src: *const u8,
    range: std::ops::Range<usize>,
    dst: &mut Vec<u8>,
    split: Option<&mut Split<'_>>,
) -> Result<(), WireError> {
    let Some(split) = split else {
        // SAFETY: the caller's promise.
        return unsafe { append_raw(dst, src.add(range.start), range.len()) };
    };
    let (at, end) = (split.layout.at, split.layout.at + split.layout.len);
    // Before the string, the string, after it.
    for (i, (lo, hi)) in [(0, at), (at, end), (end, usize::MAX)]
        .into_iter()
        .enumerate()
    {
        let (from, to) = (range.start.max(lo), range.end.min(hi));
        if from < to {
            let out = if i == 1 {
                &mut *split.string
            } else {
                &mut *dst
            };
            // SAFETY: `[from, to)` lies within `range`: the caller's promise.
            unsafe { append_raw(out, src.add(from), to - from)? };
        }
    }
    Ok(())
}

/// Appends the `n` bytes at `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes and not overlap `dst`'s buffer.
unsafe fn append_raw(dst: &mut Vec<u8>, src: *const u8, n: usize) -> Result<(), WireError> {
    dst.try_reserve_exact(n)
        .map_err(|_| WireError::OutOfMemory {
            requested: n as u64,
        })?;
    let spare = dst.spare_capacity_mut();
    // SAFETY: the caller vouches for `src`; `spare` has room for `n` bytes
    // (reserved above) and is memory of our own, so cannot overlap it.
    unsafe { std::ptr::copy_nonoverlapping(src, spare.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: the copy above initialised `n` bytes after `len`.
    unsafe { dst.set_len(dst.len() + n) };
    Ok(())
}

// ===== regions the application holds (`ipc::IpcSharedMemory`) =====

/// A sealed memfd region mapped whole, shared with whichever processes it is
/// sent to: the memory behind `ipc::IpcSharedMemory`.
///
/// Unlike a payload region it has no header: every byte is the
/// application's, and both sides may write it. Its size is sealed
/// (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so a mapping of it never
/// reaches past the end of the file, and a received one is checked for that
/// before it is mapped.
///
/// # A region that comes back finds its mapping
/// Mapping a region is cheap; faulting its pages in is not: ~0.4 µs a page
/// here, 0.4 ms for 4 MiB, about all that a round trip of a touched region
/// costs (`courier-bench ipc --case shm`); even a one-page region's fresh
/// mapping, fault and `munmap` cost ~8 µs. Regions tend to travel back and
/// forth (a buffer handed to a worker and returned), and a sender usually
/// drops its copy once sent. So a dropped region stays mapped for a while,
/// [parked](Parked), and a region that
/// arrives is looked up there first, by inode: back from its trip, it reuses
/// the mapping with its pages already in. A parked region holds its memory
/// and a descriptor: at most [`PARKED_REGIONS`] of them and
/// [`PARKED_BYTES`] in all, the oldest let go first.
pub(crate) struct SharedRegion {
    /// Copies of `held.map`'s: a dereference reads two plain fields.
    ptr: NonNull<u8>,
    len: usize,
    /// `None` only while it is dropped (parked or let go).
    held: Option<Parked>,
}

/// A mapped region and its descriptor, in use or parked.
struct Parked {
    fd: OwnedFd,
    map: Mapping,
    /// Which file (`st_dev`, `st_ino`), once asked: received regions know it
    /// from their checks; created ones ask when they are parked.
    key: Option<(u64, u64)>,
}

/// Most regions parked at a time.
const PARKED_REGIONS: usize = 4;
/// Most bytes parked at a time (a larger region is never parked).
const PARKED_BYTES: usize = 32 << 20;

/// This process's parked regions, oldest first.
static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());

// SAFETY: `ptr` points into the mapping `held` owns, which is unmapped only
// after this value is gone (or parked, unreachable through it). The bytes are
// shared memory that any holder in any process may write; that is the
// contract of `IpcSharedMemory` (its `deref_mut` is unsafe for that reason),
// not something a thread of this process can make worse.
unsafe impl Send for SharedRegion {}
// SAFETY: as for `Send`; `&SharedRegion` gives out only the pointer and the
// descriptor.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A zero-filled region of `len` bytes (`len > 0`). No page is touched:
    /// a fresh memfd reads as zeros, and pages are allocated as they are
    /// written.
    pub(crate) fn zeroed(len: usize) -> Result<SharedRegion, Errno> {
        let fd = fs::memfd_create(
            "courier-shared",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        fs::ftruncate(&fd, len as u64)?;
        SharedRegion::seal_and_map(fd, len)
    }

    /// A region holding a copy of `bytes` (not empty).
    ///
    /// The bytes go in with `write(2)`: the kernel allocates the file's pages
    /// and copies into them in one pass, where a copy through a fresh mapping
    /// would take a page fault per page.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<SharedRegion, Errno> {
        let fd = fs::memfd_create(
            "courier-shared",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        write_all(&fd, bytes)?;
        SharedRegion::seal_and_map(fd, bytes.len())
    }

    /// A region of `len` bytes, each `byte`, written in as
    /// [`from_bytes`](Self::from_bytes) writes: where memory runs short
    /// (strict overcommit, a memory cgroup's limit) `write` says so, where
    /// filling a sparse mapping would meet it as `SIGBUS` at the first page
    /// that cannot be had.
    pub(crate) fn filled(len: usize, byte: u8) -> Result<SharedRegion, Errno> {
        let fd = fs::memfd_create(
            "courier-shared",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let chunk = vec![byte; len.min(64 << 10)];
        let mut left = len;
        while left > 0 {
            let here = left.min(chunk.len());
            write_all(&fd, &chunk[..here])?;
            left -= here;
        }
        SharedRegion::seal_and_map(fd, len)
    }

    fn seal_and_map(fd: OwnedFd, len: usize) -> Result<SharedRegion, Errno> {
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::map(fd.as_fd(), len)?;
        Ok(SharedRegion::new(fd, map, None))
    }

    fn new(fd: OwnedFd, map: Mapping, key: Option<(u64, u64)>) -> SharedRegion {
        SharedRegion {
            ptr: map.ptr,
            len: map.len,
            held: Some(Parked { fd, map, key }),
        }
    }

    /// Maps a region that arrived in a message, after checking it: shared
    /// memory (not hugetlbfs, see [`not_hugetlbfs`]), sealed against
    /// shrinking and growing, not empty, and no larger than `budget`, which
    /// it is then charged to (the receiver's size limit covers the regions a
    /// message brings: touching a region's pages allocates them). A region
    /// parked here is taken back instead of mapped again.
    ///
    /// The mapping is writable, as the sender's is: a region sealed against
    /// writes, or a descriptor opened read-only, is refused here rather than
    /// fault when written through `deref_mut`.
    pub(crate) fn open(fd: OwnedFd, budget: &mut u64) -> Result<SharedRegion, WireError> {
        // Seals before size, as in `MapCache::copy_out`: a region sealed
        // against shrinking cannot get shorter than the size read after.
        let seals = fs::fcntl_get_seals(&fd).map_err(|_| WireError::BadRegion)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(WireError::BadRegion);
        }
        let stat = fs::fstat(&fd).map_err(|_| WireError::BadRegion)?;
        let size = u64::try_from(stat.st_size).map_err(|_| WireError::BadRegion)?;
        if size == 0 {
            // An empty region travels without a descriptor.
            return Err(WireError::BadRegion);
        }
        if size > *budget {
            return Err(WireError::TooLarge {
                claimed: size,
                limit: *budget,
            });
        }
        let len = usize::try_from(size).map_err(|_| WireError::BadRegion)?;
        let key = (stat.st_dev, stat.st_ino);
        let map = match unpark(key, len, fd.as_fd()) {
            // The same open file as the parked one (`unpark` asks the kernel):
            // it passed these checks when it was first mapped, seals stay, and
            // it was opened writable.
            Some(map) => map,
            None => {
                not_hugetlbfs(fd.as_fd())?;
                Mapping::map(fd.as_fd(), len).map_err(|_| WireError::BadRegion)?
            }
        };
        *budget -= size;
        Ok(SharedRegion::new(fd, map, Some(key)))
    }

    /// The first byte of the mapping (page-aligned, never null).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The region's size in bytes (not 0).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd, for sending.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.held.as_ref().expect("held until dropped").fd.as_fd()
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            park(held);
        }
    }
}

/// Parks a region no one here uses any more, if it is worth keeping; lets
/// go of the oldest parked ones past the bounds (outside the lock: `munmap`
/// of a touched region takes a while).
fn park(mut region: Parked) {
    let len = region.map.len;
    if len > PARKED_BYTES {
        return;
    }
    if region.key.is_none() {
        let Ok(stat) = fs::fstat(&region.fd) else {
            return;
        };
        region.key = Some((stat.st_dev, stat.st_ino));
    }
    let mut evicted = Vec::new();
    {
        let mut parked = PARKED.lock().unwrap_or_else(|e| e.into_inner());
        // Two copies of one region received here map it twice: keep the
        // mapping dropped last.
        if let Some(i) = parked.iter().position(|p| p.key == region.key) {
            evicted.push(parked.remove(i));
        }
        parked.push(region);
        let mut bytes: usize = parked.iter().map(|p| p.map.len).sum();
        while parked.len() > PARKED_REGIONS || bytes > PARKED_BYTES {
            let oldest = parked.remove(0);
            bytes -= oldest.map.len;
            evicted.push(oldest);
        }
    }
    drop(evicted);
}

/// Takes the parked mapping of the region `key`, if there is one of `len`
/// bytes and it is the very open file `fd` refers to; its descriptor is
/// closed (the caller has its own).
///
/// An inode number alone could name another file (memfd inode numbers are 32
/// bits before Linux 5.9, and wrap), and the same file reopened through
/// `/proc` read-only would skip the checks a fresh mapping makes: so a
/// region is reused only if `kcmp(KCMP_FILE)` says that `fd` and the parked
/// descriptor are one open file, which a round trip through `SCM_RIGHTS`
/// keeps. Where `kcmp` is not available (a kernel without it, a seccomp
/// filter), regions are mapped afresh.
fn unpark(key: (u64, u64), len: usize, fd: BorrowedFd<'_>) -> Option<Mapping> {
    let mut parked = PARKED.lock().unwrap_or_else(|e| e.into_inner());
    let i = parked
        .iter()
        .position(|p| p.key == Some(key) && p.map.len == len && same_file(p.fd.as_fd(), fd))?;
    let found = parked.remove(i);
    drop(parked);
    Some(found.map)
}

/// Whether `a` and `b` are one open file description (`kcmp(2)`,
/// `KCMP_FILE`); `false` if the kernel cannot say.
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    /// `KCMP_FILE` from `<linux/kcmp.h>`.
    const KCMP_FILE: libc::c_int = 0;
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: `kcmp` takes five integers and reads no memory of ours; the
    // descriptors are borrowed, so open for the call.
    let order = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            pid,
            KCMP_FILE,
            a.as_raw_fd() as libc::c_ulong,
            b.as_raw_fd() as libc::c_ulong,
        )
    };
    order == 0
}

/// Lets go of every parked region now (see "A region that comes back finds
/// its mapping" on [`SharedRegion`]).
pub(crate) fn unpark_all() {
    let parked = std::mem::take(&mut *PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    drop(parked);
}

/// Allocates the pages of `fd`'s first `len` bytes. A region's payload is
/// copied in through a shared mapping, where a page that cannot be had is a
/// `SIGBUS` (strict overcommit, a memory cgroup's limit) rather than an
/// error; allocated first, the copy takes no such fault, and a shortage is
/// an error here.
fn fallocate(fd: &OwnedFd, len: usize) -> Result<(), Errno> {
    loop {
        match fs::fallocate(fd, FallocateFlags::empty(), 0, len as u64) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// Writes all of `bytes` at `fd`'s offset.
fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> Result<(), Errno> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(Errno::NOSPC),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
