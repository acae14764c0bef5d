//! The blocking protocol shared by every flavor: register, re-check, park; claim, hand off, unpark.
//!
//! # The protocol
//!
//! A blocked operation is one [`Context`] (a claim word, a hand-off slot and a [`Parker`]) plus
//! one [`Entry`] per wait list it is queued on (several for a `Select`). It goes:
//!
//! 1. **register**: push an `Entry` on the channel's wait list, under the list's lock;
//! 2. **re-check**: if the channel became ready meanwhile, claim *itself* (`WAITING -> ABORTED`)
//!    so the wait below returns at once; the [`SyncWaitList`] fences make sure that a peer that
//!    changed the state either sees the entry or is seen by the re-check (a Dekker pair);
//! 3. **park**: [`Context::wait_until`] parks until the claim word changes (or the deadline
//!    passes, in which case it claims itself `ABORTED`). Before registering, an operation spins
//!    (and on some channel sides polls between yields) on the channel; a rendezvous waiter, a
//!    `Select` and a waiter of a capacity-one channel poll their claim word after registering
//!    instead (`backoff::spin_then_yield`).
//!
//! A peer that makes the channel ready pops one entry of *another* task, claims it with one CAS
//! (`WAITING -> Operation(op)`; a failed CAS means a `Select` was won elsewhere, so it tries the
//! next entry), and unparks it **after** releasing the list lock (Go's `goready` after
//! `unlock(&c.lock)`). Disconnection claims every entry with `DISCONNECTED`. An entry that was
//! not claimed by a peer is removed by its owner before the operation returns.
//!
//! This is Go's `sudog`/`selectDone` and crossbeam-channel's `Context`/`Waker`
//! (`crossbeam-channel/src/{context,waker}.rs`), written here for tasks that are threads *or*
//! fibers.
//!
//! # Threads and fibers: the [`Park`] seam
//!
//! Parking goes through [`Parker`], an enum with two cases: a thread (`std::thread::park`, the
//! built-in case, statically dispatched), or a task supplied by a scheduler through the [`Park`]
//! trait (the `fiber` layer implements it: park = switch to the scheduler, unpark = push the fiber
//! on its home run queue). The channel code never names either: it asks for "the current
//! context" ([`Context::with`]), which is **one thread-local load** of the pointer a scheduler
//! installs with [`TaskContext::run`] when it resumes a fiber (seed 001's inlined `curlwp`), and
//! falls back to the thread's own cached context when that pointer is null.
//!
//! A context is reference counted (`Arc`): the waker holds a clone, so it may unpark a task that
//! already saw its claim and returned (the unpark is then a spurious wake-up of its *next* wait,
//! which re-checks its claim word and parks again).
#![allow(unsafe_code)]

use std::fmt;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use super::backoff::{spin_adaptively, spin_then_yield, Backoff, Pollers};
#[cfg(loom)]
use crate::sync::atomic::fence;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use crate::sync::{thread, Arc, Mutex};

// ===== Park: the seam =====

/// How a task other than an OS thread sleeps and is woken: the interface a fiber scheduler
/// implements so that `chan` can block its fibers (threads are built in).
///
/// Contract (liveness, not memory safety, depends on it):
/// - `unpark` may be called from any thread, any number of times, before, during or after the
///   `park` it is meant for;
/// - an `unpark` that comes before a `park` is not lost: that `park` returns at once (a wake-up
///   token, as `std::thread::park` keeps one);
/// - `park` may return spuriously (the channel re-checks its state and parks again), and must
///   return at or soon after `deadline` when one is given;
/// - `park` and `yield_now` are only called by the task the parker belongs to, while it runs.
///
/// A panic out of any of these methods aborts the process (with a message on stderr): while a
/// task parks, peers may still write the operation state it keeps on its stack, which
/// unwinding would free under them. A channel operation that `park` or `yield_now` runs itself
/// (a scheduler that receives on a channel while its task sleeps) acts as the thread's: it gets
/// the thread's context, not the sleeping task's, and waits as a thread does.
pub trait Park: Send + Sync + 'static {
    /// Suspends the calling task until [`unpark`](Park::unpark) (or `deadline`, or spuriously).
    fn park(&self, deadline: Option<Instant>);

    /// Makes the task's current or next `park` return.
    fn unpark(&self);

    /// Lets the scheduler run its other ready tasks, then returns; the task stays ready.
    ///
    /// A channel operation calls this where it waits for another task to finish a step that
    /// task has already begun: a receiver that took a `Select`'s send on a rendezvous channel,
    /// waiting for the selecting task to write; a receiver waiting for a sender between claiming
    /// a slot and filling it (or the other way round). Spinning there would wait forever if that
    /// task shares this one's scheduler thread.
    ///
    /// Contract: `yield_now` keeps the task ready (it is not a `park`), neither consumes nor
    /// loses a pending `unpark`, may return at once when nothing else is ready, and, called
    /// repeatedly, lets every other ready task of the scheduler run.
    fn yield_now(&self);

    /// May a waiting channel operation call `std::thread::yield_now` before parking? A fiber
    /// must answer `false`: yielding the OS thread would stall every fiber of its scheduler.
    fn may_yield_thread(&self) -> bool {
        false
    }

    /// Should a blocked operation spin (briefly, with `pause`) before parking this task? A
    /// scheduler answers `false` when other tasks are ready to run on its thread: the peer a
    /// fiber waits for may be one of them, and cannot run while it spins.
    fn may_spin(&self) -> bool {
        true
    }
}

