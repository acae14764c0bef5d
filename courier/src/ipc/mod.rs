//! Channels between processes, with the names and signatures of the
//! `ipc-channel` crate's core API: switching is a change of import.
//!
//! ```
//! use courier::ipc;
//!
//! let (tx, rx) = ipc::channel::<(u32, String)>().unwrap();
//! tx.send((7, "seven".to_owned())).unwrap();
//! assert_eq!(rx.recv().unwrap(), (7, "seven".to_owned()));
//!
//! // Channel ends travel inside messages.
//! let (reply_tx, reply_rx) = ipc::channel::<u64>().unwrap();
//! let (req_tx, req_rx) = ipc::channel::<ipc::IpcSender<u64>>().unwrap();
//! req_tx.send(reply_tx).unwrap();
//! req_rx.recv().unwrap().send(42).unwrap();
//! assert_eq!(reply_rx.recv().unwrap(), 42);
//! ```
//!
//! An end sent inside a message is normally moved into it (`send` takes the
//! message by value). Should a message reach an end by reference instead
//! (an `Rc`, or a hand-written `Serialize`), the end is duplicated: the copy
//! that travels takes along the messages the receiver had read but not
//! handed out, and the one left behind stays usable and shares the socket
//! with it. ipc-channel's serialization empties the original instead.
//!
//! # Messages and cost
//! Typed messages are serde types, encoded with
//! [postcard](https://docs.rs/postcard) (chosen by measurement: the
//! `courier-bench serde` suite). A byte field (`Vec<u8>`, `&[u8]`,
//! `Box<[u8]>`, or one marked `#[serde(with = "serde_bytes")]`, which costs
//! the same) goes as one byte string: one copy, not serde's per-byte
//! sequence path (about 2 ns a byte in any format, which courier recognises
//! and skips), and a large one is sent straight from the caller's memory and
//! received into a buffer of its own. Untyped bytes skip serde entirely:
//! [`bytes_channel`], with [`IpcBytesSender::send_vectored`] to send a header
//! and a body without concatenating them.
//!
//! From a sender's second message on, a message of up to
//! [`RING_RECORD_MAX`] bytes goes through a shared-memory ring that sender
//! sets up with its receiver: no system call while the receiver keeps up,
//! one wake-up packet when it sleeps ([`Config::ring`], `docs/ring.md`).
//! Without a ring, a message is one send and one receive system call when it
//! fits one packet (about 208 KiB with Linux defaults). Channels add a
//! descriptor packet per 253 descriptors (Linux's `SCM_MAX_FD`). A larger
//! payload goes through a pooled, sealed memfd region (one copy in, one copy
//! out, no page faults once warm), or, with [`LargeMessages::Fragments`], is
//! fragmented over a socket dedicated to it. A sender's messages arrive in
//! the order sent, whichever way each goes. A message carries at most
//! [`MAX_FDS`] (4,096) channels, shared-memory regions ([`IpcSharedMemory`]:
//! memory every process it reaches maps, sent as a descriptor, never copied)
//! and [`IpcFd`]s; a send of more fails before anything is sent.
//!
//! # Allocation
//! Sending allocates nothing once warm: typed messages are encoded into a
//! per-thread buffer that is kept for reuse up to 16 MiB. Receiving a typed
//! message reuses the receiver's buffer (also kept up to 16 MiB); receiving bytes allocates exactly the
//! returned `Vec`, sized from the previous message so that a steady stream is
//! received in place. A header that claims more than the receiver's limit
//! ([`Config::max_message_size`], 1 GiB by default) is refused before
//! anything is allocated.
//!
//! # Disconnection
//! When every sender of a channel is dropped (in every process), `recv`
//! returns the messages still queued and then [`IpcError::Disconnected`]. When
//! the receiver is dropped, `send` returns [`IpcError::Disconnected`] (bytes
//! channels: an [`io::Error`] of kind [`io::ErrorKind::BrokenPipe`]); a send
//! never raises `SIGPIPE`. A peer that is killed is the same as a peer that
//! dropped its end.
//!
//! # Backpressure
//! A channel holds what its sending socket's buffer holds (about 208 KiB
//! with Linux defaults, small messages a few hundred bytes each with the
//! kernel's overhead; a large payload travels in shared memory and queues
//! only its header, up to [`Config::max_region_bytes_in_flight`] of regions
//! not yet read). When it is full, [`IpcSender::send`] waits for the
//! receiver to read (a fiber parks, its worker runs on),
//! [`IpcSender::try_send`] hands the message back in [`TrySendError::Full`]
//! and [`IpcSender::send_timeout`] in [`SendTimeoutError::Timeout`], with
//! nothing of it sent; the bytes channel's senders do the same. A message
//! is never half sent: see `try_send` for the few that may wait to complete
//! once their first packet is out.
//!
//! # Untrusted peers
//! Every length, index and descriptor from the wire is checked. A malformed
//! message is an [`IpcError::Io`] carrying a [`WireError`]; its descriptors are
//! closed, and the channel remains usable for the messages after it. Decoding
//! a typed message is bounded too: in depth ([`Config::max_decode_depth`]) and
//! in what it may allocate ([`Config::decode_budget_factor`]), so that neither
//! a deeply nested value nor a claimed element count can exhaust the stack or
//! the memory; a message past either fails with an
//! [`IpcError::SerializationError`] whose [`SerDeError::wire_error`] names
//! the limit. SECURITY.md, at the root of the repository, lists every limit
//! with its default and the test that shows it.

