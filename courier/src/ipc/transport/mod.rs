//! The portable transport: how a message travels between two ends of a
//! channel, written once over the contract of [`crate::ipc::platform`].
//!
//! The wire format (header, descriptor packets) is in [`crate::ipc::wire`].
//!
//! * [`route`]: the sending end, and the choice of route for each message
//!   (inline, a region passed by descriptor, a region the receiver holds,
//!   fragments);
//! * [`frag`]: fragmentation, for a message no packet and no region carries;
//! * [`recv`]: the receiving end, and the completion of a message whose
//!   payload travels elsewhere;
//! * [`pending`]: what a receiver holds between receives (messages waiting
//!   for their descriptors, refused, or complete and not handed out);
//! * [`read`]: the reads of one packet, into the destination or the
//!   thread's scratch area;
//! * [`backlog`]: what a receiver sent to another process takes along;
//! * [`tag`]: the random tags that tie a message to its descriptors;
//! * the region protocol (large payloads in shared memory) is
//!   [`crate::ipc::shm`].

pub(crate) mod backlog;
pub(crate) mod frag;
pub(crate) mod pending;
pub(crate) mod read;
pub(crate) mod recv;
pub(crate) mod ring;
pub(crate) mod rings;
pub(crate) mod route;
pub(crate) mod tag;

use std::time::{Duration, Instant};

use rustix::io::Errno;

pub(crate) use self::backlog::Backlog;
pub(crate) use self::recv::{OsReceiver, Split};
pub(crate) use self::route::OsSender;
use crate::ipc::err::WireError;
use crate::ipc::platform::{BorrowedFd, Os, Process, Transport};
use crate::ipc::wire::Header;

/// Why a send failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The receiving end is closed (`EPIPE`/`ECONNRESET`).
    Disconnected,
    /// No room for the message within the send's wait; nothing was sent.
    /// (`EAGAIN`: only a message's first packet is sent without waiting.)
    Full,
    /// Any other failure.
    Io(std::io::Error),
}

impl From<Errno> for SendError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN => SendError::Disconnected,
            Errno::AGAIN => SendError::Full,
            e => SendError::Io(e.into()),
        }
    }
}

/// Why a receive failed.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// Non-blocking or timed receive: nothing arrived in time.
    Empty,
    /// Every sender is gone and the queue is empty.
    Disconnected,
    /// The peer sent a malformed message; it was dropped. For a refused
    /// data packet, its header (to drop its descriptors when they come).
    Wire(WireError, Option<Header>),
    /// The socket failed.
    Io(std::io::Error),
}

impl From<WireError> for RecvError {
    fn from(e: WireError) -> Self {
        RecvError::Wire(e, None)
    }
}

impl From<Errno> for RecvError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::AGAIN => RecvError::Empty,
            // (`NOTCONN`: a socket that was never connected, which no
            // message can ever reach; ends are checked for it, but an end
            // made from a raw descriptor is the caller's word.)
            Errno::CONNRESET | Errno::NOTCONN => RecvError::Disconnected,
            e => RecvError::Io(e.into()),
        }
    }
}

/// How long a receive, or a send, may wait.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    Block,
    Poll,
    Until(Instant),
}

/// `(sender, receiver)` of a new channel.
pub(crate) fn channel() -> std::io::Result<(OsSender, OsReceiver)> {
    let (tx, rx) = Os::pair()?;
    Ok((OsSender::from_fd(tx), OsReceiver::from_fd(rx)))
}

/// `d` from now, or a century if that is past what an `Instant` holds (a
/// fragment timeout may be set as long as `u64::MAX` milliseconds).
pub(crate) fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}

/// Waits until `fd` is readable (or hung up), or `deadline` passes (then
/// `Empty`). A fiber parks on its worker's reactor.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> Result<(), RecvError> {
    match Os::wait_readable(fd, deadline) {
        Ok(true) => Ok(()),
        Ok(false) => Err(RecvError::Empty),
        Err(e) => Err(RecvError::Io(e)),
    }
}

// ===== One-shot server =====

/// A one-shot server: a listening socket for one client to connect to.
#[derive(Debug)]
pub(crate) struct OsOneShotServer {
    listener: <Os as Process>::Listener,
}

impl OsOneShotServer {
    pub(crate) fn new() -> std::io::Result<(Self, String)> {
        let (listener, name) = Os::listen()?;
        Ok((OsOneShotServer { listener }, name))
    }

    /// Accepts the client's connection, waiting at most `timeout`, and
    /// returns the connection as a receiver.
    pub(crate) fn accept(&self, timeout: Option<Duration>) -> Result<OsReceiver, RecvError> {
        match Os::accept(&self.listener, timeout.map(after)) {
            Ok(Some(fd)) => Ok(OsReceiver::from_fd(fd)),
            Ok(None) => Err(RecvError::Empty),
            Err(e) => Err(RecvError::Io(e)),
        }
    }
}

/// Connects to the one-shot server named `name`.
pub(crate) fn connect(name: &str) -> std::io::Result<OsSender> {
    Os::connect(name).map(OsSender::from_fd)
}
