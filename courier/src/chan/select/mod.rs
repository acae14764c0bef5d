//! Waiting on several channel operations at once.
//!
//! A select first tries every operation (starting at a rotating offset, for fairness); if none
//! is ready, a thread retries them for as long as its recent selects found spinning pays
//! ([`Select::spin_before_registering`]); then it registers **one** context on every
//! operation's wait list, re-checks, and parks.
//! The first peer to claim the context (one CAS; Go's `selectDone`) decides which operation
//! proceeds; every other registration is removed. For buffered flavors the chosen operation is
//! then retried (the claim only said "ready now"); for the rendezvous flavor the claimer has
//! already paired with it through a packet.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::backoff::{spin_adaptively, SpinEstimate};
use super::context::{current_may_yield, sleep_until, Context, Operation, Selected};
use super::deadline_after;
use super::err::{
    ReadyTimeoutError, RecvError, SelectTimeoutError, SendError, TryReadyError, TrySelectError,
};
use super::flavors::Token;

mod handle;
pub(crate) use self::handle::SelectHandle;
pub use self::handle::{SelectRecv, SelectSend};

/// One registered operation: the handle, the index `Select` returned for it, and the address
/// of the endpoint (to check that the caller completes the right one).
struct Handle<'a> {
    handle: &'a dyn SelectHandle,
    index: usize,
    endpoint: *const u8,
}

/// Waits on several send and receive operations; completes exactly one.
///
/// ```
/// use courier::chan::{self, Select};
///
/// let (tx1, rx1) = chan::unbounded::<i32>();
/// let (tx2, rx2) = chan::bounded::<&str>(1);
/// tx2.send("hi").unwrap();
///
/// let mut sel = Select::new();
/// let i1 = sel.recv(&rx1);
/// let i2 = sel.recv(&rx2);
/// let op = sel.select();
/// assert_eq!(op.index(), i2);
/// assert_eq!(op.recv(&rx2), Ok("hi"));
/// # let _ = (i1, tx1);
/// ```
///
/// A `Select` is not `Send` (crossbeam's is, unconditionally): it may hold
/// ends of channels whose messages are not `Send`, and a select that moved to
/// another thread could reserve such a message there, or be handed it by a
/// rendezvous sender, and then drop it on the wrong thread. Build and run it
/// on the thread that completes the operation.
///
/// ```compile_fail
/// fn assert_send<T: Send>(_: &T) {}
/// let (_tx, rx) = courier::chan::unbounded::<std::rc::Rc<u8>>();
/// let mut sel = courier::chan::Select::new();
/// sel.recv(&rx);
/// assert_send(&sel);
/// ```
pub struct Select<'a> {
    /// Inline up to four: a select is usually built, run once and dropped, and a heap `Vec`
    /// cost it a `malloc` and a `free` each time (crossbeam pays them too).
    handles: SmallVec<[Handle<'a>; 4]>,
    next_index: usize,
}

impl fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select")
            .field("operations", &self.handles.len())
            .finish()
    }
}

