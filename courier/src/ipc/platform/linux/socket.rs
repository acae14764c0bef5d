//! `SOCK_SEQPACKET` sockets: the few syscalls the transport needs, each
//! wrapped once with its error handling.
//!
//! Sending, and `recv(2)` into a buffer, use rustix (safe, `BorrowedFd`-typed;
//! its `recv` takes uninitialised buffers). `recvmsg(2)` goes through libc
//! because the payload lands in *uninitialised* memory: rustix's `recvmsg`
//! takes `IoSliceMut`, which would require the buffer to be initialised
//! (zero-filled) first, the very cost ipc-channel PR #68 removed. It is the
//! raw system call (`syscall(SYS_recvmsg, ...)`), not libc's cancellable
//! wrapper.
//!
//! # References
//! - [`socketpair(2)`](https://man7.org/linux/man-pages/man2/socketpair.2.html)
//! - [`sendmsg(2)`](https://man7.org/linux/man-pages/man2/sendmsg.2.html) (`MSG_DONTWAIT`),
//!   [`recvmsg(2)`](https://man7.org/linux/man-pages/man2/recvmsg.2.html)
//! - [`poll(2)`](https://man7.org/linux/man-pages/man2/poll.2.html) (`POLLOUT`)
//! - [`unix(7)`](https://man7.org/linux/man-pages/man7/unix.7.html) (`SCM_RIGHTS`, `MSG_CMSG_CLOEXEC`, `SIOCOUTQ`)
//! - [`cmsg(3)`](https://man7.org/linux/man-pages/man3/cmsg.3.html)
#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
    SocketAddrUnix, SocketFlags, SocketType,
};

use super::super::{Packet, FDS_PER_PACKET as MAX_FDS, SMALL_HEAD as HEADER_MAX};
use crate::buf::RawIoVec;
use crate::fiber::Interest;

/// `socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)`.
pub(crate) fn pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
}

/// The largest packet this process's sockets accept, probed once.
///
/// The kernel refuses a `SOCK_SEQPACKET` packet longer than the socket's
/// send buffer minus 32 bytes (`unix_dgram_sendmsg`: `len > sk->sk_sndbuf -
/// 32` gives `EMSGSIZE`). The send buffer is the same for every socket we
/// create (`net.core.wmem_default`), so one `getsockopt(SO_SNDBUF)` on a
/// throw-away pair, cached for the life of the process, answers for all.
pub(crate) fn max_packet() -> usize {
    static MAX_PACKET: OnceLock<usize> = OnceLock::new();
    *MAX_PACKET.get_or_init(|| {
        let probed = pair()
            .and_then(|(a, _b)| net::sockopt::socket_send_buffer_size(&a))
            .unwrap_or(0);
        // Fall back to a conservative size if the probe failed.
        let sndbuf = if probed > 4096 { probed } else { 64 * 1024 };
        sndbuf - 32
    })
}

/// `sendmsg(fd, iov, SCM_RIGHTS(fds), MSG_NOSIGNAL | MSG_DONTWAIT)`, retried
/// on `EINTR`; on `EAGAIN` (no room in the send buffer), waits until `fd` is
/// writable ([`wait_writable`]) and sends again.
///
/// No control message is attached when `fds` is empty; more than `MAX_FDS`
/// (`SCM_MAX_FD`) is `ETOOMANYREFS`, and nothing is sent. `MSG_NOSIGNAL` makes
/// a vanished peer an `EPIPE` instead of a `SIGPIPE` that would kill a host
/// process which has not ignored it. The send itself never waits: a thread
/// waits in `poll(2)`, as the kernel would have inside `sendmsg`, and a
/// fiber parks on its worker's reactor instead of blocking the worker.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    iov: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
) -> Result<usize, Errno> {
    until_sent(fd, || try_send(fd, iov, fds))
}

