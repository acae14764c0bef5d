//! Routes from IPC receivers to callbacks and channels, with the names and
//! signatures of ipc-channel 0.23's `router` module.
//!
//! A router is one thread that waits on every routed receiver at once (an
//! [`IpcReceiverSet`]) and hands each message to the route's callback, or
//! forwards it into an in-process channel. Most programs use the global
//! [`ROUTER`], started on first use:
//!
//! ```
//! use courier::{ipc, router::ROUTER};
//!
//! let (tx, rx) = ipc::channel::<String>().unwrap();
//! // Messages now arrive on an in-process channel, readable from any thread
//! // or fiber, and usable in `courier::select!`.
//! let messages = ROUTER.route_ipc_receiver_to_new_chan_receiver(rx);
//! tx.send("hello".to_owned()).unwrap();
//! assert_eq!(messages.recv().unwrap(), "hello");
//!
//! // Or a callback, run on the router's thread.
//! let (tx, rx) = ipc::channel::<u32>().unwrap();
//! let (done_tx, done_rx) = courier::chan::bounded(1);
//! ROUTER.add_typed_route(rx, Box::new(move |n| done_tx.send(n.unwrap() * 2).unwrap()));
//! tx.send(21).unwrap();
//! assert_eq!(done_rx.recv().unwrap(), 42);
//! ```
//!
//! # Routes
//!
//! - [`add_typed_route`](RouterProxy::add_typed_route): the callback is
//!   called with every message of the receiver, in order, on the router's
//!   thread, and dropped once every sender of the receiver is gone (in every
//!   process) and its messages were all handed out.
//! - [`add_typed_one_shot_route`](RouterProxy::add_typed_one_shot_route):
//!   the callback is called with the first message; later messages are
//!   dropped until the senders are gone, as ipc-channel does.
//! - [`route_ipc_receiver_to_chan_sender`](RouterProxy::route_ipc_receiver_to_chan_sender)
//!   and [`route_ipc_receiver_to_new_chan_receiver`](RouterProxy::route_ipc_receiver_to_new_chan_receiver)
//!   forward into a [`chan`] channel (courier's), and with the default
//!   feature `crossbeam-channel`, `route_ipc_receiver_to_crossbeam_sender`
//!   and `route_ipc_receiver_to_new_crossbeam_receiver` into a
//!   crossbeam-channel one (ipc-channel's). The in-process sender is dropped
//!   when the IPC senders are all gone, so the in-process receiver then sees
//!   its channel disconnected. A message the in-process receiver is no
//!   longer there for is dropped; the route stays (ipc-channel's behaviour:
//!   the IPC senders go on sending without error).
//!
//! A callback runs on the router's thread: while it runs, no route is served,
//! and a forwarding route into a full bounded channel holds every route until
//! the channel has room. A callback may add routes to its own router, and may
//! call [`shutdown`](RouterProxy::shutdown) (the router stops once the
//! callback returns; the call does not wait for that, which would be waiting
//! for itself).
//!
//! # Malformed messages
//!
//! A message that does not decode as the route's type, or that the wire
//! layer refuses (a peer writing garbage into the socket, a size claim past
//! the receiver's limit), reaches a callback as `Err(SerDeError)` (for the
//! wire layer's faults, [`SerDeError::wire_error`] names it); the channel
//! stays usable and the next message is delivered as usual. A forwarding
//! route drops such a message (its channel can only carry a `T`) and goes
//! on. ipc-channel's router thread ends at the first error its receiver
//! set reports, and its forwarding routes panic that thread at a message
//! that does not decode: either silently ends every route.
//!
//! # Panics in callbacks
//!
//! A callback that panics is caught on the router's thread. Its route is
//! removed: the callback is dropped, and the receiver closed, so that the
//! route's senders get [`IpcError::Disconnected`](crate::IpcError) instead
//! of sending into a route nobody serves. Every other route goes on. (The
//! panic is reported by the panic hook, as any panic is.) ipc-channel's
//! router thread dies with the panic, and every route with it.
//!
//! # Shutdown
//!
//! [`shutdown`](RouterProxy::shutdown) stops the router and waits until its
//! thread has stopped, by which time every callback (and every forwarding
//! route's in-process sender) has been dropped and every routed receiver
//! closed. A route added afterwards is dropped at once: its callback is
//! dropped and its receiver closed; nothing waits and nothing panics.
//! Shutting down twice, or from several threads at once, is the same as once
//! (every caller waits). Dropping a [`RouterProxy`] shuts it down; the
//! global [`ROUTER`] runs until shut down.
//!
//! # Cost
//!
//! Adding a route sends a wake-up packet to the router (none if one is
//! already on its way) and moves the receiver into its set. A message costs
//! what a receiver set's does (one `recv` system call, and the set's
//! `epoll_wait`s, shared by every message ready at once: a busy route is
//! drained up to [`DRAIN_LIMIT`](crate::ipc::DRAIN_LIMIT) messages a wait),
//! a decode, and the callback or the in-process send. Nothing is allocated
//! per message but what the decoded value holds: each message is decoded
//! where it was received, and that buffer receives the next one. (The
//! `ipc` suite's `router` case of `courier-bench` measures a route into a
//! channel against ipc-channel's and against a bare socket's floor.)

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::mem;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle, ThreadId};

