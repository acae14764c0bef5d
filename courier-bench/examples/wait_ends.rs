//! How long a waiting receive takes to end when it has nothing to wait for: a deadline that
//! has passed or is short, or senders that are gone. A wait that polls before it parks (50 µs
//! between `sched_yield`s, `docs/waiting-policy.md`) must still end on time: this shows whether
//! a deadline or a disconnection is noticed inside the poll.
//!
//! `wait_ends` prints, for courier's unbounded and bounded(16) channels and crossbeam-channel's,
//! the median and 90th percentile of 2,000 calls each:
//! - `recv_timeout(0)` and `recv_timeout(10 µs)` on an empty channel;
//! - `recv()` once the only sender has dropped (after one message went through, so the
//!   unbounded channel has a block: the `iter()` that ends a consumer loop);
//! - a `recv()` already waiting (20 µs in) when the only sender drops, from the drop to the
//!   return (200 calls).

use std::time::{Duration, Instant};

/// The calls per measurement.
const CALLS: usize = 2_000;

/// A channel kind's constructor and operations, as closures over its two ends.
struct Subject<S, R> {
    name: &'static str,
    make: fn() -> (S, R),
    send: fn(&S, u64),
    recv: fn(&R) -> bool,
    recv_timeout: fn(&R, Duration) -> bool,
}

/// Median and 90th percentile, in ns.
fn summary(mut v: Vec<u128>) -> String {
    v.sort_unstable();
    format!(
        "median {:>7} ns  p90 {:>7} ns",
        v[v.len() / 2],
        v[v.len() * 9 / 10]
    )
}

fn measure<S: Send + 'static, R>(s: &Subject<S, R>) {
    let (mut zero, mut short, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..CALLS {
        let (tx, rx) = (s.make)();
        (s.send)(&tx, 1);
        assert!((s.recv)(&rx));
        let t = Instant::now();
        assert!(!(s.recv_timeout)(&rx, Duration::ZERO));
        zero.push(t.elapsed().as_nanos());
        let t = Instant::now();
        assert!(!(s.recv_timeout)(&rx, Duration::from_micros(10)));
        short.push(t.elapsed().as_nanos());
        drop(tx);
        let t = Instant::now();
        assert!(!(s.recv)(&rx));
        gone.push(t.elapsed().as_nanos());
    }
    let mut waiting = Vec::new();
    for _ in 0..CALLS / 10 {
        let (tx, rx) = (s.make)();
        (s.send)(&tx, 1);
        assert!((s.recv)(&rx));
        let dropper = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            let dropped = Instant::now();
            drop(tx);
            dropped
        });
        assert!(!(s.recv)(&rx));
        let returned = Instant::now();
        waiting.push(returned.duration_since(dropper.join().unwrap()).as_nanos());
    }
    println!("{:24} recv_timeout(0)      {}", s.name, summary(zero));
    println!("{:24} recv_timeout(10 µs)  {}", s.name, summary(short));
    println!("{:24} recv, senders gone   {}", s.name, summary(gone));
    println!("{:24} recv waiting, drop   {}", s.name, summary(waiting));
}

fn main() {
    measure(&Subject {
        name: "courier unbounded",
        make: courier::chan::unbounded::<u64>,
        send: |tx, v| tx.send(v).unwrap(),
        recv: |rx| rx.recv().is_ok(),
        recv_timeout: |rx, d| rx.recv_timeout(d).is_ok(),
    });
    measure(&Subject {
        name: "courier bounded(16)",
        make: || courier::chan::bounded::<u64>(16),
        send: |tx, v| tx.send(v).unwrap(),
        recv: |rx| rx.recv().is_ok(),
        recv_timeout: |rx, d| rx.recv_timeout(d).is_ok(),
    });
    measure(&Subject {
        name: "crossbeam unbounded",
        make: crossbeam_channel::unbounded::<u64>,
        send: |tx, v| tx.send(v).unwrap(),
        recv: |rx| rx.recv().is_ok(),
        recv_timeout: |rx, d| rx.recv_timeout(d).is_ok(),
    });
    measure(&Subject {
        name: "crossbeam bounded(16)",
        make: || crossbeam_channel::bounded::<u64>(16),
        send: |tx, v| tx.send(v).unwrap(),
        recv: |rx| rx.recv().is_ok(),
        recv_timeout: |rx, d| rx.recv_timeout(d).is_ok(),
    });
}
