//! How a channel operation waits before it parks, and how it backs off inside the lock-free
//! algorithms.
//!
//! On this project's reference machine (2 vCPUs under KVM) waking a parked thread on the other
//! vCPU costs about 30 µs, while a peer that is running answers in well under a microsecond.
//! [`spin_then_yield`] is the policy before parking (measured; see its docs); [`Backoff`] is the
//! short exponential spin used where a lock-free operation waits for another one in flight (a
//! lost CAS: spin only; a sender between its claim and its write, or a peer that got to the slot
//! first: spin, then yield, since that peer may be waiting for this CPU).

use super::context::{current_may_spin, yield_current};
use crate::sync;

/// Spin rounds: round `k` executes `2^k` `pause` instructions. Under loom every round is one
/// scheduling point (each `spin_loop` is one; more would only grow the model).
const SPIN_LIMIT: u32 = if cfg!(loom) { 0 } else { 6 };
/// Where [`Backoff::contended`] starts (under loom: at the cap, one scheduling point a
/// round, as everywhere).
const CONTENDED_STEP: u32 = if cfg!(loom) { 0 } else { 4 };
/// Rounds after which a wait has backed off enough to park ([`Backoff::is_completed`]: the
/// brief poll of a bounded channel's receivers); `snooze` itself keeps yielding.
const YIELD_LIMIT: u32 = 10;

/// Exponential backoff for one wait.
pub(crate) struct Backoff {
    step: u32,
}

// Under loom `SPIN_LIMIT` is 0, which makes some of the comparisons below constant.
#[cfg_attr(
    loom,
    allow(clippy::absurd_extreme_comparisons, clippy::unnecessary_min_or_max)
)]
impl Backoff {
    #[inline]
    pub(crate) const fn new() -> Backoff {
        Backoff { step: 0 }
    }

    /// A backoff for a loop whose CAS races other threads for one word (the unbounded
    /// flavor's `tail` and `head`): its first lost race already spins 2^[`CONTENDED_STEP`]
    /// `pause`s instead of one.
    ///
    /// A lost race means the word's line has just moved to the winner's CPU, and the winner
    /// is likely to want it again at once (a sender streaming its next message); taking it
    /// straight back makes both of them pay a transfer a message. Measured with
    /// `AB_CAP=unbounded AB_RECEIVERS=4|1 buffered_ab 4 5 barrier` (`courier-bench/examples`;
    /// four senders, four receivers or one), builds in turn, in the machine's fast mode:
    /// crossbeam-channel's time over courier's is 1.14-1.18x (4 x 4) and 1.06-1.44x (4 x 1)
    /// with this, 1.0-1.2x and 1.05-1.26x when the first lost race spins one `pause`; retrying
    /// with no spin at all is 1.5-2x slower, and starting at 2^2 or 2^6 measures no better
    /// than 2^4 (slow mode).
    ///
    /// Two consequences: a race lost in the inlined first pass of a claim (`reserve_send`,
    /// `reserve_recv`) is retried at once by the loop it falls into, and only a second loss
    /// spins; and a wait in such a loop for another thread's step (`snooze` on a block being
    /// installed) spins for fewer rounds before it yields, since both share the step.
    #[inline]
    pub(crate) const fn contended() -> Backoff {
        Backoff {
            step: CONTENDED_STEP,
        }
    }

    /// Backs off after a lost CAS race: spinning only, never yielding (the winner has finished
    /// its step: retrying at once can succeed).
    #[inline]
    pub(crate) fn spin(&mut self) {
        for _ in 0..1u32 << self.step.min(SPIN_LIMIT) {
            sync::spin_loop();
        }
        if self.step <= SPIN_LIMIT {
            self.step += 1;
        }
    }