use serde::{Deserialize, Serialize};

use crate::chan;
use crate::fiber::affinity;
use crate::ipc::{self, IpcMessage, IpcReceiver, IpcReceiverSet, IpcSender, SetEvent};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::IpcError;
use crate::SerDeError;

/// The global router, started on first use. Add routes
/// ([`add_typed_route`](RouterProxy::add_typed_route)), or turn IPC
/// receivers into in-process ones
/// ([`route_ipc_receiver_to_new_chan_receiver`](RouterProxy::route_ipc_receiver_to_new_chan_receiver)).
///
/// # Panics
/// The first use panics if the router cannot be started (see
/// [`RouterProxy::new`]).
pub static ROUTER: LazyLock<RouterProxy> = LazyLock::new(RouterProxy::new);

/// Function to call with every message of a route: ipc-channel's untyped
/// handler type.
pub type RouterMultiHandler = Box<dyn FnMut(IpcMessage) + Send>;

/// Function to call with the first message of a route: ipc-channel's
/// untyped handler type.
pub type RouterOneShotHandler = Box<dyn FnOnce(IpcMessage) + Send>;

/// Like [`RouterMultiHandler`], with the message decoded as `T` (or the
/// reason it could not be).
pub type TypedRouterMultiHandler<T> = Box<dyn FnMut(Result<T, SerDeError>) + Send>;

/// Like [`RouterOneShotHandler`], with the message decoded as `T` (or the
/// reason it could not be).
pub type TypedRouterOneShotHandler<T> = Box<dyn FnOnce(Result<T, SerDeError>) + Send>;

// ===== the proxy =====

/// A handle on a router thread: adds routes to it and shuts it down.
/// [`new`](Self::new) starts the thread. `Send` and `Sync`; routes may be
/// added from any thread, and from the router's own callbacks.
pub struct RouterProxy {
    comm: Mutex<Comm>,
    /// The router's thread, until a [`shutdown`](Self::shutdown) joins it
    /// (held meanwhile, so that a concurrent shutdown waits for the join).
    thread: Mutex<Option<JoinHandle<()>>>,
    /// That thread's id: a shutdown called there must not wait for itself.
    thread_id: ThreadId,
}

/// What adding a route or shutting down takes, under one lock so that the
/// router reads orders in the order they were given.
struct Comm {
    /// Orders for the router: read when a wake-up arrives.
    control: chan::Sender<Control>,
    /// The wake-up: a packet on a channel in the router's receiver set.
    wakeup: IpcSender<()>,
    /// Is a wake-up on its way that the router has not acted on yet? Then
    /// an order needs none of its own. Set here (under the lock), cleared by
    /// the router before it reads the orders.
    woken: Arc<AtomicBool>,
    /// Set by the first [`RouterProxy::shutdown`].
    shutdown: bool,
}

/// An order from a proxy to its router.
enum Control {
    /// Serve a new route: `add` moves its receiver into the router's set.
    Add { add: AddToSet, route: Route },
    /// Stop.
    Shutdown,
}

/// Moves a route's receiver into the router's set (keeping its own size
/// limit, which an untyped receiver would lose); returns its id there.
type AddToSet = Box<dyn FnOnce(&mut IpcReceiverSet) -> io::Result<u64> + Send>;

/// A route's callback, given every message (lent: decoded in place, its
/// buffer receives the next one) or the wire layer's fault.
type Deliver = Box<dyn FnMut(Result<&mut IpcMessage, SerDeError>) + Send>;

/// A route's callback, given the first message.
type DeliverOnce = Box<dyn FnOnce(Result<&mut IpcMessage, SerDeError>) + Send>;

/// What a route does with its messages.
enum Route {
    Multi(Deliver),
    /// `None` once the message was delivered: later ones are dropped.
    Once(Option<DeliverOnce>),
}

