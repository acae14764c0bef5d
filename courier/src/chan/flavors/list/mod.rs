//! Unbounded channel: a linked list of fixed-size blocks.
//!
//! Sources: the block-list MPMC queue of crossbeam-channel's `flavors/list.rs` (itself after
//! Vyukov's node-based queues, 1024cores.net, "Non-intrusive MPSC node-based queue", with one
//! node per *block* of slots so that allocation is amortised) and tokio's `sync/mpsc/block.rs`.
//!
//! # Layout
//!
//! ```text
//!  head.block                                      tail.block
//!     |                                                 |
//!     v                                                 v
//!  +-------------------+ next  +-------------------+ next
//!  | slot 0 .. BLOCK_CAP-1 |---->| ...               |----> null
//!  +-------------------+       +-------------------+
//!
//!  positions (head.index, tail.index):   bits 63..1 = position; bit 0 = MARK_BIT in tail
//!  (disconnected), HAS_NEXT in head (tail is in a later block). A position p lives in slot (p % LAP) of its block; offset LAP-1 = BLOCK_CAP is
//!  never a slot: a position there means "the next block is being installed".
//! ```
//!
//! A sender claims a position with one CAS on `tail.index`; the sender that claims the last slot
//! of a block installs the next one (allocated *before* the CAS, so the window in which others
//! wait is short). A receiver claims with one CAS on `head.index`. Blocks are freed by the last
//! party to finish with them: each slot has `READ`, `SKIP` and `DESTROY` bits so that whichever
//! of "block retired" and "slot finished" comes last frees it.
//!
//! # Receivers that claim ahead
//!
//! To tell "empty" from "a message", crossbeam's receivers read `tail.index`, the line every
//! sender writes. Each such read costs the next sender a round trip to take the line back before
//! its CAS, and a receiver that waits by polling `tail` and then reads the slot crosses two
//! lines in a row. A ring of two threads over bare copies of the queue measures it (in the
//! machine's slow mode): 125 ns a message when the receiver waits on the slot, 220 when it
//! waits on `tail`, 210 when it only reads `tail` once a message.
//!
//! So a blocking `recv` claims the position at `head` without asking `tail`, and then waits on
//! that slot's own state, the line the message arrives on. It may have claimed a position no
//! sender has reached yet. If its wait runs out it gives the position up, in two steps, the
//! receiver's half of a Dekker pair: it marks the slot `ABANDON`, then reads `tail`.
//! - `tail` is past the position: a sender has claimed it and may have missed the mark. The
//!   receiver withdraws the mark and waits for that sender's write, which is under way.
//! - Otherwise no sender had claimed it, and any that does will see the mark (the sender's half:
//!   claim by CAS on `tail`, then read the slot's state before writing). The receiver confirms
//!   with `GONE`; such a sender waits for that verdict (or the withdrawal), takes its message
//!   back, marks the slot `SKIP` and sends it again at a later position.
//!
//! So a sender still marks its slot written with a plain store, not a read-modify-write: one
//! locked instruction a message (the `tail` CAS) instead of crossbeam's two. Per-sender order
//! holds: a sender's next message is claimed only after this one is placed. `head` may run
//! ahead of `tail`; every comparison of the two counts "`head` at or past `tail`" as empty.
//! The price: a receiver that keeps giving up (say `recv_timeout` with short deadlines on a
//! channel that stays empty) leaves one abandoned position per wait, up to the end of the
//! block, and each costs the sender that reaches it one more claim.
//!
//! Claiming ahead stays inside the block (never its last slot, whose reader must move `head` to
//! the next block, which may not exist yet), so the claimed slot is always live: a block is freed
//! only once every slot in it is finished, ours included. `try_recv` and `Select` keep
//! crossbeam's check of `tail`: they must not claim a position they will not wait for.
//!
//! # Block reuse
//!
//! While a channel has one `Sender`, a finished block is not freed but kept for the next block
//! the sender needs ([`FreeBlocks`]: whoever retires a block pushes it on a stack, the sender
//! takes the whole stack with one swap), up to [`KEEP_BYTES`] worth of them. Freeing hands the
//! block to the allocator on a receiving thread while the sending thread allocates the next
//! ones, and glibc's allocator serialises the two on the arena's lock: the sender's thread cache is
//! always empty (it never frees) and the receiver's always full (it never allocates). A receiver
//! that falls behind its sender sleeps on that lock and stays behind. `courier-bench chan
//! --full --case spsc_unbounded` (one sender and one receiver of a million messages): 26 ns a
//! message with reuse, 50 without, in the machine's fast mode; 40-42 and 62 in its slow mode
//! (std's channel 30-34 and 61-62).
//!
//! With several `Sender`s blocks are freed: their allocations spread over as many arenas, and
//! reuse measures worse there in the slow mode (a reused block is the one a receiver has just
//! read, hot in the other core's cache: `mpsc_unbounded` 52-54 ns a message against 48,
//! `mpmc_unbounded` up to 1.7x slower). The count is the number of handles, kept current by
//! `Sender`'s `clone` and `drop` (`senders_now`); one handle shared by reference between
//! threads still reuses, which costs only speed.

