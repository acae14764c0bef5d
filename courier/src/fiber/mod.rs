//! Fibers: stackful tasks on pooled stacks, run by a work-stealing runtime,
//! that `courier::chan` parks and wakes as it does threads.
//!
//! A fiber is a closure with a stack of its own (64 KiB by default, from a
//! pool: see "Stacks" below) that a worker thread runs until it blocks. A
//! channel operation that must wait, a [`sleep`], a [`JoinHandle::join`]
//! suspend the fiber, not its worker, which runs the next ready fiber; the
//! peer that makes it ready puts it back on a run queue. So one program can
//! run a fiber per message, per connection or per child process without an
//! OS thread each.
//!
//! ```
//! use courier::{chan, fiber};
//!
//! let rt = fiber::Runtime::new().unwrap();
//! let total = rt.block_on(|| {
//!     let (tx, rx) = chan::bounded(16);
//!     for i in 0..100u64 {
//!         let tx = tx.clone();
//!         fiber::spawn(move || tx.send(i).unwrap());
//!     }
//!     drop(tx);
//!     rx.iter().sum::<u64>()
//! });
//! assert_eq!(total, 4950);
//! ```
//!
//! # The runtime
//! [`Runtime`] starts its worker threads ([`RuntimeBuilder::workers`], by
//! default one per CPU); each has a run queue, and an idle worker steals from
//! the others, so a fiber that never blocks holds one worker and no more.
//! [`Runtime::block_on`] runs a closure as a fiber and waits for it from the
//! calling thread; [`spawn`] (inside a fiber) and [`Runtime::spawn`]
//! (anywhere) start more. [`spawn_local`] makes a fiber pinned to the
//! calling worker, whose closure need not be `Send`: fibers of one worker
//! share `chan::local` channels, which have no atomics at all.
//!
//! A fiber that is not pinned may resume on another worker after it blocks:
//! it must not hold a reference into a thread-local across a blocking call.
//!
//! # Panics
//! A panic inside a fiber is caught on its own stack (nothing unwinds across
//! a switch) and returned by [`JoinHandle::join`], as a thread's is.
//!
//! # Stacks
//! Stacks come from a pool, after Ruby's fiber pool (Ruby feature #15997):
//! one mapping holds many stacks, each above a guard page; mappings grow
//! geometrically (8, 16, 32 ... stacks); a finished fiber's stack goes on a
//! LIFO free list, still warm; and the free stacks past a high-water mark
//! (4,096) are unmapped, memory and map entries both. A stack overflow hits
//! the guard page and is reported as `fiber <name> overflowed its <N> KiB
//! stack` before the process aborts. Each stack costs two entries of the
//! kernel's `vm.max_map_count` (65,530 by default): about 32,000 fibers fit
//! at the default; a spawn past
//! it fails with an error that says so, and a million fibers need
//! `sysctl -w vm.max_map_count=2100000`.

pub(crate) mod affinity;
mod blocking;
mod join;
pub mod net;
mod reactor;
mod sched;
mod stack;
mod state;

use std::io;
use std::marker::PhantomData;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::chan::oneshot;
pub(crate) use reactor::Interest;
pub(crate) use reactor::Registration;

/// The default size of a fiber's stack: room for ordinary code (formatting,
/// serde, a few KiB of buffers on the stack), and a million of them fit in
/// the address space with room to spare (only touched pages are resident).
pub const DEFAULT_STACK_SIZE: usize = 64 << 10;

/// A set of worker threads that run fibers. Dropping it stops the workers
/// once no fiber is ready to run (fibers parked then stay parked, and their
/// memory is not reclaimed, as with threads blocked forever).
pub struct Runtime {
    workers: sched::Workers,
}

/// Settings of a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeBuilder {
    workers: usize,
    stack_size: usize,
    name: String,
    bind: Option<bool>,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            stack_size: DEFAULT_STACK_SIZE,
            name: "courier-worker".to_owned(),
            bind: None,
        }
    }
}