    /// Has this wait spun and yielded as long as it should before parking?
    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.step > YIELD_LIMIT
    }

    /// Backs off while waiting for another task to finish a step it has begun: spin, then
    /// step aside ([`yield_current`]: a thread yields its CPU, a fiber lets its scheduler run
    /// the others, one of which may be the task waited for).
    ///
    /// A fiber whose scheduler has other tasks ready ([`Park::may_spin`] false) steps aside at
    /// once: the task it waits for may be one of them, and then no spin on this thread could
    /// see it progress.
    ///
    /// [`Park::may_spin`]: super::Park::may_spin
    #[inline]
    pub(crate) fn snooze(&mut self) {
        if self.step <= SPIN_LIMIT && current_may_spin() {
            for _ in 0..1u32 << self.step.min(SPIN_LIMIT) {
                sync::spin_loop();
            }
        } else {
            yield_current();
        }
        if self.step <= YIELD_LIMIT {
            self.step += 1;
        }
    }
}

// ===== before parking: yield (threads) or spin (fibers) =====

/// What the waiters of one channel side share while they poll before parking: how long
/// spinning has been paying there ([`SpinEstimate`]).
///
/// Every waiter polls first, then registers and parks; a peer that makes the side ready wakes
/// one registered waiter whenever there is one (`SyncWaitList::notify`), polling or not.
///
/// Leaving the wake-up to the pollers while any poll (which keeps a futex wake off the peer's
/// critical path) measures slower: a sender parked behind a full slot then stays parked while
/// another sender polls, a receiver that frees the slot never moves the parked sender's message
/// into it (the bounded flavors' hand-off runs on a wake-up), and the next message waits for a
/// polling sender to be scheduled. `courier-bench chan --full --case c_bounded1` in the
/// machine's fast mode, crossbeam-channel's time over courier's, always waking against
/// skipping: `mpsc_bounded1` 1.07-1.74x against 0.71-0.87x, `mpmc_bounded1` 1.33-2.16x against
/// 0.63-0.78x; the rings of 4 and 16 threads over `bounded(1)` the same either way.
pub(crate) struct Pollers {
    /// How long a polling thread spins before its first yield: see [`SpinEstimate`].
    spin: SpinEstimate,
}

impl Pollers {
    pub(crate) fn new() -> Pollers {
        Pollers {
            spin: SpinEstimate::new(),
        }
    }

    /// The side's spin estimate.
    #[inline]
    pub(crate) fn spin(&self) -> &SpinEstimate {
        &self.spin
    }
}

/// How long a waiting thread keeps polling between `sched_yield`s before it parks.
const YIELD_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// Attempts a fiber makes while spinning; before attempt `k`, `2^min(k, 3)` `pause`s (17-24 ns
/// each on these AMD guests): 191 pauses, 3-5 µs in all. The first gaps grow, so that a peer
/// that answers at once finds the cache line it writes left alone; later gaps stay at 8 pauses
/// (about 200 ns), because the spin also watches for work that other threads hand the fiber's
/// worker (`Park::may_spin`), which runs only once the fiber stops spinning. Gaps that grew to
/// 64 pauses (1.5 µs) made a fiber woken from another worker wait about twice as long for its
/// turn: 0.6-1.6 µs a hop from worker to worker in a one-token ring of fibers, 0.25-0.55 µs
/// with these gaps and the idle worker's own looks 100 ns apart.
const SPIN_ATTEMPTS: u32 = 26;

