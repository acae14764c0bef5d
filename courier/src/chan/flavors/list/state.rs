//! The channel's length, disconnection, the discarding of what is left when
//! the last receiver goes, and its registration with `Select`.

use std::ptr;

use super::{at_or_past, Channel, BLOCK_CAP, GONE, HAS_NEXT, LAP, MARK_BIT, SHIFT, SKIP};
use crate::chan::backoff::Backoff;
use crate::chan::context::{Context, Operation};
use crate::sync::atomic::Ordering;

impl<T> Channel<T> {
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
                if at_or_past(head, tail) {
                    // Receivers claimed ahead of the senders.
                    return 0;
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
        at_or_past(head, tail)
    }

    pub(crate) fn is_disconnected(&self) -> bool {
        self.tail.index.load(Ordering::SeqCst) & MARK_BIT != 0
    }

    /// The senders are gone: mark and wake the receivers. `true` if this call did it.
    pub(crate) fn disconnect_senders(&self) -> bool {
        // SYNC POINT: RMW on `tail.index`; partners: the fenced `tail` load of `next_head`, the
        // re-check after registering, and the wait list's lock.
        let tail = self.tail.index.fetch_or(MARK_BIT, Ordering::SeqCst);
        if tail & MARK_BIT == 0 {
            self.receivers.disconnect();
            true
        } else {
            false
        }
    }

    /// The number of `Sender`s changed to `senders`: reuse blocks while there is one (see
    /// "Block reuse"). Concurrent clones and drops may leave the wrong answer for a while,
    /// which costs only speed.
    pub(crate) fn senders_now(&self, senders: usize) {
        let reuse = senders == 1;
        if self.free.reuse.load(Ordering::Relaxed) != reuse {
            self.free.reuse.store(reuse, Ordering::Relaxed);
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
    ///
    /// Also the channel's `Drop` (where nothing waits any more).
    ///
    /// A message whose `Drop` panics does not stop the others from being dropped (as with a
    /// `Vec`; a second panic aborts): `head` is kept current, each message is moved out of its
    /// slot and `head` passes it before it is dropped, and a guard finishes the walk from there.
    pub(super) fn discard_all_messages(&self) {
        /// On unwind, drops the messages after the one that panicked.
        struct Finish<'a, T>(&'a Channel<T>);
        impl<T> Drop for Finish<'_, T> {
            fn drop(&mut self) {
                self.0.discard_from_head();
            }
        }
        let finish = Finish(self);
        self.discard_from_head();
        std::mem::forget(finish);
    }

    /// [`discard_all_messages`](Self::discard_all_messages) from the current `head`.
    fn discard_from_head(&self) {
        let mut backoff = Backoff::new();
        let mut tail = self.tail.index.load(Ordering::Acquire);
        while (tail >> SHIFT) % LAP == BLOCK_CAP {
            // A sender is installing the next block: let it finish.
            backoff.snooze();
            tail = self.tail.index.load(Ordering::Acquire);
        }
        let mut head = self.head.index.load(Ordering::Acquire);
        let mut block = self.head.block.load(Ordering::Acquire);
        if !at_or_past(head, tail) {
            // There are messages, so the first block exists or is being installed.
            while block.is_null() {
                backoff.snooze();
                block = self.head.block.load(Ordering::Acquire);
            }
        }
        if !block.is_null() {
            // Below `head`, every slot is finished except abandoned ones whose senders may still
            // be taking their messages back (those below `tail`): wait for them.
            let lap = |p: usize| (p >> SHIFT) / LAP;
            let off = |p: usize| (p >> SHIFT) % LAP;
            let claimed = match lap(tail) == lap(head) {
                true => off(head).min(off(tail)),
                false => off(head),
            };
            for i in 0..claimed.min(BLOCK_CAP) {
                // SAFETY: `block` is live: it is `head`'s, whose last slot no one has read.
                let slot = unsafe { &(*block).slots[i] };
                // SYNC POINT: partner: the sender's `fetch_or(SKIP)` in `take_back`.
                while slot.state.load(Ordering::Acquire) & (GONE | SKIP) == GONE {
                    backoff.snooze();
                }
            }
        }
        while !at_or_past(head, tail) {
            let offset = (head >> SHIFT) % LAP;
            head = head.wrapping_add(1 << SHIFT);
            if offset < BLOCK_CAP {
                // SAFETY: `block` is the live block holding the position.
                let slot = unsafe { &(*block).slots[offset] };
                slot.wait_write();
                // SAFETY: written (WRITE seen) and never read: moved out once, and `head`
                // passes it before the message is dropped.
                let msg = slot.msg.with(|p| unsafe { p.read().assume_init() });
                self.head.index.store(head, Ordering::Relaxed);
                drop(msg);
            } else {
                // SAFETY: every message of `block` was taken above; move on and free it.
                let next = unsafe { (*block).wait_next() };
                self.head.block.store(next, Ordering::Relaxed);
                self.head.index.store(head, Ordering::Relaxed);
                // SAFETY: as above; no one else references the block.
                drop(unsafe { Box::from_raw(block) });
                block = next;
            }
        }
        self.head.block.store(ptr::null_mut(), Ordering::Relaxed);
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
