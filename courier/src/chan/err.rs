//! Errors of channel operations: one enum per operation, the message handed back on failure.
//!
//! A failed send returns the message it could not deliver (`SendError(msg)`,
//! `TrySendError::Full(msg)`, …) so the caller never loses it; `into_inner` takes it back. `Debug`
//! never requires `T: Debug` (it prints the variant, not the message), so any channel's errors can
//! be `unwrap`ped.

use std::error::Error;
use std::fmt;

/// `send` failed: every receiver is gone. The message is handed back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

/// `try_send` failed.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum TrySendError<T> {
    /// The channel is full (or, for `bounded(0)`, no receiver is waiting).
    Full(T),
    /// Every receiver is gone.
    Disconnected(T),
}

/// `send_timeout` / `send_deadline` failed.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum SendTimeoutError<T> {
    /// The deadline passed before there was room.
    Timeout(T),
    /// Every receiver is gone.
    Disconnected(T),
}

/// `recv` failed: the channel is empty and every sender is gone.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct RecvError;

/// `try_recv` failed.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum TryRecvError {
    /// Nothing to receive right now.
    Empty,
    /// Empty, and every sender is gone.
    Disconnected,
}

/// `recv_timeout` / `recv_deadline` failed.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum RecvTimeoutError {
    /// The deadline passed with nothing to receive.
    Timeout,
    /// Empty, and every sender is gone.
    Disconnected,
}

/// `Select::try_select` found no operation ready.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct TrySelectError;

/// `Select::select_timeout` / `select_deadline` saw no operation ready before the deadline.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct SelectTimeoutError;

/// `Select::try_ready` found no operation ready.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct TryReadyError;

/// `Select::ready_timeout` / `ready_deadline` saw no operation ready before the deadline.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct ReadyTimeoutError;

// ===== impl SendError =====

impl<T> SendError<T> {
    /// The message that could not be sent.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError { .. }")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a disconnected channel")
    }
}

impl<T> Error for SendError<T> {}

// ===== impl TrySendError =====

impl<T> TrySendError<T> {
    /// The message that could not be sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(msg) | Self::Disconnected(msg) => msg,
        }
    }

    /// `true` if the send failed because the channel was full.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// `true` if the send failed because every receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Disconnected(_))
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("Full(..)"),
            Self::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("sending on a full channel"),
            Self::Disconnected(_) => f.write_str("sending on a disconnected channel"),
        }
    }
}

impl<T> Error for TrySendError<T> {}

impl<T> From<SendError<T>> for TrySendError<T> {
    fn from(SendError(msg): SendError<T>) -> Self {
        Self::Disconnected(msg)
    }
}

// ===== impl SendTimeoutError =====

impl<T> SendTimeoutError<T> {
    /// The message that could not be sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Timeout(msg) | Self::Disconnected(msg) => msg,
        }
    }

    /// `true` if the deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    /// `true` if every receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Disconnected(_))
    }
}

impl<T> fmt::Debug for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(_) => f.write_str("Timeout(..)"),
            Self::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(_) => f.write_str("timed out waiting on a send operation"),
            Self::Disconnected(_) => f.write_str("sending on a disconnected channel"),
        }
    }
}

impl<T> Error for SendTimeoutError<T> {}

impl<T> From<SendError<T>> for SendTimeoutError<T> {
    fn from(SendError(msg): SendError<T>) -> Self {
        Self::Disconnected(msg)
    }
}

// ===== impl the receive errors =====

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("receiving on an empty and disconnected channel")
    }
}

impl Error for RecvError {}

impl TryRecvError {
    /// `true` if nothing was there to receive.
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Empty)
    }

    /// `true` if every sender is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Disconnected)
    }
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("receiving on an empty channel"),
            Self::Disconnected => f.write_str("receiving on an empty and disconnected channel"),
        }
    }
}

impl Error for TryRecvError {}

impl From<RecvError> for TryRecvError {
    fn from(_: RecvError) -> Self {
        Self::Disconnected
    }
}

impl RecvTimeoutError {
    /// `true` if the deadline passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout)
    }

    /// `true` if every sender is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Disconnected)
    }
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out waiting on a receive operation"),
            Self::Disconnected => f.write_str("receiving on an empty and disconnected channel"),
        }
    }
}

impl Error for RecvTimeoutError {}

impl From<RecvError> for RecvTimeoutError {
    fn from(_: RecvError) -> Self {
        Self::Disconnected
    }
}

impl fmt::Display for TrySelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("all operations in select would block")
    }
}

impl Error for TrySelectError {}

impl fmt::Display for SelectTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("timed out waiting on select")
    }
}

impl Error for SelectTimeoutError {}

impl fmt::Display for TryReadyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no operation in select is ready")
    }
}

impl Error for TryReadyError {}

impl fmt::Display for ReadyTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("timed out waiting for an operation in select to become ready")
    }
}

impl Error for ReadyTimeoutError {}
