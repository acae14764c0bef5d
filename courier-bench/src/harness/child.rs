//! The peer side of cross-process cases, and where both sides run.
//!
//! A suite that needs a second process re-executes this very binary
//! (`/proc/self/exe`, never a path under `target/` that another build may
//! replace meanwhile) as `courier-bench __child <role> [args...]`; the role is
//! looked up in [`crate::suites::ROLES`]. Descriptors the parent passes land in
//! the child at 3, 4, 5… in the order given, and the child claims them with
//! [`inherited_fd`]. The child gets `SIGKILL` if the parent dies, so an
//! aborted run leaves no spinning orphan.
//!
//! [`Placement`] decides where both processes run: a process's CPU mask is
//! inherited across `fork` and kept across `execve`, so a child spawned (with
//! [`Affinity::spawn`]) while the parent's thread is placed is placed too.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The hidden subcommand that runs a child role.
pub const SUBCOMMAND: &str = "__child";

/// The first descriptor number a child receives.
const FIRST_FD: RawFd = 3;
/// At most this many descriptors go to one child.
const MAX_FDS: usize = 8;

/// A running child process playing one role; killed if dropped unwaited.
#[derive(Debug)]
pub struct Peer {
    child: std::process::Child,
    role: String,
}

/// Starts `courier-bench __child <role> <args>`, handing it `fds` as
/// descriptors 3, 4, … (at most 8). Its stdout is discarded, so nothing it
/// prints can interleave with the tables; its stderr is kept for errors.
pub fn spawn(role: &str, args: &[String], fds: &[BorrowedFd<'_>]) -> io::Result<Peer> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!("more than {MAX_FDS} descriptors")));
    }
    let mut sources = [-1; MAX_FDS];
    for (slot, fd) in sources.iter_mut().zip(fds) {
        *slot = fd.as_raw_fd();
    }
    let count = fds.len();
    let mut command = Command::new("/proc/self/exe");
    command
        .arg(SUBCOMMAND)
        .arg(role)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: the hook runs between fork and exec and only makes async-signal-
    // safe calls (`fcntl`, `dup2`) on a copied array, no allocation or lock;
    // `fds` borrows the sources, so they stay open until after the exec.
    unsafe { command.pre_exec(move || place_fds(&sources[..count])) };
    Ok(Peer {
        child: command.spawn()?,
        role: role.to_string(),
    })
}

/// In the forked child: moves `sources` to 3, 4, … without close-on-exec.
fn place_fds(sources: &[RawFd]) -> io::Result<()> {
    let cvt = |r: libc::c_int| {
        if r == -1 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // First copy every source above the targets (close-on-exec, so they
    // vanish at exec): placing one target can then never clobber a source
    // that happens to sit on another target's number.
    let above = FIRST_FD + sources.len() as RawFd;
    let mut parked = [-1; MAX_FDS];
    for (park, &fd) in parked.iter_mut().zip(sources) {
        // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` takes plain integers and creates a
        // new descriptor; it touches no memory of ours.
        *park = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, above) })?;
    }
    for (target, &fd) in (FIRST_FD..).zip(&parked[..sources.len()]) {
        // SAFETY: `dup2` takes plain integers; the copy it makes at `target`
        // has close-on-exec cleared, which is what passes it on.
        cvt(unsafe { libc::dup2(fd, target) })?;
    }
    Ok(())
}

impl Peer {
    /// Waits for the child to exit; an error unless it exited with status 0.
    pub fn wait(mut self) -> io::Result<()> {
        let status = self.child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "child role `{}` failed: {status}",
                self.role
            )))
        }
    }

    /// Whether the child is still running (a `waitpid(WNOHANG)`).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a child: takes ownership of the `index`-th descriptor its parent passed
/// (0 is descriptor 3). Each index can be taken once.
pub fn inherited_fd(index: usize) -> io::Result<OwnedFd> {
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    if index >= MAX_FDS {
        return Err(io::Error::other(format!(
            "descriptor index {index} >= {MAX_FDS}"
        )));
    }
    let bit = 1 << index;
    if TAKEN.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
        return Err(io::Error::other(format!(
            "descriptor {index} already taken"
        )));
    }
    let raw = FIRST_FD + index as RawFd;
    // SAFETY: `fcntl(F_GETFD)` takes a plain integer and only reports whether
    // it names an open descriptor.
    if unsafe { libc::fcntl(raw, libc::F_GETFD) } == -1 {
        return Err(io::Error::other(format!(
            "descriptor {raw} was not passed to this child"
        )));
    }
    // SAFETY: `raw` is open (checked above) and was placed there by the parent
    // for this process; nothing else in it owns that number, and `TAKEN`
    // makes sure it is handed out once.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Called first thing in a child: die with the parent.
pub fn die_with_parent() -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

/// Where the two processes of a cross-process case run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Both on one CPU (the lowest the process may use): stable figures,
    /// the ones targets are set against. A wake-up is a context switch.
    Pinned,
    /// Wherever the scheduler puts them: what users see. On a 2-vCPU VM a
    /// wake-up on the other vCPU costs tens of µs and the figures swing.
    Unpinned,
    /// Each on its own CPU (the two lowest): every wake-up crosses CPUs, and
    /// two spinning processes never take each other's time slice.
    Split,
}

impl Placement {
    /// The two placements every cross-process case reports.
    pub const BOTH: [Placement; 2] = [Placement::Pinned, Placement::Unpinned];

