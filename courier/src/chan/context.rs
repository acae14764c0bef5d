//! The waiting state of one task, and which task runs on this thread.
//!
//! A blocked operation waits on one [`Context`]: a claim word ([`Selected`]), a hand-off slot for
//! a rendezvous packet, and the task's [`Parker`]. The channel code asks for "the current
//! context" ([`Context::with`]), which is **one thread-local load** of the pointer a scheduler
//! installs with [`TaskContext::run`] when it resumes a fiber (as the NetBSD rump kernel inlines
//! its `curlwp`), and falls back to the thread's own cached context when that pointer is null.
//!
//! A context is reference counted (`Arc`): the waker holds a clone, so it may unpark a task that
//! already saw its claim and returned (the unpark is then a spurious wake-up of its *next* wait,
//! which re-checks its claim word and parks again).
//!
//! This is crossbeam-channel's `Context` (`crossbeam-channel/src/context.rs`), written here for
//! tasks that are threads *or* fibers.
#![allow(unsafe_code)]

use std::fmt;
use std::time::Instant;

use super::backoff::{spin_then_yield, Backoff};
use super::park::{Park, Parker, TaskParker};
use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use crate::sync::{thread, Arc};

// ===== Selected, Operation =====

/// Identifies one operation of one blocked task: the address of something the task keeps alive
/// (and in place) while it is registered, so two live operations never share an id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
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
        // The thread keeps its context between operations: allocating and freeing one per
        // blocking operation costs ~175 instructions of a rendezvous ring's ~700 a hop. It is
        // taken out of its cell while in use, so a nested blocking operation (a `Drop` that
        // blocks, say) gets a fresh one instead of sharing it.
        let cx = match THREAD_CONTEXT.try_with(|cell| cell.take()) {
            Ok(Some(cx)) => cx,
            // The first operation of this thread, or one nested in another (which holds the
            // cached context).
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

    /// The context as a pointer that owns one reference (for a waiter kept in an atomic word).
    #[cfg_attr(loom, allow(dead_code))] // its caller (the fiber runtime) is left out of loom
    pub(crate) fn into_raw(self) -> *const () {
        Arc::into_raw(self.inner).cast()
    }

    /// The context a pointer from [`into_raw`](Self::into_raw) owns.
    ///
    /// # Safety
    /// `raw` came from `into_raw`, and its reference is taken over once.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) unsafe fn from_raw(raw: *const ()) -> Context {
        Context {
            // SAFETY: the caller's contract: an `Arc<Inner>` pointer with one reference.
            inner: unsafe { Arc::from_raw(raw.cast::<Inner>()) },
        }
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
            let claimed = spin_then_yield(
                || self.may_spin(),
                self.may_yield_thread(),
                deadline,
                || {
                    let sel = self.selected();
                    (sel != Selected::Waiting).then_some(sel)
                },
            );
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
        self.inner.parker.may_spin()
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
            Parker::Thread(_) | Parker::Spare => false,
        };
        (!inside).then_some(task)
    }

    /// Whether the running task is one of the crate's fibers (a
    /// `TaskContext::shared`, whose `unpark` only queues it), and not a
    /// thread, nor a task of another scheduler run inside a fiber.
    #[cfg(not(loom))]
    pub(crate) fn current_is_fiber() -> bool {
        // SAFETY: `current_task` returns only installed pointers, which are live now.
        Context::current_task().is_some_and(|task| unsafe { &*task }.stays_in_place())
    }

    /// loom builds have no scheduler tasks.
    #[cfg(loom)]
    pub(crate) fn current_is_fiber() -> bool {
        false
    }

    /// Does this context stay at its address until its task finishes? (The context of one of
    /// the crate's fibers, kept in its control block: see [`TaskContext::shared`].)
    #[inline]
    #[cfg_attr(loom, allow(dead_code))] // `chan::local` is left out of loom builds
    pub(crate) fn stays_in_place(&self) -> bool {
        matches!(&self.inner.parker, Parker::Task(parker) if parker.queues_only())
    }

    /// Wakes the task (after its claim word was set).
    #[inline]
    pub(crate) fn unpark(&self) {
        self.inner.parker.unpark();
    }

    /// Does [`unpark`](Self::unpark) return before the task runs again?
    #[inline]
    #[cfg_attr(loom, allow(dead_code))] // `chan::local` is left out of loom builds
    pub(crate) fn unpark_only_queues(&self) -> bool {
        self.inner.parker.unpark_only_queues()
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

/// Sleeps the running task until `deadline` (for ever without one), through its context: a
/// fiber parks through its scheduler (a thread sleeping here would stall the scheduler), a
/// thread parks with a timeout. For waits that nothing but the clock can end: an empty select,
/// and the timer flavors (`at`, `tick`, `never`).
pub(crate) fn sleep_until(deadline: Option<Instant>) {
    Context::with(|cx| {
        cx.wait_until(deadline, false);
    });
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

// ===== TaskContext: the scheduler's side of the seam =====

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
    #[cfg_attr(loom, allow(dead_code))] // installed by `run`, except under loom (no current task)
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

/// A context of the crate's fibers between two fibers ([`TaskContext::into_spare`]): its
/// allocation and its task id, counted by nothing else, with no `Park`.
pub(crate) struct SpareContext(Arc<Inner>);

/// The context, to reset, if `inner` is its only count (`Arc::get_mut` without its locked
/// compare-exchange: one each way a fiber's context is reused).
#[cfg(not(loom))]
fn unique(inner: &mut Arc<Inner>) -> Option<&mut Inner> {
    // SAFETY: no `Weak` of a context is ever made; the only pointers to one holding no count
    // (`chan::local`'s in-place waiters, the installed current task) live only while its fiber
    // waits or runs, never when its context is made or let go (before it starts, after it ends).
    unsafe { crate::sync::unique_arc(inner) }
}

/// loom's `Arc` checks uniqueness itself.
#[cfg(loom)]
fn unique(inner: &mut Arc<Inner>) -> Option<&mut Inner> {
    Arc::get_mut(inner)
}

impl TaskContext {
    /// The context of a task that sleeps and wakes through `parker`.
    pub fn new(parker: impl Park) -> TaskContext {
        TaskContext::with_parker(std::sync::Arc::new(parker), false)
    }

    /// The context of one of the crate's fibers, which is its own `Park` (its control block,
    /// shared), whose `unpark` only queues it, and which keeps the context in place (in its
    /// control block) until it finishes.
    pub(crate) fn shared(parker: std::sync::Arc<dyn Park>) -> TaskContext {
        TaskContext::with_parker(parker, true)
    }

    /// [`shared`](Self::shared), in the allocation of a context an earlier fiber let go
    /// ([`into_spare`](Self::into_spare)), whose task id it keeps.
    #[inline(always)]
    pub(crate) fn shared_from(
        spare: SpareContext,
        parker: std::sync::Arc<dyn Park>,
    ) -> TaskContext {
        let mut inner = spare.0;
        match unique(&mut inner) {
            Some(slot) => {
                slot.parker = Parker::Task(TaskParker::new(parker, true));
                TaskContext {
                    cx: Context { inner },
                    _not_sync: std::marker::PhantomData,
                }
            }
            // (Not reached: a spare is counted once, by itself.)
            None => TaskContext::shared(parker),
        }
    }

    /// Lets go of the task's `Park` (returned) and keeps the context's allocation for a next
    /// fiber of the crate's own, if nothing else counts the context any more (no wait-list
    /// entry names it: its task has finished, and every operation it began is over). `Err`:
    /// it is still counted elsewhere, and is handed back.
    #[inline(always)]
    pub(crate) fn into_spare(
        self,
    ) -> Result<(SpareContext, std::sync::Arc<dyn Park>), TaskContext> {
        let mut inner = self.cx.inner;
        let Some(slot) = unique(&mut inner) else {
            return Err(TaskContext {
                cx: Context { inner },
                _not_sync: std::marker::PhantomData,
            });
        };
        let Parker::Task(task) = std::mem::replace(&mut slot.parker, Parker::Spare) else {
            unreachable!("a fiber's context parks through its `Park`")
        };
        // (Stores through a unique reference: nothing else sees them.)
        slot.select.store(WAITING, Ordering::Relaxed);
        slot.packet.store(std::ptr::null_mut(), Ordering::Relaxed);
        *slot.busy.get_mut() = false;
        Ok((SpareContext(inner), task.into_park()))
    }

    fn with_parker(parker: std::sync::Arc<dyn Park>, queues_only: bool) -> TaskContext {
        TaskContext {
            cx: Context::new(
                Parker::Task(TaskParker::new(parker, queues_only)),
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

    /// [`run`](Self::run) for a turn of the crate's fiber scheduler, on its worker thread,
    /// where no task is installed: installs this task for `f`, and none after it (what the
    /// fiber left installed if it suspended inside a nested `run` included). A turn cannot
    /// unwind (a fiber's panic is caught on its own stack), so nothing is restored on unwind.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn run_turn<R>(&self, f: impl FnOnce() -> R) -> R {
        CURRENT_TASK.set(&self.cx);
        let out = f();
        CURRENT_TASK.set(std::ptr::null());
        out
    }

    /// loom models have no scheduler tasks (nor the thread-local that names the current one):
    /// `f` runs as the thread, so that a scheduler still builds under `--cfg loom`.
    #[cfg(loom)]
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }

    /// As [`run`](Self::run) under loom.
    #[cfg(loom)]
    pub(crate) fn run_turn<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
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
