//! Waiting on a word of shared memory, and how many CPUs this thread has.
//!
//! # References
//! - [`futex(2)`](https://man7.org/linux/man-pages/man2/futex.2.html)
//! - [`sched_getaffinity(2)`](https://man7.org/linux/man-pages/man2/sched_getaffinity.2.html)

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// `futex(word, FUTEX_WAIT, expected, timeout)`, shared (not
/// `FUTEX_PRIVATE`: the word may live in memory another process maps).
/// Returns when woken, when `word` no longer holds `expected` (`EAGAIN`),
/// at the timeout or on a signal: the caller looks again in every case.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = rustix::fs::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&timeout));
}

/// `futex(word, FUTEX_WAKE, n)`, shared: wakes up to `n` waiters.
pub(crate) fn wake(word: &AtomicU32, n: u32) {
    let _ = futex::wake(word, futex::Flags::empty(), n);
}

/// Whether this thread may run on more than one CPU (so a peer can run
/// while it spins). Asked when it matters, not cached: affinity changes,
/// and the question costs one system call.
pub(crate) fn smp() -> bool {
    rustix::thread::sched_getaffinity(None).is_ok_and(|set| set.count() > 1)
}