    /// The label that goes into case names.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Pinned => "pinned",
            Placement::Unpinned => "unpinned",
            Placement::Split => "split",
        }
    }

    /// Applies this placement to the calling thread until the guard drops;
    /// spawn the peer with [`Affinity::spawn`] to place it too.
    pub fn enter(self) -> io::Result<Affinity> {
        let saved = sched_getaffinity(None)?;
        let mut cpus = (0..CpuSet::MAX_CPU).filter(|&cpu| saved.is_set(cpu));
        let (ours, peer) = match self {
            Placement::Unpinned => (None, None),
            Placement::Pinned => {
                let cpu = cpus
                    .next()
                    .ok_or_else(|| io::Error::other("empty CPU mask"))?;
                (Some(cpu), None)
            }
            Placement::Split => match (cpus.next(), cpus.next()) {
                (Some(a), Some(b)) => (Some(a), Some(b)),
                _ => return Err(io::Error::other("the split placement needs two CPUs")),
            },
        };
        if let Some(cpu) = ours {
            sched_setaffinity(None, &only(cpu))?;
        }
        Ok(Affinity { saved, ours, peer })
    }
}

fn only(cpu: usize) -> CpuSet {
    let mut set = CpuSet::new();
    set.set(cpu);
    set
}

/// A placement in force on the calling thread; restores the thread's CPU
/// mask when dropped.
#[must_use = "the placement ends when the guard drops"]
pub struct Affinity {
    saved: CpuSet,
    ours: Option<usize>,
    peer: Option<usize>,
}

impl Affinity {
    /// [`spawn`]s the peer process into this placement: it inherits the
    /// thread's mask, switched to the peer's CPU for the moment of the fork
    /// when the placement splits the two.
    pub fn spawn(&self, role: &str, args: &[String], fds: &[BorrowedFd<'_>]) -> io::Result<Peer> {
        let (Some(peer), Some(ours)) = (self.peer, self.ours) else {
            return spawn(role, args, fds);
        };
        sched_setaffinity(None, &only(peer))?;
        let spawned = spawn(role, args, fds);
        sched_setaffinity(None, &only(ours))?;
        spawned
    }
}

impl Drop for Affinity {
    fn drop(&mut self) {
        let _ = sched_setaffinity(None, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_placement_narrows_to_one_cpu_and_restores() {
        let before = sched_getaffinity(None).unwrap();
        {
            let _guard = Placement::Pinned.enter().unwrap();
            assert_eq!(sched_getaffinity(None).unwrap().count(), 1);
        }
        assert_eq!(sched_getaffinity(None).unwrap().count(), before.count());
        {
            let _guard = Placement::Unpinned.enter().unwrap();
            assert_eq!(sched_getaffinity(None).unwrap().count(), before.count());
        }
    }

    #[test]
    fn labels() {
        let labels: Vec<_> = Placement::BOTH.iter().map(|p| p.label()).collect();
        assert_eq!(labels, ["pinned", "unpinned"]);
        assert_eq!(Placement::Split.label(), "split");
    }

    #[test]
    fn split_placement_pins_this_thread_to_one_cpu() {
        let before = sched_getaffinity(None).unwrap();
        match Placement::Split.enter() {
            Ok(_guard) => assert_eq!(sched_getaffinity(None).unwrap().count(), 1),
            Err(_) => assert!(before.count() < 2, "two CPUs but no split"),
        }
        assert_eq!(sched_getaffinity(None).unwrap().count(), before.count());
    }

    #[test]
    fn place_fds_swaps_sources_that_sit_on_each_others_targets() {
        use std::os::unix::ffi::OsStrExt;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        // What /proc says each descriptor is ("socket:[inode]"), read before
        // the fork so the child need not allocate.
        let link = |fd: RawFd| {
            let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            let mut out = [0u8; 64];
            let bytes = path.as_os_str().as_bytes();
            out[..bytes.len()].copy_from_slice(bytes);
            (out, bytes.len())
        };
        let (want3, want4) = (link(a.as_raw_fd()), link(b.as_raw_fd()));
        let (ra, rb) = (a.as_raw_fd(), b.as_raw_fd());
        // SAFETY: the forked child only makes async-signal-safe calls
        // (`fcntl`, `dup2`, `readlink`, `_exit`) and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: plain-integer descriptor calls (and, below, `readlink`
            // into a local buffer of the length passed).
            let (ha, hb) = unsafe {
                (
                    libc::fcntl(ra, libc::F_DUPFD, 100),
                    libc::fcntl(rb, libc::F_DUPFD, 100),
                )
            };
            // Put `a` on 4 and `b` on 3, then ask for a -> 3 and b -> 4.
            // SAFETY: as above.
            let dup_ok = unsafe { libc::dup2(ha, 4) == 4 && libc::dup2(hb, 3) == 3 };
            let placed = dup_ok && place_fds(&[4, 3]).is_ok();
            let is = |path: &std::ffi::CStr, want: &([u8; 64], usize)| {
                let mut got = [0u8; 64];
                // SAFETY: as above.
                let n = unsafe { libc::readlink(path.as_ptr(), got.as_mut_ptr().cast(), 64) };
                n as usize == want.1 && got[..want.1] == want.0[..want.1]
            };
            let ok = placed
                && is(c"/proc/self/fd/3", &want3)
                && is(c"/proc/self/fd/4", &want4)
                // SAFETY: as above; close-on-exec must be clear on both.
                && unsafe { libc::fcntl(3, libc::F_GETFD) & libc::FD_CLOEXEC == 0 }
                // SAFETY: as above.
                && unsafe { libc::fcntl(4, libc::F_GETFD) & libc::FD_CLOEXEC == 0 };
            // SAFETY: `_exit` ends the forked child without running any of
            // the parent's destructors or atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer and `pid` is our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "descriptors misplaced");
    }
}