#[allow(clippy::new_without_default)] // as ipc-channel's: `new` starts a thread
impl RouterProxy {
    /// Starts a router thread and returns its proxy.
    ///
    /// # Panics
    /// If the thread or its wake-up channel cannot be created (the process
    /// is out of threads or descriptors), as ipc-channel's does;
    /// [`try_new`](Self::try_new) returns the error instead.
    pub fn new() -> RouterProxy {
        RouterProxy::try_new().expect("cannot start the router")
    }

    /// [`new`](Self::new), with an error where it would panic.
    pub fn try_new() -> io::Result<RouterProxy> {
        let (control, orders) = chan::unbounded();
        let (wakeup, wakeup_rx) = ipc::channel()?;
        let wakeup = wakeup.without_ring();
        let mut set = IpcReceiverSet::new()?;
        let wakeup_id = set.add(wakeup_rx)?;
        let woken = Arc::new(AtomicBool::new(false));
        let router = Router {
            set,
            wakeup_id,
            orders,
            woken: Arc::clone(&woken),
            routes: Routes::default(),
        };
        let unbound = affinity::for_new_thread();
        let thread = thread::Builder::new()
            .name("courier-router".to_owned())
            .spawn(move || {
                affinity::restore(unbound);
                router.run()
            })?;
        Ok(RouterProxy {
            thread_id: thread.thread().id(),
            thread: Mutex::new(Some(thread)),
            comm: Mutex::new(Comm {
                control,
                wakeup,
                woken,
                shutdown: false,
            }),
        })
    }

    /// Adds a route: `callback` is called on the router's thread with every
    /// message of `receiver`, decoded (`Err` for a malformed message; the
    /// route goes on), and dropped when every sender of `receiver` is gone.
    /// See the [module docs](self) for panics and shutdown.
    pub fn add_typed_route<T>(
        &self,
        receiver: IpcReceiver<T>,
        mut callback: TypedRouterMultiHandler<T>,
    ) where
        T: Serialize + for<'de> Deserialize<'de> + 'static,
    {
        self.add_route(
            receiver,
            Route::Multi(Box::new(move |message| callback(decode(message)))),
        );
    }

    /// Adds a route whose `callback` is called with the first message of
    /// `receiver` only; later messages are dropped until every sender of
    /// `receiver` is gone.
    pub fn add_typed_one_shot_route<T>(
        &self,
        receiver: IpcReceiver<T>,
        callback: TypedRouterOneShotHandler<T>,
    ) where
        T: Serialize + for<'de> Deserialize<'de> + 'static,
    {
        self.add_route(
            receiver,
            Route::Once(Some(Box::new(move |message| callback(decode(message))))),
        );
    }

    /// Stops the router and waits until its thread has stopped: every route's
    /// callback is then dropped and its receiver closed. Routes added
    /// afterwards are dropped at once. Calling it again (or from several
    /// threads) is the same as once. Called from one of the router's own
    /// callbacks, it returns at once and the router stops when the callback
    /// returns.
    pub fn shutdown(&self) {
        let mut stopping = true;
        {
            let mut comm = lock(&self.comm);
            if !comm.shutdown {
                comm.shutdown = true;
                // A router that has stopped already (its thread's set
                // failed) needs no order: joining it is all that is left.
                if comm.control.send(Control::Shutdown).is_ok() {
                    // A wake-up that could not be sent to a live router (no
                    // memory for the packet) leaves it waiting for one:
                    // joining it could hang, so it is left to stop at its
                    // next wake-up instead.
                    stopping = match comm.wakeup.send(()) {
                        Ok(()) | Err(IpcError::Disconnected) => true,
                        Err(_) => false,
                    };
                }
            }
        }
        if !stopping || thread::current().id() == self.thread_id {
            return;
        }
        // Held while joining: a concurrent shutdown waits here until the
        // thread has stopped, then finds nothing left to join.
        let mut thread = lock(&self.thread);
        if let Some(thread) = thread.take() {
            // The thread catches every callback's panic; the only way for it
            // to panic is a bug in the router, reported by the panic hook.
            let _ = thread.join();
        }
    }

    /// Forwards every message of `ipc_receiver` into `sender`; see the
    /// [module docs](self) for what happens to a malformed message and when
    /// `sender` is dropped. A bounded `sender` that is full holds the router
    /// (every route) until it has room.
    pub fn route_ipc_receiver_to_chan_sender<T>(
        &self,
        ipc_receiver: IpcReceiver<T>,
        sender: chan::Sender<T>,
    ) where
        T: for<'de> Deserialize<'de> + Serialize + Send + 'static,
    {
        self.add_route(
            ipc_receiver,
            Route::Multi(Box::new(move |message| {
                if let Ok(value) = decode(message) {
                    let _ = sender.send(value);
                }
            })),
        );
    }