/// How late Linux may end a timed sleep of a thread that has not changed its timer slack
/// (`PR_SET_TIMERSLACK`; 50 µs by default): `recv_timeout(10 µs)` on a bounded channel, which
/// parked, returned after 65 µs (crossbeam-channel's after 70; `examples/wait_ends`, session
/// 16). A wait with less than this left polls between yields instead of sleeping.
const TIMER_SLACK: std::time::Duration = std::time::Duration::from_micros(50);

/// Who sleeps when a channel operation blocks.
pub(crate) enum Parker {
    /// An OS thread: `std::thread::park` / `Thread::unpark` (futex-based, keeps a token).
    Thread(thread::Thread),
    /// A task of a scheduler (a fiber), through the [`Park`] seam.
    Task(TaskParker),
}

/// A scheduler task's [`Park`], and whether the task is inside one of the methods it runs
/// itself (`park`, `yield_now`). Every call aborts the process if it unwinds (see [`Park`]).
pub(crate) struct TaskParker {
    park: Box<dyn Park>,
    /// Set while the task runs `park` or `yield_now`: a channel operation in there is the
    /// scheduler's own, and acts as the thread's ([`Context::current_task`] leaves the task
    /// out). Only the thread that runs the task touches it (a plain std atomic: it orders
    /// nothing).
    inside: std::sync::atomic::AtomicBool,
}

impl TaskParker {
    fn new(park: Box<dyn Park>) -> TaskParker {
        TaskParker {
            park,
            inside: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Runs one of the methods the task calls on itself, marked as inside.
    fn run_inside<R>(&self, f: impl FnOnce(&dyn Park) -> R) -> R {
        use std::sync::atomic::Ordering::Relaxed;
        let was_inside = self.inside.swap(true, Relaxed);
        let out = no_unwind(|| f(&*self.park));
        self.inside.store(was_inside, Relaxed);
        out
    }

    fn park(&self, deadline: Option<Instant>) {
        self.run_inside(|park| park.park(deadline));
    }

    /// Lets the scheduler's other ready tasks run.
    #[cfg_attr(loom, allow(dead_code))] // reached through `CURRENT_TASK`, left out of loom builds
    fn yield_now(&self) {
        self.run_inside(|park| park.yield_now());
    }

    /// Called by peers, from any thread: not "inside".
    fn unpark(&self) {
        no_unwind(|| self.park.unpark());
    }

    fn may_yield_thread(&self) -> bool {
        no_unwind(|| self.park.may_yield_thread())
    }

    fn may_spin(&self) -> bool {
        no_unwind(|| self.park.may_spin())
    }

    /// Is the task running one of its own `Park` methods?
    #[cfg_attr(loom, allow(dead_code))] // read through `CURRENT_TASK`, left out of loom builds
    fn is_inside(&self) -> bool {
        self.inside.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Parker {
    #[inline]
    fn park(&self, deadline: Option<Instant>) {
        match self {
            Parker::Thread(_) => match deadline {
                None => thread::park(),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left >= TIMER_SLACK {
                        thread::park_timeout(left);
                    } else if !left.is_zero() {
                        // A timed sleep this short could end the timer slack late, several
                        // times the wait asked for: yield instead (a spurious return, after
                        // which the caller re-checks and comes back until the deadline).
                        thread::yield_now();
                    }
                }
            },
            Parker::Task(task) => task.park(deadline),
        }
    }

    #[inline]
    fn unpark(&self) {
        match self {
            Parker::Thread(thread) => thread.unpark(),
            Parker::Task(task) => task.unpark(),
        }
    }

    #[inline]
    fn may_yield_thread(&self) -> bool {
        match self {
            Parker::Thread(_) => true,
            Parker::Task(task) => task.may_yield_thread(),
        }
    }
}

/// Runs a [`Park`] method, aborting the process if it unwinds (see [`Park`]).
#[inline]
fn no_unwind<R>(f: impl FnOnce() -> R) -> R {
    struct Abort;
    impl Drop for Abort {
        #[cold]
        fn drop(&mut self) {
            eprintln!(
                "courier::chan: a `Park` implementation panicked while a channel operation \
                 waited on it; aborting (the operation's state is on the stack being unwound)"
            );
            std::process::abort();
        }
    }
    let abort = Abort;
    let out = f();
    std::mem::forget(abort);
    out
}

// ===== Selected, Operation =====

/// Identifies one operation of one blocked task: the address of something the task keeps alive
/// (and in place) while it is registered, so two live operations never share an id.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Operation(usize);

impl Operation {
    /// The operation named by the address of `r` (a token or a select entry on the caller's
    /// stack; never zero-sized, so distinct objects have distinct addresses).
    #[inline]
    pub(crate) fn hook<R>(r: &mut R) -> Operation {
        const { assert!(std::mem::size_of::<R>() > 0) };
        let addr = r as *mut R as usize;
        debug_assert!(addr > DISCONNECTED);
        Operation(addr)
    }
}

const WAITING: usize = 0;
const ABORTED: usize = 1;
const DISCONNECTED: usize = 2;

/// The claim word of a [`Context`]: who ended the wait, and how.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Selected {
    /// Still waiting.
    Waiting,
    /// The task gave up (timeout, or its re-check found the channel ready).
    Aborted,
    /// A channel it waits on was disconnected.
    Disconnected,
    /// A peer chose this operation.
    Operation(Operation),
}

impl From<usize> for Selected {
    #[inline]
    fn from(word: usize) -> Selected {
        match word {
            WAITING => Selected::Waiting,
            ABORTED => Selected::Aborted,
            DISCONNECTED => Selected::Disconnected,
            oper => Selected::Operation(Operation(oper)),
        }
    }
}

impl From<Selected> for usize {
    #[inline]
    fn from(sel: Selected) -> usize {
        match sel {
            Selected::Waiting => WAITING,
            Selected::Aborted => ABORTED,
            Selected::Disconnected => DISCONNECTED,
            Selected::Operation(Operation(oper)) => oper,
        }
    }
}

// ===== Context =====

/// The waiting state of one task: shared (by `Arc`) between the task and every wait-list entry
/// that names it.
#[derive(Clone)]
pub(crate) struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    /// The claim word: a [`Selected`], `WAITING` until someone claims the wait.
    select: AtomicUsize,
    /// The hand-off slot: the packet address a peer gives a `Select` it claimed (rendezvous).
    packet: AtomicPtr<()>,
    /// How this task sleeps.
    parker: Parker,
    /// Who this is, to keep a task from matching its own entries (a select that both sends and
    /// receives on one rendezvous channel).
    task_id: usize,
    /// A task's context: an operation of the task is under way. Only the thread running the
    /// task touches it (a `TaskContext` is not `Sync`), so it is not a synchronisation point.
    #[cfg_attr(loom, allow(dead_code))] // read by `with`, left out of loom builds
    busy: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("selected", &self.selected())
            .field("task_id", &self.inner.task_id)
            .finish()
    }
}

