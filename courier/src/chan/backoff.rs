//! How long a channel operation spins before it parks.
//!
//! On this project's reference machine (2 vCPUs under KVM) waking a parked thread on the other
//! vCPU costs about 30 µs, while a peer that is running answers in well under a microsecond. So a
//! blocked operation first spins (`pause`), then, if it runs on an OS thread, gives its CPU
//! away with `sched_yield` a few times (another runnable thread, typically the peer it waits
//! for when threads outnumber CPUs, gets to run), and only then parks. A fiber never yields the
//! thread (that would stall its whole scheduler); it goes straight from spinning to parking,
//! which for a fiber is a cheap switch to its scheduler.
//!
//! The limits were chosen by measurement with `courier-bench ring` and `chan` (see
//! BENCHMARKS.md): a longer spin helps the 2-thread ring but costs every oversubscribed case.

use crate::sync;
use crate::sync::atomic::{AtomicUsize, Ordering};

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

// ===== adaptive spin before parking =====

/// Pauses between two attempts of a spinning operation (~70 ns here: `pause` is ~17 ns).
const PAUSES_PER_ATTEMPT: u32 = 4;
/// The most attempts a wait may spin: ~25 µs, about the cost of waking a sleeping vCPU (beyond
/// it, parking is cheaper whatever happens next: the ski-rental bound).
const MAX_ATTEMPTS: usize = if cfg!(loom) { 0 } else { 256 };
/// Attempts made even when spinning has stopped paying: the probe that notices it pays again.
const PROBE_ATTEMPTS: usize = if cfg!(loom) { 0 } else { 4 };
/// Where a new channel starts.
const INITIAL_ATTEMPTS: usize = if cfg!(loom) { 0 } else { 64 };

/// A spin budget learned per channel side: how long a blocked operation spins before it
/// registers and parks.
///
/// Spinning pays when the peer is running on another CPU (it answers in well under a
/// microsecond, and parking would cost a futex round trip plus, on an idle vCPU, ~30 µs of
/// wake-up); it is pure loss when the peer is not running (more threads than CPUs, a loaded
/// machine, or fibers of one scheduler). So the budget grows when a spin succeeds (to four times
/// what it took) and halves when a spin fails; a small probe is always made. The budget is a
/// hint: relaxed loads and stores, races only blur it.
pub(crate) struct SpinBudget {
    attempts: AtomicUsize,
}

impl SpinBudget {
    pub(crate) fn new() -> SpinBudget {
        SpinBudget {
            attempts: AtomicUsize::new(INITIAL_ATTEMPTS),
        }
    }

    /// Retries `attempt` (after one failed try) up to the budget. Learns from the outcome.
    #[inline]
    pub(crate) fn spin<R>(&self, may_spin: bool, mut attempt: impl FnMut() -> Option<R>) -> Option<R> {
        if !may_spin {
            return None;
        }
        let budget = self.attempts.load(Ordering::Relaxed).max(PROBE_ATTEMPTS);
        for k in 1..=budget {
            for _ in 0..PAUSES_PER_ATTEMPT {
                sync::spin_loop();
            }
            if let Some(r) = attempt() {
                let want = (4 * k + 16).min(MAX_ATTEMPTS);
                if want > budget {
                    self.attempts.store(want, Ordering::Relaxed);
                }
                return Some(r);
            }
        }
        self.attempts.store(budget / 2, Ordering::Relaxed);
        None
    }
}