mod bytes_seq;
mod config;
mod err;
mod fd;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz;
mod handles;
mod message;
mod platform;
mod select;
mod server;
mod shm;
mod shmem;
mod split;
mod transport;
mod wire;

use std::cell::Cell;
use std::fmt;
use std::io::{self, IoSlice};
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use self::config::{Config, LargeMessages, DECODE_BUDGET_MIN, RING_RECORD_MAX};
pub use self::err::{
    IpcError, NotAChannelEnd, SendTimeoutError, SerDeError, TryRecvError, TrySelectError,
    TrySendError, WireError,
};
pub use self::fd::{as_fd, IpcFd};
pub use self::message::{IpcMessage, OpaqueIpcReceiver, OpaqueIpcSender};
pub(crate) use self::select::SetEvent;
pub use self::select::{IpcReceiverSet, IpcSelectionResult, DRAIN_LIMIT};
pub use self::server::IpcOneShotServer;
pub use self::shmem::IpcSharedMemory;
use self::split::{Layout, Parts};
use self::transport::{OsReceiver, OsSender, RecvError, SendError, Split, Wait};
pub use self::wire::MAX_FDS;

/// Creates a typed channel.
pub fn channel<T>() -> Result<(IpcSender<T>, IpcReceiver<T>), io::Error>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    let (tx, rx) = transport::channel()?;
    Ok((IpcSender::from_os(tx), IpcReceiver::from_os(rx)))
}

/// Creates a channel of raw bytes (no serde on either side).
pub fn bytes_channel() -> Result<(IpcBytesSender, IpcBytesReceiver), io::Error> {
    let (tx, rx) = transport::channel()?;
    Ok((IpcBytesSender { os: tx }, IpcBytesReceiver::from_os(rx)))
}

// ===== errors from the platform layer =====

impl From<SendError> for IpcError {
    fn from(e: SendError) -> Self {
        match e {
            SendError::Disconnected => IpcError::Disconnected,
            SendError::Full => IpcError::Io(io::ErrorKind::WouldBlock.into()),
            SendError::Io(e) => IpcError::Io(e),
        }
    }
}

/// The result of a send that may not wait for ever, with `msg` handed back
/// when nothing of it was sent (full) or the receiver is gone.
fn try_sent<T>(sent: Result<(), SendError>, msg: T) -> Result<(), TrySendError<T>> {
    match sent {
        Ok(()) => Ok(()),
        Err(SendError::Full) => Err(TrySendError::Full(msg)),
        Err(SendError::Disconnected) => Err(TrySendError::Disconnected(msg)),
        Err(SendError::Io(e)) => Err(TrySendError::IpcError(IpcError::Io(e))),
    }
}

