//! In-process channels: lock-free MPMC queues whose blocking parks a thread or a fiber.
//!
//! ```
//! use courier::chan;
//! use std::thread;
//!
//! // A bounded channel: `send` waits while it is full.
//! let (tx, rx) = chan::bounded(16);
//! let producers: Vec<_> = (0..4)
//!     .map(|p| {
//!         let tx = tx.clone();
//!         thread::spawn(move || (0..100).for_each(|i| tx.send(p * 1000 + i).unwrap()))
//!     })
//!     .collect();
//! drop(tx); // the channel disconnects once every sender is gone...
//! let total: usize = rx.iter().count(); // ...so this loop ends
//! assert_eq!(total, 400);
//! producers.into_iter().for_each(|t| t.join().unwrap());
//! ```
//!
//! # Flavors
//!
//! | constructor | algorithm | blocking `send` | memory |
//! | --- | --- | --- | --- |
//! | [`bounded(n)`](bounded), n ≥ 2 | Vyukov's array queue (`flavors/array.rs`) | while full | `n` slots, allocated once |
//! | [`bounded(1)`](bounded) | one slot, one state word (`flavors/one.rs`) | while full | one slot |
//! | [`unbounded()`](unbounded) | linked list of 31-slot blocks (`flavors/list/`) | never | one block per 31 messages |
//! | [`bounded(0)`](bounded) | rendezvous (`flavors/zero.rs`) | until a receiver takes it | none |
//! | [`oneshot()`](oneshot()) | one slot, one message | never | one slot |
//! | [`local::channel()`](local) | `VecDeque` in a `RefCell`, `!Send`, no atomics | (fibers only) | grows |
//!
//! Every flavor is multi-producer multi-consumer: [`Sender`] and [`Receiver`] are `Clone`, `Send`
//! and `Sync` (for `T: Send`). Each channel synchronises on its own state only; there is no
//! global lock, and the buffered flavors take no lock at all unless an operation has to wait.
//!
//! # Timers
//!
//! Three receivers have no sender, as crossbeam-channel's of the same names: [`after(d)`](after)
//! (and [`at(t)`](at())) delivers one `Instant` once it is due, [`tick(d)`](tick) one every
//! period, and [`never()`] nothing, ever. They are flavors of their own that read the clock: no
//! thread sends their messages. They take part in a [`Select`] and in
//! [`select!`](crate::select) like any receiver (a waiting select wakes when a timer among its
//! operations is due), and their blocking receives park a fiber as any other does. In a
//! `select!` loop, swapping a disconnected receiver for `never()` takes its arm out (see
//! [`never()`]).
//!
//! # Cost model
//!
//! - A `send`/`recv` that does not wait is one CAS on the channel's tail/head, one store of the
//!   slot's stamp, and one load (a plain `mov` on x86) to see whether a peer waits (`bounded`,
//!   `unbounded`; on `bounded(1)`, a CAS and a `fetch_xor` on the slot's state word, the one
//!   line both sides touch). Nothing allocates except the unbounded flavor, once per 31
//!   messages.
//! - A thread that must wait first spins for as long as spinning has been paying on that
//!   channel side (an adaptive estimate), then polls between `sched_yield`s for up to 50 µs (a
//!   receiver of `bounded(n > 1)`: four yields, so that it trails a streaming sender), then
//!   registers itself, re-checks, and parks. A rendezvous, a `Select` and a capacity-one
//!   waiter register first and poll their claim word, so that a peer can finish the operation
//!   for them. A fiber never yields its thread: it spins ~3 µs at most, and only when its
//!   scheduler has nothing else ready (`backoff.rs`, `wait_list.rs` and
//!   `docs/waiting-policy.md`: why, with measurements).
//!   Waking a parked thread costs a futex wake; a waker that finds nobody registered pays
//!   nothing more.
//! - A blocking receiver of `unbounded()` claims the next position before any sender has and
//!   waits on that slot alone; if its wait runs out it gives the position up, and the sender
//!   that reaches it sends again further on.
//! - A receiver that frees a slot of a full `bounded` channel moves a blocked sender's message
//!   into it before waking that sender (Go's `chanrecv` does the same), so the next receiver
//!   does not wait for the sender to be scheduled.
//! - A rendezvous (`bounded(0)`) takes the channel's mutex for every operation.
//!
//! # Disconnection
//!
//! A channel is disconnected when all its senders or all its receivers are dropped. Receivers
//! still get every message sent before, then `Err(RecvError)` (or `Disconnected`); a send
//! fails with the message handed back: `SendError(msg)`. Dropping the last handle drops every
//! message still queued, exactly once (the unbounded flavor drops them as soon as the last
//! receiver is gone).
//!
//! # Blocking a fiber
//!
//! Blocking goes through one protocol (register, re-check, park) and one seam, [`Park`]: by
//! default an operation parks the OS thread; a scheduler that installs a [`TaskContext`] while
//! it runs a fiber makes the same operations park that fiber instead. Finding the current task
//! is one thread-local load. Where an operation waits for a step another task has already begun
//! (a receiver that took a `Select`'s send on a rendezvous channel, waiting for the selecting
//! task to write), a fiber lets its scheduler run the others ([`Park::yield_now`]) instead of
//! spinning: the task it waits for may share its thread. `park.rs` says what implementing the
//! seam takes; `tests/chan_fibers.rs` runs rings, producers and consumers, selects, timers and
//! timeouts as fibers of one thread under `tests/common/fibers.rs`, a minimal scheduler written
//! against it.
//!
//! # Ordering
//!
//! Messages of one sender are received in the order it sent them; no message is lost or
//! received twice.

