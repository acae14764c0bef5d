//! Receiving from whichever of many channels has a message: ipc-channel's
//! `IpcReceiverSet`, with its names and signatures.
//!
//! ```
//! use courier::ipc::{self, IpcReceiverSet, IpcSelectionResult};
//!
//! let (tx_a, rx_a) = ipc::channel::<String>().unwrap();
//! let (tx_b, rx_b) = ipc::channel::<u32>().unwrap();
//! let mut set = IpcReceiverSet::new().unwrap();
//! let a = set.add(rx_a).unwrap();
//! let b = set.add(rx_b).unwrap();
//! tx_b.send(7).unwrap();
//! drop(tx_b);
//!
//! let mut closed = false;
//! while !closed {
//!     for event in set.select().unwrap() {
//!         match event {
//!             IpcSelectionResult::MessageReceived(id, message) => {
//!                 assert_eq!(id, b);
//!                 assert_eq!(message.to::<u32>().unwrap(), 7);
//!             }
//!             IpcSelectionResult::ChannelClosed(id) => {
//!                 assert_eq!(id, b);
//!                 closed = true;
//!             }
//!         }
//!     }
//! }
//! # let _ = (a, tx_a);
//! ```
//!
//! One `epoll` instance watches the receivers' sockets (level-triggered).
//! A select waits until a socket is ready (or a receiver holds a message
//! already read), then reads the ready receivers without waiting. With
//! several ready it reads each until its socket is dry, as ipc-channel's set
//! does, up to [`DRAIN_LIMIT`] messages a channel (so that one flooding peer
//! can neither starve the others nor grow one call's result without bound:
//! the rest comes with the next call); a lone ready receiver gives one
//! message unless it has a backlog, which saves the system call that finds
//! its socket dry. Each channel's messages come in order. A channel whose
//! senders are all gone is reported once as closed, after its last message,
//! and leaves the set, which closes its socket.
//!
//! A message whose payload is still arriving when it is read (the rest of a
//! fragmented message, or a streamed region being written) is waited for
//! about a millisecond; then the read leaves it half-fetched, the select
//! serves the other channels, and the next read goes on with it. A peer
//! that begins a message and stops cannot hold the set: it costs each
//! select that millisecond, and its message fails at the fragment timeout
//! ([`Config::fragment_timeout`]).
//!
//! A malformed message from one channel is an error of the select (a
//! [`WireError`] inside an [`io::ErrorKind::InvalidData`]
//! error, as for a receive); the messages read in the same call are returned
//! first and the error by the next call, so that neither is lost.
//!
//! Timeouts are kept to the millisecond, rounded up (`epoll_wait`).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::mem;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::err::TrySelectError;
use super::platform::Poller;
use super::transport::{OsReceiver, RecvError, Wait};
use super::{
    Config, IpcError, IpcMessage, IpcReceiver, OpaqueIpcReceiver, WireError, KEEP_MSG_BUF,
};

/// Messages one select takes from one channel at most; a channel with more
/// is reported again by the next select.
pub const DRAIN_LIMIT: usize = 64;

/// A set of receivers that are waited on together. Receivers are moved into
/// the set and named by the id [`add`](Self::add) returns.
pub struct IpcReceiverSet {
    poller: Poller,
    members: BTreeMap<u64, Member>,
    next_id: u64,
    /// An error met after some messages were read: those were returned, and
    /// this is returned by the next select, so that neither is lost.
    pending: Option<io::Error>,
    /// Keys of the members to read, reused between selects.
    keys: Vec<u64>,
    /// Reads so far ([`read_ready`](Self::read_ready) calls).
    reads: u64,
    /// The members holding a message already read, or one waiting for its
    /// descriptors, and when each must be read again (`OsReceiver::due`).
    /// Only a read changes what a member holds, so this is updated there
    /// and a wait looks at no other member.
    held: Vec<(u64, Instant)>,
    /// The receive buffer a [`select_events`](Self::select_events) sink
    /// left in its message (it decoded the message in place): the next read
    /// goes into it, so that a router allocates nothing per message.
    spare: Vec<u8>,
}

