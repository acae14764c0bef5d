//! What a receiver had read off its socket but not handed out, when it is
//! sent to another process.

use std::cell::{Cell, RefCell};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::pending::{Ready, RecvState, Refused, Waiting, MAX_REFUSED, MAX_WAITING};
use super::read::check;
use super::recv::OsReceiver;
use super::RecvError;
use crate::ipc::config::Config;
use crate::ipc::err::WireError;
use crate::ipc::handles::Descriptor;
use crate::ipc::platform::OwnedFd;
use crate::ipc::shm::KeptRegion;
use crate::ipc::wire::{Body, Header, FDS_PER_PACKET, HEADER_LEN, MAX_FDS};

/// What a receiver had read off its socket but not handed out, when it is
/// sent to another process: it travels inside the message that carries the
/// receiver, so that moving a receiver mid-stream loses nothing. Messages
/// still waiting for their descriptor packet keep waiting at the new owner
/// (the packet arrives on the socket, which moved too); completed ones carry
/// their descriptors along, and so do the regions that messages still on
/// the socket may name (`shm`'s kept regions).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Backlog {
    waiting: Vec<Parked>,
    ready: Vec<Parked>,
    refused: Vec<Refused>,
    regions: Vec<ParkedRegion>,
}

/// A held region of a [`Backlog`] (see [`KeptRegion`]).
#[derive(Debug, Serialize, Deserialize)]
struct ParkedRegion {
    token: u64,
    len: u64,
    fd: Descriptor,
}

/// One message of a [`Backlog`], its header in wire form.
#[derive(Debug, Serialize, Deserialize)]
struct Parked {
    #[serde(with = "serde_bytes")]
    header: Vec<u8>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    fds: Vec<Descriptor>,
}

impl Parked {
    fn new(header: Header, data: Vec<u8>, fds: Vec<OwnedFd>) -> Self {
        Parked {
            header: header.encode().to_vec(),
            data,
            fds: fds.into_iter().map(Descriptor).collect(),
        }
    }

    /// The header, checked as if it had just arrived: a backlog is as
    /// untrusted as the socket it came from.
    fn header(&self, limit: u64) -> Result<Header, RecvError> {
        let bytes = <&[u8; HEADER_LEN]>::try_from(self.header.as_slice())
            .map_err(|_| WireError::BadHeader("short packet"))?;
        check(Header::decode(bytes)?, self.data.len(), limit)
    }
}

impl Ready {
    /// This message as it travels with its receiver to another process. One
    /// whose fetch a receive put aside goes as it was before the fetch
    /// began, less what the fetch consumed: fragments with the bytes so far
    /// (the carrier goes along), a region message without them (its region
    /// goes along, by the descriptor kept for this or as a region the
    /// receiver holds, and is copied again).
    fn park(self) -> Option<Parked> {
        let Ready {
            header,
            data,
            mut fds,
            resume,
        } = self;
        let Some(resume) = resume else {
            return Some(Parked::new(header, data, fds));
        };
        match header.body {
            Body::Inline | Body::Fragmented => Some(Parked::new(header, data, fds)),
            // A ring, not yet taken: it is taken at the new owner.
            Body::Kept | Body::Ring => Some(Parked::new(header, Vec::new(), fds)),
            Body::Wake => None,
            Body::SharedMemory => {
                // Always kept for a copy that may pause (`shm::hold`).
                let fd = resume.copy.and_then(|copy| copy.fd);
                debug_assert!(fd.is_some(), "a paused region copy without its descriptor");
                fds.push(fd?);
                Some(Parked::new(header, Vec::new(), fds))
            }
        }
    }
}

impl OsReceiver {
    /// Takes the messages read off the socket but not handed out, to send
    /// them along with this receiver; `None` in the usual case of none.
    pub(crate) fn take_backlog(&self) -> Option<Backlog> {
        let mut state = self.state.borrow_mut();
        let regions = state.regions.take_kept();
        // Each ring goes as the message that announced it, after the
        // messages ready: the new owner takes it on, from where this one
        // read it to (the position is in the ring).
        let rings = state.rings.take_fds().into_iter().map(|(fd, tag)| {
            let header = Header::new(Body::Ring, 0, 0, tag);
            Parked::new(header, Vec::new(), vec![fd])
        });
        let rings: Vec<Parked> = rings.collect();
        if state.waiting.is_empty()
            && state.ready.is_empty()
            && state.refused.is_empty()
            && regions.is_empty()
            && rings.is_empty()
        {
            return None;
        }
        let mut waiting = std::mem::take(&mut state.waiting);
        waiting.sort_by_key(|m| m.since);
        Some(Backlog {
            waiting: waiting
                .into_iter()
                .map(|m| Parked::new(m.header, m.data, m.fds))
                .collect(),
            ready: (state.ready.drain(..).filter_map(Ready::park))
                .chain(rings)
                .collect(),
            refused: state.refused.drain(..).collect(),
            regions: regions
                .into_iter()
                .map(|r| ParkedRegion {
                    token: r.token,
                    len: r.len,
                    fd: Descriptor(r.fd),
                })
                .collect(),
        })
    }

