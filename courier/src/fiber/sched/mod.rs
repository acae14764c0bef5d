//! The runtime: worker threads that run fibers, a run queue each, and work
//! stealing between them.
//!
//! # Run queues
//! A new fiber goes on the spawning worker's FIFO deque
//! ([`crossbeam_deque::Worker`]), or the runtime's injector when spawned
//! from outside; idle workers steal from both. So new work spreads over the
//! workers, and a fiber that never yields holds only its own worker: the new
//! fibers queued behind it are stolen by the others.
//!
//! The newest fiber spawned on a worker waits in a slot of its own (its
//! *next* slot) until the worker next looks for work, which moves it to the
//! back of the deque: the order is the deque's. Idle workers steal from the
//! slot too. A fiber that joins the fiber in its worker's slot takes it out
//! and runs it at once, on its own worker, as a nested turn: spawn and join
//! then cost two stack switches (into the new fiber and back), not four
//! through the worker loop, and no park, wake-up or queue round trip.
//!
//! A fiber that has started stays on the worker that started it (its
//! *home*): it is queued there when it wakes, in a queue no one steals from,
//! through the worker's inbox when woken from elsewhere. A suspended fiber's
//! stack may hold anything its code made, `Rc`s and `chan::local` ends and
//! references into thread-locals included, none of which may move to another
//! thread; only the closure a fiber starts from is known to be `Send`. So
//! the fibers woken on a worker that a fiber monopolises wait for it, as the
//! tasks of one thread would. A fiber made with
//! [`spawn_local`](super::spawn_local) has its home from the start.
//!
//! # Parking: the fiber's side of `chan`'s seam
//! Every fiber runs inside its own [`TaskContext`]: a channel operation that must wait
//! calls [`Park::park`] on the fiber, which suspends the coroutine back to
//! the worker; [`Park::unpark`], from any thread, makes it ready again. A
//! fiber's state word makes the two meet:
//!
//! ```text
//!   QUEUED --run--> RUNNING --park (suspends)--> PARKED --wake-up--> QUEUED
//!                     |  ^
//!             wake-up |  | park returns at once
//!                     v  |
//!                   NOTIFIED
//! ```
//!
//! A wake-up that finds the fiber running leaves a token (`NOTIFIED`), so
//! the wake-up of a park that has not happened yet is not lost; one that
//! finds it parked queues it, exactly once.
//!
//! Only the fiber's home worker reads or writes the word, so it is a plain
//! `Cell`: a park and a wake-up between two fibers of one worker (a
//! `chan::local` message, a join, a timer) cost no locked instruction. A
//! wake-up from another thread does not touch the word: it sends the fiber
//! (counted) to its home worker's inbox, and the worker applies it when it
//! next looks there (when it runs out of ready fibers, and every
//! [`POLL_EVERY`] turns). A park with a deadline also puts a timer on the
//! worker's heap, which wakes the fiber when it fires (a spurious wake-up if
//! it was woken before, which the channel's re-check absorbs).
#![allow(unsafe_code)]

use std::any::Any;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corosensei::{Coroutine, CoroutineResult, Yielder};
use crossbeam_deque::{Injector, Stealer, Worker as Deque};
use crossbeam_utils::CachePadded;

use super::join::JoinSlot;
use super::reactor::Reactor;
use super::stack::{self, PooledStack};
use super::state::State;
use crate::chan::context::SpareContext;
use crate::chan::{Park, TaskContext};

mod worker;
pub(crate) use self::worker::Workers;

/// Why a fiber suspended: a byte, which crosses the switch in a register
/// (a park's deadline waits in the fiber's `deadline`).
#[derive(Clone, Copy)]
enum Suspend {
    /// It stays ready: queue it again.
    Yield,
    /// It waits for an `unpark`, or its `deadline` if it set one.
    Park,
}

type Coro = Coroutine<(), Suspend, (), PooledStack>;

/// The home of a fiber that has not started.
const NO_HOME: usize = usize::MAX;

/// A fiber: its coroutine and its scheduling state.
pub(crate) struct Fiber {
    /// Queued, running, notified or parked (see the module docs): touched
    /// only by the thread that runs the fiber.
    state: State,
    name: Option<Box<str>>,
    /// The worker it runs on once started ([`NO_HOME`] before).
    home: AtomicUsize,
    rt: Arc<Shared>,
    /// The coroutine's yielder, set when it starts (it lives on the fiber's
    /// stack for as long as the coroutine does); read by the fiber itself.
    yielder: Cell<*const Yielder<(), Suspend>>,
    /// The deadline of the park it suspends for: set by the fiber, taken by
    /// its worker as the fiber's turn ends.
    deadline: Cell<Option<Instant>>,
    /// The next fiber on the run queue of fibers at home on a worker
    /// ([`Pinned`]), while this one is on it.
    pinned_next: Cell<*const Fiber>,
    /// Which of its worker's two resume sites resumes it (see [`run`]):
    /// given at its first turn, the other one than the fiber that ran last.
    site: Cell<bool>,
    /// Touched only by the worker that runs the fiber, while it does.
    run: UnsafeCell<Running>,
    /// Its result, for the one that joins it.
    pub(crate) join: JoinSlot,
}

