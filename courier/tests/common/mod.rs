//! Helpers shared by the integration tests.

use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// The number of descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Serialises the tests of one binary that hold it, and checks when dropped
/// that the process has as many descriptors open as when it was taken.
pub struct FdCheck {
    before: usize,
    _serial: MutexGuard<'static, ()>,
}

/// Starts an [`FdCheck`] (waiting for any other test holding one).
pub fn fd_check() -> FdCheck {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    FdCheck {
        before: open_fds(),
        _serial: serial,
    }
}

impl Drop for FdCheck {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(open_fds(), self.before, "descriptor leak");
        }
    }
}
