//! A time limit for tests that could hang: the body runs on a thread of its own, and a body that
//! is not done in time fails the test (with a message) instead of hanging CI.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Runs `f` on a thread and fails if it does not finish within `limit`; a panic in `f` fails
/// the test with that panic. A body that never returns is left running (the test binary
/// exits without it).
pub fn with_watchdog(name: &str, limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel();
    let t = thread::spawn(move || {
        f();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(limit) {
        // Done, or panicked (the sender dropped unsent): joining surfaces the panic.
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => t.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name}: not done after {limit:?} (a lost wake-up, or a task waiting for one that cannot run)")
        }
    }
}
