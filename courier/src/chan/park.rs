//! How a blocked task sleeps and is woken: an OS thread (built in), or a task of a scheduler
//! through the [`Park`] seam.
//!
//! Every blocking operation of `chan` ends in [`Parker::park`], an enum with two cases: a thread
//! (`std::thread::park`, statically dispatched), or a task that a scheduler supplies through the
//! [`Park`] trait (for a fiber: park = switch to the scheduler, unpark = push the fiber on its
//! home run queue). The channel code never names either case: it takes the current task's
//! [`Context`](super::context::Context), whose parker does the rest.
//!
//! # Implementing the seam
//!
//! A scheduler (a fiber runtime, in `crate::fiber` or outside the crate) needs only the two
//! public items of the seam:
//!
//! 1. it implements [`Park`] for a handle of one of its tasks, keeping the contract written on
//!    the trait;
//! 2. it wraps that handle in a [`TaskContext`](super::TaskContext) once per task, and runs every
//!    slice of the task inside [`TaskContext::run`](super::TaskContext::run), which installs the
//!    task as the thread's current one.
//!
//! `chan` never imports the scheduler: the dependency points from the scheduler to `chan`.
//! `tests/common/fibers.rs` is the smallest scheduler that keeps the contract (stackful
//! coroutines on one thread), and `tests/chan_fibers.rs` runs every flavor under it.

use std::time::Instant;

use crate::sync::thread;

/// How a task other than an OS thread sleeps and is woken: the interface a fiber scheduler
/// implements so that `chan` can block its fibers (threads are built in).
///
/// A scheduler implements it for a handle of one task and hands that to
/// [`TaskContext::new`](super::TaskContext::new); from then on every channel operation that
/// blocks inside [`TaskContext::run`](super::TaskContext::run) calls these methods instead of
/// parking the thread (the example on [`TaskContext`](super::TaskContext) shows the whole seam).
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
    /// fiber waits for may be one of them, and cannot run while it spins. Asked before every
    /// attempt of the spin, so that a task woken meanwhile (from another thread) stops it.
    fn may_spin(&self) -> bool {
        true
    }
}

/// How late Linux may end a timed sleep of a thread that has not changed its timer slack
/// (`PR_SET_TIMERSLACK`; 50 µs by default): a `recv_timeout(10 µs)` on a bounded channel that
/// parked returned after 65 µs (crossbeam-channel's after 70; `courier-bench/examples/
/// wait_ends.rs` measures both). A wait with less than this left polls between yields instead
/// of sleeping.
const TIMER_SLACK: std::time::Duration = std::time::Duration::from_micros(50);

/// Who sleeps when a channel operation blocks.
pub(crate) enum Parker {
    /// An OS thread: `std::thread::park` / `Thread::unpark` (futex-based, keeps a token).
    Thread(thread::Thread),
    /// A task of a scheduler (a fiber), through the [`Park`] seam.
    Task(TaskParker),
    /// No one: a context of the crate's fibers kept for the next fiber, between the finish of
    /// one and the spawn of the next (never installed as a task's, and named by no wait-list
    /// entry: see `SpareContext`).
    Spare,
}

/// A scheduler task's [`Park`], and whether the task is inside one of the methods it runs
/// itself (`park`, `yield_now`). Every call aborts the process if it unwinds (see [`Park`]).
pub(crate) struct TaskParker {
    /// Shared, so that a scheduler's task may be its own `Park` (a fiber's control block,
    /// which the scheduler holds by `Arc` anyway) with no allocation of its own.
    park: std::sync::Arc<dyn Park>,
    /// Set while the task runs `park` or `yield_now`: a channel operation in there is the
    /// scheduler's own, and acts as the thread's
    /// ([`Context::current_task`](super::context::Context::current_task) leaves the task out).
    /// Only the thread that runs the task touches it (a plain std atomic: it orders nothing).
    inside: std::sync::atomic::AtomicBool,
    /// Does `unpark` only queue the task, never running it before it returns? Known of the
    /// crate's own fibers; a scheduler outside the crate may do either.
    queues_only: bool,
}

