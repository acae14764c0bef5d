//! A single-threaded fiber scheduler for tests: the smallest one that keeps the
//! [`Park`](courier::chan::Park) contract.
//!
//! Stackful fibers (`corosensei`), a ready queue (FIFO, or a seeded random order), a wake-up
//! token per fiber, and a timed park that comes back after the other ready fibers have had a
//! turn (a spurious return, which the contract allows). Each fiber has a
//! [`TaskContext`](courier::chan::TaskContext), installed around each of its turns and moved out
//! of its slot meanwhile, as a scheduler is free to move a suspended task's context. When no
//! fiber is ready and some are parked, [`run_fibers`] reports a deadlock instead of hanging.
//!
//! Use it from a test file with `#[path = "common/fibers.rs"] mod fibers;`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use corosensei::{Coroutine, CoroutineResult, Yielder};
use courier::chan::{Park, TaskContext};

thread_local! {
    /// The running fiber's yielder, installed by the scheduler around each resume.
    static YIELDER: Cell<*const Yielder<(), ()>> = const { Cell::new(std::ptr::null()) };
    /// The running fiber's index and the ready queue it goes back on (for [`yield_fiber`]).
    static CURRENT_FIBER: std::cell::RefCell<Option<(usize, ReadyQueue)>> =
        const { std::cell::RefCell::new(None) };
}

/// Lets the other ready fibers run: what a fiber body calls to wait without blocking.
pub fn yield_fiber() {
    let (index, ready) = CURRENT_FIBER
        .with_borrow(|r| r.clone())
        .expect("yield_fiber() outside a fiber");
    ready.lock().unwrap().push_back(index);
    suspend();
}

/// Switches from the running fiber back to the scheduler loop.
fn suspend() {
    let yielder = YIELDER.get();
    assert!(!yielder.is_null(), "suspend() outside a fiber");
    // SAFETY: the scheduler installs a fiber's yielder only while it resumes that fiber, and the
    // yielder lives on the fiber's own stack until the fiber returns.
    unsafe { &*yielder }.suspend(());
}

/// The fibers ready to run, by index. Shared with the parkers, which `Park` requires to be
/// `Send + Sync`; here every wake-up comes from the scheduler's own thread.
type ReadyQueue = Arc<Mutex<VecDeque<usize>>>;

/// A fiber's parking state.
const RUNNING: u8 = 0;
const PARKED: u8 = 1;
const NOTIFIED: u8 = 2;

/// The `Park` of one fiber.
struct FiberPark {
    index: usize,
    state: AtomicU8,
    ready: ReadyQueue,
}

impl Park for FiberPark {
    fn park(&self, deadline: Option<Instant>) {
        // A wake-up that came first is not lost: consume it and return.
        if self
            .state
            .compare_exchange(NOTIFIED, RUNNING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        if self
            .state
            .compare_exchange(RUNNING, PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            self.state.store(RUNNING, Ordering::Relaxed);
            return;
        }
        if deadline.is_some() {
            // Come back after the fibers ready now: a spurious return the caller re-checks.
            self.ready.lock().unwrap().push_back(self.index);
        }
        suspend();
        self.state.store(RUNNING, Ordering::Release);
    }

    fn unpark(&self) {
        if self.state.swap(NOTIFIED, Ordering::AcqRel) == PARKED {
            self.ready.lock().unwrap().push_back(self.index);
        }
    }

    fn yield_now(&self) {
        self.ready.lock().unwrap().push_back(self.index);
        suspend();
    }

    fn may_spin(&self) -> bool {
        // Only when no other fiber is ready: spinning cannot see progress that only another
        // fiber of this thread can make (with nothing else ready, the spin runs out and the
        // fiber parks; it exercises the channels' spinning path for fibers).
        self.ready.lock().unwrap().is_empty()
    }
}

/// One fiber: its coroutine, its task context and its yielder's address (known once started).
struct Fiber {
    coroutine: Coroutine<(), (), ()>,
    /// Moved out for each turn and back after it, as a scheduler is free to move a suspended
    /// task's context: no channel may keep a pointer into it across a suspension.
    task: Option<TaskContext>,
    yielder: Rc<Cell<*const Yielder<(), ()>>>,
}

/// Runs `bodies` as fibers on the calling thread until all return, in FIFO order. Panics if
/// every unfinished fiber is parked with nothing left to wake it (a deadlock).
pub fn run_fibers(bodies: Vec<Box<dyn FnOnce()>>) {
    run_fibers_in_order(bodies, None);
}

/// Like [`run_fibers`]; with `shuffle = Some(seed)` the next fiber to run is drawn at random
/// from the ready ones (the `Park` contract promises no order), so that a seed is one
/// interleaving of the fibers, repeatable.
pub fn run_fibers_in_order(bodies: Vec<Box<dyn FnOnce()>>, shuffle: Option<u64>) {
    // xorshift64*: enough to pick among a few ready fibers.
    let mut state = shuffle.map(|seed| seed | 1);
    let mut pick = move |ready: usize| match state.as_mut() {
        None => 0,
        Some(x) => {
            *x ^= *x >> 12;
            *x ^= *x << 25;
            *x ^= *x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % ready
        }
    };
    let ready: ReadyQueue = Arc::new(Mutex::new((0..bodies.len()).collect()));
    let mut fibers: Vec<Option<Fiber>> = bodies
        .into_iter()
        .enumerate()
        .map(|(index, body)| {
            let yielder = Rc::new(Cell::new(std::ptr::null()));
            let own = yielder.clone();
            let coroutine = Coroutine::new(move |y: &Yielder<(), ()>, ()| {
                own.set(y as *const _);
                YIELDER.set(y as *const _);
                body();
            });
            let task = TaskContext::new(FiberPark {
                index,
                state: AtomicU8::new(RUNNING),
                ready: ready.clone(),
            });
            Some(Fiber {
                coroutine,
                task: Some(task),
                yielder,
            })
        })
        .collect();
    let schedule = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut live = fibers.len();
        while live > 0 {
            let next = {
                let mut ready = ready.lock().unwrap();
                match ready.len() {
                    0 => None,
                    n => ready.remove(pick(n)),
                }
            };
            let Some(index) = next else {
                panic!("deadlock: {live} fiber(s) parked, none ready");
            };
            // A fiber may be queued twice (a timed park, then a wake-up): a later turn is a
            // spurious return, and a finished fiber's turns are dropped.
            let Some(fiber) = fibers[index].as_mut() else {
                continue;
            };
            YIELDER.set(fiber.yielder.get());
            CURRENT_FIBER.set(Some((index, ready.clone())));
            let task = fiber
                .task
                .take()
                .expect("a fiber's context is back after its turn");
            let step = task.run(|| fiber.coroutine.resume(()));
            fiber.task = Some(task);
            CURRENT_FIBER.set(None);
            YIELDER.set(std::ptr::null());
            if let CoroutineResult::Return(()) = step {
                fibers[index] = None;
                live -= 1;
            }
        }
    }));
    if let Err(panic) = schedule {
        // A fiber failed (its panic came out of `resume`) or the rest deadlocked. Dropping a
        // suspended fiber unwinds its stack through the channel operation it is parked in,
        // which aborts the process (see `Park`): leak them, and report the panic.
        std::mem::forget(fibers);
        std::panic::resume_unwind(panic);
    }
}