/// Retries `attempt` while the peer is likely to answer soon; `None` means: register and park.
///
/// (A thread waiting on a buffered channel side has spun before this, for as long as its side's
/// [`SpinEstimate`] says spinning has been paying: [`spin_adaptively`]. The rendezvous hand-off
/// and `Select`, which wait on their claim word, come here straight away; so does a capacity-one
/// waiter, after that spin and its registration.)
///
/// **A thread polls between `sched_yield`s for up to 50 µs.** On an idle machine a yield with
/// nothing else to run returns in ~0.3 µs, so this polls about as fast as a spin would, and it
/// keeps the vCPU awake: parking would let it halt, and waking a halted vCPU costs ~30 µs here.
/// When threads outnumber CPUs, the same yield hands the CPU to another runnable thread, often
/// the peer being waited for, which is what parking achieves, minus the futex round trip.
/// Measured with `courier-bench ring`, against a fixed `pause` spin of 1-3 µs before the
/// yields: yielding at once is faster in every ring (the `bounded(1)` rings of 4 and 16 threads
/// 2-3x; the adaptive spin above costs them 10-30%), and a yield phase of 5 µs lets the 4- and
/// 16-thread rendezvous rings fall back to parking (17 µs a message) where 50 µs keeps them at
/// 2-5 µs. `docs/waiting-policy.md` gives the whole policy and its measurements.
///
/// **A fiber never yields the thread** (that would stall its whole scheduler): it spins for
/// 3-5 µs while its scheduler allows (`Park::may_spin`: nothing else to run, asked before every
/// attempt), then parks, which for a fiber is a switch to its scheduler. Asked once, a fiber
/// kept spinning after another thread had woken a fiber of its worker, which waited out the
/// whole spin: 4-5 µs of every hop from one worker to the other in a one-token ring of fibers
/// on two workers (`courier-bench ring --case ring_fiber1_100_w2`).
///
/// A thread stops polling at `deadline` if that comes first (the short spins do not look).
#[inline]
pub(crate) fn spin_then_yield<R>(
    may_spin: impl Fn() -> bool,
    may_yield_thread: bool,
    deadline: Option<std::time::Instant>,
    mut attempt: impl FnMut() -> Option<R>,
) -> Option<R> {
    if cfg!(loom) {
        // One attempt, which is all the models need of a poll (spinning would only grow them).
        return attempt();
    }
    if may_yield_thread {
        let give_up = std::time::Instant::now() + YIELD_FOR;
        let give_up = deadline.map_or(give_up, |d| d.min(give_up));
        loop {
            sync::thread::yield_now();
            if let Some(r) = attempt() {
                return Some(r);
            }
            if std::time::Instant::now() >= give_up {
                return None;
            }
        }
    }
    for k in 0..SPIN_ATTEMPTS {
        if !may_spin() {
            break;
        }
        for _ in 0..1u32 << k.min(3) {
            sync::spin_loop();
        }
        if let Some(r) = attempt() {
            return Some(r);
        }
    }
    None
}

/// A thread's spin before it polls between yields: as many attempts as `estimate` allows (one
/// attempt after one `pause` when spinning has not been paying; at most crossbeam's whole
/// spin), attempt `k` after `2^min(k-1, 6)` `pause`s; and every [`EXPLORE_EVERY`]th wait of
/// the thread, the whole spin, to find out whether longer spins would pay (see
/// [`SpinEstimate`]). Nothing under loom: the models make their one attempt in
/// [`spin_then_yield`].
///
/// Out of line: it runs only once a wait has begun, and inlined (with the exploring wait's
/// thread-local counter) it changes the code of the send and receive fast paths beside it
/// enough to move `courier-bench chan --full --case spsc_boundedN` (a million messages) from 13
/// to 15-29 ns a message. How closely a receiver trails its sender there depends on the exact
/// timing of both loops.
#[inline(never)]
pub(crate) fn spin_adaptively<R>(
    estimate: &SpinEstimate,
    attempt: &mut impl FnMut() -> Option<R>,
) -> Option<R> {
    if cfg!(loom) {
        return None;
    }
    let limit = if explores() {
        SPIN_MAX
    } else {
        estimate.limit()
    };
    for k in 1..=limit {
        for _ in 0..1u32 << (k - 1).min(6) {
            sync::spin_loop();
        }
        if let Some(r) = attempt() {
            estimate.record(k);
            return Some(r);
        }
    }
    // Only a whole spin that ran out says spinning does not pay; a shorter one says nothing
    // about the attempts it did not make.
    if limit == SPIN_MAX {
        estimate.record(0);
    }
    None
}