/// The iterator types of a receiver type that has `recv` and `try_recv` (this module's and
/// [`local`]'s): `Iter` and `TryIter` (from `iter` and `try_iter`), `IntoIter`, and
/// `IntoIterator` for the receiver and a reference to it.
macro_rules! receiver_iterators {
    ($receiver:ident) => {
        impl<'a, T> IntoIterator for &'a $receiver<T> {
            type Item = T;
            type IntoIter = Iter<'a, T>;

            fn into_iter(self) -> Self::IntoIter {
                self.iter()
            }
        }

        impl<T> IntoIterator for $receiver<T> {
            type Item = T;
            type IntoIter = IntoIter<T>;

            fn into_iter(self) -> Self::IntoIter {
                IntoIter { rx: self }
            }
        }

        /// Blocking iterator over received messages ([`Receiver::iter`]).
        #[derive(Debug)]
        pub struct Iter<'a, T> {
            rx: &'a $receiver<T>,
        }

        impl<T> Iterator for Iter<'_, T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.recv().ok()
            }
        }

        /// Non-blocking iterator over the messages available now ([`Receiver::try_iter`]).
        #[derive(Debug)]
        pub struct TryIter<'a, T> {
            rx: &'a $receiver<T>,
        }

        impl<T> Iterator for TryIter<'_, T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.try_recv().ok()
            }
        }

        /// Owning blocking iterator (`Receiver::into_iter`).
        #[derive(Debug)]
        pub struct IntoIter<T> {
            rx: $receiver<T>,
        }

        impl<T> Iterator for IntoIter<T> {
            type Item = T;

            fn next(&mut self) -> Option<T> {
                self.rx.recv().ok()
            }
        }
    };
}

mod backoff;
pub(crate) mod context;
mod err;
pub(crate) mod flavors;
pub mod local;
pub mod oneshot;
mod park;
mod select;
mod select_macro;
mod wait_list;

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::Arc;
use flavors::{array, list, one, zero, Token};

pub use context::TaskContext;
pub use err::{
    ReadyTimeoutError, RecvError, RecvTimeoutError, SelectTimeoutError, SendError,
    SendTimeoutError, TryReadyError, TryRecvError, TrySelectError, TrySendError,
};
pub use oneshot::oneshot;
pub use park::Park;
pub use select::{Select, SelectRecv, SelectSend, SelectedOperation};

/// A channel of capacity `cap`: `bounded(0)` is a rendezvous channel.
///
/// ```
/// let (tx, rx) = courier::chan::bounded(1);
/// tx.send(1).unwrap();
/// assert!(tx.try_send(2).unwrap_err().is_full());
/// assert_eq!(rx.recv(), Ok(1));
/// ```
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let flavor = match cap {
        0 => Flavor::Zero(zero::Channel::new()),
        1 => Flavor::One(one::Channel::new()),
        _ => Flavor::Array(array::Channel::with_capacity(cap)),
    };
    Chan::pair(flavor)
}