    /// Forwards every message of `ipc_receiver` into a new unbounded
    /// [`chan`] channel, and returns its receiver: it reports the channel
    /// disconnected once every sender of `ipc_receiver` is gone and every
    /// message was received.
    pub fn route_ipc_receiver_to_new_chan_receiver<T>(
        &self,
        ipc_receiver: IpcReceiver<T>,
    ) -> chan::Receiver<T>
    where
        T: for<'de> Deserialize<'de> + Serialize + Send + 'static,
    {
        let (sender, receiver) = chan::unbounded();
        self.route_ipc_receiver_to_chan_sender(ipc_receiver, sender);
        receiver
    }

    /// Forwards every message of `ipc_receiver` into `crossbeam_sender`, as
    /// [`route_ipc_receiver_to_chan_sender`](Self::route_ipc_receiver_to_chan_sender)
    /// does into a `chan` sender. A malformed message is dropped, where
    /// ipc-channel's router panics.
    #[cfg(feature = "crossbeam-channel")]
    pub fn route_ipc_receiver_to_crossbeam_sender<T>(
        &self,
        ipc_receiver: IpcReceiver<T>,
        crossbeam_sender: crossbeam_channel::Sender<T>,
    ) where
        T: for<'de> Deserialize<'de> + Serialize + Send + 'static,
    {
        self.add_route(
            ipc_receiver,
            Route::Multi(Box::new(move |message| {
                if let Ok(value) = decode(message) {
                    let _ = crossbeam_sender.send(value);
                }
            })),
        );
    }

    /// Forwards every message of `ipc_receiver` into a new unbounded
    /// crossbeam-channel channel, and returns its receiver (ipc-channel's
    /// most common use of its router).
    #[cfg(feature = "crossbeam-channel")]
    pub fn route_ipc_receiver_to_new_crossbeam_receiver<T>(
        &self,
        ipc_receiver: IpcReceiver<T>,
    ) -> crossbeam_channel::Receiver<T>
    where
        T: for<'de> Deserialize<'de> + Serialize + Send + 'static,
    {
        let (crossbeam_sender, crossbeam_receiver) = crossbeam_channel::unbounded();
        self.route_ipc_receiver_to_crossbeam_sender(ipc_receiver, crossbeam_sender);
        crossbeam_receiver
    }

    /// Sends the router an order to serve `route` on `receiver`, and wakes
    /// it unless a wake-up is on its way already. After a shutdown the
    /// route is dropped here.
    fn add_route<T>(&self, receiver: IpcReceiver<T>, route: Route)
    where
        T: Serialize + for<'de> Deserialize<'de> + 'static,
    {
        let order = Control::Add {
            add: Box::new(move |set: &mut IpcReceiverSet| set.add(receiver)),
            route,
        };
        let comm = lock(&self.comm);
        let refused = if comm.shutdown {
            Some(order)
        } else {
            match comm.control.send(order) {
                // The router stopped on its own (its set failed): nobody
                // will serve the route.
                Err(chan::SendError(order)) => Some(order),
                Ok(()) => {
                    // SYNC POINT: proxy. The order above is pushed before
                    // this swap; the router's `swap(false)` either reads this
                    // `true` (and then reads the order) or precedes it (and
                    // this swap reads `false` and sends a wake-up).
                    if !comm.woken.swap(true, Ordering::AcqRel) && comm.wakeup.send(()).is_err() {
                        // The router has stopped (and dropped the order with
                        // its queue), or the packet found no memory: then the
                        // next order sends a wake-up again.
                        comm.woken.store(false, Ordering::Relaxed);
                    }
                    None
                }
            }
        };
        // Dropped outside the lock: a callback's drop may do anything,
        // including adding a route.
        drop(comm);
        drop(refused);
    }
}

impl Drop for RouterProxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for RouterProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterProxy")
            .field("thread", &self.thread_id)
            .field("shutdown", &lock(&self.comm).shutdown)
            .finish()
    }
}

/// The proxy's locks guard no invariant a panic could break halfway (no
/// callback runs under them), so a poisoned one is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A route's message decoded as `T`.
fn decode<T>(message: Result<&mut IpcMessage, SerDeError>) -> Result<T, SerDeError>
where
    T: Serialize + for<'de> Deserialize<'de>,
{
    message.and_then(IpcMessage::decode_in_place::<T>)
}

// ===== the router thread =====

/// The router: its thread's state.
struct Router {
    /// Every route's receiver, and the wake-up channel's.
    set: IpcReceiverSet,
    /// The wake-up channel's id in `set`.
    wakeup_id: u64,
    /// Orders from the proxy.
    orders: chan::Receiver<Control>,
    /// See [`Comm::woken`].
    woken: Arc<AtomicBool>,
    /// Each route, under its receiver's id in `set`.
    routes: Routes,
}