impl Context {
    fn new(parker: Parker, task_id: usize) -> Context {
        Context {
            inner: Arc::new(Inner {
                select: AtomicUsize::new(WAITING),
                packet: AtomicPtr::new(std::ptr::null_mut()),
                parker,
                task_id,
                busy: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A context for the calling OS thread.
    fn for_thread() -> Context {
        Context::new(Parker::Thread(thread::current()), current_thread_id())
    }

    /// Makes the context ready for a new operation.
    ///
    /// Only its owner calls this, between two operations: no entry of an earlier operation is
    /// registered any more, so no peer claims it concurrently (an old waker may still unpark,
    /// which is a harmless spurious wake-up).
    #[inline]
    #[cfg_attr(loom, allow(dead_code))] // its callers are left out of loom builds
    fn reset(&self) {
        self.inner.select.store(WAITING, Ordering::Relaxed);
        self.inner
            .packet
            .store(std::ptr::null_mut(), Ordering::Relaxed);
    }

    /// Runs `f` with the context of the current task: the fiber a scheduler installed with
    /// [`TaskContext::run`], else the thread's own (cached) context.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn with<R>(f: impl FnOnce(&Context) -> R) -> R {
        // The `curlwp` read: one thread-local load, no call chain.
        if let Some(cx) = Context::current_task() {
            // The operation keeps a handle of its own (one reference count): once the task
            // suspends, its scheduler may move or drop the `TaskContext` the pointer names.
            // SAFETY: `current_task` returns only installed pointers, which are live now.
            let cx = &unsafe { &*cx }.clone();
            // An operation that the task's own `Park` runs (the scheduler's, while the task
            // waits: `current_task` leaves those out), or one nested in another of its
            // operations (a message's `Drop` that blocks), must not reset the waiting
            // operation's claim word: it takes the thread's context below.
            if !cx.inner.busy.load(std::sync::atomic::Ordering::Relaxed) {
                /// Marks the task idle again when its operation ends, on unwind too.
                struct Idle<'a>(&'a Context);
                impl Drop for Idle<'_> {
                    fn drop(&mut self) {
                        (self.0.inner.busy).store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                cx.inner
                    .busy
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let _idle = Idle(cx);
                cx.reset();
                return f(cx);
            }
        }
        let mut f = Some(f);
        let mut run = |cx: &Context| {
            cx.reset();
            let f = f.take().expect("the closure runs once");
            f(cx)
        };
        // The thread's context is taken out of its cell while in use, so a nested blocking
        // operation (a `Drop` that blocks, say) gets a fresh one instead of sharing it.
        let cx = match THREAD_CONTEXT.try_with(|cell| cell.take()) {
            Ok(Some(cx)) => cx,
            // The first operation of this thread, or one nested in another (which holds the
            // cached context). (Until session 19 no context was ever kept: every blocking
            // operation allocated one and freed it, ~175 instructions of a rendezvous ring's
            // ~700 a hop.)
            Ok(None) => Context::for_thread(),
            // The thread is exiting (its thread-locals are gone).
            Err(_) => return run(&Context::for_thread()),
        };
        let out = run(&cx);
        // Kept for the next operation (in place of any a nested operation left), unless the
        // operation ended on another thread than it began on: a task's operation nested in
        // one of its own (so taking the thread's context) whose back-off stepped aside through
        // the task's `Park::yield_now`, during which a scheduler moved the task. That context
        // parks and names the first thread; cached on this one, it would make every later
        // operation here park this thread while its peers unpark the other.
        if cx.inner.task_id == current_thread_id() {
            let _ = THREAD_CONTEXT.try_with(|cell| cell.set(Some(cx)));
        }
        out
    }

    /// loom models have no thread-locals to cache in: a fresh context per operation.
    #[cfg(loom)]
    pub(crate) fn with<R>(f: impl FnOnce(&Context) -> R) -> R {
        f(&Context::for_thread())
    }

    /// Claims the wait for `sel` if it is still waiting. On failure, returns who claimed it.
    #[inline]
    pub(crate) fn try_select(&self, sel: Selected) -> Result<(), Selected> {
        // SYNC POINT: claimer. Release publishes what the claimer did before (a packet written);
        // Acquire (on failure too) lets a loser see what the winner published. Partner: the
        // Acquire load in `wait_until`/`selected`.
        self.inner
            .select
            .compare_exchange(WAITING, sel.into(), Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(Selected::from)
    }

    /// The current claim.
    #[inline]
    pub(crate) fn selected(&self) -> Selected {
        // SYNC POINT: waiter. Partner: the claim CAS in `try_select`.
        Selected::from(self.inner.select.load(Ordering::Acquire))
    }

    /// Gives a claimed `Select` the packet of its chosen rendezvous operation.
    #[inline]
    pub(crate) fn store_packet(&self, packet: *mut ()) {
        if !packet.is_null() {
            // SYNC POINT: producer of the packet address. Partner: `wait_packet`'s Acquire.
            self.inner.packet.store(packet, Ordering::Release);
        }
    }

    /// Waits for the packet address that the claimer stores right after its claim (spinning,
    /// then stepping aside: `Backoff::snooze`).
    pub(crate) fn wait_packet(&self) -> *mut () {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: consumer of the packet address. Partner: `store_packet`.
            let packet = self.inner.packet.load(Ordering::Acquire);
            if !packet.is_null() {
                return packet;
            }
            backoff.snooze();
        }
    }

    /// The task this context belongs to.
    #[inline]
    pub(crate) fn task_id(&self) -> usize {
        self.inner.task_id
    }

    #[inline]
    pub(crate) fn may_yield_thread(&self) -> bool {
        self.inner.parker.may_yield_thread()
    }

    /// Waits until the context is claimed, or the deadline passes (then claims it `Aborted`,
    /// unless a peer claimed it first, whose claim is returned instead and must be honoured).
    ///
    /// With `spin`, first polls the claim word (`backoff::spin_then_yield`): the rendezvous
    /// flavor, `Select` and capacity one, whose peers finish a registered waiter's operation
    /// for it. The other buffered waiters poll the channel itself before registering, and pass
    /// `false`.
    pub(crate) fn wait_until(&self, deadline: Option<Instant>, spin: bool) -> Selected {
        if spin {
            let claimed =
                spin_then_yield(self.may_spin(), self.may_yield_thread(), deadline, || {
                    let sel = self.selected();
                    (sel != Selected::Waiting).then_some(sel)
                });
            if let Some(sel) = claimed {
                return sel;
            }
        }
        loop {
            let sel = self.selected();
            if sel != Selected::Waiting {
                return sel;
            }
            if let Some(deadline) = deadline {
                if Instant::now() >= deadline {
                    return match self.try_select(Selected::Aborted) {
                        Ok(()) => Selected::Aborted,
                        Err(sel) => sel,
                    };
                }
            }
            self.inner.parker.park(deadline);
        }
    }

    /// Should this task spin before parking? (A thread: yes. A fiber: as its scheduler says.)
    #[inline]
    fn may_spin(&self) -> bool {
        match &self.inner.parker {
            Parker::Thread(_) => true,
            Parker::Task(task) => task.may_spin(),
        }
    }

    /// Parks the task directly (for `chan::local`, which keeps its own wake-up flag).
    #[inline]
    #[cfg_attr(loom, allow(dead_code))] // `chan::local` is left out of loom builds
    pub(crate) fn park(&self, deadline: Option<Instant>) {
        self.inner.parker.park(deadline);
    }

    /// The scheduler task running on this thread, if any, unless it is inside one of its own
    /// `Park` methods, where an operation acts as the thread's ([`Park`]). One thread-local
    /// load for a thread.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn current_task() -> Option<*const Context> {
        let task = CURRENT_TASK.get();
        if task.is_null() {
            return None;
        }
        // SAFETY: `TaskContext::run` installs a pointer to a `Context` it borrows for as long
        // as the pointer stays installed, and restores the previous value (even on unwind)
        // before that borrow ends; so a non-null pointer is live here.
        let inside = match &unsafe { &*task }.inner.parker {
            Parker::Task(parker) => parker.is_inside(),
            Parker::Thread(_) => false,
        };
        (!inside).then_some(task)
    }

    /// Wakes the task (after its claim word was set).
    #[inline]
    pub(crate) fn unpark(&self) {
        self.inner.parker.unpark();
    }
}

// ===== the current task =====

#[cfg(not(loom))]
thread_local! {
    /// The context of the task a scheduler is running on this thread; null: the thread itself.
    /// Const-initialised, so reading it is a single `%fs`-relative load.
    static CURRENT_TASK: std::cell::Cell<*const Context> = const { std::cell::Cell::new(std::ptr::null()) };

    /// This thread's own context, reused by its blocking operations (taken while in use).
    static THREAD_CONTEXT: std::cell::Cell<Option<Context>> = const { std::cell::Cell::new(None) };

    /// This thread's task id (0 until first asked).
    static THREAD_ID: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A fresh task id. Threads and scheduler tasks draw from one counter, so ids never collide.
/// (A plain std atomic: it hands out names, it synchronises nothing.)
fn next_task_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(DISCONNECTED + 1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(loom))]
fn current_thread_id() -> usize {
    let id = THREAD_ID.get();
    if id != 0 {
        return id;
    }
    let id = next_task_id();
    THREAD_ID.set(id);
    id
}

#[cfg(loom)]
fn current_thread_id() -> usize {
    // loom runs its model threads on one OS thread: name them by loom's thread id instead.
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    thread::current().id().hash(&mut h);
    h.finish() as usize
}

/// Runs `f` with the scheduler task running on this thread, if there is one and it is not
/// inside one of its own `Park` methods (an operation in there acts as the thread's: [`Park`]).
/// One thread-local load for a thread.
#[inline]
fn with_current_task<R>(f: impl FnOnce(Option<&TaskParker>) -> R) -> R {
    #[cfg(not(loom))]
    if let Some(cx) = Context::current_task() {
        // SAFETY: `current_task` returns only installed pointers, which are live.
        if let Parker::Task(task) = &unsafe { &*cx }.inner.parker {
            return f(Some(task));
        }
    }
    f(None)
}

/// Should the running task spin before parking? (A thread: yes. A fiber: as its scheduler
/// says.)
#[inline]
pub(crate) fn current_may_spin() -> bool {
    with_current_task(|task| task.is_none_or(TaskParker::may_spin))
}

/// May the running task yield its OS thread while it waits? (A thread: yes; a fiber: no.)
#[inline]
pub(crate) fn current_may_yield() -> bool {
    with_current_task(|task| task.is_none_or(TaskParker::may_yield_thread))
}

/// Steps aside while the caller waits for another task to finish a step it has begun (a
/// `Select` that took the caller's rendezvous and has yet to write, a sender between claiming
/// a slot and filling it): a fiber lets its scheduler run the others ([`Park::yield_now`]),
/// since the task it waits for may share its thread; a thread yields its CPU.
///
/// The yield goes through a clone of the task's context: the scheduler may drop or move the
/// task's `TaskContext` while the task is suspended, and the parker must outlive the call.
#[cold]
pub(crate) fn yield_current() {
    #[cfg(not(loom))]
    if let Some(cx) = Context::current_task() {
        // SAFETY: `current_task` returns only installed pointers, which are live now (the
        // clone keeps the task's parker alive past the suspension).
        let cx = unsafe { &*cx }.clone();
        if let Parker::Task(task) = &cx.inner.parker {
            task.yield_now();
            return;
        }
    }
    thread::yield_now();
}

/// The id of the running task, as stored in its contexts.
#[inline]
pub(crate) fn current_task_id() -> usize {
    #[cfg(not(loom))]
    if let Some(cx) = Context::current_task() {
        // SAFETY: `current_task` returns only installed pointers, which are live.
        return unsafe { &*cx }.task_id();
    }
    current_thread_id()
}

/// The waiting state of one scheduler task (a fiber): what a scheduler installs while it runs
/// the task so that channel operations park the task instead of the thread.
///
/// Create one per task and keep it with the task; run each slice of the task inside
/// [`run`](TaskContext::run):
///
/// ```
/// use courier::chan::{self, Park, TaskContext};
/// use std::time::Instant;
///
/// /// A stand-in "scheduler" whose tasks are threads: shows the seam, not a real fiber.
/// struct ByThread(std::thread::Thread);
/// impl Park for ByThread {
///     fn park(&self, _deadline: Option<Instant>) { std::thread::park() }
///     fn unpark(&self) { self.0.unpark() }
///     fn yield_now(&self) { std::thread::yield_now() }
/// }
///
/// let (tx, rx) = chan::bounded(1);
/// let task = TaskContext::new(ByThread(std::thread::current()));
/// let t = std::thread::spawn(move || tx.send(7).unwrap());
/// assert_eq!(task.run(|| rx.recv()), Ok(7));
/// t.join().unwrap();
/// ```
///
/// A `TaskContext` is `Send` (a task may move between threads) but not `Sync`: one task runs on
/// one thread at a time. A scheduler may move it, or keep it anywhere, between turns of its
/// task: an operation that blocks holds a handle of its own to the task's waiting state.
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<courier::chan::TaskContext>();
/// ```
pub struct TaskContext {
    #[cfg_attr(loom, allow(dead_code))] // `run` installs it, left out of loom builds
    cx: Context,
    /// Not `Sync`: one task runs on one thread at a time, and two threads running it at once
    /// would share one claim word between two operations.
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext").finish_non_exhaustive()
    }
}

impl TaskContext {
    /// The context of a task that sleeps and wakes through `parker`.
    pub fn new(parker: impl Park) -> TaskContext {
        TaskContext {
            cx: Context::new(
                Parker::Task(TaskParker::new(Box::new(parker))),
                next_task_id(),
            ),
            _not_sync: std::marker::PhantomData,
        }
    }

