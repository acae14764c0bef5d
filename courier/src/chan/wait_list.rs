//! The tasks waiting on one side of a channel, and the blocking protocol every flavor follows:
//! register, re-check, park; claim, hand off, unpark.
//!
//! # The protocol
//!
//! A blocked operation is one [`Context`] (a claim word, a hand-off slot and a parker) plus one
//! [`Entry`] per wait list it is queued on (several for a `Select`). It goes:
//!
//! 1. **register**: push an `Entry` on the channel's wait list, under the list's lock;
//! 2. **re-check**: if the channel became ready meanwhile, claim *itself* (`WAITING -> ABORTED`)
//!    so the wait below returns at once; the [`SyncWaitList`] fences make sure that a peer that
//!    changed the state either sees the entry or is seen by the re-check (a Dekker pair);
//! 3. **park**: [`Context::wait_until`] parks until the claim word changes (or the deadline
//!    passes, in which case it claims itself `ABORTED`). Before registering, an operation spins
//!    (and on some channel sides polls between yields) on the channel; a rendezvous waiter, a
//!    `Select` and a waiter of a capacity-one channel poll their claim word after registering
//!    instead (`backoff::spin_then_yield`).
//!
//! A peer that makes the channel ready pops one entry of *another* task, claims it with one CAS
//! (`WAITING -> Operation(op)`; a failed CAS means a `Select` was won elsewhere, so it tries the
//! next entry), and unparks it **after** releasing the list lock (Go's `goready` after
//! `unlock(&c.lock)`). Disconnection claims every entry with `DISCONNECTED`. An entry that was
//! not claimed by a peer is removed by its owner before the operation returns.
//!
//! This is Go's `sudog`/`selectDone` and crossbeam-channel's `Waker`/`SyncWaker`
//! (`crossbeam-channel/src/waker.rs`).

use std::collections::BTreeMap;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::backoff::{spin_adaptively, spin_then_yield, Backoff, Pollers};
use super::context::{
    current_may_spin, current_may_yield, current_task_id, Context, Operation, Selected,
};
#[cfg(loom)]
use crate::sync::atomic::fence;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::Mutex;

// ===== WaitList =====

/// One registered operation of one task.
pub(crate) struct Entry {
    /// Which of the task's operations this is.
    pub(crate) oper: Operation,
    /// Rendezvous hand-off packet (null for buffered flavors).
    pub(crate) packet: *mut (),
    /// The waiting task.
    pub(crate) cx: Context,
}

/// The tasks waiting on one side of one channel. Not synchronised: see [`SyncWaitList`], or the
/// rendezvous flavor's lock.
pub(crate) struct WaitList {
    entries: Vec<Entry>,
    /// `Select::ready` callers watching this side: woken by every change that may make it
    /// ready, never handed an operation (so they take no wake-up from `entries`).
    observers: Vec<Entry>,
    /// Entries a disconnection claimed, until each waiter takes its own back
    /// ([`unregister`](Self::unregister)): by key, so that a million waiters woken at once
    /// take theirs back in `O(log n)` each rather than each scanning (and shifting) `entries`.
    disconnected: BTreeMap<Operation, Entry>,
}

impl WaitList {
    pub(crate) const fn new() -> WaitList {
        WaitList {
            entries: Vec::new(),
            observers: Vec::new(),
            disconnected: BTreeMap::new(),
        }
    }

    /// Adds an observer: `cx` is claimed for `oper` at the next change of this side.
    pub(crate) fn watch(&mut self, oper: Operation, cx: &Context) {
        self.observers.push(Entry {
            oper,
            packet: std::ptr::null_mut(),
            cx: cx.clone(),
        });
    }

    /// Removes the observer of `oper`, if no change has woken it yet.
    pub(crate) fn unwatch(&mut self, oper: Operation) {
        if let Some(i) = self.observers.iter().position(|e| e.oper == oper) {
            self.observers.remove(i);
        }
    }

    /// Claims every observer for its operation and removes it; the caller unparks the returned
    /// contexts (after releasing any lock). Allocates nothing when nobody watches.
    pub(crate) fn take_observers(&mut self) -> Vec<Context> {
        if self.observers.is_empty() {
            return Vec::new();
        }
        self.observers
            .drain(..)
            .filter(|e| e.cx.try_select(Selected::Operation(e.oper)).is_ok())
            .map(|e| e.cx)
            .collect()
    }

    #[inline]
    pub(crate) fn register(&mut self, oper: Operation, cx: &Context) {
        self.register_with_packet(oper, std::ptr::null_mut(), cx);
    }

    #[inline]
    pub(crate) fn register_with_packet(&mut self, oper: Operation, packet: *mut (), cx: &Context) {
        self.entries.push(Entry {
            oper,
            packet,
            cx: cx.clone(),
        });
    }