/// `sendmsg(fd, iov, SCM_RIGHTS(fds), MSG_NOSIGNAL | MSG_DONTWAIT)`, retried
/// on `EINTR`: `EAGAIN`, with nothing sent, when the send buffer is full.
///
/// A `SOCK_SEQPACKET` packet is queued whole or not at all: the kernel takes
/// it whenever the bytes queued from this socket (`SIOCOUTQ`, counted with
/// the kernel's overhead) are below its send buffer (`SO_SNDBUF`), however
/// large the packet (`sock_alloc_send_pskb`).
pub(crate) fn try_send(
    fd: BorrowedFd<'_>,
    iov: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
) -> Result<usize, Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    // (The buffer's padding would take one more than `MAX_FDS`; the kernel
    // would refuse it with `EINVAL`.)
    if !fds.is_empty()
        && (fds.len() > MAX_FDS || !control.push(SendAncillaryMessage::ScmRights(fds)))
    {
        return Err(Errno::TOOMANYREFS);
    }
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    loop {
        match net::sendmsg(fd, iov, &mut control, flags) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// `send(fd, header ++ parts, MSG_NOSIGNAL | MSG_DONTWAIT)` through one
/// stack buffer of at most `HEADER_MAX + SMALL_MAX` bytes, retried on
/// `EINTR`: `EAGAIN`, with nothing sent, when the send buffer is full.
#[inline]
pub(crate) fn try_send_small<const H: usize>(
    fd: BorrowedFd<'_>,
    header: &[u8; H],
    parts: &[IoSlice<'_>],
    total: usize,
) -> Result<usize, Errno> {
    const { assert!(H <= HEADER_MAX) };
    assert!(total <= SMALL_MAX);
    // Not zero-filled: only the `len` bytes written below are ever read.
    let mut buf = [MaybeUninit::<u8>::uninit(); HEADER_MAX + SMALL_MAX];
    let len = H + total;
    let mut at = 0;
    for part in std::iter::once(&header[..]).chain(parts.iter().map(|p| &**p)) {
        buf[at..at + part.len()].copy_from_slice(as_uninit(part));
        at += part.len();
    }
    debug_assert_eq!(at, len);
    // SAFETY: the loop above initialised `buf[..len]`: the header and the
    // parts, whose lengths sum to `total`.
    let buf = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len) };
    loop {
        match net::send(fd, buf, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// Runs `try_send` until it does not fail with `EAGAIN`, waiting for `fd`
/// to be writable between two tries.
fn until_sent(
    fd: BorrowedFd<'_>,
    mut try_send: impl FnMut() -> Result<usize, Errno>,
) -> Result<usize, Errno> {
    loop {
        match try_send() {
            Err(Errno::AGAIN) => {
                wait_writable(fd, None)
                    .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
            }
            other => return other,
        }
    }
}

/// Waits until `fd` is writable (or hung up, or failed), or `deadline`
/// passes: `true` if it is, `false` if the deadline came first (`None`: no
/// deadline). A fiber parks on its worker's reactor; a thread waits in
/// `poll(2)`.
///
/// A Unix datagram or seqpacket socket polls writable once its queued bytes
/// are at most a quarter of its send buffer (`unix_writable`), the point at
/// which the kernel would wake a blocked `sendmsg`, so a packet sent then
/// is taken.
pub(crate) fn wait_writable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> io::Result<bool> {
    crate::fiber::wait_fd(fd, Interest::Write, deadline)
}

/// `ioctl(fd, SIOCOUTQ)` and `getsockopt(fd, SO_SNDBUF)`: the bytes queued
/// from `fd` and not yet read by its peer, counted as the kernel charges
/// them (packet and overhead), and the send buffer they are held to.
pub(crate) fn send_queue(fd: BorrowedFd<'_>) -> Result<(usize, usize), Errno> {
    let mut queued: libc::c_int = 0;
    // SAFETY: `SIOCOUTQ` (`TIOCOUTQ`) writes one `int` through its argument,
    // which points to `queued`, alive and writable for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    if r < 0 {
        return Err(Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO));
    }
    let size = net::sockopt::socket_send_buffer_size(fd)?;
    Ok((queued.max(0) as usize, size))
}

/// `bytes` as uninitialised-or-not bytes (always sound: every `u8` is a
/// valid `MaybeUninit<u8>`, and the slice is shared, so nothing can write
/// uninitialised bytes through it).
fn as_uninit(bytes: &[u8]) -> &[MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; see above.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) }
}

