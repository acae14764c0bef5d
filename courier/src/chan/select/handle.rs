//! What a select sees of each channel end: [`SelectHandle`], implemented by
//! every flavor's sender and receiver, and the public [`SelectRecv`] and
//! [`SelectSend`] through which `Select` takes `chan`'s, `chan::local`'s and
//! `oneshot`'s ends alike.
#![allow(unsafe_code)]

use std::time::Instant;

use super::{Select, SelectedOperation};
use crate::chan::context::{Context, Operation};
use crate::chan::err::{RecvError, SendError};
use crate::chan::flavors::Token;
use crate::chan::{local, no_sender, oneshot, Flavor, Receiver, Sender};

/// One side of one channel, as a select sees it.
pub(crate) trait SelectHandle {
    /// Tries to reserve the operation now.
    fn try_select(&self, token: &mut Token) -> bool;
    /// Registers the waiting context; returns `true` if the operation is ready already.
    fn register(&self, oper: Operation, cx: &Context) -> bool;
    /// Removes the registration (if no peer took it).
    fn unregister(&self, oper: Operation);
    /// The context was claimed for this operation: reserve it.
    fn accept(&self, token: &mut Token, cx: &Context) -> bool;
    /// Would the operation complete now (with a message, room, a waiting peer, or an error
    /// because the channel is disconnected)? A snapshot, for `Select::ready`.
    fn is_ready(&self) -> bool;
    /// Watches the operation: `cx` is claimed at the next change that may make it ready.
    /// Returns `true` if it is ready already.
    fn watch(&self, oper: Operation, cx: &Context) -> bool;
    /// Stops watching (if no change has woken the watcher yet).
    fn unwatch(&self, oper: Operation);
    /// Does the operation complete only against a peer that waits on it (a rendezvous)?
    fn is_rendezvous(&self) -> bool {
        false
    }
    /// When the operation becomes ready by the clock alone (a timer's receive): a waiting
    /// select wakes then to look again.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// Can only a task of this thread make the operation ready (a `chan::local` end)?
    #[cfg_attr(loom, allow(dead_code))] // read by `check_can_wait`, a no-op under loom
    fn is_local(&self) -> bool {
        false
    }
}

