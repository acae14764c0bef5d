//! Fibers that share one OS thread, blocking on `chan`'s channels through the `Park` seam.
//!
//! The case the seam exists for: a ring of fibers on one scheduler thread, which deadlocks on
//! channels that can only park the OS thread. The fibers run under the test scheduler of
//! `common/fibers.rs`: a deadlock fails the test with a message, and a fiber that spins forever
//! is caught by the watchdog.

#![cfg(not(loom))]

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use courier::chan::{self, Receiver, RecvError, RecvTimeoutError, Select, Sender};

#[path = "common/fibers.rs"]
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
