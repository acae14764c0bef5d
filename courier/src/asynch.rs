//! IPC receivers as async streams (feature `async`), with the names and
//! signatures of ipc-channel's `asynch` module: [`IpcReceiver::to_stream`]
//! turns a receiver into an [`IpcStream`], a [`Stream`] of
//! `Result<T, SerDeError>` that is also a [`FusedStream`] and `Unpin`.
//!
//! ```
//! use courier::ipc;
//! use futures_util::StreamExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let (tx, rx) = ipc::channel::<u32>().unwrap();
//! let sender = std::thread::spawn(move || {
//!     for n in 0..3 {
//!         tx.send(n).unwrap();
//!     }
//!     // Dropping the last sender ends the stream.
//! });
//! let mut stream = rx.to_stream();
//! let mut got = Vec::new();
//! while let Some(n) = stream.next().await {
//!     got.push(n.unwrap());
//! }
//! assert_eq!(got, [0, 1, 2]);
//! # sender.join().unwrap();
//! # }
//! ```
//!
//! The stream works under any executor: it needs nothing of the task's
//! runtime but its [`Waker`].
//!
//! # How a stream waits
//! A poll first receives without waiting ([`IpcReceiver::try_recv`]). That
//! answers from the messages the receiver already holds in memory (a
//! receive can read several packets off the socket and keep what it did not
//! hand out) before it reads the socket, so its `Empty` is the whole truth:
//! nothing in memory, nothing on the socket. Only then does the stream wait,
//! and it waits for its socket.
//!
//! One background thread per process, the *stream reactor*, serves every
//! stream: an `epoll` instance in which each stream's socket is registered
//! one-shot (`EPOLLIN | EPOLLONESHOT`) under a token of its own, with the
//! [`Waker`] of the task that last polled it stored beside the token. A poll
//! that finds nothing stores its waker, arms the socket (`epoll_ctl`) and
//! returns `Pending`; the reactor wakes the stored waker when the socket is
//! readable or hung up, and the socket stays disarmed until the next poll
//! that finds nothing arms it again. No message passes through the reactor
//! or through another channel: the woken task receives it from the socket
//! itself.
//!
//! No message can slip between the receive that finds nothing and the arm:
//! `epoll_ctl` checks the socket's readiness as it arms it, and reports a
//! socket that is already readable at once. The messages in memory change
//! only through the stream's own receives, so they cannot change between the
//! two either.
//!
//! A receiver can hold a message that its socket's readiness will not
//! announce: one whose payload is still arriving (the rest of a fragmented
//! message, or a large region the sender is still writing; a receive that
//! may not wait leaves it half-fetched after about a millisecond and goes on
//! with it at the next receive), or one whose descriptors are late (it fails
//! at a deadline). For those the poll also gives the reactor that deadline,
//! and the reactor wakes the task when it passes, as an `IpcReceiverSet`
//! does for its members. A timer the reactor is not yet sleeping toward
//! interrupts its sleep through an `eventfd`.
//!
//! The reactor starts with the first stream that has to wait, and runs for
//! the life of the process. A forked child starts its own at its first
//! wait; a stream is not carried across a fork (the child must not poll a
//! stream its parent created).
//!
//! # Cost
//! A message that is already there costs what a [`IpcReceiver::try_recv`]
//! costs: one `recvmsg` while the channel is busy, no lock, no wake-up, no
//! copy. A poll that finds nothing costs one more `recvmsg` (the one that
//! finds the socket dry), an uncontended lock and one `epoll_ctl`; the
//! wake-up costs one `epoll_wait` return in the reactor and the executor's
//! own wake. Each stream costs one registration in the `epoll` instance
//! while it lives; no thread and no buffer of its own. `courier-bench ipc
//! --case stream` measures a stream under tokio against ipc-channel's (a
//! router thread that receives every message and forwards it through a
//! second channel) and against a thread in a blocking `recv`.
//!
//! A stream whose messages keep coming is always ready: a task that loops
//! on it returns to its executor only when the stream waits (so it is with
//! ipc-channel's).
//!
//! # Backpressure: where courier differs
//! Messages stay in the socket until the stream takes them, so a sender
//! blocks while the socket buffer is full and the stream is not polled, as
//! it would for a blocking receiver; a stream's memory is the socket's
//! buffer. ipc-channel's router thread drains every stream's socket into an
//! unbounded queue, so its senders never wait for a stream, and a stream
//! that is not polled grows without limit. A program that sends many
//! messages to a stream from the task that polls it, before polling it,
//! relies on the latter: with courier, send from another thread or task.
//!
//! # Disconnection and errors
//! When every sender is gone, the stream yields the messages still queued,
//! then `None`, and stays terminated ([`FusedStream::is_terminated`]). A
//! message that cannot be decoded is `Some(Err(SerDeError))`, and so is a
//! malformed one from a peer (its [`SerDeError::wire_error`] names the
//! fault); the stream goes on with the messages after it. Any other error
//! of the receive (an I/O error of the socket) ends the stream, as it ends
//! ipc-channel's.
//!
//! Dropping the stream removes its socket from the reactor before the
//! socket is closed. A wake-up the reactor already took in hand for it wakes
//! a waker the reactor still holds a reference to: never one that was freed.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{eventfd, EventfdFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{getpid, Pid};
use serde::{Deserialize, Serialize};

