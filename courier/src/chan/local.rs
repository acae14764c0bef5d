//! Single-thread channels: for fibers that share one scheduler thread. No atomics, no locks.
//!
//! The NetBSD rump kernel's `locks_up`: when only one CPU runs inside a component, the atomic
//! instructions and barriers of its lock fast paths are pure cost. A `local` channel lives on
//! one thread (its handles are `!Send`), so its queue is a plain `VecDeque` behind `RefCell`s and
//! its counters are `Cell`s.
//!
//! ```
//! let (tx, rx) = courier::chan::local::channel();
//! tx.send(1).unwrap();
//! tx.send(2).unwrap();
//! assert_eq!(rx.try_recv(), Ok(1));
//! assert_eq!(rx.recv(), Ok(2));
//! ```
//!
//! The handles cannot leave their thread:
//!
//! ```compile_fail
//! let (tx, _rx) = courier::chan::local::channel::<u32>();
//! std::thread::spawn(move || tx.send(1)); // error: `Rc<..>` cannot be sent between threads
//! ```
//!
//! # Blocking
//!
//! A blocking operation that cannot complete parks the **current scheduler task** (a courier
//! fiber, or a task another scheduler installs with
//! [`TaskContext::run`](super::TaskContext::run)); the peer that makes
//! it ready wakes it with [`Park::unpark`](super::Park::unpark). Outside a task nothing else on
//! the thread could ever make it ready, so instead of deadlocking it panics (use the `try_`
//! operations there). A timed operation outside a task sleeps the thread until its deadline
//! and times out, since nothing could have made it ready meanwhile either; one whose timeout
//! overflows `Instant` has no deadline, and panics there as an untimed one does. `iter` ends
//! only when every sender is gone, so outside a task it panics at the first empty queue while
//! a sender lives.
//!
//! Both ends can take part in a [`Select`](super::Select) (beside any other channel's). A
//! select over local ends only, without a deadline, panics outside a task where it would wait,
//! as a blocking `recv` or `send` does. Nothing is reserved for a select: a message arriving
//! (room made) goes to a parked `recv` (`send`) first, else to a waiting select (room made
//! takes the oldest parked `send`'s message into the channel at once, unless a select waits on
//! that side); and should another task take the selected message (room) before the selecting
//! one completes the operation, the completion waits for the next, as `recv` (`send`) would
//! (without the select's deadline).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::context::Context;
use super::err::{
    RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};
use super::wait_list::WaitList;

/// An unbounded local channel.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    pair(usize::MAX)
}

/// A local channel holding at most `cap ≥ 1` messages.
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    assert!(cap > 0, "a local channel needs room for one message");
    pair(cap)
}

fn pair<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Rc::new(Shared {
        queue: RefCell::new(VecDeque::with_capacity(cap.min(32))),
        cap,
        senders: Cell::new(1),
        receivers: Cell::new(1),
        sending: Side::new(),
        receiving: Side::new(),
    });
    (
        Sender {
            shared: Rc::clone(&shared),
        },
        Receiver { shared },
    )
}

/// A parked task: lives on the blocked operation's stack while it is queued.
struct Waiter {
    woken: Cell<bool>,
    /// A parked send's message, a `Cell<Option<T>>` on its stack (null for a receive): a
    /// receive that makes room moves it into the channel before waking the send (see
    /// [`Shared::room_made`]).
    slot: *const (),
    #[cfg(not(loom))]
    task: TaskRef,
}

/// How a waker reaches a parked task.
#[cfg(not(loom))]
enum TaskRef {
    /// One of the crate's fibers: its context stays in place until the fiber finishes, which
    /// it cannot do while it waits here, so a waiter borrows it (no reference count).
    InPlace(*const Context),
    /// Any other task: its own handle, not a pointer into its `TaskContext`, which its
    /// scheduler may move or drop while the task is suspended.
    Counted(Context),
}

#[cfg(not(loom))]
impl TaskRef {
    #[allow(unsafe_code)]
    #[inline]
    fn get(&self) -> &Context {
        match self {
            // SAFETY: an `InPlace` context outlives the wait (see the variant), and the
            // waiter is read only while the wait lasts: by its owner, or by a waker before
            // it sets `woken`.
            TaskRef::InPlace(cx) => unsafe { &**cx },
            TaskRef::Counted(cx) => cx,
        }
    }
}

struct Shared<T> {
    queue: RefCell<VecDeque<T>>,
    cap: usize,
    senders: Cell<usize>,
    receivers: Cell<usize>,
    /// Who waits for room, and who waits for a message.
    sending: Side,
    receiving: Side,
}

