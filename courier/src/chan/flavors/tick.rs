//! A channel that delivers a message every period: the receiver of
//! [`tick`](crate::chan::tick) (crossbeam-channel's `flavors/tick.rs`).
//!
//! There is no sender and no thread behind it: the next message is due at `delivery_time`, and
//! every operation reads the clock to learn whether it is. A receive takes the due message and
//! moves the next one a period on, from the later of the due time and now, so ticks that
//! nobody received are not queued: a slow receiver gets one late tick, then the rhythm again.
//! A blocking receive claims the next tick at once and sleeps until it is due, through the
//! current task's context (a thread parks with a timeout, a fiber parks through its
//! scheduler). The message is the instant the tick was due.

use std::time::{Duration, Instant};

use crate::chan::context::sleep_until;
use crate::chan::err::{RecvTimeoutError, TryRecvError};
use crate::chan::flavors::Token;
use crate::sync::{Mutex, MutexGuard};

/// The channel of a periodic message.
pub(crate) struct Channel<T> {
    /// When the next message is due; `None` once that instant would overflow `Instant` (no
    /// more ticks). Behind a lock: the receivers' clones claim ticks, and an `Instant` is two
    /// words.
    delivery_time: Mutex<Option<Instant>>,
    /// The period.
    duration: Duration,
    /// Makes the message a `T` (the identity, for the `Receiver<Instant>` this channel is
    /// made for: `Flavor<T>` is generic, and this keeps the conversion safe).
    msg: fn(Instant) -> T,
}

impl<T> Channel<T> {
    pub(crate) fn new(first: Instant, duration: Duration, msg: fn(Instant) -> T) -> Self {
        Channel {
            delivery_time: Mutex::new(Some(first)),
            duration,
            msg,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Instant>> {
        self.delivery_time.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the due message, if one is due; the next is due a period from now.
    fn take(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut next = self.lock();
        let due = (*next).filter(|&due| due <= now)?;
        *next = now.checked_add(self.duration);
        Some(due)
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        self.take().map(self.msg).ok_or(TryRecvError::Empty)
    }

    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let now = Instant::now();
        let mut next = self.lock();
        let due = match *next {
            Some(due) if deadline.is_none_or(|d| due <= d) => due,
            // Not due before the deadline (or never again): nothing to take.
            _ => {
                drop(next);
                sleep_until(deadline);
                return Err(RecvTimeoutError::Timeout);
            }
        };
        // Claim it now; the next one is due a period after it (or after now, if it is late).
        *next = due.max(now).checked_add(self.duration);
        drop(next);
        if now < due {
            sleep_until(Some(due));
        }
        Ok((self.msg)(due))
    }

    /// When a select waiting on this channel must look again: the next due time.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        *self.lock()
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
        (*self.lock()).is_none_or(|due| Instant::now() < due)
    }

    pub(crate) fn len(&self) -> usize {
        usize::from(!self.is_empty())
    }
}
