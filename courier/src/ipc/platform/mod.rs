//! The transport contract between the portable `ipc` layer and an OS.
//!
//! Required types and functions (see [`linux`] for the only implementation):
//!
//! * `OsSender`: `Clone + Send + Sync`; `send(parts: &[IoSlice], channels:
//!   &[BorrowedFd])` sends one message, gathered from `parts`, with the
//!   descriptors of the channels it carries. It must deliver the message
//!   whole or not at all, never interleave with another sender's message,
//!   and report a closed receiver as `SendError::Disconnected` (never a
//!   signal).
//! * `OsReceiver`: `Send`; `recv_into(dst, wait, limit)` receives one message
//!   into `dst` (reusing its capacity) and returns the channel descriptors in
//!   the order they were sent. Malformed input is a `RecvError::Wire`, after
//!   which the channel stays usable; a closed and drained channel is
//!   `RecvError::Disconnected`.
//!   `take_backlog()` and `with_backlog(fd, backlog)` move what a receiver
//!   has read but not handed out along with it, when it is sent to another
//!   process (`Backlog: Serialize + Deserialize`).
//! * `OsOneShotServer`: `new() -> (server, name)`, `accept(timeout)`, and
//!   `connect(name) -> OsSender`.
//! * `channel() -> (OsSender, OsReceiver)`.
//! * `SharedRegion`: `Send + Sync`; `zeroed(len)`, `from_bytes(bytes)`, and
//!   `open(fd, budget)` for one that arrived in a message, which must refuse
//!   a region that could shrink under its mapping or exceeds `budget`;
//!   `as_ptr()`, `len()` and `fd()` (for `ipc::IpcSharedMemory`); and
//!   `unpark_all()`, which lets go of whatever it keeps of dropped regions.
//! * For receiver sets: `OsReceiver::due()`, when a receiver holds a message
//!   (or a deadline) that its socket's readiness will not announce, and
//!   `Poller`: `add(fd, key)`, `remove(fd)`, `wait(deadline, keys)`.
//!
//! The portable layer (serialization, descriptor tables, the public API)
//! names none of these types' internals, so a shared-memory data path can be
//! added beside the socket one without touching the public API.

pub(crate) mod linux;

pub(crate) use linux::poller::Poller;
pub(crate) use linux::shm::{unpark_all, SharedRegion};
pub(crate) use linux::{
    channel, connect, Backlog, OsOneShotServer, OsReceiver, OsSender, RecvError, SendError, Split,
    Wait,
};