/// Who waits on one side of a channel.
struct Side {
    /// Tasks parked in a blocking operation, oldest first (pointers to their on-stack
    /// `Waiter`s).
    parked: RefCell<VecDeque<*const Waiter>>,
    /// `Select`s waiting for this side to become ready (a `Select::send` or `Select::recv` on
    /// one of its ends), and `Select::ready` callers watching for it.
    selecting: RefCell<WaitList>,
    /// A task or a select may be waiting: set before one queues, recomputed from the lists by
    /// a wake-up that finds it set. The one read a send (a receive) makes when nobody waits
    /// for a message (for room).
    waiting: Cell<bool>,
}

impl Side {
    fn new() -> Side {
        Side {
            parked: RefCell::new(VecDeque::new()),
            selecting: RefCell::new(WaitList::new()),
            waiting: Cell::new(false),
        }
    }

    /// The side became ready (a message arrived, or room was made): wake whoever waits.
    #[inline]
    fn became_ready(&self) {
        if self.waiting.get() {
            self.wake_one();
        }
    }

    /// Wakes the oldest parked task if there is one, else claims a waiting select; and wakes
    /// every watcher.
    #[cold]
    fn wake_one(&self) {
        let first = self.parked.borrow_mut().pop_front();
        let woke = first.is_some();
        if let Some(w) = first {
            wake(w);
        }
        if self.selecting.borrow().is_empty() {
            // The common case, a task parked in `send` or `recv`: no select to look at.
            self.waiting.set(!self.parked.borrow().is_empty());
            return;
        }
        let (chosen, observers) = {
            let mut selecting = self.selecting.borrow_mut();
            let chosen = if woke { None } else { selecting.try_select() };
            (chosen, selecting.take_observers())
        };
        self.waiting
            .set(!self.parked.borrow().is_empty() || !self.selecting.borrow().is_empty());
        if let Some(entry) = chosen {
            entry.cx.unpark();
        }
        observers.iter().for_each(Context::unpark);
    }

    /// The other side is gone: wake every parked task, select and watcher, for good.
    ///
    /// Parked tasks are woken one at a time: a waiter stays queued until it is woken, so that
    /// one whose deadline passes meanwhile (should an `unpark` run other tasks) takes itself
    /// off the list before its frame goes.
    fn disconnect(&self) {
        loop {
            let first = self.parked.borrow_mut().pop_front();
            let Some(w) = first else { break };
            wake(w);
        }
        let woken = self.with_selecting(WaitList::disconnect);
        woken.iter().for_each(Context::unpark);
    }

    /// Runs `f` on the selects waiting on this side (`waiting` set if any is left).
    fn with_selecting<R>(&self, f: impl FnOnce(&mut WaitList) -> R) -> R {
        let mut selecting = self.selecting.borrow_mut();
        let r = f(&mut selecting);
        if !selecting.is_empty() {
            self.waiting.set(true);
        }
        r
    }

    /// Parks the current task on this side until woken (`true`) or until `deadline` passes
    /// (`false`, and the task is no longer queued). Outside a task: panics without a deadline,
    /// sleeps until it with one.
    #[cfg(not(loom))]
    #[allow(unsafe_code)]
    fn park(&self, what: &str, deadline: Option<Instant>, slot: *const ()) -> bool {
        let Some(task) = Context::current_task() else {
            let Some(deadline) = deadline else {
                panic!("chan::local: {what} would block the thread forever (no scheduler task)");
            };
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return false;
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        // SAFETY: `current_task` returns only installed pointers, which are live now.
        let cx = unsafe { &*task };
        let waiter = Waiter {
            woken: Cell::new(false),
            slot,
            task: match cx.stays_in_place() {
                true => TaskRef::InPlace(task),
                false => TaskRef::Counted(cx.clone()),
            },
        };
        self.waiting.set(true);
        self.parked.borrow_mut().push_back(&waiter);
        // Takes the waiter off the list if it returns unwoken (its deadline passed). No unwind
        // leaves it queued either: a `Park` method that panics aborts the process.
        struct Unqueue<'a>(&'a RefCell<VecDeque<*const Waiter>>, &'a Waiter);
        impl Drop for Unqueue<'_> {
            fn drop(&mut self) {
                if !self.1.woken.get() {
                    self.0.borrow_mut().retain(|&w| !std::ptr::eq(w, self.1));
                }
            }
        }
        let _unqueue = Unqueue(&self.parked, &waiter);
        while !waiter.woken.get() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Unwoken, so no wake-up meant for another waiter is lost: `_unqueue` takes
                // this one off the list.
                return false;
            }
            waiter.task.get().park(deadline);
        }
        true
    }

    #[cfg(loom)]
    fn park(&self, what: &str, _: Option<Instant>, _: *const ()) -> bool {
        panic!("chan::local: {what} would block the thread forever (no scheduler task)");
    }
}