impl RuntimeBuilder {
    /// The default settings: a worker per CPU, each bound to its CPU, 64 KiB
    /// stacks.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many worker threads run fibers (at least one).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// The stack size of the runtime's fibers, in bytes (rounded up to whole
    /// pages).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// The name of the worker threads (followed by `-<index>`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Whether each worker thread is bound to a CPU of its own (worker `i`
    /// to the `i`th CPU the building thread may run on, round the set again
    /// if there are more workers than CPUs). By default a runtime binds its
    /// workers when there are as many as CPUs the building thread may run on
    /// (the default count, unless a cgroup quota grants the process less CPU
    /// time than its CPU set holds CPUs), and leaves fewer to the kernel,
    /// which then has CPUs to spare for other threads. may binds its workers
    /// by default too.
    ///
    /// Bound workers wake where they slept: unbound, in a virtual machine,
    /// a worker woken by another often lands on its waker's CPU and the two
    /// share it for milliseconds (see `docs/fibers.md`).
    ///
    /// A thread inherits its creator's binding: a thread that a fiber starts
    /// with `std::thread::spawn` runs on that fiber's worker's CPU only.
    /// Start it with [`spawn_blocking`] instead (whose threads, like every
    /// thread courier starts, run on all the runtime's CPUs), or build the
    /// runtime with `bind_workers(false)`.
    pub fn bind_workers(mut self, bind: bool) -> Self {
        self.bind = Some(bind);
        self
    }

    /// Starts the runtime's workers.
    pub fn build(self) -> io::Result<Runtime> {
        let cpus = match self.bind {
            Some(false) => None,
            bind => affinity::allowed().filter(|(_, cpus)| {
                !cpus.is_empty() && (bind == Some(true) || cpus.len() == self.workers)
            }),
        };
        let workers = sched::Workers::start(self.workers, self.stack_size, &self.name, cpus)?;
        Ok(Runtime { workers })
    }
}

impl Runtime {
    /// A runtime with the default settings ([`RuntimeBuilder::new`]).
    pub fn new() -> io::Result<Runtime> {
        RuntimeBuilder::new().build()
    }

    /// Settings for a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::new()
    }

    /// Starts a fiber running `f` on this runtime.
    ///
    /// # Panics
    /// If no stack can be had for it (see [`Builder::spawn_on`] for the
    /// error instead).
    pub fn spawn<T, F>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        Builder::new()
            .spawn_on(self, f)
            .unwrap_or_else(|e| panic!("cannot start a fiber: {e}"))
    }

    /// Runs `f` as a fiber of this runtime and waits for it on the calling
    /// thread; a panic in `f` is resumed here.
    pub fn block_on<T, F>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.spawn(f).join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

/// Settings of one fiber: its name (in overflow reports) and stack size.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    name: Option<String>,
    stack_size: Option<usize>,
}

impl Builder {
    /// A fiber with no name and the runtime's stack size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the fiber.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The fiber's stack size in bytes (rounded up to whole pages).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Starts the fiber on the runtime of the calling fiber or worker.
    ///
    /// # Panics
    /// Outside a runtime (use [`Builder::spawn_on`] there).
    pub fn spawn<T, F>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let rt = sched::current_runtime().expect(OUTSIDE);
        self.start(&rt, None, f)
    }

    /// Starts the fiber on `runtime`; an error if no stack can be had for it
    /// (the process's `vm.max_map_count`, or its memory).
    pub fn spawn_on<T, F>(self, runtime: &Runtime, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.start(&runtime.workers.shared, None, f)
    }

    /// Starts the fiber pinned to the calling worker (see [`spawn_local`]).
    ///
    /// # Panics
    /// Outside a runtime's fiber or worker.
    pub fn spawn_local<T, F>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + 'static,
        T: 'static,
    {
        let rt = sched::current_runtime().expect(OUTSIDE);
        let home = sched::current_worker().expect(OUTSIDE);
        self.start(&rt, Some(home), f)
    }

    fn start<T, F>(
        self,
        rt: &Arc<sched::Shared>,
        home: Option<usize>,
        f: F,
    ) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + 'static,
        T: 'static,
    {
        let fiber = sched::spawn_on(rt, self.name, home, self.stack_size, f)?;
        Ok(JoinHandle {
            from: Source::Fiber(fiber),
            _result: PhantomData,
        })
    }
}

const OUTSIDE: &str =
    "courier::fiber: no runtime here (spawn from a fiber, or use Runtime::spawn / block_on)";

/// Starts a fiber running `f` on the runtime of the calling fiber or worker.
///
/// # Panics
/// Outside a runtime, or if no stack can be had (see [`Builder::spawn`]).
pub fn spawn<T, F>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new()
        .spawn(f)
        .unwrap_or_else(|e| panic!("cannot start a fiber: {e}"))
}