/// One wait in this many spins the whole spin whatever the estimate says.
///
/// Without it the estimate could not grow where only long spins pay: `mpmc_bounded1` (four
/// senders and four receivers on a capacity-one channel, two CPUs) has a counterpart on the
/// other CPU take the slot within ~1-2 µs, but a spin of a few `pause`s never sees it, so every
/// wait would run out, pull the estimate to the floor, and go on to poll between
/// `sched_yield`s: two yields and 1.6 context switches a message (`perf stat`), against
/// crossbeam's 0.06. Exploring (1 in 64), with and without, builds in turn:
/// `AB_CAP=1 AB_RECEIVERS=4 buffered_ab 4 5 barrier` (`courier-bench/examples`) 0.73-0.96 µs a
/// message against 1.68-1.88 (crossbeam 1.06-1.22); `courier-bench chan --case _bounded1`:
/// `mpmc_bounded1` 0.84-1.45 µs against 1.64-1.98, `mpsc_bounded1` 1.27-1.30 against
/// 1.65-1.91, `spsc_bounded1` 369-431 ns against 537-545; `courier-bench ring --case
/// ring_bounded1_2` 161-168 ns against 284-1280; the `bounded(1)` rings of 4 and 16 threads,
/// where no spin pays, 0-10% slower. One in 16 costs those rings 15-20%.
const EXPLORE_EVERY: u32 = 64;