    /// Runs `f` as this task: channel operations that block inside `f` park through this
    /// task's [`Park`] instead of parking the thread. Nests; restores the previous task on
    /// return and on unwind.
    ///
    /// A nested `run` whose `f` suspends the fiber (its scheduler's turn ends, and the next
    /// turn installs the task its scheduler runs it as) continues after the suspension as that
    /// task, and on return leaves it installed: the task it would have restored belonged to a
    /// turn that is over.
    #[cfg(not(loom))]
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Puts the previous task back, unless another `run` has installed its own since (the
        /// fiber was suspended inside `f` and resumed in another turn, maybe on another
        /// thread: the previous pointer may name a context that is gone).
        struct Restore {
            previous: *const Context,
            mine: *const Context,
        }
        impl Drop for Restore {
            fn drop(&mut self) {
                if std::ptr::eq(CURRENT_TASK.get(), self.mine) {
                    CURRENT_TASK.set(self.previous);
                }
            }
        }
        let mine: *const Context = &self.cx;
        let _restore = Restore {
            previous: CURRENT_TASK.replace(mine),
            mine,
        };
        f()
    }
}

// ===== wait lists =====

/// One registered operation of one task.
pub(crate) struct Entry {
    /// Which of the task's operations this is.
    pub(crate) oper: Operation,
    /// Rendezvous hand-off packet (null for buffered flavors).
    pub(crate) packet: *mut (),
    /// The waiting task.
    pub(crate) cx: Context,
}

/// The tasks waiting on one side of one channel. Not synchronised: see [`SyncWaitList`], or the
/// rendezvous flavor's lock.
pub(crate) struct WaitList {
    entries: Vec<Entry>,
    /// `Select::ready` callers watching this side: woken by every change that may make it
    /// ready, never handed an operation (so they take no wake-up from `entries`).
    observers: Vec<Entry>,
}

impl WaitList {
    pub(crate) const fn new() -> WaitList {
        WaitList {
            entries: Vec::new(),
            observers: Vec::new(),
        }
    }

