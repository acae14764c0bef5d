//! Clocks and samplers.
//!
//! Three clocks are read around every sample:
//!
//! | clock | source | what it answers |
//! | --- | --- | --- |
//! | wall | `Instant` (`CLOCK_MONOTONIC`, vDSO) | how long the caller waited |
//! | thread CPU | `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` | how long this thread ran (the clock of the Linux `iov_iter` dispatch patch's test program) |
//! | cycles | `rdtsc` on x86_64 | the unit of the rump kernel send-path measurements; elsewhere the monotonic clock in ns |
//!
//! Wall and CPU time differ when the thread blocks (a cross-process wake-up)
//! or is preempted; suites report the CPU figure where that difference is the
//! point. `rdtsc` counts reference cycles at the TSC's constant rate (the
//! nominal frequency), as those measurements did, not the core's current clock.
//!
//! A sample must be long enough for its clock reads not to matter: reading the
//! thread CPU clock is a real system call (a few hundred ns), so a [`Sampler`]
//! groups `ops` operations per sample and divides. The wall and cycle reads sit
//! innermost, next to the work.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};

/// The unit of [`cycles`]: TSC reference cycles on x86_64, nanoseconds elsewhere.
pub const CYCLES_UNIT: &str = if cfg!(target_arch = "x86_64") {
    "cycles"
} else {
    "ns"
};

/// A cycle counter: `rdtsc` on x86_64, the monotonic clock in ns elsewhere.
#[inline(always)]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86_64 CPU and only reads the
        // time-stamp counter; it touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// Nanoseconds on the monotonic clock.
#[inline]
pub fn monotonic_ns() -> u64 {
    timespec_ns(clock_gettime(ClockId::Monotonic))
}

/// CPU time consumed by the calling thread, in nanoseconds.
#[inline]
pub fn thread_cpu_ns() -> u64 {
    timespec_ns(clock_gettime(ClockId::ThreadCPUTime))
}

fn timespec_ns(t: rustix::time::Timespec) -> u64 {
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// How many [`cycles`] tick per nanosecond, measured once per process
/// against the monotonic clock over 20 ms (the TSC rate is constant on this
/// kind of CPU, `constant_tsc nonstop_tsc`). Exactly 1 without a TSC.
pub fn cycles_per_ns() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") {
            return 1.0;
        }
        let (c0, t0) = (cycles(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (c1, t1) = (cycles(), Instant::now());
        (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64
    })
}

/// Per-operation figures of every sample a [`Sampler`] took.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    /// Operations per sample; every figure below is divided by it.
    pub ops: u64,
    /// Wall time per operation, ns.
    pub wall_ns: Vec<f64>,
    /// Thread CPU time per operation, ns.
    pub cpu_ns: Vec<f64>,
    /// [`cycles`] per operation.
    pub cycles: Vec<f64>,
}

impl Sampled {
    /// Operations per second of wall time, one value per sample.
    pub fn per_s(&self) -> Vec<f64> {
        self.wall_ns.iter().map(|ns| 1e9 / ns).collect()
    }

    /// Bytes per second of wall time when every operation moves `bytes`.
    pub fn bytes_per_s(&self, bytes: u64) -> Vec<f64> {
        self.wall_ns
            .iter()
            .map(|ns| bytes as f64 * 1e9 / ns)
            .collect()
    }
}

/// Runs a closure for a warm-up, then for `samples` timed samples of `ops`
/// operations each.
///
/// ```
/// use courier_bench::harness::measure::Sampler;
///
/// let (a, b) = std::os::unix::net::UnixDatagram::pair()?;
/// let mut buf = [0u8; 64];
/// let s = Sampler::new(20).ops(100).run(|ops| {
///     for _ in 0..ops {
///         a.send(b"ping")?;
///         b.recv(&mut buf)?;
///     }
///     Ok::<(), std::io::Error>(())
/// })?;
/// assert_eq!(s.wall_ns.len(), 20); // one figure per sample, per operation
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    samples: usize,
    warmup: usize,
    ops: u64,
}

impl Sampler {
    /// `samples` timed samples of one operation, after a warm-up of a tenth as
    /// many (at least one).
    pub fn new(samples: usize) -> Sampler {
        let samples = samples.max(1);
        Sampler {
            samples,
            warmup: (samples / 10).max(1),
            ops: 1,
        }
    }

    /// Untimed samples run first, to fault in memory, train predictors and
    /// let the frequency settle.
    pub fn warmup(self, samples: usize) -> Sampler {
        Sampler {
            warmup: samples,
            ..self
        }
    }

    /// Operations the closure performs per sample (the figures are per
    /// operation).
    pub fn ops(self, ops: u64) -> Sampler {
        Sampler {
            ops: ops.max(1),
            ..self
        }
    }

    /// Times `f(ops)` once per sample. `f` performs `ops` operations.
    pub fn run<E>(&self, mut f: impl FnMut(u64) -> Result<(), E>) -> Result<Sampled, E> {
        self.run_batched(|| (), |()| f(black_box(self.ops)))
    }