use std::mem::MaybeUninit;
use std::ptr;

use crossbeam_utils::CachePadded;

use crate::chan::backoff::Backoff;
use crate::chan::flavors::Token;
use crate::chan::wait_list::{loom_seqcst_fence, SyncWaitList};
use crate::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use crate::sync::UnsafeCell;

mod state;
mod wait;

/// Positions per block, counting the one phantom position used for "next block pending".
#[cfg(not(loom))]
const LAP: usize = 32;
/// A tiny block under loom so that models cross block boundaries in a few operations.
#[cfg(loom)]
const LAP: usize = 3;
/// Messages per block.
const BLOCK_CAP: usize = LAP - 1;
/// Position bits start here; below is the mark.
const SHIFT: usize = 1;
/// `tail.index` bit 0: the channel is disconnected.
const MARK_BIT: usize = 1;
/// `head.index` bit 0: `tail` is known to be in a later block than `head` (crossbeam's trick to
/// keep receivers off the tail's cache line while the queue is long).
const HAS_NEXT: usize = 1;

/// Bytes of retired blocks a channel keeps for reuse (32 blocks of `usize` messages); beyond
/// that a retired block is freed, so that a burst does not pin its memory for the channel's
/// life. At least one block is kept whatever its size: a channel of messages over ~500 bytes
/// keeps one block (31 messages' worth) while it has one `Sender`, which spares each block of
/// large messages an allocation that glibc would serve with `mmap` from 128 KiB up.
const KEEP_BYTES: usize = 16 * 1024;

/// Slot state bits. A slot is finished (its block may be freed) once it has `READ` (its
/// message taken) or `SKIP` (abandoned by its receiver, and its sender has moved on).
const WRITE: usize = 1;
const READ: usize = 2;
const DESTROY: usize = 4;
/// Its receiver, which claimed the position ahead, is giving it up (not final: see `GONE`).
const ABANDON: usize = 8;
/// With `ABANDON`: given up for good; the position's sender must send elsewhere.
const GONE: usize = 16;
/// Its sender found `GONE`, took the message back and will not touch the slot again.
const SKIP: usize = 32;

struct Slot<T> {
    msg: UnsafeCell<MaybeUninit<T>>,
    /// `WRITE | READ | DESTROY | ABANDON | GONE | SKIP` bits.
    state: AtomicUsize,
}

impl<T> Slot<T> {
    /// Sets the state to `WRITE` (a sender's last touch of its slot), erasing at most an
    /// `ABANDON` that its receiver is withdrawing (see `write_reserved`).
    #[inline]
    fn mark_written(&self) {
        // SYNC POINT: publishes the message. Partners: `Slot::wait_write` and the claimed-ahead
        // receiver's wait.
        #[cfg(not(loom))]
        self.state.store(WRITE, Ordering::Release);
        // The same value change as a read-modify-write: loom lets a plain store land between
        // the read and the write of another thread's read-modify-write (tokio-rs/loom#254, open
        // as of loom 0.7.3), a history no hardware allows, which here would erase a WRITE.
        #[cfg(loom)]
        self.state.swap(WRITE, Ordering::Release);
    }

    /// Waits for the sender that claimed this slot to finish writing it.
    #[inline]
    fn wait_write(&self) {
        // SYNC POINT: as in `wait_write_slow`.
        if self.state.load(Ordering::Acquire) & WRITE == 0 {
            self.wait_write_slow();
        }
    }

    /// [`wait_write`](Self::wait_write) once the message was not there yet: out of line, so
    /// that the receive path that finds it written makes no call.
    #[cold]
    #[inline(never)]
    fn wait_write_slow(&self) {
        let mut backoff = Backoff::new();
        // SYNC POINT: waits for WRITE. Partner: the Release store of WRITE in `mark_written`.
        while self.state.load(Ordering::Acquire) & WRITE == 0 {
            backoff.snooze();
        }
    }
}

struct Block<T> {
    next: AtomicPtr<Block<T>>,
    slots: [Slot<T>; BLOCK_CAP],
}