    /// Adds an observer: `cx` is claimed for `oper` at the next change of this side.
    pub(crate) fn watch(&mut self, oper: Operation, cx: &Context) {
        self.observers.push(Entry {
            oper,
            packet: std::ptr::null_mut(),
            cx: cx.clone(),
        });
    }

    /// Removes the observer of `oper`, if no change has woken it yet.
    pub(crate) fn unwatch(&mut self, oper: Operation) {
        if let Some(i) = self.observers.iter().position(|e| e.oper == oper) {
            self.observers.remove(i);
        }
    }

    /// Claims every observer for its operation and removes it; the caller unparks the returned
    /// contexts (after releasing any lock). Allocates nothing when nobody watches.
    pub(crate) fn take_observers(&mut self) -> Vec<Context> {
        if self.observers.is_empty() {
            return Vec::new();
        }
        self.observers
            .drain(..)
            .filter(|e| e.cx.try_select(Selected::Operation(e.oper)).is_ok())
            .map(|e| e.cx)
            .collect()
    }

    #[inline]
    pub(crate) fn register(&mut self, oper: Operation, cx: &Context) {
        self.register_with_packet(oper, std::ptr::null_mut(), cx);
    }

    #[inline]
    pub(crate) fn register_with_packet(&mut self, oper: Operation, packet: *mut (), cx: &Context) {
        self.entries.push(Entry {
            oper,
            packet,
            cx: cx.clone(),
        });
    }