    /// A receiver on `fd` that first delivers `backlog` (see
    /// [`OsReceiver::take_backlog`]), which is checked like anything else
    /// from a peer. The regions it holds are charged to `budget`, what the
    /// message that brought it may still map, and to the process's budget
    /// for held regions.
    pub(crate) fn with_backlog(
        fd: OwnedFd,
        backlog: Backlog,
        budget: &mut u64,
    ) -> Result<Self, WireError> {
        let limit = Config::max_message_size_now();
        let wire = |e: RecvError| match e {
            RecvError::Wire(e, _) => e,
            _ => WireError::BadHeader("bad backlog"),
        };
        if backlog.waiting.len() > MAX_WAITING || backlog.refused.len() > MAX_REFUSED {
            return Err(WireError::BadHeader("backlog too long"));
        }
        let mut state = RecvState::default();
        let now = Instant::now();
        for m in backlog.waiting {
            let header = m.header(limit).map_err(wire)?;
            // Whole descriptor packets only, and not all of them.
            if m.fds.len() >= header.nfds || m.fds.len() % FDS_PER_PACKET != 0 {
                return Err(WireError::BadHeader("backlog: not waiting for descriptors"));
            }
            state.waiting.push(Waiting {
                header,
                data: m.data,
                fds: m.fds.into_iter().map(|d| d.0).collect(),
                since: now,
                // (Its ring, if it came through one, is a new one here.)
                ring: None,
            });
        }
        for m in backlog.ready {
            let header = m.header(limit).map_err(wire)?;
            if header.nfds != m.fds.len() {
                return Err(WireError::UnexpectedFds {
                    announced: header.nfds,
                    received: m.fds.len(),
                });
            }
            state.ready.push_back(Ready {
                header,
                data: m.data,
                fds: m.fds.into_iter().map(|d| d.0).collect(),
                resume: None,
            });
        }
        if backlog.refused.iter().any(|r| r.left > MAX_FDS + 1) {
            return Err(WireError::BadHeader(
                "backlog: too many descriptors to refuse",
            ));
        }
        state.refused.extend(backlog.refused);
        for r in backlog.regions {
            let region = KeptRegion {
                token: r.token,
                len: r.len,
                fd: r.fd.0,
            };
            // A region the process cannot hold, or that fails its checks, is
            // left out: the messages that name it fail alone (`BadRegion`),
            // not the whole receiver. One over the message's budget fails it.
            match state.regions.hold(region, budget) {
                Ok(_) | Err(WireError::BadRegion) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(OsReceiver {
            fd,
            guess: Cell::new(0),
            packet_guess: Cell::new(0),
            state: RefCell::new(state),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use super::*;
    use crate::ipc::platform::{Os, Transport};
    use crate::ipc::transport::channel;
    use crate::ipc::wire::FdPacket;

    /// A receiver moved while a message waits for its descriptor packet:
    /// the new owner completes and delivers it, in order with the rest.
    #[test]
    fn a_moved_receiver_keeps_a_message_waiting_for_its_descriptors() {
        let (tx, rx) = crate::ipc::bytes_channel().unwrap();
        // A message announcing one descriptor, whose descriptor packet is
        // held back (as if its sender were slow), then a plain one.
        let tag = 0x5eed_u64;
        let header = Header::new(Body::Inline, 5, 1, tag).encode();
        let parts = [IoSlice::new(&header), IoSlice::new(b"first")];
        Os::send(tx.os.fd(), &parts, &[]).unwrap();
        tx.send(b"second").unwrap();
        assert_eq!(rx.recv().unwrap(), b"second");
        assert_eq!(rx.os.state.borrow().waiting.len(), 1);

        // With a large byte string, so that the message is walked twice
        // (the backlog is taken on the first walk only).
        type Move = (crate::ipc::IpcBytesReceiver, serde_bytes::ByteBuf);
        let (move_tx, move_rx) = crate::ipc::channel::<Move>().unwrap();
        move_tx.send((rx, vec![7; 8192].into())).unwrap();
        let (moved, bytes) = move_rx.recv().unwrap();
        assert_eq!(bytes.into_vec(), vec![7; 8192]);

        let (spare, _spare_rx) = crate::ipc::bytes_channel().unwrap();
        let packet = FdPacket::first(1, tag).encode();
        Os::send(tx.os.fd(), &[IoSlice::new(&packet)], &[spare.os.fd()]).unwrap();
        tx.send(b"third").unwrap();
        assert_eq!(moved.recv().unwrap(), b"first");
        assert_eq!(moved.recv().unwrap(), b"third");
    }

    /// A backlog is checked like packets from the socket.
    #[test]
    fn a_forged_backlog_is_refused() {
        let (_, rx) = channel().unwrap();
        let forged = Backlog {
            waiting: vec![Parked {
                header: Header::new(Body::Inline, 3, 0, 7).encode().to_vec(),
                data: b"abc".to_vec(),
                fds: Vec::new(),
            }],
            ..Backlog::default()
        };
        assert!(OsReceiver::with_backlog(rx.fd, forged, &mut u64::MAX.clone()).is_err());
        let (_, rx) = channel().unwrap();
        let lying = Backlog {
            ready: vec![Parked {
                header: Header::new(Body::Inline, 9, 1, 7).encode().to_vec(),
                data: b"abc".to_vec(),
                fds: Vec::new(),
            }],
            ..Backlog::default()
        };
        assert!(OsReceiver::with_backlog(rx.fd, lying, &mut u64::MAX.clone()).is_err());
    }
}