struct Running {
    coroutine: Option<Coro>,
    /// The fiber's side of `chan`'s seam; let go when it finishes (it counts
    /// the fiber, its `Park`: a fiber is alive from its spawn until it
    /// finishes).
    task: Option<TaskContext>,
    /// The stack of the fiber that finished, if its control block went to
    /// the worker's spares as it did (see `run`): the next fiber made from
    /// them starts on it, with no trip through the stack pool.
    stack: Option<PooledStack>,
    /// The `chan` context of the fiber that finished, without its `Park`,
    /// for the next fiber made from this control block (its allocation and
    /// task id).
    context: Option<SpareContext>,
}

// SAFETY: the fields a fiber shares between threads are its home, its
// name, its join slot and the runtime's `Shared` (all `Sync`); `state`,
// `run`, `yielder`, `deadline` and `pinned_next` are touched only by the one worker
// running the fiber (its home once started: a wake-up from elsewhere goes
// through that worker's inbox, see `unpark`), and the fiber itself. Before it starts,
// its coroutine holds only the `Send` closure it starts from, and may move
// to any worker (taken off a run queue, which hands it over with the
// queue's own synchronisation); once started it never leaves its home
// worker (see the module docs), and one made with `spawn_local` (a closure
// that need not be `Send`) has its home from the start.
unsafe impl Send for Fiber {}
// SAFETY: as for `Send`.
unsafe impl Sync for Fiber {}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(coroutine) = self.coroutine.take() {
            if coroutine.started() && !coroutine.done() {
                // A fiber suspended for good (its runtime stopped while it
                // waited): its stack holds state that peers may still point
                // into; it is leaked, as a thread blocked forever would be.
                std::mem::forget(coroutine);
            }
        }
    }
}

/// A fiber is its own `Park` (its task context counts the fiber).
impl Park for Fiber {
    fn park(&self, deadline: Option<Instant>) {
        park_current(self, deadline);
    }

    fn unpark(&self) {
        unpark(self);
    }

    fn yield_now(&self) {
        suspend(self, Suspend::Yield);
    }

    fn may_spin(&self) -> bool {
        // With other fibers ready on this worker, the one waited for may be
        // among them: spinning would only delay it. So would a wake-up that
        // another thread left in the worker's inbox, which the worker takes
        // only once this fiber has parked.
        WORKER.with(|w| {
            let w = w.get();
            // SAFETY: a non-null pointer names this thread's worker, alive
            // while it runs fibers.
            w.is_null()
                || unsafe {
                    let w = &*w;
                    w.local.is_empty()
                        && w.pinned.is_empty()
                        && !w.next_hint.get()
                        && w.rt.inboxes[w.index].is_empty()
                }
        })
    }
}

/// Suspends the running fiber `fiber` until it is unparked (or `deadline`).
pub(super) fn park_current(fiber: &Fiber, deadline: Option<Instant>) {
    // A token left by a wake-up while it ran: consumed, no suspension.
    if fiber.state.park() {
        fiber.deadline.set(deadline);
        suspend(fiber, Suspend::Park);
    }
}

/// Switches from the running fiber back to its worker.
fn suspend(fiber: &Fiber, why: Suspend) {
    let yielder = fiber.yielder.get();
    assert!(!yielder.is_null(), "a fiber suspends only while it runs");
    // SAFETY: the yielder was set when the coroutine started and lives on its
    // stack, which is alive while the fiber runs (the caller is the fiber).
    unsafe { &*yielder }.suspend(why);
}

/// Makes `fiber`'s current or next park return (see the module docs): on
/// its home worker at once; from anywhere else through that worker's inbox.
pub(super) fn unpark(fiber: &Fiber) {
    let home = fiber.home.load(Ordering::Relaxed);
    if let Some(w) = this_worker(&fiber.rt).filter(|w| w.index == home) {
        wake_here(w, fiber);
        return;
    }
    if home == NO_HOME {
        // It has not started, so it waits for nothing. (A fiber that parked
        // has its home: whoever wakes it learned of the park through what
        // it waited on, after the home was set.)
        debug_assert!(false, "a wake-up for a fiber that has not started");
        return;
    }
    let rt = &fiber.rt;
    rt.inboxes[home].push(counted(fiber));
    rt.wake(home);
}

