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
//! wait is short). A receiver claims with one CAS on `head.index`, and waits (spinning) only if
//! the sender of that slot has claimed it but not yet written (`WRITE` bit). Blocks are freed by
//! the last reader: each slot has `READ` and `DESTROY` bits so that whichever of "block retired"
//! and "slot read" comes last frees it.
//!
//! Unlike crossbeam-channel's list, a sender marks its slot written with a plain store, not a
//! `fetch_or`: nothing else writes a slot's state before `WRITE` is set, because its reader
//! waits for `WRITE` and so does the block's destroyer before it marks `DESTROY`. One locked
//! read-modify-write less per message (three instead of four); the cost is that a destroyer
//! may wait for a sender that claimed a slot and was preempted before writing, which that
//! slot's own reader must wait for anyway.

use std::mem::MaybeUninit;
use std::ptr;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::chan::backoff::Backoff;
use crate::chan::err::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::chan::flavors::Token;
use crate::chan::waiter::{Context, Operation, SyncWaitList};
use crate::sync::atomic::{fence, AtomicPtr, AtomicUsize, Ordering};
use crate::sync::UnsafeCell;

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

/// Slot state bits.
const WRITE: usize = 1;
const READ: usize = 2;
const DESTROY: usize = 4;

struct Slot<T> {
    msg: UnsafeCell<MaybeUninit<T>>,
    /// `WRITE | READ | DESTROY` bits.
    state: AtomicUsize,
}