    /// Like [`run`](Self::run), with an untimed `setup` before every sample
    /// whose value the timed `routine` consumes; what the routine returns is
    /// dropped after the clocks stop (e.g. an `munmap`).
    pub fn run_batched<S, R, E>(
        &self,
        mut setup: impl FnMut() -> S,
        mut routine: impl FnMut(S) -> Result<R, E>,
    ) -> Result<Sampled, E> {
        for _ in 0..self.warmup {
            let input = setup();
            drop(black_box(routine(input)?));
        }
        let ops = self.ops as f64;
        let mut out = self.empty();
        for _ in 0..self.samples {
            let input = setup();
            out.sample(ops, || routine(black_box(input)))?;
        }
        Ok(out)
    }

    /// Like [`run`](Self::run) for several subjects that take turns: after
    /// each one's warm-up, every round times one sample of each, starting one
    /// subject further along each round (so that no subject always follows
    /// the same one, or always runs first after the warm-ups).
    /// The slow drifts of a shared machine (other jobs, the other vCPU's
    /// load, frequency) then fall on all subjects alike instead of on
    /// whichever ran while they lasted, and the ratios between subjects hold
    /// even when the absolute figures move. Each turn starts with one
    /// untimed operation, so that a sample finds its subject as warm as a
    /// steady stream would (the others ran in between: with one 8 MiB
    /// message per sample, a cold turn measures the allocator's page faults).
    pub fn interleave<E>(&self, subjects: &mut [Ops<'_, E>]) -> Result<Vec<Sampled>, E> {
        for run in subjects.iter_mut() {
            for _ in 0..self.warmup {
                run(black_box(self.ops))?;
            }
        }
        let ops = self.ops as f64;
        let mut out: Vec<Sampled> = subjects.iter().map(|_| self.empty()).collect();
        for round in 0..self.samples {
            for i in rotation(round, subjects.len()) {
                let run = &mut subjects[i];
                run(black_box(1))?;
                out[i].sample(ops, || run(black_box(self.ops)))?;
            }
        }
        Ok(out)
    }

    fn empty(&self) -> Sampled {
        Sampled {
            ops: self.ops,
            wall_ns: Vec::with_capacity(self.samples),
            cpu_ns: Vec::with_capacity(self.samples),
            cycles: Vec::with_capacity(self.samples),
        }
    }
}

/// One subject of [`Sampler::interleave`]: performs the operations it is
/// given the number of.
pub type Ops<'a, E> = Box<dyn FnMut(u64) -> Result<(), E> + 'a>;

impl Sampled {
    /// Times `routine` (`ops` operations) and appends the sample; what it
    /// returns is dropped after the clocks stop.
    fn sample<R, E>(&mut self, ops: f64, routine: impl FnOnce() -> Result<R, E>) -> Result<(), E> {
        let cpu0 = thread_cpu_ns();
        let wall0 = Instant::now();
        let c0 = cycles();
        let output = routine()?;
        let c1 = cycles();
        let wall = wall0.elapsed();
        let cpu1 = thread_cpu_ns();
        drop(black_box(output));
        self.wall_ns.push(wall.as_nanos() as f64 / ops);
        self.cpu_ns.push((cpu1 - cpu0) as f64 / ops);
        self.cycles.push(c1.wrapping_sub(c0) as f64 / ops);
        Ok(())
    }
}

/// One figure per operation, for latency distributions (p50, p99) where
/// grouping would hide the tail: see [`time_each`].
#[derive(Clone, Debug, Default)]
pub struct Each {
    /// Wall time of every timed operation, ns (from [`cycles`]).
    pub ns: Vec<f64>,
    /// Thread CPU time over all timed operations, divided by their number.
    pub cpu_ns_per_op: f64,
}

/// Runs `op` `warmup` times untimed, then `n` times timing each one with
/// [`cycles`] (two counter reads, ~20 ns on x86_64, no system call).
pub fn time_each<E>(
    warmup: usize,
    n: usize,
    mut op: impl FnMut() -> Result<(), E>,
) -> Result<Each, E> {
    for _ in 0..warmup {
        op()?;
    }
    let mut ticks = Vec::with_capacity(n);
    let cpu0 = thread_cpu_ns();
    for _ in 0..n {
        let c0 = cycles();
        op()?;
        ticks.push(cycles().wrapping_sub(c0));
    }
    let cpu1 = thread_cpu_ns();
    let rate = cycles_per_ns();
    Ok(Each {
        ns: ticks.into_iter().map(|t| t as f64 / rate).collect(),
        cpu_ns_per_op: (cpu1 - cpu0) as f64 / n.max(1) as f64,
    })
}

/// One operation of a subject of [`time_each_interleaved`].
pub type Op<'a, E> = Box<dyn FnMut() -> Result<(), E> + 'a>;

/// [`time_each`] for several subjects that take turns: after each one's
/// warm-up, `rounds` rounds in which every subject times `n / rounds` of its
/// operations (see [`Sampler::interleave`] for why), each turn after one
/// untimed operation, as there (timing the first of each turn made a fifth
/// of the 8 MiB round trips of a quick run cold ones).
pub fn time_each_interleaved<E>(
    warmup: usize,
    n: usize,
    rounds: usize,
    subjects: &mut [Op<'_, E>],
) -> Result<Vec<Each>, E> {
    time_each_turns(warmup, n, rounds, subjects, |_| Ok(()))
}

/// [`time_each_interleaved`], calling `turn(i)` (untimed) before subject
/// `i`'s warm-up and before each of its turns: for subjects that need a
/// process-wide setting of their own while they run, or a peer woken from
/// (or sent back to) its sleep, without any of it inside a timed operation.
pub fn time_each_turns<E>(
    warmup: usize,
    n: usize,
    rounds: usize,
    subjects: &mut [Op<'_, E>],
    mut turn: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<Each>, E> {
    let rounds = rounds.clamp(1, n.max(1));
    let per_round = n / rounds;
    let mut out: Vec<(Each, u64)> = Vec::with_capacity(subjects.len());
    for (i, op) in subjects.iter_mut().enumerate() {
        turn(i)?;
        for _ in 0..warmup {
            op()?;
        }
        out.push((Each::default(), 0));
    }
    for round in 0..rounds {
        for i in rotation(round, subjects.len()) {
            turn(i)?;
            let (op, (each, cpu)) = (&mut subjects[i], &mut out[i]);
            let chunk = time_each(1, per_round, op)?;
            *cpu += (chunk.cpu_ns_per_op * per_round as f64) as u64;
            each.ns.extend(chunk.ns);
        }
    }
    Ok(out
        .into_iter()
        .map(|(mut each, cpu)| {
            each.cpu_ns_per_op = cpu as f64 / each.ns.len().max(1) as f64;
            each
        })
        .collect())
}

/// The order in which `k` subjects take their turns in round `round`: all of
/// them, starting `round` places along (mod `k`).
pub fn rotation(round: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..k).map(move |i| (round + i) % k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_starts_one_subject_further_along() {
        assert_eq!(rotation(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(1, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(rotation(5, 3).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(rotation(4, 0).count(), 0);
    }

    #[test]
    fn sampler_runs_warmup_then_samples_with_ops() {
        let mut calls = Vec::new();
        let s = Sampler::new(5)
            .warmup(2)
            .ops(3)
            .run(|ops| {
                calls.push(ops);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(calls, vec![3; 7]);
        assert_eq!(s.ops, 3);
        assert_eq!((s.wall_ns.len(), s.cpu_ns.len(), s.cycles.len()), (5, 5, 5));
        assert!(s.wall_ns.iter().all(|&ns| ns >= 0.0));
    }

    #[test]
    fn sampler_stops_at_the_first_error() {
        let mut n = 0;
        let r = Sampler::new(10).warmup(0).run(|_| {
            n += 1;
            if n == 4 {
                Err("boom")
            } else {
                Ok(())
            }
        });
        assert_eq!(r.unwrap_err(), "boom");
        assert_eq!(n, 4);
    }

    #[test]
    fn batched_setup_feeds_the_routine() {
        let mut next = 0;
        let mut seen = Vec::new();
        Sampler::new(3)
            .warmup(1)
            .run_batched(
                || {
                    next += 1;
                    next
                },
                |v| {
                    seen.push(v);
                    Ok::<_, ()>(v)
                },
            )
            .unwrap();
        assert_eq!(seen, vec![1, 2, 3, 4]);
    }

    #[test]
    fn rates_invert_times() {
        let s = Sampled {
            ops: 1,
            wall_ns: vec![1000.0, 250.0],
            ..Sampled::default()
        };
        assert_eq!(s.per_s(), vec![1e6, 4e6]);
        assert_eq!(s.bytes_per_s(64), vec![64e6, 256e6]);
    }

    #[test]
    fn turns_are_announced_before_warmups_and_turns() {
        let log = std::cell::RefCell::new(Vec::new());
        let mut a = || {
            log.borrow_mut().push("a");
            Ok::<(), ()>(())
        };
        let mut b = || {
            log.borrow_mut().push("b");
            Ok::<(), ()>(())
        };
        let mut subjects: Vec<Op<'_, ()>> = vec![Box::new(&mut a), Box::new(&mut b)];
        let each = time_each_turns(1, 2, 2, &mut subjects, |i| {
            log.borrow_mut().push(["A", "B"][i]);
            Ok(())
        })
        .unwrap();
        drop(subjects);
        assert_eq!(each.len(), 2);
        assert!(each.iter().all(|e| e.ns.len() == 2));
        // Warm-ups, then two rounds (the second starting with b), each turn
        // an untimed operation and one timed one.
        let want = "A a B b A a a B b b B b b A a a";
        assert_eq!(log.into_inner().join(" "), want);
    }

    #[test]
    fn time_each_counts_every_operation() {
        let mut n = 0;
        let e = time_each(2, 5, || {
            n += 1;
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(n, 7);
        assert_eq!(e.ns.len(), 5);
    }
}
