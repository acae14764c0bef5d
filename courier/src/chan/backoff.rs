//! How a channel operation waits before it parks, and how it backs off inside the lock-free
//! algorithms.
//!
//! On this project's reference machine (2 vCPUs under KVM) waking a parked thread on the other
//! vCPU costs about 30 µs, while a peer that is running answers in well under a microsecond.
//! [`spin_then_yield`] is the policy before parking (measured; see its docs); [`Backoff`] is the
//! short exponential spin used where a lock-free operation waits for another one in flight (a
//! lost CAS, a sender between its claim and its write).

use crate::sync;

/// Spin rounds: round `k` executes `2^k` `pause` instructions. Under loom every round is one
/// scheduling point (each `spin_loop` is one; more would only grow the model).
const SPIN_LIMIT: u32 = if cfg!(loom) { 0 } else { 6 };
/// Rounds after which a thread stops yielding and parks.
const YIELD_LIMIT: u32 = 10;

/// Exponential backoff for one wait.
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    #[inline]
    pub(crate) const fn new() -> Backoff {
        Backoff { step: 0 }
    }

    /// Backs off after a lost CAS race: spinning only, never yielding (the winner is running).
    #[inline]
    pub(crate) fn spin(&mut self) {
        for _ in 0..1u32 << self.step.min(SPIN_LIMIT) {
            sync::spin_loop();
        }
        if self.step <= SPIN_LIMIT {
            self.step += 1;
        }
    }

    /// Backs off while waiting for another task to make progress: spin, then (threads only)
    /// yield the CPU.
    #[inline]
    pub(crate) fn snooze(&mut self, may_yield_thread: bool) {
        if self.step <= SPIN_LIMIT || !may_yield_thread {
            for _ in 0..1u32 << self.step.min(SPIN_LIMIT) {
                sync::spin_loop();
            }
        } else {
            sync::thread::yield_now();
        }
        if self.step <= YIELD_LIMIT {
            self.step += 1;
        }
    }
}

// ===== before parking: yield (threads) or spin (fibers) =====

/// One polling waiter per channel side: the right to spin or yield before parking.
///
/// Polling pays when the peer is about to answer. With several tasks waiting on the same side
/// (4 senders on a full `bounded(1)`), only one of them can be answered next, and the others,
/// yielding in turn, would take most of the CPU time from the receiver that has to make room
/// (measured: 1.8 µs per message against crossbeam's 66 ns on `mpsc_bounded1`). So the first
/// waiter polls and the others park at once; and a peer that makes the side ready while a
/// waiter polls leaves the wake-up to that poller (it takes what became ready within a
/// microsecond) instead of waking a parked one (a futex wake on the peer's critical path).
///
/// Not under loom: models never poll, and the right is never taken.
pub(crate) struct PollRight {
    taken: crate::sync::atomic::AtomicBool,
}

/// Holds a side's [`PollRight`]; gives it back on drop.
pub(crate) struct Polling<'a>(&'a PollRight);

impl PollRight {
    pub(crate) fn new() -> PollRight {
        PollRight {
            taken: crate::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Takes the right to poll, if no other waiter of this side holds it.
    #[inline]
    pub(crate) fn try_take(&self) -> Option<Polling<'_>> {
        use crate::sync::atomic::Ordering;
        if cfg!(loom) {
            return None;
        }
        // SeqCst: see `is_taken`.
        (!self.taken.load(Ordering::Relaxed) && !self.taken.swap(true, Ordering::SeqCst))
            .then_some(Polling(self))
    }

    /// Is a waiter polling? A notifier that changed the channel (SeqCst RMW) and sees `true`
    /// may skip waking anyone.
    ///
    /// SYNC POINT: against [`Polling`]'s drop. If this SeqCst load reads `true`, it comes
    /// before the poller's SeqCst store of `false` in the SeqCst order, so the poller's
    /// re-check after it registers (SeqCst loads, after that store) sees the notifier's change:
    /// a poller that gives up still finds what it was not woken for.
    #[inline]
    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(crate::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        // SYNC POINT: see `PollRight::is_taken`.
        self.0
            .taken
            .store(false, crate::sync::atomic::Ordering::SeqCst);
    }
}

/// How long a waiting thread keeps polling between `sched_yield`s before it parks.
const YIELD_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// Attempts a fiber makes while spinning; before attempt `k`, `2^min(k, 6)` `pause`s (~17 ns
/// each here): 191 pauses, ~3 µs in all, with growing gaps so that polling does not keep
/// stealing the cache line the peer writes.
const SPIN_ATTEMPTS: u32 = 8;

/// Retries `attempt` while the peer is likely to answer soon; `None` means: register and park.
///
/// **A thread polls between `sched_yield`s for up to 50 µs.** On an idle machine a yield with
/// nothing else to run returns in ~0.3 µs, so this polls about as fast as a spin would, and it
/// keeps the vCPU awake: parking would let it halt, and waking a halted vCPU costs ~30 µs here.
/// When threads outnumber CPUs, the same yield hands the CPU to another runnable thread, often
/// the peer being waited for, which is what parking achieves, minus the futex round trip.
/// Measured with `courier-bench ring` (see BENCHMARKS.md), against a `pause` spin of 1-3 µs
/// before the yields: yielding at once was faster in every ring (bounded(1) rings of 4 and 16
/// threads 2-3x), and a yield phase of 5 µs lets 4- and 16-thread rendezvous rings fall back to
/// parking (17 µs/message) where 50 µs keeps them at 2-5 µs.
///
/// **A fiber never yields the thread** (that would stall its whole scheduler): it spins for
/// ~3 µs if its scheduler allows (`Park::may_spin`: nothing else to run), then parks, which for
/// a fiber is a switch to its scheduler.
#[inline]
pub(crate) fn spin_then_yield<R>(
    may_spin: bool,
    may_yield_thread: bool,
    mut attempt: impl FnMut() -> Option<R>,
) -> Option<R> {
    if cfg!(loom) {
        return None;
    }
    if may_yield_thread {
        let start = std::time::Instant::now();
        loop {
            sync::thread::yield_now();
            if let Some(r) = attempt() {
                return Some(r);
            }
            if start.elapsed() >= YIELD_FOR {
                return None;
            }
        }
    }
    if may_spin {
        for k in 0..SPIN_ATTEMPTS {
            for _ in 0..1u32 << k.min(6) {
                sync::spin_loop();
            }
            if let Some(r) = attempt() {
                return Some(r);
            }
        }
    }
    None
}