impl<T> SelectHandle for Sender<T> {
    fn try_select(&self, token: &mut Token) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.start_send(token),
            Flavor::One(c) => c.start_send(token),
            Flavor::List(c) => c.start_send(token),
            Flavor::Zero(c) => c.start_send(token),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn register(&self, oper: Operation, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.register_send(oper, cx),
            Flavor::One(c) => c.register_send(oper, cx),
            // An unbounded send is always ready.
            Flavor::List(_) => true,
            Flavor::Zero(c) => c.register_send(oper, cx),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn unregister(&self, oper: Operation) {
        match &self.chan.flavor {
            Flavor::Array(c) => c.unregister_send(oper),
            Flavor::One(c) => c.unregister_send(oper),
            Flavor::List(_) => {}
            Flavor::Zero(c) => c.unregister_send(oper),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn accept(&self, token: &mut Token, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.start_send(token),
            Flavor::One(c) => c.start_send(token),
            Flavor::List(c) => c.start_send(token),
            Flavor::Zero(c) => c.accept(token, cx),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn is_ready(&self) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => !c.is_full() || c.is_disconnected(),
            Flavor::One(c) => !c.is_full() || c.is_disconnected(),
            Flavor::List(_) => true,
            Flavor::Zero(c) => c.is_ready_send(),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn watch(&self, oper: Operation, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.watch_send(oper, cx),
            Flavor::One(c) => c.watch_send(oper, cx),
            Flavor::List(_) => true,
            Flavor::Zero(c) => c.watch_send(oper, cx),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn unwatch(&self, oper: Operation) {
        match &self.chan.flavor {
            Flavor::Array(c) => c.unwatch_send(oper),
            Flavor::One(c) => c.unwatch_send(oper),
            Flavor::List(_) => {}
            Flavor::Zero(c) => c.unwatch_send(oper),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => no_sender(),
        }
    }

    fn is_rendezvous(&self) -> bool {
        matches!(self.chan.flavor, Flavor::Zero(_))
    }
}

impl<T> SelectHandle for Receiver<T> {
    fn try_select(&self, token: &mut Token) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.start_recv(token),
            Flavor::One(c) => c.start_recv(token),
            Flavor::List(c) => c.start_recv(token),
            Flavor::Zero(c) => c.start_recv(token),
            Flavor::At(c) => c.start_recv(token),
            Flavor::Tick(c) => c.start_recv(token),
            Flavor::Never(_) => false,
        }
    }

    fn register(&self, oper: Operation, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.register_recv(oper, cx),
            Flavor::One(c) => c.register_recv(oper, cx),
            Flavor::List(c) => c.register_recv(oper, cx),
            Flavor::Zero(c) => c.register_recv(oper, cx),
            // Nothing but the clock makes a timer ready: nobody to register with.
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => self.is_ready(),
        }
    }

    fn unregister(&self, oper: Operation) {
        match &self.chan.flavor {
            Flavor::Array(c) => c.unregister_recv(oper),
            Flavor::One(c) => c.unregister_recv(oper),
            Flavor::List(c) => c.unregister_recv(oper),
            Flavor::Zero(c) => c.unregister_recv(oper),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => {}
        }
    }

    fn accept(&self, token: &mut Token, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.start_recv(token),
            Flavor::One(c) => c.start_recv(token),
            Flavor::List(c) => c.start_recv(token),
            Flavor::Zero(c) => c.accept(token, cx),
            Flavor::At(c) => c.start_recv(token),
            Flavor::Tick(c) => c.start_recv(token),
            Flavor::Never(_) => false,
        }
    }

    fn is_ready(&self) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => !c.is_empty() || c.is_disconnected(),
            Flavor::One(c) => !c.is_empty() || c.is_disconnected(),
            Flavor::List(c) => !c.is_empty() || c.is_disconnected(),
            Flavor::Zero(c) => c.is_ready_recv(),
            Flavor::At(c) => !c.is_empty(),
            Flavor::Tick(c) => !c.is_empty(),
            Flavor::Never(_) => false,
        }
    }

    fn watch(&self, oper: Operation, cx: &Context) -> bool {
        match &self.chan.flavor {
            Flavor::Array(c) => c.watch_recv(oper, cx),
            Flavor::One(c) => c.watch_recv(oper, cx),
            Flavor::List(c) => c.watch_recv(oper, cx),
            Flavor::Zero(c) => c.watch_recv(oper, cx),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => self.is_ready(),
        }
    }

    fn unwatch(&self, oper: Operation) {
        match &self.chan.flavor {
            Flavor::Array(c) => c.unwatch_recv(oper),
            Flavor::One(c) => c.unwatch_recv(oper),
            Flavor::List(c) => c.unwatch_recv(oper),
            Flavor::Zero(c) => c.unwatch_recv(oper),
            Flavor::At(_) | Flavor::Tick(_) | Flavor::Never(_) => {}
        }
    }

    fn is_rendezvous(&self) -> bool {
        matches!(self.chan.flavor, Flavor::Zero(_))
    }

    fn deadline(&self) -> Option<Instant> {
        match &self.chan.flavor {
            Flavor::At(c) => c.deadline(),
            Flavor::Tick(c) => c.deadline(),
            _ => None,
        }
    }
}

/// A oneshot receiver is ready once its state has left EMPTY, which it never returns to; the
/// receive itself is a `try_recv` (nothing to reserve: the one message stays in its slot).
impl<T> SelectHandle for oneshot::Receiver<T> {
    fn try_select(&self, _: &mut Token) -> bool {
        self.is_settled()
    }

