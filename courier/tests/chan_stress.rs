//! Stress: many threads on every flavor, checking totals. Each test runs under a watchdog so a
//! lost wake-up fails the test (with a message) instead of hanging CI.
//!
//! Real threads and real time: not built under `--cfg loom` (the models are in `chan_loom.rs`).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use courier::chan::{self, Receiver, RecvTimeoutError, Select, Sender, TaskContext};

mod watchdog;
use watchdog::with_watchdog;

/// Messages per producer: small under Miri.
const PER_PRODUCER: u64 = if cfg!(miri) { 20 } else { 20_000 };
const PRODUCERS: usize = 6;
const CONSUMERS: usize = 6;

/// A channel's two ends.
type Pair<T> = (Sender<T>, Receiver<T>);

fn flavors() -> Vec<(&'static str, Pair<u64>)> {
    vec![
        ("bounded(0)", chan::bounded(0)),
        ("bounded(1)", chan::bounded(1)),
        ("bounded(16)", chan::bounded(16)),
        ("unbounded", chan::unbounded()),
    ]
}

#[test]
fn mpmc_totals() {
    with_watchdog("mpmc_totals", Duration::from_secs(120), || {
        for (name, (tx, rx)) in flavors() {
            let producers: Vec<_> = (0..PRODUCERS as u64)
                .map(|p| {
                    let tx = tx.clone();
                    thread::spawn(move || {
                        for i in 0..PER_PRODUCER {
                            tx.send(p * PER_PRODUCER + i).unwrap();
                        }
                    })
                })
                .collect();
            drop(tx);
            let consumers: Vec<_> = (0..CONSUMERS)
                .map(|_| {
                    let rx = rx.clone();
                    thread::spawn(move || {
                        let (mut n, mut sum) = (0u64, 0u64);
                        for v in rx.iter() {
                            n += 1;
                            sum += v;
                        }
                        (n, sum)
                    })
                })
                .collect();
            drop(rx);
            producers.into_iter().for_each(|t| t.join().unwrap());
            let (n, sum) = consumers
                .into_iter()
                .map(|t| t.join().unwrap())
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
            let total = PRODUCERS as u64 * PER_PRODUCER;
            assert_eq!(n, total, "{name}: message count");
            assert_eq!(sum, total * (total - 1) / 2, "{name}: message sum");
        }
    });
}

#[test]
fn select_many_to_many_totals() {
    with_watchdog(
        "select_many_to_many_totals",
        Duration::from_secs(120),
        || {
            for (name, make) in [
                (
                    "bounded(0)",
                    (|| chan::bounded::<u64>(0)) as fn() -> Pair<u64>,
                ),
                ("bounded(2)", || chan::bounded(2)),
                ("unbounded", chan::unbounded),
            ] {
                let (txs, rxs): (Vec<_>, Vec<_>) = (0..4).map(|_| make()).unzip();
                let per = PER_PRODUCER / 4;
                let producers: Vec<_> = (0..4u64)
                    .map(|p| {
                        let txs = txs.clone();
                        thread::spawn(move || {
                            for i in 0..per {
                                let mut sel = Select::new();
                                for tx in &txs {
                                    sel.send(tx);
                                }
                                let op = sel.select();
                                let k = op.index();
                                op.send(&txs[k], p * per + i).unwrap();
                            }
                        })
                    })
                    .collect();
                drop(txs);
                let consumers: Vec<_> = (0..4)
                    .map(|_| {
                        let rxs = rxs.clone();
                        thread::spawn(move || {
                            let (mut n, mut sum) = (0u64, 0u64);
                            let mut open = rxs.len();
                            let mut done = vec![false; rxs.len()];
                            while open > 0 {
                                let mut sel = Select::new();
                                let mut idx = Vec::new();
                                for (k, rx) in rxs.iter().enumerate() {
                                    if !done[k] {
                                        sel.recv(rx);
                                        idx.push(k);
                                    }
                                }
                                let op = sel.select();
                                let k = idx[op.index()];
                                match op.recv(&rxs[k]) {
                                    Ok(v) => {
                                        n += 1;
                                        sum += v;
                                    }
                                    Err(_) => {
                                        done[k] = true;
                                        open -= 1;
                                    }
                                }
                            }
                            (n, sum)
                        })
                    })
                    .collect();
                drop(rxs);
                producers.into_iter().for_each(|t| t.join().unwrap());
                let (n, sum) = consumers
                    .into_iter()
                    .map(|t| t.join().unwrap())
                    .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
                let total = 4 * per;
                assert_eq!(n, total, "{name}: message count");
                assert_eq!(sum, total * (total - 1) / 2, "{name}: message sum");
            }
        },
    );
}