impl Default for Select<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> Select<'a> {
    /// An empty select.
    pub fn new() -> Select<'a> {
        Select {
            handles: SmallVec::new(),
            next_index: 0,
        }
    }

    /// Adds a send on `tx` (a channel's [`Sender`](super::Sender) or a
    /// [`local::Sender`](super::local::Sender)); returns the operation's index.
    pub fn send<S: SelectSend>(&mut self, tx: &'a S) -> usize {
        tx.add_to(self)
    }

    /// Adds a receive on `rx` (a channel's [`Receiver`](super::Receiver), a
    /// [`oneshot::Receiver`](super::oneshot::Receiver) or a
    /// [`local::Receiver`](super::local::Receiver)); returns the operation's index.
    pub fn recv<R: SelectRecv>(&mut self, rx: &'a R) -> usize {
        rx.add_to(self)
    }

    fn push(&mut self, handle: &'a dyn SelectHandle, endpoint: *const u8) -> usize {
        let index = self.next_index;
        self.next_index += 1;
        self.handles.push(Handle {
            handle,
            index,
            endpoint,
        });
        index
    }

    /// Completes nothing and returns at once if no operation is ready.
    pub fn try_select(&mut self) -> Result<SelectedOperation<'a>, TrySelectError> {
        self.run(Timeout::Now).ok_or(TrySelectError)
    }

    /// Waits until one operation is ready. Panics if the select is empty (it would never
    /// return).
    pub fn select(&mut self) -> SelectedOperation<'a> {
        assert!(
            !self.handles.is_empty(),
            "select over no operation would wait forever"
        );
        self.run(Timeout::Never)
            .expect("an untimed select returns an operation")
    }

    /// Waits at most `timeout` for an operation.
    pub fn select_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        match deadline_after(timeout) {
            Some(deadline) => self.select_deadline(deadline),
            None => Ok(self.select()),
        }
    }

    /// Waits until `deadline` at the latest for an operation.
    pub fn select_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        self.run(Timeout::At(deadline)).ok_or(SelectTimeoutError)
    }

    /// Returns the index of an operation that is ready now (a message to receive, room to
    /// send, a peer waiting on a rendezvous channel, or a disconnected channel), without
    /// completing it; `Err` if none is.
    ///
    /// Unlike [`try_select`](Self::try_select), nothing is reserved: by the time the caller
    /// acts, another thread may have taken what was ready, so complete the operation with a
    /// non-blocking call (`try_recv`, `try_send`) and come back on `Empty`/`Full`.
    pub fn try_ready(&mut self) -> Result<usize, TryReadyError> {
        self.run_ready(Timeout::Now).ok_or(TryReadyError)
    }

    /// Waits until an operation is ready and returns its index (see
    /// [`try_ready`](Self::try_ready)). Panics if the select is empty.
    ///
    /// A waiting `ready` only watches the channels: it takes no wake-up meant for a blocked
    /// `send` or `recv`, and pairs with no rendezvous peer.
    ///
    /// ```
    /// use courier::chan::{self, Select, TryRecvError};
    ///
    /// let (tx, rx) = chan::unbounded::<u32>();
    /// let t = std::thread::spawn(move || tx.send(5).unwrap());
    /// let mut sel = Select::new();
    /// let i = sel.recv(&rx);
    /// loop {
    ///     assert_eq!(sel.ready(), i);
    ///     match rx.try_recv() {
    ///         Ok(v) => break assert_eq!(v, 5),
    ///         Err(TryRecvError::Empty) => continue, // someone else took it
    ///         Err(TryRecvError::Disconnected) => unreachable!(),
    ///     }
    /// }
    /// # t.join().unwrap();
    /// ```
    pub fn ready(&mut self) -> usize {
        assert!(
            !self.handles.is_empty(),
            "ready over no operation would wait forever"
        );
        self.run_ready(Timeout::Never)
            .expect("an untimed ready returns an operation")
    }

    /// Waits at most `timeout` for an operation to become ready.
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, ReadyTimeoutError> {
        match deadline_after(timeout) {
            Some(deadline) => self.ready_deadline(deadline),
            None => Ok(self.ready()),
        }
    }

    /// Waits until `deadline` at the latest for an operation to become ready.
    pub fn ready_deadline(&mut self, deadline: Instant) -> Result<usize, ReadyTimeoutError> {
        self.run_ready(Timeout::At(deadline))
            .ok_or(ReadyTimeoutError)
    }

    /// Where this call starts trying the operations: a different one each call, for fairness
    /// (0 under loom: models must be deterministic). `None`: the select is empty.
    ///
    /// An offset, not a rotation of `handles`: rotating moved the entries with up to three
    /// `memmove` calls per select (5% of a selecting receiver's instructions in `select_rx`).
    fn start(&self) -> Option<usize> {
        let n = self.handles.len();
        match n {
            0 => None,
            _ if cfg!(loom) => Some(0),
            _ => Some(next_rotation(n)),
        }
    }

    /// Retries `attempt` (one pass over the operations) while the calling thread's recent
    /// selects found that spinning pays, before the select registers. The estimate is the
    /// thread's ([`SpinEstimate`], as each buffered channel side keeps one): a `Select` is built
    /// for one call and has nothing that outlives it, and a thread's selects usually repeat one
    /// shape. Fibers do not spin here (their scheduler may have other work), and nor does a
    /// select with a rendezvous among its operations: a rendezvous completes against a peer
    /// that waits, and registering is what lets a sending peer hand over its message at once
    /// instead of waiting itself (`courier-bench chan --case select_rx_bounded0`: 0.93-0.96 µs
    /// a message, 1.23-1.24 when it spins).
    ///
    /// Registering costs every operation's wait-list lock twice (register, unregister), and a
    /// registered select makes each peer that readies one of its channels lock that list to
    /// claim and wake it. Where the operations become ready within a microsecond or two,
    /// spinning first avoids all of that. Without it `select_rx` over `bounded(1)` (four
    /// senders each on its own channel, one selecting receiver, two CPUs) registers for most
    /// messages: its receiver's time goes to the locks, and its polling senders take the CPU it
    /// shares with them (173,000 context switches for 600,000 messages, crossbeam 3,600).
    /// `select_ab 1 200000 5` (`courier-bench/examples`), builds and crossbeam taking turns,
    /// medians: 0.51-0.53 µs a message with the spin, 1.34-1.40 without, in the machine's slow
    /// mode (crossbeam 0.86-1.11); 0.28-0.35 and 0.44-0.47 in its fast one (crossbeam
    /// 0.22-0.23).
    fn spin_before_registering<R>(&self, mut attempt: impl FnMut() -> Option<R>) -> Option<R> {
        thread_local! {
            static SPIN: SpinEstimate = const { SpinEstimate::new() };
        }
        if !current_may_yield() || self.handles.iter().any(|h| h.handle.is_rendezvous()) {
            return None;
        }
        SPIN.with(|spin| spin_adaptively(spin, &mut attempt))
    }

    /// Panics where waiting could only deadlock: no deadline, outside a scheduler task, and
    /// every operation a `chan::local` one, which only this (then sleeping) thread could make
    /// ready; as a local `recv` does there.
    fn check_can_wait(&self, deadline: Option<Instant>) {
        #[cfg(not(loom))]
        if deadline.is_none()
            && self.handles.iter().all(|h| h.handle.is_local())
            && Context::current_task().is_none()
        {
            panic!("chan::local: a select would block the thread forever (no scheduler task)");
        }
        #[cfg(loom)]
        let _ = deadline;
    }

    /// When a waiting select must wake: at `deadline`, or when a timer among the operations
    /// (`after`, `tick`) is due, if that comes first: the clock makes it ready, and the clock
    /// wakes nobody.
    fn wake_at(&self, deadline: Option<Instant>) -> Option<Instant> {
        self.handles
            .iter()
            .filter_map(|h| h.handle.deadline())
            .chain(deadline)
            .min()
    }

    /// The operations in trying order: from `start` round to just before it.
    fn in_turn(&self, start: usize) -> impl Iterator<Item = &Handle<'a>> {
        let (front, back) = self.handles.split_at(start);
        back.iter().chain(front)
    }

    fn run_ready(&mut self, timeout: Timeout) -> Option<usize> {
        let deadline = match timeout {
            Timeout::At(d) => Some(d),
            _ => None,
        };
        let Some(start) = self.start() else {
            if let Some(d) = deadline {
                wait_out(d);
            }
            return None;
        };
        let mut first = true;
        loop {
            if let Some(h) = self.in_turn(start).find(|h| h.handle.is_ready()) {
                return Some(h.index);
            }
            if matches!(timeout, Timeout::Now) || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            self.check_can_wait(deadline);
            if std::mem::take(&mut first) {
                let ready = self.spin_before_registering(|| {
                    self.in_turn(start)
                        .find(|h| h.handle.is_ready())
                        .map(|h| h.index)
                });
                if ready.is_some() {
                    return ready;
                }
            }
            // Watch everything, re-check, park; whatever wakes us (a timer's due time
            // included), look again.
            let wake_at = self.wake_at(deadline);
            let handles = &mut self.handles;
            Context::with(|cx| {
                let mut watched = 0;
                for h in handles.iter_mut() {
                    watched += 1;
                    if h.handle.watch(Operation::hook(h), cx) {
                        let _ = cx.try_select(Selected::Aborted);
                        break;
                    }
                    if cx.selected() != Selected::Waiting {
                        break;
                    }
                }
                cx.wait_until(wake_at, true);
                for h in handles.iter_mut().take(watched) {
                    h.handle.unwatch(Operation::hook(h));
                }
            });
        }
    }

    fn run(&mut self, timeout: Timeout) -> Option<SelectedOperation<'a>> {
        let deadline = match timeout {
            Timeout::At(d) => Some(d),
            _ => None,
        };
        // Fairness: start each select at a different operation.
        let Some(start) = self.start() else {
            if let Some(d) = deadline {
                wait_out(d);
            }
            return None;
        };
        let mut token = Token::default();
        loop {
            // 1. Is anything ready now? (`token.waited` from the second round on.)
            for h in self.in_turn(start) {
                if h.handle.try_select(&mut token) {
                    return Some(SelectedOperation::new(token, h.index, h.endpoint));
                }
            }
            if matches!(timeout, Timeout::Now) {
                return None;
            }
            self.check_can_wait(deadline);
            // 2. Before the first registration, retry while spinning pays.
            if !token.waited {
                let chosen = self.spin_before_registering(|| {
                    self.in_turn(start)
                        .find(|h| h.handle.try_select(&mut token))
                        .map(|h| (h.index, h.endpoint))
                });
                if let Some((index, endpoint)) = chosen {
                    return Some(SelectedOperation::new(token, index, endpoint));
                }
            }
            // 3. Register everywhere, re-check, park (until a timer among the operations is
            // due, if one comes before the deadline).
            let wake_at = self.wake_at(deadline);
            let handles = &mut self.handles;
            let chosen = Context::with(|cx| {
                let mut sel = Selected::Waiting;
                let mut registered = 0;
                for h in handles.iter_mut() {
                    registered += 1;
                    let oper = Operation::hook(h);
                    let ready = h.handle.register(oper, cx);
                    if ready {
                        sel = match cx.try_select(Selected::Aborted) {
                            Ok(()) => Selected::Aborted,
                            Err(s) => s,
                        };
                        break;
                    }
                    sel = cx.selected();
                    if sel != Selected::Waiting {
                        break;
                    }
                }
                if sel == Selected::Waiting {
                    sel = cx.wait_until(wake_at, true);
                }
                for h in handles.iter_mut().take(registered) {
                    let oper = Operation::hook(h);
                    h.handle.unregister(oper);
                }
                if let Selected::Operation(oper) = sel {
                    for h in handles.iter_mut() {
                        if Operation::hook(h) == oper {
                            return h
                                .handle
                                .accept(&mut token, cx)
                                .then_some((h.index, h.endpoint));
                        }
                    }
                }
                None
            });
            token.waited = true;
            if let Some((index, endpoint)) = chosen {
                return Some(SelectedOperation::new(token, index, endpoint));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
        }
    }
}