impl TaskParker {
    pub(super) fn new(park: std::sync::Arc<dyn Park>, queues_only: bool) -> TaskParker {
        TaskParker {
            park,
            inside: std::sync::atomic::AtomicBool::new(false),
            queues_only,
        }
    }

    /// The task's `Park`.
    pub(super) fn into_park(self) -> std::sync::Arc<dyn Park> {
        self.park
    }

    /// Runs one of the methods the task calls on itself, marked as inside.
    fn run_inside<R>(&self, f: impl FnOnce(&dyn Park) -> R) -> R {
        use std::sync::atomic::Ordering::Relaxed;
        // Only the task's own thread touches the flag: a load and a store, not a locked swap.
        let was_inside = self.inside.load(Relaxed);
        self.inside.store(true, Relaxed);
        let out = no_unwind(|| f(&*self.park));
        self.inside.store(was_inside, Relaxed);
        out
    }

    fn park(&self, deadline: Option<Instant>) {
        self.run_inside(|park| park.park(deadline));
    }

    /// Lets the scheduler's other ready tasks run.
    #[cfg_attr(loom, allow(dead_code))] // reached through `CURRENT_TASK`, left out of loom builds
    pub(super) fn yield_now(&self) {
        self.run_inside(|park| park.yield_now());
    }

    /// Called by peers, from any thread: not "inside".
    fn unpark(&self) {
        no_unwind(|| self.park.unpark());
    }

    pub(super) fn may_yield_thread(&self) -> bool {
        no_unwind(|| self.park.may_yield_thread())
    }

    pub(super) fn may_spin(&self) -> bool {
        no_unwind(|| self.park.may_spin())
    }

    /// Does `unpark` only queue the task (one of the crate's fibers)?
    #[cfg_attr(loom, allow(dead_code))] // asked through `CURRENT_TASK`, left out of loom builds
    pub(super) fn queues_only(&self) -> bool {
        self.queues_only
    }

    /// Is the task running one of its own `Park` methods?
    #[cfg_attr(loom, allow(dead_code))] // read through `CURRENT_TASK`, left out of loom builds
    pub(super) fn is_inside(&self) -> bool {
        self.inside.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Parker {
    /// Sleeps until [`unpark`](Self::unpark), `deadline`, or spuriously: the caller re-checks
    /// its claim word and comes back.
    #[inline]
    pub(super) fn park(&self, deadline: Option<Instant>) {
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
            // (A spurious return: the caller re-checks.)
            Parker::Spare => {}
        }
    }

    #[inline]
    pub(super) fn unpark(&self) {
        match self {
            Parker::Thread(thread) => thread.unpark(),
            Parker::Task(task) => task.unpark(),
            Parker::Spare => {}
        }
    }

    /// Does `unpark` return before the woken task runs again? (A thread: it runs beside the
    /// waker, but no thread parks on a `chan::local` channel, the only one that asks.)
    #[inline]
    pub(super) fn unpark_only_queues(&self) -> bool {
        match self {
            Parker::Thread(_) => true,
            Parker::Task(task) => task.queues_only,
            Parker::Spare => true,
        }
    }

    /// May the task yield its OS thread while it waits? (A thread: yes; a fiber: no.)
    #[inline]
    pub(super) fn may_yield_thread(&self) -> bool {
        match self {
            Parker::Thread(_) => true,
            Parker::Task(task) => task.may_yield_thread(),
            Parker::Spare => true,
        }
    }

    /// Should the task spin before parking? (A thread: yes. A fiber: as its scheduler says.)
    #[inline]
    pub(super) fn may_spin(&self) -> bool {
        match self {
            Parker::Thread(_) => true,
            Parker::Task(task) => task.may_spin(),
            Parker::Spare => true,
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