impl<T> From<TrySendError<T>> for SendTimeoutError<T> {
    fn from(e: TrySendError<T>) -> Self {
        match e {
            TrySendError::Full(msg) => SendTimeoutError::Timeout(msg),
            TrySendError::Disconnected(msg) => SendTimeoutError::Disconnected(msg),
            TrySendError::IpcError(e) => SendTimeoutError::IpcError(e),
        }
    }
}

impl From<RecvError> for TryRecvError {
    fn from(e: RecvError) -> Self {
        match e {
            RecvError::Empty => TryRecvError::Empty,
            RecvError::Disconnected => TryRecvError::IpcError(IpcError::Disconnected),
            RecvError::Wire(e, _) => TryRecvError::IpcError(e.into()),
            RecvError::Io(e) => TryRecvError::IpcError(IpcError::Io(e)),
        }
    }
}

impl From<RecvError> for IpcError {
    fn from(e: RecvError) -> Self {
        match TryRecvError::from(e) {
            TryRecvError::IpcError(e) => e,
            TryRecvError::Empty => IpcError::Io(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// The result of a blocking receive, which cannot be `Empty`.
fn blocking<T>(result: Result<T, TryRecvError>) -> Result<T, IpcError> {
    result.map_err(|e| match e {
        TryRecvError::IpcError(e) => e,
        TryRecvError::Empty => IpcError::Io(io::ErrorKind::WouldBlock.into()),
    })
}

fn deadline(timeout: Duration) -> Wait {
    Instant::now()
        .checked_add(timeout)
        .map_or(Wait::Block, Wait::Until)
}

thread_local! {
    /// The buffer typed messages are encoded into before a send and received
    /// into before decoding: one per thread, reused, so neither allocates.
    /// One for both directions keeps a thread that sends and receives in turn
    /// (request and reply) within less memory: with a buffer per direction a
    /// 16 KiB echo touched four 16 KiB buffers per message, which overflows
    /// a 32 KiB L1 data cache (callgrind's cache model: 14x the misses).
    static MSG_BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Largest message buffer a thread keeps: dropping a large buffer and
/// faulting a new one in on the next message costs more than the message
/// itself (8 MiB: ~4 ms of page faults against ~0.3 ms of copying).
const KEEP_MSG_BUF: usize = 16 << 20;

// ===== IpcSender =====

/// The sending end of a typed channel. Cloneable, `Send` and `Sync`; itself
/// serializable, so it can be sent to another process inside a message.
pub struct IpcSender<T> {
    os: OsSender,
    _type: PhantomData<fn(T)>,
}

impl<T> IpcSender<T> {
    /// This sender never sets up a shared-memory ring: for a channel that
    /// carries rare wake-ups within one process (the router's), where a
    /// ring would only hold a descriptor and 68 KiB for nothing.
    pub(crate) fn without_ring(self) -> Self {
        self.os.without_ring();
        self
    }
}

impl<T> IpcSender<T>
where
    T: Serialize,
{
    fn from_os(os: OsSender) -> Self {
        IpcSender {
            os,
            _type: PhantomData,
        }
    }

    /// Connects to the [`IpcOneShotServer`] named `name`. A failure names
    /// the server it could not reach (its path).
    pub fn connect(name: String) -> Result<IpcSender<T>, io::Error> {
        match transport::connect(&name) {
            Ok(os) => Ok(IpcSender::from_os(os)),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("cannot connect to the one-shot server {name:?}: {e}"),
            )),
        }
    }

    /// Sends `data`, waiting while the channel is full.
    ///
    /// # Blocking
    /// The kernel queues a channel's messages in the sending socket's
    /// buffer (`SO_SNDBUF`, about 208 KiB with Linux defaults, counted with
    /// the kernel's overhead of some hundreds of bytes a packet) until the
    /// receiver reads them; a large payload queues only its header there
    /// (it travels in shared memory). `send` returns as soon as its message
    /// is queued: it never waits for the receiver while there is room, and
    /// while there is none it waits until the receiver has read enough
    /// (until a quarter of the buffer or less is left queued). A thread
    /// waits in `poll(2)`; a fiber parks, and its worker runs other fibers
    /// meanwhile. If the receiver is dropped (or its process dies) during
    /// the wait, `send` returns [`IpcError::Disconnected`]. A message is
    /// never half sent: if it takes several packets (channels inside it, a
    /// fragmented payload), its later packets are sent whatever the wait.
    ///
    /// [`try_send`](Self::try_send) does not wait, and
    /// [`send_timeout`](Self::send_timeout) waits up to a timeout.
    pub fn send(&self, data: T) -> Result<(), IpcError> {
        Ok(self.send_wait(&data, Wait::Block)??)
    }

    /// Sends `data` if the channel has room for it now, without waiting;
    /// else hands it back in [`TrySendError::Full`], with nothing of it sent.
    ///
    /// "Room" is room in the socket's send buffer for the message's first
    /// packet, and for its later packets too: a message that carries
    /// channels is a data packet and a descriptor packet, sent only if both
    /// fit, so that the second never waits for the receiver. A large
    /// payload goes in shared memory, and a sender whose regions not yet
    /// read by the receiver reach [`Config::max_region_bytes_in_flight`]
    /// finds the channel full as well. Three cases may still wait after the
    /// first packet is out, to complete the message: a clone of this sender
    /// on another thread took the room between the look and the send; a
    /// payload near the packet limit (about 208 KiB) carries channels, and
    /// its descriptor packet fits only once the receiver has read the data
    /// packet (such a message is sent when the socket is empty: it would
    /// never fit otherwise); a message fragmented by
    /// [`LargeMessages::Fragments`] writes its rest as the receiver reads it.
    ///
    /// ```
    /// use courier::ipc::{self, TrySendError};
    /// let (tx, rx) = ipc::channel::<u64>().unwrap();
    /// let mut sent = 0;
    /// let full = loop {
    ///     match tx.try_send(sent) {
    ///         Ok(()) => sent += 1,
    ///         Err(TrySendError::Full(msg)) => break msg,
    ///         Err(e) => panic!("{e}"),
    ///     }
    /// };
    /// assert_eq!(full, sent); // handed back
    /// assert_eq!(rx.recv().unwrap(), 0);
    /// ```
    pub fn try_send(&self, data: T) -> Result<(), TrySendError<T>> {
        match self.send_wait(&data, Wait::Poll) {
            Ok(sent) => try_sent(sent, data),
            Err(e) => Err(TrySendError::IpcError(e.into())),
        }
    }

    /// Sends `data`, waiting at most `timeout` for room as
    /// [`try_send`](Self::try_send) counts it; else hands it back in
    /// [`SendTimeoutError::Timeout`], with nothing of it sent. The wait is
    /// as [`send`](Self::send)'s (a fiber parks); a message that took its
    /// first packet before the timeout is completed even if that takes
    /// longer (see `try_send` for when it can).
    pub fn send_timeout(&self, data: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        match self.send_wait(&data, deadline(timeout)) {
            Ok(sent) => Ok(try_sent(sent, data)?),
            Err(e) => Err(SendTimeoutError::IpcError(e.into())),
        }
    }

    /// Serializes `data` into the thread's buffer and sends it, waiting for
    /// room as `wait` allows.
    fn send_wait(&self, data: &T, wait: Wait) -> Result<Result<(), SendError>, SerDeError> {
        // Take the thread's buffer (a nested send, from a `Serialize` impl,
        // finds it empty and uses its own).
        // (`try_with`: a send from a thread-local's `Drop` may find the
        // buffer gone, and then uses its own.)
        let mut buf = MSG_BUF.try_with(Cell::take).unwrap_or_default();
        let sent = handles::serialize_message(data, &mut buf, |parts, fds| {
            self.os.send_wait(parts, fds, wait)
        });
        if buf.capacity() <= KEEP_MSG_BUF {
            let _ = MSG_BUF.try_with(|b| b.set(buf));
        }
        sent
    }

    /// Erases the message type.
    pub fn to_opaque(self) -> OpaqueIpcSender {
        OpaqueIpcSender { os: self.os }
    }
}

impl<T> Clone for IpcSender<T> {
    fn clone(&self) -> Self {
        IpcSender {
            os: self.os.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> fmt::Debug for IpcSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcSender")
            .field("fd", &self.os.fd())
            .finish()
    }
}

// ===== IpcReceiver =====

/// The receiving end of a typed channel. `Send` but not `Sync`; serializable,
/// so it can be moved to another process inside a message.
pub struct IpcReceiver<T> {
    os: OsReceiver,
    /// This receiver's size limit, if set (else the process's).
    limit: Cell<Option<u64>>,
    /// Where the last message's first large byte string sat: where the next
    /// one's is expected.
    layout: Cell<Option<Layout>>,
    _type: PhantomData<fn() -> T>,
}

impl<T> IpcReceiver<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    fn from_os(os: OsReceiver) -> Self {
        IpcReceiver {
            os,
            limit: Cell::new(None),
            layout: Cell::new(None),
            _type: PhantomData,
        }
    }

    /// Blocks until a message arrives, or every sender is gone.
    pub fn recv(&self) -> Result<T, IpcError> {
        blocking(self.recv_wait(Wait::Block))
    }

    /// Receives a message if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.recv_wait(Wait::Poll)
    }

    /// Waits up to `duration` for a message.
    pub fn try_recv_timeout(&self, duration: Duration) -> Result<T, TryRecvError> {
        self.recv_wait(deadline(duration))
    }

    /// Sets the largest message this receiver accepts, in bytes.
    pub fn set_max_message_size(&self, bytes: u64) {
        self.limit.set(Some(bytes));
    }

    /// Erases the message type.
    pub fn to_opaque(self) -> OpaqueIpcReceiver {
        OpaqueIpcReceiver { os: self.os }
    }

    /// When this receiver must be read again even if its socket stays
    /// quiet: it holds a message its socket's readiness will not announce
    /// (see `OsReceiver::due`). For waiters on the socket other than `recv`.
    #[cfg(feature = "async")]
    pub(crate) fn due(&self) -> Option<Instant> {
        self.os.due()
    }

    fn recv_wait(&self, wait: Wait) -> Result<T, TryRecvError> {
        // The thread's buffer, as in `IpcSender::send` (a nested receive,
        // from a `Deserialize` impl, finds it empty and uses its own).
        let mut buf = MSG_BUF.try_with(Cell::take).unwrap_or_default();
        let received = self.recv_in(&mut buf, wait);
        if buf.capacity() <= KEEP_MSG_BUF {
            let _ = MSG_BUF.try_with(|b| b.set(buf));
        }
        received
    }

    fn recv_in(&self, buf: &mut Vec<u8>, wait: Wait) -> Result<T, TryRecvError> {
        let limit = self
            .limit
            .get()
            .unwrap_or_else(Config::max_message_size_now);
        // A large byte string where the last message had one goes into a
        // buffer of its own, which the field it belongs to then keeps.
        let (fds, split_off) = match self.layout.get() {
            None => (self.os.recv_into(buf, wait, limit)?, None),
            Some(layout) => {
                let mut string = Vec::new();
                let split = Split {
                    layout,
                    string: &mut string,
                };
                let (fds, split_off) = self.os.recv_message(buf, Some(split), wait, limit)?;
                (fds, split_off.then_some((layout.at, string)))
            }
        };
        let parts = match split_off {
            Some((at, string)) => Parts {
                head: &buf[..at],
                string: Some(string),
                tail: &buf[at..],
            },
            None => Parts {
                head: buf,
                string: None,
                tail: &[],
            },
        };
        Ok(
            handles::deserialize_message(parts, fds, &self.layout, limit)
                .map_err(IpcError::from)?,
        )
    }
}

impl<T> fmt::Debug for IpcReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcReceiver")
            .field("fd", &self.os.fd())
            .finish()
    }
}