/// Largest payload [`try_send_small`] takes, and the line between the plain
/// `send`/`recv` paths and the `sendmsg`/`recvmsg` iovec paths.
///
/// Set where the two cost the same. Send+receive of one message on a bytes
/// channel, both lines moved together, alternating in one process, plain
/// path vs iovec path: 6 KiB 1.29 vs 1.43 µs, 7 KiB 1.33 vs 1.49 µs, 8 KiB
/// 1.57 vs 1.52 µs, 12 KiB 2.65 vs 1.96 µs (`courier-bench ipc --case
/// sendrecv_`, bytes, on an Intel Xeon guest). The line is not a round 4 KiB
/// so that a page of payload plus its framing (a typed message with a 4 KiB
/// `serde_bytes` field is 4,098
/// bytes) stays on the cheap path: at 4,096 it paid 1.2x. [`try_send_small`]'s
/// stack buffer is this size plus the header, which a task's stack (a
/// fiber's, too) must allow for.
pub(crate) const SMALL_MAX: usize = 7 * 1024;

/// Control buffer for up to `MAX_FDS` descriptors (`SCM_MAX_FD`, 253: one
/// packet's), aligned for `cmsghdr`. Never initialised: the kernel writes
/// what it delivers, so its size costs a packet without descriptors nothing.
#[repr(C, align(8))]
struct ControlBuf([MaybeUninit<u8>; CONTROL_LEN]);

/// `CMSG_SPACE(MAX_FDS * sizeof(int))` on LP64 Linux: a 16-byte header
/// followed by the descriptors, padded to 8 bytes.
const CONTROL_LEN: usize =
    size_of::<libc::cmsghdr>() + (MAX_FDS * size_of::<RawFd>()).next_multiple_of(8);

/// `recv(fd, buf, MSG_TRUNC | flags)`, retried on `EINTR`: the length of
/// the whole packet, which exceeds `buf.len()` if the packet did not fit
/// (the rest is lost). Descriptors attached to the packet are closed by the
/// kernel.
pub(crate) fn recv_whole(
    fd: BorrowedFd<'_>,
    buf: &mut [MaybeUninit<u8>],
    dontwait: bool,
) -> Result<usize, Errno> {
    // rustix's raw syscall: libc's `recv` is a cancellation point, whose
    // bookkeeping and `errno` round trip cost a small message ~5% here.
    let flags = match dontwait {
        true => RecvFlags::TRUNC | RecvFlags::DONTWAIT,
        false => RecvFlags::TRUNC,
    };
    loop {
        match net::recv(fd, &mut *buf, flags) {
            Ok((_, len)) => return Ok(len),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `recv(fd, buf, MSG_PEEK | MSG_DONTWAIT)`, retried on `EINTR`: copies the
/// start of the next packet into `buf` and leaves the packet queued. Returns
/// the bytes copied.
pub(crate) fn peek<'b>(
    fd: BorrowedFd<'_>,
    buf: &'b mut [MaybeUninit<u8>],
) -> Result<&'b [u8], Errno> {
    let copied = loop {
        match net::recv(fd, &mut *buf, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok(((copied, _), _)) => break copied.len(),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    };
    // SAFETY: `recv` initialised the first `copied` bytes of `buf`.
    Ok(unsafe { assume_init(&buf[..copied]) })
}

/// The bytes of `buf`, which the caller knows to be initialised.
///
/// # Safety
/// The caller must ensure that every byte of `buf` was written (by the
/// kernel, in this module's uses).
pub(crate) unsafe fn assume_init(buf: &[MaybeUninit<u8>]) -> &[u8] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the caller
    // guarantees every byte is initialised.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len()) }
}

/// `recvmsg(fd, iov, MSG_CMSG_CLOEXEC | flags)`, retried on `EINTR`, with a
/// control buffer for `MAX_FDS` descriptors when `control` is set (without
/// one, descriptors attached to the packet are closed by the kernel).
///
/// Every received descriptor becomes an [`OwnedFd`] before this returns, so
/// no later validation step can leak one.
pub(crate) fn recv(
    fd: BorrowedFd<'_>,
    iov: &mut [RawIoVec<'_>],
    control: bool,
    dontwait: bool,
) -> Result<Packet<OwnedFd>, Errno> {
    let mut control_buf = ControlBuf([MaybeUninit::uninit(); CONTROL_LEN]);
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    loop {
        // SAFETY: an all-zero `msghdr` is valid (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = RawIoVec::as_iovecs(iov);
        msg.msg_iovlen = iov.len();
        if control {
            msg.msg_control = control_buf.0.as_mut_ptr().cast();
            msg.msg_controllen = CONTROL_LEN;
        }
        // The system call itself, not libc's `recvmsg`: that one is a
        // cancellation point, which in a process of several threads costs
        // two locked compare-exchanges around every call.
        // SAFETY: `RawIoVec` is an `iovec` over memory lent to it exclusively
        // (by `io_vecs`); `msg_control`, if set, has `CONTROL_LEN` writable
        // bytes; `recvmsg` takes an `int`, a `struct msghdr *` and an `int`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvmsg,
                fd.as_raw_fd(),
                std::ptr::from_mut(&mut msg),
                flags,
            )
        };
        if n < 0 {
            match Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO) {
                Errno::INTR => continue,
                e => return Err(e),
            }
        }
        let fds = if control { take_fds(&msg) } else { Vec::new() };
        return Ok(Packet {
            len: n as usize,
            fds,
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            control_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        });
    }
}