    /// Removes the entry of `oper`, if a peer has not already taken it.
    pub(crate) fn unregister(&mut self, oper: Operation) -> Option<Entry> {
        let i = self.entries.iter().position(|e| e.oper == oper)?;
        Some(self.entries.remove(i))
    }

    /// Claims the first (oldest) waiting entry of another task for its operation, removes it and
    /// returns it, packet address stored; the caller unparks `entry.cx` once it has done its
    /// part (and released any lock).
    pub(crate) fn try_select(&mut self) -> Option<Entry> {
        if self.entries.is_empty() {
            return None;
        }
        let me = current_task_id();
        let i = self.entries.iter().position(|e| {
            e.cx.task_id() != me && e.cx.try_select(Selected::Operation(e.oper)).is_ok()
        })?;
        let entry = self.entries.remove(i);
        entry.cx.store_packet(entry.packet);
        Some(entry)
    }

    /// Claims every waiting entry for its operation, and every observer, and removes them; the
    /// caller unparks the returned contexts. For a change that lets every waiter proceed, each
    /// to find out for itself what it gets (a oneshot's message: one takes it, the others find
    /// it taken).
    pub(crate) fn select_all(&mut self) -> Vec<Context> {
        let mut woken: Vec<Context> = self
            .entries
            .drain(..)
            .filter(|e| e.cx.try_select(Selected::Operation(e.oper)).is_ok())
            .map(|e| e.cx)
            .collect();
        woken.extend(self.take_observers());
        woken
    }

    /// Is there a waiting entry of another task that `try_select` could claim?
    pub(crate) fn can_select(&self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let me = current_task_id();
        self.entries
            .iter()
            .any(|e| e.cx.task_id() != me && e.cx.selected() == Selected::Waiting)
    }

    /// Claims every entry with `Disconnected` and returns the contexts to unpark. The entries
    /// stay: each owner unregisters its own.
    pub(crate) fn disconnect(&mut self) -> Vec<Context> {
        self.entries
            .iter()
            .chain(&self.observers)
            .filter(|e| e.cx.try_select(Selected::Disconnected).is_ok())
            .map(|e| e.cx.clone())
            .collect()
    }

    /// Nobody waits or watches.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.observers.is_empty()
    }
}

/// A [`WaitList`] behind its own lock, with an `is_empty` hint read without the lock, so that
/// the fast path of a buffered channel pays one fence and one load to learn nobody waits
/// (crossbeam's `SyncWaker`). The lock is only taken by tasks that block and by their wakers.
pub(crate) struct SyncWaitList<P: PollerCell = CachePadded<Pollers>> {
    list: Mutex<WaitList>,
    is_empty: AtomicBool,
    /// The other side has disconnected: for waiters that poll something else than the
    /// channel's state (the unbounded flavor's receivers that claimed ahead). Beside
    /// `is_empty`, on a line peers read and rarely write.
    disconnected: AtomicBool,
    /// What this side's polling waiters share (the spin estimate). A channel keeps it on a line
    /// of its own: waiters write it as they learn, while every peer's fast path reads
    /// `is_empty`.
    pollers: P,
}

/// Where a [`SyncWaitList`] keeps its [`Pollers`]: on a cache line of their own
/// (`CachePadded`, for channels: waiters write the spin estimate while every peer's fast path
/// reads `is_empty`; when this line also held a pollers count written at every wait, moving it
/// off `is_empty`'s line took `spsc` over `bounded(1)` with pinned threads from 253-281 to
/// 204-222 ns a message) or inline (a oneshot, whose receiver polls without a spin estimate:
/// padding would quadruple its allocation for nothing).
pub(crate) trait PollerCell {
    fn new() -> Self;
    fn get(&self) -> &Pollers;
}

