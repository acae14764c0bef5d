//! Fibers, as Ruby's fiber pool measured them (Ruby feature #15997):
//! creating and finishing fibers one at a time (`allocate`), in batches that
//! reuse the stacks of the last (`reuse`), switching between two
//! (`switch`), and how many can be alive at once and at what cost
//! (`alive_100k`, `alive_1m`).
//!
//! Subjects: `courier` (`courier::fiber`, one worker), `may` (its
//! coroutines, one worker), `corosensei` (a coroutine on a fresh default
//! stack each: no pool), and `floor` (corosensei's bare resume and suspend
//! on one reused stack: the switch itself, and creation with no allocation).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use courier::{chan, fiber};

use crate::harness::measure::{Sampled, Sampler};
use crate::harness::mem::{map_count, MapCount};
use crate::harness::{Case, Ctx, Result};

/// Measures every case (see the module docs).
pub fn run(ctx: &mut Ctx) -> Result<()> {
    may::config().set_workers(1);
    let rt = fiber::Runtime::builder().workers(1).build()?;
    allocate(ctx, &rt)?;
    reuse(ctx, &rt)?;
    switch(ctx, &rt)?;
    alive(ctx, &rt, 100_000)?;
    alive(ctx, &rt, 1_000_000)?;
    Ok(())
}

/// Runs `f` as a fiber of `rt` and returns its figures.
fn in_fiber(rt: &fiber::Runtime, f: impl FnOnce() -> Sampled + Send + 'static) -> Sampled {
    rt.block_on(f)
}