impl<T> Block<T> {
    #[cfg(not(loom))]
    fn new() -> Box<Block<T>> {
        // Zeroed memory comes straight from the allocator (calloc), without a per-slot loop.
        // (`Box::new_zeroed` would say it in one line, but is newer than our MSRV.)
        let layout = std::alloc::Layout::new::<Block<T>>();
        // SAFETY: `Block<T>` has a non-zero size (it holds atomics).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Block<T>;
        if raw.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `raw` was allocated with `Block<T>`'s layout, and all-zero bytes are a valid
        // `Block`: a null `next`, slot states of 0 (atomics are valid at any bit pattern of
        // their integer), and messages that are `MaybeUninit`.
        unsafe { Box::from_raw(raw) }
    }

    /// loom's atomics are not plain integers: build the block field by field.
    #[cfg(loom)]
    fn new() -> Box<Block<T>> {
        Box::new(Block {
            next: AtomicPtr::new(ptr::null_mut()),
            slots: std::array::from_fn(|_| Slot {
                msg: UnsafeCell::new(MaybeUninit::uninit()),
                state: AtomicUsize::new(0),
            }),
        })
    }

    /// Makes a retired block as [`Block::new`] leaves it: no successor, every slot state 0.
    /// (Safe: a `&mut Block` is one no one else references.)
    fn reset(&mut self) {
        #[cfg(not(loom))]
        {
            *self.next.get_mut() = ptr::null_mut();
            for slot in &mut self.slots {
                *slot.state.get_mut() = 0;
            }
        }
        // loom checks that these writes come after every other access to the block.
        #[cfg(loom)]
        {
            self.next.with_mut(|next| *next = ptr::null_mut());
            for slot in &mut self.slots {
                slot.state.with_mut(|state| *state = 0);
            }
        }
    }

    /// Waits for the sender that filled this block to link the next one.
    fn wait_next(&self) -> *mut Block<T> {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the Release store of `next` in `start_send`.
            let next = self.next.load(Ordering::Acquire);
            if !next.is_null() {
                return next;
            }
            backoff.snooze();
        }
    }

    /// Frees the block once slots `start..` are all finished (read, or abandoned and skipped),
    /// or hands the job to the first slot still busy: its reader, or its skipping sender.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `this` is a block of the channel that owns `free`, every slot of which below `start`
    ///   is finished;
    /// - every position of it has been claimed by a sender and a receiver.
    ///
    /// Once per block, so out of line: inlined, it made `read_reserved` too large to inline and
    /// its prologue save six registers per message.
    #[cold]
    #[inline(never)]
    unsafe fn destroy(this: *mut Block<T>, start: usize, free: &FreeBlocks<T>) {
        // The last slot is never marked: its reader is the one that starts destruction.
        for i in start..BLOCK_CAP - 1 {
            // SAFETY: the block is live until the loop decides to free it.
            let slot = unsafe { &(*this).slots[i] };
            // A sender marks WRITE with a plain store: let it land (or the slot be given up)
            // before marking anything. From then on every writer of the state uses a
            // read-modify-write, so no bit is lost.
            let mut state = slot.state.load(Ordering::Acquire);
            if state & (WRITE | GONE) == 0 {
                let mut backoff = Backoff::new();
                while state & (WRITE | GONE) == 0 {
                    backoff.snooze();
                    state = slot.state.load(Ordering::Acquire);
                }
            }
            // SYNC POINT: partners: the reader's `fetch_or(READ)` in `read_reserved` and the
            // sender's `fetch_or(SKIP)` in `take_back`: whoever comes last sees the other's bit.
            if state & (READ | SKIP) == 0
                && slot.state.fetch_or(DESTROY, Ordering::AcqRel) & (READ | SKIP) == 0
            {
                // That slot is busy; whoever finishes it continues from `i + 1`.
                return;
            }
        }
        // SAFETY: every slot is finished and no one touches the block any more.
        free.retire(unsafe { Box::from_raw(this) });
    }

    /// A sender found its slot abandoned: takes its message back and finishes the slot.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - it wrote its message into slot `offset` of live block `this`, and then found `GONE`;
    /// - it calls this once, with the `free` of the block's channel.
    #[cold]
    #[inline(never)]
    unsafe fn take_back(this: *mut Block<T>, offset: usize, free: &FreeBlocks<T>) -> T {
        // SAFETY: the slot is not finished (no SKIP yet), so the block is live.
        let slot = unsafe { &(*this).slots[offset] };
        // SAFETY: we wrote the message; its receiver gave the slot up without reading it.
        let msg = slot.msg.with(|p| unsafe { p.read().assume_init() });
        // SYNC POINT: finishes the slot; partner: `destroy`'s `fetch_or(DESTROY)`.
        if slot.state.fetch_or(SKIP, Ordering::AcqRel) & DESTROY != 0 {
            // SAFETY: destruction stopped at our slot and handed the rest to us.
            unsafe { Block::destroy(this, offset + 1, free) };
        }
        msg
    }
}