/// A wake-up of `fiber`, at home on `w`, the calling thread's worker.
#[inline]
fn wake_here(w: &WorkerState, fiber: &Fiber) {
    if fiber.state.unpark() {
        w.pinned.push_back(fiber);
    }
}

/// The calling thread's worker, if it is one of `rt`'s.
#[inline]
fn this_worker(rt: &Arc<Shared>) -> Option<&'static WorkerState> {
    let here = WORKER.with(Cell::get);
    // SAFETY: a non-null pointer names this thread's worker, alive while it
    // runs (the pointer is cleared before it goes); the callers use it only
    // within their own call.
    let here = (!here.is_null()).then(|| unsafe { &*here });
    here.filter(|w| Arc::ptr_eq(&w.rt, rt))
}

/// A fiber on a run queue: its address, not a count. A fiber is alive from
/// its spawn until it finishes (its task context counts it: it is its own
/// `Park`), and is queued only in between, so a queued fiber is alive; and
/// it is queued once at a time (its state word says who queues it). So a
/// wake-up costs no reference count.
struct Queued(NonNull<Fiber>);

// SAFETY: a `Queued` stands for the fiber (`Send`, see there) while it waits
// on a run queue; the queue hands it over to the worker that takes it.
unsafe impl Send for Queued {}

impl Queued {
    fn new(fiber: &Fiber) -> Queued {
        Queued(NonNull::from(fiber))
    }
}

/// A worker's run queue of fibers at home there, first in, first out: a
/// list through the fibers' own `pinned_next` links. A fiber is on one run
/// queue at a time (see [`Queued`]), and this one is touched only by its
/// worker, so a yield's queue round trip is a few loads and stores, with no
/// ring buffer's index arithmetic nor a borrow flag.
struct Pinned {
    /// The first fiber, null when empty.
    head: Cell<*const Fiber>,
    /// The last fiber, null when empty.
    tail: Cell<*const Fiber>,
}

impl Pinned {
    fn new() -> Pinned {
        Pinned {
            head: Cell::new(std::ptr::null()),
            tail: Cell::new(std::ptr::null()),
        }
    }

    fn push_back(&self, fiber: &Fiber) {
        fiber.pinned_next.set(std::ptr::null());
        let tail = self.tail.replace(fiber);
        match tail.is_null() {
            true => self.head.set(fiber),
            // SAFETY: `tail` is queued here, so it is alive (see `Queued`).
            false => unsafe { &*tail }.pinned_next.set(fiber),
        }
    }

    fn pop_front(&self) -> Option<Queued> {
        let head = NonNull::new(self.head.get().cast_mut())?;
        // SAFETY: `head` is queued here, so it is alive (see `Queued`).
        let next = unsafe { head.as_ref() }.pinned_next.get();
        self.head.set(next);
        if next.is_null() {
            self.tail.set(std::ptr::null());
        }
        Some(Queued(head))
    }

    fn is_empty(&self) -> bool {
        self.head.get().is_null()
    }
}

// ===== the runtime =====

/// What a runtime's workers share.
pub(crate) struct Shared {
    /// Fibers made outside a worker of this runtime.
    injector: Injector<Queued>,
    /// Each worker's queue, for stealing.
    stealers: Vec<Stealer<Queued>>,
    /// Each worker's next slot: the newest fiber spawned there, not yet on
    /// its queue (null: none; see the module docs). With one worker only
    /// that worker touches it.
    nexts: Box<[CachePadded<AtomicPtr<Fiber>>]>,
    /// Each worker's inbox: wake-ups, from other threads, of fibers at home
    /// there.
    inboxes: Vec<Injector<Arc<Fiber>>>,
    /// Each worker's `epoll` instance and the `eventfd` that wakes it.
    pub(super) reactors: Vec<Arc<Reactor>>,
    /// Workers asleep, by index.
    sleepers: Mutex<Vec<usize>>,
    idle: AtomicUsize,
    shutdown: AtomicBool,
    stack_size: usize,
}

impl Shared {
    /// Wakes worker `index` if it sleeps (the caller has just queued work
    /// for it).
    fn wake(&self, index: usize) {
        // SYNC POINT: the fence orders the caller's push before the load of
        // `idle`, against the sleeper's `SeqCst` increment before its last
        // look at its queues: either it sees the work, or this sees it idle.
        // So the common case, a worker awake, costs no lock.
        fence(Ordering::SeqCst);
        if self.idle.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = sleepers.iter().position(|&s| s == index) {
            sleepers.swap_remove(i);
            self.idle.fetch_sub(1, Ordering::Relaxed);
            drop(sleepers);
            self.unpark_thread(index);
        }
    }