/// A channel without a capacity limit: `send` never waits.
///
/// ```
/// let (tx, rx) = courier::chan::unbounded();
/// for i in 0..100 { tx.send(i).unwrap(); }
/// drop(tx);
/// assert_eq!(rx.iter().sum::<i32>(), 4950);
/// ```
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    Chan::pair(Flavor::List(list::Channel::new()))
}

// ===== timers: receivers without senders =====

/// A receiver that never delivers a message and is never disconnected (a `bounded(0)` channel
/// without senders, as crossbeam-channel's `never`).
///
/// Its receives wait until their deadline (for ever without one), and in a [`Select`] or
/// [`select!`](crate::select) its operation is never ready. That is how an arm leaves a
/// `select!` loop: a disconnected receiver is always ready (its arm gets `Err`), so swap it for
/// `never()`.
///
/// ```
/// use courier::chan;
///
/// let (numbers_tx, mut numbers) = chan::unbounded::<u32>();
/// let (words_tx, mut words) = chan::unbounded::<&str>();
/// numbers_tx.send(1).unwrap();
/// words_tx.send("one").unwrap();
/// drop((numbers_tx, words_tx));
///
/// let mut open = 2;
/// let mut got = Vec::new();
/// while open > 0 {
///     courier::select! {
///         recv(numbers) -> msg => match msg {
///             Ok(n) => got.push(n.to_string()),
///             Err(_) => { numbers = chan::never(); open -= 1; }
///         },
///         recv(words) -> msg => match msg {
///             Ok(w) => got.push(w.to_owned()),
///             Err(_) => { words = chan::never(); open -= 1; }
///         },
///     }
/// }
/// got.sort();
/// assert_eq!(got, ["1", "one"]);
/// ```
///
/// All `never()` receivers count as one channel ([`Receiver::same_channel`]).
pub fn never<T>() -> Receiver<T> {
    Chan::receiver(Flavor::Never(flavors::never::Channel))
}

/// A receiver that delivers one message, the instant it was due, once `duration` has passed
/// (as crossbeam-channel's `after`). A `duration` too long for `Instant` gives [`never()`].
///
/// Nothing runs in the background: the receiver reads the clock. A blocking receive waits for
/// the instant (a fiber parks, its thread runs others); of the receiver's clones exactly one
/// gets the message, and later receives wait as `never()`'s do.
///
/// ```
/// use std::time::{Duration, Instant};
/// use courier::chan;
///
/// let (_tx, jobs) = chan::unbounded::<u32>();
/// let start = Instant::now();
/// let timeout = chan::after(Duration::from_millis(10));
/// courier::select! {
///     recv(jobs) -> job => panic!("no job was sent: {job:?}"),
///     recv(timeout) -> at => assert!(at.unwrap() >= start + Duration::from_millis(10)),
/// }
/// ```
pub fn after(duration: Duration) -> Receiver<Instant> {
    match Instant::now().checked_add(duration) {
        Some(when) => at(when),
        None => never(),
    }
}

/// A receiver that delivers one message, `when`, once `when` has come (as crossbeam-channel's
/// `at`): [`after`] with an instant instead of a duration.
pub fn at(when: Instant) -> Receiver<Instant> {
    Chan::receiver(Flavor::At(flavors::at::Channel::new(
        when,
        std::convert::identity,
    )))
}

/// A receiver that delivers a message every `duration`, the instant that tick was due (as
/// crossbeam-channel's `tick`). A `duration` too long for `Instant` gives [`never()`].
///
/// Ticks are not queued: a receive takes the one that is due and the next is due `duration`
/// later, from then, so a receiver that falls behind gets one late tick and then the rhythm
/// again. Nothing runs in the background: the receiver reads the clock.
///
/// ```
/// use std::time::{Duration, Instant};
/// use courier::chan;
///
/// let start = Instant::now();
/// let ticker = chan::tick(Duration::from_millis(5));
/// let first = ticker.recv().unwrap();
/// let second = ticker.recv().unwrap();
/// assert!(first >= start + Duration::from_millis(5));
/// assert!(second >= first + Duration::from_millis(5));
/// ```
pub fn tick(duration: Duration) -> Receiver<Instant> {
    match Instant::now().checked_add(duration) {
        Some(first) => Chan::receiver(Flavor::Tick(flavors::tick::Channel::new(
            first,
            duration,
            std::convert::identity,
        ))),
        None => never(),
    }
}