/// Retired blocks kept for reuse (see "Block reuse" in the module docs). Two stacks linked
/// through `Block::next`: `retired`, on which whoever retires a block pushes it, and `taken`,
/// where a sender that took all of `retired` leaves what it did not use. A stack is only ever
/// pushed one block at a time and emptied whole (a swap), so a push's CAS cannot be fooled by a
/// block that left and came back (ABA): whatever the top is, the new block goes on top of it.
struct FreeBlocks<T> {
    retired: AtomicPtr<Block<T>>,
    taken: AtomicPtr<Block<T>>,
    /// Blocks on both stacks (an estimate: it and the stacks are not updated together, which
    /// only moves the [`KEEP_BYTES`] bound by a block or two).
    kept: AtomicUsize,
    /// Blocks are reused: the channel has one `Sender` (see "Block reuse").
    reuse: AtomicBool,
}

impl<T> FreeBlocks<T> {
    /// Blocks kept: [`KEEP_BYTES`] of them, and at least one.
    const KEEP: usize = {
        let n = KEEP_BYTES / std::mem::size_of::<Block<T>>();
        if n == 0 {
            1
        } else {
            n
        }
    };

    fn new() -> Self {
        FreeBlocks {
            retired: AtomicPtr::new(ptr::null_mut()),
            taken: AtomicPtr::new(ptr::null_mut()),
            kept: AtomicUsize::new(0),
            reuse: AtomicBool::new(true),
        }
    }

    /// Keeps a finished block for a sender, or frees it if enough are kept.
    fn retire(&self, block: Box<Block<T>>) {
        if !self.reuse.load(Ordering::Relaxed) {
            drop(block);
            return;
        }
        if self.kept.fetch_add(1, Ordering::Relaxed) >= Self::KEEP {
            self.kept.fetch_sub(1, Ordering::Relaxed);
            drop(block);
            return;
        }
        let block = Box::into_raw(block);
        let mut top = self.retired.load(Ordering::Relaxed);
        loop {
            // SAFETY: the block is ours (from `Box::into_raw` above) until the CAS publishes it.
            unsafe { (*block).next.store(top, Ordering::Relaxed) };
            // SYNC POINT: publishes the block, and our last accesses to it, to the sender that
            // takes it. Partner: the Acquire swaps in `take`.
            match self.retired.compare_exchange_weak(
                top,
                block,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(t) => top = t,
            }
        }
    }

    /// A block for a sender: a retired one, reset, if any is kept; else a new one.
    fn take(&self) -> Box<Block<T>> {
        if !self.reuse.load(Ordering::Relaxed) {
            return Block::new();
        }
        // Look before swapping: a swap of an empty stack would still take its line.
        let mut list = ptr::null_mut();
        if !self.taken.load(Ordering::Relaxed).is_null() {
            // SYNC POINT: partner: the Release CAS below (another sender's leftovers).
            list = self.taken.swap(ptr::null_mut(), Ordering::Acquire);
        }
        if list.is_null() && !self.retired.load(Ordering::Relaxed).is_null() {
            // SYNC POINT: partner: the Release CAS in `retire`.
            list = self.retired.swap(ptr::null_mut(), Ordering::Acquire);
        }
        if list.is_null() {
            return Block::new();
        }
        self.kept.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the swap gave us the whole stack; its blocks are retired ones from
        // `Box::into_raw`, which no one else references.
        let mut block = unsafe { Box::from_raw(list) };
        let rest = block.next.load(Ordering::Relaxed);
        if !rest.is_null() {
            // SYNC POINT: hands the rest to the next sender. Partner: the Acquire swap above.
            if self
                .taken
                .compare_exchange(ptr::null_mut(), rest, Ordering::Release, Ordering::Relaxed)
                .is_err()
            {
                // Another sender left blocks there meanwhile (senders raced): free ours.
                // SAFETY: `rest` is the rest of the stack we took, ours alone.
                let freed = unsafe { Self::free_list(rest) };
                self.kept.fetch_sub(freed, Ordering::Relaxed);
            }
        }
        block.reset();
        block
    }

    /// Frees a stack of blocks; returns how many.
    ///
    /// # Safety
    /// The caller must own every block of the stack (taken with a swap, or at `Drop`).
    #[cold]
    unsafe fn free_list(mut list: *mut Block<T>) -> usize {
        let mut freed = 0;
        while !list.is_null() {
            // SAFETY: owned, from `Box::into_raw`, by the caller's contract.
            let block = unsafe { Box::from_raw(list) };
            list = block.next.load(Ordering::Relaxed);
            freed += 1;
        }
        freed
    }
}