thread_local! {
    /// An emptied vector of received descriptors, given back by the layer
    /// above (`Transport::recycle_fds`) for the next receive to fill.
    static SPARE_FDS: std::cell::Cell<Vec<OwnedFd>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Keeps `fds`, emptied, for this thread's next receive of descriptors.
pub(crate) fn recycle_fds(mut fds: Vec<OwnedFd>) {
    fds.clear();
    let _ = SPARE_FDS.try_with(|spare| spare.set(fds));
}

/// Takes ownership of every descriptor in the `SCM_RIGHTS` messages of `msg`.
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = SPARE_FDS.try_with(|spare| spare.take()).unwrap_or_default();
    // SAFETY: `msg` was filled by a successful `recvmsg`; its control
    // pointer and length describe the kernel-written control data.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: `CMSG_FIRSTHDR`/`CMSG_NXTHDR` return either null or a
        // pointer to a complete, aligned `cmsghdr` inside the control buffer.
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: computing the header length has no preconditions.
            let data_offset = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (hdr.cmsg_len as usize).saturating_sub(data_offset) / size_of::<RawFd>();
            // SAFETY: `cmsg` is a valid header (above), so its data follows it.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: the kernel wrote `count` descriptors after the
                // header; they may be unaligned, hence `read_unaligned`.
                let raw = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel installed `raw` in our table for this
                // message alone; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for `CMSG_FIRSTHDR`, with `cmsg` a header of `msg`.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    fds
}

/// Waits until `fd` is readable (or hung up), or `deadline` passes: `true`
/// if it is, `false` if the deadline came first. A fiber parks on its
/// worker's reactor; a thread waits in `poll(2)`, retried on `EINTR`.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<bool> {
    if crate::fiber::in_fiber() {
        return crate::fiber::wait_fd(fd, Interest::Read, Some(deadline));
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `poll(fd, 0, timeout 0)`: whether the peer is gone (`POLLHUP`, which a
/// socket whose peer is closed always reports); `false` if `poll` fails.
pub(crate) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::empty())];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&now)).is_ok() && fds[0].revents().contains(PollFlags::HUP)
}

/// `poll(fd, POLLIN | POLLRDHUP, timeout 0)`: whether the peer has stopped
/// writing (`POLLHUP` or `POLLRDHUP`); `true` if `poll` fails.
pub(crate) fn read_hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::IN | PollFlags::RDHUP)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::HUP | PollFlags::RDHUP),
        Err(_) => true,
    }
}

/// `ioctl(fd, FIONREAD)`: on a `SOCK_SEQPACKET` socket, the bytes of every
/// queued packet, not only the next one's.
pub(crate) fn queued(fd: BorrowedFd<'_>) -> Result<usize, Errno> {
    rustix::io::ioctl_fionread(fd).map(|n| n as usize)
}

