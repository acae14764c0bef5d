//! Rendezvous channel (`bounded(0)`): a message passes directly from a sender to a receiver.
//!
//! Sources: Go's unbuffered `chan` (`runtime/chan.go`: `sendDirect`/`recvDirect` into the
//! peer's `sudog.elem`) and crossbeam-channel's `flavors/zero.rs` (a packet per operation).
//!
//! There is no buffer: a sender that finds a waiting receiver claims it and writes into the
//! receiver's **packet**; otherwise it registers a packet holding its message and waits for a
//! receiver to claim it and take the message. The two wait lists sit behind one mutex per
//! channel (the rendezvous *is* the synchronisation, so there is no lock-free fast path to
//! keep); the wake-up happens after the lock is released.
//!
//! A packet lives on the stack of a blocked `send`/`recv` (it returns only after the peer has
//! set `ready`), or on the heap for an operation registered by a `Select`, which does not know
//! yet whether it will take this operation; the reader of a heap packet frees it.

use std::ptr;
use std::time::Instant;

use crate::chan::backoff::Backoff;
use crate::chan::context::{Context, Operation, Selected};
use crate::chan::err::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::chan::flavors::Token;
use crate::chan::wait_list::WaitList;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Mutex, MutexGuard, UnsafeCell};

/// A message slot for one rendezvous.
struct Packet<T> {
    /// Stack packets are freed by their owner; heap packets by their reader.
    on_stack: bool,
    /// The other side is done with the packet.
    ready: AtomicBool,
    msg: UnsafeCell<Option<T>>,
}

impl<T> Packet<T> {
    fn empty_on_stack() -> Packet<T> {
        Packet {
            on_stack: true,
            ready: AtomicBool::new(false),
            msg: UnsafeCell::new(None),
        }
    }

    fn empty_on_heap() -> Box<Packet<T>> {
        Box::new(Packet {
            on_stack: false,
            ready: AtomicBool::new(false),
            msg: UnsafeCell::new(None),
        })
    }

    fn message_on_stack(msg: T) -> Packet<T> {
        Packet {
            on_stack: true,
            ready: AtomicBool::new(false),
            msg: UnsafeCell::new(Some(msg)),
        }
    }

    /// Waits for the other side to finish with the packet, spinning and then stepping aside
    /// (`Backoff::snooze`): the reader of a `Select`'s packet waits for the selecting task to
    /// return from its select and write, and if that task is a fiber of the reader's own
    /// thread it runs only when the reader lets its scheduler run it.
    fn wait_ready(&self) {
        let mut backoff = Backoff::new();
        // SYNC POINT: partner: the Release stores of `ready` in `write` and `read`.
        while !self.ready.load(Ordering::Acquire) {
            backoff.snooze();
        }
    }
}

/// The peer (packet and task) a `start_*` claimed.
#[derive(Default)]
pub(crate) struct ZeroToken {
    /// The packet, or null if the channel is disconnected.
    packet: *mut (),
    /// The claimed peer to unpark once the packet is done (none for a select's own packet).
    peer: Option<Context>,
}

impl ZeroToken {
    pub(crate) fn is_reserved(&self) -> bool {
        !self.packet.is_null()
    }
}

struct Inner {
    senders: WaitList,
    receivers: WaitList,
    is_disconnected: bool,
}

/// A rendezvous channel.
pub(crate) struct Channel<T> {
    inner: Mutex<Inner>,
    _marker: std::marker::PhantomData<T>,
}

