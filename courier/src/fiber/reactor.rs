//! A worker's reactor: an `epoll` instance that wakes the fibers waiting for
//! descriptors, and the two ways a fiber waits on one.
//!
//! - A socket of `fiber::net` is registered once ([`Registration`]),
//!   edge-triggered for both directions, with the reactor of the first worker
//!   that waits on it. A wait then costs no system call beyond the read or
//!   write that said `EAGAIN`: an event that finds a fiber waiting for its
//!   direction wakes it, and one that finds none leaves the direction marked
//!   ready, so that the next wait returns at once and its caller tries again.
//! - Any other descriptor (an ipc socket, a receiver set's `epoll`), and a
//!   socket waited on from a worker other than the one it is registered
//!   with, is added for one wait and deleted after it ([`wait_fd`]).
//!
//! # How long a registration lives
//! The `epoll` entry's data is the address of its [`Source`], which owns one
//! strong count of it. A worker handles the events of one `epoll_wait`
//! without running fibers, but a socket may be dropped on another thread
//! meanwhile; so a dropped socket's entry is deleted at once and its count is
//! *retired* to the reactor, which lets it go before its next `epoll_wait`,
//! when no event naming the source can still be in hand.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{eventfd, EventfdFlags};

use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::sched::{self, Fiber, WorkerState};

/// The token of a reactor's `eventfd`. One-shot waits use odd tokens, and a
/// [`Source`]'s token is its (aligned, so even and non-zero) address.
pub(super) const WAKE_TOKEN: u64 = 0;

/// A worker's `epoll` instance, the `eventfd` in it that other threads write
/// to wake the worker, and the sources retired since its last wait.
pub(super) struct Reactor {
    pub(super) epoll: OwnedFd,
    event: OwnedFd,
    /// The entries' counts of sources deleted from `epoll` (see the module
    /// docs); `None` once the worker has stopped, after which a retired count
    /// goes at once.
    retired: Mutex<Option<Vec<Arc<Source>>>>,
    /// How many sources are registered: a busy worker looks at its reactor
    /// now and then only if some are (or a one-shot wait is under way).
    sources: AtomicUsize,
}

