//! Errors of the `ipc` layer.
//!
//! The public types keep ipc-channel's names and shapes ([`IpcError`],
//! [`TryRecvError`], [`SerDeError`]) so that its users switch by changing an
//! import. Underneath, a peer's fault is a precise [`WireError`], carried in
//! `IpcError::Io` as an [`io::Error`] of kind [`io::ErrorKind::InvalidData`]
//! that can be downcast back:
//!
//! ```
//! # use courier::ipc::{IpcError, WireError};
//! # fn inspect(err: IpcError) {
//! if let IpcError::Io(io) = &err {
//!     if let Some(wire) = io.get_ref().and_then(|e| e.downcast_ref::<WireError>()) {
//!         eprintln!("the peer sent a malformed message: {wire}");
//!     }
//! }
//! # }
//! ```

use std::fmt;
use std::io;

/// A message that could not be encoded or decoded: the format rejected the
/// value or the bytes, or a channel inside a message was missing, used twice
/// or out of range.
#[derive(Debug)]
pub struct SerDeError(pub(crate) postcard::Error);

impl fmt::Display for SerDeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "serialization error: {}", self.0)
    }
}

impl std::error::Error for SerDeError {}

impl From<postcard::Error> for SerDeError {
    fn from(e: postcard::Error) -> Self {
        SerDeError(e)
    }
}

/// Errors of a send or a blocking receive.
#[derive(Debug)]
pub enum IpcError {
    /// The message could not be serialized or deserialized.
    SerializationError(SerDeError),
    /// An I/O error, or a malformed message from the peer (a [`WireError`]
    /// inside an [`io::ErrorKind::InvalidData`] error).
    Io(io::Error),
    /// The other end is gone: every sender was dropped (and no message is
    /// left), or the receiver was dropped.
    Disconnected,
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpcError::SerializationError(e) => write!(f, "error in decoding or encoding: {e}"),
            IpcError::Io(e) => write!(f, "I/O error: {e}"),
            IpcError::Disconnected => f.write_str("channel disconnected"),
        }
    }
}

impl std::error::Error for IpcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IpcError::SerializationError(e) => Some(e),
            IpcError::Io(e) => Some(e),
            IpcError::Disconnected => None,
        }
    }
}

impl From<SerDeError> for IpcError {
    fn from(e: SerDeError) -> Self {
        IpcError::SerializationError(e)
    }
}

impl From<io::Error> for IpcError {
    fn from(e: io::Error) -> Self {
        IpcError::Io(e)
    }
}

impl From<WireError> for IpcError {
    fn from(e: WireError) -> Self {
        IpcError::Io(e.into())
    }
}

impl From<IpcError> for io::Error {
    fn from(e: IpcError) -> Self {
        match e {
            IpcError::Io(e) => e,
            IpcError::Disconnected => io::ErrorKind::BrokenPipe.into(),
            IpcError::SerializationError(e) => io::Error::new(io::ErrorKind::InvalidData, e),
        }
    }
}

/// Errors of a non-blocking or timed receive.
#[derive(Debug)]
pub enum TryRecvError {
    /// The receive failed.
    IpcError(IpcError),
    /// No message was ready (within the timeout, for a timed receive).
    Empty,
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::IpcError(e) => e.fmt(f),
            TryRecvError::Empty => f.write_str("channel empty"),
        }
    }
}

impl std::error::Error for TryRecvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TryRecvError::IpcError(e) => Some(e),
            TryRecvError::Empty => None,
        }
    }
}

impl From<IpcError> for TryRecvError {
    fn from(e: IpcError) -> Self {
        TryRecvError::IpcError(e)
    }
}

/// Errors of a non-blocking or timed select over an
/// [`IpcReceiverSet`](super::IpcReceiverSet).
#[derive(Debug)]
pub enum TrySelectError {
    /// The select failed (a malformed message is a [`WireError`] inside an
    /// [`io::ErrorKind::InvalidData`] error, as for a receive).
    IoError(io::Error),
    /// No message arrived and no channel closed (within the timeout, for a
    /// timed select).
    Empty,
}

impl fmt::Display for TrySelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySelectError::IoError(e) => write!(f, "I/O error: {e}"),
            TrySelectError::Empty => {
                f.write_str("no messages were received and no channel was closed")
            }
        }
    }
}

impl std::error::Error for TrySelectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrySelectError::IoError(e) => Some(e),
            TrySelectError::Empty => None,
        }
    }
}

impl From<io::Error> for TrySelectError {
    fn from(e: io::Error) -> Self {
        TrySelectError::IoError(e)
    }
}

/// A malformed message from the peer. The message is dropped with every
/// descriptor that came with it; the channel stays usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The header is not a courier header, or its fields contradict each other.
    BadHeader(&'static str),
    /// The message claims more payload bytes than this receiver accepts.
    TooLarge {
        /// What the header claims.
        claimed: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// The payload is shorter or longer than the header says, or a packet did
    /// not fit the receive buffer (`MSG_TRUNC`), or a fragment stream ended
    /// early.
    Truncated,
    /// More descriptors arrived than the control buffer holds (`MSG_CTRUNC`).
    ControlTruncated,
    /// The number of descriptors differs from what the header announces.
    UnexpectedFds {
        /// What the header announces.
        announced: usize,
        /// What arrived.
        received: usize,
    },
    /// A shared-memory region that came with the message is unusable: not
    /// shared memory (or on hugetlbfs), not sealed against shrinking and
    /// growing, empty or smaller than the payload it claims to hold, or not
    /// mappable for writing.
    BadRegion,
    /// The rest of a fragmented message did not arrive within the fragment
    /// timeout.
    FragmentTimeout,
    /// A message announced descriptors that did not arrive in time (its
    /// sender died between sending the message and its descriptors, or
    /// never sent them).
    DescriptorsMissing,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadHeader(why) => write!(f, "malformed message header: {why}"),
            WireError::TooLarge { claimed, limit } => {
                write!(
                    f,
                    "message of {claimed} bytes exceeds the limit of {limit} bytes"
                )
            }
            WireError::Truncated => f.write_str("message truncated"),
            WireError::ControlTruncated => {
                f.write_str("too many descriptors (control data truncated)")
            }
            WireError::UnexpectedFds {
                announced,
                received,
            } => {
                write!(
                    f,
                    "header announces {announced} descriptors, {received} arrived"
                )
            }
            WireError::BadRegion => f.write_str(
                "shared memory region refused (not sealed shared memory, too small, or not writable)",
            ),
            WireError::FragmentTimeout => f.write_str("fragment stream stalled"),
            WireError::DescriptorsMissing => f.write_str("announced descriptors never arrived"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for io::Error {
    fn from(e: WireError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}
