//! Helpers shared by the integration tests.

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use courier::ipc::Config;

pub mod wire;

#[allow(dead_code)] // not every test binary checks descriptors
static SERIAL: Mutex<()> = Mutex::new(());

/// The number of descriptors this process has open.
#[allow(dead_code)] // not every test binary checks descriptors
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Descriptors of the process that are senders' shared-memory rings (a
/// receiver holds one for each sender that set one up).
#[allow(dead_code)] // not every test binary counts them
pub fn ring_fds() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|link| link.to_string_lossy().starts_with("/memfd:courier-ring"))
        .count()
}

/// Serialises the tests of one binary that hold it, and checks when dropped
/// that the process has no more descriptors open than when it was taken.
///
/// The tests of one binary are threads of one process, and a thread outside
/// the lock (the test harness, a test that does not take it, proptest looking
/// for its failure file as a test starts) may hold a descriptor for a moment
/// when a count is taken: a run of `ipc_hostile` once counted 7 before and 6
/// after. So fewer at the end is no leak, and more at the end must last half
/// a second to be called one.
#[allow(dead_code)] // not every test binary checks descriptors
pub struct FdCheck {
    before: usize,
    _serial: MutexGuard<'static, ()>,
}

/// Starts an [`FdCheck`] (waiting for any other test holding one).
#[allow(dead_code)] // not every test binary checks descriptors
pub fn fd_check() -> FdCheck {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    FdCheck {
        before: open_fds(),
        _serial: serial,
    }
}

impl Drop for FdCheck {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for _ in 0..50 {
            if open_fds() <= self.before {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let after = open_fds();
        assert!(
            after <= self.before,
            "descriptor leak: {after} open, {} before",
            self.before
        );
    }
}

/// Runs `f` with the process's settings changed by `change`, restored after
/// (also if `f` panics, so that one failure does not spread to the tests
/// after it).
#[allow(dead_code)] // not every test binary changes the settings
pub fn with_config<R>(change: impl FnOnce(&mut Config), f: impl FnOnce() -> R) -> R {
    struct Restore(Config);
    impl Drop for Restore {
        fn drop(&mut self) {
            Config::set_global(self.0);
        }
    }
    let saved = Restore(Config::global());
    let mut config = saved.0;
    change(&mut config);
    Config::set_global(config);
    f()
}

/// This test binary again (`/proc/self/exe`, no `fork` of the threaded
/// harness), to run only its `child_entry` test with `envs` set (the role it
/// plays, the one-shot server it connects to...); its stdin is closed, and
/// the caller chooses its stdout and how to start it.
#[allow(dead_code)] // not every test binary has child processes
pub fn child_command(envs: &[(&str, &str)]) -> Command {
    let mut command = Command::new("/proc/self/exe");
    command
        .args([
            "child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .envs(envs.iter().copied())
        .stdin(Stdio::null());
    command
}

/// Starts [`child_command`]`(envs)` with its stdout piped to the caller.
#[allow(dead_code)] // not every test binary has child processes
pub fn spawn_child_entry(envs: &[(&str, &str)]) -> Child {
    child_command(envs).stdout(Stdio::piped()).spawn().unwrap()
}