impl<T> Drop for FreeBlocks<T> {
    fn drop(&mut self) {
        // SAFETY: exclusive access: both stacks are ours.
        unsafe {
            Self::free_list(self.retired.load(Ordering::Relaxed));
            Self::free_list(self.taken.load(Ordering::Relaxed));
        }
    }
}

/// `true` if position index `head` is at or past `tail` (the flag bits aside): nothing to
/// receive. Past: receivers claimed ahead of the senders.
#[inline(always)]
fn at_or_past(head: usize, tail: usize) -> bool {
    head >> SHIFT >= tail >> SHIFT
}

/// A position: an index and the block it is in.
struct Position<T> {
    index: AtomicUsize,
    block: AtomicPtr<Block<T>>,
}

/// A reserved slot.
#[derive(Debug)]
pub(crate) struct ListToken {
    /// The block, or null if the channel is disconnected.
    block: *const u8,
    /// Slot index in the block.
    offset: usize,
}

impl ListToken {
    pub(crate) fn is_reserved(&self) -> bool {
        !self.block.is_null()
    }
}

impl Default for ListToken {
    fn default() -> Self {
        ListToken {
            block: ptr::null(),
            offset: 0,
        }
    }
}

/// An unbounded channel.
pub(crate) struct Channel<T> {
    head: CachePadded<Position<T>>,
    tail: CachePadded<Position<T>>,
    /// Receivers waiting for a message (senders never wait).
    receivers: SyncWaitList,
    /// Retired blocks kept for the senders (on its own line: written once a block by each
    /// side).
    free: CachePadded<FreeBlocks<T>>,
}

/// What [`Channel::claim`] did.
enum Claim {
    /// Claimed a position that holds a message, or will once its sender's write lands.
    Filled,
    /// Claimed this position, which no sender may have reached yet.
    Ahead(usize),
    /// Claimed nothing.
    No,
}

/// What [`Channel::next_head`] found.
enum Next {
    /// The index `head` moves to.
    To(usize),
    Empty,
    Disconnected,
}

// ===== impl Channel: lock-free core =====

impl<T> Channel<T> {
    pub(crate) fn new() -> Self {
        Channel {
            head: CachePadded::new(Position {
                index: AtomicUsize::new(0),
                block: AtomicPtr::new(ptr::null_mut()),
            }),
            tail: CachePadded::new(Position {
                index: AtomicUsize::new(0),
                block: AtomicPtr::new(ptr::null_mut()),
            }),
            receivers: SyncWaitList::new(),
            free: CachePadded::new(FreeBlocks::new()),
        }
    }

    /// Reserves a position (for `Select`: the channel's own operations use a bare
    /// [`ListToken`], cheaper to build than a [`Token`]).
    pub(crate) fn start_send(&self, token: &mut Token) -> bool {
        self.reserve_send(&mut token.list)
    }

    /// Reserves a position. Always succeeds; a null block in the token means disconnected.
    ///
    /// The first pass of [`reserve_send_loop`](Self::reserve_send_loop) for the common case
    /// (a slot inside a block that is not its last, claimed at the first try), small enough
    /// to inline into `send`; anything else goes to the loop, which starts over. Out of line,
    /// the whole loop costs a call and its prologue a message. `seq_count`
    /// (`courier-bench/examples`: one thread sends 100,000 messages, then receives them; under
    /// callgrind) counts 135 instructions a message with this, `wait_write`'s inline check,
    /// `recv`'s single claim and unchecked slot indexing, 191 without them (crossbeam-channel
    /// 123, std 120); `courier-bench chan --case seq_unbounded` 13 ns a message against 21, the
    /// other unbounded cases 20-30% faster.
    #[inline]
    fn reserve_send(&self, token: &mut ListToken) -> bool {
        let tail = self.tail.index.load(Ordering::Acquire);
        let block = self.tail.block.load(Ordering::Acquire);
        let offset = (tail >> SHIFT) % LAP;
        if tail & MARK_BIT == 0 && offset + 1 < BLOCK_CAP && !block.is_null() {
            // SYNC POINT: as in `reserve_send_loop`.
            if self
                .tail
                .index
                .compare_exchange_weak(
                    tail,
                    tail + (1 << SHIFT),
                    Ordering::SeqCst,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                token.block = block as *const u8;
                token.offset = offset;
                return true;
            }
        }
        self.reserve_send_loop(token)
    }

