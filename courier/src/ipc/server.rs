//! The one-shot server: a named rendezvous for the first channel between two
//! processes.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::transport::{OsOneShotServer, RecvError, Wait};
use super::{deadline, IpcError, IpcReceiver, TryRecvError};

/// A named rendezvous for the first channel between two processes: the
/// server hands its name to a child (an argument, an environment variable),
/// the child connects with
/// [`IpcSender::connect`](super::IpcSender::connect) and sends a first
/// message, usually carrying more channel ends.
///
/// ```
/// use courier::ipc::{IpcOneShotServer, IpcSender};
/// let (server, name) = IpcOneShotServer::<String>::new().unwrap();
/// // In the child process:
/// let tx = IpcSender::<String>::connect(name).unwrap();
/// tx.send("hello".to_owned()).unwrap();
/// // Back in the parent:
/// let (rx, first) = server.accept().unwrap();
/// assert_eq!(first, "hello");
/// # drop(rx);
/// ```
pub struct IpcOneShotServer<T> {
    os: OsOneShotServer,
    _type: PhantomData<fn() -> T>,
}

impl<T> IpcOneShotServer<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    /// Creates the server and returns it with its name.
    pub fn new() -> Result<(IpcOneShotServer<T>, String), io::Error> {
        let (os, name) = OsOneShotServer::new()?;
        Ok((
            IpcOneShotServer {
                os,
                _type: PhantomData,
            },
            name,
        ))
    }

    /// Waits for the client to connect and send its first message.
    pub fn accept(self) -> Result<(IpcReceiver<T>, T), IpcError> {
        self.accept_until(Wait::Block)
    }

    /// As [`accept`](Self::accept), but gives up after `timeout` (connection
    /// and first message together, all of it however large) with an
    /// [`io::ErrorKind::TimedOut`] error,
    /// so that a child that died before connecting cannot hang the server.
    pub fn accept_timeout(self, timeout: Duration) -> Result<(IpcReceiver<T>, T), IpcError> {
        self.accept_until(deadline(timeout))
    }

    fn accept_until(self, wait: Wait) -> Result<(IpcReceiver<T>, T), IpcError> {
        let timed_out = |e: RecvError| match e {
            RecvError::Empty => IpcError::Io(io::ErrorKind::TimedOut.into()),
            e => e.into(),
        };
        let left = |wait| match wait {
            Wait::Until(at) => Some(Instant::saturating_duration_since(&at, Instant::now())),
            _ => None,
        };
        let rx = IpcReceiver::from_os(self.os.accept(left(wait)).map_err(timed_out)?);
        let first = match rx.recv_wait(wait) {
            Ok(first) => first,
            Err(TryRecvError::Empty) => return Err(IpcError::Io(io::ErrorKind::TimedOut.into())),
            Err(TryRecvError::IpcError(e)) => return Err(e),
        };
        Ok((rx, first))
    }
}

impl<T> fmt::Debug for IpcOneShotServer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.os.fmt(f)
    }
}
