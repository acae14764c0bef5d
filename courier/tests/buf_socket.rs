//! `buf`'s first user: gather-send a header plus three user slices with
//! `sendmsg` and scatter-receive them with `recvmsg` into a message buffer's
//! uninitialised spare capacity plus a discard tail, through real sockets.
//!
//! Run under valgrind memcheck (`scripts/valgrind-buf.sh`), these tests also
//! show that receive memory is never read before the kernel writes it: the
//! spare capacity is fresh from the allocator, and every byte is compared
//! after the receive, so a byte read before it was written would be reported.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use courier::buf::{fill_spare, Discard, IoIter, RawIoVec};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    sendmsg, socketpair, AddressFamily, SendAncillaryBuffer, SendFlags, SocketFlags, SocketType,
};

/// A byte pattern that never contains the poison value 0xA5.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8 % 100) + 1 + seed % 50).collect()
}

fn pair(kind: SocketType) -> (OwnedFd, OwnedFd) {
    socketpair(AddressFamily::UNIX, kind, SocketFlags::CLOEXEC, None).expect("socketpair")
}

/// `recvmsg(fd, {msg_iov = iov}, 0)`: returns the byte count and `msg_flags`.
fn recvmsg_raw(fd: BorrowedFd<'_>, iov: &mut [RawIoVec<'_>]) -> (usize, i32) {
    // SAFETY: `msghdr` is plain data (pointers and integers) for which all
    // zeroes is a valid value: no name, no control buffer.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = RawIoVec::as_iovecs(iov);
    hdr.msg_iovlen = iov.len();
    // SAFETY: `hdr.msg_iov` points at `iov.len()` entries laid out as
    // `struct iovec`; each covers memory lent by a destination that stays
    // mutably borrowed (through the entries' lifetime) for this call.
    let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdr, 0) };
    assert!(r >= 0, "recvmsg: {}", io::Error::last_os_error());
    (r as usize, hdr.msg_flags)
}

/// Sends all of `it` with `sendmsg` from `io_slices`, resuming after partial
/// sends; returns how many calls sent less than they were offered.
fn send_all(fd: BorrowedFd<'_>, mut it: IoIter<'_>, width: usize, flags: SendFlags) -> usize {
    let mut partial = 0;
    let mut iov = vec![IoSlice::new(&[]); width];
    while it.remaining() > 0 {
        let n = it.io_slices(&mut iov);
        let offered: usize = iov[..n].iter().map(|s| s.len()).sum();
        match sendmsg(fd, &iov[..n], &mut SendAncillaryBuffer::default(), flags) {
            Ok(sent) => {
                partial += usize::from(sent < offered);
                it.advance(sent);
            }
            Err(Errno::AGAIN) => {
                let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                poll(&mut fds, None).expect("poll");
            }
            Err(e) => panic!("sendmsg: {e}"),
        }
    }
    partial
}

#[test]
fn header_and_three_slices_into_message_buffer_and_discard_tail() {
    let (tx, rx) = pair(SocketType::SEQPACKET);
    let header = pattern(16, 0);
    let (a, b, c) = (pattern(7, 1), pattern(3000, 2), pattern(900, 3));
    let whole = [&header[..], &a, &b, &c].concat();
    let parts = [
        IoSlice::new(&header),
        IoSlice::new(&a),
        IoSlice::new(&b),
        IoSlice::new(&c),
    ];

    // One message, gathered from four places, sent twice.
    for _ in 0..2 {
        let partial = send_all(
            tx.as_fd_ref(),
            IoIter::slices(&parts),
            8,
            SendFlags::NOSIGNAL,
        );
        assert_eq!(partial, 0, "a SEQPACKET message goes out whole");
    }

    // 1. Into a message buffer that holds the header, `a` and `b`, and a
    //    discard tail for `c`. The spare capacity is poisoned first, so a
    //    byte not written by the kernel could not pass the comparison.
    let keep = header.len() + a.len() + b.len();
    let mut msg = Vec::with_capacity(keep);
    msg.spare_capacity_mut().fill(MaybeUninit::new(0xA5));
    let mut tail = Discard::new(c.len());
    let (got, flags) = fill_spare(&mut msg, |room| {
        let mut iov = [RawIoVec::EMPTY; 8];
        let n1 = room.io_vecs(&mut iov);
        let n2 = tail.io_vecs(&mut iov[n1..]);
        assert_eq!((n1, n2), (1, 1));
        let (got, flags) = recvmsg_raw(rx.as_fd_ref(), &mut iov[..n1 + n2]);
        let to_msg = got.min(room.remaining());
        // SAFETY: `recvmsg` returned `got`: the kernel wrote the first `got`
        // bytes the iovecs cover, and `room`'s come first.
        unsafe { room.advance(to_msg) };
        tail.advance(got - to_msg);
        (got, flags)
    });
    assert_eq!(got, whole.len());
    assert_eq!(flags & libc::MSG_TRUNC, 0);
    assert_eq!(msg, whole[..keep]);
    assert_eq!(tail.filled(), c.len());
    assert_eq!(tail.remaining(), 0);

    // 2. Into a message buffer with room for everything (fresh, unpoisoned
    //    memory: under valgrind, any read of an unwritten byte is reported).
    let mut msg = Vec::with_capacity(whole.len() + 64);
    let got = fill_spare(&mut msg, |room| {
        let mut iov = [RawIoVec::EMPTY; 1];
        let n = room.io_vecs(&mut iov);
        let (got, _) = recvmsg_raw(rx.as_fd_ref(), &mut iov[..n]);
        // SAFETY: the kernel wrote the first `got` bytes of `room`.
        unsafe { room.advance(got) };
        got
    });
    assert_eq!(got, whole.len());
    assert_eq!(msg, whole);
}

/// Over a stream socket with a small send buffer, `sendmsg` sends part of
/// what it is offered; the send loop resumes mid-segment, and the receiver
/// gets every byte exactly once, in order.
#[test]
fn partial_sends_resume_mid_segment() {
    let (tx, rx) = pair(SocketType::STREAM);
    rustix::net::sockopt::set_socket_send_buffer_size(&tx, 4096).expect("SO_SNDBUF");
    let header = pattern(24, 4);
    let chunks: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(300_000 + i * 77_777, 5 + i as u8))
        .collect();
    let mut parts = vec![IoSlice::new(&header)];
    parts.extend(chunks.iter().map(|c| IoSlice::new(c)));
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
    let total = whole.len();

    let receiver = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(total);
        while got.len() < total {
            let n = fill_spare(&mut got, |room| {
                let mut iov = [RawIoVec::EMPTY; 1];
                let n = room.io_vecs(&mut iov);
                let (n, _) = recvmsg_raw(rx.as_fd_ref(), &mut iov[..n]);
                // SAFETY: the kernel wrote the first `n` bytes of `room`.
                unsafe { room.advance(n) };
                n
            });
            assert!(n > 0, "early EOF after {} bytes", got.len());
        }
        got
    });
    let partial = send_all(
        tx.as_fd_ref(),
        IoIter::slices(&parts),
        2,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    );
    let got = receiver.join().expect("receiver");
    assert!(partial > 0, "the small send buffer forced partial sends");
    assert_eq!(got.len(), total);
    assert!(got == whole, "bytes differ");
}

/// `BorrowedFd` from an `OwnedFd`, short.
trait AsFdRef {
    fn as_fd_ref(&self) -> BorrowedFd<'_>;
}

impl AsFdRef for OwnedFd {
    fn as_fd_ref(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}