/// An empty select's wait until `deadline`: nothing can end it early. Through the running
/// task's context, so that a fiber parks (a thread sleeping here would stall its scheduler).
fn wait_out(deadline: Instant) {
    sleep_until(Some(deadline));
}

#[derive(Clone, Copy)]
enum Timeout {
    Now,
    Never,
    At(Instant),
}

/// Where the next select of this thread starts, in `0..n`: a per-thread xorshift state mapped
/// onto the range by a multiply and a shift (Lemire's "fast alternative to the modulo
/// reduction") rather than `%`, whose `div` is a third of `Select::run`'s own samples in a
/// `perf record` of `select_ab` (`courier-bench/examples`).
fn next_rotation(n: usize) -> usize {
    thread_local! {
        static SEED: Cell<u32> = const { Cell::new(0x9E37_79B9) };
    }
    SEED.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s.set(x);
        // Below `n` for any `n`: x < 2^32. (One 64x64 -> 128-bit `mul` on x86-64.)
        ((u128::from(x) * n as u128) >> 32) as usize
    })
}

/// The operation a select chose: complete it with [`send`](SelectedOperation::send) or
/// [`recv`](SelectedOperation::recv) on the same endpoint. Dropping it without completing
/// panics (a rendezvous peer may be waiting on it).
#[must_use = "a selected operation must be completed with `send` or `recv`"]
pub struct SelectedOperation<'a> {
    token: Token,
    index: usize,
    endpoint: *const u8,
    _marker: PhantomData<&'a ()>,
}

