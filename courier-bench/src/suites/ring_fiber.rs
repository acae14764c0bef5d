//! The 2012 ring with fibers as its tasks (`courier-bench ring`): rings of
//! 100, 10,000 and 100,000 fibers, on one worker and on two (the largest
//! raises `vm.max_map_count` for the case where it may, as root, and puts it
//! back, or is skipped with a note; the quick run measures only its
//! `ring_fiber` family).
//!
//! | case | what circulates | channels |
//! | --- | --- | --- |
//! | `ring_fiber_<n>_w<workers>` | `n` messages: every fiber sends to the next, then receives from its own channel | unbounded, as may's |
//! | `ring_fiber1_<n>_w<workers>` | one token: every hop a hand-off from one fiber to the next | courier's `bounded(1)`, may's unbounded: one message never fills a channel, so the two behave alike |
//! | `ring_fiber_b1_<n>_w<workers>` | `n` messages, as `ring_fiber` | courier's `bounded(1)`: a fiber waits for room in its neighbour's channel; may's stay unbounded (it has no bounded one) |
//!
//! Subjects: `courier` (`chan` between fibers of a runtime of one or two
//! workers), `courier-local` (one worker, `chan::local` between pinned
//! fibers: no atomics), and `may` (its coroutines and channels, one or two
//! workers). On unbounded channels the fibers of a ring run in streaks, a
//! message a turn or many, as their scheduler lets them; a bounded(1) ring
//! parks and wakes a fiber at nearly every message, which is what
//! `ring_fiber1` measures alone. The clock starts once every fiber is
//! spawned and waiting at a gate, and stops when the last has finished.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{chan, fiber};

use super::chan::{measure_interleaved, Runner};
use crate::harness::mem::{map_count, MapCount};
use crate::harness::{Case, Ctx};

/// The shape of a ring: how many messages circulate, through which
/// channels.
#[derive(Clone, Copy)]
struct Shape {
    /// One token instead of one message a fiber.
    one_token: bool,
    /// courier's channels hold one message (may's are unbounded).
    bounded1: bool,
}

/// The ring of `n` fibers on `rt` passing `per_task * n` messages.
fn courier_ring(rt: &fiber::Runtime, n: usize, per_task: usize, shape: Shape) -> Duration {
    let Shape {
        one_token,
        bounded1,
    } = shape;
    rt.block_on(move || {
        let channel = || match bounded1 {
            true => chan::bounded::<u64>(1),
            false => chan::unbounded::<u64>(),
        };
        let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        txs.rotate_left(1);
        let (gate_tx, gate) = chan::bounded::<()>(0);
        let fibers: Vec<_> = txs
            .into_iter()
            .zip(rxs)
            .enumerate()
            .map(|(i, (tx, rx))| {
                let gate = gate.clone();
                fiber::spawn(move || {
                    let _ = gate.recv();
                    let sends_first = !one_token || i == 0;
                    for j in 0..per_task as u64 {
                        if sends_first {
                            tx.send(j).expect("ring");
                            std::hint::black_box(rx.recv().expect("ring"));
                        } else {
                            let v = rx.recv().expect("ring");
                            tx.send(std::hint::black_box(v)).expect("ring");
                        }
                    }
                })
            })
            .collect();
        // Everyone waits at the gate before the clock starts.
        for _ in 0..4 {
            fiber::yield_now();
        }
        let start = Instant::now();
        drop(gate_tx);
        fibers
            .into_iter()
            .for_each(|f| f.join().expect("ring fiber"));
        start.elapsed()
    })
}