    fn register(&self, oper: Operation, cx: &Context) -> bool {
        self.waiters().register(oper, cx);
        self.is_settled()
    }

    fn unregister(&self, oper: Operation) {
        self.waiters().unregister(oper);
    }

    fn accept(&self, _: &mut Token, _: &Context) -> bool {
        self.is_settled()
    }

    fn is_ready(&self) -> bool {
        self.is_settled()
    }

    fn watch(&self, oper: Operation, cx: &Context) -> bool {
        self.waiters().watch(oper, cx);
        self.is_settled()
    }

    fn unwatch(&self, oper: Operation) {
        self.waiters().unwatch(oper);
    }
}

/// A receiving end that [`Select::recv`] (and [`select!`](crate::select)) can wait on: a
/// channel's [`Receiver`], a [`oneshot::Receiver`], or a [`local::Receiver`] (whose select
/// waits in a task of its thread, like its `recv`). Sealed: implemented in this crate only.
///
/// ```
/// use courier::chan::{self, Select};
///
/// let (_jobs_tx, jobs) = chan::unbounded::<u32>();
/// let (stop_tx, stop) = chan::oneshot::<()>();
/// stop_tx.send(()).unwrap();
///
/// let mut sel = Select::new();
/// let job = sel.recv(&jobs);
/// let halt = sel.recv(&stop);
/// let op = sel.select();
/// assert_eq!(op.index(), halt);
/// assert_eq!(op.recv(&stop), Ok(()));
/// # let _ = job;
/// ```
pub trait SelectRecv: sealed::Sealed {
    /// What a receive on this end yields.
    type Msg;

    /// Adds a receive on this end to `sel`.
    #[doc(hidden)]
    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize;

    /// Completes `op`, which a select chose for this end (consumed: a reservation is used
    /// once).
    #[doc(hidden)]
    fn take_selected(&self, op: SelectedOperation<'_>) -> Result<Self::Msg, RecvError>;
}

/// A reference to an end, so that `select!` and `Select` take `&Receiver` (and `&Sender`)
/// expressions as crossbeam's do: the operation is the referenced end's.
impl<R: SelectRecv + ?Sized> SelectRecv for &R {
    type Msg = R::Msg;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        (**self).add_to(sel)
    }

    fn take_selected(&self, op: SelectedOperation<'_>) -> Result<R::Msg, RecvError> {
        (**self).take_selected(op)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<S: Sealed + ?Sized> Sealed for &S {}
    impl<T> Sealed for super::Receiver<T> {}
    impl<T> Sealed for super::oneshot::Receiver<T> {}
    impl<T> Sealed for super::local::Receiver<T> {}
    impl<T> Sealed for super::Sender<T> {}
    impl<T> Sealed for super::local::Sender<T> {}
}

/// A sending end that [`Select::send`] (and [`select!`](crate::select)) can wait on: a
/// channel's [`Sender`] or a [`local::Sender`] (whose select waits in a task of its thread,
/// like its `send`). Sealed: implemented in this crate only.
///
/// ```
/// use courier::chan::{self, Select};
///
/// let (tx, rx) = chan::local::bounded::<u32>(1);
/// let mut sel = Select::new();
/// let i = sel.send(&tx);
/// let op = sel.select();
/// assert_eq!(op.index(), i);
/// op.send(&tx, 7).unwrap();
/// assert_eq!(rx.try_recv(), Ok(7));
/// ```
pub trait SelectSend: sealed::Sealed {
    /// What a send on this end carries.
    type Msg;

    /// Adds a send on this end to `sel`.
    #[doc(hidden)]
    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize;

    /// Completes `op`, which a select chose for this end, with `msg` (consumed: a
    /// reservation is used once).
    #[doc(hidden)]
    fn put_selected(
        &self,
        op: SelectedOperation<'_>,
        msg: Self::Msg,
    ) -> Result<(), SendError<Self::Msg>>;
}

impl<S: SelectSend + ?Sized> SelectSend for &S {
    type Msg = S::Msg;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        (**self).add_to(sel)
    }

