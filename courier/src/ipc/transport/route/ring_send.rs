//! A sender's side of its ring (see [`crate::ipc::transport::ring`]): setting
//! it up and announcing it, writing records under its lock (with a message's
//! descriptor packet after its record, in the records' order), the short way
//! of a message that fits a record, and ringing a parked receiver.

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::{
    Fds, OsSender, RingSend, NAP, REPLAN, RING_AFTER, RING_CHECK_EVERY, RING_OFF, RING_ON,
};
use crate::ipc::config::{Config, LargeMessages};
use crate::ipc::platform::{BorrowedFd, Os, Transport};
use crate::ipc::transport::ring::{Answer, Push, Writer};
use crate::ipc::transport::tag::random_tag;
use crate::ipc::transport::SendError;
use crate::ipc::wire::{Body, Header, HEADER_LEN};

impl OsSender {
    /// Whether this sender's data packets go through its ring, setting the
    /// ring up on its [`RING_AFTER`]th send.
    #[inline]
    pub(super) fn ring_ready(&self) -> bool {
        match self.inner.ring_state.load(Ordering::Acquire) {
            RING_ON => true,
            RING_OFF => false,
            _ => self.ring_setup(),
        }
    }

    /// Sets the ring up, if it is time: creates it, then announces it to
    /// the receiver over the socket (a [`Body::Ring`] header, then the
    /// memfd in its descriptor packet), which reads it before any record.
    #[cold]
    fn ring_setup(&self) -> bool {
        let mut ring = self.lock_ring();
        if ring.writer.is_some() {
            return true;
        }
        ring.sends = ring.sends.saturating_add(1);
        if ring.sends < RING_AFTER {
            return false;
        }
        let off = || {
            self.inner.ring_state.store(RING_OFF, Ordering::Relaxed);
            false
        };
        // A ring sends medium messages by region (see `send_routed`), and
        // with `Fragments` none is ever used.
        if Config::large_messages_now() != LargeMessages::SharedMemory {
            return off();
        }
        let Ok((writer, fd)) = Writer::create() else {
            return off();
        };
        let tag = random_tag();
        let header = Header::new(Body::Ring, 0, 0, tag).encode();
        match Os::try_send_small(self.fd(), &header, &[], 0) {
            Ok(_) => {}
            // The socket is full: again on the next send.
            Err(Errno::AGAIN) => return false,
            Err(_) => return off(),
        }
        // Committed: its descriptor packet follows whatever it takes.
        if self.send_fds(&[], Some(Os::borrow(&fd)), tag).is_err() {
            return off();
        }
        ring.writer = Some(writer);
        ring.tag = tag;
        self.inner.ring_state.store(RING_ON, Ordering::Release);
        true
    }