/// Checks that a descriptor can be a channel end: a `SOCK_SEQPACKET` Unix
/// socket connected to a peer (`getsockopt(SO_TYPE)`, `getpeername`). The
/// error says what it is instead.
pub(crate) fn check_channel_end(fd: BorrowedFd<'_>) -> Result<(), &'static str> {
    if net::sockopt::socket_type(fd) != Ok(SocketType::SEQPACKET) {
        return Err("a channel end is not a SOCK_SEQPACKET socket");
    }
    match net::getpeername(fd) {
        Ok(Some(peer)) if peer.address_family() == AddressFamily::UNIX => Ok(()),
        Ok(_) => Err("a channel end is not a Unix socket"),
        Err(_) => Err("a channel end is not connected (a listening or unconnected socket)"),
    }
}

/// Which socket `fd` is (`fstat`'s `st_dev`, `st_ino`): the same for every
/// duplicate of one descriptor.
pub(crate) fn identity(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    rustix::fs::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

// ===== One-shot server =====

/// A listening `SOCK_SEQPACKET` socket at a path in a fresh private (0700)
/// directory; the name handed to the client is that path.
#[derive(Debug)]
pub(crate) struct Listener {
    listener: OwnedFd,
    dir: PathBuf,
    path: PathBuf,
}

impl Listener {
    /// `socket`, `bind` and `listen(1)` at a fresh path; the path is the name.
    pub(crate) fn new() -> io::Result<(Self, String)> {
        use std::hash::{BuildHasher, Hasher};
        use std::os::unix::fs::DirBuilderExt;
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u32(std::process::id());
        let dir = std::env::temp_dir().join(format!("courier-{:016x}", random.finish()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("socket");
        let listener = Self::listen(&path).inspect_err(|_| {
            // `bind` may have made the socket file before `listen` failed.
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_dir(&dir);
        })?;
        // From here on, dropping the listener removes the file and directory.
        let server = Listener {
            listener,
            dir,
            path,
        };
        let name = server
            .path
            .to_str()
            .map(str::to_owned)
            .ok_or(io::ErrorKind::InvalidFilename)?;
        Ok((server, name))
    }

    fn listen(path: &Path) -> io::Result<OwnedFd> {
        let fd = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        net::listen(&fd, 1)?;
        Ok(fd)
    }

    /// Accepts the client's connection, waiting until `deadline` at most
    /// (`None`: no limit); `Ok(None)` if the deadline came first. A fiber
    /// waits on its reactor, never in `accept(2)`.
    pub(crate) fn accept(&self, deadline: Option<Instant>) -> io::Result<Option<OwnedFd>> {
        let fd = self.listener.as_fd();
        match deadline {
            Some(deadline) if !wait_readable(fd, deadline)? => return Ok(None),
            Some(_) => {}
            None if crate::fiber::in_fiber() => {
                let hour = std::time::Duration::from_secs(3600);
                while let Ok(false) = wait_readable(fd, Instant::now() + hour) {}
            }
            None => {}
        }
        loop {
            match net::accept_with(&self.listener, SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(Some(fd)),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `socket` and `connect` to the listener named `name`.
pub(crate) fn connect(name: &str) -> io::Result<OwnedFd> {
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    net::connect(&fd, &SocketAddrUnix::new(name)?)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// The kernel takes `MAX_FDS` descriptors in one `SCM_RIGHTS` message
    /// and refuses one more (`SCM_MAX_FD`; `EINVAL`), and `recv` gets all of
    /// them: one packet's worth, in order.
    #[test]
    fn one_packet_carries_scm_max_fd_descriptors_and_no_more() {
        let (a, b) = pair().unwrap();
        let (spare, _peer) = pair().unwrap();
        let fds = vec![spare.as_fd(); MAX_FDS + 1];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        let refused = net::sendmsg(&a, &[IoSlice::new(b"x")], &mut control, SendFlags::NOSIGNAL);
        assert_eq!(refused.map(drop), Err(Errno::INVAL));
        assert_eq!(
            send(a.as_fd(), &[IoSlice::new(b"y")], &fds),
            Err(Errno::TOOMANYREFS)
        );
        assert_eq!(
            send(a.as_fd(), &[IoSlice::new(b"z")], &fds[..MAX_FDS]),
            Ok(1)
        );
        let mut buf = [MaybeUninit::<u8>::uninit(); 4];
        let mut ubuf = crate::buf::UbufMut::new(&mut buf);
        let mut iov = [RawIoVec::EMPTY; 1];
        let n = ubuf.io_vecs(&mut iov);
        let packet = recv(b.as_fd(), &mut iov[..n], true, true).unwrap();
        assert_eq!((packet.len, packet.fds.len()), (1, MAX_FDS));
        assert!(!packet.control_truncated);
        let same = identity(spare.as_fd());
        assert!(packet.fds.iter().all(|fd| identity(fd.as_fd()) == same));
    }
}