/// The algorithm behind a channel, chosen at construction (one file each in `flavors/`).
///
/// The variants differ in size (the wait lists' spin estimates sit on lines of their own),
/// which costs nothing: a channel is one heap allocation, and boxing a variant would add a
/// pointer chase to every operation.
///
/// The timer flavors (`At`, `Tick`, `Never`) have receivers only: no [`Sender`] of them
/// exists, and the senders' operations treat them as unreachable ([`no_sender`]).
#[allow(clippy::large_enum_variant)]
enum Flavor<T> {
    Array(array::Channel<T>),
    One(one::Channel<T>),
    List(list::Channel<T>),
    Zero(zero::Channel<T>),
    At(flavors::at::Channel<T>),
    Tick(flavors::tick::Channel<T>),
    Never(flavors::never::Channel),
}

/// A channel and the number of handles on each side.
struct Chan<T> {
    senders: AtomicUsize,
    receivers: AtomicUsize,
    flavor: Flavor<T>,
}

impl<T> Chan<T> {
    fn pair(flavor: Flavor<T>) -> (Sender<T>, Receiver<T>) {
        let chan = Arc::new(Chan {
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
            flavor,
        });
        (
            Sender {
                chan: Arc::clone(&chan),
            },
            Receiver { chan },
        )
    }

    /// A channel without senders (a timer): its one receiver.
    fn receiver(flavor: Flavor<T>) -> Receiver<T> {
        Receiver {
            chan: Arc::new(Chan {
                senders: AtomicUsize::new(0),
                receivers: AtomicUsize::new(1),
                flavor,
            }),
        }
    }
}

/// A sender's operation found a timer flavor, which has no senders.
#[cold]
#[inline(never)]
fn no_sender() -> ! {
    unreachable!("a timer channel (after, at, tick, never) has no sender")
}

/// Guards a handle count against overflow (as `Arc` does): abort rather than wrap.
#[inline]
fn acquire_handle(count: &AtomicUsize) {
    // Relaxed: a new handle is made from an existing one, which keeps the channel alive.
    if count.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
        std::process::abort();
    }
}

/// `now + timeout`, or `None` (wait forever) if that overflows `Instant`.
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

// ===== Sender =====