// ===== bytes channels =====

/// The sending end of a bytes channel.
#[derive(Clone)]
pub struct IpcBytesSender {
    os: OsSender,
}

impl IpcBytesSender {
    /// Sends `data` as one message, waiting while the channel is full (as
    /// [`IpcSender::send`] does). A closed receiver is an error of kind
    /// [`io::ErrorKind::BrokenPipe`].
    #[inline]
    pub fn send(&self, data: &[u8]) -> Result<(), io::Error> {
        self.send_vectored(&[IoSlice::new(data)])
    }

    /// Sends `data` if the channel has room for it now (as
    /// [`IpcSender::try_send`] counts it), without waiting; else
    /// [`TrySendError::Full`], with nothing sent. The bytes were only lent:
    /// the error holds `()`, and the caller still has them to send again.
    pub fn try_send(&self, data: &[u8]) -> Result<(), TrySendError<()>> {
        try_sent(
            self.os.send_wait(&[IoSlice::new(data)], &[], Wait::Poll),
            (),
        )
    }

    /// Sends `data`, waiting at most `timeout` for room (as
    /// [`IpcSender::send_timeout`] does); else
    /// [`SendTimeoutError::Timeout`], with nothing sent.
    pub fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<(), SendTimeoutError<()>> {
        let sent = self
            .os
            .send_wait(&[IoSlice::new(data)], &[], deadline(timeout));
        Ok(try_sent(sent, ())?)
    }

