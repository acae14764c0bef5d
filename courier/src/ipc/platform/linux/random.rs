//! The kernel's random generator, and a hook run in the child of a `fork`.
//!
//! # References
//! - [`getrandom(2)`](https://man7.org/linux/man-pages/man2/getrandom.2.html)
//! - [`pthread_atfork(3)`](https://man7.org/linux/man-pages/man3/pthread_atfork.3.html)

use rustix::io::Errno;
use rustix::rand::{getrandom, GetRandomFlags};

/// `getrandom(out, 0)` until `out` is full, retried on `EINTR`.
pub(crate) fn fill(out: &mut [u8]) -> Result<(), Errno> {
    let mut filled = 0;
    while filled < out.len() {
        match getrandom(&mut out[filled..], GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `pthread_atfork(NULL, NULL, hook)`: runs `hook` in the child of every
/// later `fork`; `false` if it could not be registered (no memory).
///
/// `hook` runs in a forked child of a threaded process, so it must only do
/// what is async-signal-safe (an atomic add, say).
pub(crate) fn on_fork_in_child(hook: extern "C" fn()) -> bool {
    // SAFETY: registering a handler reads no memory of ours; what `hook`
    // may do in the child is the caller's contract, stated above.
    unsafe { libc::pthread_atfork(None, None, Some(hook)) == 0 }
}
