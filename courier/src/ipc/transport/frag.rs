//! Fragmentation: a message no packet and no region carries.
//!
//! The first packet carries the header (announcing the total) and the first
//! part; the rest follows over a socketpair created for this message alone,
//! whose receiving end travels in the descriptor packet. Fragments of
//! concurrent senders therefore never interleave (ipc-channel's earlier
//! design re-queued fragments on the shared socket and deadlocked,
//! servo/ipc-channel#34). Fragment payloads are multiples of 8 bytes.
//! `ENOBUFS` (the kernel could not allocate a packet that large) halves the
//! packet size and retries, down to [`MIN_PACKET`], and so does `EMSGSIZE`:
//! packets are sized for this process's default send buffer
//! ([`Transport::max_packet`]), and an end made from a descriptor may have a
//! smaller one.
//!
//! The receiver reads the rest straight into the destination's spare
//! capacity, and measures the fragment timeout itself ([`recv_fragments`]).
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::time::Instant;

use rustix::io::Errno;

use super::route::{Fds, OsSender, IOV_MAX};
use super::tag::random_tag;
use super::{wait_readable, RecvError, SendError, Wait};
use crate::buf::{fill_spare, IoIter, RawIoVec};
use crate::ipc::err::WireError;
use crate::ipc::platform::{BorrowedFd, Os, OwnedFd, Transport};
use crate::ipc::wire::{Body, Header, HEADER_LEN};

/// `ENOBUFS` halving stops here: below it the error is reported.
const MIN_PACKET: usize = 2048;

impl OsSender {
    pub(super) fn send_fragmented(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
        packet: usize,
        wait: Wait,
    ) -> Result<(), SendError> {
        let (carrier_tx, carrier_rx) = Os::pair()?;
        let tag = random_tag();
        let header = Header::new(Body::Fragmented, total, channels.len(), tag).encode();

        let fds = Fds::new(channels, Some(Os::borrow(&carrier_rx)), tag);
        let mut rest = IoIter::slices(parts);
        let mut packet = packet & !7;
        let mut iov = Vec::new();
        // First packet: header + first part, on the channel itself.
        loop {
            iov.clear();
            iov.push(IoSlice::new(&header));
            let len = next_bytes(&rest, (packet - HEADER_LEN) & !7, &mut iov);
            // The descriptor packet (the carrier, at least) follows.
            let ahead = super::route::ahead(HEADER_LEN + len, channels.len() + 1);
            let first = || self.try_data(&header, &iov[1..], len, false, &fds);
            match self.first_packet(wait, ahead, first) {
                Ok(_) => {
                    rest.advance(len);
                    break;
                }
                Err(Errno::NOBUFS | Errno::MSGSIZE) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(e) => return Err(e.into()),
            }
        }
        fds.finish(self)?;
        // The receiver holds its own copy of the carrier now.
        drop(carrier_rx);
        // The rest: on the dedicated socket, blocking until the receiver
        // reads, whatever the caller's wait (the message is committed).
        while rest.remaining() > 0 {
            iov.clear();
            let len = next_bytes(&rest, packet & !7, &mut iov);
            match Os::send(Os::borrow(&carrier_tx), &iov, &[]) {
                Ok(_) => rest.advance(len),
                Err(Errno::NOBUFS | Errno::MSGSIZE) if packet / 2 >= MIN_PACKET => packet /= 2,
                Err(Errno::PIPE | Errno::CONNRESET) => return Err(self.carrier_closed()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The receiver closed a message's carrier before its end: it refused
    /// the message (over its size limit) or gave up on it (its fragments
    /// took longer than the fragment timeout), or it is gone altogether,
    /// which only the last case makes a `Disconnected`.
    #[cold]
    fn carrier_closed(&self) -> SendError {
        // A socket whose peer is closed always polls as hung up.
        match Os::hung_up(self.fd()) {
            true => SendError::Disconnected,
            false => SendError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the receiver gave this message up before its end \
                 (over its size limit, or past its fragment timeout)",
            )),
        }
    }
}

/// Appends iovec entries for the next `max` bytes of `src` (fewer at its
/// end, or when `IOV_MAX` entries are reached) to `iov`, without copying or
/// advancing `src`; returns how many bytes they cover.
fn next_bytes<'a>(src: &IoIter<'a>, max: usize, iov: &mut Vec<IoSlice<'a>>) -> usize {
    let mut walk = src.clone();
    let mut len = 0;
    while len < max && iov.len() < IOV_MAX {
        let chunk = walk.chunk();
        if chunk.is_empty() {
            break;
        }
        let n = chunk.len().min(max - len);
        iov.push(IoSlice::new(&chunk[..n]));
        walk.advance(n);
        len += n;
    }
    len
}

/// Receives the rest of a fragmented message from its dedicated socket,
/// straight into `dst`'s spare capacity, until `dst.len() == total`; `false`
/// if `pause` came first (then `dst` holds what came, to go on with).
///
/// The whole rest must arrive by `deadline` (what is left of the fragment
/// timeout), as this receiver measures it (`poll` with a deadline,
/// `MSG_DONTWAIT` reads): a socket option such as `SO_RCVTIMEO` would not
/// do, since the sender holds the same socket and could clear it.
pub(super) fn recv_fragments(
    carrier: &OwnedFd,
    dst: &mut Vec<u8>,
    total: usize,
    deadline: Instant,
    pause: Option<Instant>,
) -> Result<bool, RecvError> {
    let more = total - dst.len();
    dst.try_reserve_exact(more)
        .map_err(|_| WireError::OutOfMemory {
            requested: more as u64,
        })?;
    let until = pause.map_or(deadline, |p| p.min(deadline));
    while dst.len() < total {
        let want = total - dst.len();
        let packet = fill_spare(dst, |room| {
            let mut iov = [RawIoVec::EMPTY; 1];
            let n = room.io_vecs(&mut iov);
            let packet = Os::recv(Os::borrow(carrier), &mut iov[..n], false, true)?;
            // SAFETY: `recvmsg` wrote `packet.len` bytes at the start of the
            // room (at most its length).
            unsafe { room.advance(packet.len.min(room.remaining())) };
            Ok::<_, Errno>(packet)
        });
        let packet = match packet {
            Ok(packet) => packet,
            Err(Errno::AGAIN) => {
                match wait_readable(Os::borrow(carrier), until) {
                    Err(RecvError::Empty) if until < deadline => return Ok(false),
                    Err(RecvError::Empty) => return Err(WireError::FragmentTimeout.into()),
                    other => other?,
                }
                continue;
            }
            // The carrier failed (a peer may pass any socket as one, even one that resets):
            // the message cannot be completed, but the channel itself is not disconnected.
            Err(_) => return Err(WireError::Truncated.into()),
        };
        if packet.len == 0 || packet.truncated || packet.len > want {
            // The stream ended early, or overran the total.
            return Err(WireError::Truncated.into());
        }
        // Checked on every packet, not only when the carrier runs dry: a
        // peer that keeps it full of one-byte packets must not stretch the
        // message past the timeout, nor a receive past its pause (a clock
        // read against a `recvmsg`).
        if dst.len() < total {
            let now = Instant::now();
            if now >= deadline {
                return Err(WireError::FragmentTimeout.into());
            }
            if pause.is_some_and(|pause| now >= pause) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
