//! A channel for exactly one message: one state word and one slot, no queue.
//!
//! ```
//! let (tx, rx) = courier::chan::oneshot();
//! std::thread::spawn(move || tx.send("done").unwrap());
//! assert_eq!(rx.recv(), Ok("done"));
//! assert!(rx.recv().is_err()); // the one message was taken
//! ```
//!
//! The state word moves `EMPTY -> FULL -> TAKEN` on success; `EMPTY -> SENDER_GONE` if the
//! sender is dropped unsent; `* -> RECEIVER_GONE` when the receiver is dropped (which then drops
//! a message it never took). Each transition is one atomic RMW, so whoever makes the last one
//! knows whether a message is left to drop. A blocked receiver waits through the same
//! register/re-check/park protocol as the other flavors.
#![allow(unsafe_code)]

use std::fmt;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use super::backoff::Pollers;
use super::context::Operation;
use super::err::{RecvError, RecvTimeoutError, SendError, TryRecvError};
use super::wait_list::SyncWaitList;
use crate::sync::atomic::{AtomicU8, Ordering};
use crate::sync::{Arc, UnsafeCell};

const EMPTY: u8 = 0;
const FULL: u8 = 1;
const TAKEN: u8 = 2;
const SENDER_GONE: u8 = 3;
const RECEIVER_GONE: u8 = 4;

struct Inner<T> {
    state: AtomicU8,
    /// Initialised exactly while `state == FULL`.
    msg: UnsafeCell<MaybeUninit<T>>,
    /// The receiver, when it waits.
    receiver: SyncWaitList<Pollers>,
}

// SAFETY: the message moves from the sender's thread to the receiver's (`T: Send`); the state
// word gives each side exclusive access to the slot in turn.
unsafe impl<T: Send> Send for Inner<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Inner<T> {}

/// A channel for one message.
pub fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Inner {
        state: AtomicU8::new(EMPTY),
        msg: UnsafeCell::new(MaybeUninit::uninit()),
        receiver: SyncWaitList::new(),
    });
    (
        Sender {
            inner: Some(Arc::clone(&inner)),
        },
        Receiver { inner },
    )
}

/// The sending side of a [`oneshot`] channel: sends once, by value.
pub struct Sender<T> {
    /// `None` once sent.
    inner: Option<Arc<Inner<T>>>,
}

/// The receiving side of a [`oneshot`] channel.
pub struct Receiver<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Sender<T> {
    /// Sends the message; fails (handing it back) if the receiver is gone.
    pub fn send(mut self, msg: T) -> Result<(), SendError<T>> {
        let inner = self.inner.take().expect("a sender sends once");
        inner.msg.with_mut(|p| {
            // SAFETY: only the sender writes the slot, and only while the state is EMPTY
            // (the receiver reads it only after seeing FULL).
            unsafe { p.write(MaybeUninit::new(msg)) }
        });
        // SYNC POINT: publishes the message. Partner: the receiver's Acquire CAS FULL -> TAKEN
        // (and the Acquire swap in `Receiver::drop`).
        match inner
            .state
            .compare_exchange(EMPTY, FULL, Ordering::SeqCst, Ordering::Acquire)
        {
            Ok(_) => {
                // Every waiter, not one: receivers may share the end (`&Receiver` is `Sync`),
                // and the state never returns to EMPTY, so a waiter left parked would stay so.
                inner.receiver.notify_all();
                Ok(())
            }
            Err(_) => {
                // RECEIVER_GONE: take the message back.
                // SAFETY: written above and never published.
                let msg = inner.msg.with(|p| unsafe { p.read().assume_init() });
                Err(SendError(msg))
            }
        }
    }

    /// `true` if the receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|i| i.state.load(Ordering::Acquire) == RECEIVER_GONE)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // Dropped unsent: tell the receiver.
            if inner
                .state
                .compare_exchange(EMPTY, SENDER_GONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                inner.receiver.disconnect();
            }
        }
    }
}

impl<T> Receiver<T> {
    /// Takes the message if it is there.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        // SYNC POINT: Acquire pairs with the sender's publishing CAS.
        match self
            .inner
            .state
            .compare_exchange(FULL, TAKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                // SAFETY: FULL means initialised; winning the CAS made us its only reader.
                Ok(self.inner.msg.with(|p| unsafe { p.read().assume_init() }))
            }
            Err(EMPTY) => Err(TryRecvError::Empty),
            Err(_) => Err(TryRecvError::Disconnected),
        }
    }

    /// Waits for the message. Fails if the sender was dropped unsent (or it was taken).
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_impl(None).map_err(|_| RecvError)
    }

    /// Waits at most `timeout` for the message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_impl(super::deadline_after(timeout))
    }

    /// Waits until `deadline` at the latest for the message.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.recv_impl(Some(deadline))
    }

    fn recv_impl(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            let attempt = || match self.try_recv() {
                Ok(msg) => Some(Ok(msg)),
                Err(TryRecvError::Disconnected) => Some(Err(RecvTimeoutError::Disconnected)),
                Err(TryRecvError::Empty) => None,
            };
            if let Some(done) = attempt().or_else(|| self.inner.receiver.poll(deadline, attempt)) {
                return done;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RecvTimeoutError::Timeout);
            }
            let mut hook = 0u8;
            // SYNC POINT: SeqCst re-check; partner: the sender's SeqCst CAS (see
            // `SyncWaitList::register`).
            self.inner
                .receiver
                .park_unless(Operation::hook(&mut hook), deadline, false, || {
                    self.inner.state.load(Ordering::SeqCst) != EMPTY
                });
        }
    }

    /// `true` if the message is there.
    pub fn is_ready(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == FULL
    }

    /// Has the state left EMPTY for good (the message is there, was taken, or will never come)?
    /// Then a receive returns at once. SeqCst: the re-check after a `Select` registers (see
    /// `SyncWaitList::register`).
    pub(crate) fn is_settled(&self) -> bool {
        self.inner.state.load(Ordering::SeqCst) != EMPTY
    }

    /// The wait list a `Select` registers on.
    pub(crate) fn waiters(&self) -> &SyncWaitList<Pollers> {
        &self.inner.receiver
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // SYNC POINT: Acquire pairs with the sender's publishing CAS, for the drop below.
        if self.inner.state.swap(RECEIVER_GONE, Ordering::AcqRel) == FULL {
            // SAFETY: FULL means initialised and not taken; the swap made us its only owner.
            self.inner
                .msg
                .with_mut(|p| unsafe { (*p).assume_init_drop() });
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("oneshot::Sender { .. }")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("oneshot::Receiver { .. }")
    }
}