impl<T> Slot<T> {
    /// Waits for the sender that claimed this slot to finish writing it.
    fn wait_write(&self) {
        let mut backoff = Backoff::new();
        // SYNC POINT: waits for WRITE. Partner: the Release store of WRITE in `write_reserved`.
        while self.state.load(Ordering::Acquire) & WRITE == 0 {
            backoff.snooze(true);
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

    /// Waits for the sender that filled this block to link the next one.
    fn wait_next(&self) -> *mut Block<T> {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the Release store of `next` in `start_send`.
            let next = self.next.load(Ordering::Acquire);
            if !next.is_null() {
                return next;
            }
            backoff.snooze(true);
        }
    }

    /// Frees the block once slots `start..` are all read (their readers are done with it), or
    /// hands the job to the first reader still busy.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `this` is a block every slot of which below `start` has been read;
    /// - no one will claim a slot of it any more.
    ///
    /// Once per block, so out of line: inlined, it made `read_reserved` too large to inline and
    /// its prologue save six registers per message.
    #[cold]
    #[inline(never)]
    unsafe fn destroy(this: *mut Block<T>, start: usize) {
        // The last slot is never marked: its reader is the one that starts destruction.
        for i in start..BLOCK_CAP - 1 {
            // SAFETY: the block is live until the loop decides to free it.
            let slot = unsafe { &(*this).slots[i] };
            // Every slot of a retired block is claimed; its sender's plain store of WRITE must
            // land before DESTROY is or'ed in, or it would erase it (see the module docs).
            slot.wait_write();
            // SYNC POINT: partner: the reader's `fetch_or(READ)` in `read`: whoever comes last
            // sees the other's bit.
            if slot.state.load(Ordering::Acquire) & READ == 0
                && slot.state.fetch_or(DESTROY, Ordering::AcqRel) & READ == 0
            {
                // That slot's reader is still busy; it will continue from `i + 1`.
                return;
            }
        }
        // SAFETY: every slot has been read and no reader touches the block any more.
        drop(unsafe { Box::from_raw(this) });
    }
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
        }
    }

    /// Reserves a position (for `Select`: the channel's own operations use a bare
    /// [`ListToken`], cheaper to build than a [`Token`]).
    pub(crate) fn start_send(&self, token: &mut Token) -> bool {
        self.reserve_send(&mut token.list)
    }

    /// Reserves a position. Always succeeds; a null block in the token means disconnected.
    fn reserve_send(&self, token: &mut ListToken) -> bool {
        let mut backoff = Backoff::new();
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
                backoff.snooze(true);
                tail = self.tail.index.load(Ordering::Acquire);
                block = self.tail.block.load(Ordering::Acquire);
                continue;
            }
            // About to claim a block's last slot: allocate its successor outside the window.
            if offset + 1 == BLOCK_CAP && next_block.is_none() {
                next_block = Some(Block::new());
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
            // checks). Partner: `start_recv`'s fence + `tail` load.
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
        unsafe { self.write_reserved(&token.list, msg) }
    }

    /// Writes into the reserved slot and wakes a receiver.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_send` of this channel;
    /// - it is written once.
    unsafe fn write_reserved(&self, token: &ListToken, msg: T) -> Result<(), T> {
        if token.block.is_null() {
            return Err(msg);
        }
        let block = token.block as *mut Block<T>;
        // SAFETY: the block cannot be freed before this slot is read, which waits for WRITE.
        let slot = unsafe { &(*block).slots[token.offset] };
        // SAFETY: the `tail` CAS gave this sender the slot exclusively until WRITE is set.
        slot.msg
            .with_mut(|p| unsafe { p.write(MaybeUninit::new(msg)) });
        // SYNC POINT: publishes the message. Partner: `Slot::wait_write` (the reader's, and the
        // destroyer's before it marks DESTROY: until this store, no one else writes the state,
        // so a plain store loses no bit).
        if cfg!(any(loom, debug_assertions)) {
            // The invariant that makes the plain store below lose no bit.
            assert_eq!(
                slot.state.load(Ordering::Relaxed),
                0,
                "a slot marked before its write"
            );
        }
        slot.state.store(WRITE, Ordering::Release);
        self.receivers.notify();
        Ok(())
    }

    /// Reserves a message (for `Select`; see `start_send`).
    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        self.reserve_recv(&mut token.list)
    }

    /// Reserves a message. `false`: empty. `true` with a null block: empty and disconnected.
    ///
    /// The first pass of [`reserve_recv_loop`](Self::reserve_recv_loop) for the common cases
    /// (a message inside a block, or none), small enough to inline into `recv`; anything else
    /// (a block boundary, the first block, a lost race) goes to the loop, which starts over.
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
            if head >> SHIFT == tail >> SHIFT {
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
        let mut backoff = Backoff::new();
        let mut head = self.head.index.load(Ordering::Acquire);
        let mut block = self.head.block.load(Ordering::Acquire);
        loop {
            let offset = (head >> SHIFT) % LAP;
            if offset == BLOCK_CAP {
                // Another receiver is moving `head` to the next block: wait.
                backoff.snooze(true);
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
                backoff.snooze(true);
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
        let got = unsafe { self.read_reserved(&token.list) };
        // A select woken for this passes on, now that nothing is held.
        if token.waited {
            self.pass_on_recv();
        }
        got
    }

    /// Reads the reserved message; frees the block when it was the last one in it.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_recv` of this channel that returned `true`;
    /// - it is read once.
    #[inline]
    unsafe fn read_reserved(&self, token: &ListToken) -> Result<T, ()> {
        if token.block.is_null() {
            return Err(());
        }
        let block = token.block as *mut Block<T>;
        let offset = token.offset;
        // SAFETY: the block is live until this slot is marked READ (below).
        let slot = unsafe { &(*block).slots[offset] };
        slot.wait_write();
        // SAFETY: WRITE is set, so the message is initialised; the `head` CAS made us its only
        // reader.
        let msg = slot.msg.with(|p| unsafe { p.read().assume_init() });
        if offset + 1 == BLOCK_CAP {
            // SAFETY: the last slot's reader starts the block's destruction; no one claims
            // slots of it any more (`head` moved to the next block).
            unsafe { Block::destroy(block, 0) };
        } else if slot.state.fetch_or(READ, Ordering::AcqRel) & DESTROY != 0 {
            // SAFETY: destruction stopped at our slot and handed the rest to us.
            unsafe { Block::destroy(block, offset + 1) };
        }
        Ok(msg)
    }

    // ===== impl Channel: try, blocking =====

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.send(msg, None).map_err(|e| match e {
            SendTimeoutError::Disconnected(m) => TrySendError::Disconnected(m),
            SendTimeoutError::Timeout(_) => unreachable!("an unbounded send never waits"),
        })
    }

    pub(crate) fn send(
        &self,
        msg: T,
        _deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        let token = &mut ListToken::default();
        self.reserve_send(token);
        // SAFETY: `reserve_send` always succeeds, once for this token.
        unsafe { self.write_reserved(token, msg) }.map_err(SendTimeoutError::Disconnected)
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let token = &mut ListToken::default();
        if self.reserve_recv(token) {
            // SAFETY: `reserve_recv` returned true for this token.
            unsafe { self.read_reserved(token) }.map_err(|()| TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }

    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let token = &mut ListToken::default();
        // Polled or woken: pass on after completing (see `SyncWaitList::pass_on`).
        let mut slow = false;
        loop {
            // Fast path, then a spin while a sender is about to deliver.
            let ready = self.reserve_recv(token) || {
                slow = true;
                self.receivers
                    .poll_spinning_first(
                        || self.reserve_recv(token).then_some(()),
                        || !self.is_empty(),
                        |_| {},
                    )
                    .is_some()
            };
            if ready {
                // SAFETY: `reserve_recv` returned true for this token.
                let got = unsafe { self.read_reserved(token) };
                if slow {
                    self.pass_on_recv();
                }
                return got.map_err(|()| RecvTimeoutError::Disconnected);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(RecvTimeoutError::Timeout);
                }
            }
            self.receivers
                .park_unless(Operation::hook(token), deadline, || {
                    !self.is_empty() || self.is_disconnected()
                });
        }
    }

    // ===== `Select::ready` support =====

    pub(crate) fn watch_recv(&self, oper: Operation, cx: &Context) -> bool {
        self.receivers.watch(oper, cx);
        !self.is_empty() || self.is_disconnected()
    }

    pub(crate) fn unwatch_recv(&self, oper: Operation) {
        self.receivers.unwatch(oper);
    }

    /// After a polling or woken receiver's success: see `SyncWaitList::pass_on`.
    pub(crate) fn pass_on_recv(&self) {
        self.receivers.pass_on(|| !self.is_empty(), |_| {});
    }

    // ===== impl Channel: state =====

    /// The number of messages in the channel (a snapshot).
    pub(crate) fn len(&self) -> usize {
        loop {
            let mut tail = self.tail.index.load(Ordering::SeqCst);
            let mut head = self.head.index.load(Ordering::SeqCst);
            if self.tail.index.load(Ordering::SeqCst) == tail {
                tail &= !MARK_BIT;
                head &= !HAS_NEXT;
                // Count phantom positions as the next block's first slot.
                if (tail >> SHIFT) % LAP == BLOCK_CAP {
                    tail = tail.wrapping_add(1 << SHIFT);
                }
                if (head >> SHIFT) % LAP == BLOCK_CAP {
                    head = head.wrapping_add(1 << SHIFT);
                }
                let lap = |p: usize| (p >> SHIFT) / LAP;
                let off = |p: usize| (p >> SHIFT) % LAP;
                return (lap(tail) - lap(head)) * BLOCK_CAP + off(tail) - off(head);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        let head = self.head.index.load(Ordering::SeqCst);
        let tail = self.tail.index.load(Ordering::SeqCst);
        head >> SHIFT == tail >> SHIFT
    }

    pub(crate) fn is_disconnected(&self) -> bool {
        self.tail.index.load(Ordering::SeqCst) & MARK_BIT != 0
    }

    /// The senders are gone: mark and wake the receivers. `true` if this call did it.
    pub(crate) fn disconnect_senders(&self) -> bool {
        // SYNC POINT: RMW on `tail.index`; partners: `start_recv`'s fenced `tail` load, the
        // re-check after registering, and the wait list's lock.
        let tail = self.tail.index.fetch_or(MARK_BIT, Ordering::SeqCst);
        if tail & MARK_BIT == 0 {
            self.receivers.disconnect();
            true
        } else {
            false
        }
    }

    /// The receivers are gone: mark, and drop every message now (no one will read them).
    pub(crate) fn disconnect_receivers(&self) -> bool {
        let tail = self.tail.index.fetch_or(MARK_BIT, Ordering::SeqCst);
        if tail & MARK_BIT == 0 {
            self.discard_all_messages();
            true
        } else {
            false
        }
    }

    /// Drops every message. Called by the last receiver after marking: no receiver runs
    /// concurrently, and no sender claims a position any more (the mark stops them), but
    /// senders that claimed before the mark may still be writing.
    fn discard_all_messages(&self) {
        let mut backoff = Backoff::new();
        let mut tail = self.tail.index.load(Ordering::Acquire);
        while (tail >> SHIFT) % LAP == BLOCK_CAP {
            // A sender is installing the next block: let it finish.
            backoff.snooze(true);
            tail = self.tail.index.load(Ordering::Acquire);
        }
        let mut head = self.head.index.load(Ordering::Acquire);
        let mut block = self.head.block.swap(ptr::null_mut(), Ordering::AcqRel);
        if head >> SHIFT != tail >> SHIFT {
            // There are messages, so the first block exists or is being installed.
            while block.is_null() {
                backoff.snooze(true);
                block = self.head.block.swap(ptr::null_mut(), Ordering::AcqRel);
            }
        }
        while head >> SHIFT != tail >> SHIFT {
            let offset = (head >> SHIFT) % LAP;
            if offset < BLOCK_CAP {
                // SAFETY: `block` is the live block holding position `head`.
                let slot = unsafe { &(*block).slots[offset] };
                slot.wait_write();
                // SAFETY: written (WRITE seen), never read: drop it once.
                slot.msg.with_mut(|p| unsafe { (*p).assume_init_drop() });
            } else {
                // SAFETY: every slot of `block` was dropped above; move on and free it.
                let next = unsafe { (*block).wait_next() };
                // SAFETY: as above; no one else references the block.
                drop(unsafe { Box::from_raw(block) });
                block = next;
            }
            head = head.wrapping_add(1 << SHIFT);
        }
        if !block.is_null() {
            // SAFETY: the last (partially used) block; nothing references it any more.
            drop(unsafe { Box::from_raw(block) });
        }
        self.head.index.store(head & !HAS_NEXT, Ordering::Release);
    }

    // ===== select support =====

    pub(crate) fn register_recv(&self, oper: Operation, cx: &Context) -> bool {
        self.receivers.register(oper, cx);
        !self.is_empty() || self.is_disconnected()
    }

    pub(crate) fn unregister_recv(&self, oper: Operation) {
        self.receivers.unregister(oper);
    }
}

impl<T> Drop for Channel<T> {
    fn drop(&mut self) {
        // Exclusive access: drop what is left, free the blocks.
        let mut head = self.head.index.load(Ordering::Relaxed) & !HAS_NEXT;
        let tail = self.tail.index.load(Ordering::Relaxed) & !MARK_BIT;
        let mut block = self.head.block.load(Ordering::Relaxed);
        while head != tail {
            let offset = (head >> SHIFT) % LAP;
            if offset < BLOCK_CAP {
                // SAFETY: positions in `head..tail` hold written, unread messages (every
                // sender finished: we are the last handle).
                unsafe {
                    (*block).slots[offset]
                        .msg
                        .with_mut(|p| (*p).assume_init_drop())
                };
            } else {
                // SAFETY: the block is exhausted; its successor is linked (its last slot's
                // sender linked it before finishing).
                let next = unsafe { (*block).next.load(Ordering::Relaxed) };
                // SAFETY: no one references the block any more.
                drop(unsafe { Box::from_raw(block) });
                block = next;
            }
            head = head.wrapping_add(1 << SHIFT);
        }
        if !block.is_null() {
            // SAFETY: the last block; no one references it any more.
            drop(unsafe { Box::from_raw(block) });
        }
    }
}

// SAFETY: messages move between threads through the channel (`T: Send`); slots are accessed
// under the claim/WRITE/READ protocol above.
unsafe impl<T: Send> Send for Channel<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Channel<T> {}
