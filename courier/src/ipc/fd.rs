//! Any descriptor inside a typed message: an open file, a socket, a
//! listener, a pipe, a `memfd`.
//!
//! A descriptor travels as channel ends do: beside the message's bytes
//! (`SCM_RIGHTS`), its place in the message written as an index. The sender
//! sends a duplicate, so it keeps its own; the receiver owns the one that
//! arrives, and gets back what it sent (a `File` stays a file, a listener a
//! listener). Two ways to put one in a message:
//!
//! - [`IpcFd`], a field type convertible from and to `OwnedFd`, `File`,
//!   `UnixStream`, `UnixListener`, `TcpStream`, `TcpListener` and
//!   `UdpSocket`;
//! - the [`as_fd`] module, for `#[serde(with = "...")]` on a
//!   field of one of those types itself.
//!
//! ```
//! use std::io::{Read, Seek, Write};
//! use courier::ipc::{self, IpcFd};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Job {
//!     name: String,
//!     #[serde(with = "courier::ipc::as_fd")]
//!     log: std::fs::File,
//!     input: IpcFd,
//! }
//!
//! let (tx, rx) = ipc::channel::<Job>()?;
//! let mut input = tempfile_with(b"to be read by the other side")?;
//! input.rewind()?;
//! tx.send(Job { name: "one".into(), log: tempfile_with(b"")?, input: input.into() })?;
//!
//! let job = rx.recv()?;
//! let mut text = String::new();
//! std::fs::File::from(job.input).read_to_string(&mut text)?;
//! assert_eq!(text, "to be read by the other side");
//! writeln!(&job.log, "done: {}", job.name)?;
//! # fn tempfile_with(bytes: &[u8]) -> std::io::Result<std::fs::File> {
//! #     let path = std::env::temp_dir().join(format!("courier-fd-doc-{}-{}", std::process::id(), bytes.len()));
//! #     let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
//! #     std::fs::remove_file(&path)?;
//! #     f.write_all(bytes)?;
//! #     Ok(f)
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A message carries at most [`MAX_FDS`](super::MAX_FDS) (4,096)
//! descriptors in all (channel ends, shared-memory regions and these
//! together), 253 a descriptor packet; a send with more fails with an error,
//! before anything is sent. A receiver that runs out of descriptors part-way
//! (`EMFILE`) gets an error for that message alone
//! ([`WireError::ControlTruncated`](super::WireError::ControlTruncated)):
//! the descriptors that came are closed, and the channel goes on.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::handles;

/// A descriptor that travels inside a typed message (see the module docs).
///
/// Shared by reference count with the send it is in, so that a send keeps
/// it open without a duplicate (a `dup` and a `close` a descriptor: most of
/// what passing one costs beyond the kernel's own work).
pub struct IpcFd(Option<SharedFd>);

/// A descriptor shared by count between an [`IpcFd`] and the sends it is
/// in: `Some` for as long as the `IpcFd` lives (it is taken only from a
/// count no send shares).
pub(crate) type SharedFd = Arc<Option<OwnedFd>>;

/// How many emptied counts a thread keeps for its next `IpcFd`s: as many as
/// one message carries.
const SPARE_MAX: usize = super::MAX_FDS;

thread_local! {
    /// Counts whose descriptor is gone, for the next `IpcFd` made on this
    /// thread: a message of many descriptors then costs no allocation a
    /// descriptor. (With glibc, hundreds of small allocations a message,
    /// between the message's own larger ones, cost more than the
    /// descriptors' system calls.)
    static SPARE: RefCell<Vec<SharedFd>> = const { RefCell::new(Vec::new()) };
}

/// The slot of `cell`, if `cell` is its only count (`Arc::get_mut` without
/// its locked compare-exchange: two of them a descriptor a message, a third
/// of what courier adds to the kernel's work for one).
fn unique(cell: &mut SharedFd) -> Option<&mut Option<OwnedFd>> {
    // SAFETY: no `Weak` of a `SharedFd` is ever made, nor any pointer to
    // one that holds no count.
    unsafe { crate::sync::unique_arc(cell) }
}

/// Keeps `cell`, whose descriptor is gone and which no one else counts, for
/// the thread's next `IpcFd`.
fn recycle(cell: SharedFd) {
    let _ = SPARE.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARE_MAX {
            spare.push(cell);
        }
    });
}

impl IpcFd {
    /// The descriptor, as the type it was sent as (`File`, `TcpListener`...).
    pub fn into<T: From<OwnedFd>>(self) -> T {
        T::from(self.into_owned())
    }