    /// Wakes one sleeping worker, if any.
    fn wake_one(&self) {
        // SYNC POINT: as in `wake`.
        fence(Ordering::SeqCst);
        if self.idle.load(Ordering::Relaxed) == 0 {
            return;
        }
        let index = {
            let mut sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            let index = sleepers.pop();
            if index.is_some() {
                self.idle.fetch_sub(1, Ordering::Relaxed);
            }
            index
        };
        if let Some(index) = index {
            self.unpark_thread(index);
        }
    }

    /// Puts `fiber` in worker `index`'s next slot (the caller is that
    /// worker), and returns the one it held, which the caller queues.
    fn put_next(&self, index: usize, fiber: &Fiber) -> Option<Queued> {
        let slot = &self.nexts[index];
        let fiber = std::ptr::from_ref(fiber).cast_mut();
        let before = if self.stealers.len() == 1 {
            // No other worker: no one else touches the slot.
            let before = slot.load(Ordering::Relaxed);
            slot.store(fiber, Ordering::Relaxed);
            before
        } else {
            // SYNC POINT: `Release` publishes the new fiber to a stealer's
            // `Acquire` swap; `Acquire` takes back one nobody stole.
            slot.swap(fiber, Ordering::AcqRel)
        };
        NonNull::new(before).map(Queued)
    }

    /// Takes the fiber out of worker `index`'s next slot, if it holds one:
    /// that worker moving it to its queue, or another stealing it.
    fn take_next(&self, index: usize) -> Option<Queued> {
        let slot = &self.nexts[index];
        let seen = slot.load(Ordering::Relaxed);
        if seen.is_null() {
            return None;
        }
        let taken = if self.stealers.len() == 1 {
            // No other worker: no one else touches the slot.
            slot.store(std::ptr::null_mut(), Ordering::Relaxed);
            seen
        } else {
            // SYNC POINT: `Acquire` pairs with `put_next`'s `Release`: the
            // fiber's making is seen by whoever takes it.
            slot.swap(std::ptr::null_mut(), Ordering::AcqRel)
        };
        NonNull::new(taken).map(Queued)
    }

