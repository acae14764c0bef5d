//! The cases of `chan_fibers.rs` (fibers that share one OS thread, blocking on `chan`'s
//! channels) with courier's own runtime as the scheduler: every fiber of a case pinned to the
//! one worker of a runtime (`common/runtime_fibers.rs`). A deadlock or a lost wake-up hangs
//! here, and the watchdog fails the test.

#![cfg(not(loom))]

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use courier::chan::{self, Receiver, RecvError, RecvTimeoutError, Select, Sender};

#[path = "common/runtime_fibers.rs"]
mod fibers;
mod watchdog;
use fibers::{run_fibers, run_fibers_in_order, yield_fiber};
use watchdog::with_watchdog;

const LIMIT: Duration = Duration::from_secs(30);

/// A channel's two ends.
type Pair<T> = (Sender<T>, Receiver<T>);

/// Makes a channel of one flavor.
type Make = fn() -> Pair<u64>;

fn flavors() -> Vec<(&'static str, Make)> {
    vec![
        ("bounded(0)", || chan::bounded(0)),
        ("bounded(1)", || chan::bounded(1)),
        ("bounded(4)", || chan::bounded(4)),
        ("unbounded", chan::unbounded),
    ]
}

// ===== tests =====

include!("common/chan_fiber_cases.rs");
