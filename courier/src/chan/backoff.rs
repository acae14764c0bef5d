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

// ===== spin, then yield, then park =====

/// Attempts in the spinning phase; before attempt `k`, `2^min(k, 6)` `pause`s (~17 ns each
/// here): 191 pauses, ~3 µs in all. The gaps grow so that a receiver polling an empty channel
/// does not keep stealing the cache line its sender is writing (crossbeam's `Backoff` does the
/// same).
const SPIN_ATTEMPTS: u32 = 8;
/// How long the yielding phase lasts at most. Measured (`courier-bench ring`, idle machine):
/// 5 µs lets 4- and 16-thread rendezvous rings fall back to parking (17 µs/message), 20 µs
/// still half the time, 50-60 µs keeps them at 2-5 µs; longer buys nothing more.
const YIELD_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// Retries `attempt` while the peer is likely to answer soon: first spinning (`pause`) for about
/// three microseconds, then, on an OS thread, yielding the CPU for up to 50 µs.
///
/// Why both: on an idle machine the peer runs on the other CPU and answers within the spin,
/// and a `sched_yield` with nothing else to run returns in ~0.3 µs, so yielding keeps the
/// vCPU awake (parking would let it halt, and waking a halted vCPU costs ~30 µs). When threads
/// outnumber CPUs, the same `sched_yield` hands the CPU to another runnable thread, often the
/// peer itself, which is what parking would achieve, without the futex round trip. A fiber
/// neither spins long nor yields (`may_spin`/`may_yield_thread` false): its peer may be a fiber
/// of the same scheduler, which runs only once it parks.
#[inline]
pub(crate) fn spin_then_yield<R>(
    may_spin: bool,
    may_yield_thread: bool,
    mut attempt: impl FnMut() -> Option<R>,
) -> Option<R> {
    if cfg!(loom) {
        return None;
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
    None
}