    /// Takes `fiber` out of worker `index`'s next slot if it is there (the
    /// caller is that worker): `true` if the caller has it to run.
    fn claim_next(&self, index: usize, fiber: &Fiber) -> bool {
        let slot = &self.nexts[index];
        let fiber = std::ptr::from_ref(fiber).cast_mut();
        if slot.load(Ordering::Relaxed) != fiber {
            return false;
        }
        if self.stealers.len() == 1 {
            slot.store(std::ptr::null_mut(), Ordering::Relaxed);
            return true;
        }
        // SYNC POINT: a stealer's swap may take it first; only one wins.
        slot.compare_exchange(
            fiber,
            std::ptr::null_mut(),
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    fn unpark_thread(&self, index: usize) {
        if let Some(reactor) = self.reactors.get(index) {
            reactor.wake();
        }
    }
}

/// Queues a new fiber to run: one with a home on that worker (which is the
/// caller: `spawn_local` pins a fiber to its own), any other where its
/// runtime's workers find it.
#[inline(always)]
fn queue_new(fiber: &Arc<Fiber>) {
    let rt = &fiber.rt;
    let here = this_worker(rt);
    let home = fiber.home.load(Ordering::Relaxed);
    if home != NO_HOME {
        let w = here.filter(|w| w.index == home);
        let w = w.expect("a pinned fiber is spawned on its own worker");
        w.pinned.push_back(fiber);
        return;
    }
    match here {
        Some(w) => {
            if let Some(older) = rt.put_next(w.index, fiber) {
                w.push_local(older);
            }
            w.next_hint.set(true);
            // Another worker may steal it (a runtime of one has no other).
            if rt.stealers.len() > 1 {
                rt.wake_one();
            }
        }
        None => {
            rt.injector.push(Queued::new(fiber));
            rt.wake_one();
        }
    }
}

/// A worker thread's own state.
pub(super) struct WorkerState {
    pub(super) index: usize,
    pub(super) rt: Arc<Shared>,
    local: Deque<Queued>,
    /// Whether `local` may hold a fiber: set when one goes in (only this
    /// worker puts any there), cleared when a look finds it empty (thieves
    /// only take). Spares a yield the deque's look when it is empty.
    local_maybe: Cell<bool>,
    /// Fibers at home here, ready to run (no one steals them).
    pinned: Pinned,
    /// Parks with a deadline: when to unpark whom.
    timers: RefCell<BinaryHeap<Reverse<Timer>>>,
    timer_seq: Cell<u64>,
    /// Which queue `find_work` looks at first.
    turn: Cell<bool>,
    /// Whether this worker's next slot may hold a fiber: set when one goes
    /// in, cleared when this worker looks (a thief may have emptied it
    /// meanwhile). Spares the worker loop a look at the slot's word when
    /// nothing was spawned.
    next_hint: Cell<bool>,
    /// The resume site of the next fiber to start here: the one the last
    /// fiber to run here does not use (see [`run`]).
    next_site: Cell<bool>,
    /// Fibers waiting for a descriptor, by the token of their registration.
    pub(super) io_waits: RefCell<HashMap<u64, Arc<Fiber>>>,
    pub(super) next_token: Cell<u64>,
    /// Turns since the reactor was last looked at.
    pub(super) since_poll: Cell<u32>,
    /// How long to spin before the next sleep (see `worker::next_spin`).
    spin: Cell<Duration>,
    /// Finished fibers' control blocks, with their `chan` contexts and
    /// (mostly) their stacks, for the next fibers spawned here (see
    /// [`SPARES`]).
    spare_fibers: RefCell<Vec<Arc<Fiber>>>,
}

impl WorkerState {
    /// Puts `fiber` at the back of this worker's deque.
    fn push_local(&self, fiber: Queued) {
        self.local.push(fiber);
        self.local_maybe.set(true);
    }

    /// The fiber at the front of this worker's deque, looked for only when
    /// it may hold one.
    fn pop_local(&self) -> Option<Queued> {
        if !self.local_maybe.get() {
            return None;
        }
        let fiber = self.local.pop();
        if fiber.is_none() {
            self.local_maybe.set(false);
        }
        fiber
    }
}

/// How many finished fibers' control blocks a worker keeps for its next
/// spawns: a spawn and join then allocates nothing (with glibc, its two
/// allocations and frees were a quarter of its instructions), and takes no
/// stack from the pool.
const SPARES: usize = 64;

/// Turns of fibers between two looks at the timers and the reactor while
/// fibers are ready.
const POLL_EVERY: u32 = 61;

struct Timer {
    at: Instant,
    seq: u64,
    fiber: Arc<Fiber>,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

thread_local! {
    /// The worker this thread is (null: none).
    static WORKER: Cell<*const WorkerState> = const { Cell::new(std::ptr::null()) };
    /// The fiber running on this thread (null: none): one load answers
    /// "which fiber am I".
    static CURRENT: Cell<*const Fiber> = const { Cell::new(std::ptr::null()) };
}

/// The running fiber, if the caller is one.
pub(crate) fn current() -> Option<&'static Fiber> {
    let fiber = CURRENT.with(Cell::get);
    // SAFETY: the worker sets the pointer while the fiber runs, and the
    // fiber (kept alive by the worker for its turn) outlives any call made on
    // its stack during that turn; the caller is that code.
    (!fiber.is_null()).then(|| unsafe { &*fiber })
}

/// The name of the fiber running on this thread, if it has one. (Read by
/// the overflow report, in a signal handler: one thread-local load.)
pub(crate) fn current_name() -> Option<&'static str> {
    let fiber = CURRENT.try_with(Cell::get).ok()?;
    // SAFETY: as in `current`: the running fiber outlives its turn.
    (!fiber.is_null())
        .then(|| unsafe { &*fiber })
        .and_then(|f| f.name.as_deref())
}

/// The runtime of the calling worker (or fiber), if any.
pub(crate) fn current_runtime() -> Option<Arc<Shared>> {
    let w = WORKER.with(Cell::get);
    // SAFETY: a non-null pointer names this thread's live worker.
    (!w.is_null()).then(|| Arc::clone(unsafe { &(*w).rt }))
}

/// The index of the calling worker, if it is one.
pub(crate) fn current_worker() -> Option<usize> {
    let w = WORKER.with(Cell::get);
    // SAFETY: as above.
    (!w.is_null()).then(|| unsafe { (*w).index })
}

/// Parks the running fiber `fiber` until it is unparked (or spuriously).
pub(super) fn park(fiber: &Fiber) {
    park_current(fiber, None);
}

/// A counted handle on the running fiber `fiber`.
pub(super) fn current_arc(fiber: &Fiber) -> Arc<Fiber> {
    debug_assert!(std::ptr::eq(CURRENT.with(Cell::get), fiber));
    counted(fiber)
}

/// Runs `f` on the calling worker (the caller is a fiber, so it runs on
/// one; the worker outlives the call, which may park the fiber).
pub(super) fn with_worker<R>(f: impl FnOnce(&WorkerState) -> R) -> R {
    let w = WORKER.with(Cell::get);
    assert!(!w.is_null(), "a fiber runs on its worker");
    // SAFETY: a running fiber's thread is its worker, alive while it runs;
    // a started fiber stays on its home worker, so it is the same one after
    // any park inside `f`.
    f(unsafe { &*w })
}

/// Runs `f` on the reactor of the calling worker (the caller is a fiber, so
/// it runs on one).
pub(super) fn with_reactor<R>(f: impl FnOnce(&Arc<Reactor>) -> R) -> R {
    let w = WORKER.with(Cell::get);
    assert!(!w.is_null(), "a fiber runs on its worker");
    // SAFETY: a running fiber's thread is its worker, alive while it runs.
    let w = unsafe { &*w };
    f(&w.rt.reactors[w.index])
}

/// Suspends the running fiber, which stays ready.
pub(crate) fn yield_current(fiber: &Fiber) {
    suspend(fiber, Suspend::Yield);
}

/// Parks the running fiber until `deadline` (or a spurious wake-up).
pub(crate) fn sleep_current(fiber: &Fiber, deadline: Instant) {
    park_current(fiber, Some(deadline));
}

/// Makes a fiber running `f`, and queues it on `rt` (pinned to worker
/// `home`, if given).
pub(crate) fn spawn_on<T, F>(
    rt: &Arc<Shared>,
    name: Option<String>,
    home: Option<usize>,
    stack_size: Option<usize>,
    f: F,
) -> io::Result<Handle>
where
    F: FnOnce() -> T + 'static,
    T: 'static,
{
    let size = stack_size.unwrap_or(rt.stack_size);
    // A spare control block of this worker's if it has one (it is of this
    // runtime), and the stack it kept if that has the size.
    let w = this_worker(rt);
    let mut spare = w.and_then(|w| w.spare_fibers.borrow_mut().pop());
    let (kept, context) = match spare.as_mut() {
        Some(fiber) => {
            // (A spare is counted once, by the list it came from.)
            let blank = unique(fiber).expect("a spare fiber is counted once");
            let run = blank.run.get_mut();
            (
                run.stack.take().filter(|s| s.fits(size)),
                run.context.take(),
            )
        }
        None => (None, None),
    };
    let stack = match kept {
        Some(stack) => stack,
        None => stack::take(size)?,
    };
    let coroutine = Coroutine::with_stack(stack, move |yielder: &Yielder<(), Suspend>, ()| {
        let me = current().expect("a fiber starts on its worker");
        me.yielder.set(yielder);
        let outcome =
            catch_unwind(AssertUnwindSafe(f)).map(|value| Box::new(value) as Box<dyn Any>);
        me.join.finish(outcome);
    });
    let name = name.map(String::into_boxed_str);
    let home = home.unwrap_or(NO_HOME);
    let fiber = match spare {
        Some(mut fiber) => {
            let blank = unique(&mut fiber).expect("a spare fiber is counted once");
            blank.state = State::queued();
            blank.name = name;
            *blank.home.get_mut() = home;
            *blank.yielder.get_mut() = std::ptr::null();
            // (A spare's coroutine and task are gone: see `release`.)
            blank.run.get_mut().coroutine = Some(coroutine);
            fiber
        }
        None => Arc::new(Fiber {
            state: State::queued(),
            name,
            home: AtomicUsize::new(home),
            rt: Arc::clone(rt),
            yielder: Cell::new(std::ptr::null()),
            deadline: Cell::new(None),
            pinned_next: Cell::new(std::ptr::null()),
            site: Cell::new(false),
            run: UnsafeCell::new(Running {
                coroutine: Some(coroutine),
                task: None,
                stack: None,
                context: None,
            }),
            join: JoinSlot::new(),
        }),
    };
    let park = Arc::clone(&fiber) as Arc<dyn Park>;
    let task = match context {
        Some(spare) => TaskContext::shared_from(spare, park),
        None => TaskContext::shared(park),
    };
    // SAFETY: no one else has the fiber yet.
    unsafe { (*fiber.run.get()).task = Some(task) };
    queue_new(&fiber);
    Ok(Handle(ManuallyDrop::new(fiber)))
}

/// A counted handle on a fiber (a [`JoinHandle`](super::JoinHandle)'s)
/// that, if it is the last count when it goes, gives the fiber's control
/// block to its worker's spares (see [`release`]).
pub(crate) struct Handle(ManuallyDrop<Arc<Fiber>>);

impl Deref for Handle {
    type Target = Fiber;

