//! One subject of `chan`'s `seq_unbounded` case per process, for counting
//! instructions (the machine's clocks are too noisy for a 15% question):
//!
//! ```sh
//! cargo build --release -p courier-bench --example seq_count
//! for s in courier crossbeam flume std; do
//!     valgrind --tool=callgrind --callgrind-out-file=/tmp/seq.$s \
//!         target/release/examples/seq_count $s 2>&1 | grep Collected
//! done
//! ```
//!
//! 100,000 `u64` messages are sent, then received, on one unbounded channel
//! (`seq_count <subject> bounded`: one with room for all of them, the
//! `seq_boundedN` case); divide the count by 100,000 for instructions per
//! message (the process's start-up adds ~0.1 M).

use std::hint::black_box;

const MESSAGES: u64 = 100_000;

fn main() {
    if std::env::args().nth(2).as_deref() == Some("bounded") {
        return bounded(std::env::args().nth(1).as_deref());
    }
    match std::env::args().nth(1).as_deref() {
        Some("crossbeam") => {
            let (tx, rx) = crossbeam_channel::unbounded();
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("flume") => {
            let (tx, rx) = flume::unbounded();
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("std") => {
            let (tx, rx) = std::sync::mpsc::channel();
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("courier") => {
            let (tx, rx) = courier::chan::unbounded();
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        _ => eprintln!("usage: seq_count courier|crossbeam|flume|std"),
    }
}

/// The same on channels with room for every message.
fn bounded(subject: Option<&str>) {
    let n = MESSAGES as usize;
    match subject {
        Some("crossbeam") => {
            let (tx, rx) = crossbeam_channel::bounded(n);
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("flume") => {
            let (tx, rx) = flume::bounded(n);
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("std") => {
            let (tx, rx) = std::sync::mpsc::sync_channel(n);
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        Some("courier") => {
            let (tx, rx) = courier::chan::bounded(n);
            (0..MESSAGES).for_each(|i| tx.send(i).unwrap());
            (0..MESSAGES).for_each(|_| {
                black_box(rx.recv().unwrap());
            });
        }
        _ => eprintln!("usage: seq_count courier|crossbeam|flume|std [bounded]"),
    }
}