    /// The shared count (`None` only inside `drop` and `into_owned`).
    fn cell(&self) -> &SharedFd {
        self.0
            .as_ref()
            .expect("an IpcFd holds its count while it lives")
    }

    fn fd(&self) -> &OwnedFd {
        (**self.cell())
            .as_ref()
            .expect("an IpcFd holds its descriptor while it lives")
    }

    fn into_owned(mut self) -> OwnedFd {
        let mut cell = self
            .0
            .take()
            .expect("an IpcFd holds its count while it lives");
        if let Some(fd) = unique(&mut cell).and_then(Option::take) {
            recycle(cell);
            return fd;
        }
        // A send still counts it (the `IpcFd` was taken out of a message
        // being sent, through a `Mutex` in it, say): the caller gets a
        // duplicate, and the send's descriptor closes when the send is done.
        let shared = (*cell)
            .as_ref()
            .expect("an IpcFd holds its descriptor while it lives");
        shared
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot duplicate a descriptor a send still holds: {e}"))
    }
}

impl Drop for IpcFd {
    fn drop(&mut self) {
        let Some(mut cell) = self.0.take() else {
            return; // `into_owned` took it
        };
        if let Some(slot) = unique(&mut cell) {
            if let Some(fd) = slot.take() {
                close(fd);
            }
            recycle(cell);
        }
        // Otherwise a send still counts it (an `IpcFd` serialized and
        // dropped inside a `Serialize` impl): the descriptor closes when
        // that send lets it go.
    }
}

/// Closes `fd` with the system call itself. `OwnedFd`'s drop calls libc's
/// `close`, a cancellation point, which in a process of several threads
/// costs two locked compare-exchanges around the call; a sender closes its
/// copy of every descriptor it sent as the message goes.
fn close(fd: OwnedFd) {
    // SAFETY: `fd` is owned, and given up here: nothing else closes it, and
    // nothing uses its number after this.
    unsafe { rustix::io::close(fd.into_raw_fd()) };
}

impl AsFd for IpcFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd().as_fd()
    }
}

impl AsRawFd for IpcFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd().as_raw_fd()
    }
}

impl fmt::Debug for IpcFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IpcFd").field(&self.as_raw_fd()).finish()
    }
}

impl From<OwnedFd> for IpcFd {
    fn from(fd: OwnedFd) -> IpcFd {
        let spare = SPARE
            .try_with(|spare| spare.borrow_mut().pop())
            .ok()
            .flatten();
        let cell = match spare {
            // A spare is counted by no one else (see `recycle`'s callers).
            Some(mut cell) => match unique(&mut cell) {
                Some(slot) => {
                    *slot = Some(fd);
                    cell
                }
                None => Arc::new(Some(fd)),
            },
            None => Arc::new(Some(fd)),
        };
        IpcFd(Some(cell))
    }
}

impl From<IpcFd> for OwnedFd {
    fn from(fd: IpcFd) -> OwnedFd {
        fd.into_owned()
    }
}

/// `From` both ways between [`IpcFd`] and std's descriptor types.
macro_rules! conversions {
    ($($ty:ty),* $(,)?) => {$(
        impl From<$ty> for IpcFd {
            fn from(value: $ty) -> IpcFd {
                IpcFd::from(OwnedFd::from(value))
            }
        }

        impl From<IpcFd> for $ty {
            fn from(fd: IpcFd) -> $ty {
                <$ty>::from(fd.into_owned())
            }
        }
    )*};
}

conversions!(
    File,
    UnixStream,
    UnixListener,
    UnixDatagram,
    TcpStream,
    TcpListener,
    UdpSocket
);

impl Serialize for IpcFd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        handles::serialize_shared_fd(self.cell(), serializer)
    }
}

impl<'de> Deserialize<'de> for IpcFd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<IpcFd, D::Error> {
        handles::deserialize_fd(deserializer).map(IpcFd::from)
    }
}

/// `#[serde(with = "courier::ipc::as_fd")]` on a field of a descriptor type
/// (`File`, `OwnedFd`, `UnixStream`, `TcpListener`...): the field travels
/// as an [`IpcFd`] does.
pub mod as_fd {
    use std::os::fd::{AsFd, OwnedFd};

    use serde::{Deserializer, Serializer};

    use super::handles;

    /// Writes the field's descriptor (a duplicate goes with the message).
    pub fn serialize<F: AsFd, S: Serializer>(fd: &F, serializer: S) -> Result<S::Ok, S::Error> {
        handles::serialize_fd(fd.as_fd(), serializer)
    }

    /// Takes the descriptor that arrived for the field.
    pub fn deserialize<'de, F: From<OwnedFd>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<F, D::Error> {
        handles::deserialize_fd(deserializer).map(F::from)
    }
}