use crate::fiber::affinity;
use crate::ipc::{IpcError, IpcReceiver, SerDeError, TryRecvError, WireError};

impl<T> IpcReceiver<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    /// Turns this receiver into a stream of its messages (feature `async`;
    /// see [`asynch`](crate::asynch) for how it waits). The messages the
    /// receiver holds come first.
    pub fn to_stream(self) -> IpcStream<T> {
        IpcStream {
            rx: Mutex::new(self),
            registration: None,
            terminated: false,
        }
    }
}

// ===== IpcStream =====

/// The messages of an [`IpcReceiver`], as a [`Stream`]: made by
/// [`IpcReceiver::to_stream`]. Dropping it drops the receiver.
pub struct IpcStream<T> {
    /// The receiver. The lock is never taken: every use goes through
    /// `&mut self` (`Mutex::get_mut`). It makes the stream `Sync`, as
    /// ipc-channel's is, without an `unsafe impl`.
    rx: Mutex<IpcReceiver<T>>,
    /// The socket's place in the reactor, from the first poll that has to
    /// wait until the stream ends.
    registration: Option<Registration>,
    /// The stream has yielded `None`.
    terminated: bool,
}

impl<T> Unpin for IpcStream<T> {}

impl<T> IpcStream<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    /// Ends the stream: it yields `None` from now on, and leaves the reactor.
    fn terminate(&mut self) -> Poll<Option<Result<T, SerDeError>>> {
        self.terminated = true;
        if let Some(registration) = self.registration.take() {
            let rx = self.rx.get_mut().unwrap_or_else(PoisonError::into_inner);
            registration.deregister(rx.as_fd());
        }
        Poll::Ready(None)
    }
}

impl<T> Stream for IpcStream<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    type Item = Result<T, SerDeError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.terminated {
            return Poll::Ready(None);
        }
        let rx = this.rx.get_mut().unwrap_or_else(PoisonError::into_inner);
        match rx.try_recv() {
            Ok(message) => return Poll::Ready(Some(Ok(message))),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::IpcError(IpcError::SerializationError(e))) => {
                return Poll::Ready(Some(Err(e)))
            }
            Err(TryRecvError::IpcError(IpcError::Io(e))) => match wire_error(&e) {
                Some(wire) => return Poll::Ready(Some(Err(wire.into()))),
                None => return this.terminate(),
            },
            Err(TryRecvError::IpcError(IpcError::Disconnected)) => return this.terminate(),
        }
        // Nothing in memory, nothing on the socket: wait for the socket, and
        // for the deadline of a message held that it will not announce.
        let due = rx.due();
        if due.is_some_and(|due| due <= Instant::now()) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if this.registration.is_none() {
            this.registration = Registration::new();
        }
        let armed = match &mut this.registration {
            Some(registration) => registration.arm(rx.as_fd(), cx.waker(), due),
            None => Err(io::ErrorKind::Unsupported.into()),
        };
        if armed.is_err() {
            // No reactor (no thread, or no `epoll` watch left): poll again
            // at the executor's next turn, which is slow but loses nothing.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<T> FusedStream for IpcStream<T>
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    fn is_terminated(&self) -> bool {
        self.terminated
    }
}

