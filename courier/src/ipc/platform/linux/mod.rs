//! The Linux transport: system calls only.
//!
//! * [`socket`]: `SOCK_SEQPACKET` socketpairs (`sendmsg`/`recvmsg` with
//!   `SCM_RIGHTS`, `recv`, `poll`), and the one-shot listener;
//! * [`memfd`]: sealed memfd regions and their shared mappings;
//! * [`futex`]: waiting on a word of a mapping;
//! * [`epoll`]: `epoll`, for receiver sets;
//! * [`random`]: `getrandom`, and a hook run in a forked child.
//!
//! Each implements its part of the contract of [`super`] for [`Linux`].
#![allow(unsafe_code)]

pub(crate) mod epoll;
pub(crate) mod futex;
pub(crate) mod memfd;
pub(crate) mod random;
pub(crate) mod socket;

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::{Memory, Packet, Process, Transport};
use crate::buf::RawIoVec;

/// The Linux implementation of the contract.
#[derive(Debug)]
pub(crate) enum Linux {}

impl Transport for Linux {
    type Fd = OwnedFd;
    type BorrowedFd<'a> = BorrowedFd<'a>;

    const SMALL_MAX: usize = socket::SMALL_MAX;

    #[inline]
    fn borrow(fd: &OwnedFd) -> BorrowedFd<'_> {
        fd.as_fd()
    }

    #[inline]
    fn pair() -> Result<(OwnedFd, OwnedFd), Errno> {
        socket::pair()
    }

    #[inline]
    fn max_packet() -> usize {
        socket::max_packet()
    }

    #[inline]
    fn send(
        fd: BorrowedFd<'_>,
        iov: &[IoSlice<'_>],
        fds: &[BorrowedFd<'_>],
    ) -> Result<usize, Errno> {
        socket::send(fd, iov, fds)
    }

    #[inline]
    fn try_send(
        fd: BorrowedFd<'_>,
        iov: &[IoSlice<'_>],
        fds: &[BorrowedFd<'_>],
    ) -> Result<usize, Errno> {
        socket::try_send(fd, iov, fds)
    }

    #[inline]
    fn try_send_small<const H: usize>(
        fd: BorrowedFd<'_>,
        header: &[u8; H],
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Errno> {
        socket::try_send_small(fd, header, parts, total)
    }

    #[inline]
    fn wait_writable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> io::Result<bool> {
        socket::wait_writable(fd, deadline)
    }

    #[inline]
    fn send_queue(fd: BorrowedFd<'_>) -> Result<(usize, usize), Errno> {
        socket::send_queue(fd)
    }

    #[inline]
    fn recv(
        fd: BorrowedFd<'_>,
        iov: &mut [RawIoVec<'_>],
        control: bool,
        dontwait: bool,
    ) -> Result<Packet<OwnedFd>, Errno> {
        socket::recv(fd, iov, control, dontwait)
    }

    #[inline]
    fn recycle_fds(fds: Vec<OwnedFd>) {
        socket::recycle_fds(fds);
    }

    #[inline]
    fn recv_whole(
        fd: BorrowedFd<'_>,
        buf: &mut [MaybeUninit<u8>],
        dontwait: bool,
    ) -> Result<usize, Errno> {
        socket::recv_whole(fd, buf, dontwait)
    }

    #[inline]
    fn peek<'b>(fd: BorrowedFd<'_>, buf: &'b mut [MaybeUninit<u8>]) -> Result<&'b [u8], Errno> {
        socket::peek(fd, buf)
    }

    #[inline]
    fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<bool> {
        socket::wait_readable(fd, deadline)
    }

    #[inline]
    fn hung_up(fd: BorrowedFd<'_>) -> bool {
        socket::hung_up(fd)
    }

    #[inline]
    fn read_hung_up(fd: BorrowedFd<'_>) -> bool {
        socket::read_hung_up(fd)
    }

    #[inline]
    fn queued(fd: BorrowedFd<'_>) -> Result<usize, Errno> {
        socket::queued(fd)
    }

    #[inline]
    fn check_channel_end(fd: BorrowedFd<'_>) -> Result<(), &'static str> {
        socket::check_channel_end(fd)
    }

    #[inline]
    fn identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
        socket::identity(fd)
    }

    /// `fcntl(F_DUPFD_CLOEXEC)`.
    #[inline]
    fn duplicate(fd: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
        rustix::io::fcntl_dupfd_cloexec(fd, 0)
    }
}

impl Memory for Linux {
    type Mapping = memfd::Mapping;

    #[inline]
    fn create_region(name: &str, len: usize) -> Result<OwnedFd, Errno> {
        memfd::create(name, len)
    }

    #[inline]
    fn seal(fd: BorrowedFd<'_>) -> Result<(), Errno> {
        memfd::seal(fd)
    }

    #[inline]
    fn sealed(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
        memfd::sealed(fd)
    }

    #[inline]
    fn stat(fd: BorrowedFd<'_>) -> Result<(u64, (u64, u64)), Errno> {
        memfd::stat(fd)
    }

    #[inline]
    fn on_hugetlbfs(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
        memfd::on_hugetlbfs(fd)
    }

    #[inline]
    fn allocate(fd: BorrowedFd<'_>, len: usize) -> Result<(), Errno> {
        memfd::allocate(fd, len)
    }

    #[inline]
    fn write_all(fd: BorrowedFd<'_>, bytes: &[u8]) -> Result<(), Errno> {
        memfd::write_all(fd, bytes)
    }

    #[inline]
    fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
        memfd::same_file(a, b)
    }

    #[inline]
    fn map(fd: BorrowedFd<'_>, len: usize) -> Result<memfd::Mapping, Errno> {
        memfd::Mapping::map(fd, len)
    }

    #[inline]
    fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
        futex::wait(word, expected, timeout)
    }

    #[inline]
    fn futex_wake(word: &AtomicU32, n: u32) {
        futex::wake(word, n)
    }

    #[inline]
    fn smp() -> bool {
        futex::smp()
    }

    #[inline]
    fn current_cpu() -> Option<u32> {
        // (glibc's, through the vDSO: no system call. Not rustix's, whose
        // own vDSO lookup faults under valgrind.)
        // SAFETY: `sched_getcpu` takes nothing and touches no memory of ours.
        let cpu = unsafe { libc::sched_getcpu() };
        u32::try_from(cpu).ok()
    }
}

impl Process for Linux {
    type Listener = socket::Listener;

    #[inline]
    fn fill_random(out: &mut [u8]) -> Result<(), Errno> {
        random::fill(out)
    }

    #[inline]
    fn on_fork_in_child(hook: extern "C" fn()) -> bool {
        random::on_fork_in_child(hook)
    }

    #[inline]
    fn listen() -> io::Result<(socket::Listener, String)> {
        socket::Listener::new()
    }

    #[inline]
    fn accept(
        listener: &socket::Listener,
        deadline: Option<Instant>,
    ) -> io::Result<Option<OwnedFd>> {
        listener.accept(deadline)
    }

    #[inline]
    fn connect(name: &str) -> io::Result<OwnedFd> {
        socket::connect(name)
    }
}
