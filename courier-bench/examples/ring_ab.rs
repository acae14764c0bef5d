//! The `ring` suite's thread rings, courier against flume and crossbeam-channel in one
//! process, taking turns: for A/B runs of one ring and for profiling one subject.
//!
//! `ring_ab <kind> <n> [rounds]` with `kind` one of `bounded1`, `bounded0`, `unbounded`
//! (default 3 rounds): a ring of `n` threads passes 1,000,000 messages in all, as in
//! `courier-bench ring` (buffered rings circulate `n` messages, the rendezvous ring one). Prints
//! each subject's ns per message, sorted. `AB_ONLY=<subject>` runs that subject alone (to
//! profile it); `AB_MESSAGES=<n>` passes `n` messages a round instead of a million;
//! `AB_PIN=<placement>` pins the ring's threads (CPUs 0 and 1): `one` all on CPU 0, `halves`
//! the first half of the ring on CPU 0 and the rest on CPU 1, `alternate` every other thread
//! on CPU 1 (every hop crosses). Unpinned by default, as in the suite.

use std::time::Instant;

/// Messages a round unless `AB_MESSAGES` says otherwise.
const MESSAGES: usize = 1_000_000;

/// ns per message around a ring of `n` threads over the channels `make` builds.
fn ring<S, R>(
    n: usize,
    messages: usize,
    one_token: bool,
    make: impl Fn() -> (S, R),
    send: fn(&S, usize),
    recv: fn(&R) -> usize,
) -> f64
where
    S: Send + 'static,
    R: Send + 'static,
{
    let per_task = messages / n;
    // Task i receives on channel i and sends on channel i + 1.
    let (txs, rxs): (Vec<S>, Vec<R>) = (0..n).map(|_| make()).unzip();
    let mut txs: Vec<Option<S>> = txs.into_iter().map(Some).collect();
    let start = Instant::now();
    let threads: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            let tx = txs[(i + 1) % n].take().unwrap();
            std::thread::spawn(move || {
                if let Some(cpu) = placement(i, n) {
                    pin(cpu);
                }
                let sends_first = !one_token || i == 0;
                for j in 0..per_task {
                    if sends_first {
                        send(&tx, j);
                        std::hint::black_box(recv(&rx));
                    } else {
                        let v = recv(&rx);
                        send(&tx, std::hint::black_box(v));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed().as_nanos() as f64 / (per_task * n) as f64
}

/// The CPU that `AB_PIN` gives thread `i` of a ring of `n` (`None`: unpinned).
fn placement(i: usize, n: usize) -> Option<usize> {
    match std::env::var("AB_PIN").ok()?.as_str() {
        "" => None,
        "one" => Some(0),
        "halves" => Some(i * 2 / n),
        "alternate" => Some(i % 2),
        other => panic!("AB_PIN={other}: expected one, halves or alternate"),
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map_or("bounded1", String::as_str).to_owned();
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(16);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let messages = std::env::var("AB_MESSAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(MESSAGES);
    let only = std::env::var("AB_ONLY").ok();
    let cap = match kind.as_str() {
        "bounded1" => Some(1),
        "bounded0" => Some(0),
        "unbounded" => None,
        other => panic!("unknown kind {other}: bounded1, bounded0 or unbounded"),
    };
    let one_token = cap == Some(0);

    type Subject = (&'static str, Box<dyn Fn() -> f64>);
    /// A subject: its name and a ring over its channels (`$chan::bounded`/`unbounded`).
    macro_rules! subject {
        ($name:literal, $chan:ident) => {
            (
                $name,
                Box::new(move || {
                    ring(
                        n,
                        messages,
                        one_token,
                        || match cap {
                            Some(c) => $chan::bounded(c),
                            None => $chan::unbounded(),
                        },
                        |tx, v| tx.send(v).unwrap(),
                        |rx| rx.recv().unwrap(),
                    )
                }) as Box<dyn Fn() -> f64>,
            )
        };
    }
    use courier::chan;
    let subjects: Vec<Subject> = vec![
        subject!("courier", chan),
        subject!("flume", flume),
        subject!("crossbeam-channel", crossbeam_channel),
    ];
    let subjects: Vec<_> = subjects
        .into_iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    for _ in 0..rounds {
        for (k, (_, run)) in subjects.iter().enumerate() {
            times[k].push(run());
        }
    }
    for ((name, _), mut t) in subjects.iter().zip(times) {
        t.sort_by(f64::total_cmp);
        let shown: Vec<String> = t.iter().map(|x| format!("{x:.0}")).collect();
        println!("{kind}_{n} {name:18} ns/msg {}", shown.join(" "));
    }
}