/// Is this wait of the calling thread one that explores?
#[inline]
fn explores() -> bool {
    thread_local! {
        /// The thread's waits so far (wrapping).
        static WAITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    WAITS.with(|waits| {
        let n = waits.get().wrapping_add(1);
        waits.set(n);
        n % EXPLORE_EVERY == 0
    })
}

/// Attempts a thread spins before yielding when spinning has not been paying (one `pause`; 2
/// attempts measure no better in `courier-bench chan --case _bounded1`).
const SPIN_FLOOR: u32 = 1;
/// Most attempts a thread spins before yielding (127 pauses, ~2.2 µs: crossbeam's whole spin
/// phase).
const SPIN_MAX: u32 = 7;
/// Fixed-point scale of the estimate (so that 1/8 steps move small values).
const SCALE: u32 = 16;

/// An adaptive spin limit for one channel side: the threads polling it spin before they yield
/// for up to twice the number of attempts recent successful spins took (plus a small floor), and
/// a whole spin that runs out pulls the estimate towards zero (a shorter one that runs out
/// leaves it: it did not try the attempts that might have paid, which the occasional whole
/// spin of [`spin_adaptively`] explores).
///
/// Spinning pays when the peer that will make the operation ready is running on another CPU
/// (`mpmc_bounded1`: a sender and a receiver on two CPUs hand the one slot back and forth),
/// and wastes the CPU when the peer must first be scheduled on this one (a ring of more
/// threads than CPUs): the estimate finds out which, per channel, from what spinning achieved.
/// The same idea as glibc's adaptive mutexes (`__spins`, a running average moved 1/8 of the way
/// per acquisition) and Solaris's adaptive locks, except that here a whole spin that fails
/// shrinks the estimate instead of growing it.
///
/// Since only whole spins shrink it, an estimate in the middle of its range falls back only
/// through the exploring waits: from a limit of 5 to the floor takes about 14 of them, some 900
/// waits, each spending its partial spin meanwhile. Where no spin pays (the rings of 4 and 16
/// threads) that measures 0-10% slower; letting every short failure shrink it keeps
/// `mpmc_bounded1` at 1.06-1.24 µs against 0.73-0.96.
///
/// Measured with `courier-bench chan` and `ring`, quick, builds in turn, spinning adaptively
/// against not spinning before the yields: `mpmc_bounded1` 0.85-1.37 µs a message against
/// 1.5-1.8, `mpsc_bounded1` 0.90-1.17 against 1.5-2.9; the 4- and 16-thread `bounded(1)` rings
/// 10-30% slower (`scripts/ab.sh`, 9 samples: 1.05-1.35 µs against 0.85-0.98, still 1.8x ahead
/// of crossbeam), the two-thread one 0-13% faster. Used by the buffered flavors (see
/// `SyncWaitList::spin`).
///
/// A heuristic only: racy read-modify-writes may lose updates, which changes nothing but timing.
pub(crate) struct SpinEstimate(std::sync::atomic::AtomicU32);

impl SpinEstimate {
    pub(crate) const fn new() -> SpinEstimate {
        SpinEstimate(std::sync::atomic::AtomicU32::new(0))
    }

    /// Attempts to spin now.
    #[inline]
    fn limit(&self) -> u32 {
        let s = self.0.load(std::sync::atomic::Ordering::Relaxed);
        (2 * s / SCALE + SPIN_FLOOR).min(SPIN_MAX)
    }

    /// Records a spin that succeeded at attempt `k`, or ran out (`k == 0`).
    #[inline]
    fn record(&self, k: u32) {
        let s = self.0.load(std::sync::atomic::Ordering::Relaxed);
        let target = k * SCALE;
        let next = if target >= s {
            s + (target - s) / 8
        } else {
            s - (s - target) / 8
        };
        if next != s {
            self.0.store(next, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_spin_estimate_grows_with_late_successes_and_falls_back_to_the_floor() {
        let estimate = SpinEstimate::new();
        assert_eq!(estimate.limit(), SPIN_FLOOR);
        // Spins that succeed at their last attempt ask for longer ones, up to the cap.
        for _ in 0..200 {
            estimate.record(estimate.limit());
        }
        assert_eq!(estimate.limit(), SPIN_MAX);
        // Spins that run out bring it back down to the floor, never below.
        for _ in 0..200 {
            estimate.record(0);
        }
        assert_eq!(estimate.limit(), SPIN_FLOOR);
        // Quick successes settle it near twice their attempt count.
        for _ in 0..200 {
            estimate.record(1);
        }
        assert!((SPIN_FLOOR..=SPIN_FLOOR + 2).contains(&estimate.limit()));
    }

    #[test]
    fn a_thread_explores_one_wait_in_every_explore_every() {
        std::thread::spawn(|| {
            let explored = (0..10 * EXPLORE_EVERY).filter(|_| explores()).count();
            assert_eq!(explored, 10);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn only_a_whole_spin_that_runs_out_shrinks_the_estimate() {
        let estimate = SpinEstimate::new();
        for _ in 0..200 {
            estimate.record(SPIN_MAX);
        }
        let grown = estimate.0.load(std::sync::atomic::Ordering::Relaxed);
        // Fewer than `EXPLORE_EVERY` waits, so none explores: each stops at the limit, which
        // is the whole spin here, and runs out.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(spin_adaptively(&estimate, &mut || None::<()>), None);
            });
        });
        let after_whole = estimate.0.load(std::sync::atomic::Ordering::Relaxed);
        assert!(after_whole < grown);
        // With a limit short of the whole spin (quick successes put it at two attempts), spins
        // that run out leave the estimate where it is: they did not try the longer attempts.
        let estimate = SpinEstimate::new();
        for _ in 0..20 {
            estimate.record(1);
        }
        assert!((2..SPIN_MAX).contains(&estimate.limit()));
        let low = estimate.0.load(std::sync::atomic::Ordering::Relaxed);
        let shrunk = SpinEstimate(std::sync::atomic::AtomicU32::new(low));
        shrunk.record(0);
        assert!(
            shrunk.0.load(std::sync::atomic::Ordering::Relaxed) < low,
            "a recorded failure would have shrunk it"
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..EXPLORE_EVERY - 1 {
                    assert_eq!(spin_adaptively(&estimate, &mut || None::<()>), None);
                }
            });
        });
        assert_eq!(estimate.0.load(std::sync::atomic::Ordering::Relaxed), low);
    }
}