/// The same ring on `chan::local` channels between fibers pinned to one
/// worker.
fn local_ring(rt: &fiber::Runtime, n: usize, per_task: usize, shape: Shape) -> Duration {
    let Shape {
        one_token,
        bounded1,
    } = shape;
    rt.block_on(move || {
        let inner = fiber::spawn_local(move || {
            let channel = || match bounded1 {
                true => chan::local::bounded::<u64>(1),
                false => chan::local::channel::<u64>(),
            };
            let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
            txs.rotate_left(1);
            let (gate_tx, gate) = chan::local::bounded::<()>(1);
            let fibers: Vec<_> = txs
                .into_iter()
                .zip(rxs)
                .enumerate()
                .map(|(i, (tx, rx))| {
                    let gate = gate.clone();
                    fiber::spawn_local(move || {
                        let _ = gate.recv();
                        let sends_first = !one_token || i == 0;
                        for j in 0..per_task as u64 {
                            if sends_first {
                                tx.send(j).expect("ring");
                                std::hint::black_box(rx.recv().expect("ring"));
                            } else {
                                let v = rx.recv().expect("ring");
                                tx.send(std::hint::black_box(v)).expect("ring");
                            }
                        }
                    })
                })
                .collect();
            drop(gate);
            for _ in 0..4 {
                fiber::yield_now();
            }
            let start = Instant::now();
            drop(gate_tx);
            fibers
                .into_iter()
                .for_each(|f| f.join().expect("ring fiber"));
            start.elapsed()
        });
        inner.join().expect("ring")
    })
}

/// The ring of `n` may coroutines (one worker).
fn may_ring(n: usize, per_task: usize, one_token: bool) -> Duration {
    may::go!(move || {
        let (mut txs, rxs): (Vec<_>, Vec<_>) =
            (0..n).map(|_| may::sync::mpsc::channel::<u64>()).unzip();
        txs.rotate_left(1);
        // Every coroutine waits at the gate: a channel of many receivers
        // (may's mpsc receiver takes one at a time, and two workers hang it).
        let (gate_tx, gate) = may::sync::mpmc::channel::<()>();
        let coroutines: Vec<_> = txs
            .into_iter()
            .zip(rxs)
            .enumerate()
            .map(|(i, (tx, rx))| {
                let gate = gate.clone();
                may::go!(move || {
                    let _ = gate.recv();
                    let sends_first = !one_token || i == 0;
                    for j in 0..per_task as u64 {
                        if sends_first {
                            tx.send(j).expect("ring");
                            std::hint::black_box(rx.recv().expect("ring"));
                        } else {
                            let v = rx.recv().expect("ring");
                            tx.send(std::hint::black_box(v)).expect("ring");
                        }
                    }
                })
            })
            .collect();
        for _ in 0..4 {
            may::coroutine::yield_now();
        }
        let start = Instant::now();
        drop(gate_tx);
        coroutines.into_iter().for_each(|c| c.join().expect("ring"));
        start.elapsed()
    })
    .join()
    .expect("may ring")
}

/// The child role that runs [`may_ring`] on two workers (may's worker count
/// is process-wide and fixed at its first use, and this process uses one).
pub(crate) const MAY_W2: &str = "ring-may-w2";

/// Child: `ring-may-w2 <n> <per_task> <one_token>`; writes the ring's time
/// in nanoseconds to descriptor 3.
pub(crate) fn may_w2_child(args: &[String]) -> crate::harness::Result<()> {
    crate::harness::child::die_with_parent()?;
    let arg = |i: usize| {
        args.get(i)
            .ok_or(format!("{MAY_W2}: {} arguments, not 3", args.len()))
    };
    let n: usize = arg(0)?.parse()?;
    let per_task: usize = arg(1)?.parse()?;
    let one_token: bool = arg(2)?.parse()?;
    may::config().set_workers(2);
    let took = may_ring(n, per_task, one_token);
    let mut out = std::fs::File::from(crate::harness::child::inherited_fd(0)?);
    std::io::Write::write_all(&mut out, took.as_nanos().to_string().as_bytes())?;
    Ok(())
}

/// [`may_ring`] on two workers, in a child process.
fn may_ring_w2(n: usize, per_task: usize, one_token: bool) -> Option<Duration> {
    let run = || -> crate::harness::Result<Duration> {
        let (mut reader, writer) = std::io::pipe()?;
        let args = [n.to_string(), per_task.to_string(), one_token.to_string()];
        let peer = crate::harness::child::spawn(MAY_W2, &args, &[writer.as_fd()])?;
        drop(writer);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut reader, &mut out)?;
        peer.wait()?;
        Ok(Duration::from_nanos(out.trim().parse()?))
    };
    run()
        .map_err(|e| eprintln!("may ring on two workers: {e}"))
        .ok()
}

