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

/// Spin rounds: round `k` executes `2^k` `pause` instructions.
const SPIN_LIMIT: u32 = 6;
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

    /// Has the wait spun (and yielded) long enough that it should park?
    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.step > YIELD_LIMIT
    }
}