    /// [`reserve_send`](Self::reserve_send) in every case.
    #[inline(never)]
    fn reserve_send_loop(&self, token: &mut ListToken) -> bool {
        let mut backoff = Backoff::contended();
        let mut tail = self.tail.index.load(Ordering::Acquire);
        let mut block = self.tail.block.load(Ordering::Acquire);
        let mut next_block: Option<Box<Block<T>>> = None;
        loop {
            if tail & MARK_BIT != 0 {
                token.block = ptr::null();
                return true;
            }
            let offset = (tail >> SHIFT) % LAP;
            if offset == BLOCK_CAP {
                // The claimer of the previous slot is installing the next block: wait.
                backoff.snooze();
                tail = self.tail.index.load(Ordering::Acquire);
                block = self.tail.block.load(Ordering::Acquire);
                continue;
            }
            // About to claim a block's last slot: allocate its successor outside the window.
            if offset + 1 == BLOCK_CAP && next_block.is_none() {
                next_block = Some(self.free.take());
            }
            if block.is_null() {
                // The very first message: install the first block.
                let new = Box::into_raw(Block::new());
                // SYNC POINT: publishes the block's initialised slots; partners: the Acquire
                // loads of `tail.block` and `head.block`.
                if self
                    .tail
                    .block
                    .compare_exchange(block, new, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
                {
                    self.head.block.store(new, Ordering::Release);
                    block = new;
                } else {
                    // SAFETY: `new` was never shared; take it back.
                    next_block = Some(unsafe { Box::from_raw(new) });
                    tail = self.tail.index.load(Ordering::Acquire);
                    block = self.tail.block.load(Ordering::Acquire);
                    continue;
                }
            }
            let new_tail = tail + (1 << SHIFT);
            // SYNC POINT: claims the position (SeqCst: ordered against the receivers' emptiness
            // checks). Partner: the fence and `tail` load of `next_head`.
            match self.tail.index.compare_exchange_weak(
                tail,
                new_tail,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if offset + 1 == BLOCK_CAP {
                        // We took the last slot: install the next block and skip the phantom
                        // position.
                        let next = Box::into_raw(next_block.take().expect("allocated above"));
                        // SYNC POINT: publishes the new block to senders (the index step is
                        // their signal); partners: their Acquire loads of `tail.*`. An RMW, not
                        // a store: a disconnect may have set MARK_BIT meanwhile (loom found it).
                        self.tail.block.store(next, Ordering::Release);
                        self.tail.index.fetch_add(1 << SHIFT, Ordering::Release);
                        // SAFETY: `block` stays allocated until all of its slots are read, and
                        // ours is not written yet.
                        unsafe { (*block).next.store(next, Ordering::Release) };
                    }
                    token.block = block as *const u8;
                    token.offset = offset;
                    return true;
                }
                Err(t) => {
                    tail = t;
                    block = self.tail.block.load(Ordering::Acquire);
                    backoff.spin();
                }
            }
        }
    }

    /// Completes a `start_send`.
    ///
    /// # Safety
    /// As for [`write_reserved`](Self::write_reserved).
    pub(crate) unsafe fn write(&self, token: &mut Token, msg: T) -> Result<(), T> {
        // SAFETY: forwarded from the caller.
        unsafe { self.write_reserved(&mut token.list, msg) }
    }

    /// Writes into the reserved slot and wakes a receiver. If the slot's receiver gave it up
    /// (claimed ahead and stopped waiting), reserves another position and writes there.
    /// `Err`: disconnected.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_send` of this channel;
    /// - it is written once.
    unsafe fn write_reserved(&self, token: &mut ListToken, mut msg: T) -> Result<(), T> {
        loop {
            if token.block.is_null() {
                return Err(msg);
            }
            let block = token.block as *mut Block<T>;
            debug_assert!(token.offset < BLOCK_CAP);
            // SAFETY: the block cannot be freed before this slot is finished, which needs our
            // WRITE (then a read) or our SKIP; `reserve_send` gives offsets below `BLOCK_CAP`
            // only (unchecked: the bounds check was 3 of the ~140 instructions a message).
            let slot = unsafe { (*block).slots.get_unchecked(token.offset) };
            // SAFETY: the `tail` CAS gave this sender the message cell exclusively (a receiver
            // touches it only after seeing WRITE).
            slot.msg
                .with_mut(|p| unsafe { p.write(MaybeUninit::new(msg)) });
            // SYNC POINT: the sender's half of the Dekker pair in `wait_claimed`: [the `tail` CAS
            // (SeqCst); this load (SeqCst)] against [its CAS to ABANDON; its `tail` load]. If
            // the receiver saw no claim, this load sees its mark.
            loom_seqcst_fence();
            let state = slot.state.load(Ordering::SeqCst);
            if state & ABANDON == 0 || Self::receiver_withdraws(slot) {
                // A plain store (not a read-modify-write: one locked instruction a message
                // fewer) may erase only an ABANDON its receiver is withdrawing (it saw our claim).
                // The destroyer waits for WRITE before it marks DESTROY.
                slot.mark_written();
                self.receivers.notify();
                return Ok(());
            }
            // SAFETY: the slot is GONE: the message is ours again, once.
            msg = unsafe { Block::take_back(block, token.offset, &self.free) };
            self.reserve_send(token);
        }
    }