#[allow(unsafe_code)]
// SAFETY: the receivers' `Cell`s and `RefCell`s are reached only through
// `&mut self` methods; the one method that takes `&self` (`Debug`) reads
// nothing but the ids, plain data of the map. So a shared reference lets no
// two threads touch a receiver (ipc-channel's set is `Sync` too).
unsafe impl Sync for IpcReceiverSet {}

/// A receiver in a set.
struct Member {
    os: OsReceiver,
    /// The receiver's own size limit, if it had one (else the process's).
    limit: Option<u64>,
    /// The last read that handed out one of its messages (`IpcReceiverSet::reads`).
    last_read: u64,
    /// Did that read end by finding the socket dry?
    dry: bool,
}

/// What a select found: a message or a channel that closed.
#[derive(Debug)]
pub enum IpcSelectionResult {
    /// A message, not yet deserialized, from the receiver of this id.
    MessageReceived(u64, IpcMessage),
    /// Every sender of the receiver of this id is gone and its messages were
    /// all handed out; the receiver has left the set.
    ChannelClosed(u64),
}

impl IpcSelectionResult {
    /// The id and message of a [`MessageReceived`](Self::MessageReceived).
    ///
    /// # Panics
    /// If the result is [`ChannelClosed`](Self::ChannelClosed).
    pub fn unwrap(self) -> (u64, IpcMessage) {
        match self {
            IpcSelectionResult::MessageReceived(id, message) => (id, message),
            IpcSelectionResult::ChannelClosed(id) => {
                panic!("IpcSelectionResult::unwrap(): channel {id} closed")
            }
        }
    }
}

