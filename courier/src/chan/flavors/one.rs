//! Bounded channel of capacity one (`bounded(1)`): one slot whose state word is the whole
//! channel.
//!
//! # Layout
//!
//! ```text
//!   state:  bit 63 ........ 3 |  2   |  1 .. 0
//!           (always 0)        | mark | phase: 00 EMPTY, 01 SENDING, 10 FULL, 11 RECEIVING
//! ```
//!
//! The array flavor at capacity one would keep `head`, `tail` and the slot's stamp: three
//! cache lines that both sides touch for every message. Here the slot's state alone says EMPTY,
//! SENDING, FULL or RECEIVING, plus the disconnect mark. A claim is one CAS on it (a sender's
//! EMPTY -> SENDING, a receiver's FULL -> RECEIVING) and a completion one `fetch_xor`
//! (SENDING -> FULL, RECEIVING -> EMPTY) that keeps a mark set meanwhile, so a message moves
//! one cache line between the two sides: the state and the message share it.
//!
//! SENDING counts as a message and RECEIVING as room, as a claimed position does in the array
//! flavor's ring, so the claims are the changes the wait lists' Dekker pairs see. A claim that
//! finds the other side's step in flight (a receiver that finds SENDING, a sender that finds
//! RECEIVING) waits for it, stepping aside after a few spins (`Backoff::snooze`).
//!
//! # Waiting
//!
//! **A thread registers before it polls, and polls its claim word.** A blocked operation spins
//! on the slot for as long as spinning has been paying (`SyncWaitList::spin`), then registers,
//! then polls its claim word between yields before it parks (`Context::wait_until` with
//! `poll_claim`). Here a sender waits for a receiver as much as the other way round, and a
//! registered waiter lets its peer finish for it: a receiver that empties the slot moves a
//! registered sender's message into it and claims it ([`hand_off`](super::hand_off)), a sender
//! that fills the slot claims a registered receiver, and the waiter, polling between yields,
//! sees the claim without a futex round trip (its `unpark` finds it awake). A thread that
//! polled the slot instead would have to be scheduled to finish its own operation: in a ring of
//! 16 threads over `bounded(1)` channels on two CPUs (`courier-bench ring --case
//! ring_bounded1_16`), that measured 1.10 context switches a message against 0.62 (flume,
//! which parks at once and hands off the same way: 0.61), and 0.97-1.28 µs a message against
//! 0.70-0.90.

use std::mem::MaybeUninit;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::hand_off::{wait_for_receiver, SendPacket};
use crate::chan::backoff::Backoff;
use crate::chan::context::{Context, Operation};
use crate::chan::err::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::chan::flavors::Token;
use crate::chan::wait_list::{Entry, SyncWaitList};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::UnsafeCell;

/// The phase bits of the state.
const PHASE: usize = 0b11;
const EMPTY: usize = 0b00;
const SENDING: usize = 0b01;
const FULL: usize = 0b10;
const RECEIVING: usize = 0b11;
/// SENDING -> FULL and RECEIVING -> EMPTY, as one `fetch_xor` that keeps the mark.
const DONE: usize = 0b11;
/// The disconnect mark.
const MARK: usize = 0b100;

/// The slot: its state and its message, on one cache line.
struct Slot<T> {
    /// `mark | phase`, see the module docs.
    state: AtomicUsize,
    /// The message; initialised exactly while the phase is FULL (and RECEIVING, until the
    /// receiver has moved it out).
    msg: UnsafeCell<MaybeUninit<T>>,
}

/// A claimed slot, or a claim that found the channel disconnected.
#[derive(Debug, Default)]
pub(crate) struct OneToken {
    /// The claim succeeded (the phase is SENDING or RECEIVING, and ours); `false` after a
    /// claim that found the channel disconnected.
    claimed: bool,
}

impl OneToken {
    pub(crate) fn is_reserved(&self) -> bool {
        self.claimed
    }
}

/// A bounded channel of capacity one.
pub(crate) struct Channel<T> {
    /// The one slot, on a cache line of its own.
    slot: CachePadded<Slot<T>>,
    /// Senders waiting for room.
    senders: SyncWaitList,
    /// Receivers waiting for a message.
    receivers: SyncWaitList,
}

// ===== impl Channel: lock-free core =====

impl<T> Channel<T> {
    pub(crate) fn new() -> Self {
        Channel {
            slot: CachePadded::new(Slot {
                state: AtomicUsize::new(EMPTY),
                msg: UnsafeCell::new(MaybeUninit::uninit()),
            }),
            senders: SyncWaitList::new(),
            receivers: SyncWaitList::new(),
        }
    }

