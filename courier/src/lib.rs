//! courier: message passing for Rust programs split across fibers, threads and processes.
//!
//! One channel model, three reaches:
//!
//! | reach | module | carried by | blocks |
//! | --- | --- | --- | --- |
//! | process to process | [`ipc`] | `SOCK_SEQPACKET` sockets, sealed memfd regions | the thread, or the fiber |
//! | thread to thread | [`chan`] | a lock-free queue per channel | the thread, or the fiber |
//! | fiber to fiber on one thread | `chan::local` | a queue with no atomics | the fiber |
//!
//! [`fiber`] runs stackful tasks on pooled stacks over worker threads: a
//! blocking call of `chan`, `ipc` or [`fiber::net`] parks the fiber, not its
//! worker. [`buf`] is the scatter-gather iterator every transfer goes through.
//! [`router`] serves many IPC receivers from one thread, handing their
//! messages to callbacks or forwarding them into `chan` channels, as
//! ipc-channel's router does. With feature `async`, `courier::asynch` turns
//! an IPC receiver into a `futures_core::Stream` for any async runtime
//! (`IpcReceiver::to_stream`, as in ipc-channel).
//!
//! # Between processes
//!
//! [`ipc`] keeps the names and signatures of the `ipc-channel` crate's core
//! API. A parent hands a child the name of a one-shot server; the child
//! connects and sends the first message, which usually carries more channels:
//!
//! ```
//! use courier::ipc::{self, IpcOneShotServer, IpcReceiver, IpcSender};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! enum Request {
//!     // A byte field goes as one copy, with no per-byte serde cost.
//!     Thumbnail { id: u32, png: Vec<u8> },
//!     Quit,
//! }
//!
//! // Parent: a rendezvous whose name goes to the child (argv, env...).
//! let (server, name) = IpcOneShotServer::<IpcSender<Request>>::new()?;
//!
//! // Child (here: the same process): its request channel, sent to the parent.
//! let (requests, incoming): (IpcSender<Request>, IpcReceiver<Request>) = ipc::channel()?;
//! IpcSender::<IpcSender<Request>>::connect(name)?.send(requests)?;
//!
//! // Parent: the child's sender arrives as the first message.
//! let (_bootstrap, to_child) = server.accept()?;
//! to_child.send(Request::Thumbnail { id: 7, png: vec![0x89, b'P', b'N', b'G'] })?;
//! to_child.send(Request::Quit)?;
//!
//! // Child: requests arrive in order; a dead parent would give `Disconnected`.
//! assert!(matches!(incoming.recv()?, Request::Thumbnail { id: 7, .. }));
//! assert!(matches!(incoming.recv()?, Request::Quit));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "async")]
pub mod asynch;
pub mod buf;
pub mod chan;
pub mod fiber;
pub mod ipc;
pub mod router;
mod sync;

// ipc-channel's error types live at its crate root: so do these, so that
// replacing the crate's name is the whole switch.
pub use ipc::{IpcError, SerDeError, TryRecvError, TrySelectError};

/// The README's quick starts, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