    fn deref(&self) -> &Fiber {
        &self.0
    }
}

impl Drop for Handle {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: taken once, here, as the handle goes.
        release(unsafe { ManuallyDrop::take(&mut self.0) });
    }
}

/// Lets go of a count of `fiber`. The last count, let go on a worker of the
/// fiber's runtime, keeps the finished fiber's control block for the next
/// spawn there, emptied at once (its name, and a result no one joined, go
/// now, not at the next spawn); any other is an `Arc`'s drop.
#[inline(always)]
fn release(mut fiber: Arc<Fiber>) {
    let Some(w) = this_worker(&fiber.rt) else {
        return;
    };
    let Some(blank) = unique(&mut fiber) else {
        return;
    };
    let run = blank.run.get_mut();
    // (A fiber left suspended when its runtime stopped keeps its coroutine.)
    if run.coroutine.is_some() || run.task.is_some() {
        return;
    }
    blank.name = None;
    blank.join = JoinSlot::new();
    let mut spares = w.spare_fibers.borrow_mut();
    if spares.len() < SPARES {
        spares.push(fiber);
    }
}

/// Runs `fiber` at once if it waits in the calling worker's next slot (it
/// has not started): a turn nested in the calling fiber's, which goes on
/// when the new fiber finishes, parks or yields. Called by a fiber about to
/// wait for `fiber` (a join), which would otherwise park until the worker
/// got to it.
pub(crate) fn run_if_next(fiber: &Fiber) {
    let Some(me) = current() else {
        return;
    };
    let Some(w) = this_worker(&fiber.rt) else {
        return;
    };
    if !w.rt.claim_next(w.index, fiber) {
        return;
    }
    run(w, Queued::new(fiber), true);
    CURRENT.with(|c| c.set(me));
}

