//! Single-thread channels: for fibers that share one scheduler thread. No atomics, no locks.
//!
//! The rump kernel's `locks_up` (seed 001): when only one CPU runs inside a component, the atomic
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
//! A blocking operation that cannot complete parks the **current scheduler task** (installed by
//! a fiber scheduler with [`TaskContext::run`](super::TaskContext::run)); the peer that makes
//! it ready wakes it with [`Park::unpark`](super::Park::unpark). Outside a task nothing else on
//! the thread could ever make it ready, so instead of deadlocking it panics (use the `try_`
//! operations there).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;

use super::err::{RecvError, SendError, TryRecvError, TrySendError};
#[cfg(not(loom))]
use super::waiter::Context;

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
        waiting_senders: RefCell::new(VecDeque::new()),
        waiting_receivers: RefCell::new(VecDeque::new()),
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
    #[cfg(not(loom))]
    task: *const Context,
}

struct Shared<T> {
    queue: RefCell<VecDeque<T>>,
    cap: usize,
    senders: Cell<usize>,
    receivers: Cell<usize>,
    /// Tasks waiting for room / for a message (pointers to their on-stack `Waiter`s).
    waiting_senders: RefCell<VecDeque<*const Waiter>>,
    waiting_receivers: RefCell<VecDeque<*const Waiter>>,
}

impl<T> Shared<T> {
    /// Wakes the first task of `list`.
    fn wake_one(list: &RefCell<VecDeque<*const Waiter>>) {
        let first = list.borrow_mut().pop_front();
        if let Some(w) = first {
            Self::wake(w);
        }
    }

    fn wake_all(list: &RefCell<VecDeque<*const Waiter>>) {
        let all = std::mem::take(&mut *list.borrow_mut());
        all.into_iter().for_each(Self::wake);
    }

    #[allow(unsafe_code)]
    fn wake(w: *const Waiter) {
        // SAFETY: a queued waiter's frame is live: its owner removes it before returning.
        let w = unsafe { &*w };
        w.woken.set(true);
        #[cfg(not(loom))]
        // SAFETY: the task's context outlives its blocked operation (it runs inside
        // `TaskContext::run`, which borrows the context).
        unsafe { &*w.task }.unpark();
    }

    /// Parks the current task on `list` until woken. Panics outside a task.
    #[cfg(not(loom))]
    #[allow(unsafe_code)]
    fn park_on(list: &RefCell<VecDeque<*const Waiter>>, what: &str) {
        let Some(task) = Context::current_task() else {
            panic!("chan::local: {what} would block the thread forever (no scheduler task)");
        };
        let waiter = Waiter {
            woken: Cell::new(false),
            task,
        };
        list.borrow_mut().push_back(&waiter);
        // Unqueues the waiter if its frame unwinds (a fiber dropped while parked) unwoken.
        struct Unqueue<'a>(&'a RefCell<VecDeque<*const Waiter>>, &'a Waiter);
        impl Drop for Unqueue<'_> {
            fn drop(&mut self) {
                if !self.1.woken.get() {
                    self.0.borrow_mut().retain(|&w| !std::ptr::eq(w, self.1));
                }
            }
        }
        let _unqueue = Unqueue(list, &waiter);
        while !waiter.woken.get() {
            // SAFETY: `current_task` returned an installed, live context.
            unsafe { &*task }.park(None);
        }
    }

    #[cfg(loom)]
    fn park_on(_: &RefCell<VecDeque<*const Waiter>>, what: &str) {
        panic!("chan::local: {what} would block the thread forever (no scheduler task)");
    }
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
        if !s.waiting_receivers.borrow().is_empty() {
            Shared::<T>::wake_one(&s.waiting_receivers);
        }
        Ok(())
    }

    /// Sends, parking the current task while the channel is full.
    pub fn send(&self, mut msg: T) -> Result<(), SendError<T>> {
        loop {
            match self.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(m)) => return Err(SendError(m)),
                Err(TrySendError::Full(m)) => {
                    msg = m;
                    Shared::<T>::park_on(&self.shared.waiting_senders, "send on a full channel");
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

    /// `Some(cap)` for `bounded(cap)`, `None` for `channel()`.
    pub fn capacity(&self) -> Option<usize> {
        (self.shared.cap != usize::MAX).then_some(self.shared.cap)
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
                if !s.waiting_senders.borrow().is_empty() {
                    Shared::<T>::wake_one(&s.waiting_senders);
                }
                Ok(msg)
            }
            None if s.senders.get() == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Receives, parking the current task while the channel is empty.
    pub fn recv(&self) -> Result<T, RecvError> {
        loop {
            match self.try_recv() {
                Ok(msg) => return Ok(msg),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => {
                    Shared::<T>::park_on(&self.shared.waiting_receivers, "recv on an empty channel")
                }
            }
        }
    }

    /// The messages available now.
    pub fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    /// The number of queued messages.
    pub fn len(&self) -> usize {
        self.shared.queue.borrow().len()
    }

    /// `true` if no message is queued.
    pub fn is_empty(&self) -> bool {
        self.shared.queue.borrow().is_empty()
    }

    /// `Some(cap)` for `bounded(cap)`, `None` for `channel()`.
    pub fn capacity(&self) -> Option<usize> {
        (self.shared.cap != usize::MAX).then_some(self.shared.cap)
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
            Shared::<T>::wake_all(&self.shared.waiting_receivers);
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
            Shared::<T>::wake_all(&self.shared.waiting_senders);
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