    /// Sends the concatenation of `parts` as one message, gathered by the
    /// kernel: the parts are never copied into one buffer.
    ///
    /// ```
    /// # use std::io::IoSlice;
    /// let (tx, rx) = courier::ipc::bytes_channel().unwrap();
    /// tx.send_vectored(&[IoSlice::new(b"header:"), IoSlice::new(b"body")]).unwrap();
    /// assert_eq!(rx.recv().unwrap(), b"header:body");
    /// ```
    pub fn send_vectored(&self, parts: &[IoSlice<'_>]) -> Result<(), io::Error> {
        self.os
            .send(parts, &[])
            .map_err(|e| io::Error::from(IpcError::from(e)))
    }

    /// [`send_vectored`](Self::send_vectored) if the channel has room for
    /// the message now, without waiting (as [`try_send`](Self::try_send));
    /// else [`TrySendError::Full`], with nothing sent.
    pub fn try_send_vectored(&self, parts: &[IoSlice<'_>]) -> Result<(), TrySendError<()>> {
        try_sent(self.os.send_wait(parts, &[], Wait::Poll), ())
    }

    /// [`send_vectored`](Self::send_vectored), waiting at most `timeout` for
    /// room (as [`send_timeout`](Self::send_timeout)); else
    /// [`SendTimeoutError::Timeout`], with nothing sent.
    pub fn send_vectored_timeout(
        &self,
        parts: &[IoSlice<'_>],
        timeout: Duration,
    ) -> Result<(), SendTimeoutError<()>> {
        Ok(try_sent(
            self.os.send_wait(parts, &[], deadline(timeout)),
            (),
        )?)
    }
}

impl fmt::Debug for IpcBytesSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcBytesSender")
            .field("fd", &self.os.fd())
            .finish()
    }
}

/// The receiving end of a bytes channel.
pub struct IpcBytesReceiver {
    os: OsReceiver,
    limit: Cell<Option<u64>>,
}

/// Smallest buffer a bytes receive starts with.
const MIN_GUESS: usize = 64;

impl IpcBytesReceiver {
    fn from_os(os: OsReceiver) -> Self {
        IpcBytesReceiver {
            os,
            limit: Cell::new(None),
        }
    }

