//! `ipc` suite, cases `fds_<n>`: a message carrying `n` descriptors (1, 16,
//! 64, and 253, the most one descriptor packet carries), sent and received
//! by one thread, against the least the kernel does for as many.
//!
//! | subject | one operation |
//! | --- | --- |
//! | `courier` | `IpcSender<Vec<IpcFd>>::send` of a message of `n` descriptors and its `recv`; the descriptors received are the next message's (the message's own closed after the send) |
//! | `floor` | `sendmsg(2)` of an 8-byte packet with `n` descriptors (`SCM_RIGHTS`) on a `SOCK_SEQPACKET` socketpair, `recvmsg(2)`, and the `n` received ones closed (`close(2)` itself, not libc's cancellable wrapper) |
//!
//! The descriptors are `n` opens of `/dev/null`. Both subjects make the same
//! system calls: a `sendmsg` and a `recvmsg` a message (courier's data goes
//! through its shared-memory ring, the descriptors alone on the socket) and
//! `n` closes. An `IpcFd` shares its descriptor with the send by count, so
//! no duplicate is made; the gap to the floor is courier's user-space work
//! (the wire header, decoding, the `Vec<IpcFd>` the message is).

#![allow(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};

use courier::ipc::{self as cr, IpcFd};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

use crate::harness::measure::{Ops, Sampler};
use crate::harness::{Case, Ctx, Error, Result};

/// Descriptor counts measured (253: the most one descriptor packet carries).
const COUNTS: [usize; 4] = [1, 16, 64, 253];

/// Measures every `fds_<n>` case.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    for n in COUNTS {
        let case = Case::new(format!("fds_{n}"));
        if !ctx.wants(&case) {
            continue;
        }
        ctx.status(case.name());
        let files: Vec<OwnedFd> = (0..n)
            .map(|_| std::fs::File::open("/dev/null").map(OwnedFd::from))
            .collect::<std::io::Result<_>>()?;
        let ops = ctx.pick(2_000, 20_000);
        let samples = ctx.samples(10, 30);
        let mut subjects: Vec<Ops<'_, Error>> = vec![courier(&files)?, floor(&files)?];
        let sampled = Sampler::new(samples)
            .warmup(1)
            .ops(ops)
            .interleave(&mut subjects)?;
        drop(subjects);
        for (subject, s) in ["courier", "floor"].into_iter().zip(sampled) {
            ctx.record(&case, subject, "msg_ns", "ns", &s.wall_ns);
        }
    }
    ctx.note(
        "fds_<n>: a message of n descriptors (opens of /dev/null) sent and received by one \
         thread, the received ones closed; floor: sendmsg/recvmsg with SCM_RIGHTS on a \
         socketpair"
            .to_string(),
    );
    Ok(())
}

fn courier(files: &[OwnedFd]) -> Result<Ops<'_, Error>> {
    let (tx, rx) = cr::channel::<Vec<IpcFd>>()?;
    // The message owns what it carries: the descriptors that arrive are the
    // next message's (an application's own, given away with each message),
    // so only what the send itself costs is timed.
    let mut message: Option<Vec<IpcFd>> = Some(
        files
            .iter()
            .map(|f| f.try_clone().map(IpcFd::from))
            .collect::<std::io::Result<_>>()?,
    );
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            tx.send(message.take().expect("a message to send"))?;
            let got = rx.recv()?;
            debug_assert_eq!(got.len(), files.len());
            message = Some(got);
        }
        Ok(())
    }))
}

fn floor(files: &[OwnedFd]) -> Result<Ops<'_, Error>> {
    let (a, b) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let fds: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
    let n = fds.len();
    let mut send_space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(n))];
    let mut recv_space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(n))];
    Ok(Box::new(move |ops| {
        let payload = [7u8; 8];
        let mut buf = [0u8; 8];
        for _ in 0..ops {
            let mut control = SendAncillaryBuffer::new(&mut send_space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            net::sendmsg(
                &a,
                &[IoSlice::new(&payload)],
                &mut control,
                SendFlags::empty(),
            )?;
            let mut control = RecvAncillaryBuffer::new(&mut recv_space);
            net::recvmsg(
                &b,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )?;
            let mut got = 0;
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    for fd in received {
                        close(fd);
                        got += 1;
                    }
                }
            }
            debug_assert_eq!(got, n);
        }
        Ok(())
    }))
}

/// Closes `fd` with the system call itself, as courier does: `OwnedFd`'s
/// drop calls libc's `close`, a cancellation point, which in a process of
/// several threads (this one) adds two locked compare-exchanges a
/// descriptor, no part of the kernel's work.
fn close(fd: OwnedFd) {
    // SAFETY: `fd` is owned and given up here; nothing uses its number after.
    unsafe { rustix::io::close(fd.into_raw_fd()) };
}
