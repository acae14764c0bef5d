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
/// value or the bytes, a channel inside a message was missing, used twice,
/// out of range or not a channel, or the message broke a decoding limit.
///
/// Where the fault is the peer's (a malformed or hostile message), the
/// precise cause is a [`WireError`], given by [`SerDeError::wire_error`]
/// and as the error's `source`.
#[derive(Debug)]
pub struct SerDeError(pub(crate) SerDeRepr);

#[derive(Debug)]
pub(crate) enum SerDeRepr {
    /// postcard's own error.
    Format(postcard::Error),
    /// A fault courier found while decoding (a limit, a descriptor).
    Peer(WireError),
}

impl SerDeError {
    /// The peer's fault, if this error is one courier could name: a decoding
    /// limit ([`WireError::TooDeep`], [`WireError::DecodeBudget`]) or a
    /// descriptor that is no channel end ([`WireError::BadDescriptor`]).
    pub fn wire_error(&self) -> Option<WireError> {
        match self.0 {
            SerDeRepr::Peer(e) => Some(e),
            SerDeRepr::Format(_) => None,
        }
    }
}

impl fmt::Display for SerDeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            SerDeRepr::Format(e) => write!(f, "serialization error: {e}"),
            SerDeRepr::Peer(e) => write!(f, "serialization error: {e}"),
        }
    }
}

impl std::error::Error for SerDeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            SerDeRepr::Format(e) => Some(e),
            SerDeRepr::Peer(e) => Some(e),
        }
    }
}

impl From<postcard::Error> for SerDeError {
    fn from(e: postcard::Error) -> Self {
        SerDeError(SerDeRepr::Format(e))
    }
}

impl From<WireError> for SerDeError {
    fn from(e: WireError) -> Self {
        SerDeError(SerDeRepr::Peer(e))
    }
}

/// A descriptor turned into a channel end (`TryFrom<OwnedFd>`) that is not
/// one: not a socket, not `SOCK_SEQPACKET`, not a Unix socket, or not
/// connected (a listening socket, or one never connected). The descriptor
/// comes back with it.
pub struct NotAChannelEnd {
    pub(crate) fd: std::os::fd::OwnedFd,
    pub(crate) why: &'static str,
}

impl NotAChannelEnd {
    /// The descriptor, given back.
    pub fn into_fd(self) -> std::os::fd::OwnedFd {
        self.fd
    }
}

impl fmt::Debug for NotAChannelEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotAChannelEnd")
            .field("fd", &self.fd)
            .field("why", &self.why)
            .finish()
    }
}

impl fmt::Display for NotAChannelEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use std::os::fd::AsRawFd;
        write!(
            f,
            "descriptor {} is not a courier channel end: {}",
            self.fd.as_raw_fd(),
            self.why
        )
    }
}

impl std::error::Error for NotAChannelEnd {}

impl From<NotAChannelEnd> for io::Error {
    fn from(e: NotAChannelEnd) -> Self {
        io::Error::new(io::ErrorKind::InvalidInput, e)
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

/// Errors of [`IpcSender::try_send`](super::IpcSender::try_send) and
/// [`IpcBytesSender::try_send`](super::IpcBytesSender::try_send). The
/// message comes back when the channel was full or disconnected; a bytes
/// channel's error holds `()` (the caller still has the bytes it lent).
///
/// `Debug` does not require `T: Debug`: it prints the variant only.
pub enum TrySendError<T> {
    /// The socket had no room for the message: nothing of it was sent.
    Full(T),
    /// The receiver is gone.
    Disconnected(T),
    /// The message could not be serialized, or the send failed otherwise.
    IpcError(IpcError),
}

impl<T> TrySendError<T> {
    /// The message, if it came back (`Full` or `Disconnected`).
    pub fn into_inner(self) -> Option<T> {
        match self {
            TrySendError::Full(msg) | TrySendError::Disconnected(msg) => Some(msg),
            TrySendError::IpcError(_) => None,
        }
    }

    /// `true` if the socket had no room.
    pub fn is_full(&self) -> bool {
        matches!(self, TrySendError::Full(_))
    }

    /// `true` if the receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, TrySendError::Disconnected(_))
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Disconnected(_) => f.write_str("Disconnected(..)"),
            TrySendError::IpcError(e) => f.debug_tuple("IpcError").field(e).finish(),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("sending on a full channel"),
            TrySendError::Disconnected(_) => f.write_str("sending on a disconnected channel"),
            TrySendError::IpcError(e) => e.fmt(f),
        }
    }
}

impl<T> std::error::Error for TrySendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrySendError::IpcError(e) => Some(e),
            _ => None,
        }
    }
}

impl<T> From<TrySendError<T>> for io::Error {
    /// `Full` is [`io::ErrorKind::WouldBlock`], `Disconnected`
    /// [`io::ErrorKind::BrokenPipe`] (the message is dropped).
    fn from(e: TrySendError<T>) -> Self {
        match e {
            TrySendError::Full(_) => io::ErrorKind::WouldBlock.into(),
            TrySendError::Disconnected(_) => io::ErrorKind::BrokenPipe.into(),
            TrySendError::IpcError(e) => e.into(),
        }
    }
}

