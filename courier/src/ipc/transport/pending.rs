//! What a receiver holds between receives: messages waiting for their
//! descriptors, messages refused after their data packet (whose descriptors
//! are dropped as they come), and messages complete but not yet handed out,
//! with the fetch of a payload that was still arriving when its receive had
//! to return.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::rings::Rings;
use super::RecvError;
use crate::ipc::err::WireError;
use crate::ipc::platform::{Os, OwnedFd, Transport};
use crate::ipc::shm::{self, MapCache, PausedCopy};
use crate::ipc::split::Layout;
use crate::ipc::wire::{FdPacket, Header, FDS_PER_PACKET};

/// A message whose data packet arrived and whose descriptors have not (or
/// not all: the descriptor packets that came so far).
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) header: Header,
    /// The payload bytes of the data packet.
    pub(super) data: Vec<u8>,
    /// The descriptors of the packets that came, in order: always whole
    /// packets, so `fds.len() / FDS_PER_PACKET` is the next packet's index.
    pub(super) fds: Vec<OwnedFd>,
    pub(super) since: Instant,
    /// The ring its data packet came through: the ring's later records
    /// wait for it.
    pub(super) ring: Option<u32>,
}

/// A message refused after its data packet: its descriptor packets are
/// dropped quietly when they come.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Refused {
    pub(super) tag: u64,
    /// Descriptors still to come (the entry goes when none is).
    pub(super) left: usize,
    /// Whether its last descriptor is the message's carrier.
    pub(super) carrier: bool,
}

/// A message complete but not yet handed out.
#[derive(Debug)]
pub(super) struct Ready {
    pub(super) header: Header,
    pub(super) data: Vec<u8>,
    pub(super) fds: Vec<OwnedFd>,
    /// Set if a receive began to fetch the part of the payload carried
    /// elsewhere and returned before it all came (see `OsReceiver::finish`).
    pub(super) resume: Option<Resume>,
}

/// How far the fetch of a message's payload got before its receive had to
/// return: a carrier's fragments (the carrier is back among the message's
/// descriptors, the bytes so far in its data) or a streamed region's copy.
#[derive(Debug)]
pub(super) struct Resume {
    /// What is left of the fragment timeout. It runs only while receives
    /// wait for the rest: a message that came whole while the application
    /// was away is not failed for the time it took to come back, and a peer
    /// that stops or creeps still uses it up, in a set's reads as in a
    /// blocking receive.
    pub(super) budget: Duration,
    /// When a receive last got some of it (or when the receive that began
    /// the fetch began, if none has). A message
    /// put aside fails, however much budget it has left, when a receive that
    /// may not block gets none of it a whole fragment timeout after that: a
    /// stalled message at the head of a rarely polled receiver must not hold
    /// back the messages of the channel's other senders for thousands of
    /// polls, while a sender that is slow but keeps going is never cut off.
    pub(super) last_got: Instant,
    /// When the receive that put it aside returned.
    pub(super) paused_at: Instant,
    /// Whether that receive got no byte of it: a set then reads it again
    /// only after a slice (`OsReceiver::due`), and without spinning first.
    pub(super) stalled: bool,
    /// The region's copy, for a payload in shared memory. If the receiver
    /// moves to another process, the message goes along and is copied there
    /// from the start (the copy so far reads a mapping of this process): a
    /// message that brought the region's descriptor takes it along
    /// (`PausedCopy::fd`), a kept message finds its region among the held
    /// ones that move with the receiver.
    pub(super) copy: Option<PausedCopy>,
    /// The byte string copied so far to a buffer of its own, and where it
    /// sits in the payload (`PausedCopy::split`).
    pub(super) string: Option<(Layout, Vec<u8>)>,
}

/// What a receiver keeps between calls.
#[derive(Debug, Default)]
pub(super) struct RecvState {
    /// Mappings of the regions large payloads arrived in.
    pub(super) regions: MapCache,
    /// Messages whose descriptor packet has not arrived. They never hold up
    /// other messages: per-sender order needs no waiting, because a sender
    /// sends a message's descriptor packet before its next data packet, so
    /// anything that arrives meanwhile comes from another sender.
    pub(super) waiting: Vec<Waiting>,
    /// Messages completed by a descriptor packet, in completion order.
    pub(super) ready: VecDeque<Ready>,
    /// Messages refused after their data packet: their descriptor packets
    /// are dropped quietly when they come.
    pub(super) refused: VecDeque<Refused>,
    /// The senders' shared-memory rings.
    pub(super) rings: Rings,
}

/// Messages a receiver keeps waiting for their descriptors; past this, the
/// oldest is given up (a peer announcing descriptors it never sends cannot
/// make the receiver hold more: each keeps at most one packet's bytes, so
/// 64 of them about 13 MiB with Linux's default socket buffer).
pub(super) const MAX_WAITING: usize = 64;

/// How long a message may wait for its descriptor packet (its sender died
/// between the two sends, or never meant to send it).
pub(crate) const DESCRIPTOR_WAIT: Duration = Duration::from_secs(10);
/// Tags of refused messages remembered.
pub(super) const MAX_REFUSED: usize = 16;