impl Reactor {
    pub(super) fn new() -> io::Result<Reactor> {
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        let event = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &epoll,
            &event,
            EventData::new_u64(WAKE_TOKEN),
            EventFlags::IN | EventFlags::ET,
        )?;
        Ok(Reactor {
            epoll,
            event,
            retired: Mutex::new(Some(Vec::new())),
            sources: AtomicUsize::new(0),
        })
    }

    /// Wakes the worker from its wait (or makes its next wait return).
    pub(super) fn wake(&self) {
        let _ = rustix::io::write(&self.event, &1u64.to_ne_bytes());
    }

    /// Whether any source is registered.
    pub(super) fn has_sources(&self) -> bool {
        self.sources.load(Ordering::Relaxed) != 0
    }

    /// Takes the wake-up the `eventfd` holds.
    pub(super) fn drain_wake(&self) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.event, &mut counter);
    }

    /// Lets the retired sources go: called by the worker before it waits.
    pub(super) fn release_retired(&self) {
        let retired = lock(&self.retired).as_mut().map(std::mem::take);
        drop(retired);
    }

    /// The worker has stopped: its retired sources go now, and later ones at
    /// once.
    pub(super) fn close(&self) {
        let retired = lock(&self.retired).take();
        drop(retired);
    }

    fn retire(&self, source: Arc<Source>) {
        let mut retired = lock(&self.retired);
        match retired.as_mut() {
            Some(list) => list.push(source),
            None => {
                drop(retired);
                drop(source);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A descriptor registered with a reactor: which directions an event found
/// ready with no one waiting, and who waits for each.
pub(super) struct Source {
    reactor: Arc<Reactor>,
    state: Mutex<Readiness>,
}

#[derive(Default)]
struct Readiness {
    /// Directions an event reported while no fiber waited for them.
    ready: u8,
    /// Whether the last read took all the socket held (fewer bytes than it
    /// asked for): the next read waits for an event before it asks.
    drained: bool,
    /// Whether an event reported the peer gone, the socket failed, or
    /// urgent data (which a read stops short of): from then on a short read
    /// is not taken to have drained the socket, since no later event need
    /// report any of these again.
    unusual: bool,
    /// The fiber waiting to read, and the one waiting to write.
    waiting: [Option<Arc<Fiber>>; 2],
}

const READ: u8 = 1;
const WRITE: u8 = 2;

fn bit(interest: Interest) -> u8 {
    match interest {
        Interest::Read => READ,
        Interest::Write => WRITE,
    }
}

fn slot(interest: Interest) -> usize {
    match interest {
        Interest::Read => 0,
        Interest::Write => 1,
    }
}

/// The directions an event reports ready (a hang-up or an error wakes both:
/// the next call says what happened).
fn directions(flags: EventFlags) -> u8 {
    let mut bits = 0;
    if flags.intersects(EventFlags::IN | EventFlags::RDHUP | EventFlags::PRI) {
        bits |= READ;
    }
    if flags.contains(EventFlags::OUT) {
        bits |= WRITE;
    }
    if flags.intersects(EventFlags::HUP | EventFlags::ERR) {
        bits |= READ | WRITE;
    }
    bits
}

/// An event for the source whose token is `token`: wakes whoever waits for
/// the directions it reports, and marks the others ready.
///
/// # Safety
/// `token` is the data of an entry of the calling worker's reactor, read by
/// its last `epoll_wait`, and the worker has not released its retired
/// sources since (the entry's count keeps the source alive).
pub(super) unsafe fn source_event(token: u64, flags: EventFlags) {
    // SAFETY: the caller's contract: the entry's count keeps the source alive.
    let source = unsafe { &*(token as usize as *const Source) };
    let bits = directions(flags);
    let unusual =
        flags.intersects(EventFlags::RDHUP | EventFlags::HUP | EventFlags::ERR | EventFlags::PRI);
    let woken: [Option<Arc<Fiber>>; 2] = {
        let mut state = lock(&source.state);
        state.unusual |= unusual;
        let mut woken = [None, None];
        for (i, b) in [READ, WRITE].into_iter().enumerate() {
            if bits & b == 0 {
                continue;
            }
            match state.waiting[i].take() {
                Some(fiber) => woken[i] = Some(fiber),
                None => state.ready |= b,
            }
        }
        woken
    };
    woken.iter().flatten().for_each(|f| sched::unpark(f));
}

/// A descriptor's registration with a worker's reactor, made when a fiber
/// first waits on it; its owner deletes it ([`Registration::deregister`])
/// before the descriptor closes.
#[derive(Default)]
pub(crate) struct Registration {
    /// The source, or `None` if registering failed (the descriptor then
    /// waits one wait at a time).
    source: OnceLock<Option<Arc<Source>>>,
    /// Whether the socket underneath was lent out (`get_ref`): code that
    /// reads it there (urgent data with `MSG_OOB`, say) may leave a short
    /// read of ours with bytes queued and no event to come, so no read is
    /// taken to have drained it from then on.
    lent: AtomicBool,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let registered = matches!(self.source.get(), Some(Some(_)));
        f.debug_struct("Registration")
            .field("registered", &registered)
            .finish()
    }
}

impl Registration {
    /// Waits until `fd` may be ready for `interest` (or hung up, or failed)
    /// after a call on it said `EAGAIN`: a fiber parks (its worker runs
    /// others), a thread waits in `poll(2)`. The caller tries again; it may
    /// find `EAGAIN` again, and wait again.
    pub(crate) fn wait(&self, fd: BorrowedFd<'_>, interest: Interest) -> io::Result<()> {
        let Some(fiber) = sched::current() else {
            return super::wait_fd(fd, interest, None).map(drop);
        };
        let source = sched::with_reactor(|reactor| {
            let source = self.source.get_or_init(|| register(reactor, fd));
            // Registered elsewhere (the socket moved to a fiber of another
            // worker), or not registrable: a one-time registration here.
            source.as_ref().filter(|s| Arc::ptr_eq(&s.reactor, reactor))
        });
        match source {
            Some(source) => wait_on(source, fiber, fd, interest),
            None => wait_fd(fiber, fd, interest, None).map(drop),
        }
    }

    /// Called before a TCP read: parks the calling fiber until an event says
    /// there is more to read, if the last read drained the socket and none
    /// has since. The read after a drained one then asks the kernel once,
    /// not twice (an `EAGAIN`, then the read that finds the bytes); tokio's
    /// sockets clear their readiness on a short read for the same reason.
    /// Takes the readiness an event left, which the read that follows uses.
    pub(crate) fn before_read(&self) {
        let Some((source, fiber)) = self.registered_here() else {
            return;
        };
        let i = slot(Interest::Read);
        let mut state = lock(&source.state);
        if state.ready & READ != 0 {
            state.ready &= !READ;
            return;
        }
        // (A second reader has a wait of its own.)
        if !state.drained || state.unusual || state.waiting[i].is_some() {
            return;
        }
        state.waiting[i] = Some(sched::current_arc(fiber));
        drop(state);
        park_in(source, fiber, i);
    }

    /// The socket underneath is lent out: see `lent`.
    pub(crate) fn lend(&self) {
        self.lent.store(true, Ordering::Relaxed);
    }

    /// Called after a read into a buffer of `len` bytes (not empty) that
    /// returned `n` bytes, or `None` for an error. Fewer than asked for (and
    /// not the end of the stream) means the socket is drained, if this is a
    /// fiber of the worker the socket is registered with: its reactor cannot
    /// have taken an event between the read and now, so bytes that came
    /// after the read have an event still to come. Anything else means the
    /// socket may hold more, which wakes a reader parked since it found the
    /// socket drained (it then asks the kernel).
    pub(crate) fn after_read(&self, n: Option<usize>, len: usize) {
        let Some(Some(source)) = self.source.get() else {
            return;
        };
        let drained = n.is_some_and(|n| n > 0 && n < len)
            && !self.lent.load(Ordering::Relaxed)
            && self.registered_here().is_some();
        let waiting = {
            let mut state = lock(&source.state);
            state.drained = drained;
            match drained {
                true => None,
                false => state.waiting[slot(Interest::Read)].take(),
            }
        };
        if let Some(fiber) = waiting {
            sched::unpark(&fiber);
        }
    }

    /// The source, if it is registered with the reactor of the worker of
    /// the calling fiber, and that fiber.
    fn registered_here(&self) -> Option<(&Source, &'static Fiber)> {
        let Some(Some(source)) = self.source.get() else {
            return None;
        };
        let fiber = sched::current()?;
        sched::with_reactor(|reactor| Arc::ptr_eq(&source.reactor, reactor))
            .then_some((&**source, fiber))
    }

    /// Deletes the registration: called before the descriptor closes.
    pub(crate) fn deregister(&mut self, fd: BorrowedFd<'_>) {
        if let Some(Some(source)) = self.source.take() {
            let _ = epoll::delete(&source.reactor.epoll, fd);
            let address = Arc::as_ptr(&source);
            // SAFETY: `register` turned one count into the entry's data, and
            // the entry is gone: that count is taken back exactly once, here.
            let entry = unsafe { Arc::from_raw(address) };
            let reactor = Arc::clone(&source.reactor);
            reactor.sources.fetch_sub(1, Ordering::Relaxed);
            reactor.retire(entry);
        }
    }
}

/// Registers `fd` with `reactor`, edge-triggered for both directions: `None`
/// if it cannot be (the caller waits one wait at a time).
fn register(reactor: &Arc<Reactor>, fd: BorrowedFd<'_>) -> Option<Arc<Source>> {
    let source = Arc::new(Source {
        reactor: Arc::clone(reactor),
        state: Mutex::new(Readiness::default()),
    });
    let entry = Arc::into_raw(Arc::clone(&source));
    // `PRI`: urgent data, at which a read stops short (see `Readiness`).
    let flags =
        EventFlags::IN | EventFlags::OUT | EventFlags::RDHUP | EventFlags::PRI | EventFlags::ET;
    match epoll::add(
        &reactor.epoll,
        fd,
        EventData::new_u64(entry as usize as u64),
        flags,
    ) {
        Ok(()) => {
            reactor.sources.fetch_add(1, Ordering::Relaxed);
            Some(source)
        }
        Err(_) => {
            // SAFETY: the count turned into `entry` just above, never shared.
            drop(unsafe { Arc::from_raw(entry) });
            None
        }
    }
}

/// Parks `fiber` until an event reports `source` ready for `interest`, unless
/// one already has since the caller's last wait.
fn wait_on(
    source: &Source,
    fiber: &Fiber,
    fd: BorrowedFd<'_>,
    interest: Interest,
) -> io::Result<()> {
    let (b, i) = (bit(interest), slot(interest));
    {
        let mut state = lock(&source.state);
        if state.ready & b != 0 {
            state.ready &= !b;
            return Ok(());
        }
        if state.waiting[i].is_some() {
            // Another fiber waits for this direction (two fibers reading one
            // socket): this one waits on its own.
            drop(state);
            return wait_fd(fiber, fd, interest, None).map(drop);
        }
        state.waiting[i] = Some(sched::current_arc(fiber));
    }
    park_in(source, fiber, i);
    Ok(())
}

/// Parks `fiber`, which has put itself in `source`'s slot `i`, until an
/// event takes it from there.
fn park_in(source: &Source, fiber: &Fiber, i: usize) {
    loop {
        sched::park(fiber);
        // Woken by the event (which took the slot), or spuriously (the slot
        // still names this fiber).
        let state = lock(&source.state);
        if !state.waiting[i]
            .as_ref()
            .is_some_and(|f| std::ptr::eq(&**f, fiber))
        {
            return;
        }
    }
}

/// Whether worker `w` has fibers waiting for descriptors (or sockets
/// registered with its reactor).
pub(super) fn waits_for_io(w: &WorkerState) -> bool {
    !w.io_waits.borrow().is_empty() || w.rt.reactors[w.index].has_sources()
}

/// Waits on worker `w`'s reactor up to `timeout` (`None`: no limit; zero:
/// a look) and wakes the fibers whose descriptors are ready: `true` if
/// another thread woke the worker.
pub(super) fn poll_reactor(w: &WorkerState, timeout: Option<Duration>) -> bool {
    w.since_poll.set(0);
    let reactor = &w.rt.reactors[w.index];
    let mut events = [const { std::mem::MaybeUninit::<epoll::Event>::uninit() }; 64];
    let timeout = timeout.map(|t| {
        rustix::time::Timespec::try_from(t.min(Duration::from_secs(3600))).unwrap_or(
            rustix::time::Timespec {
                tv_sec: 3600,
                tv_nsec: 0,
            },
        )
    });
    reactor.release_retired();
    let ready = match epoll::wait(&reactor.epoll, &mut events[..], timeout.as_ref()) {
        Ok((ready, _)) => ready,
        Err(_) => return false,
    };
    let mut woken = false;
    for event in ready.iter() {
        match event.data.u64() {
            WAKE_TOKEN => {
                reactor.drain_wake();
                woken = true;
            }
            token if token & 1 == 1 => {
                let fiber = w.io_waits.borrow_mut().remove(&token);
                if let Some(fiber) = fiber {
                    sched::unpark(&fiber);
                }
            }
            // SAFETY: an even token other than the wake-up's is a source's,
            // read from this worker's reactor by the wait just above; retired
            // sources are let go only before the next wait.
            token => unsafe { source_event(token, event.flags) },
        }
    }
    woken
}

/// What a fiber waits for on a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interest {
    Read,
    Write,
}

/// Parks the running fiber `fiber` until `fd` is ready for `interest` (or
/// hung up, or failed), or `deadline`: `Ok(true)` if it is ready, `Ok(false)`
/// if the deadline came first. Its worker runs other fibers meanwhile.
pub(crate) fn wait_fd(
    fiber: &Fiber,
    fd: BorrowedFd<'_>,
    interest: Interest,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    sched::with_worker(|w| wait_fd_on(w, fiber, fd, interest, deadline))
}

fn wait_fd_on(
    w: &WorkerState,
    fiber: &Fiber,
    fd: BorrowedFd<'_>,
    interest: Interest,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    // One-shot tokens are odd (see `reactor::WAKE_TOKEN`).
    let token = w.next_token.get();
    w.next_token.set(token + 2);
    let me = sched::current_arc(fiber);
    let flags = match interest {
        Interest::Read => EventFlags::IN | EventFlags::RDHUP,
        Interest::Write => EventFlags::OUT,
    } | EventFlags::ONESHOT;
    let epoll_fd = &w.rt.reactors[w.index].epoll;
    // A descriptor another fiber of this worker already waits on (its other
    // direction) is registered through a duplicate: `epoll` keys entries by
    // descriptor number and open file.
    let dup = match epoll::add(epoll_fd, fd, EventData::new_u64(token), flags) {
        Ok(()) => None,
        Err(Errno::EXIST) => {
            let copy = fd.try_clone_to_owned()?;
            epoll::add(epoll_fd, &copy, EventData::new_u64(token), flags)?;
            Some(copy)
        }
        Err(e) => return Err(e.into()),
    };
    w.io_waits.borrow_mut().insert(token, me);
    let ready = loop {
        sched::park_current(fiber, deadline);
        if !w.io_waits.borrow().contains_key(&token) {
            break true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break false;
        }
    };
    w.io_waits.borrow_mut().remove(&token);
    let _ = epoll::delete(epoll_fd, dup.as_ref().map_or(fd, AsFd::as_fd));
    Ok(ready)
}