    /// Removes the entry of `oper`, if a peer has not already taken it.
    pub(crate) fn unregister(&mut self, oper: Operation) -> Option<Entry> {
        match self.entries.iter().position(|e| e.oper == oper) {
            Some(i) => Some(self.entries.remove(i)),
            None if self.disconnected.is_empty() => None,
            None => self.disconnected.remove(&oper),
        }
    }

    /// Claims the first (oldest) waiting entry of another task for its operation, removes it and
    /// returns it, packet address stored; the caller unparks `entry.cx` once it has done its
    /// part (and released any lock).
    pub(crate) fn try_select(&mut self) -> Option<Entry> {
        if self.entries.is_empty() {
            return None;
        }
        let me = current_task_id();
        let i = self.entries.iter().position(|e| {
            e.cx.task_id() != me && e.cx.try_select(Selected::Operation(e.oper)).is_ok()
        })?;
        let entry = self.entries.remove(i);
        entry.cx.store_packet(entry.packet);
        Some(entry)
    }

    /// Claims every waiting entry for its operation, and every observer, and removes them; the
    /// caller unparks the returned contexts. For a change that lets every waiter proceed, each
    /// to find out for itself what it gets (a oneshot's message: one takes it, the others find
    /// it taken).
    pub(crate) fn select_all(&mut self) -> Vec<Context> {
        let mut woken: Vec<Context> = self
            .entries
            .drain(..)
            .filter(|e| e.cx.try_select(Selected::Operation(e.oper)).is_ok())
            .map(|e| e.cx)
            .collect();
        woken.extend(self.take_observers());
        woken
    }

    /// Is there a waiting entry of another task that `try_select` could claim?
    pub(crate) fn can_select(&self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let me = current_task_id();
        self.entries
            .iter()
            .any(|e| e.cx.task_id() != me && e.cx.selected() == Selected::Waiting)
    }

    /// Claims every entry with `Disconnected` and returns the contexts to unpark. The claimed
    /// entries move to `disconnected`, where each owner takes its own back (`unregister`).
    pub(crate) fn disconnect(&mut self) -> Vec<Context> {
        let mut woken = Vec::new();
        let mut still = Vec::new();
        for entry in self.entries.drain(..) {
            if entry.cx.try_select(Selected::Disconnected).is_ok() {
                woken.push(entry.cx.clone());
                self.disconnected.insert(entry.oper, entry);
            } else {
                // Claimed by another operation (a select's): its task unregisters it.
                still.push(entry);
            }
        }
        self.entries = still;
        woken.extend(
            (self.observers.iter())
                .filter(|e| e.cx.try_select(Selected::Disconnected).is_ok())
                .map(|e| e.cx.clone()),
        );
        woken
    }

    /// Nobody waits or watches.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.observers.is_empty()
    }
}

// ===== SyncWaitList =====

/// A [`WaitList`] behind its own lock, with an `is_empty` hint read without the lock, so that
/// the fast path of a buffered channel pays one fence and one load to learn nobody waits
/// (crossbeam's `SyncWaker`). The lock is only taken by tasks that block and by their wakers.
pub(crate) struct SyncWaitList<P: PollerCell = CachePadded<Pollers>> {
    list: Mutex<WaitList>,
    is_empty: AtomicBool,
    /// The other side has disconnected: for waiters that poll something else than the
    /// channel's state (the unbounded flavor's receivers that claimed ahead). Beside
    /// `is_empty`, on a line peers read and rarely write.
    disconnected: AtomicBool,
    /// What this side's polling waiters share (the spin estimate). A channel keeps it on a line
    /// of its own: waiters write it as they learn, while every peer's fast path reads
    /// `is_empty`.
    pollers: P,
}

/// Where a [`SyncWaitList`] keeps its [`Pollers`]: on a cache line of their own
/// (`CachePadded`, for channels: waiters write the spin estimate while every peer's fast path
/// reads `is_empty`, and sharing a line with a word written at every wait costs `spsc` over
/// `bounded(1)` with pinned threads 253-281 ns a message against 204-222) or inline (a
/// oneshot, whose receiver polls without a spin estimate: padding would quadruple its
/// allocation for nothing).
pub(crate) trait PollerCell {
    fn new() -> Self;
    fn get(&self) -> &Pollers;
}

impl PollerCell for Pollers {
    fn new() -> Self {
        Pollers::new()
    }
    #[inline]
    fn get(&self) -> &Pollers {
        self
    }
}

impl PollerCell for CachePadded<Pollers> {
    fn new() -> Self {
        CachePadded::new(Pollers::new())
    }
    #[inline]
    fn get(&self) -> &Pollers {
        self
    }
}