/// Whether `n` may coroutines fit under this process's `vm.max_map_count`
/// (may's stacks take two map entries each, as courier's do).
fn may_fits(n: usize) -> bool {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .is_some_and(|limit| 2 * n + 10_000 < limit)
}

/// The fiber rings of suite `ring`.
pub(crate) fn run(ctx: &mut Ctx<'_>) -> crate::harness::Result<()> {
    may::config().set_workers(1);
    let one = Arc::new(fiber::Runtime::builder().workers(1).build()?);
    let two = Arc::new(fiber::Runtime::builder().workers(2).build()?);
    let messages = ctx.pick(100_000, 1_000_000);
    let samples = ctx.samples(3, 3);
    let sizes = [100, 10_000, 100_000];
    let shapes = [
        (
            "ring_fiber",
            Shape {
                one_token: false,
                bounded1: false,
            },
        ),
        (
            "ring_fiber1",
            Shape {
                one_token: true,
                bounded1: true,
            },
        ),
        (
            "ring_fiber_b1",
            Shape {
                one_token: false,
                bounded1: true,
            },
        ),
    ];
    for n in sizes {
        // A sample of a ring of 100,000 spends most of its time making and
        // freeing the fibers (touching their stacks): the quick run
        // measures the first family only there.
        let families = match n >= 100_000 && !ctx.full() {
            true => &shapes[..1],
            false => &shapes[..],
        };
        let wanted = families.iter().any(|(family, _)| {
            (1..=2).any(|w| ctx.wants(&Case::new(format!("{family}_{n}_w{w}"))))
        });
        if !wanted {
            continue;
        }
        // Every stack and its guard page are two mappings, courier's and
        // may's alike.
        let Some(_maps) = MapCount::at_least(2 * n as u64 + 100_000) else {
            ctx.note(format!(
                "ring_fiber*_{n}: vm.max_map_count is {} and could not be raised: skipped",
                map_count().unwrap_or(0)
            ));
            continue;
        };
        for &(family, shape) in families {
            let one_token = shape.one_token;
            for workers in [1, 2] {
                let case = Case::new(format!("{family}_{n}_w{workers}")).tasks(n as u64);
                let rt = if workers == 1 {
                    one.clone()
                } else {
                    two.clone()
                };
                let mut subjects: Vec<(&'static str, Runner)> = vec![(
                    "courier",
                    Box::new(move |m| Some(courier_ring(&rt, n, (m / n).max(1), shape))),
                )];
                if workers == 2 && may_fits(n) {
                    subjects.push((
                        "may",
                        Box::new(move |m| may_ring_w2(n, (m / n).max(1), one_token)),
                    ));
                }
                if workers == 1 {
                    let local = one.clone();
                    subjects.push((
                        "courier-local",
                        Box::new(move |m| Some(local_ring(&local, n, (m / n).max(1), shape))),
                    ));
                    if may_fits(n) {
                        subjects.push((
                            "may",
                            Box::new(move |m| Some(may_ring(n, (m / n).max(1), one_token))),
                        ));
                    }
                }
                let total = (messages / n).max(1) * n;
                measure_interleaved(ctx, &case, subjects, samples, total);
            }
        }
    }
    ctx.note(format!(
        "fiber rings: {messages} messages a sample; ring_fiber: every fiber sends then receives \
         (n messages circulate), unbounded channels (as may's); ring_fiber1: one token (a \
         hand-off a hop; courier's bounded(1) channels, which one token never fills, may's \
         unbounded ones); ring_fiber_b1: as ring_fiber on courier's bounded(1) channels (may's \
         stay unbounded: it has no bounded one); w1/w2: one or two worker threads (may's \
         two-worker rings run in a child process: its worker count is process-wide)"
    ));
    Ok(())
}