impl<T> Drop for IpcStream<T> {
    fn drop(&mut self) {
        // Before the receiver, and so its socket, is dropped.
        if let Some(registration) = self.registration.take() {
            let rx = self.rx.get_mut().unwrap_or_else(PoisonError::into_inner);
            registration.deregister(rx.as_fd());
        }
    }
}

impl<T> fmt::Debug for IpcStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcStream")
            .field("terminated", &self.terminated)
            .field("registered", &self.registration.is_some())
            .finish_non_exhaustive()
    }
}

/// The peer's fault inside a receive's I/O error, if that is what it is.
fn wire_error(e: &io::Error) -> Option<WireError> {
    e.get_ref()?.downcast_ref::<WireError>().copied()
}

// ===== Registration =====

/// A stream's socket in the reactor.
struct Registration {
    reactor: Arc<Reactor>,
    token: u64,
    slot: Arc<Slot>,
    /// Whether the socket is in the `epoll` instance (added at the first arm).
    added: bool,
    /// The last deadline given to the reactor: a later poll with the same
    /// one (the same message still held) adds no second timer.
    due: Option<Instant>,
}

/// What the reactor keeps of a stream: the waker of its last poll that had
/// to wait.
#[derive(Default)]
struct Slot {
    waker: Mutex<Option<Waker>>,
}

impl Registration {
    /// A token and a slot in this process's reactor (`None` if it cannot
    /// be started).
    fn new() -> Option<Registration> {
        let reactor = Reactor::get().ok()?;
        let slot = Arc::new(Slot::default());
        let token = {
            let mut slots = lock(&reactor.slots);
            let token = slots.next_token;
            slots.next_token += 1;
            slots.map.insert(token, Arc::clone(&slot));
            token
        };
        Some(Registration {
            reactor,
            token,
            slot,
            added: false,
            due: None,
        })
    }

    /// Makes the reactor wake `waker` when `fd` is readable (or hung up),
    /// or when `due` passes.
    fn arm(&mut self, fd: BorrowedFd<'_>, waker: &Waker, due: Option<Instant>) -> io::Result<()> {
        {
            let mut stored = lock(&self.slot.waker);
            match &*stored {
                Some(old) if old.will_wake(waker) => {}
                _ => *stored = Some(waker.clone()),
            }
        }
        // The waker is in place before the socket is armed: a wake-up the
        // arm triggers at once finds it.
        let data = EventData::new_u64(self.token);
        let flags = EventFlags::IN | EventFlags::ONESHOT;
        if self.added {
            epoll::modify(&self.reactor.epoll, fd, data, flags)?;
        } else {
            epoll::add(&self.reactor.epoll, fd, data, flags)?;
            self.added = true;
        }
        if let Some(at) = due.filter(|&at| Some(at) != self.due) {
            self.reactor.add_timer(at, self.token);
        }
        self.due = due;
        Ok(())
    }

    /// Leaves the reactor (before `fd` is closed: `epoll` forgets a socket
    /// only when every descriptor of it is closed).
    fn deregister(self, fd: BorrowedFd<'_>) {
        if self.added {
            let _ = epoll::delete(&self.reactor.epoll, fd);
        }
        lock(&self.reactor.slots).map.remove(&self.token);
        // A timer of this token left in the queue finds no slot when it
        // fires, and is dropped.
    }
}

// ===== Reactor =====

/// The process's stream reactor: an `epoll` instance, the slots of the
/// streams in it, and their timers, served by one thread.
struct Reactor {
    epoll: OwnedFd,
    /// An `eventfd` in the `epoll` instance (token [`KICK`]): written to
    /// interrupt the thread's sleep when a timer comes due before it ends.
    kick: OwnedFd,
    slots: Mutex<Slots>,
    timers: Mutex<Timers>,
    /// The process that created it (a forked child creates its own).
    pid: Pid,
}

/// The token of the reactor's `eventfd`; streams' tokens start above it.
const KICK: u64 = 0;

/// Events taken from the kernel per `epoll_wait`; the rest come with the
/// next.
const EVENTS: usize = 64;

/// The longest sleep of the reactor thread without a timer: kernels before
/// 5.11 refuse a timeout of more than `c_int::MAX` milliseconds.
const MAX_SLEEP: Duration = Duration::from_secs(24 * 3600);

struct Slots {
    map: HashMap<u64, Arc<Slot>>,
    next_token: u64,
}