/// The routes by id: the set's ids are consecutive integers, which a
/// multiplication spreads well enough (SipHash, `HashMap`'s default, cost
/// about 150 instructions a message here).
type Routes = HashMap<u64, Route, BuildHasherDefault<IdHasher>>;

/// Hashes a route id: Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// What one select asked of the router beyond delivering messages: done
/// once the select has returned, as they change the set.
#[derive(Default)]
struct After {
    /// The wake-up channel had a packet: orders are queued.
    orders: bool,
    /// The wake-up channel closed (the proxy is gone).
    stop: bool,
    /// Routes whose callback panicked: their receivers leave the set.
    failed: Vec<u64>,
}

impl Router {
    /// Serves the routes until a shutdown order, or until the set fails (a
    /// failing `epoll_wait`, which no input can cause: then the router
    /// stops and its routes are dropped, as at a shutdown).
    ///
    /// Each message is delivered as the set reads it, decoded in place in
    /// the set's buffer: no allocation, and no batch of messages held.
    fn run(mut self) {
        let mut after = After::default();
        loop {
            let (wakeup_id, routes) = (self.wakeup_id, &mut self.routes);
            let selected = self.set.select_events(None, |event| match event {
                SetEvent::Message(id, _) | SetEvent::Malformed(id, _) if id == wakeup_id => {
                    after.orders = true;
                }
                // Only the proxy holds the wake-up's sender, and it shuts
                // the router down before it lets go of it.
                SetEvent::Closed(id, _) if id == wakeup_id => after.stop = true,
                SetEvent::Message(id, message) => deliver(routes, id, Ok(message), &mut after),
                SetEvent::Malformed(id, e) => {
                    deliver(routes, id, Err(SerDeError::from(e)), &mut after);
                }
                SetEvent::Closed(id, _) => {
                    if let Some(route) = routes.remove(&id) {
                        drop_quietly(route);
                    }
                }
            });
            if selected.is_err() || after.stop {
                return;
            }
            for id in after.failed.drain(..) {
                self.set.remove(id);
            }
            if mem::take(&mut after.orders) && !self.take_orders() {
                return;
            }
        }
    }

    /// Carries out the orders queued; `false` at a shutdown order.
    fn take_orders(&mut self) -> bool {
        // SYNC POINT: router, partner of the proxy's swap in
        // `RouterProxy::add_route`. Cleared before the queue is read: a
        // proxy swap after this one reads `false` and sends a wake-up; one
        // before it is read by this swap (an RMW reads the latest value),
        // whose Acquire makes the order pushed before it visible below.
        self.woken.swap(false, Ordering::AcqRel);
        while let Ok(order) = self.orders.try_recv() {
            match order {
                Control::Add { add, route } => match add(&mut self.set) {
                    Ok(id) => {
                        self.routes.insert(id, route);
                    }
                    // The set cannot watch one more descriptor (`epoll`'s
                    // limits): the route is dropped, its receiver closed.
                    Err(_) => drop_quietly(route),
                },
                Control::Shutdown => return false,
            }
        }
        true
    }
}

/// Hands a message of route `id` to its callback. A callback that panics
/// loses its route (see the module docs): its callback is dropped here, and
/// its id noted in `after` for its receiver to leave the set.
fn deliver(
    routes: &mut Routes,
    id: u64,
    message: Result<&mut IpcMessage, SerDeError>,
    after: &mut After,
) {
    // (A route removed earlier in this select has no callback left.)
    let Some(route) = routes.get_mut(&id) else {
        return;
    };
    let outcome = match route {
        Route::Multi(deliver) => panic::catch_unwind(AssertUnwindSafe(|| deliver(message))),
        Route::Once(deliver) => match deliver.take() {
            Some(deliver) => panic::catch_unwind(AssertUnwindSafe(|| deliver(message))),
            None => Ok(()),
        },
    };
    if let Err(payload) = outcome {
        drop_quietly(payload);
        if let Some(route) = routes.remove(&id) {
            drop_quietly(route);
        }
        after.failed.push(id);
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        for (_, route) in self.routes.drain() {
            drop_quietly(route);
        }
    }
}

/// Drops `value`, catching a panic of its `Drop` (a callback's captures
/// are the caller's code) so that it cannot end the router's thread. A
/// panic whose own payload panics when dropped leaks that payload instead.
fn drop_quietly<T>(value: T) {
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(move || drop(value))) {
        mem::forget(payload);
    }
}