/// The sending side of a channel. `Clone` to get more senders.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Sender<T> {
    /// Sends without waiting: fails with `Full` if there is no room (for `bounded(0)`: no
    /// receiver waiting), `Disconnected` if every receiver is gone.
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        match &self.chan.flavor {
            Flavor::Array(c) => c.try_send(msg),
            Flavor::One(c) => c.try_send(msg),
            Flavor::List(c) => c.try_send(msg),
            Flavor::Zero(c) => c.try_send(msg),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    /// Sends, waiting for room if the channel is full. Fails only if every receiver is gone.
    #[inline]
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_impl(msg, None).map_err(|e| match e {
            SendTimeoutError::Disconnected(m) => SendError(m),
            SendTimeoutError::Timeout(_) => unreachable!("no deadline, no timeout"),
        })
    }

    /// Sends, waiting at most `timeout` for room.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send_impl(msg, deadline_after(timeout))
    }

    /// Sends, waiting until `deadline` at the latest for room.
    pub fn send_deadline(&self, msg: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        self.send_impl(msg, Some(deadline))
    }

    #[inline]
    fn send_impl(&self, msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        match &self.chan.flavor {
            Flavor::Array(c) => c.send(msg, deadline),
            Flavor::One(c) => c.send(msg, deadline),
            Flavor::List(c) => c.send(msg, deadline),
            Flavor::Zero(c) => c.send(msg, deadline),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    /// Completes a send that `start_send` (or a select) reserved.
    #[allow(unsafe_code)]
    ///
    /// # Safety
    /// The caller must ensure `token` holds a reservation of this channel's send side.
    unsafe fn write(&self, token: &mut Token, msg: T) -> Result<(), T> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match &self.chan.flavor {
                Flavor::Array(c) => c.write(token, msg),
                Flavor::One(c) => c.write(token, msg),
                Flavor::List(c) => c.write(token, msg),
                Flavor::Zero(c) => c.write(token, msg),
                Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
            }
        }
    }

    /// The number of messages in the channel.
    pub fn len(&self) -> usize {
        self.chan.flavor.len()
    }

    /// `true` if the channel holds no message.
    pub fn is_empty(&self) -> bool {
        self.chan.flavor.is_empty()
    }

    /// `true` if a send would have to wait (always for `bounded(0)`, never for `unbounded`).
    pub fn is_full(&self) -> bool {
        self.chan.flavor.is_full()
    }

    /// The capacity: `Some(n)` for `bounded(n)`, `None` for `unbounded`.
    pub fn capacity(&self) -> Option<usize> {
        self.chan.flavor.capacity()
    }

    /// `true` if every receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        self.chan.flavor.is_disconnected()
    }

    /// `true` if both handles belong to the same channel.
    pub fn same_channel(&self, other: &Sender<T>) -> bool {
        Arc::ptr_eq(&self.chan, &other.chan)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        acquire_handle(&self.chan.senders);
        if let Flavor::List(c) = &self.chan.flavor {
            c.senders_now(self.chan.senders.load(Ordering::Relaxed));
        }
        Sender {
            chan: Arc::clone(&self.chan),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // SYNC POINT: AcqRel so the last sender's disconnect follows every other sender's
        // sends; partner: the other senders' decrements.
        let senders = self.chan.senders.fetch_sub(1, Ordering::AcqRel) - 1;
        if senders == 0 {
            match &self.chan.flavor {
                Flavor::Array(c) => c.disconnect(),
                Flavor::One(c) => c.disconnect(),
                Flavor::List(c) => c.disconnect_senders(),
                Flavor::Zero(c) => c.disconnect(),
                Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
            };
        } else if let Flavor::List(c) = &self.chan.flavor {
            c.senders_now(senders);
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Sender { .. }")
    }
}

// ===== Receiver =====

/// The receiving side of a channel. `Clone` to get more receivers (each message goes to one).
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Receiver<T> {
    /// Receives without waiting: `Empty` if there is nothing, `Disconnected` if there is
    /// nothing and every sender is gone.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        match &self.chan.flavor {
            Flavor::Array(c) => c.try_recv(),
            Flavor::One(c) => c.try_recv(),
            Flavor::List(c) => c.try_recv(),
            Flavor::Zero(c) => c.try_recv(),
            Flavor::At(c) => c.try_recv(),
            Flavor::Tick(c) => c.try_recv(),
            Flavor::Never(c) => c.try_recv(),
        }
    }

    /// Receives, waiting for a message. Fails once the channel is empty and every sender gone.
    #[inline]
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_impl(None).map_err(|_| RecvError)
    }

    /// Receives, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_impl(deadline_after(timeout))
    }

    /// Receives, waiting until `deadline` at the latest.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.recv_impl(Some(deadline))
    }

    #[inline]
    fn recv_impl(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        match &self.chan.flavor {
            Flavor::Array(c) => c.recv(deadline),
            Flavor::One(c) => c.recv(deadline),
            Flavor::List(c) => c.recv(deadline),
            Flavor::Zero(c) => c.recv(deadline),
            Flavor::At(c) => c.recv(deadline),
            Flavor::Tick(c) => c.recv(deadline),
            Flavor::Never(c) => c.recv(deadline),
        }
    }

    /// Completes a receive that `start_recv` (or a select) reserved.
    #[allow(unsafe_code)]
    ///
    /// # Safety
    /// The caller must ensure `token` holds a reservation of this channel's receive side.
    unsafe fn read(&self, token: &mut Token) -> Result<T, ()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match &self.chan.flavor {
                Flavor::Array(c) => c.read(token),
                Flavor::One(c) => c.read(token),
                Flavor::List(c) => c.read(token),
                Flavor::Zero(c) => c.read(token),
                Flavor::At(c) => c.read(token),
                Flavor::Tick(c) => c.read(token),
                Flavor::Never(_) => Err(()),
            }
        }
    }

    /// A blocking iterator: yields messages until the channel is empty and disconnected.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// A non-blocking iterator: yields the messages available now.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }

    /// The number of messages in the channel.
    pub fn len(&self) -> usize {
        self.chan.flavor.len()
    }

    /// `true` if the channel holds no message.
    pub fn is_empty(&self) -> bool {
        self.chan.flavor.is_empty()
    }

    /// `true` if a send would have to wait.
    pub fn is_full(&self) -> bool {
        self.chan.flavor.is_full()
    }

    /// The capacity: `Some(n)` for `bounded(n)`, `None` for `unbounded`.
    pub fn capacity(&self) -> Option<usize> {
        self.chan.flavor.capacity()
    }

    /// `true` if every sender is gone (messages may still be queued).
    pub fn is_disconnected(&self) -> bool {
        self.chan.flavor.is_disconnected()
    }

    /// `true` if both handles belong to the same channel.
    ///
    /// Every [`never()`] receiver counts as the same channel, as crossbeam-channel's do.
    pub fn same_channel(&self, other: &Receiver<T>) -> bool {
        Arc::ptr_eq(&self.chan, &other.chan)
            || matches!(
                (&self.chan.flavor, &other.chan.flavor),
                (Flavor::Never(_), Flavor::Never(_))
            )
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        acquire_handle(&self.chan.receivers);
        Receiver {
            chan: Arc::clone(&self.chan),
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // SYNC POINT: as for `Sender::drop`.
        if self.chan.receivers.fetch_sub(1, Ordering::AcqRel) == 1 {
            match &self.chan.flavor {
                Flavor::Array(c) => c.disconnect(),
                Flavor::One(c) => c.disconnect(),
                Flavor::List(c) => c.disconnect_receivers(),
                Flavor::Zero(c) => c.disconnect(),
                // Nothing waits on a timer but its receivers, and they are all gone.
                Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => false,
            };
        }
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Receiver { .. }")
    }
}

