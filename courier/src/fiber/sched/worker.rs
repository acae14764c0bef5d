//! A worker thread's loop: where it finds its next fiber (its own queues in
//! turns, its inbox, the injector, then the other workers' queues), its
//! timers, how it waits for work, and the set of worker threads a runtime
//! owns.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Worker as Deque};
use crossbeam_utils::CachePadded;
use rustix::thread::CpuSet;

use super::{run, unpark, wake_here, Pinned, Queued, Shared, WorkerState, POLL_EVERY, WORKER};
use crate::fiber::affinity;
use crate::fiber::reactor::{poll_reactor, waits_for_io, Reactor};
use crate::fiber::stack;

/// The next fiber for worker `w`: the fibers at home here and its own
/// queue of new ones, in turns; its inbox; the injector; then the other
/// workers' queues.
fn find_work(w: &WorkerState) -> Option<Queued> {
    // The two queues take turns, so that neither a stream of new fibers nor
    // fibers that keep yielding hold the other's back.
    let turn = w.turn.get();
    w.turn.set(!turn);
    // The newest fiber joins the queue's back.
    if w.next_hint.replace(false) {
        if let Some(newest) = w.rt.take_next(w.index) {
            w.push_local(newest);
        }
    }
    let home = || w.pinned.pop_front();
    let found = match turn {
        true => home().or_else(|| w.pop_local()),
        false => w.pop_local().or_else(home),
    };
    if found.is_some() {
        return found;
    }
    if take_wake_ups(w) {
        if let Some(f) = w.pinned.pop_front() {
            return Some(f);
        }
    }
    loop {
        let mut retry = false;
        // (A batch stolen goes on this worker's deque.)
        w.local_maybe.set(true);
        match w.rt.injector.steal_batch_and_pop(&w.local) {
            Steal::Success(f) => return Some(f),
            Steal::Retry => retry = true,
            Steal::Empty => {}
        }
        let n = w.rt.stealers.len();
        for k in 1..n {
            let victim = (w.index + k) % n;
            match w.rt.stealers[victim].steal_batch_and_pop(&w.local) {
                Steal::Success(f) => return Some(f),
                Steal::Retry => retry = true,
                // The victim's newest fiber last: taken first, it would
                // split fibers spawned together one by one between the
                // workers, where a batch keeps neighbours together.
                Steal::Empty => {
                    if let Some(f) = w.rt.take_next(victim) {
                        return Some(f);
                    }
                }
            }
        }
        if !retry {
            return None;
        }
    }
}

/// Applies the wake-ups other threads sent worker `w` (up to
/// [`POLL_EVERY`] of them): `true` if any came.
fn take_wake_ups(w: &WorkerState) -> bool {
    let inbox = &w.rt.inboxes[w.index];
    let mut any = false;
    for _ in 0..POLL_EVERY {
        match inbox.steal() {
            Steal::Success(fiber) => {
                wake_here(w, &fiber);
                any = true;
            }
            Steal::Empty => break,
            Steal::Retry => {}
        }
    }
    any
}

/// Takes the work other threads made for worker `w` (the wake-ups in its
/// inbox, and a batch of the injector's new fibers) behind the fibers ready
/// here.
fn take_queued_elsewhere(w: &WorkerState) {
    take_wake_ups(w);
    w.local_maybe.set(true);
    if let Steal::Success(f) = w.rt.injector.steal_batch_and_pop(&w.local) {
        w.push_local(f);
    }
}

/// Fires the timers that are due; returns when the next one is.
fn fire_timers(w: &WorkerState) -> Option<Instant> {
    let now = Instant::now();
    loop {
        let due = {
            let mut timers = w.timers.borrow_mut();
            match timers.peek() {
                Some(Reverse(t)) if t.at <= now => timers.pop().map(|Reverse(t)| t.fiber),
                Some(Reverse(t)) => return Some(t.at),
                None => return None,
            }
        };
        if let Some(fiber) = due {
            unpark(&fiber);
        }
    }
}

/// Whether worker `w` could find anything to run.
fn has_work(w: &WorkerState) -> bool {
    !w.pinned.is_empty()
        || !w.local.is_empty()
        || w.rt
            .nexts
            .iter()
            .any(|n| !n.load(Ordering::Relaxed).is_null())
        || !w.rt.inboxes[w.index].is_empty()
        || !w.rt.injector.is_empty()
        || w.rt.stealers.iter().any(|s| !s.is_empty())
}

