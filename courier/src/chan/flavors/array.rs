//! Bounded channel: Dmitry Vyukov's bounded MPMC queue.
//!
//! Source: D. Vyukov, "Bounded MPMC queue", 1024cores.net
//! (<https://www.1024cores.net/home/lock-free-algorithms/queues/bounded-mpmc-queue>), with the
//! lap counter and the disconnect mark of crossbeam-channel's `flavors/array.rs`.
//!
//! # Layout
//!
//! A ring of `cap` slots, each with a **stamp** saying what the slot is waiting for. Positions
//! (`head`, `tail`, stamps) pack three fields into one word:
//!
//! ```text
//!   bit:  63 ..................... k+1 |  k   | k-1 ........... 0
//!         lap (multiples of one_lap)   | mark | index (< cap)
//!   where 2^k = mark_bit = (cap+1).next_power_of_two(), one_lap = 2 * mark_bit
//! ```
//!
//! `mark` is only ever set in `tail`: it means "disconnected".
//! A slot at `index` is
//! - free for the sender at position `p = {lap, index}` when `stamp == p`;
//! - full for the receiver at position `p` when `stamp == p + 1`.
//!
//! A sender that finds its slot free CASes `tail` one step forward (to the next lap after the
//! last index), writes the message and stores `stamp = p + 1`; a receiver that finds its slot
//! full CASes `head` forward, reads, and stores `stamp = p + one_lap` (free for the next lap).
//! One CAS per operation, no ABA (positions only grow), no allocation after construction.
//!
//! Capacity one (`bounded(1)`) is another algorithm, in [`one`](super::one): there the slot's
//! state alone is the channel, so that a message moves one cache line between the sides
//! instead of three.
//!
//! # Waiting
//!
//! A blocked operation spins on the channel for as long as spinning has been paying
//! (`SyncWaitList::spin`), then polls the channel between `sched_yield`s (senders) or briefly
//! (receivers), then registers and parks. A receiver that frees a slot of a full channel moves
//! a blocked sender's message into it before waking that sender
//! ([`hand_off`](super::hand_off)).

use std::mem::MaybeUninit;
use std::ptr;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::hand_off::{wait_for_receiver, SendPacket};
use crate::chan::backoff::Backoff;
use crate::chan::context::{Context, Operation};
use crate::chan::err::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::chan::flavors::Token;
use crate::chan::wait_list::{Entry, SyncWaitList};
use crate::sync::atomic::{fence, AtomicUsize, Ordering};
use crate::sync::UnsafeCell;

/// One slot of the ring.
struct Slot<T> {
    /// What the slot waits for: `stamp == p` free for the sender at `p`, `p + 1` full for the
    /// receiver at `p`.
    stamp: AtomicUsize,
    /// The message; initialised exactly when the stamp says "full".
    msg: UnsafeCell<MaybeUninit<T>>,
}

/// A reserved slot.
#[derive(Debug)]
pub(crate) struct ArrayToken {
    /// The slot, or null if the channel is disconnected.
    slot: *const u8,
    /// The stamp to store once the slot has been written (or read).
    stamp: usize,
}

impl ArrayToken {
    pub(crate) fn is_reserved(&self) -> bool {
        !self.slot.is_null()
    }
}

impl Default for ArrayToken {
    fn default() -> Self {
        ArrayToken {
            slot: ptr::null(),
            stamp: 0,
        }
    }
}

/// A bounded channel of capacity `cap ≥ 1`.
pub(crate) struct Channel<T> {
    /// Position of the next receive: `{lap, index}`.
    head: CachePadded<AtomicUsize>,
    /// Position of the next send: `{lap, mark, index}`.
    tail: CachePadded<AtomicUsize>,
    /// The ring.
    buffer: Box<[Slot<T>]>,
    /// Number of slots.
    cap: usize,
    /// One step of `lap`.
    one_lap: usize,
    /// The disconnect bit of `tail`; `mark_bit - 1` masks the index.
    mark_bit: usize,
    /// Senders waiting for room.
    senders: SyncWaitList,
    /// Receivers waiting for a message.
    receivers: SyncWaitList,
}

// ===== impl Channel: lock-free core =====