/// Starts a fiber pinned to the calling worker: it runs only there, so `f`
/// need not be `Send` (it may hold `chan::local` ends, `Rc`s...), and fibers
/// of one worker that share a `chan::local` channel wait on it with no
/// atomics.
///
/// ```
/// use courier::{chan, fiber};
///
/// let rt = fiber::Runtime::builder().workers(2).build().unwrap();
/// let sum = rt.block_on(|| {
///     let (tx, rx) = chan::local::bounded::<u32>(1);
///     let consumer = fiber::spawn_local(move || rx.iter().sum::<u32>());
///     for i in 1..=10 {
///         tx.send(i).unwrap(); // parks this fiber while the channel is full
///     }
///     drop(tx);
///     consumer.join().unwrap()
/// });
/// assert_eq!(sum, 55);
/// ```
///
/// # Panics
/// Outside a runtime's fiber or worker, or if no stack can be had.
pub fn spawn_local<T, F>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + 'static,
    T: 'static,
{
    Builder::new()
        .spawn_local(f)
        .unwrap_or_else(|e| panic!("cannot start a fiber: {e}"))
}

/// Waits for a fiber to finish, from a fiber (which parks) or a thread.
pub struct JoinHandle<T> {
    from: Source<T>,
    /// `Send` and `Sync` as the result is.
    _result: PhantomData<T>,
}

/// Where a handle's result comes from.
enum Source<T> {
    /// A fiber's own slot (see `join.rs`).
    Fiber(sched::Handle),
    /// A thread of the blocking pool.
    Blocking(oneshot::Receiver<std::thread::Result<T>>),
}

impl<T: 'static> JoinHandle<T> {
    /// Waits for the fiber and returns its value, or the panic it ended with.
    pub fn join(self) -> std::thread::Result<T> {
        match self.from {
            Source::Fiber(fiber) => {
                if !fiber.join.is_done() {
                    sched::run_if_next(&fiber);
                }
                fiber.join.join().map(|value| {
                    *value
                        .downcast::<T>()
                        .unwrap_or_else(|_| unreachable!("a fiber's result has its handle's type"))
                })
            }
            Source::Blocking(result) => result.recv().unwrap_or_else(|_| Err(sched::lost())),
        }
    }

    /// Whether the fiber has finished.
    pub fn is_finished(&self) -> bool {
        match &self.from {
            Source::Fiber(fiber) => fiber.join.is_done(),
            Source::Blocking(result) => result.is_ready(),
        }
    }
}

impl<T> std::fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinHandle").finish_non_exhaustive()
    }
}

/// Runs `f` on a thread of a pool kept for calls that would block a worker
/// (a blocking system call, a library that waits on its own), and returns a
/// handle that joins it from a fiber (which parks) or a thread. The pool
/// grows as calls need threads, and a thread idle for 10 s ends.
pub fn spawn_blocking<T, F>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (done, result) = oneshot();
    blocking::run(Box::new(move || {
        let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = done.send(value);
    }));
    JoinHandle {
        from: Source::Blocking(result),
        _result: PhantomData,
    }
}

/// Lets the other ready fibers of this worker run, then goes on (a thread:
/// `std::thread::yield_now`).
pub fn yield_now() {
    match sched::current() {
        Some(fiber) => sched::yield_current(fiber),
        None => std::thread::yield_now(),
    }
}

/// Parks the calling fiber (or thread) for `duration`; its worker runs other
/// fibers meanwhile.
pub fn sleep(duration: Duration) {
    let Some(deadline) = Instant::now().checked_add(duration) else {
        loop {
            std::thread::park();
        }
    };
    sleep_until(deadline);
}

/// Parks the calling fiber (or thread) until `deadline`.
pub fn sleep_until(deadline: Instant) {
    match sched::current() {
        Some(fiber) => {
            while Instant::now() < deadline {
                sched::sleep_current(fiber, deadline);
            }
        }
        None => std::thread::sleep(deadline.saturating_duration_since(Instant::now())),
    }
}

/// The name of the calling fiber, if it is a named fiber.
pub fn name() -> Option<String> {
    sched::current().and_then(|f| f.name().map(str::to_owned))
}

/// Whether the caller is a fiber.
pub(crate) fn in_fiber() -> bool {
    sched::current().is_some()
}

/// Waits until `fd` is ready for `interest` (or hung up, or failed), or
/// `deadline`: `Ok(true)` if ready. A fiber parks on its worker's reactor;
/// a thread waits in `poll(2)`.
pub(crate) fn wait_fd(
    fd: BorrowedFd<'_>,
    interest: Interest,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    if let Some(fiber) = sched::current() {
        return reactor::wait_fd(fiber, fd, interest, deadline);
    }
    use rustix::event::{poll, PollFd, PollFlags};
    let flags = match interest {
        Interest::Read => PollFlags::IN,
        Interest::Write => PollFlags::OUT,
    };
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let timeout = left.map(|left| {
            rustix::time::Timespec::try_from(left).unwrap_or(rustix::time::Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let mut fds = [PollFd::new(&fd, flags)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