impl<T> Channel<T> {
    pub(crate) fn new() -> Self {
        Channel {
            inner: Mutex::new(Inner {
                senders: WaitList::new(),
                receivers: WaitList::new(),
                is_disconnected: false,
            }),
            _marker: std::marker::PhantomData,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims a waiting receiver. `false`: none. `true` with a null packet: disconnected.
    pub(crate) fn start_send(&self, token: &mut Token) -> bool {
        let mut inner = self.lock();
        if let Some(entry) = inner.receivers.try_select() {
            token.zero.packet = entry.packet;
            token.zero.peer = Some(entry.cx);
            true
        } else if inner.is_disconnected {
            token.zero.packet = ptr::null_mut();
            true
        } else {
            false
        }
    }

    /// Writes into the claimed receiver's packet, then wakes it.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `start_send` of this channel that returned `true`, or by a
    ///   select that was claimed for this channel's send operation;
    /// - `write` is called once for it.
    pub(crate) unsafe fn write(&self, token: &mut Token, msg: T) -> Result<(), T> {
        if token.zero.packet.is_null() {
            return Err(msg);
        }
        // SAFETY: the packet belongs to a claimed receiver, which does not touch it (nor free
        // it) before `ready` is set.
        let packet = unsafe { &*(token.zero.packet as *const Packet<T>) };
        // SAFETY: until `ready`, this sender is the only one accessing the message.
        packet.msg.with_mut(|p| unsafe { *p = Some(msg) });
        // SYNC POINT: hands the message over. Partner: `wait_ready` in `read`/`recv`.
        packet.ready.store(true, Ordering::Release);
        if let Some(peer) = token.zero.peer.take() {
            peer.unpark();
        }
        Ok(())
    }

    /// Claims a waiting sender. `false`: none. `true` with a null packet: disconnected.
    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        let mut inner = self.lock();
        if let Some(entry) = inner.senders.try_select() {
            token.zero.packet = entry.packet;
            token.zero.peer = Some(entry.cx);
            true
        } else if inner.is_disconnected {
            token.zero.packet = ptr::null_mut();
            true
        } else {
            false
        }
    }

    /// Takes the message from the claimed sender's packet, then wakes it.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `token` was filled by a `start_recv` of this channel that returned `true`, or by a
    ///   select that was claimed for this channel's receive operation;
    /// - `read` is called once for it.
    pub(crate) unsafe fn read(&self, token: &mut Token) -> Result<T, ()> {
        if token.zero.packet.is_null() {
            return Err(());
        }
        let packet_ptr = token.zero.packet as *mut Packet<T>;
        // SAFETY: the packet is live: its owner waits for `ready` (stack) or leaves freeing to
        // us (heap).
        let packet = unsafe { &*packet_ptr };
        let peer = token.zero.peer.take();
        if packet.on_stack {
            // A blocked sender's packet: its message is there already.
            // SAFETY: the sender does not touch the packet until `ready`.
            let msg = packet.msg.with_mut(|p| unsafe { (*p).take() });
            // SYNC POINT: releases the packet back to its owner. Partner: its `wait_ready`.
            packet.ready.store(true, Ordering::Release);
            if let Some(peer) = peer {
                peer.unpark();
            }
            Ok(msg.expect("a blocked sender's packet holds its message"))
        } else {
            // A select's packet: the sender writes after its select returns, so wake it first.
            if let Some(peer) = peer {
                peer.unpark();
            }
            packet.wait_ready();
            // SAFETY: `ready` was set, so the writer is done; we own the heap packet now.
            let packet = unsafe { Box::from_raw(packet_ptr) };
            Ok(packet
                .msg
                .into_inner()
                .expect("a ready packet holds a message"))
        }
    }

    // ===== impl Channel: try, blocking =====

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let token = &mut Token::default();
        if self.start_send(token) {
            // SAFETY: `start_send` returned true for this token.
            unsafe { self.write(token, msg) }.map_err(TrySendError::Disconnected)
        } else {
            Err(TrySendError::Full(msg))
        }
    }