    fn put_selected(
        &self,
        op: SelectedOperation<'_>,
        msg: S::Msg,
    ) -> Result<(), SendError<S::Msg>> {
        (**self).put_selected(op, msg)
    }
}

impl<T> SelectSend for Sender<T> {
    type Msg = T;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.push(self, self as *const Self as *const u8)
    }

    fn put_selected(&self, op: SelectedOperation<'_>, msg: T) -> Result<(), SendError<T>> {
        op.complete_on(self as *const Self as *const u8, "sender", |token| {
            // SAFETY: the token holds the reservation made on this sender's channel
            // (`complete_on` checked the endpoint), and is used this once.
            unsafe { self.write(token, msg) }.map_err(SendError)
        })
    }
}

impl<T> SelectSend for local::Sender<T> {
    type Msg = T;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.push(self, self as *const Self as *const u8)
    }

    fn put_selected(&self, op: SelectedOperation<'_>, msg: T) -> Result<(), SendError<T>> {
        op.complete_on(self as *const Self as *const u8, "sender", |_| ());
        self.send(msg)
    }
}

impl<T> SelectRecv for Receiver<T> {
    type Msg = T;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.push(self, self as *const Self as *const u8)
    }

    fn take_selected(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        op.complete_on(self as *const Self as *const u8, "receiver", |token| {
            // SAFETY: the token holds the reservation made on this receiver's channel
            // (`complete_on` checked the endpoint), and is used this once.
            unsafe { self.read(token) }.map_err(|()| RecvError)
        })
    }
}

impl<T> SelectRecv for oneshot::Receiver<T> {
    type Msg = T;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.push(self, self as *const Self as *const u8)
    }

    fn take_selected(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        op.complete_on(self as *const Self as *const u8, "receiver", |_| ());
        self.try_recv().map_err(|_| RecvError)
    }
}

/// A `chan::local` end: nothing is reserved (its peers are tasks of the same thread), so a
/// selected operation takes the message (the room) when it is completed. Should another task
/// of the thread take it in between (the selecting task blocked elsewhere first), the
/// completion waits for the next one, as the end's blocking `recv` (`send`) does.
macro_rules! local_select_handle {
    ($end:ident) => {
        impl<T> SelectHandle for local::$end<T> {
            fn try_select(&self, _: &mut Token) -> bool {
                self.is_ready()
            }

            fn register(&self, oper: Operation, cx: &Context) -> bool {
                self.with_selecting(|selecting| selecting.register(oper, cx));
                self.is_ready()
            }

            fn unregister(&self, oper: Operation) {
                self.with_selecting(|selecting| selecting.unregister(oper));
            }

            fn accept(&self, _: &mut Token, _: &Context) -> bool {
                self.is_ready()
            }

            fn is_ready(&self) -> bool {
                self.is_ready()
            }

            fn watch(&self, oper: Operation, cx: &Context) -> bool {
                self.with_selecting(|selecting| selecting.watch(oper, cx));
                self.is_ready()
            }

            fn unwatch(&self, oper: Operation) {
                self.with_selecting(|selecting| selecting.unwatch(oper));
            }

            fn is_local(&self) -> bool {
                true
            }
        }
    };
}

local_select_handle!(Receiver);
local_select_handle!(Sender);

impl<T> SelectRecv for local::Receiver<T> {
    type Msg = T;

    fn add_to<'a>(&'a self, sel: &mut Select<'a>) -> usize {
        sel.push(self, self as *const Self as *const u8)
    }

    fn take_selected(&self, op: SelectedOperation<'_>) -> Result<T, RecvError> {
        op.complete_on(self as *const Self as *const u8, "receiver", |_| ());
        self.recv()
    }
}