/// The first spin of an idle worker whose sleep was cut short by another
/// thread: a fiber woken from another worker (a channel's peer there) then
/// usually comes within microseconds, and sleeping costs that worker an
/// `epoll_wait` and its waker an `eventfd` write, and, in a virtual machine,
/// a halted CPU's wake-up of tens of microseconds.
const SPIN_START: Duration = Duration::from_micros(20);

/// The longest spin: a few times the ~30 µs a halted virtual CPU takes to
/// wake on these machines (Linux's guest halt-polling, `cpuidle-haltpoll`,
/// bounds its own window at 200 µs by default).
const SPIN_MAX: Duration = Duration::from_micros(100);

/// The spin before worker `w`'s next sleep, from the one it had (`spun`),
/// and how its last idle spell (`idle`, spin and sleep) ended, as guest
/// halt-polling adapts its window: a wake-up from another thread that came
/// within [`SPIN_MAX`] but after the spin doubles it (a longer spin would
/// have caught it); a longer spell halves it; a wake-up by the worker's own
/// descriptors or timers ends it (on a machine with as many busy threads as
/// CPUs, a spinning worker takes a CPU from them).
fn next_spin(spun: Duration, woken: bool, idle: Duration) -> Duration {
    if !woken {
        Duration::ZERO
    } else if idle < SPIN_MAX {
        (spun * 2).clamp(SPIN_START, SPIN_MAX)
    } else if spun / 2 < SPIN_START {
        Duration::ZERO
    } else {
        spun / 2
    }
}

/// Spins up to `spin` (not past the next timer) for work: `true` if some
/// came.
fn spin_for_work(w: &WorkerState, spin: Duration, next_timer: Option<Instant>) -> bool {
    let start = Instant::now();
    let until = next_timer.map_or(start + spin, |t| t.min(start + spin));
    loop {
        for _ in 0..SPIN_PAUSES {
            std::hint::spin_loop();
        }
        if has_work(w) {
            return true;
        }
        if w.rt.shutdown.load(Ordering::Relaxed) || Instant::now() >= until {
            return false;
        }
    }
}

/// `pause` instructions between two looks for work while spinning: about
/// 100 ns on these AMD guests, where a `pause` takes about 24 ns. (With 64,
/// 1.5 µs between looks, a fiber woken from the other worker waited 0.8 µs
/// on average for a spinning worker to notice it; the few cache lines a look
/// reads cost a busy worker on the other CPU nothing measurable at 100 ns.)
const SPIN_PAUSES: u32 = 4;