impl fmt::Debug for SelectedOperation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation")
            .field("index", &self.index)
            .finish()
    }
}

impl<'a> SelectedOperation<'a> {
    fn new(token: Token, index: usize, endpoint: *const u8) -> Self {
        SelectedOperation {
            token,
            index,
            endpoint,
            _marker: PhantomData,
        }
    }

    /// The index `Select::send`/`recv` returned for this operation.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Completes the selected send. Panics if `tx` is not the sender that was selected, which
    /// aborts the process if the operation holds a reservation (see the `Drop` impl).
    ///
    /// On a channel's [`Sender`](super::Sender) this never waits: the select reserved the
    /// room. On a [`local::Sender`](super::local::Sender) nothing is reserved, and the send
    /// waits as `send` does if another task of the thread has filled the room since (see
    /// [`local`](super::local)'s "Blocking").
    pub fn send<S: SelectSend>(self, tx: &S, msg: S::Msg) -> Result<(), SendError<S::Msg>> {
        tx.put_selected(self, msg)
    }

    /// Completes the selected receive. Panics if `rx` is not the receiver that was selected,
    /// which aborts the process if the operation holds a reservation (see the `Drop` impl).
    ///
    /// Never waits, except on a [`local::Receiver`](super::local::Receiver) whose message
    /// another task of the thread has taken since the select (as [`send`](Self::send)).
    pub fn recv<R: SelectRecv>(self, rx: &R) -> Result<R::Msg, RecvError> {
        rx.take_selected(self)
    }

