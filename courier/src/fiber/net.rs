//! Sockets whose blocking calls park the calling fiber, not its worker:
//! std's shapes (`bind`, `accept`, `connect`, `Read`, `Write`) over
//! non-blocking sockets. A call that would block waits on the worker's
//! `epoll` reactor; outside a fiber it waits in `poll(2)`, as a blocking
//! socket would. A peer that goes away wakes the waiting fiber with what the
//! socket says (end of stream, or an error), never a hang.
//!
//! A socket is registered with the reactor once, edge-triggered, when a fiber
//! first waits on it, and deleted from it when the socket is dropped: a wait
//! costs no system call beyond the read or write that said `EAGAIN` (adding
//! and deleting an entry per wait cost two more: without them the
//! `http_hello` example serves 15-20% more requests a second). A TCP read
//! that returns fewer bytes than asked for has drained the socket, so the
//! next read waits for an event before it asks the kernel, instead of
//! finding `EAGAIN` first.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use courier::fiber::{self, net::TcpListener};
//!
//! let rt = fiber::Runtime::new()?;
//! rt.block_on(|| -> std::io::Result<()> {
//!     let listener = TcpListener::bind("127.0.0.1:8080")?;
//!     loop {
//!         let (mut conn, _) = listener.accept()?;
//!         fiber::spawn(move || {
//!             let mut buf = [0; 1024];
//!             while let Ok(n @ 1..) = conn.read(&mut buf) {
//!                 let _ = conn.write_all(&buf[..n]);
//!             }
//!         });
//!     }
//! })?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{self as rnet, AddressFamily, SocketFlags, SocketType};

use super::{wait_fd, Interest, Registration};

/// Runs `op` until it does not say `WouldBlock`, waiting for `fd` to be
/// ready for `interest` in between (through its registration with the
/// worker's reactor, made by the first wait).
fn retry<T>(
    reg: &Registration,
    fd: BorrowedFd<'_>,
    interest: Interest,
    mut op: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => reg.wait(fd, interest)?,
            other => return other,
        }
    }
}

/// Deletes a socket's registration before the socket closes.
macro_rules! deregister_on_drop {
    ($name:ident) => {
        impl Drop for $name {
            fn drop(&mut self) {
                self.reg.deregister(self.inner.as_fd());
            }
        }
    };
}

/// A non-blocking connect of `fd` to `addr`, waited for.
fn connect_nonblocking(fd: &OwnedFd, addr: &rnet::SocketAddrAny) -> io::Result<()> {
    match rnet::connect(fd, addr) {
        Ok(()) => return Ok(()),
        Err(rustix::io::Errno::INPROGRESS | rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e.into()),
    }
    wait_fd(fd.as_fd(), Interest::Write, None)?;
    match rnet::sockopt::socket_error(fd)? {
        Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

macro_rules! stream {
    ($(#[$doc:meta])* $name:ident, $std:ty, short_read_drains: $drains:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            inner: $std,
            reg: Registration,
        }

        deregister_on_drop!($name);

        impl $name {
            fn from_std(inner: $std) -> io::Result<Self> {
                inner.set_nonblocking(true)?;
                Ok($name {
                    inner,
                    reg: Registration::default(),
                })
            }

            /// The socket underneath (non-blocking). Once it is lent, every
            /// read of this one asks the kernel before it waits, as the
            /// socket may have been read there.
            pub fn get_ref(&self) -> &$std {
                self.reg.lend();
                &self.inner
            }
        }

        impl Read for &$name {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                // (An empty read says nothing of what the socket holds.)
                let drains = $drains && !buf.is_empty();
                if drains {
                    self.reg.before_read();
                }
                let len = buf.len();
                let read = retry(&self.reg, self.inner.as_fd(), Interest::Read, || {
                    (&self.inner).read(buf)
                });
                if drains {
                    self.reg.after_read(read.as_ref().ok().copied(), len);
                }
                read
            }
        }

        impl Write for &$name {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                retry(&self.reg, self.inner.as_fd(), Interest::Write, || {
                    (&self.inner).write(buf)
                })
            }

            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        impl Read for $name {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                (&*self).read(buf)
            }
        }

        impl Write for $name {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                (&*self).write(buf)
            }

            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        impl AsFd for $name {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.inner.as_fd()
            }
        }
    };
}