fn allocate(ctx: &mut Ctx, rt: &fiber::Runtime) -> Result<()> {
    let case = Case::new("allocate");
    if !ctx.wants(&case) {
        return Ok(());
    }
    let samples = ctx.samples(10, 30);
    let ops = ctx.pick(10_000, 100_000);
    let sampler = Sampler::new(samples).ops(ops);
    ctx.status("allocate · courier");
    let s = in_fiber(rt, move || {
        sampler
            .run(|ops| {
                for _ in 0..ops {
                    fiber::spawn(|| ()).join().expect("no panic");
                }
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    });
    ctx.record(&case, "courier", "spawns_per_s", "spawns/s", &s.per_s());
    ctx.status("allocate · may");
    let s = may::go!(move || {
        sampler
            .run(|ops| {
                for _ in 0..ops {
                    may::go!(|| ()).join().expect("no panic");
                }
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    })
    .join()
    .expect("may coroutine");
    ctx.record(&case, "may", "spawns_per_s", "spawns/s", &s.per_s());
    ctx.status("allocate · corosensei");
    let s = sampler.run(|ops| {
        for _ in 0..ops {
            let mut c = Coroutine::<(), (), ()>::new(|_, ()| ());
            assert!(matches!(c.resume(()), CoroutineResult::Return(())));
        }
        Ok::<(), Infallible>(())
    })?;
    ctx.record(&case, "corosensei", "spawns_per_s", "spawns/s", &s.per_s());
    ctx.status("allocate · floor");
    let mut stack = Some(DefaultStack::new(64 << 10)?);
    let s = sampler.run(|ops| {
        for _ in 0..ops {
            let reused = stack.take().expect("one stack");
            let mut c = Coroutine::<(), (), (), _>::with_stack(reused, |_, ()| ());
            assert!(matches!(c.resume(()), CoroutineResult::Return(())));
            stack = Some(c.into_stack());
        }
        Ok::<(), Infallible>(())
    })?;
    ctx.record(&case, "floor", "spawns_per_s", "spawns/s", &s.per_s());
    Ok(())
}

fn reuse(ctx: &mut Ctx, rt: &fiber::Runtime) -> Result<()> {
    let case = Case::new("reuse").tasks(10_000);
    if !ctx.wants(&case) {
        return Ok(());
    }
    let samples = ctx.samples(10, 30);
    // One operation: a fiber made (and finished) in a batch of 10,000 that
    // follows a batch as large.
    let sampler = Sampler::new(samples).ops(10_000);
    ctx.status("reuse · courier");
    let s = in_fiber(rt, move || {
        sampler
            .run(|ops| {
                let batch: Vec<_> = (0..ops).map(|_| fiber::spawn(|| ())).collect();
                batch.into_iter().for_each(|f| f.join().expect("no panic"));
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    });
    ctx.record(&case, "courier", "spawns_per_s", "spawns/s", &s.per_s());
    ctx.status("reuse · may");
    let s = may::go!(move || {
        sampler
            .run(|ops| {
                let batch: Vec<_> = (0..ops).map(|_| may::go!(|| ())).collect();
                batch.into_iter().for_each(|f| f.join().expect("no panic"));
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    })
    .join()
    .expect("may coroutine");
    ctx.record(&case, "may", "spawns_per_s", "spawns/s", &s.per_s());
    ctx.status("reuse · corosensei");
    let s = sampler.run(|ops| {
        let mut batch: Vec<_> = (0..ops)
            .map(|_| Coroutine::<(), (), ()>::new(|_, ()| ()))
            .collect();
        for c in &mut batch {
            let _ = c.resume(());
        }
        Ok::<(), Infallible>(())
    })?;
    ctx.record(&case, "corosensei", "spawns_per_s", "spawns/s", &s.per_s());
    Ok(())
}

fn switch(ctx: &mut Ctx, rt: &fiber::Runtime) -> Result<()> {
    let case = Case::new("switch");
    if !ctx.wants(&case) {
        return Ok(());
    }
    let samples = ctx.samples(10, 30);
    let sampler = Sampler::new(samples).ops(ctx.pick(100_000, 1_000_000));
    // One operation: a round trip, each of two fibers yielding once.
    ctx.status("switch · courier");
    let s = in_fiber(rt, move || {
        sampler
            .run(|ops| {
                let other = fiber::spawn(move || (0..ops).for_each(|_| fiber::yield_now()));
                (0..ops).for_each(|_| fiber::yield_now());
                other.join().expect("no panic");
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    });
    ctx.record(&case, "courier", "yield_rtt_ns", "ns", &s.wall_ns);
    ctx.status("switch · may");
    let s = may::go!(move || {
        sampler
            .run(|ops| {
                let other = may::go!(move || (0..ops).for_each(|_| may::coroutine::yield_now()));
                (0..ops).for_each(|_| may::coroutine::yield_now());
                other.join().expect("no panic");
                Ok::<(), Infallible>(())
            })
            .expect("infallible")
    })
    .join()
    .expect("may coroutine");
    ctx.record(&case, "may", "yield_rtt_ns", "ns", &s.wall_ns);
    ctx.status("switch · floor");
    // A round trip between two fibers is two switches each way: a resume and
    // a suspend of each of two coroutines.
    let mut a = Coroutine::<(), (), ()>::new(|y, ()| loop {
        y.suspend(());
    });
    let mut b = Coroutine::<(), (), ()>::new(|y, ()| loop {
        y.suspend(());
    });
    let s = sampler.run(|ops| {
        for _ in 0..ops {
            let _ = a.resume(());
            let _ = b.resume(());
        }
        Ok::<(), Infallible>(())
    })?;
    ctx.record(&case, "floor", "yield_rtt_ns", "ns", &s.wall_ns);
    // (The coroutines are suspended for good: unwound on drop.)
    drop((a, b));
    Ok(())
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

fn alive(ctx: &mut Ctx, rt: &fiber::Runtime, n: u64) -> Result<()> {
    let label = if n >= 1_000_000 { "1m" } else { "100k" };
    let case = Case::new(format!("alive_{label}")).tasks(n);
    if !ctx.wants(&case) {
        return Ok(());
    }
    let Some(_maps) = MapCount::at_least(2 * n + 100_000) else {
        ctx.note(format!(
            "alive_{label}: vm.max_map_count is {} and could not be raised: skipped",
            map_count().unwrap_or(0)
        ));
        return Ok(());
    };
    ctx.status(format!("alive_{label} · courier"));
    let (per_fiber, spawn_ns) = rt.block_on(move || {
        let before = rss();
        let (tx, rx) = chan::bounded::<()>(0);
        let waiting = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let fibers: Vec<_> = (0..n)
            .map(|_| {
                let rx = rx.clone();
                let waiting = Arc::clone(&waiting);
                fiber::spawn(move || {
                    waiting.fetch_add(1, Ordering::Relaxed);
                    let _ = rx.recv();
                })
            })
            .collect();
        let spawn_ns = start.elapsed().as_nanos() as f64 / n as f64;
        // Every fiber runs to its park before the memory is read (each
        // yield lets the worker run the fibers queued before this one).
        while waiting.load(Ordering::Relaxed) < n {
            fiber::yield_now();
        }
        let per_fiber = rss().saturating_sub(before) as f64 / n as f64;
        drop(tx);
        fibers.into_iter().for_each(|f| f.join().expect("no panic"));
        (per_fiber, spawn_ns)
    });
    ctx.record_value(&case, "courier", "rss_per_fiber_bytes", "B", per_fiber);
    ctx.record_value(&case, "courier", "spawn_ns", "ns", spawn_ns);
    Ok(())
}