impl<P: PollerCell> SyncWaitList<P> {
    pub(crate) fn new() -> SyncWaitList<P> {
        SyncWaitList {
            list: Mutex::new(WaitList::new()),
            is_empty: AtomicBool::new(true),
            disconnected: AtomicBool::new(false),
            pollers: P::new(),
        }
    }

    /// Retries `attempt` while the caller polls before it parks (`backoff::spin_then_yield`):
    /// `None` if the poll ran out (or `deadline` passed).
    #[inline]
    pub(crate) fn poll<R>(
        &self,
        deadline: Option<Instant>,
        attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        spin_then_yield(current_may_spin, current_may_yield(), deadline, attempt)
    }

    /// Like [`poll`](Self::poll), but a thread first spins for as long as spinning has been
    /// paying on this side (`backoff::SpinEstimate`).
    ///
    /// For the buffered flavors' waiters (but capacity one's, which poll registered:
    /// [`spin`](Self::spin)). On a bounded channel the peer that makes a waiter ready is often
    /// a poller running on the other CPU, and catching its move without a `sched_yield` is
    /// what makes `courier-bench chan --case mpmc_bounded1` 0.85-1.37 µs a message rather than
    /// 1.5-1.8. The unbounded flavor's receivers gain where a sender runs on the other CPU (the
    /// ring of two, pinned: 87-95 ns a message, 112-117 without the spin) and lose nothing
    /// measurable in the larger rings (`courier-bench ring --case ring_unbounded`), where a
    /// fixed spin cost them 20-25%.
    #[inline]
    pub(crate) fn poll_spinning_first<R>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        self.spin(&mut attempt)
            .or_else(|| spin_then_yield(current_may_spin, current_may_yield(), deadline, attempt))
    }

    /// A thread spins on `attempt` for as long as spinning has been paying on this side
    /// (`backoff::SpinEstimate`); `None` if the spin ran out, or at once for a fiber (whose
    /// spin, if its scheduler allows one, comes when it waits).
    ///
    /// For the waiters of a capacity-one channel, which then register and poll their claim
    /// word ([`park_unless`](Self::park_unless) with `poll_claim`), not the channel.
    #[inline]
    pub(crate) fn spin<R>(&self, attempt: &mut impl FnMut() -> Option<R>) -> Option<R> {
        if current_may_yield() {
            spin_adaptively(self.pollers.get().spin(), attempt)
        } else {
            None
        }
    }

    /// Like [`poll`](Self::poll), but a thread polls only briefly, spinning then yielding four
    /// times (`Backoff`: crossbeam's schedule, ~4 µs here), before it parks.
    ///
    /// For the receivers of a bounded channel with room for more than one message, where a
    /// waiting receiver usually waits for senders that do not wait for it: polling between
    /// yields for 50 µs kept such a receiver right behind the sender, fighting it for every
    /// slot's line, while one that parks is woken once and then trails the sender.
    /// `courier-bench chan --full --case spsc_boundedN` (a million messages), three rounds
    /// each: 12-13 ns a message with the brief poll, 17-20 with the long one (crossbeam
    /// 14.5-15.4); `mpsc_boundedN` and `mpmc_boundedN` the same either way, within their noise.
    /// Capacity one polls longer, registered: there the sender waits for the receiver as much
    /// as the other way round.
    #[inline]
    pub(crate) fn poll_briefly<R>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        if cfg!(loom) || !current_may_yield() {
            return spin_then_yield(current_may_spin, false, deadline, attempt);
        }
        let mut backoff = Backoff::new();
        loop {
            backoff.snooze();
            if let Some(r) = attempt() {
                return Some(r);
            }
            if backoff.is_completed() || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
        }
    }

    /// Registers `oper`. The caller then re-checks the channel and aborts the wait if it is
    /// ready (step 2 of the protocol).
    pub(crate) fn register(&self, oper: Operation, cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.register(oper, cx);
        // SYNC POINT: waiter side of a Dekker pair: [store `is_empty = false` (SeqCst); caller
        // re-checks the channel with SeqCst loads] against the notifier's [change the channel
        // with a SeqCst RMW (the head/tail CAS); load `is_empty` (SeqCst)]. All four are in the
        // single SeqCst order, so at least one side sees the other's write: no lost wake-up.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Steps 1-3 of the protocol for a waiter that a peer only has to wake (a receiver of a
    /// buffered channel or a oneshot): registers `oper`, re-checks with `ready` (SeqCst loads:
    /// the waiter's half of the Dekker pair in [`register`](Self::register)) and aborts the
    /// wait if the side is ready after all, then parks until a peer claims the wait, the
    /// channel is disconnected or `deadline` passes; unregisters unless a peer took the entry.
    /// The caller then retries its operation. With `poll_claim`, the task polls its claim word
    /// (`backoff::spin_then_yield`) before it parks, as a rendezvous waiter does.
    pub(crate) fn park_unless(
        &self,
        oper: Operation,
        deadline: Option<Instant>,
        poll_claim: bool,
        ready: impl FnOnce() -> bool,
    ) {
        Context::with(|cx| {
            self.register(oper, cx);
            if ready() {
                let _ = cx.try_select(Selected::Aborted);
            }
            match cx.wait_until(deadline, poll_claim) {
                Selected::Aborted | Selected::Disconnected => {
                    self.unregister(oper);
                }
                Selected::Operation(_) | Selected::Waiting => {}
            }
        });
    }

    /// Removes `oper` if a peer did not already take it.
    pub(crate) fn unregister(&self, oper: Operation) -> Option<Entry> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let entry = list.unregister(oper);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        entry
    }

    /// Wakes one waiting task, if any. Called after every change that may let a waiter proceed.
    #[inline]
    pub(crate) fn notify(&self) {
        // SYNC POINT: notifier side of the Dekker pair; partner: the SeqCst store in `register`.
        // The caller changed the channel with a SeqCst RMW before (x86: this load is a plain
        // `mov`, no fence on the fast path).
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_slow();
        }
    }

    /// Like [`notify`](Self::notify), and runs `help` on the claimed entry before waking its
    /// task (outside the lock): the bounded flavor uses it to move a blocked sender's message
    /// into the slot that just freed up.
    #[inline]
    pub(crate) fn notify_with(&self, help: impl FnOnce(&Entry)) {
        // SYNC POINT: as in `notify`.
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_slow_with(help);
        }
    }

    #[cold]
    fn notify_slow(&self) {
        self.notify_slow_with(|_| {});
    }

    #[cold]
    fn notify_slow_with(&self, help: impl FnOnce(&Entry)) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let entry = list.try_select();
        let observers = list.take_observers();
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        drop(list);
        if let Some(entry) = entry {
            help(&entry);
            entry.cx.unpark();
        }
        for cx in observers {
            cx.unpark();
        }
    }

    /// Wakes every waiting task and watcher (see [`WaitList::select_all`]), after a change the
    /// caller made with a SeqCst RMW, as for [`notify`](Self::notify).
    pub(crate) fn notify_all(&self) {
        // SYNC POINT: as in `notify`.
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_all_slow();
        }
    }

    #[cold]
    fn notify_all_slow(&self) {
        self.wake_claimed(WaitList::select_all);
    }

    /// Claims entries with `claim` under the lock, then unparks the claimed tasks after it.
    fn wake_claimed(&self, claim: impl FnOnce(&mut WaitList) -> Vec<Context>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let woken = claim(&mut list);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        drop(list);
        for cx in woken {
            cx.unpark();
        }
    }

    /// Adds an observer (`Select::ready`). The caller then re-checks the side, as after
    /// [`register`](Self::register), and the same Dekker pair keeps the change from being
    /// missed.
    pub(crate) fn watch(&self, oper: Operation, cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.watch(oper, cx);
        // SYNC POINT: as in `register`.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Removes the observer of `oper`, if no change woke it.
    pub(crate) fn unwatch(&self, oper: Operation) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.unwatch(oper);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
    }

    /// Registers `oper` with a hand-off packet (see [`notify_with`](Self::notify_with)).
    pub(crate) fn register_with_packet(&self, oper: Operation, packet: *mut (), cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.register_with_packet(oper, packet, cx);
        // SYNC POINT: as in `register`.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Wakes every waiting task with `Disconnected`. Takes the lock unconditionally: the caller
    /// marked the channel disconnected with an RMW before, and a task that registers after this
    /// lock sees the mark in its re-check.
    pub(crate) fn disconnect(&self) {
        // SYNC POINT: partner: the Acquire load in `is_disconnected` (after the channel's own
        // disconnect mark, which this makes visible to that reader).
        self.disconnected.store(true, Ordering::Release);
        self.wake_claimed(WaitList::disconnect);
    }

    /// Has [`disconnect`](Self::disconnect) been called? (A read of a line peers rarely write.)
    #[inline]
    pub(crate) fn is_disconnected(&self) -> bool {
        // SYNC POINT: partner: the Release store in `disconnect`.
        self.disconnected.load(Ordering::Acquire)
    }
}

/// loom treats SeqCst loads and stores as AcqRel (its README, "Unsupported features"), which
/// would let the models lose wake-ups the SeqCst order forbids; a SeqCst fence, which loom does
/// model, restores that order in the models. Real builds rely on the SeqCst accesses alone.
#[inline(always)]
pub(crate) fn loom_seqcst_fence() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

impl<P: PollerCell> Drop for SyncWaitList<P> {
    fn drop(&mut self) {
        debug_assert!(self.list.get_mut().map(|l| l.is_empty()).unwrap_or(true));
    }
}