#[test]
fn ring_of_threads_completes() {
    // A ring (`courier-bench ring`'s shape): every task sends to the next and receives from its
    // own channel.
    with_watchdog(
        "ring_of_threads_completes",
        Duration::from_secs(120),
        || {
            for (name, make) in [
                (
                    "bounded(1)",
                    (|| chan::bounded::<u64>(1)) as fn() -> Pair<u64>,
                ),
                ("unbounded", chan::unbounded),
            ] {
                let n = 8;
                let rounds = PER_PRODUCER / 4;
                let (mut txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| make()).unzip();
                txs.rotate_left(1);
                let handles: Vec<_> = txs
                    .into_iter()
                    .zip(rxs)
                    .map(|(tx, rx)| {
                        thread::spawn(move || {
                            let mut sum = 0;
                            for j in 0..rounds {
                                tx.send(j).unwrap();
                                sum += rx.recv().unwrap();
                            }
                            sum
                        })
                    })
                    .collect();
                let total: u64 = handles.into_iter().map(|t| t.join().unwrap()).sum();
                assert_eq!(total, n as u64 * rounds * (rounds - 1) / 2, "{name}");
            }
        },
    );
}

#[test]
fn disconnect_races_drop_every_message_once() {
    struct D(Arc<AtomicUsize>);
    impl Drop for D {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    with_watchdog("disconnect_races", Duration::from_secs(120), || {
        for round in 0..if cfg!(miri) { 2 } else { 200 } {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = match round % 3 {
                0 => chan::bounded::<D>(0),
                1 => chan::bounded::<D>(2),
                _ => chan::unbounded::<D>(),
            };
            let sent = 50;
            let producers: Vec<_> = (0..3)
                .map(|_| {
                    let tx = tx.clone();
                    let drops = drops.clone();
                    thread::spawn(move || {
                        for _ in 0..sent {
                            if tx.send(D(drops.clone())).is_err() {
                                break; // the handed-back message is dropped here
                            }
                        }
                    })
                })
                .collect();
            drop(tx);
            // Receive a little, then leave while the producers are still sending.
            for _ in 0..round % 7 {
                let _ = rx.recv();
            }
            drop(rx);
            producers.into_iter().for_each(|t| t.join().unwrap());
            // Each producer created at most `sent` messages, and every created one is dropped:
            // received, discarded by the channel, or handed back.
            let created = drops.load(Ordering::SeqCst);
            assert!(created <= 3 * sent, "round {round}: {created} drops");
            assert!(created >= round % 7, "round {round}");
        }
    });
}

/// Receivers that wait longer than they poll give up the positions they claimed ahead of the
/// senders (`flavors::list`), so senders keep finding abandoned slots and sending again:
/// nothing may be lost, duplicated or reordered per sender, and when the receivers leave
/// early every message is still dropped once.
#[test]
fn abandoned_positions_lose_nothing() {
    struct D(u64, Arc<AtomicUsize>);
    impl Drop for D {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    with_watchdog("abandoned_positions", Duration::from_secs(120), || {
        let per_producer: u64 = if cfg!(miri) { 50 } else { 20_000 };
        for leave_early in [false, true] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = chan::unbounded::<D>();
            let producers: Vec<_> = (0..2u64)
                .map(|p| {
                    let (tx, drops) = (tx.clone(), drops.clone());
                    // Returns how many messages it made (the last one may come back).
                    thread::spawn(move || {
                        for i in 0..per_producer {
                            if tx.send(D(p << 32 | i, drops.clone())).is_err() {
                                return i + 1;
                            }
                            // Long enough for waiting receivers to give up their claims.
                            if i % 512 == 0 {
                                thread::sleep(Duration::from_micros(200));
                            }
                        }
                        per_producer
                    })
                })
                .collect();
            drop(tx);
            let consumers: Vec<_> = (0..2)
                .map(|_| {
                    let rx = rx.clone();
                    thread::spawn(move || {
                        let mut last = [None::<u64>; 2];
                        let mut got = 0u64;
                        loop {
                            if leave_early && got == per_producer / 2 {
                                return got;
                            }
                            match rx.recv_timeout(Duration::from_nanos(1)) {
                                Ok(D(v, _)) => {
                                    let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                                    assert!(
                                        last[p].is_none_or(|l| l < i),
                                        "producer {p} reordered"
                                    );
                                    last[p] = Some(i);
                                    got += 1;
                                }
                                Err(RecvTimeoutError::Timeout) => {}
                                Err(RecvTimeoutError::Disconnected) => return got,
                            }
                        }
                    })
                })
                .collect();
            drop(rx);
            let got: u64 = consumers.into_iter().map(|t| t.join().unwrap()).sum();
            let made: u64 = producers.into_iter().map(|t| t.join().unwrap()).sum();
            if !leave_early {
                assert_eq!(got, 2 * per_producer);
            }
            // Every message made was dropped once: received, discarded or handed back.
            assert_eq!(drops.load(Ordering::SeqCst) as u64, made);
        }
    });
}

/// A stand-in task scheduler whose tasks are threads: exercises the `Park` seam under load.
struct ThreadTask {
    thread: thread::Thread,
    /// Parks so far.
    parks: Arc<AtomicUsize>,
    /// A channel on which, while its task sleeps, the scheduler receives through that same
    /// task (with a timeout: no one sends on it), as one that meddles would.
    meddle: Option<Receiver<u64>>,
}

impl ThreadTask {
    fn new(parks: Arc<AtomicUsize>, meddle: Option<Receiver<u64>>) -> ThreadTask {
        ThreadTask {
            thread: thread::current(),
            parks,
            meddle,
        }
    }
}

impl chan::Park for ThreadTask {
    fn park(&self, deadline: Option<std::time::Instant>) {
        self.parks.fetch_add(1, Ordering::Relaxed);
        if let Some(quiet) = &self.meddle {
            if let Some(task) = MEDDLING_TASK.with(|t| t.borrow().clone()) {
                let _ = task.run(|| quiet.recv_timeout(Duration::from_micros(50)));
            }
        }
        match deadline {
            Some(d) => thread::park_timeout(d.saturating_duration_since(std::time::Instant::now())),
            None => thread::park(),
        }
    }
    fn unpark(&self) {
        self.thread.unpark();
    }
    fn yield_now(&self) {
        thread::yield_now();
    }
    fn may_spin(&self) -> bool {
        false
    }
}

#[test]
fn blocking_through_the_park_seam() {
    with_watchdog("park_seam", Duration::from_secs(60), || {
        let parks = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::bounded::<u64>(0);
        let (back_tx, back_rx) = chan::bounded::<u64>(1);
        let p = parks.clone();
        let t = thread::spawn(move || {
            let task = TaskContext::new(ThreadTask::new(p, None));
            task.run(|| {
                for v in rx.iter() {
                    back_tx.send(v * 2).unwrap();
                }
            });
        });
        let n = if cfg!(miri) { 10 } else { 2_000 };
        let mut sum = 0;
        for i in 0..n {
            tx.send(i).unwrap();
            sum += back_rx.recv().unwrap();
        }
        drop(tx);
        t.join().unwrap();
        assert_eq!(sum, n * (n - 1));
        // The task never spins (its `may_spin` says no), so it parked through the seam.
        assert!(parks.load(Ordering::Relaxed) > 0);
    });
}

std::thread_local! {
    /// The task a meddling `ThreadTask` belongs to (a `TaskContext` is not `Sync`: it stays on its thread).
    static MEDDLING_TASK: std::cell::RefCell<Option<std::rc::Rc<TaskContext>>> =
        const { std::cell::RefCell::new(None) };
}

/// An operation run from inside `Park::park` on the waiting task's own context must not
/// disturb the waiting operation (resetting its claim word would lose a hand-off: a hang).
#[test]
fn an_operation_run_by_park_leaves_the_waiting_one_alone() {
    with_watchdog("park_reentry", Duration::from_secs(60), || {
        let (tx, rx) = chan::bounded::<u64>(0);
        let (_quiet_tx, quiet_rx) = chan::bounded::<u64>(0);
        let n = if cfg!(miri) { 10 } else { 500 };
        let t = thread::spawn(move || {
            let parks = Arc::new(AtomicUsize::new(0));
            let task = std::rc::Rc::new(TaskContext::new(ThreadTask::new(parks, Some(quiet_rx))));
            MEDDLING_TASK.with(|t| *t.borrow_mut() = Some(task.clone()));
            let sum: u64 = task.run(|| rx.iter().sum());
            MEDDLING_TASK.with(|t| *t.borrow_mut() = None);
            sum
        });
        for i in 0..n {
            tx.send(i).unwrap();
        }
        drop(tx);
        assert_eq!(t.join().unwrap(), n * (n - 1) / 2);
    });
}

/// A scheduler whose `park` panics.
struct PanickingPark;

impl chan::Park for PanickingPark {
    fn park(&self, _deadline: Option<std::time::Instant>) {
        panic!("a scheduler bug (on purpose)");
    }
    fn unpark(&self) {}
    fn yield_now(&self) {}
    fn may_spin(&self) -> bool {
        false
    }
}

/// A `park` that panics aborts the process instead of unwinding past the operation, whose
/// registered state (here a sender's message, on its stack) a receiver would then read.
#[test]
fn a_panicking_park_aborts_the_process() {
    const CHILD: &str = "COURIER_TEST_PANICKING_PARK";
    if std::env::var_os(CHILD).is_some() {
        let (tx, _rx) = chan::bounded::<u64>(0);
        let task = TaskContext::new(PanickingPark);
        // Blocks (no receiver), so it parks, and the park panics.
        let _ = task.run(|| tx.send(1));
        unreachable!("the park above panicked");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panicking_park_aborts_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a `Park` implementation panicked"),
        "{stderr}"
    );
}