/// Errors of [`IpcSender::send_timeout`](super::IpcSender::send_timeout)
/// and [`IpcBytesSender::send_timeout`](super::IpcBytesSender::send_timeout),
/// the message handed back as by [`TrySendError`].
pub enum SendTimeoutError<T> {
    /// The socket had no room for the message before the timeout: nothing
    /// of it was sent.
    Timeout(T),
    /// The receiver is gone.
    Disconnected(T),
    /// The message could not be serialized, or the send failed otherwise.
    IpcError(IpcError),
}

impl<T> SendTimeoutError<T> {
    /// The message, if it came back (`Timeout` or `Disconnected`).
    pub fn into_inner(self) -> Option<T> {
        match self {
            SendTimeoutError::Timeout(msg) | SendTimeoutError::Disconnected(msg) => Some(msg),
            SendTimeoutError::IpcError(_) => None,
        }
    }

    /// `true` if the timeout passed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, SendTimeoutError::Timeout(_))
    }

    /// `true` if the receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, SendTimeoutError::Disconnected(_))
    }
}

impl<T> fmt::Debug for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(_) => f.write_str("Timeout(..)"),
            SendTimeoutError::Disconnected(_) => f.write_str("Disconnected(..)"),
            SendTimeoutError::IpcError(e) => f.debug_tuple("IpcError").field(e).finish(),
        }
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(_) => f.write_str("timed out waiting on a send operation"),
            SendTimeoutError::Disconnected(_) => f.write_str("sending on a disconnected channel"),
            SendTimeoutError::IpcError(e) => e.fmt(f),
        }
    }
}

impl<T> std::error::Error for SendTimeoutError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendTimeoutError::IpcError(e) => Some(e),
            _ => None,
        }
    }
}

impl<T> From<SendTimeoutError<T>> for io::Error {
    /// `Timeout` is [`io::ErrorKind::TimedOut`], `Disconnected`
    /// [`io::ErrorKind::BrokenPipe`] (the message is dropped).
    fn from(e: SendTimeoutError<T>) -> Self {
        match e {
            SendTimeoutError::Timeout(_) => io::ErrorKind::TimedOut.into(),
            SendTimeoutError::Disconnected(_) => io::ErrorKind::BrokenPipe.into(),
            SendTimeoutError::IpcError(e) => e.into(),
        }
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
    /// A sender's shared-memory ring is unusable: refused when it came (not
    /// sealed shared memory of the ring's size, or too many rings), or
    /// found corrupt while reading it (an index or length out of its
    /// bounds). The ring is dropped; the channel goes on, without the
    /// messages of that ring's sender still to come.
    BadRing(&'static str),
    /// The rest of a fragmented message did not arrive within the fragment
    /// timeout.
    FragmentTimeout,
    /// A message announced descriptors that did not arrive in time (its
    /// sender died between sending the message and its descriptors, or
    /// never sent them).
    DescriptorsMissing,
    /// A descriptor in the message cannot be what its place in the message
    /// says: an index out of range or used twice, or a channel end that is
    /// not a connected `SOCK_SEQPACKET` Unix socket.
    BadDescriptor(&'static str),
    /// The message's value nests deeper than the decoding depth limit
    /// ([`Config::max_decode_depth`](super::Config::max_decode_depth)).
    TooDeep {
        /// The limit in force.
        limit: u32,
    },
    /// Decoding the message would allocate more than its decoding budget
    /// ([`Config::decode_budget_factor`](super::Config::decode_budget_factor)
    /// times its size): element counts, strings and collections are charged
    /// as they are decoded, so no length a peer claims is trusted.
    DecodeBudget {
        /// The budget of this message, in bytes.
        limit: u64,
    },
    /// Memory for the message could not be reserved (the allocator refused
    /// a reservation of this many bytes); nothing of it was kept.
    OutOfMemory {
        /// The reservation that failed, in bytes.
        requested: u64,
    },
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
            WireError::BadRing(why) => write!(f, "shared-memory ring dropped: {why}"),
            WireError::FragmentTimeout => f.write_str("fragment stream stalled"),
            WireError::DescriptorsMissing => f.write_str("announced descriptors never arrived"),
            WireError::BadDescriptor(why) => write!(f, "bad descriptor in message: {why}"),
            WireError::TooDeep { limit } => {
                write!(f, "message nests deeper than the decoding limit of {limit}")
            }
            WireError::DecodeBudget { limit } => write!(
                f,
                "decoding the message would allocate more than its budget of {limit} bytes"
            ),
            WireError::OutOfMemory { requested } => {
                write!(f, "could not reserve {requested} bytes for the message")
            }
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for io::Error {
    fn from(e: WireError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}
