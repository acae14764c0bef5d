//! A channel that delivers one message at a given instant: the receiver of
//! [`after`](crate::chan::after) and [`at`](crate::chan::at) (crossbeam-channel's
//! `flavors/at.rs`).
//!
//! There is no sender and no thread behind it: the message is due at `delivery_time`, and every
//! operation reads the clock to learn whether it is. A receive takes the message with one swap
//! of `received`, so of the clones of one receiver exactly one gets it. A blocked receive
//! sleeps until the message is due through the current task's context (a thread parks with a
//! timeout, a fiber parks through its scheduler); a receive after the message was taken waits
//! as one on [`never`](crate::chan::never) does.

use std::time::Instant;

use crate::chan::context::sleep_until;
use crate::chan::err::{RecvTimeoutError, TryRecvError};
use crate::chan::flavors::Token;
use crate::sync::atomic::{AtomicBool, Ordering};

/// The channel of one timed message.
pub(crate) struct Channel<T> {
    /// When the message is due; the message is this instant.
    delivery_time: Instant,
    /// The message has been taken.
    received: AtomicBool,
    /// Makes the message a `T` (the identity, for the `Receiver<Instant>` this channel is
    /// made for: `Flavor<T>` is generic, and this keeps the conversion safe).
    msg: fn(Instant) -> T,
}

impl<T> Channel<T> {
    pub(crate) fn new(delivery_time: Instant, msg: fn(Instant) -> T) -> Self {
        Channel {
            delivery_time,
            received: AtomicBool::new(false),
            msg,
        }
    }

    /// Takes the message if it is due and still there.
    fn take(&self) -> Option<Instant> {
        // Relaxed: an early answer for a message already taken; the swap below decides.
        if self.received.load(Ordering::Relaxed) || Instant::now() < self.delivery_time {
            return None;
        }
        // SYNC POINT: one taker among the receivers' clones; the message is a plain value,
        // so there is nothing to publish.
        (!self.received.swap(true, Ordering::SeqCst)).then_some(self.delivery_time)
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        self.take().map(self.msg).ok_or(TryRecvError::Empty)
    }

    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            if let Some(at) = self.take() {
                return Ok((self.msg)(at));
            }
            if self.received.load(Ordering::Relaxed) {
                // Taken: nothing will ever come.
                sleep_until(deadline);
                return Err(RecvTimeoutError::Timeout);
            }
            let now = Instant::now();
            match deadline {
                Some(d) if now >= d => return Err(RecvTimeoutError::Timeout),
                Some(d) if d < self.delivery_time => sleep_until(Some(d)),
                _ => sleep_until(Some(self.delivery_time)),
            }
        }
    }

    /// When a select waiting on this channel must look again: the due time, unless the
    /// message was taken.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (!self.received.load(Ordering::Relaxed)).then_some(self.delivery_time)
    }

    /// `try_recv` for a select: the message goes into the token.
    pub(crate) fn start_recv(&self, token: &mut Token) -> bool {
        match self.take() {
            Some(at) => {
                token.timer = Some(at);
                true
            }
            None => false,
        }
    }

    /// Completes a select's receive: the message its `start_recv` took.
    pub(crate) fn read(&self, token: &mut Token) -> Result<T, ()> {
        token.timer.take().map(self.msg).ok_or(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.received.load(Ordering::Relaxed)
            || Instant::now() < self.delivery_time
            || self.received.load(Ordering::SeqCst)
    }

    pub(crate) fn len(&self) -> usize {
        usize::from(!self.is_empty())
    }
}