/// The fiber, to reset, if `fiber` is its only count (`Arc::get_mut`
/// without its locked compare-exchange: three of them a spawn and join).
fn unique(fiber: &mut Arc<Fiber>) -> Option<&mut Fiber> {
    // SAFETY: no `Weak` of a fiber is ever made, and a fiber that is not
    // counted is not queued, running or in a slot (see `Queued`): no
    // uncounted pointer reaches it.
    unsafe { crate::sync::unique_arc(fiber) }
}

impl Fiber {
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Runs `fiber` for one turn on worker `w` (from its loop, or `nested` in a
/// joining fiber's turn: [`run_if_next`]). Inlined in both: a call here
/// costs the worker loop's switch round trip a quarter more.
#[inline(always)]
fn run(w: &WorkerState, queued: Queued, nested: bool) {
    // SAFETY: a queued fiber is alive (see `Queued`); a fiber that finishes
    // in this turn may be freed at its end, after its last use below.
    let fiber = unsafe { queued.0.as_ref() };
    // Its first turn (its coroutine has not set its yielder yet) makes this
    // worker its home, unless it was pinned to one, and gives it a resume
    // site; a fiber that yielded, still running, has both.
    if fiber.state.start_turn() && fiber.yielder.get().is_null() {
        if fiber.home.load(Ordering::Relaxed) == NO_HOME {
            fiber.home.store(w.index, Ordering::Relaxed);
        }
        fiber.site.set(w.next_site.get());
    }
    CURRENT.with(|c| c.set(fiber));
    // Field by field, never a `&mut Running`: the suspended fiber may hold
    // shared borrows of its task context (a channel operation under way).
    let running = fiber.run.get();
    // SAFETY: this worker took the fiber off a run queue: no one else runs
    // it or touches `run` until it is queued again, which only this worker
    // does, after the turn; the fiber's code borrows only `task`.
    let (coroutine, task) = unsafe { (&mut (*running).coroutine, &(*running).task) };
    let (Some(coroutine), Some(task)) = (coroutine.as_mut(), task.as_ref()) else {
        CURRENT.with(|c| c.set(std::ptr::null()));
        return;
    };
    // (A worker's own turn starts with no task installed; a nested one,
    // inside its joiner's, puts the joiner's back.)
    //
    // A worker's own turns resume from two places, a fiber always from the
    // same one. A resume is an indirect call to where the fiber suspended,
    // and one call site that alternates between two fibers' suspension
    // points (a producer and its consumer, two fibers that yield to each
    // other) has its target mispredicted at most hops: on the AMD guest a
    // yield round trip of two fibers takes 24 ns from one site and 11-13 ns
    // from two, and bare corosensei, one coroutine resumed after the other
    // from a single site, takes twice its time from two sites (the design
    // note on fibers under `docs/`). A fiber's first turn gives it the site
    // the fiber that ran before it does not use: a fiber and the one it
    // spawned, say, or a fiber and the one that woke it first.
    let site = fiber.site.get();
    w.next_site.set(!site);
    let turn = match (nested, site) {
        (true, _) => task.run(|| coroutine.resume(())),
        (false, false) => task.run_turn(|| resume_at::<0>(coroutine)),
        (false, true) => task.run_turn(|| resume_at::<1>(coroutine)),
    };
    CURRENT.with(|c| c.set(std::ptr::null()));
    match turn {
        CoroutineResult::Yield(Suspend::Yield) => {
            requeue(w, fiber);
            // New fibers first: a fiber that yields goes behind every fiber
            // ready here.
            w.turn.set(false);
        }
        CoroutineResult::Yield(Suspend::Park) => {
            // Parked (its park set the state before it suspended): a wake-up
            // queues it. A deadline also wakes it.
            if let Some(at) = fiber.deadline.take() {
                let seq = w.timer_seq.get();
                w.timer_seq.set(seq + 1);
                let timer = Timer {
                    at,
                    seq,
                    fiber: counted(fiber),
                };
                w.timers.borrow_mut().push(Reverse(timer));
            }
        }
        CoroutineResult::Return(()) => {
            // Done: the fiber's task context (which counts the fiber, its
            // `Park`) is let go, and the fiber's stack and context stay with
            // its control block for the next fiber made from it (see
            // `release`) if that goes to the spares at once: when this was
            // its last count, or when its joiner, which ran it in a nested
            // turn, is about to let its handle go. Otherwise the stack goes
            // back to the pool now, not when the handle goes.
            // SAFETY: as above; the coroutine finished on this worker, and
            // with it every borrow its code held.
            let running = unsafe { &mut *running };
            let stack = running.coroutine.take().map(Coro::into_stack);
            // (Taken out before it goes: it may hold the last count of the
            // fiber, whose memory goes with it.)
            let task = running.task.take();
            if let Some(Ok((context, park))) = task.map(TaskContext::into_spare) {
                // SAFETY: a fiber's context parks through the fiber itself,
                // an `Arc<Fiber>` (see `spawn_on`).
                let fiber = unsafe { Arc::from_raw(Arc::into_raw(park).cast::<Fiber>()) };
                running.context = Some(context);
                if nested || Arc::strong_count(&fiber) == 1 {
                    running.stack = stack;
                }
                release(fiber);
            }
        }
    }
}

/// Queues a fiber that stays ready (it has started here: its home) at the
/// back of this worker's own queue.
fn requeue(w: &WorkerState, fiber: &Fiber) {
    w.pinned.push_back(fiber);
}

/// Resumes `coroutine` at resume site `SITE` of the worker loop (see
/// [`run`]). The two sites are the same code, which the optimizer would
/// otherwise fold into one: an empty `asm!` that differs by site before and
/// after the resume keeps each its own.
#[inline(always)]
fn resume_at<const SITE: u8>(coroutine: &mut Coro) -> CoroutineResult<Suspend, ()> {
    // SAFETY: an empty assembly block (a comment): no instruction, no
    // operand, no effect.
    unsafe {
        std::arch::asm!("/* resume site {} */", const SITE, options(nomem, nostack, preserves_flags))
    };
    let turn = coroutine.resume(());
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("/* resumed at site {} */", const SITE, options(nomem, nostack, preserves_flags))
    };
    turn
}

/// A counted handle on `fiber`, which is alive.
fn counted(fiber: &Fiber) -> Arc<Fiber> {
    // SAFETY: every fiber lives in an `Arc` (`spawn_on` makes it so), alive
    // while the caller borrows it: one more strong count.
    unsafe {
        Arc::increment_strong_count(fiber);
        Arc::from_raw(fiber)
    }
}

/// The payload of a fiber that ended without a result (its runtime stopped
/// before it finished).
pub(crate) fn lost() -> Box<dyn Any + Send> {
    Box::new("the fiber's runtime stopped before the fiber finished")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::fiber::{self, Runtime};

    /// A fiber and every fiber it spawns resume from different sites of
    /// their worker's loop (see `run`): each new one gets the site its
    /// spawner, the fiber that ran before it, does not use, not the next
    /// site in turn (which would put every other one on its spawner's).
    #[test]
    fn a_fiber_and_each_fiber_it_spawns_resume_from_different_sites() {
        let rt = Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let site = || current().expect("a fiber").site.get();
            let mine = site();
            for _ in 0..4 {
                let other = fiber::spawn(move || {
                    fiber::yield_now();
                    site()
                });
                fiber::yield_now();
                assert_eq!(other.join().unwrap(), !mine);
                assert_eq!(site(), mine, "a fiber keeps its site");
            }
        });
    }
}