struct Timers {
    /// Deadlines, and the tokens to wake at each.
    queue: BTreeSet<(Instant, u64)>,
    /// When the thread's current sleep ends at the latest (`None`: it is
    /// awake, and looks at the queue before it sleeps).
    sleep_until: Option<Instant>,
}

/// This process's reactor, if one was started.
static REACTOR: Mutex<Option<Arc<Reactor>>> = Mutex::new(None);

impl Reactor {
    /// This process's reactor, started at the first call (and again in a
    /// forked child).
    fn get() -> io::Result<Arc<Reactor>> {
        let mut current = lock(&REACTOR);
        let pid = getpid();
        if let Some(reactor) = current.as_ref().filter(|r| r.pid == pid) {
            return Ok(Arc::clone(reactor));
        }
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        let kick = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &epoll,
            &kick,
            EventData::new_u64(KICK),
            EventFlags::IN | EventFlags::ET,
        )?;
        let reactor = Arc::new(Reactor {
            epoll,
            kick,
            slots: Mutex::new(Slots {
                map: HashMap::new(),
                next_token: KICK + 1,
            }),
            timers: Mutex::new(Timers {
                queue: BTreeSet::new(),
                sleep_until: None,
            }),
            pid,
        });
        let serving = Arc::clone(&reactor);
        let unbound = affinity::for_new_thread();
        std::thread::Builder::new()
            .name("courier-streams".to_owned())
            .spawn(move || {
                affinity::restore(unbound);
                serving.run()
            })?;
        *current = Some(Arc::clone(&reactor));
        Ok(reactor)
    }

    /// Wakes `token`'s stream at `at`.
    fn add_timer(&self, at: Instant, token: u64) {
        let mut timers = lock(&self.timers);
        timers.queue.insert((at, token));
        if timers.sleep_until.is_some_and(|until| at < until) {
            timers.sleep_until = None;
            drop(timers);
            let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
        }
    }

    /// The reactor thread: waits for armed sockets and timers, and wakes
    /// their streams' tasks.
    fn run(&self) {
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; EVENTS];
        let mut due = Vec::new();
        loop {
            let timeout = self.next_sleep(&mut due);
            self.wake(&due);
            due.clear();
            let timeout = Timespec::try_from(timeout).unwrap_or(Timespec {
                tv_sec: MAX_SLEEP.as_secs() as i64,
                tv_nsec: 0,
            });
            let ready = match epoll::wait(&self.epoll, &mut events[..], Some(&timeout)) {
                Ok((ready, _)) => ready,
                Err(Errno::INTR) => continue,
                // A valid `epoll` instance and buffer: nothing else can fail.
                Err(e) => panic!("the stream reactor's epoll_wait failed: {e}"),
            };
            for event in ready.iter() {
                match event.data.u64() {
                    KICK => {
                        let mut counter = [0u8; 8];
                        let _ = rustix::io::read(&self.kick, &mut counter);
                    }
                    token => due.push(token),
                }
            }
        }
    }

    /// Moves the tokens of the timers that have passed to `due`, and returns
    /// how long to sleep until the next one (recorded, so that an earlier
    /// timer added meanwhile interrupts the sleep).
    fn next_sleep(&self, due: &mut Vec<u64>) -> Duration {
        let mut timers = lock(&self.timers);
        let now = Instant::now();
        while let Some(&(at, token)) = timers.queue.first() {
            if at > now {
                timers.sleep_until = Some(at);
                return at - now;
            }
            timers.queue.pop_first();
            due.push(token);
        }
        timers.sleep_until = Some(now + MAX_SLEEP);
        MAX_SLEEP
    }

    /// Wakes the tasks of the streams of `tokens`. A token whose stream is
    /// gone has no slot: nothing to wake.
    fn wake(&self, tokens: &[u64]) {
        if tokens.is_empty() {
            return;
        }
        let slots: Vec<Arc<Slot>> = {
            let map = &lock(&self.slots).map;
            tokens.iter().filter_map(|t| map.get(t).cloned()).collect()
        };
        for slot in slots {
            // Taken, and woken outside the lock: a poll that arms again
            // stores a waker again.
            let waker = lock(&slot.waker).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// A lock whose holder cannot leave its data half-changed: a panic
/// elsewhere does not poison it for the reactor.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