impl RecvState {
    /// Gives the descriptors of `packet` to the waiting message it names,
    /// which is ready once its last packet came. A packet out of place
    /// (index or count not what the header implies), short of descriptors
    /// or truncated by the kernel (`MSG_CTRUNC`, the receiver out of
    /// descriptors) fails its message: the descriptors that came are
    /// closed, and the packets still to come are dropped quietly.
    pub(super) fn attach(
        &mut self,
        packet: FdPacket,
        fds: Vec<OwnedFd>,
        truncated: bool,
    ) -> Result<(), RecvError> {
        let Some(i) = self.waiting.iter().position(|m| m.header.tag == packet.tag) else {
            if !self.rings.is_empty() && !self.refused.iter().any(|r| r.tag == packet.tag) {
                // The message's record may not have been read yet.
                return self
                    .rings
                    .stash(packet, fds, truncated)
                    .map_err(RecvError::from);
            }
            if self.refused.iter().any(|r| r.tag == packet.tag) {
                let last = self.skip(packet);
                // A refused region message's region (its carrier, last) goes
                // back to its sender, which counts it in flight until then.
                if let (Some(true), Some(carrier)) = (last, fds.last()) {
                    shm::release_refused(Os::borrow(carrier));
                }
                return Ok(()); // dropping `fds` closes them
            }
            return Err(match truncated {
                true => WireError::ControlTruncated,
                false => WireError::BadHeader("descriptor packet for no message"),
            }
            .into());
        };
        let m = &mut self.waiting[i];
        let (nfds, have) = (m.header.nfds, m.fds.len());
        // The common case: a message of one packet, whole.
        if !truncated && have == 0 && packet.index == 0 && packet.count == nfds && fds.len() == nfds
        {
            let Waiting { header, data, .. } = self.waiting.swap_remove(i);
            self.ready.push_back(Ready {
                header,
                data,
                fds,
                resume: None,
            });
            return Ok(());
        }
        let expected = FdPacket::expected(nfds, have / FDS_PER_PACKET);
        let fault = if truncated {
            Some(WireError::ControlTruncated)
        } else if packet.index != have / FDS_PER_PACKET {
            Some(WireError::BadHeader("a descriptor packet out of order"))
        } else if fds.len() != expected {
            Some(WireError::UnexpectedFds {
                announced: nfds,
                received: have + fds.len(),
            })
        } else if packet.count != expected {
            Some(WireError::BadHeader(
                "a descriptor packet's count contradicts its message's header",
            ))
        } else {
            None
        };
        if let Some(fault) = fault {
            // The packets after this one are dropped as they come.
            let m = self.waiting.swap_remove(i);
            let left = nfds.saturating_sub(have + packet.count.max(fds.len()));
            self.refuse_rest(m.header, left);
            return Err(fault.into());
        }
        // At most `nfds` (`MAX_FDS + 1`, checked by `Header::decode`), and
        // only what arrived.
        if have + fds.len() < nfds {
            m.fds.extend(fds);
            return Ok(());
        }
        let Waiting {
            header,
            data,
            fds: mut first,
            ..
        } = self.waiting.swap_remove(i);
        // A message of one packet (the common case) keeps its vector.
        let fds = match first.is_empty() {
            true => fds,
            false => {
                first.extend(fds);
                first
            }
        };
        self.ready.push_back(Ready {
            header,
            data,
            fds,
            resume: None,
        });
        Ok(())
    }

    /// Counts the descriptors of `packet`, of a refused message, as come;
    /// `Some(true)` if they were its last and its last is a carrier,
    /// `Some(false)` if they were its last, `None` if more are to come or
    /// the message is not a refused one.
    pub(super) fn skip(&mut self, packet: FdPacket) -> Option<bool> {
        let i = self.refused.iter().position(|r| r.tag == packet.tag)?;
        let r = &mut self.refused[i];
        r.left = r.left.saturating_sub(packet.count);
        if r.left > 0 {
            return None;
        }
        let carrier = r.carrier;
        self.refused.remove(i);
        Some(carrier)
    }

    /// Remembers a refused message so that its descriptors are dropped.
    pub(super) fn refuse(&mut self, header: Header) {
        self.refuse_rest(header, header.nfds);
    }

    /// Remembers a refused message, `left` of whose descriptors are still to
    /// come, so that they are dropped.
    pub(super) fn refuse_rest(&mut self, header: Header, left: usize) {
        if left > 0 {
            if self.refused.len() == MAX_REFUSED {
                self.refused.pop_front();
            }
            self.refused.push_back(Refused {
                tag: header.tag,
                left,
                carrier: header.body.has_carrier(),
            });
        }
    }

    /// Puts a message whose payload is still arriving back at the head of
    /// the ready queue, with what came so far, for the next receive to go on
    /// with; the receive that put it back is `Empty`.
    #[cold]
    pub(super) fn put_back(
        &mut self,
        header: Header,
        dst: &mut Vec<u8>,
        fds: Vec<OwnedFd>,
        resume: Resume,
    ) -> RecvError {
        self.ready.push_front(Ready {
            header,
            data: std::mem::take(dst),
            fds,
            resume: Some(resume),
        });
        RecvError::Empty
    }

    /// Gives up the oldest waiting message.
    pub(super) fn give_up_oldest(&mut self) -> WireError {
        if let Some(i) = (0..self.waiting.len()).min_by_key(|&i| self.waiting[i].since) {
            let m = self.waiting.swap_remove(i);
            self.refuse_rest(m.header, m.header.nfds - m.fds.len());
        }
        WireError::DescriptorsMissing
    }

    /// When the oldest message waiting for its descriptors is given up, if
    /// any waits.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.waiting.iter().map(|m| m.since + DESCRIPTOR_WAIT).min()
    }

    /// Gives up one message that waited too long, if any.
    pub(super) fn expire(&mut self) -> Option<WireError> {
        let i = self
            .waiting
            .iter()
            .position(|m| m.since.elapsed() >= DESCRIPTOR_WAIT)?;
        let m = self.waiting.swap_remove(i);
        self.refuse_rest(m.header, m.header.nfds - m.fds.len());
        Some(WireError::DescriptorsMissing)
    }
}
