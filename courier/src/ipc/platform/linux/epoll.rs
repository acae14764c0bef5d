//! Waiting for any of many sockets: one `epoll` instance per receiver set.
//!
//! Level-triggered, so a socket the set did not drain (it reads a bounded
//! number of messages per call) is reported again by the next wait, and a
//! hung-up socket is reported readable until its receiver is removed.
//!
//! # References
//! - [`epoll(7)`](https://man7.org/linux/man-pages/man7/epoll.7.html),
//!   [`epoll_ctl(2)`](https://man7.org/linux/man-pages/man2/epoll_ctl.2.html),
//!   [`epoll_wait(2)`](https://man7.org/linux/man-pages/man2/epoll_wait.2.html)

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::Timespec;
use rustix::io::Errno;

/// Events taken from the kernel per `epoll_wait`; more ready sockets are
/// reported by the next wait (level-triggered).
const EVENTS: usize = 64;

/// The longest single `epoll_wait`: kernels before 5.11 refuse a timeout of
/// more than `c_int::MAX` milliseconds (about 24 days); a longer wait is a
/// loop of these.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// An `epoll` instance watching sockets for input, each under a key. (The
/// events of a wait live on the waiter's stack: kept here, rustix's event
/// type, which may hold a pointer, would make the poller `!Send`.)
#[derive(Debug)]
pub(crate) struct Poller {
    epoll: OwnedFd,
}

impl Poller {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Poller {
            epoll: epoll::create(CreateFlags::CLOEXEC)?,
        })
    }

    /// Watches `fd` for input (and hang-up, which `epoll` always reports),
    /// under `key`.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, key: u64) -> io::Result<()> {
        epoll::add(&self.epoll, fd, EventData::new_u64(key), EventFlags::IN)?;
        Ok(())
    }

    /// Stops watching `fd` (before it is closed: an `epoll` instance forgets
    /// a descriptor only when every duplicate of it is closed).
    pub(crate) fn remove(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        epoll::delete(&self.epoll, fd)?;
        Ok(())
    }

    /// Waits until a watched socket has input or hung up, or until
    /// `deadline` (`None`: no limit), and appends the keys of the ready
    /// sockets to `keys` (none if the deadline passed first). A signal
    /// does not end the wait early.
    pub(crate) fn wait(&self, deadline: Option<Instant>, keys: &mut Vec<u64>) -> io::Result<()> {
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; EVENTS];
        if crate::fiber::in_fiber() {
            return self.wait_as_fiber(deadline, keys, &mut events);
        }
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let timeout = Timespec::try_from(left.map_or(MAX_WAIT, |left| left.min(MAX_WAIT)))
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            match epoll::wait(&self.epoll, &mut events[..], Some(&timeout)) {
                Ok((ready, _)) if ready.is_empty() && left.is_none_or(|left| left > MAX_WAIT) => {
                    continue
                }
                Ok((ready, _)) => {
                    keys.extend(ready.iter().map(|event| event.data.u64()));
                    return Ok(());
                }
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// [`wait`](Self::wait) from a fiber: the `epoll` instance is itself
    /// readable when a watched socket is, so the fiber parks on that through
    /// its worker's reactor and then looks without waiting.
    fn wait_as_fiber(
        &self,
        deadline: Option<Instant>,
        keys: &mut Vec<u64>,
        events: &mut [MaybeUninit<epoll::Event>],
    ) -> io::Result<()> {
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            match epoll::wait(&self.epoll, &mut *events, Some(&now)) {
                Ok((ready, _)) if !ready.is_empty() => {
                    keys.extend(ready.iter().map(|event| event.data.u64()));
                    return Ok(());
                }
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            let interest = crate::fiber::Interest::Read;
            if !crate::fiber::wait_fd(self.epoll.as_fd(), interest, deadline)? {
                return Ok(());
            }
        }
    }
}