    /// Completes the operation on `endpoint` with `f`, which gets the token; panics, before
    /// anything trusts the token, unless `endpoint` is the end this operation was selected on.
    fn complete_on<R>(
        mut self,
        endpoint: *const u8,
        what: &str,
        f: impl FnOnce(&mut Token) -> R,
    ) -> R {
        assert!(
            std::ptr::eq(endpoint, self.endpoint),
            "completed a selected operation on the wrong {what}"
        );
        let res = f(&mut self.token);
        self.complete();
        res
    }

    fn complete(self) {
        // Everything the token holds is plain data or an `Option<Context>` already taken.
        let mut this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used again; dropping its token in place runs its destructor
        // once (ManuallyDrop suppresses ours, which would panic).
        unsafe { std::ptr::drop_in_place(&mut this.token) };
    }
}

/// Dropping an operation that holds a reservation (a slot, a position, or a rendezvous peer
/// waiting for its packet) would leave peers, and the channel's own drop, waiting for a message
/// that never comes, so it aborts the process: on a panic between the select and the
/// completion (crossbeam-channel's aborts there too, through a second panic), and on an early
/// exit there, such as `?`, `return` or `break` in a `select!` send arm's message expression.
/// An operation that holds none (a `chan::local` or oneshot end's, or one on a disconnected
/// channel) panics when dropped uncompleted, unless the thread is unwinding already.
/// (Forgetting an operation with `mem::forget` is not unsound, but may leave those peers
/// waiting forever.)
impl Drop for SelectedOperation<'_> {
    fn drop(&mut self) {
        if self.token.is_reserved() {
            eprintln!(
                "courier: a selected channel operation that holds a reservation was dropped \
                 uncompleted; aborting (its peers would wait for it forever)"
            );
            std::process::abort();
        }
        if !std::thread::panicking() {
            panic!("dropped a SelectedOperation without completing it");
        }
    }
}