    /// Blocks until a message arrives, or every sender is gone.
    #[inline]
    pub fn recv(&self) -> Result<Vec<u8>, IpcError> {
        blocking(self.recv_wait(Wait::Block))
    }

    /// Receives a message if one is queued.
    pub fn try_recv(&self) -> Result<Vec<u8>, TryRecvError> {
        self.recv_wait(Wait::Poll)
    }

    /// Waits up to `duration` for a message (ipc-channel lacks this one).
    pub fn try_recv_timeout(&self, duration: Duration) -> Result<Vec<u8>, TryRecvError> {
        self.recv_wait(deadline(duration))
    }

    /// Sets the largest message this receiver accepts, in bytes.
    pub fn set_max_message_size(&self, bytes: u64) {
        self.limit.set(Some(bytes));
    }

    fn recv_wait(&self, wait: Wait) -> Result<Vec<u8>, TryRecvError> {
        let limit = self
            .limit
            .get()
            .unwrap_or_else(Config::max_message_size_now);
        // Sized as the last message, so that a steady stream of large
        // messages is received in place with no extra copy. (Fallibly: the
        // last message was the peer's choice, up to the size limit.)
        let mut data = Vec::new();
        if data
            .try_reserve_exact(self.os.last_len().max(MIN_GUESS))
            .is_err()
        {
            data.reserve_exact(MIN_GUESS);
        }
        let fds = self.os.recv_into(&mut data, wait, limit)?;
        // Bytes channels carry no channels; close whatever a peer attached.
        drop(fds);
        if data.capacity() - data.len() > 4096 && data.capacity() / 2 > data.len() {
            data.shrink_to_fit();
        }
        Ok(data)
    }
}

impl fmt::Debug for IpcBytesReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcBytesReceiver")
            .field("fd", &self.os.fd())
            .finish()
    }
}

