//! A channel that never delivers a message and is never disconnected: the receiver of
//! [`never`](crate::chan::never) (crossbeam-channel's `flavors/never.rs`).
//!
//! Every operation answers at once from nothing: a receive is empty, a blocking one waits until
//! its deadline (or for ever) through the current task's context, and in a select the
//! operation is never ready, so that swapping it in takes an arm out of a `select!` loop.

use std::time::Instant;

use crate::chan::context::sleep_until;
use crate::chan::err::{RecvTimeoutError, TryRecvError};

/// The channel that stays empty.
pub(crate) struct Channel;

impl Channel {
    pub(crate) fn try_recv<T>(&self) -> Result<T, TryRecvError> {
        Err(TryRecvError::Empty)
    }

    pub(crate) fn recv<T>(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        sleep_until(deadline);
        Err(RecvTimeoutError::Timeout)
    }
}