    /// A sender found its slot marked `ABANDON`: waits for the receiver's verdict. `true`: the
    /// receiver withdrew (it saw this sender's claim) and waits for the message.
    #[cold]
    #[inline(never)]
    fn receiver_withdraws(slot: &Slot<T>) -> bool {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the receiver's `fetch_or(GONE)` or its withdrawing CAS.
            let state = slot.state.load(Ordering::Acquire);
            if state & GONE != 0 {
                return false;
            }
            if state & ABANDON == 0 {
                return true;
            }
            backoff.snooze();
        }
    }

    /// Reserves a message (for `Select`; see `start_send`).
    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        self.reserve_recv(&mut token.list)
    }

    /// Reserves a message. `false`: empty. `true` with a null block: empty and disconnected.
    ///
    /// The first pass of [`reserve_recv_loop`](Self::reserve_recv_loop) for the common cases
    /// (a message inside a block, or none), inlined into `try_recv`, `recv_slow` and `Select`'s
    /// calls; anything else (a block boundary, the first block, a lost race) goes to the loop,
    /// which starts over.
    #[inline]
    fn reserve_recv(&self, token: &mut ListToken) -> bool {
        let head = self.head.index.load(Ordering::Acquire);
        let block = self.head.block.load(Ordering::Acquire);
        let offset = (head >> SHIFT) % LAP;
        if offset + 1 < BLOCK_CAP && !block.is_null() {
            // Empty is answered here: a receiver polling an empty channel must not pay twice.
            let new_head = match self.next_head(head) {
                Next::To(new_head) => new_head,
                Next::Empty => return false,
                Next::Disconnected => {
                    token.block = ptr::null();
                    return true;
                }
            };
            // SYNC POINT: as in `reserve_recv_loop`.
            if self
                .head
                .index
                .compare_exchange_weak(head, new_head, Ordering::SeqCst, Ordering::Acquire)
                .is_ok()
            {
                token.block = block as *const u8;
                token.offset = offset;
                return true;
            }
        }
        self.reserve_recv_loop(token)
    }

    /// Where `head` moves when a receiver claims its position, or why it cannot.
    ///
    /// HAS_NEXT set: `tail` is in a later block, so this position holds a message (or will,
    /// once its sender writes): no need to read `tail`, the line every sender writes.
    #[inline(always)]
    fn next_head(&self, head: usize) -> Next {
        let mut new_head = head + (1 << SHIFT);
        if head & HAS_NEXT == 0 {
            // SYNC POINT: orders our view of `head` before the `tail` load; partner: the
            // SeqCst CAS on `tail.index` in `start_send` and the disconnect RMW.
            fence(Ordering::SeqCst);
            let tail = self.tail.index.load(Ordering::Relaxed);
            if at_or_past(head, tail) {
                return match tail & MARK_BIT != 0 {
                    true => Next::Disconnected,
                    false => Next::Empty,
                };
            }
            if (head >> SHIFT) / LAP != (tail >> SHIFT) / LAP {
                new_head |= HAS_NEXT;
            }
        }
        Next::To(new_head)
    }

    /// [`reserve_recv`](Self::reserve_recv) in every case.
    #[inline(never)]
    fn reserve_recv_loop(&self, token: &mut ListToken) -> bool {
        let mut backoff = Backoff::contended();
        let mut head = self.head.index.load(Ordering::Acquire);
        let mut block = self.head.block.load(Ordering::Acquire);
        loop {
            let offset = (head >> SHIFT) % LAP;
            if offset == BLOCK_CAP {
                // Another receiver is moving `head` to the next block: wait.
                backoff.snooze();
                head = self.head.index.load(Ordering::Acquire);
                block = self.head.block.load(Ordering::Acquire);
                continue;
            }
            let new_head = match self.next_head(head) {
                Next::To(new_head) => new_head,
                Next::Empty => return false,
                Next::Disconnected => {
                    token.block = ptr::null();
                    return true;
                }
            };
            if block.is_null() {
                // The first sender is installing the first block.
                backoff.snooze();
                head = self.head.index.load(Ordering::Acquire);
                block = self.head.block.load(Ordering::Acquire);
                continue;
            }
            match self.head.index.compare_exchange_weak(
                head,
                new_head,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if offset + 1 == BLOCK_CAP {
                        // We took the block's last slot: move `head` to the next block.
                        // SAFETY: the block is live until its last slot (ours) is read.
                        let next = unsafe { (*block).wait_next() };
                        let mut next_index = (new_head & !HAS_NEXT).wrapping_add(1 << SHIFT);
                        // SAFETY: `next` was linked by a sender; blocks are freed only after
                        // `head` has left them.
                        if !unsafe { (*next).next.load(Ordering::Relaxed) }.is_null() {
                            next_index |= HAS_NEXT;
                        }
                        self.head.block.store(next, Ordering::Release);
                        // SYNC POINT: the index store releases the block store above to the
                        // other receivers' Acquire loads of `head.index`.
                        self.head.index.store(next_index, Ordering::Release);
                    }
                    token.block = block as *const u8;
                    token.offset = offset;
                    return true;
                }
                Err(h) => {
                    head = h;
                    block = self.head.block.load(Ordering::Acquire);
                    backoff.spin();
                }
            }
        }
    }

    /// Completes a `start_recv`.
    ///
    /// # Safety
    /// As for [`read_reserved`](Self::read_reserved).
    pub(crate) unsafe fn read(&self, token: &mut Token) -> Result<T, ()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.read_reserved(&token.list) }
    }

    /// Reads the reserved message; frees the block when it was the last one in it.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_recv` of this channel that returned `true`, or by a
    ///   `claim` that returned [`Claim::Filled`], or [`Claim::Ahead`] whose position
    ///   `wait_claimed` then saw written;
    /// - it is read once.
    #[inline]
    unsafe fn read_reserved(&self, token: &ListToken) -> Result<T, ()> {
        if token.block.is_null() {
            return Err(());
        }
        let block = token.block as *mut Block<T>;
        let offset = token.offset;
        debug_assert!(offset < BLOCK_CAP);
        // SAFETY: the block is live until this slot is marked READ (below); the claims give
        // offsets below `BLOCK_CAP` only.
        let slot = unsafe { (*block).slots.get_unchecked(offset) };
        slot.wait_write();
        // SAFETY: WRITE is set, so the message is initialised; the `head` CAS made us its only
        // reader.
        let msg = slot.msg.with(|p| unsafe { p.read().assume_init() });
        if offset + 1 == BLOCK_CAP {
            // SAFETY: the last slot's reader starts the block's destruction; no one claims
            // slots of it any more (`head` moved to the next block).
            unsafe { Block::destroy(block, 0, &self.free) };
        } else if slot.state.fetch_or(READ, Ordering::AcqRel) & DESTROY != 0 {
            // SAFETY: destruction stopped at our slot and handed the rest to us.
            unsafe { Block::destroy(block, offset + 1, &self.free) };
        }
        Ok(msg)
    }
}