impl<T> Channel<T> {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        assert!(
            cap > 0,
            "an array channel has room for at least one message"
        );
        let mark_bit = (cap + 1).next_power_of_two();
        let one_lap = mark_bit * 2;
        // Slot `i` starts free for the sender at position {lap 0, index i}, whose word is `i`.
        let buffer = (0..cap)
            .map(|i| Slot {
                stamp: AtomicUsize::new(i),
                msg: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect();
        Channel {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            buffer,
            cap,
            one_lap,
            mark_bit,
            senders: SyncWaitList::new(),
            receivers: SyncWaitList::new(),
        }
    }

    /// The position after `pos`: next index, or index 0 of the next lap.
    #[inline]
    fn next_pos(&self, pos: usize) -> usize {
        let index = pos & (self.mark_bit - 1);
        let lap = pos & !(self.one_lap - 1);
        if index + 1 < self.cap {
            pos + 1
        } else {
            lap.wrapping_add(self.one_lap)
        }
    }

    /// Reserves a slot to write into. `false`: full. `true` with a null slot: disconnected.
    ///
    /// Always inlined: out of line (as the compiler leaves it once the function grows), it
    /// takes `courier-bench chan --full --case spsc_boundedN` (a million messages) from 13-23
    /// to 44-89 ns a message, far more than two calls cost: how closely the receiver trails the
    /// sender decides how often they fight over the slots' lines, and that balance is fragile.
    #[inline(always)]
    fn reserve_send(&self, token: &mut ArrayToken) -> bool {
        let mut backoff = Backoff::new();
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            if tail & self.mark_bit != 0 {
                token.slot = ptr::null();
                token.stamp = 0;
                return true;
            }
            let slot = &self.buffer[tail & (self.mark_bit - 1)];
            // SYNC POINT: sender reads the slot's stamp. Partner: the receiver's Release store
            // of `stamp` in `read` (the slot's previous message has been moved out).
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == tail {
                // The slot is free for this lap: claim it by moving `tail` on.
                match self.tail.compare_exchange_weak(
                    tail,
                    self.next_pos(tail),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        token.slot = slot as *const Slot<T> as *const u8;
                        token.stamp = tail + 1;
                        return true;
                    }
                    Err(t) => {
                        tail = t;
                        backoff.spin();
                    }
                }
            } else if stamp.wrapping_add(self.one_lap) == tail + 1 {
                // The slot still holds the message of the previous lap: full, unless a receiver
                // has moved `head` past it meanwhile, and is reading it (or holds it for a
                // `Select`, whose task may be suspended before it reads: step aside).
                // SYNC POINT: orders the stamp load above before the `head` load below; partner:
                // the SeqCst CAS on `head` in `reserve_recv`.
                fence(Ordering::SeqCst);
                let head = self.head.load(Ordering::Relaxed);
                if head.wrapping_add(self.one_lap) == tail {
                    return false;
                }
                backoff.snooze();
                tail = self.tail.load(Ordering::Relaxed);
            } else {
                // Another sender claimed this slot and moved `tail` (catch up), or a peer of the
                // previous lap is still writing or reading the slot (wait for it). After a few
                // rounds give the CPU away (crossbeam's `snooze` here): senders outnumbering the
                // CPUs otherwise spin against each other on `tail` while the receiver waits for
                // a CPU (`buffered_ab 4 15 barrier`, `courier-bench/examples`: 20-26 ns a
                // message, 43-66 spinning only), and a peer preempted mid-slot needs this CPU
                // to finish.
                backoff.snooze();
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Writes into the reserved slot and wakes a receiver.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_send` of this channel that returned `true`;
    /// - `write` is called once for it.
    unsafe fn write_reserved(&self, token: &ArrayToken, msg: T) -> Result<(), T> {
        if token.slot.is_null() {
            return Err(msg);
        }
        // SAFETY: the token points at a slot of `self.buffer` (`reserve_send` stored it).
        let slot: &Slot<T> = unsafe { &*(token.slot as *const Slot<T>) };
        // SAFETY: winning the `tail` CAS gave this sender exclusive access to the slot's message
        // until it publishes the stamp below.
        slot.msg
            .with_mut(|p| unsafe { p.write(MaybeUninit::new(msg)) });
        // SYNC POINT: publishes the message. Partner: the Acquire stamp load in `reserve_recv`.
        slot.stamp.store(token.stamp, Ordering::Release);
        self.receivers.notify();
        Ok(())
    }

    /// Reserves a message to read. `false`: empty. `true` with a null slot: empty and
    /// disconnected. Always inlined: see `reserve_send`.
    #[inline(always)]
    fn reserve_recv(&self, token: &mut ArrayToken) -> bool {
        let mut backoff = Backoff::new();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let slot = &self.buffer[head & (self.mark_bit - 1)];
            // SYNC POINT: receiver reads the slot's stamp. Partner: the sender's Release store in
            // `write` (the message is initialised).
            let stamp = slot.stamp.load(Ordering::Acquire);
            if head + 1 == stamp {
                // The slot holds this lap's message: claim it by moving `head` on.
                match self.head.compare_exchange_weak(
                    head,
                    self.next_pos(head),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        token.slot = slot as *const Slot<T> as *const u8;
                        token.stamp = head.wrapping_add(self.one_lap);
                        return true;
                    }
                    Err(h) => {
                        head = h;
                        backoff.spin();
                    }
                }
            } else if stamp == head {
                // The slot is not written for this lap: empty, unless a sender has claimed it
                // and is writing.
                // SYNC POINT: orders the stamp load before the `tail` load; partner: the SeqCst
                // CAS on `tail` in `reserve_send` (and the disconnect RMW).
                fence(Ordering::SeqCst);
                let tail = self.tail.load(Ordering::Relaxed);
                if tail & !self.mark_bit == head {
                    if tail & self.mark_bit != 0 {
                        token.slot = ptr::null();
                        token.stamp = 0;
                        return true;
                    }
                    return false;
                }
                // A sender is between its CAS and its stamp store: wait for it.
                backoff.snooze();
                head = self.head.load(Ordering::Relaxed);
            } else {
                // Another receiver took this slot (catch up), or the previous lap's sender is
                // still writing it (wait for it): yield after a few rounds, as senders do.
                backoff.snooze();
                head = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Reads the reserved message and wakes a sender.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `reserve_recv` of this channel that returned `true`;
    /// - `read` is called once for it.
    unsafe fn read_reserved(&self, token: &ArrayToken) -> Result<T, ()> {
        if token.slot.is_null() {
            return Err(());
        }
        // SAFETY: the token points at a slot of `self.buffer` (`reserve_recv` stored it).
        let slot: &Slot<T> = unsafe { &*(token.slot as *const Slot<T>) };
        // SAFETY: winning the `head` CAS on a slot stamped "full" gave this receiver exclusive
        // access to an initialised message, moved out once.
        let msg = slot.msg.with(|p| unsafe { p.read().assume_init() });
        // SYNC POINT: frees the slot for the next lap. Partner: the Acquire stamp load in
        // `reserve_send`.
        slot.stamp.store(token.stamp, Ordering::Release);
        self.senders.notify_with(|entry| self.hand_off(entry));
        Ok(msg)
    }

    // ===== impl Channel: the two-step operations, for `Select` =====
    //
    // The channel's own operations use a bare `ArrayToken`, cheaper to build than a `Token`.

    pub(crate) fn start_send(&self, token: &mut Token) -> bool {
        self.reserve_send(&mut token.array)
    }

    /// # Safety
    /// As for [`write_reserved`](Self::write_reserved).
    pub(crate) unsafe fn write(&self, token: &mut Token, msg: T) -> Result<(), T> {
        // SAFETY: forwarded from the caller.
        unsafe { self.write_reserved(&token.array, msg) }
    }

    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        self.reserve_recv(&mut token.array)
    }

    /// # Safety
    /// As for [`read_reserved`](Self::read_reserved).
    pub(crate) unsafe fn read(&self, token: &mut Token) -> Result<T, ()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.read_reserved(&token.array) }
    }

    // ===== impl Channel: try, blocking =====

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let token = &mut ArrayToken::default();
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
        let token = &mut ArrayToken::default();
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
        let token = &mut ArrayToken::default();
        loop {
            // Fast path, then a spin and polling between yields while a receiver is about to
            // make room.
            let ready = self.reserve_send(token)
                || self
                    .senders
                    .poll_spinning_first(deadline, || self.reserve_send(token).then_some(()))
                    .is_some();
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
            // Register with the message in a hand-off packet, re-check, park.
            msg = match wait_for_receiver(
                &self.senders,
                Operation::hook(token),
                msg,
                deadline,
                false,
                || !self.is_full() || self.is_disconnected(),
            ) {
                Ok(()) => return Ok(()),
                Err(msg) => msg,
            };
        }
    }

    /// Run by a receiver that freed a slot and claimed a blocked sender (outside the list lock,
    /// before waking it): moves the sender's message into a slot
    /// ([`hand_off`](super::hand_off)).
    fn hand_off(&self, entry: &Entry) {
        // SAFETY: only `send_slow` registers packets on `senders` (a `Select` registers none),
        // and `notify_with` runs this on the entry it claimed.
        let Some(packet) = (unsafe { SendPacket::<T>::of(entry) }) else {
            return;
        };
        let mut token = ArrayToken::default();
        if self.reserve_send(&mut token) && !token.slot.is_null() {
            let write = |msg| {
                // SAFETY: `reserve_send` reserved a slot for this token.
                let written = unsafe { self.write_reserved(&token, msg) };
                debug_assert!(written.is_ok());
            };
            // SAFETY: the packet came from `of`; this is its one `deliver`.
            unsafe { packet.deliver(write) };
        } else {
            packet.retry();
        }
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let token = &mut ArrayToken::default();
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
        let token = &mut ArrayToken::default();
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
        let token = &mut ArrayToken::default();
        loop {
            // Fast path, then a brief poll while a sender is about to deliver (the senders
            // rarely wait for us: `SyncWaitList::poll_briefly`).
            let ready = self.reserve_recv(token)
                || self
                    .receivers
                    .poll_briefly(deadline, || self.reserve_recv(token).then_some(()))
                    .is_some();
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
            self.receivers
                .park_unless(Operation::hook(token), deadline, false, || {
                    !self.is_empty() || self.is_disconnected()
                });
        }
    }

    // ===== impl Channel: state =====

    /// The number of messages in the channel (a snapshot).
    pub(crate) fn len(&self) -> usize {
        loop {
            let tail = self.tail.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            // A consistent pair: `tail` did not move while `head` was read.
            if self.tail.load(Ordering::SeqCst) == tail {
                return self.len_between(head, tail);
            }
        }
    }

    fn len_between(&self, head: usize, tail: usize) -> usize {
        let hix = head & (self.mark_bit - 1);
        let tix = tail & (self.mark_bit - 1);
        if hix < tix {
            tix - hix
        } else if hix > tix {
            self.cap - hix + tix
        } else if tail & !self.mark_bit == head {
            0
        } else {
            self.cap
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    pub(crate) fn is_empty(&self) -> bool {
        let head = self.head.load(Ordering::SeqCst);
        let tail = self.tail.load(Ordering::SeqCst);
        tail & !self.mark_bit == head
    }

    pub(crate) fn is_full(&self) -> bool {
        let tail = self.tail.load(Ordering::SeqCst);
        let head = self.head.load(Ordering::SeqCst);
        head.wrapping_add(self.one_lap) == tail & !self.mark_bit
    }

    pub(crate) fn is_disconnected(&self) -> bool {
        self.tail.load(Ordering::SeqCst) & self.mark_bit != 0
    }

    /// Marks the channel disconnected and wakes everyone. `true` if this call did it.
    pub(crate) fn disconnect(&self) -> bool {
        // SYNC POINT: the mark is an RMW on `tail`; partners: the `tail` loads of `reserve_recv`
        // (after their fence) and of the re-checks, and the wait lists' locks.
        if self.tail.fetch_or(self.mark_bit, Ordering::SeqCst) & self.mark_bit == 0 {
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
        // Exclusive access: every handle is gone. Drop the messages still in the ring.
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        let hix = head & (self.mark_bit - 1);
        let len = self.len_between(head, tail);

        /// The messages not dropped yet: slots `hix + done .. hix + len` (mod `cap`). On unwind
        /// (a message's `Drop` panicked) it drops the rest, as a `Vec` does; a second panic
        /// aborts.
        struct Rest<'a, T> {
            buffer: &'a [Slot<T>],
            hix: usize,
            done: usize,
            len: usize,
            mark_bit: usize,
        }
        impl<T> Rest<'_, T> {
            fn drop_all(&mut self) {
                while self.done < self.len {
                    let index = (self.hix + self.done) % self.buffer.len();
                    self.done += 1;
                    let slot = &self.buffer[index];
                    // Written means stamp = position + 1, whose index bits are `index + 1`;
                    // a slot reserved by a send that never wrote (a selected send that was
                    // forgotten) still has its position's own (`index`), and nothing to drop.
                    let stamp = slot.stamp.load(Ordering::Relaxed);
                    if stamp & (self.mark_bit - 1) != index + 1 {
                        continue;
                    }
                    slot.msg.with_mut(|p| {
                        // SAFETY: a slot between `head` and `tail` whose stamp says written
                        // holds an initialised message; `done` passed it first, so it is
                        // dropped once.
                        unsafe { (*p).assume_init_drop() }
                    });
                }
            }
        }
        impl<T> Drop for Rest<'_, T> {
            fn drop(&mut self) {
                self.drop_all();
            }
        }
        let mut rest = Rest {
            buffer: &self.buffer,
            hix,
            done: 0,
            len,
            mark_bit: self.mark_bit,
        };
        rest.drop_all();
    }
}

// SAFETY: messages move between threads through the channel (`T: Send`); the slots are only
// accessed under the stamp protocol above.
unsafe impl<T: Send> Send for Channel<T> {}
// SAFETY: as above; `&Channel` only lets threads send and receive whole `T`s.
unsafe impl<T: Send> Sync for Channel<T> {}