impl IpcReceiverSet {
    /// An empty set.
    pub fn new() -> Result<IpcReceiverSet, io::Error> {
        Ok(IpcReceiverSet {
            poller: Poller::new()?,
            members: BTreeMap::new(),
            next_id: 0,
            pending: None,
            keys: Vec::new(),
            reads: 0,
            held: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// Moves `receiver` into the set; returns the id its results carry. Its
    /// size limit, if set, goes with it.
    pub fn add<T>(&mut self, receiver: IpcReceiver<T>) -> Result<u64, io::Error>
    where
        T: for<'de> Deserialize<'de> + Serialize,
    {
        let limit = receiver.limit.get();
        self.insert(receiver.os, limit)
    }

    /// Moves an untyped receiver into the set; returns the id its results
    /// carry.
    pub fn add_opaque(&mut self, receiver: OpaqueIpcReceiver) -> Result<u64, io::Error> {
        self.insert(receiver.os, None)
    }

    fn insert(&mut self, os: OsReceiver, limit: Option<u64>) -> Result<u64, io::Error> {
        let id = self.next_id;
        self.poller.add(os.fd(), id)?;
        self.next_id += 1;
        // A receiver that was moved between processes may arrive holding
        // messages.
        if let Some(due) = os.due() {
            self.held.push((id, due));
        }
        self.members.insert(
            id,
            Member {
                os,
                limit,
                last_read: 0,
                dry: true,
            },
        );
        Ok(id)
    }

    /// Waits until at least one receiver has a message or closes, and returns
    /// what every ready receiver has (see the module docs). An empty set
    /// waits forever, as ipc-channel's does.
    pub fn select(&mut self) -> Result<Vec<IpcSelectionResult>, io::Error> {
        self.select_until(None)
    }

    /// [`select`](Self::select) without waiting: [`TrySelectError::Empty`] if
    /// nothing is ready.
    pub fn try_select(&mut self) -> Result<Vec<IpcSelectionResult>, TrySelectError> {
        non_empty(self.select_until(Some(Instant::now()))?)
    }

    /// [`select`](Self::select), waiting at most `duration`:
    /// [`TrySelectError::Empty`] if nothing was ready by then.
    pub fn try_select_timeout(
        &mut self,
        duration: Duration,
    ) -> Result<Vec<IpcSelectionResult>, TrySelectError> {
        non_empty(self.select_until(Instant::now().checked_add(duration))?)
    }

    /// Waits until a result or `deadline` (`None`: none), and returns the
    /// results (none: the deadline passed).
    fn select_until(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Vec<IpcSelectionResult>, io::Error> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let mut results = Vec::new();
        let mut error = None;
        self.select_events(deadline, |event| match event {
            SetEvent::Message(id, message) => {
                let message = mem::replace(message, IpcMessage::from_data(Vec::new()));
                results.push(IpcSelectionResult::MessageReceived(id, message));
            }
            SetEvent::Closed(id, failure) => {
                results.push(IpcSelectionResult::ChannelClosed(id));
                if let Some(e) = failure {
                    error.get_or_insert(e);
                }
            }
            SetEvent::Malformed(_, e) => {
                error.get_or_insert_with(|| io::Error::from(IpcError::from(e)));
            }
        })?;
        // The first error is returned at once if nothing was read, else kept
        // for the next select (later ones in the same call are dropped: they
        // are reports, and the messages they concern are gone either way).
        match error {
            Some(e) if results.is_empty() => Err(e),
            error => {
                self.pending = error;
                Ok(results)
            }
        }
    }

    /// Waits until at least one member has something to report or
    /// `deadline` (`None`: none) passes, and hands `sink` what every ready
    /// member has, a malformed message as the [`SetEvent::Malformed`] of
    /// its channel: the form of a select in which each fault belongs to a
    /// channel (the router hands it to that channel's handler). Returns after
    /// one read that gave at least one event, or at the deadline.
    ///
    /// A message is lent to the sink: what the sink leaves of its bytes
    /// (having decoded them, or taken its descriptors) is the buffer the
    /// next message is received into, up to 16 MiB of it.
    pub(crate) fn select_events(
        &mut self,
        deadline: Option<Instant>,
        mut sink: impl FnMut(SetEvent<'_>),
    ) -> Result<(), io::Error> {
        loop {
            // A member holding a complete message, or one whose waiting
            // message expires, is read without its socket saying so.
            let due = self.held.iter().map(|&(_, due)| due).min();
            let wake = match (due, deadline) {
                (Some(due), Some(deadline)) => Some(due.min(deadline)),
                (due, deadline) => due.or(deadline),
            };
            self.keys.clear();
            self.poller.wait(wake, &mut self.keys)?;
            if !self.held.is_empty() {
                let now = Instant::now();
                let due_now = self.held.iter().filter(|&&(_, due)| due <= now);
                self.keys.extend(due_now.map(|&(id, _)| id));
            }
            self.keys.sort_unstable();
            self.keys.dedup();
            if self.read_ready(&mut sink) > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            // Only a descriptor packet, or the start of a message whose
            // descriptors are still to come: wait again.
        }
    }

    /// Takes the member `id` out of the set and closes its receiver, without
    /// reporting it: `false` if it was not in the set.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let Some(member) = self.members.remove(&id) else {
            return false;
        };
        // As in `read_ready`'s closing: out of the `epoll` set first.
        let _ = self.poller.remove(member.os.fd());
        self.held.retain(|&(held, _)| held != id);
        true
    }

    /// Reads what the members in `self.keys` have, handing each message,
    /// closing and fault to `sink`; returns how many events it handed.
    ///
    /// When several are ready, each is read until its socket is dry, as
    /// ipc-channel's set does, but for at most [`DRAIN_LIMIT`] messages: a
    /// result then shows no later message of one channel without every
    /// earlier readable message of the others (a peer that sends data on one
    /// channel and then "done" on another gets the data through first)
    /// *unless a channel had more than the limit queued*. Then the result
    /// has that channel's first 64 beside the other's "done", and the rest
    /// come with the next select. ipc-channel reads without a bound, which
    /// keeps the order but lets one flooding peer hold the select forever. A lone ready
    /// member gives one message, unless it gave one in the previous read and
    /// did not run dry then (a backlog, drained likewise): finding out that a
    /// socket is dry costs a system call of its own, and a member with more
    /// is reported ready again by the next wait (`select_1of16`: 4 -> 3
    /// system calls a message).
    ///
    /// A member whose socket fails leaves the set, reported closed with the
    /// failure. A member whose read fails otherwise (a malformed message: its
    /// channel stays usable) is left for this call and the others are read
    /// all the same, so that a peer sending garbage cannot starve them.
    fn read_ready(&mut self, sink: &mut impl FnMut(SetEvent<'_>)) -> usize {
        self.reads += 1;
        let several = self.keys.len() > 1;
        let mut events = 0;
        for i in 0..self.keys.len() {
            let id = self.keys[i];
            let Some(member) = self.members.get_mut(&id) else {
                continue;
            };
            let limit = member.limit.unwrap_or_else(Config::max_message_size_now);
            let drain = several || (member.last_read + 1 == self.reads && !member.dry);
            let most = if drain { DRAIN_LIMIT } else { 1 };
            member.dry = false;
            for _ in 0..most {
                let mut data = mem::take(&mut self.spare);
                match member.os.recv_into(&mut data, Wait::Poll, limit) {
                    Ok(channels) => {
                        member.last_read = self.reads;
                        events += 1;
                        let mut message = IpcMessage {
                            data,
                            channels,
                            limit: Some(limit),
                        };
                        sink(SetEvent::Message(id, &mut message));
                        if message.data.capacity() <= KEEP_MSG_BUF {
                            self.spare = message.data;
                        }
                    }
                    Err(RecvError::Empty) => {
                        member.dry = true;
                        break;
                    }
                    Err(RecvError::Disconnected) => {
                        self.remove(id);
                        events += 1;
                        sink(SetEvent::Closed(id, None));
                        break;
                    }
                    // The socket itself failed: it can never deliver again,
                    // and level-triggered `epoll` would report it ready on
                    // every wait. It leaves the set, closed, and the error
                    // says why.
                    Err(RecvError::Io(e)) => {
                        self.remove(id);
                        events += 1;
                        sink(SetEvent::Closed(id, Some(e)));
                        break;
                    }
                    Err(RecvError::Wire(e, _)) => {
                        events += 1;
                        sink(SetEvent::Malformed(id, e));
                        break;
                    }
                }
            }
            self.held.retain(|&(held, _)| held != id);
            if let Some(due) = self.members.get(&id).and_then(|m| m.os.due()) {
                self.held.push((id, due));
            }
        }
        events
    }
}

/// What one member of a set gave a read: [`IpcReceiverSet::select_events`]'
/// results, where a malformed message belongs to its channel.
pub(crate) enum SetEvent<'a> {
    /// A message from the receiver of this id, lent to the sink (which may
    /// take it, or decode it in place with [`IpcMessage::decode_in_place`]).
    Message(u64, &'a mut IpcMessage),
    /// The receiver of this id left the set: every sender is gone (`None`),
    /// or its socket failed (the error).
    Closed(u64, Option<io::Error>),
    /// The receiver of this id was sent a malformed message, which was
    /// dropped (its descriptors closed); the channel stays usable.
    Malformed(u64, WireError),
}

/// A try-select's results: [`TrySelectError::Empty`] if there are none.
fn non_empty(results: Vec<IpcSelectionResult>) -> Result<Vec<IpcSelectionResult>, TrySelectError> {
    if results.is_empty() {
        Err(TrySelectError::Empty)
    } else {
        Ok(results)
    }
}

impl fmt::Debug for IpcReceiverSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcReceiverSet")
            .field("ids", &self.members.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    use super::*;

    /// A member whose socket can never deliver (one never connected: no
    /// public way makes such an end, which `TryFrom<OwnedFd>` refuses, so
    /// it is built here) is closed: never an error returned on every
    /// select, at full speed, while level-triggered `epoll` reports it.
    #[test]
    fn a_member_that_can_never_deliver_is_closed() {
        let unconnected = || {
            let fd = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            OsReceiver::from_fd(fd)
        };
        let mut lone = Vec::new();
        assert!(matches!(
            unconnected().recv_into(&mut lone, Wait::Block, 1 << 20),
            Err(RecvError::Disconnected)
        ));
        let mut set = IpcReceiverSet::new().unwrap();
        let (live_tx, live_rx) = super::super::channel::<u8>().unwrap();
        let live = set.add(live_rx).unwrap();
        let dead = set.insert(unconnected(), None).unwrap();
        let results = set.select().unwrap();
        assert!(
            matches!(results[..], [IpcSelectionResult::ChannelClosed(id)] if id == dead),
            "{results:?}"
        );
        live_tx.send(3).unwrap();
        let (id, message) = set.select().unwrap().remove(0).unwrap();
        assert_eq!((id, message.to::<u8>().unwrap()), (live, 3));
    }
}