impl<T> Drop for Channel<T> {
    fn drop(&mut self) {
        // Exclusive access: every sender has finished, so nothing below waits.
        self.discard_all_messages();
    }
}

// SAFETY: messages move between threads through the channel (`T: Send`); slots are accessed
// under the claim/WRITE/READ protocol above.
unsafe impl<T: Send> Send for Channel<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Channel<T> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Blocks on one of `FreeBlocks`'s stacks.
    fn stack_len<T>(stack: &AtomicPtr<Block<T>>) -> usize {
        let mut n = 0;
        let mut block = stack.load(Ordering::Acquire);
        while !block.is_null() {
            n += 1;
            // SAFETY: the test's single thread owns the channel; kept blocks stay allocated
            // until taken or freed, neither of which runs during this walk.
            block = unsafe { (*block).next.load(Ordering::Acquire) };
        }
        n
    }

    #[test]
    fn the_blocks_kept_for_reuse_stay_within_the_cap() {
        let chan = Channel::<u64>::new();
        let send = |n: usize| (0..n).for_each(|i| chan.send(i as u64, None).unwrap());
        let recv = |n: usize| (0..n).for_each(|_| assert!(chan.try_recv().is_ok()));
        // 80 blocks queued; the first 40 retired (the cap's worth kept); one block sent, which
        // takes the kept stack and leaves the rest aside; then the other 40 retired while those
        // wait there.
        send(80 * BLOCK_CAP);
        recv(40 * BLOCK_CAP);
        send(BLOCK_CAP);
        recv(41 * BLOCK_CAP);
        let kept = stack_len(&chan.free.retired) + stack_len(&chan.free.taken);
        let cap = FreeBlocks::<u64>::KEEP;
        assert!((1..=cap).contains(&kept), "{kept} blocks kept, cap {cap}");
        assert_eq!(chan.free.kept.load(Ordering::Relaxed), kept);
    }
}