stream! {
    /// A TCP connection (std's `TcpStream`, waiting as a fiber).
    TcpStream, std::net::TcpStream,
    // A short read took all that was queued, but for urgent data (which an
    // event reports: see `Registration::before_read`).
    short_read_drains: true
}

stream! {
    /// A Unix stream connection (std's `UnixStream`, waiting as a fiber).
    UnixStream, std::os::unix::net::UnixStream,
    // A read stops after bytes that carried descriptors (or another
    // writer's credentials), with more queued and no event to come.
    short_read_drains: false
}

impl TcpStream {
    /// Connects to the first of `addr`'s addresses that accepts.
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<TcpStream> {
        let mut last = None;
        for addr in addr.to_socket_addrs()? {
            let family = match addr {
                SocketAddr::V4(_) => AddressFamily::INET,
                SocketAddr::V6(_) => AddressFamily::INET6,
            };
            let fd = rnet::socket_with(
                family,
                SocketType::STREAM,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
                None,
            )?;
            match connect_nonblocking(&fd, &addr.into()) {
                Ok(()) => return TcpStream::from_std(std::net::TcpStream::from(fd)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable)))
    }

    /// The address of the peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }
}

impl UnixStream {
    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
        let fd = rnet::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let addr = rnet::SocketAddrUnix::new(path.as_ref())?;
        connect_nonblocking(&fd, &addr.into())?;
        UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
    }

    /// A connected pair.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = std::os::unix::net::UnixStream::pair()?;
        Ok((UnixStream::from_std(a)?, UnixStream::from_std(b)?))
    }
}

/// Connections a listener queues before they are accepted (what `listen(2)`
/// is given; the kernel caps it at `net.core.somaxconn`). std's `bind` asks
/// for 128, which a burst of connections to a fiber server overflows: on
/// loopback, a thousand clients connecting at once then saw some of their
/// connections reset. tokio's listeners ask for 1,024 too.
const BACKLOG: i32 = 1024;

/// A TCP listener whose `accept` parks the calling fiber.
#[derive(Debug)]
pub struct TcpListener {
    inner: std::net::TcpListener,
    reg: Registration,
}

deregister_on_drop!(TcpListener);

impl TcpListener {
    /// Binds to `addr` and listens, with room for 1,024 connections
    /// not yet accepted.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        let inner = std::net::TcpListener::bind(addr)?;
        rustix::net::listen(&inner, BACKLOG)?;
        inner.set_nonblocking(true)?;
        Ok(TcpListener {
            inner,
            reg: Registration::default(),
        })
    }

    /// Waits for a connection.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, addr) = retry(&self.reg, self.inner.as_fd(), Interest::Read, || {
            self.inner.accept()
        })?;
        Ok((TcpStream::from_std(stream)?, addr))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A Unix socket listener whose `accept` parks the calling fiber.
#[derive(Debug)]
pub struct UnixListener {
    inner: std::os::unix::net::UnixListener,
    reg: Registration,
}

deregister_on_drop!(UnixListener);

impl UnixListener {
    /// Binds to `path` and listens, with room for 1,024 connections
    /// not yet accepted.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixListener> {
        let inner = std::os::unix::net::UnixListener::bind(path)?;
        rustix::net::listen(&inner, BACKLOG)?;
        inner.set_nonblocking(true)?;
        Ok(UnixListener {
            inner,
            reg: Registration::default(),
        })
    }

    /// Waits for a connection.
    pub fn accept(&self) -> io::Result<UnixStream> {
        let (stream, _) = retry(&self.reg, self.inner.as_fd(), Interest::Read, || {
            self.inner.accept()
        })?;
        UnixStream::from_std(stream)
    }
}