impl<T> Shared<T> {
    /// A receive made room, and a task or a select may wait for it. Without a select on this
    /// side, the oldest parked send's message takes the room at once, and the send is woken
    /// done: the next receive finds that message without waiting for the sender to run again
    /// (on a `bounded(1)` ring of fibers, a park every two messages instead of every one).
    /// Else whoever waits for room is woken, as on any side.
    #[cold]
    #[allow(unsafe_code)]
    fn room_made(&self) {
        // (With a select waiting for room, or watching for it, the general path: selects
        // and watchers are woken as they always are.)
        let first = match self.sending.selecting.borrow().is_empty() {
            true => self.sending.parked.borrow().front().copied(),
            false => None,
        };
        if let Some(w) = first {
            // SAFETY: a queued waiter's frame is live (see `wake`); a waiter on the sending
            // side with a slot is a parked `send` of this channel, whose slot is the
            // `Cell<Option<T>>` holding its message, on that frame.
            let slot = unsafe { (*w).slot }.cast::<Cell<Option<T>>>();
            let msg = match slot.is_null() {
                true => None,
                // SAFETY: as above; the sender reads the slot only once it runs again.
                false => unsafe { (*slot).take() },
            };
            if let Some(msg) = msg {
                self.sending.parked.borrow_mut().pop_front();
                self.sending
                    .waiting
                    .set(!self.sending.parked.borrow().is_empty());
                self.queue.borrow_mut().push_back(msg);
                wake(w);
                self.receiving.became_ready();
                return;
            }
        }
        self.sending.wake_one();
    }
}

/// Wakes a waiter just taken off its list.
#[allow(unsafe_code)]
fn wake(w: *const Waiter) {
    // SAFETY: a waiter popped from its list was queued, and a queued waiter's frame is live:
    // its owner takes it off the list (unless woken, which pops it) before returning. Once
    // `woken` is set its owner may return, but not before it runs again.
    let w = unsafe { &*w };
    #[cfg(not(loom))]
    {
        let task = w.task.get();
        if task.unpark_only_queues() {
            // The owner (a task of this thread: a local channel does not leave it) runs
            // after this returns: its frame, and an in-place context, outlive the call.
            w.woken.set(true);
            task.unpark();
        } else {
            // Through our own handle: should `unpark` run the woken task, its frame goes
            // meanwhile. (A task whose unpark may run it keeps a counted handle.)
            let task = task.clone();
            w.woken.set(true);
            task.unpark();
        }
    }
    #[cfg(loom)]
    w.woken.set(true);
}

/// The sending side of a local channel (`!Send`).
pub struct Sender<T> {
    shared: Rc<Shared<T>>,
}