    /// The state (SeqCst: a re-check's load, the waiter's half of the Dekker pair).
    #[inline]
    fn state(&self) -> usize {
        self.slot.state.load(Ordering::SeqCst)
    }

    /// Does a state count as holding a message (for receivers: not empty; for senders: full)?
    #[inline]
    fn has_message(state: usize) -> bool {
        matches!(state & PHASE, SENDING | FULL)
    }

    /// Claims the slot by moving its state from `from` to `to`; on a lost race, backs off and
    /// returns `false` for the caller to look again.
    #[inline]
    fn claim(&self, token: &mut OneToken, from: usize, to: usize, backoff: &mut Backoff) -> bool {
        // SYNC POINT: the claim is the change the wait lists' Dekker pairs see (SeqCst RMW).
        match self
            .slot
            .state
            .compare_exchange_weak(from, to, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => {
                token.claimed = true;
                true
            }
            Err(_) => {
                backoff.spin();
                false
            }
        }
    }

    /// Claims the slot to write into. `false`: full. `true` with an unclaimed token:
    /// disconnected.
    ///
    /// Always inlined, as the array flavor's `reserve_send` is: the fast paths of `send` and
    /// `recv` are these loops, and a call in them changes how closely the two sides trail each
    /// other.
    #[inline(always)]
    fn reserve_send(&self, token: &mut OneToken) -> bool {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the receiver's Release `fetch_xor` in `read_reserved` (the
            // previous message has been moved out).
            let state = self.slot.state.load(Ordering::Acquire);
            if state & MARK != 0 {
                token.claimed = false;
                return true;
            }
            match state {
                EMPTY => {
                    if self.claim(token, state, SENDING, &mut backoff) {
                        return true;
                    }
                }
                // A receiver is moving the message out: room in a moment.
                RECEIVING => backoff.snooze(),
                // FULL, or another sender writing: full.
                _ => return false,
            }
        }
    }

    /// Writes into the claimed slot and wakes a receiver.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_send` of this channel that returned `true`;
    /// - `write` is called once for it.
    unsafe fn write_reserved(&self, token: &OneToken, msg: T) -> Result<(), T> {
        if !token.claimed {
            return Err(msg);
        }
        self.slot.msg.with_mut(|p| {
            // SAFETY: claiming EMPTY -> SENDING gave this sender exclusive access to the
            // message until it publishes FULL below.
            unsafe { p.write(MaybeUninit::new(msg)) }
        });
        // SYNC POINT: SENDING -> FULL publishes the message, keeping a disconnect mark set
        // meanwhile. Partner: the Acquire load of `reserve_recv`. (`SeqCst`, though `Release`
        // suffices by the C++20 model: Miri's weak-memory emulation mishandles a location
        // reached by `SeqCst` and weaker accesses alike, rust-lang/miri#5104, and reported a
        // deadlock in `tests/chan.rs` with `Release`; on x86 both are one `lock xor`.)
        self.slot.state.fetch_xor(DONE, Ordering::SeqCst);
        self.receivers.notify();
        Ok(())
    }

    /// Claims the message to read. `false`: empty. `true` with an unclaimed token: empty and
    /// disconnected. Always inlined: see `reserve_send`.
    #[inline(always)]
    fn reserve_recv(&self, token: &mut OneToken) -> bool {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the sender's Release `fetch_xor` in `write_reserved` (the
            // message is initialised).
            let state = self.slot.state.load(Ordering::Acquire);
            match state & PHASE {
                FULL => {
                    let receiving = state ^ FULL ^ RECEIVING;
                    if self.claim(token, state, receiving, &mut backoff) {
                        return true;
                    }
                }
                // A sender is writing its message: wait for it.
                SENDING => backoff.snooze(),
                // EMPTY, or another receiver taking the message: empty, and disconnected if
                // marked (no message can follow: a sender's claim needs an unmarked EMPTY).
                _ => {
                    if state & MARK != 0 {
                        token.claimed = false;
                        return true;
                    }
                    return false;
                }
            }
        }
    }

    /// Reads the claimed message and wakes a sender (moving a blocked one's message in).
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_recv` of this channel that returned `true`;
    /// - `read` is called once for it.
    unsafe fn read_reserved(&self, token: &OneToken) -> Result<T, ()> {
        if !token.claimed {
            return Err(());
        }
        // SAFETY: claiming FULL -> RECEIVING gave this receiver exclusive access to an
        // initialised message, moved out once.
        let msg = self.slot.msg.with(|p| unsafe { p.read().assume_init() });
        // SYNC POINT: RECEIVING -> EMPTY frees the slot, keeping a disconnect mark set
        // meanwhile. Partner: the Acquire load of `reserve_send`. (`SeqCst`: see `write_reserved`'s
        // completion above.)
        self.slot.state.fetch_xor(DONE, Ordering::SeqCst);
        self.senders.notify_with(|entry| self.hand_off(entry));
        Ok(msg)
    }

    /// Run by a receiver that emptied the slot and claimed a blocked sender (outside the list
    /// lock, before waking it): moves the sender's message into the slot
    /// ([`hand_off`](super::hand_off)).
    fn hand_off(&self, entry: &Entry) {
        // SAFETY: only `send_slow` registers packets on `senders` (a `Select` registers none),
        // and `notify_with` runs this on the entry it claimed.
        let Some(packet) = (unsafe { SendPacket::<T>::of(entry) }) else {
            return;
        };
        let mut token = OneToken::default();
        if self.reserve_send(&mut token) && token.claimed {
            let write = |msg| {
                // SAFETY: `reserve_send` claimed the slot for this token.
                let written = unsafe { self.write_reserved(&token, msg) };
                debug_assert!(written.is_ok());
            };
            // SAFETY: the packet came from `of`; this is its one `deliver`.
            unsafe { packet.deliver(write) };
        } else {
            packet.retry();
        }
    }

    // ===== impl Channel: the two-step operations, for `Select` =====
    //
    // The channel's own operations use a bare `OneToken`, cheaper to build than a `Token`.

    pub(crate) fn start_send(&self, token: &mut Token) -> bool {
        self.reserve_send(&mut token.one)
    }

    /// # Safety
    /// As for [`write_reserved`](Self::write_reserved).
    pub(crate) unsafe fn write(&self, token: &mut Token, msg: T) -> Result<(), T> {
        // SAFETY: forwarded from the caller.
        unsafe { self.write_reserved(&token.one, msg) }
    }

    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        self.reserve_recv(&mut token.one)
    }

    /// # Safety
    /// As for [`read_reserved`](Self::read_reserved).
    pub(crate) unsafe fn read(&self, token: &mut Token) -> Result<T, ()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.read_reserved(&token.one) }
    }

    // ===== impl Channel: try, blocking =====

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let token = &mut OneToken::default();
        if self.reserve_send(token) {
            // SAFETY: `reserve_send` returned true for this token.
            unsafe { self.write_reserved(token, msg) }.map_err(TrySendError::Disconnected)
        } else {
            Err(TrySendError::Full(msg))
        }
    }

    /// Sends: the common case (room at once) inline, waiting out of line, so that the
    /// callers' frames carry only what the common case needs.
    #[inline]
    pub(crate) fn send(
        &self,
        msg: T,
        deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        let token = &mut OneToken::default();
        if self.reserve_send(token) {
            // SAFETY: `reserve_send` returned true for this token.
            return unsafe { self.write_reserved(token, msg) }
                .map_err(SendTimeoutError::Disconnected);
        }
        self.send_slow(msg, deadline)
    }

    /// [`send`](Self::send) in every case.
    #[inline(never)]
    fn send_slow(&self, mut msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        let token = &mut OneToken::default();
        loop {
            // Fast path, then a spin while a receiver is about to make room.
            let ready = self.reserve_send(token) || {
                let mut attempt = || self.reserve_send(token).then_some(());
                self.senders.spin(&mut attempt).is_some()
            };
            if ready {
                // SAFETY: `reserve_send` returned true for this token.
                let sent = unsafe { self.write_reserved(token, msg) };
                return sent.map_err(SendTimeoutError::Disconnected);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(SendTimeoutError::Timeout(msg));
                }
            }
            // Register with the message in a hand-off packet, re-check, poll the claim, park.
            msg = match wait_for_receiver(
                &self.senders,
                Operation::hook(token),
                msg,
                deadline,
                true,
                || !self.is_full() || self.is_disconnected(),
            ) {
                Ok(()) => return Ok(()),
                Err(msg) => msg,
            };
        }
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let token = &mut OneToken::default();
        if self.reserve_recv(token) {
            // SAFETY: `reserve_recv` returned true for this token.
            unsafe { self.read_reserved(token) }.map_err(|()| TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }

    /// Receives: the common case (a message at once) inline, waiting out of line (as
    /// [`send`](Self::send)).
    #[inline]
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let token = &mut OneToken::default();
        if self.reserve_recv(token) {
            // SAFETY: `reserve_recv` returned true for this token.
            return unsafe { self.read_reserved(token) }
                .map_err(|()| RecvTimeoutError::Disconnected);
        }
        self.recv_slow(deadline)
    }

    /// [`recv`](Self::recv) in every case.
    #[inline(never)]
    fn recv_slow(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let token = &mut OneToken::default();
        loop {
            // Fast path, then a spin while a sender is about to deliver.
            let ready = self.reserve_recv(token) || {
                let mut attempt = || self.reserve_recv(token).then_some(());
                self.receivers.spin(&mut attempt).is_some()
            };
            if ready {
                // SAFETY: `reserve_recv` returned true for this token.
                let got = unsafe { self.read_reserved(token) };
                return got.map_err(|()| RecvTimeoutError::Disconnected);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(RecvTimeoutError::Timeout);
                }
            }
            // Register, re-check, poll the claim, park.
            self.receivers
                .park_unless(Operation::hook(token), deadline, true, || {
                    !self.is_empty() || self.is_disconnected()
                });
        }
    }

    // ===== impl Channel: state =====

    /// The number of messages in the channel (a snapshot).
    pub(crate) fn len(&self) -> usize {
        usize::from(Self::has_message(self.state()))
    }

    pub(crate) fn is_empty(&self) -> bool {
        !Self::has_message(self.state())
    }

    pub(crate) fn is_full(&self) -> bool {
        Self::has_message(self.state())
    }

    pub(crate) fn is_disconnected(&self) -> bool {
        self.state() & MARK != 0
    }

    /// Marks the channel disconnected and wakes everyone. `true` if this call did it.
    pub(crate) fn disconnect(&self) -> bool {
        // SYNC POINT: the mark is an RMW on the state; partners: the state loads of the claims
        // and of the re-checks, and the wait lists' locks.
        if self.slot.state.fetch_or(MARK, Ordering::SeqCst) & MARK == 0 {
            self.senders.disconnect();
            self.receivers.disconnect();
            true
        } else {
            false
        }
    }

    // ===== select support =====

    pub(crate) fn register_send(&self, oper: Operation, cx: &Context) -> bool {
        self.senders.register(oper, cx);
        !self.is_full() || self.is_disconnected()
    }

    pub(crate) fn unregister_send(&self, oper: Operation) {
        self.senders.unregister(oper);
    }

    pub(crate) fn register_recv(&self, oper: Operation, cx: &Context) -> bool {
        self.receivers.register(oper, cx);
        !self.is_empty() || self.is_disconnected()
    }

    pub(crate) fn unregister_recv(&self, oper: Operation) {
        self.receivers.unregister(oper);
    }

    // ===== `Select::ready` support =====

    pub(crate) fn watch_send(&self, oper: Operation, cx: &Context) -> bool {
        self.senders.watch(oper, cx);
        !self.is_full() || self.is_disconnected()
    }

    pub(crate) fn unwatch_send(&self, oper: Operation) {
        self.senders.unwatch(oper);
    }

    pub(crate) fn watch_recv(&self, oper: Operation, cx: &Context) -> bool {
        self.receivers.watch(oper, cx);
        !self.is_empty() || self.is_disconnected()
    }

    pub(crate) fn unwatch_recv(&self, oper: Operation) {
        self.receivers.unwatch(oper);
    }
}

impl<T> Drop for Channel<T> {
    fn drop(&mut self) {
        // Exclusive access: every handle is gone. A message claimed by a send that never wrote
        // (a selected send that was forgotten) is still SENDING: nothing to drop.
        if self.slot.state.load(Ordering::Relaxed) & PHASE == FULL {
            self.slot.msg.with_mut(|p| {
                // SAFETY: FULL: the slot holds an initialised message, dropped once here.
                unsafe { (*p).assume_init_drop() }
            });
        }
    }
}

// SAFETY: messages move between threads through the channel (`T: Send`); the slot is only
// accessed under the state protocol above.
unsafe impl<T: Send> Send for Channel<T> {}
// SAFETY: as above; `&Channel` only lets threads send and receive whole `T`s.
unsafe impl<T: Send> Sync for Channel<T> {}