receiver_iterators!(Receiver);

// ===== impl Flavor: state queries =====

impl<T> Flavor<T> {
    fn len(&self) -> usize {
        match self {
            Flavor::Array(c) => c.len(),
            Flavor::One(c) => c.len(),
            Flavor::List(c) => c.len(),
            Flavor::Zero(_) | Flavor::Never(_) => 0,
            Flavor::At(c) => c.len(),
            Flavor::Tick(c) => c.len(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Flavor::Array(c) => c.is_empty(),
            Flavor::One(c) => c.is_empty(),
            Flavor::List(c) => c.is_empty(),
            Flavor::Zero(_) | Flavor::Never(_) => true,
            Flavor::At(c) => c.is_empty(),
            Flavor::Tick(c) => c.is_empty(),
        }
    }

    fn is_full(&self) -> bool {
        match self {
            Flavor::Array(c) => c.is_full(),
            Flavor::One(c) => c.is_full(),
            Flavor::List(_) => false,
            Flavor::Zero(_) | Flavor::Never(_) => true,
            // Full while the message is there, as crossbeam-channel's timers are.
            Flavor::At(c) => !c.is_empty(),
            Flavor::Tick(c) => !c.is_empty(),
        }
    }

    fn capacity(&self) -> Option<usize> {
        match self {
            Flavor::Array(c) => Some(c.capacity()),
            Flavor::One(_) => Some(1),
            Flavor::List(_) => None,
            Flavor::Zero(_) | Flavor::Never(_) => Some(0),
            Flavor::At(_) | Flavor::Tick(_) => Some(1),
        }
    }

    fn is_disconnected(&self) -> bool {
        match self {
            Flavor::Array(c) => c.is_disconnected(),
            Flavor::One(c) => c.is_disconnected(),
            Flavor::List(c) => c.is_disconnected(),
            Flavor::Zero(c) => c.is_disconnected(),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => false,
        }
    }
}