/// The receiving side of a local channel (`!Send`).
pub struct Receiver<T> {
    shared: Rc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Sends without waiting.
    #[inline]
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let s = &*self.shared;
        if s.receivers.get() == 0 {
            return Err(TrySendError::Disconnected(msg));
        }
        {
            let mut q = s.queue.borrow_mut();
            if q.len() >= s.cap {
                return Err(TrySendError::Full(msg));
            }
            q.push_back(msg);
        }
        s.receiving.became_ready();
        Ok(())
    }

    /// Sends, parking the current task while the channel is full.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.send_until(msg, None).map_err(|e| match e {
            SendTimeoutError::Disconnected(m) => SendError(m),
            SendTimeoutError::Timeout(_) => unreachable!("an untimed send timed out"),
        })
    }

    /// Sends, parking the current task while the channel is full, for at most `timeout`.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send_until(msg, Instant::now().checked_add(timeout))
    }

    /// Sends, parking the current task while the channel is full, until `deadline` at the
    /// latest.
    pub fn send_deadline(&self, msg: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        self.send_until(msg, Some(deadline))
    }

    fn send_until(&self, mut msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        loop {
            match self.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(m)) => {
                    return Err(SendTimeoutError::Disconnected(m))
                }
                Err(TrySendError::Full(m)) => {
                    // The message waits beside the parked send: a receive that makes room
                    // moves it into the channel, and the send is done when it runs again.
                    let slot = Cell::new(Some(m));
                    let woken = self.shared.sending.park(
                        "send on a full channel",
                        deadline,
                        std::ptr::from_ref(&slot).cast(),
                    );
                    let Some(m) = slot.take() else {
                        return Ok(());
                    };
                    msg = m;
                    if !woken {
                        // One last try: room may have been made as the deadline passed.
                        return self.try_send(msg).map_err(|e| match e {
                            TrySendError::Full(m) => SendTimeoutError::Timeout(m),
                            TrySendError::Disconnected(m) => SendTimeoutError::Disconnected(m),
                        });
                    }
                }
            }
        }
    }

    /// The number of queued messages.
    pub fn len(&self) -> usize {
        self.shared.queue.borrow().len()
    }

    /// `true` if no message is queued.
    pub fn is_empty(&self) -> bool {
        self.shared.queue.borrow().is_empty()
    }

    /// `true` if the channel is full.
    pub fn is_full(&self) -> bool {
        self.shared.queue.borrow().len() >= self.shared.cap
    }

    /// `Some(cap)` for `bounded(cap)`, `None` for `channel()`.
    pub fn capacity(&self) -> Option<usize> {
        (self.shared.cap != usize::MAX).then_some(self.shared.cap)
    }

    /// `true` if every receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        self.shared.receivers.get() == 0
    }

    /// Would a send complete now (room, or every receiver gone)?
    pub(crate) fn is_ready(&self) -> bool {
        !self.is_full() || self.is_disconnected()
    }

    /// Runs `f` on the selects and watchers waiting for room (see
    /// [`Select`](super::Select)).
    pub(crate) fn with_selecting<R>(&self, f: impl FnOnce(&mut WaitList) -> R) -> R {
        self.shared.sending.with_selecting(f)
    }

    /// `true` if both senders send into the same channel.
    pub fn same_channel(&self, other: &Sender<T>) -> bool {
        Rc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<T> Receiver<T> {
    /// Receives without waiting.
    #[inline]
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let s = &*self.shared;
        let msg = s.queue.borrow_mut().pop_front();
        match msg {
            Some(msg) => {
                if s.sending.waiting.get() {
                    s.room_made();
                }
                Ok(msg)
            }
            None if s.senders.get() == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives, parking the current task while the channel is empty.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.recv_until(None).map_err(|e| match e {
            RecvTimeoutError::Disconnected => RecvError,
            RecvTimeoutError::Timeout => unreachable!("an untimed receive timed out"),
        })
    }

    /// Receives, parking the current task while the channel is empty, for at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_until(Instant::now().checked_add(timeout))
    }

    /// Receives, parking the current task while the channel is empty, until `deadline` at
    /// the latest.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.recv_until(Some(deadline))
    }

    fn recv_until(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            match self.try_recv() {
                Ok(msg) => return Ok(msg),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {
                    if !self.shared.receiving.park(
                        "recv on an empty channel",
                        deadline,
                        std::ptr::null(),
                    ) {
                        // One last try: a message may have come as the deadline passed.
                        return self.try_recv().map_err(|e| match e {
                            TryRecvError::Empty => RecvTimeoutError::Timeout,
                            TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                        });
                    }
                }
            }
        }
    }

    /// The messages as they come, parking the current task while the channel is empty, until
    /// every sender is gone.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// The messages available now.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }

    /// The number of queued messages.
    pub fn len(&self) -> usize {
        self.shared.queue.borrow().len()
    }

    /// `true` if no message is queued.
    pub fn is_empty(&self) -> bool {
        self.shared.queue.borrow().is_empty()
    }

    /// `true` if the channel is full.
    pub fn is_full(&self) -> bool {
        self.shared.queue.borrow().len() >= self.shared.cap
    }

    /// `Some(cap)` for `bounded(cap)`, `None` for `channel()`.
    pub fn capacity(&self) -> Option<usize> {
        (self.shared.cap != usize::MAX).then_some(self.shared.cap)
    }

    /// `true` if every sender is gone.
    pub fn is_disconnected(&self) -> bool {
        self.shared.senders.get() == 0
    }

    /// Would a receive complete now (a message, or every sender gone)?
    pub(crate) fn is_ready(&self) -> bool {
        !self.is_empty() || self.is_disconnected()
    }

    /// Runs `f` on the selects and watchers waiting for a message (see
    /// [`Select`](super::Select)).
    pub(crate) fn with_selecting<R>(&self, f: impl FnOnce(&mut WaitList) -> R) -> R {
        self.shared.receiving.with_selecting(f)
    }

    /// `true` if both receivers receive from the same channel.
    pub fn same_channel(&self, other: &Receiver<T>) -> bool {
        Rc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.set(self.shared.senders.get() + 1);
        Sender {
            shared: Rc::clone(&self.shared),
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.set(self.shared.receivers.get() + 1);
        Receiver {
            shared: Rc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let n = self.shared.senders.get() - 1;
        self.shared.senders.set(n);
        if n == 0 {
            self.shared.receiving.disconnect();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let n = self.shared.receivers.get() - 1;
        self.shared.receivers.set(n);
        if n == 0 {
            // No one will read them: drop the messages now, and release blocked senders.
            let dropped = std::mem::take(&mut *self.shared.queue.borrow_mut());
            drop(dropped);
            self.shared.sending.disconnect();
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("local::Sender { .. }")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("local::Receiver { .. }")
    }
}

receiver_iterators!(Receiver);