// ===== descriptors: interop and serde =====

/// Every channel end is a descriptor. It travels inside messages as the
/// index of its descriptor in the message's descriptor table (see
/// `handles`); it can also be inherited by a child process (clear
/// `FD_CLOEXEC` on a duplicate) and rebuilt there with `TryFrom<OwnedFd>`,
/// which checks that the descriptor is a connected `SOCK_SEQPACKET` Unix
/// socket and says what is wrong if it is not ([`NotAChannelEnd`]).
macro_rules! channel_end {
    ($($ty:ident $(<$t:ident>)? => $os:ident, $build:expr, $ser:path, $de:path;)*) => {$(
        impl$(<$t>)? AsFd for $ty$(<$t>)? {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.os.fd()
            }
        }

        impl$(<$t>)? TryFrom<OwnedFd> for $ty$(<$t>)? {
            type Error = NotAChannelEnd;

            /// The end on `fd`, if it is one end of a channel (a connected
            /// `SOCK_SEQPACKET` Unix socket); else the descriptor back, with
            /// what is wrong with it.
            fn try_from(fd: OwnedFd) -> Result<Self, NotAChannelEnd> {
                if let Err(WireError::BadDescriptor(why)) = handles::check_channel_end(fd.as_fd()) {
                    return Err(NotAChannelEnd { fd, why });
                }
                let build: fn($os) -> Self = $build;
                Ok(build($os::from_fd(fd)))
            }
        }

        impl$(<$t>)? Serialize for $ty$(<$t>)? {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $ser(&self.os, serializer)
            }
        }

        impl<'de, $($t)?> Deserialize<'de> for $ty$(<$t>)? {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let build: fn($os) -> Self = $build;
                Ok(build($de(deserializer)?))
            }
        }
    )*};
}

channel_end! {
    IpcSender<T> => OsSender, |os| IpcSender { os, _type: PhantomData },
        serialize_sender, deserialize_sender;
    IpcReceiver<T> => OsReceiver,
        |os| IpcReceiver {
            os,
            limit: Cell::new(None),
            layout: Cell::new(None),
            _type: PhantomData,
        },
        handles::serialize_receiver, handles::deserialize_receiver;
    IpcBytesSender => OsSender, |os| IpcBytesSender { os }, serialize_sender, deserialize_sender;
    IpcBytesReceiver => OsReceiver, IpcBytesReceiver::from_os,
        handles::serialize_receiver, handles::deserialize_receiver;
    OpaqueIpcSender => OsSender, |os| OpaqueIpcSender { os }, serialize_sender, deserialize_sender;
    OpaqueIpcReceiver => OsReceiver, |os| OpaqueIpcReceiver { os },
        handles::serialize_receiver, handles::deserialize_receiver;
}

fn serialize_sender<S: Serializer>(os: &OsSender, serializer: S) -> Result<S::Ok, S::Error> {
    handles::serialize_fd(os.fd(), serializer)
}

fn deserialize_sender<'de, D: Deserializer<'de>>(deserializer: D) -> Result<OsSender, D::Error> {
    let fd = handles::deserialize_fd(deserializer)?;
    handles::check_channel_end(fd.as_fd()).map_err(split::fault)?;
    Ok(OsSender::from_fd(fd))
}
