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
//! the sender hold more memory than [`Config::max_region_bytes_in_flight`](crate::ipc::Config::max_region_bytes_in_flight)
//! plus its pool ([`POOL_REGIONS`] regions):
//!
//! * whether a region is free to reuse: a receiver that clears `BUSY` early
//!   makes the sender overwrite the bytes it is still copying, which spoils
//!   only its own message;
//! * whether a region the pool let go of is still in flight: once it says
//!   not, the sender frees the region's pages (`pool::discard`) before it lets
//!   go, so a receiver that keeps every descriptor and clears `BUSY` at once
//!   keeps holes, not the sender's memory.
//!
//! A receiver that never clears `BUSY` keeps its regions counted in flight,
//! and past the bound its sender's large messages go in fragments, which
//! wait for it to read.
//!
//! # Where each part lives
//! * [`pool`]: the sender's regions, their claims, and the pool that reuses
//!   them;
//! * [`cache`]: the receiver's mappings and held regions;
//! * [`copy`]: copying a payload out, as it is streamed;
//! * [`shared`]: the regions behind `ipc::IpcSharedMemory`;
//! * here: the region's layout, its state word, and the process's budgets.
//!
//! The system calls (memfd, `mmap`, `madvise`, futex) are the platform's
//! ([`crate::ipc::platform::Memory`]).
#![allow(unsafe_code)]

pub(crate) mod cache;
pub(crate) mod copy;
pub(crate) mod pool;
pub(crate) mod shared;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub(crate) use self::cache::{release_refused, KeptRegion, MapCache, PausedCopy, Progress};
pub(crate) use self::copy::{Span, Stream};
pub(crate) use self::pool::{Pool, Route, Take};
pub(crate) use self::shared::{unpark_all, SharedRegion};
use crate::ipc::err::WireError;
use crate::ipc::platform::{BorrowedFd, Mapping, Memory, Os, OwnedFd, RegionMap, Transport};

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

impl Mapping {
    /// The region's state word.
    fn state(&self) -> &AtomicU32 {
        // SAFETY: a message region's mapping (the only kind this is called on)
        // is page-aligned, at least `REGION_HEADER` bytes, lives as long as
        // `self`; both processes access the word only atomically.
        unsafe { AtomicU32::from_ptr(self.as_ptr().cast::<u32>()) }
    }

    /// How many bytes of the region the receiver maps (written by it,
    /// advice for the sender only).
    fn mapped(&self) -> &AtomicU64 {
        // SAFETY: as for `state`: bytes 8..16 of the header, aligned for
        // `u64`, only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.as_ptr().add(8).cast::<u64>()) }
    }

    /// How far a streamed payload is written (bytes from the skew on).
    fn filled(&self) -> &AtomicU64 {
        // SAFETY: as for `state`: bytes 16..24 of the header, aligned for
        // `u64`, only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.as_ptr().add(16).cast::<u64>()) }
    }

    /// Bumped with every store to `filled`: the futex word a receiver sleeps on.
    fn seq(&self) -> &AtomicU32 {
        // SAFETY: as for `state`: bytes 24..28 of the header, aligned for
        // `u32`, only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.as_ptr().add(24).cast::<u32>()) }
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: a message region's mapping (the only kind this is called
        // on) is at least a header long, so the offset is inside the mapping
        // or one past its end.
        unsafe { self.as_ptr().add(REGION_HEADER) }
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

/// Refuses a region on hugetlbfs. Seals against shrinking do not stop its
/// owner from punching holes in it (`FALLOC_FL_PUNCH_HOLE`; on hugetlbfs only
/// a write seal does), and touching a hole in our mapping raises `SIGBUS`
/// once the huge page pool is empty. Only shared memory and hugetlbfs take
/// seals, so a sealed region that passes is shared memory, where a punched
/// hole reads back as zeros.
fn not_hugetlbfs(fd: BorrowedFd<'_>) -> Result<(), WireError> {
    match Os::on_hugetlbfs(fd) {
        Ok(false) => Ok(()),
        _ => Err(WireError::BadRegion),
    }
}