/// A worker thread's loop.
fn work(w: &WorkerState) {
    loop {
        if let Some(fiber) = find_work(w) {
            run(w, fiber, false);
            // Timers, descriptors and the work queued from other threads are
            // looked at now and then even while fibers are ready here, so
            // that a busy worker (a fiber that yields in a loop, say) does
            // not starve its waiting ones.
            let turns = w.since_poll.get() + 1;
            w.since_poll.set(turns);
            if turns >= POLL_EVERY {
                w.since_poll.set(0);
                if !w.timers.borrow().is_empty() {
                    fire_timers(w);
                }
                if waits_for_io(w) {
                    poll_reactor(w, Some(Duration::ZERO));
                }
                take_queued_elsewhere(w);
            }
            continue;
        }
        let next_timer = fire_timers(w);
        if has_work(w) {
            continue;
        }
        let idle_from = Instant::now();
        let spin = w.spin.get();
        if !spin.is_zero() && spin_for_work(w, spin, next_timer) {
            continue;
        }
        if w.rt.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Sleep: registered first, then a last look (see `Shared::wake_one`).
        // The count moves with the list, under its lock: a waker that takes
        // this worker off the list takes its count with it. (Counted after
        // the lock, a worker could be taken off and uncounted before it had
        // counted itself; the count then said one sleeper fewer than the
        // list held, and a wake-up for another sleeper read zero and went
        // nowhere.)
        {
            let mut sleepers = w.rt.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            sleepers.push(w.index);
            w.rt.idle.fetch_add(1, Ordering::SeqCst);
        }
        if !has_work(w) && !w.rt.shutdown.load(Ordering::Acquire) {
            let slept = Instant::now();
            let timeout = next_timer.map(|at| at.saturating_duration_since(slept));
            let woken = poll_reactor(w, timeout);
            w.spin.set(next_spin(spin, woken, idle_from.elapsed()));
        } else if waits_for_io(w) {
            poll_reactor(w, Some(Duration::ZERO));
        }
        let mut sleepers = w.rt.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = sleepers.iter().position(|&s| s == w.index) {
            sleepers.swap_remove(i);
            w.rt.idle.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A runtime's handle on its workers.
pub(crate) struct Workers {
    pub(crate) shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` worker threads whose fibers get `stack_size`-byte
    /// stacks, each bound to one of `cpus` (the set, and each in order) in
    /// turn, if given.
    pub(crate) fn start(
        count: usize,
        stack_size: usize,
        name: &str,
        cpus: Option<(CpuSet, Vec<usize>)>,
    ) -> io::Result<Workers> {
        let count = count.max(1);
        let deques: Vec<Deque<Queued>> = (0..count).map(|_| Deque::new_fifo()).collect();
        let shared = Arc::new(Shared {
            injector: Injector::new(),
            stealers: deques.iter().map(Deque::stealer).collect(),
            nexts: (0..count).map(|_| CachePadded::default()).collect(),
            inboxes: (0..count).map(|_| Injector::new()).collect(),
            reactors: (0..count)
                .map(|_| Reactor::new().map(Arc::new))
                .collect::<io::Result<_>>()?,
            sleepers: Mutex::new(Vec::new()),
            idle: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            stack_size,
        });
        let mut threads = Vec::with_capacity(count);
        let unbound = affinity::for_new_thread();
        for (index, local) in deques.into_iter().enumerate() {
            let rt = Arc::clone(&shared);
            let cpu = cpus
                .as_ref()
                .map(|(set, cpus)| (*set, cpus[index % cpus.len()]));
            let spawned = thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    affinity::restore(unbound);
                    if let Some((set, cpu)) = cpu {
                        affinity::bind(cpu, set);
                    }
                    let w = WorkerState {
                        index,
                        rt,
                        local,
                        local_maybe: Cell::new(false),
                        pinned: Pinned::new(),
                        timers: RefCell::new(BinaryHeap::new()),
                        timer_seq: Cell::new(0),
                        turn: Cell::new(false),
                        next_hint: Cell::new(false),
                        next_site: Cell::new(false),
                        io_waits: RefCell::new(HashMap::new()),
                        next_token: Cell::new(1),
                        since_poll: Cell::new(0),
                        spin: Cell::new(Duration::ZERO),
                        spare_fibers: RefCell::new(Vec::new()),
                    };
                    WORKER.with(|p| p.set(&w));
                    work(&w);
                    WORKER.with(|p| p.set(std::ptr::null()));
                    stack::flush_local();
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let workers = Workers { shared, threads };
                    drop(workers);
                    return Err(e);
                }
            }
        }
        Ok(Workers { shared, threads })
    }
}

impl Drop for Workers {
    /// Stops the workers once no fiber is ready to run. Fibers parked then
    /// stay parked: their memory is leaked, as a thread blocked forever
    /// keeps its own.
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for index in 0..self.shared.stealers.len() {
            self.shared.unpark_thread(index);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.shared.reactors.iter().for_each(|r| r.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_spin_grows_while_other_threads_wake_the_worker_soon_and_ends_otherwise() {
        let us = Duration::from_micros;
        // A worker that never spun, woken soon by another thread, spins next.
        assert_eq!(next_spin(Duration::ZERO, true, us(5)), SPIN_START);
        // Woken soon after its spin ran out: twice as long, up to the bound.
        assert_eq!(next_spin(us(20), true, us(30)), us(40));
        assert_eq!(next_spin(us(80), true, us(90)), SPIN_MAX);
        assert_eq!(next_spin(SPIN_MAX, true, us(99)), SPIN_MAX);
        // A long idle spell halves it, and below the first spin ends it.
        assert_eq!(next_spin(SPIN_MAX, true, us(500)), SPIN_MAX / 2);
        assert_eq!(next_spin(us(30), true, us(500)), Duration::ZERO);
        // Woken by its own descriptors or timers: no spin.
        assert_eq!(next_spin(SPIN_MAX, false, us(5)), Duration::ZERO);
    }
}