impl PollerCell for Pollers {
    fn new() -> Self {
        Pollers::new()
    }
    #[inline]
    fn get(&self) -> &Pollers {
        self
    }
}

impl PollerCell for CachePadded<Pollers> {
    fn new() -> Self {
        CachePadded::new(Pollers::new())
    }
    #[inline]
    fn get(&self) -> &Pollers {
        self
    }
}

impl<P: PollerCell> SyncWaitList<P> {
    pub(crate) fn new() -> SyncWaitList<P> {
        SyncWaitList {
            list: Mutex::new(WaitList::new()),
            is_empty: AtomicBool::new(true),
            disconnected: AtomicBool::new(false),
            pollers: P::new(),
        }
    }

    /// Retries `attempt` while the caller polls before it parks (`backoff::spin_then_yield`):
    /// `None` if the poll ran out (or `deadline` passed).
    #[inline]
    pub(crate) fn poll<R>(
        &self,
        deadline: Option<Instant>,
        attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        spin_then_yield(current_may_spin(), current_may_yield(), deadline, attempt)
    }

    /// Like [`poll`](Self::poll), but a thread first spins for as long as spinning has been
    /// paying on this side (`backoff::SpinEstimate`).
    ///
    /// For the buffered flavors' waiters (but capacity one's, which poll registered: [`spin`](
    /// Self::spin)). On the bounded one the peer that makes a waiter ready
    /// is often a poller running on the other CPU, and catching its move without a
    /// `sched_yield` took `mpmc_bounded1` from 1.5-1.8 µs to 0.85-1.37 µs a message
    /// (BENCHMARKS.md, "ring and chan", session 4). The unbounded flavor's receivers first
    /// polled without it (its rings of 4 and 16 threads had looked 20-25% slower with a fixed
    /// spin); with the adaptive spin they gain where a sender runs on the other CPU (the ring
    /// of two, pinned: 112-117 -> 87-95 ns a message) and lose nothing measurable in the larger
    /// rings (session 9).
    #[inline]
    pub(crate) fn poll_spinning_first<R>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        self.spin(&mut attempt)
            .or_else(|| spin_then_yield(current_may_spin(), current_may_yield(), deadline, attempt))
    }

    /// A thread spins on `attempt` for as long as spinning has been paying on this side
    /// (`backoff::SpinEstimate`); `None` if the spin ran out, or at once for a fiber (whose
    /// spin, if its scheduler allows one, comes when it waits).
    ///
    /// For the waiters of a capacity-one channel, which then register and poll their claim
    /// word ([`park_unless`](Self::park_unless) with `poll_claim`), not the channel.
    #[inline]
    pub(crate) fn spin<R>(&self, attempt: &mut impl FnMut() -> Option<R>) -> Option<R> {
        if current_may_yield() {
            spin_adaptively(self.pollers.get().spin(), attempt)
        } else {
            None
        }
    }

    /// Like [`poll`](Self::poll), but a thread polls only briefly, spinning then yielding four
    /// times (`Backoff`: crossbeam's schedule, ~4 µs here), before it parks.
    ///
    /// For the receivers of a bounded channel with room for more than one message, where a
    /// waiting receiver usually waits for senders that do not wait for it: polling between
    /// yields for 50 µs kept such a receiver right behind the sender, fighting it for every
    /// slot's line, while one that parks is woken once and then trails the sender. `chan --full
    /// --case spsc_boundedN` (a million messages), three rounds each: 17-20 -> 12-13 ns a
    /// message (crossbeam 14.5-15.4); `mpsc_boundedN` and `mpmc_boundedN` unchanged within
    /// their noise (session 9, BENCHMARKS.md). Capacity one polls longer, registered: there the
    /// sender waits for the receiver as much as the other way round.
    #[inline]
    pub(crate) fn poll_briefly<R>(
        &self,
        deadline: Option<Instant>,
        mut attempt: impl FnMut() -> Option<R>,
    ) -> Option<R> {
        if cfg!(loom) || !current_may_yield() {
            return spin_then_yield(current_may_spin(), false, deadline, attempt);
        }
        let mut backoff = Backoff::new();
        loop {
            backoff.snooze();
            if let Some(r) = attempt() {
                return Some(r);
            }
            if backoff.is_completed() || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
        }
    }

    /// Registers `oper`. The caller then re-checks the channel and aborts the wait if it is
    /// ready (step 2 of the protocol).
    pub(crate) fn register(&self, oper: Operation, cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.register(oper, cx);
        // SYNC POINT: waiter side of a Dekker pair: [store `is_empty = false` (SeqCst); caller
        // re-checks the channel with SeqCst loads] against the notifier's [change the channel
        // with a SeqCst RMW (the head/tail CAS); load `is_empty` (SeqCst)]. All four are in the
        // single SeqCst order, so at least one side sees the other's write: no lost wake-up.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Steps 1-3 of the protocol for a waiter that a peer only has to wake (a receiver of a
    /// buffered channel or a oneshot): registers `oper`, re-checks with `ready` (SeqCst loads:
    /// the waiter's half of the Dekker pair in [`register`](Self::register)) and aborts the
    /// wait if the side is ready after all, then parks until a peer claims the wait, the
    /// channel is disconnected or `deadline` passes; unregisters unless a peer took the entry.
    /// The caller then retries its operation. With `poll_claim`, the task polls its claim word
    /// (`backoff::spin_then_yield`) before it parks, as a rendezvous waiter does.
    pub(crate) fn park_unless(
        &self,
        oper: Operation,
        deadline: Option<Instant>,
        poll_claim: bool,
        ready: impl FnOnce() -> bool,
    ) {
        Context::with(|cx| {
            self.register(oper, cx);
            if ready() {
                let _ = cx.try_select(Selected::Aborted);
            }
            match cx.wait_until(deadline, poll_claim) {
                Selected::Aborted | Selected::Disconnected => {
                    self.unregister(oper);
                }
                Selected::Operation(_) | Selected::Waiting => {}
            }
        });
    }

    /// Removes `oper` if a peer did not already take it.
    pub(crate) fn unregister(&self, oper: Operation) -> Option<Entry> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let entry = list.unregister(oper);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        entry
    }

    /// Wakes one waiting task, if any. Called after every change that may let a waiter proceed.
    #[inline]
    pub(crate) fn notify(&self) {
        // SYNC POINT: notifier side of the Dekker pair; partner: the SeqCst store in `register`.
        // The caller changed the channel with a SeqCst RMW before (x86: this load is a plain
        // `mov`, no fence on the fast path).
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_slow();
        }
    }

    /// Like [`notify`](Self::notify), and runs `help` on the claimed entry before waking its
    /// task (outside the lock): the bounded flavor uses it to move a blocked sender's message
    /// into the slot that just freed up.
    #[inline]
    pub(crate) fn notify_with(&self, help: impl FnOnce(&Entry)) {
        // SYNC POINT: as in `notify`.
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_slow_with(help);
        }
    }

    #[cold]
    fn notify_slow(&self) {
        self.notify_slow_with(|_| {});
    }

    #[cold]
    fn notify_slow_with(&self, help: impl FnOnce(&Entry)) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let entry = list.try_select();
        let observers = list.take_observers();
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        drop(list);
        if let Some(entry) = entry {
            help(&entry);
            entry.cx.unpark();
        }
        for cx in observers {
            cx.unpark();
        }
    }

    /// Wakes every waiting task and watcher (see [`WaitList::select_all`]), after a change the
    /// caller made with a SeqCst RMW, as for [`notify`](Self::notify).
    pub(crate) fn notify_all(&self) {
        // SYNC POINT: as in `notify`.
        loom_seqcst_fence();
        if !self.is_empty.load(Ordering::SeqCst) {
            self.notify_all_slow();
        }
    }

    #[cold]
    fn notify_all_slow(&self) {
        self.wake_claimed(WaitList::select_all);
    }

    /// Claims entries with `claim` under the lock, then unparks the claimed tasks after it.
    fn wake_claimed(&self, claim: impl FnOnce(&mut WaitList) -> Vec<Context>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let woken = claim(&mut list);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
        drop(list);
        for cx in woken {
            cx.unpark();
        }
    }

    /// Adds an observer (`Select::ready`). The caller then re-checks the side, as after
    /// [`register`](Self::register), and the same Dekker pair keeps the change from being
    /// missed.
    pub(crate) fn watch(&self, oper: Operation, cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.watch(oper, cx);
        // SYNC POINT: as in `register`.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Removes the observer of `oper`, if no change woke it.
    pub(crate) fn unwatch(&self, oper: Operation) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.unwatch(oper);
        self.is_empty.store(list.is_empty(), Ordering::SeqCst);
    }

    /// Registers `oper` with a hand-off packet (see [`notify_with`](Self::notify_with)).
    pub(crate) fn register_with_packet(&self, oper: Operation, packet: *mut (), cx: &Context) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.register_with_packet(oper, packet, cx);
        // SYNC POINT: as in `register`.
        self.is_empty.store(false, Ordering::SeqCst);
        drop(list);
        loom_seqcst_fence();
    }

    /// Wakes every waiting task with `Disconnected`. Takes the lock unconditionally: the caller
    /// marked the channel disconnected with an RMW before, and a task that registers after this
    /// lock sees the mark in its re-check.
    pub(crate) fn disconnect(&self) {
        // SYNC POINT: partner: the Acquire load in `is_disconnected` (after the channel's own
        // disconnect mark, which this makes visible to that reader).
        self.disconnected.store(true, Ordering::Release);
        self.wake_claimed(WaitList::disconnect);
    }

    /// Has [`disconnect`](Self::disconnect) been called? (A read of a line peers rarely write.)
    #[inline]
    pub(crate) fn is_disconnected(&self) -> bool {
        // SYNC POINT: partner: the Release store in `disconnect`.
        self.disconnected.load(Ordering::Acquire)
    }
}

/// loom treats SeqCst loads and stores as AcqRel (its README, "Unsupported features"), which
/// would let the models lose wake-ups the SeqCst order forbids; a SeqCst fence, which loom does
/// model, restores that order in the models. Real builds rely on the SeqCst accesses alone.
#[inline(always)]
pub(crate) fn loom_seqcst_fence() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

impl<P: PollerCell> Drop for SyncWaitList<P> {
    fn drop(&mut self) {
        debug_assert!(self.list.get_mut().map(|l| l.is_empty()).unwrap_or(true));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reuses_its_context_and_a_nested_operation_gets_another() {
        std::thread::spawn(|| {
            let address = |cx: &Context| Arc::as_ptr(&cx.inner) as usize;
            let first = Context::with(address);
            assert_eq!(Context::with(address), first, "cached after the first use");
            Context::with(|outer| {
                assert_eq!(address(outer), first);
                assert_ne!(Context::with(address), first, "the cached one is in use");
            });
            assert_eq!(Context::with(address), first, "the outer one is kept");
        })
        .join()
        .unwrap();
    }
}