    pub(super) fn lock_ring(&self) -> std::sync::MutexGuard<'_, RingSend> {
        // (A panic while it was held left the ring as it was: whole records.)
        self.inner
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a data packet without waiting, `header` then `parts` (`total`
    /// bytes): through the ring once there is one, else the socket.
    /// `plain`: a message without descriptors, whose record needs no header.
    #[inline]
    pub(in crate::ipc::transport) fn try_data(
        &self,
        header: &[u8; HEADER_LEN],
        parts: &[IoSlice<'_>],
        total: usize,
        plain: bool,
        fds: &Fds<'_>,
    ) -> Result<usize, Errno> {
        if self.inner.ring_state.load(Ordering::Relaxed) == RING_OFF {
            return self.try_socket(header, parts, total);
        }
        let mut ring = self.lock_ring();
        let RingSend {
            writer: slot,
            sends,
            tag,
            marked,
        } = &mut *ring;
        let Some(writer) = slot.as_mut() else {
            return self.try_socket(header, parts, total);
        };
        match writer.answer() {
            Answer::Accepted if *marked => {}
            Answer::Accepted => {
                // The mark of the switch, after every message this ring's
                // sender sent by socket: the receiver reads the ring's
                // records once it has read up to it. Until it goes (a full
                // socket), messages keep to the socket.
                let mark = Header::new(Body::Wake, 0, 0, *tag).encode();
                if Os::try_send_small(self.fd(), &mark, &[], 0).is_err() {
                    return self.try_socket(header, parts, total);
                }
                *marked = true;
                self.inner.ring_live.store(true, Ordering::Relaxed);
            }
            // (Under the lock all the same: see `ring`.)
            Answer::Pending => return self.try_socket(header, parts, total),
            Answer::Refused => {
                *slot = None;
                self.inner.ring_state.store(RING_OFF, Ordering::Relaxed);
                return self.try_socket(header, parts, total);
            }
        }
        if self.counted_hung_up(sends) {
            return Err(Errno::PIPE);
        }
        let pushed = match plain {
            true => writer.push(None, parts, total),
            false => writer.push(Some(header), parts, total),
        };
        if pushed.is_ok() {
            // Under the lock: a ring's descriptor packets follow its
            // records' order, so the receiver, which holds a ring behind a
            // record waiting for its descriptors, finds the descriptors of
            // the records behind it behind them on the socket.
            fds.send_now(self);
        }
        if pushed == Err(Push::Gone) {
            // The receiver that took the ring is gone, but the socket is
            // not (another end, rebuilt from a duplicate of its descriptor,
            // reads it): the socket it is, from now on.
            ring.writer = None;
            self.inner.ring_state.store(RING_OFF, Ordering::Relaxed);
            self.inner.ring_live.store(false, Ordering::Relaxed);
            return self.try_socket(header, parts, total);
        }
        drop(ring);
        match pushed {
            Ok(parked) => {
                if parked {
                    self.ring_bell();
                }
                Ok(HEADER_LEN + total)
            }
            Err(Push::Full) => Err(Errno::AGAIN),
            Err(Push::TooLarge) => Err(REPLAN),
            // (Handled above.)
            Err(Push::Gone) => Err(Errno::PIPE),
            Err(Push::Corrupt) => Err(Errno::PROTO),
        }
    }

    /// Counts a send through the ring; every [`RING_CHECK_EVERY`]th, `true`
    /// if the socket has hung up.
    #[inline]
    fn counted_hung_up(&self, sends: &mut u32) -> bool {
        *sends = sends.wrapping_add(1);
        sends.is_multiple_of(RING_CHECK_EVERY) && Os::hung_up(self.fd())
    }

    /// A message whose payload fits a record, through the ring the
    /// receiver took on, without the general route's setup (its choice of
    /// route, its wait for room): what [`try_data`](Self::try_data) does
    /// for it when the record fits. A message with descriptors writes its
    /// header into the record and sends its descriptor packet under the
    /// ring's lock, as there. `None`: the general route takes it (no ring
    /// in use yet, a full ring, a gone or corrupt one), and finds the ring
    /// as it was.
    #[inline]
    pub(super) fn try_record(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        channels: &[BorrowedFd<'_>],
    ) -> Option<Result<(), SendError>> {
        let mut ring = self.lock_ring();
        let RingSend {
            writer,
            sends,
            marked,
            ..
        } = &mut *ring;
        let writer = writer.as_mut()?;
        if !*marked || writer.answer() != Answer::Accepted {
            return None;
        }
        if self.counted_hung_up(sends) {
            return Some(Err(SendError::Disconnected));
        }
        let (parked, fds) = match channels.is_empty() {
            true => (writer.push(None, parts, total).ok()?, Ok(())),
            false => {
                let tag = random_tag();
                let header = Header::new(Body::Inline, total, channels.len(), tag).encode();
                let parked = writer.push(Some(&header), parts, total).ok()?;
                // Under the lock: see `try_data`.
                (parked, self.send_fds(channels, None, tag))
            }
        };
        drop(ring);
        if parked {
            self.ring_bell();
        }
        Some(fds.map_err(SendError::from))
    }

    /// Wakes a receiver parked on its socket (see `ring`): a [`Body::Wake`]
    /// packet. A full socket needs none (the receiver has packets to read);
    /// a closed one is the next send's to report.
    #[cold]
    pub(super) fn ring_bell(&self) {
        let header = Header::new(Body::Wake, 0, 0, 0).encode();
        let _ = Os::try_send_small(self.fd(), &header, &[], 0);
    }

    /// Waits for room in the ring until `deadline`: `EAGAIN` if none came,
    /// `EPIPE` if the receiver is gone. No readiness announces room (the
    /// receiver makes no system call as it reads), so the writer naps,
    /// longer each time, checking that its socket has not hung up.
    #[cold]
    pub(super) fn wait_ring_room(
        &self,
        deadline: Option<Instant>,
        nap: &mut Duration,
    ) -> Result<(), Errno> {
        if Os::hung_up(self.fd()) {
            return Err(Errno::PIPE);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(Errno::AGAIN);
        }
        let until = now + *nap;
        crate::fiber::sleep_until(deadline.map_or(until, |d| d.min(until)));
        *nap = (*nap * 2).min(NAP);
        Ok(())
    }
}