    /// Out of line: a hand-off takes the channel's lock and costs microseconds when it waits,
    /// so the call costs nothing measurable here, and the public `send` keeps its frame for
    /// the buffered flavors' inline common cases.
    #[inline(never)]
    pub(crate) fn send(
        &self,
        msg: T,
        deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        let token = &mut Token::default();
        let mut inner = self.lock();
        if let Some(entry) = inner.receivers.try_select() {
            drop(inner);
            token.zero.packet = entry.packet;
            token.zero.peer = Some(entry.cx);
            // SAFETY: we claimed a receiver for this token.
            return unsafe { self.write(token, msg) }.map_err(SendTimeoutError::Disconnected);
        }
        if inner.is_disconnected {
            return Err(SendTimeoutError::Disconnected(msg));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(SendTimeoutError::Timeout(msg));
        }
        Context::with(|cx| {
            let oper = Operation::hook(token);
            let packet = Packet::message_on_stack(msg);
            inner
                .senders
                .register_with_packet(oper, &packet as *const Packet<T> as *mut (), cx);
            let observers = inner.receivers.take_observers();
            drop(inner);
            wake(observers);
            match cx.wait_until(deadline, true) {
                Selected::Aborted | Selected::Disconnected => {
                    let sel = cx.selected();
                    self.lock().senders.unregister(oper);
                    // SAFETY: no receiver claimed us, so no one touches the packet.
                    let msg = packet
                        .msg
                        .with_mut(|p| unsafe { (*p).take() })
                        .expect("an unclaimed packet keeps its message");
                    Err(if sel == Selected::Disconnected {
                        SendTimeoutError::Disconnected(msg)
                    } else {
                        SendTimeoutError::Timeout(msg)
                    })
                }
                Selected::Operation(_) | Selected::Waiting => {
                    // A receiver claimed us and is taking the message.
                    packet.wait_ready();
                    Ok(())
                }
            }
        })
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let token = &mut Token::default();
        if self.start_recv(token) {
            // SAFETY: `start_recv` returned true for this token.
            unsafe { self.read(token) }.map_err(|()| TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }

    /// Out of line, as [`send`](Self::send).
    #[inline(never)]
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let token = &mut Token::default();
        let mut inner = self.lock();
        if let Some(entry) = inner.senders.try_select() {
            drop(inner);
            token.zero.packet = entry.packet;
            token.zero.peer = Some(entry.cx);
            // SAFETY: we claimed a sender for this token.
            return unsafe { self.read(token) }.map_err(|()| RecvTimeoutError::Disconnected);
        }
        if inner.is_disconnected {
            return Err(RecvTimeoutError::Disconnected);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(RecvTimeoutError::Timeout);
        }
        Context::with(|cx| {
            let oper = Operation::hook(token);
            let packet = Packet::<T>::empty_on_stack();
            inner
                .receivers
                .register_with_packet(oper, &packet as *const Packet<T> as *mut (), cx);
            let observers = inner.senders.take_observers();
            drop(inner);
            wake(observers);
            match cx.wait_until(deadline, true) {
                Selected::Aborted => {
                    self.lock().receivers.unregister(oper);
                    Err(RecvTimeoutError::Timeout)
                }
                Selected::Disconnected => {
                    self.lock().receivers.unregister(oper);
                    Err(RecvTimeoutError::Disconnected)
                }
                Selected::Operation(_) | Selected::Waiting => {
                    // A sender claimed us and is writing the message.
                    packet.wait_ready();
                    // SAFETY: `ready` was set: the sender is done with the packet.
                    let msg = packet.msg.with_mut(|p| unsafe { (*p).take() });
                    Ok(msg.expect("a ready packet holds a message"))
                }
            }
        })
    }

    // ===== impl Channel: state =====

    pub(crate) fn is_disconnected(&self) -> bool {
        self.lock().is_disconnected
    }

    /// Marks the channel disconnected and wakes everyone. `true` if this call did it.
    pub(crate) fn disconnect(&self) -> bool {
        let mut inner = self.lock();
        if inner.is_disconnected {
            return false;
        }
        inner.is_disconnected = true;
        let mut woken = inner.senders.disconnect();
        woken.extend(inner.receivers.disconnect());
        drop(inner);
        for cx in woken {
            cx.unpark();
        }
        true
    }

    // ===== select support =====

    pub(crate) fn register_send(&self, oper: Operation, cx: &Context) -> bool {
        let packet = Box::into_raw(Packet::<T>::empty_on_heap());
        let mut inner = self.lock();
        inner
            .senders
            .register_with_packet(oper, packet as *mut (), cx);
        let ready = inner.receivers.can_select() || inner.is_disconnected;
        let observers = inner.receivers.take_observers();
        drop(inner);
        wake(observers);
        ready
    }

    pub(crate) fn unregister_send(&self, oper: Operation) {
        if let Some(entry) = self.lock().senders.unregister(oper) {
            // SAFETY: the entry was still registered, so no receiver claimed its heap packet.
            drop(unsafe { Box::from_raw(entry.packet as *mut Packet<T>) });
        }
    }

    pub(crate) fn register_recv(&self, oper: Operation, cx: &Context) -> bool {
        let packet = Box::into_raw(Packet::<T>::empty_on_heap());
        let mut inner = self.lock();
        inner
            .receivers
            .register_with_packet(oper, packet as *mut (), cx);
        let ready = inner.senders.can_select() || inner.is_disconnected;
        let observers = inner.senders.take_observers();
        drop(inner);
        wake(observers);
        ready
    }

    pub(crate) fn unregister_recv(&self, oper: Operation) {
        if let Some(entry) = self.lock().receivers.unregister(oper) {
            // SAFETY: the entry was still registered, so no sender claimed its heap packet.
            drop(unsafe { Box::from_raw(entry.packet as *mut Packet<T>) });
        }
    }

    // ===== `Select::ready` support: a side is ready when the other side has a waiter =====

    pub(crate) fn is_ready_send(&self) -> bool {
        let inner = self.lock();
        inner.receivers.can_select() || inner.is_disconnected
    }

    pub(crate) fn is_ready_recv(&self) -> bool {
        let inner = self.lock();
        inner.senders.can_select() || inner.is_disconnected
    }

    /// Watches for a receiver to arrive (woken when one registers); `true` if one waits now.
    pub(crate) fn watch_send(&self, oper: Operation, cx: &Context) -> bool {
        let mut inner = self.lock();
        inner.senders.watch(oper, cx);
        inner.receivers.can_select() || inner.is_disconnected
    }

    pub(crate) fn unwatch_send(&self, oper: Operation) {
        self.lock().senders.unwatch(oper);
    }

    /// Watches for a sender to arrive (woken when one registers); `true` if one waits now.
    pub(crate) fn watch_recv(&self, oper: Operation, cx: &Context) -> bool {
        let mut inner = self.lock();
        inner.receivers.watch(oper, cx);
        inner.senders.can_select() || inner.is_disconnected
    }

    pub(crate) fn unwatch_recv(&self, oper: Operation) {
        self.lock().receivers.unwatch(oper);
    }

    /// A select was claimed for this channel's operation: take the packet the claimer left.
    pub(crate) fn accept(&self, token: &mut Token, cx: &Context) -> bool {
        token.zero.packet = cx.wait_packet();
        token.zero.peer = None;
        true
    }
}

/// Wakes the observers a registration claimed (outside the channel's lock).
fn wake(observers: Vec<Context>) {
    for cx in observers {
        cx.unpark();
    }
}

// SAFETY: messages move between threads through packets (`T: Send`), each accessed by one side
// at a time under the claim/ready protocol.
unsafe impl<T: Send> Send for Channel<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Channel<T> {}
