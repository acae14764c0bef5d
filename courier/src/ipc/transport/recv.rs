//! The receiving end: how a receive reads its rings and its socket, and the
//! completion of a message whose payload travels elsewhere (what it holds
//! between receives is in [`super::pending`]).
//!
//! # Receiving
//! Each receiver predicts the next message's size from the last one.
//! * Expected small (≤ [`SCATTER_MIN`]): one plain `recv(2)` of the whole
//!   packet into the thread's scratch area, then the payload is copied into
//!   the destination. Plain `recv` is the cheapest read the kernel offers
//!   (`recvmsg` with an iovec and a control buffer costs ~16% more for 64
//!   bytes), and copying a few hundred bytes costs less than the difference.
//! * Expected larger: one `recvmsg` scatters the packet into the header,
//!   then **straight into the destination's spare capacity**, then into the
//!   scratch area, touched only if the message outgrew the prediction.
//! * After a header that announces descriptors, packets are read with a
//!   control buffer until the announced descriptor packets arrive (several,
//!   for more than [`FDS_PER_PACKET`] descriptors, each checked for its
//!   place and count as it comes: see the wire format); messages that
//!   arrive meanwhile wait in order behind the one that is incomplete.
//!
//! Nothing is zero-filled, and a small message never allocates a buffer the
//! size of the socket buffer. The header's total is checked against the
//! receiver's limit before anything is allocated; the rest of a fragmented
//! message is received directly into the final buffer.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::frag::recv_fragments;
use super::pending::{Ready, RecvState, Resume, Waiting, DESCRIPTOR_WAIT, MAX_WAITING};
use super::read::{with_scratch, Read};
use super::ring::Record;
use super::{after, wait_readable, RecvError, Wait};
use crate::ipc::config::Config;
use crate::ipc::err::WireError;
use crate::ipc::platform::{BorrowedFd, Os, OwnedFd, Transport};
use crate::ipc::shm::{Progress, Span, Stream};
use crate::ipc::split::Layout;
use crate::ipc::wire::{
    Body, FdKind, FdPacket, Header, PacketKind, FDS_PER_PACKET, FD_PACKET_LEN, HEADER_LEN,
};

// ===== OsReceiver =====

/// The receiving end of a channel.
#[derive(Debug)]
pub(crate) struct OsReceiver {
    pub(super) fd: OwnedFd,
    /// Payload length of the last message: how large the next is expected
    /// to be, which sizes the buffer.
    pub(super) guess: Cell<usize>,
    /// Payload bytes the last message's data packet carried: how large the
    /// next packet is expected to be, which picks the read path (a region's
    /// message is a bare header, however large its payload).
    pub(super) packet_guess: Cell<usize>,
    pub(super) state: RefCell<RecvState>,
}

/// How long a receive that may not block (`try_recv`, a receiver set's
/// read) waits for the rest of a message whose payload is still arriving
/// (fragments, or a streamed region) before it returns empty-handed and
/// leaves the fetch to the next receive, which goes on where it stopped.
/// A peer that starts a message and never finishes it holds such a
/// receive, and a set's select, this long at a time, not the fragment
/// timeout's 30 s; the message itself still fails at that timeout.
pub(super) const FETCH_SLICE: Duration = Duration::from_millis(1);

/// A byte string to receive into a buffer of its own (see `ipc::split`):
/// where it is predicted to sit in the payload, and the buffer.
pub(crate) struct Split<'a> {
    pub layout: Layout,
    pub string: &'a mut Vec<u8>,
}

/// A predicted byte string is received into its own buffer only if at most
/// this many payload bytes come before it (they pass through the scratch
/// area and are copied).
pub(super) const MAX_SPLIT_HEAD: usize = 4096;

/// What [`OsReceiver::read_beside`] read.
enum Beside {
    /// The record's descriptors, all of them.
    Whole(Vec<OwnedFd>),
    /// Any other packet, for the receive loop, with the payload of a data
    /// packet.
    Other(Read, Vec<u8>),
}

/// The bytes a message that waits for its descriptors keeps: `dst` itself
/// (the usual case: no copy, and the buffer comes back with the message),
/// unless its capacity is far beyond its length; then a copy of its bytes,
/// and `dst` keeps its capacity for the next read.
fn waiting_data(dst: &mut Vec<u8>) -> Result<Vec<u8>, RecvError> {
    if dst.capacity() <= dst.len().max(4096).saturating_mul(2) {
        return Ok(std::mem::take(dst));
    }
    let mut data = Vec::new();
    data.try_reserve_exact(dst.len())
        .map_err(|_| WireError::OutOfMemory {
            requested: dst.len() as u64,
        })?;
    data.extend_from_slice(dst);
    dst.clear();
    Ok(data)
}
/// How long a receive that refused a message with descriptors waits for its
/// descriptor packet (normally sent right after the message).
const REFUSED_WAIT: Duration = Duration::from_millis(5);
/// Messages expected to be at most this large are read with plain `recv(2)`
/// into the thread's scratch area and copied out (cheaper than the
/// `recvmsg` path below this size); larger ones are scattered by `recvmsg`
/// straight into the destination. The same line as the sender's
/// `SMALL`, and for the same reason (see [`Transport::SMALL_MAX`]).
pub(super) const SCATTER_MIN: usize = Os::SMALL_MAX;

impl OsReceiver {
    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        OsReceiver {
            fd,
            guess: Cell::new(0),
            packet_guess: Cell::new(0),
            state: RefCell::new(RecvState::default()),
        }
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        Os::borrow(&self.fd)
    }

    /// When this receiver must be read again even if its socket stays quiet:
    /// now, if a message is complete and not yet handed out; when the oldest
    /// message still waiting for its descriptors expires (a read that finds
    /// the socket dry then reports it); `None` if nothing is held. For a
    /// receiver set, which otherwise waits for its sockets alone.
    pub(crate) fn due(&self) -> Option<Instant> {
        let state = self.state.borrow();
        if !state.rings.is_empty() {
            let blocked = |id| state.waiting.iter().any(|m| m.ring == Some(id));
            // A caller that finds nothing due waits on the socket: the
            // doorbell is armed for it.
            if state.rings.ready(blocked) || state.rings.park(blocked) {
                return Some(Instant::now());
            }
        }
        if let Some(first) = state.ready.front() {
            return Some(match &first.resume {
                // A message whose rest is late: not before a slice has passed.
                Some(r) if r.stalled => r.paused_at + FETCH_SLICE,
                _ => Instant::now(),
            });
        }
        state
            .waiting
            .iter()
            .map(|m| m.since + DESCRIPTOR_WAIT)
            .min()
    }

    /// The payload length of the last message received.
    pub(crate) fn last_len(&self) -> usize {
        self.guess.get()
    }

    /// Receives one message: its payload replaces the contents of `dst` (the
    /// spare capacity of which is used as the receive buffer), and its
    /// channel descriptors are returned in order.
    #[inline]
    pub(crate) fn recv_into(
        &self,
        dst: &mut Vec<u8>,
        wait: Wait,
        limit: u64,
    ) -> Result<Vec<OwnedFd>, RecvError> {
        self.recv_message(dst, None, wait, limit)
            .map(|(fds, _)| fds)
    }

    /// [`recv_into`](Self::recv_into), and with `split`, a message without
    /// channels laid out as predicted has its byte string received into
    /// `split.string` and the rest into `dst` (`true` returned): the
    /// payload is `dst[..at]`, the string, `dst[at..]`.
    pub(crate) fn recv_message(
        &self,
        dst: &mut Vec<u8>,
        mut split: Option<Split<'_>>,
        wait: Wait,
        limit: u64,
    ) -> Result<(Vec<OwnedFd>, bool), RecvError> {
        let mut state = self.state.borrow_mut();
        // The steady state of small messages takes a shorter path; anything
        // else it reads is handed to the loop as the loop's own read.
        let mut first = None;
        // A fiber never blocks its worker in the kernel: it reads without
        // waiting, and waits on its worker's reactor (`wait_readable`).
        let fiber = crate::fiber::in_fiber();
        let rings = !state.rings.is_empty();
        if rings {
            state.rings.begin();
        } else if state.ready.is_empty()
            && state.waiting.is_empty()
            && self.packet_guess.get() <= SCATTER_MIN
        {
            let dontwait = fiber || !matches!(wait, Wait::Block);
            match self.read_plain(&state, dst, limit, dontwait) {
                Ok(()) => return Ok((Vec::new(), false)),
                Err(other) => first = Some(other),
            }
        }
        loop {
            if let Some(ready) = state.ready.pop_front() {
                if ready.header.body == Body::Ring {
                    // A sender's ring: its data packets come through it now.
                    let fd = ready.fds.into_iter().next_back();
                    let fd = fd.ok_or(WireError::BadHeader("carrier missing"))?;
                    state.rings.install(fd, ready.header.tag)?;
                    continue;
                }
                *dst = ready.data;
                let Ready {
                    header,
                    fds,
                    resume,
                    ..
                } = ready;
                return self.finish(&mut state, header, dst, fds, split, resume, wait);
            }
            // Block in the kernel only when nothing waits for descriptors;
            // otherwise read without blocking (a descriptor packet normally
            // follows its message at once) and wait below, with a deadline.
            // (With rings, the socket is read without waiting: a record may
            // come meanwhile. A ring's records come first.)
            let dontwait = fiber
                || !matches!(wait, Wait::Block)
                || !state.waiting.is_empty()
                || !state.rings.is_empty();
            let mut from_ring = None;
            let read = match first.take() {
                Some(read) => read,
                None => match self.read_ring(&mut state, dst, limit) {
                    Ok(Some((read, ring))) => {
                        from_ring = Some(ring);
                        Ok(read)
                    }
                    Ok(None) if rings && matches!(wait, Wait::Block) && !fiber => {
                        // Dry: spin, then park and sleep in the socket's
                        // read itself (a wake-up, or any packet, ends it).
                        match self.before_read(&mut state) {
                            Some(true) => continue,
                            Some(false) => self.read(&state, dst, split.as_mut(), limit, dontwait),
                            None => self.read(&state, dst, split.as_mut(), limit, false),
                        }
                    }
                    Ok(None) => self.read(&state, dst, split.as_mut(), limit, dontwait),
                    Err(e) => Err(e),
                },
            };
            let read = match read {
                // A ring's last records, written before its sender went.
                Err(RecvError::Disconnected)
                    if state.rings.unfence() || state.rings.ready(|_| false) =>
                {
                    continue
                }
                Err(RecvError::Disconnected) if !state.waiting.is_empty() => {
                    // The stream ended before the announced descriptors.
                    state.waiting.clear();
                    return Err(WireError::Truncated.into());
                }
                Err(RecvError::Empty) => {
                    // Only a socket read dry tells that a waiting message's descriptors are
                    // late: a receiver that comes back after a long while may find them queued.
                    if let Some(stale) = state.expire() {
                        return Err(stale.into());
                    }
                    if let Some(stale) = state.rings.expire_orphans() {
                        return Err(stale.into());
                    }
                    // Wake up in time to expire the oldest waiting message,
                    // or at the caller's deadline if that comes first.
                    let expiry = state.next_expiry();
                    let (deadline, own) = match (wait, expiry) {
                        (Wait::Poll, _) => return Err(RecvError::Empty),
                        (Wait::Until(d), Some(e)) if e < d => (e, false),
                        (Wait::Until(d), _) => (d, true),
                        (Wait::Block, Some(e)) => (e, false),
                        // (A read that consumed a packet and had nothing to
                        // return, such as late descriptors dropped quietly.)
                        (Wait::Block, None) => (Instant::now() + DESCRIPTOR_WAIT, false),
                    };
                    if !state.rings.is_empty() && self.wait_rings(&mut state, deadline) {
                        continue;
                    }
                    match wait_readable(self.fd(), deadline) {
                        Err(RecvError::Empty) if !own => continue,
                        other => other?,
                    }
                    continue;
                }
                Err(RecvError::Wire(WireError::TooLarge { claimed, limit }, Some(header))) => {
                    state.refuse(header);
                    // A ring's record: its descriptors may be here already.
                    for o in state.rings.orphans_of(header.tag) {
                        let _ = state.attach(o.packet, o.fds, o.truncated);
                    }
                    match header.body {
                        Body::Fragmented | Body::SharedMemory => {
                            self.drop_refused(&mut state, header.tag, limit)
                        }
                        // Unpin the region for its sender.
                        Body::Kept => state.regions.skip_kept(header.tag),
                        Body::Inline | Body::Ring | Body::Wake => {}
                    }
                    return Err(WireError::TooLarge { claimed, limit }.into());
                }
                other => other?,
            };
            match read {
                Read::Data(header, _) if header.body == Body::Wake => {
                    if header.tag != 0 {
                        state.rings.mark(header.tag);
                    }
                }
                Read::Data(header, split_off) if header.nfds == 0 => {
                    // The steady state: no descriptors, so the payload is inline
                    // or in a region we hold (`Header::decode` wants a carrier
                    // for any other body).
                    if header.body == Body::Kept {
                        let fds = Vec::new();
                        return self.finish(&mut state, header, dst, fds, split, None, wait);
                    }
                    debug_assert_eq!(header.body, Body::Inline);
                    self.guess.set(header.total as usize);
                    self.packet_guess.set(header.total as usize);
                    return Ok((Vec::new(), split_off));
                }
                Read::Data(header, _) => {
                    // A ring's record whose descriptors came in one packet,
                    // sent just after it: the message is whole at once.
                    let alone = from_ring.is_some()
                        && state.waiting.is_empty()
                        && !state.rings.has_orphans()
                        && header.nfds <= FDS_PER_PACKET;
                    let read = match alone {
                        true => Some(self.read_beside(&header, limit)),
                        false => None,
                    };
                    let read = match read {
                        // Its payload came whole in the record: what `finish`
                        // does for an inline body, without its setup.
                        Some(Ok(Beside::Whole(fds))) if header.body == Body::Inline => {
                            self.guess.set(header.total as usize);
                            self.packet_guess.set(header.total as usize);
                            return Ok((fds, false));
                        }
                        Some(Ok(Beside::Whole(fds))) => {
                            return self.finish(&mut state, header, dst, fds, split, None, wait);
                        }
                        Some(Ok(Beside::Other(read, payload))) => Some((read, payload)),
                        Some(Err(RecvError::Empty)) | None => None,
                        Some(Err(e)) => {
                            first = Some(Err(e));
                            None
                        }
                    };
                    // It keeps the bytes of its packet only, at most one
                    // packet's worth, not the capacity of `dst`: a receive
                    // buffer is sized from the last message (up to the size
                    // limit), and each header announcing descriptors that
                    // never come would pin another one.
                    let data = waiting_data(dst)?;
                    state.waiting.push(Waiting {
                        header,
                        data,
                        fds: Vec::new(),
                        since: Instant::now(),
                        ring: from_ring,
                    });
                    if state.waiting.len() > MAX_WAITING {
                        return Err(state.give_up_oldest().into());
                    }
                    if from_ring.is_some() {
                        // Its descriptors may have been read first.
                        for o in state.rings.orphans_of(header.tag) {
                            state.attach(o.packet, o.fds, o.truncated)?;
                        }
                    }
                    // The packet read beside it is the loop's next read.
                    if let Some((read, payload)) = read {
                        *dst = payload;
                        first = Some(Ok(read));
                    }
                }
                Read::Fds(packet, fds, truncated) => state.attach(packet, fds, truncated)?,
                Read::Skip(packet) => {
                    state.skip(packet);
                }
            }
        }
    }

    /// Reads the socket's next packet without waiting, for the ring record
    /// `header` that announces descriptors: usually their one packet, which
    /// its sender wrote right after the record, and then the message is
    /// whole without waiting among the others (`Beside::Whole`).
    #[inline]
    fn read_beside(&self, header: &Header, limit: u64) -> Result<Beside, RecvError> {
        // A data packet's payload lands in `payload` (nothing is allocated
        // for a descriptor packet).
        let mut payload = Vec::new();
        let read = with_scratch(|scratch| self.read_whole(scratch, &mut payload, limit))?;
        Ok(match read {
            Read::Fds(packet, fds, false)
                if packet.tag == header.tag
                    && packet.index == 0
                    && packet.count == header.nfds
                    && fds.len() == header.nfds =>
            {
                Beside::Whole(fds)
            }
            read => Beside::Other(read, payload),
        })
    }

    /// Waits briefly for the descriptor packet of the refused message `tag`
    /// and, if it is the next packet, reads and drops it: that closes our
    /// copy of the message's carrier, so a sender blocked on the rest of a
    /// fragmented message learns at once that it was refused
    /// (`ConnectionAborted`) instead of at this receiver's next read. Any
    /// other next packet is left for the next receive (the refused packet is
    /// then dropped when it comes, as before). A sender that never sends the
    /// packet costs this receive at most [`REFUSED_WAIT`].
    #[cold]
    fn drop_refused(&self, state: &mut RecvState, tag: u64, limit: u64) {
        let deadline = Instant::now() + REFUSED_WAIT;
        let mut next = [MaybeUninit::<u8>::uninit(); FD_PACKET_LEN];
        loop {
            match Os::peek(self.fd(), &mut next) {
                Ok(next) => {
                    let ours = PacketKind::of(next) == Ok(PacketKind::Fds)
                        && FdPacket::decode(next).is_ok_and(|p| p.tag == tag);
                    if ours {
                        // With a control buffer, so that `attach` gets the
                        // descriptors (and hands a region back to its sender)
                        // before it closes them.
                        let mut none = Vec::new();
                        let read = with_scratch(|scratch| {
                            let scratch = &mut scratch[HEADER_LEN..];
                            self.read_scatter(scratch, &mut none, limit, true, true)
                        });
                        if let Ok(Read::Fds(packet, fds, truncated)) = read {
                            let _ = state.attach(packet, fds, truncated);
                        }
                    }
                    return;
                }
                Err(Errno::AGAIN) if wait_readable(self.fd(), deadline).is_ok() => {}
                Err(_) => return,
            }
        }
    }

    /// Completes a message whose descriptors are all here: fetches the part
    /// of the payload carried elsewhere, going on from `resume` if an earlier
    /// receive began it.
    ///
    /// A receive that may not block (`wait` not `Block`) waits for a payload
    /// still arriving until its own deadline, and at least [`FETCH_SLICE`];
    /// then the message goes back to the head of the ready queue with what
    /// came so far, and the receive is `Empty`.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        state: &mut RecvState,
        header: Header,
        dst: &mut Vec<u8>,
        mut fds: Vec<OwnedFd>,
        mut split: Option<Split<'_>>,
        resume: Option<Resume>,
        wait: Wait,
    ) -> Result<(Vec<OwnedFd>, bool), RecvError> {
        let mut split_off = false;
        // `read` checked `total` against the limit and the inline bytes.
        let total = usize::try_from(header.total).map_err(|_| WireError::Truncated)?;
        let timeout = Config::global().fragment_timeout;
        let (deadline, last_got, mut paused, string, stalled) = match resume {
            Some(r) => (
                Some(after(r.budget)),
                Some(r.last_got),
                r.copy,
                r.string,
                r.stalled,
            ),
            None => (None, None, None, None, false),
        };
        // Whether a receive that got nothing ends the message (`Resume::last_got`).
        let given_up = |got: bool, now: Instant| {
            !got && last_got.is_some_and(|last| now.saturating_duration_since(last) >= timeout)
        };
        // When this receive got some of it, or what it was before.
        let last_got = |got: bool, now: Instant, entered: Instant| match got {
            true => now,
            false => last_got.unwrap_or(entered),
        };
        if let Some(copy) = &mut paused {
            // Go on with the string's own buffer if this receive predicts
            // the same string; else put the string back in its place.
            match (string, split.as_mut()) {
                (Some((layout, string)), Some(s)) if s.layout == layout => *s.string = string,
                (Some((layout, string)), _) => {
                    let at = layout.at.min(dst.len());
                    dst.splice(at..at, string);
                    copy.split = false;
                }
                (None, _) => {}
            }
            if !copy.split {
                split = None;
            }
        }
        let deadline = || deadline.unwrap_or_else(|| after(timeout));
        let pause = || match wait {
            Wait::Block => None,
            Wait::Poll => Some(Instant::now() + FETCH_SLICE),
            Wait::Until(d) => Some(d.max(Instant::now() + FETCH_SLICE)),
        };
        // Where a region's payload lies: `skew` bytes in, `total` long, and
        // for a streamed one, how long to wait for it.
        let alive = || self.senders_left();
        let span = |deadline: Option<Instant>| Span {
            skew: usize::from(header.skew),
            total,
            stream: deadline.map(|deadline| Stream {
                deadline,
                pause: pause(),
                spin: !stalled,
                alive: &alive,
            }),
        };
        let mut in_packet = total;
        let progress = match header.body {
            // (Never handed out: `recv_message` takes a ring first.)
            Body::Inline | Body::Ring | Body::Wake => None,
            Body::Fragmented => {
                let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                let deadline = deadline();
                let entered = deadline.checked_sub(timeout).unwrap_or(deadline);
                let before = dst.len();
                if dst.len() < total && !recv_fragments(&carrier, dst, total, deadline, pause())? {
                    let now = Instant::now();
                    let got = dst.len() > before;
                    if given_up(got, now) {
                        return Err(WireError::FragmentTimeout.into());
                    }
                    fds.push(carrier);
                    let resume = Resume {
                        budget: deadline.saturating_duration_since(now),
                        last_got: last_got(got, now, entered),
                        paused_at: now,
                        stalled: !got,
                        copy: None,
                        string: None,
                    };
                    return Err(state.put_back(header, dst, fds, resume));
                }
                None
            }
            Body::SharedMemory | Body::Kept => {
                in_packet = 0;
                // Only a streamed payload is waited for (no clock read for
                // the others, medium messages included).
                let deadline = header.streamed.then(deadline);
                // Reborrowed: a paused copy takes the string back out.
                let reborrow = split.as_mut().map(|s| Split {
                    layout: s.layout,
                    string: &mut *s.string,
                });
                let progress = match (paused, header.body) {
                    (Some(copy), _) => state.regions.resume(copy, span(deadline), dst, reborrow),
                    (None, Body::Kept) => {
                        state
                            .regions
                            .copy_kept(header.tag, span(deadline), dst, reborrow)
                    }
                    (None, _) => {
                        let carrier = fds.pop().ok_or(WireError::BadHeader("carrier missing"))?;
                        // Split only a message without channels (see `ipc::split`).
                        let reborrow = reborrow.filter(|_| fds.is_empty());
                        state
                            .regions
                            .copy_out(carrier, header.tag, span(deadline), dst, reborrow)
                    }
                };
                Some((progress?, deadline))
            }
        };
        match progress {
            Some((Progress::Done(split), ..)) => split_off = split,
            Some((Progress::Paused(copy), deadline)) => {
                // (Only a streamed copy pauses, so there is a deadline.)
                let deadline = deadline.unwrap_or_else(|| after(timeout));
                let entered = deadline.checked_sub(timeout).unwrap_or(deadline);
                let now = Instant::now();
                if given_up(copy.progressed, now) {
                    state.regions.give_up(copy);
                    return Err(WireError::FragmentTimeout.into());
                }
                let string =
                    (split.filter(|_| copy.split)).map(|s| (s.layout, std::mem::take(s.string)));
                let resume = Resume {
                    budget: deadline.saturating_duration_since(now),
                    last_got: last_got(copy.progressed, now, entered),
                    paused_at: now,
                    stalled: !copy.progressed,
                    copy: Some(copy),
                    string,
                };
                return Err(state.put_back(header, dst, fds, resume));
            }
            None => {}
        }
        debug_assert!((0..fds.len()).all(|i| header.kind(i) == FdKind::Channel));
        self.guess.set(total);
        self.packet_guess.set(in_packet);
        Ok((fds, split_off))
    }

    /// The next record of the rings, as the read of a data packet, and its
    /// ring.
    #[inline]
    fn read_ring(
        &self,
        state: &mut RecvState,
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Option<(Read, u32)>, RecvError> {
        if state.rings.is_empty() {
            return Ok(None);
        }
        let RecvState { rings, waiting, .. } = state;
        let blocked = |id| waiting.iter().any(|m| m.ring == Some(id));
        Ok(rings.next(blocked, dst, limit)?.map(|(record, ring)| {
            let header = match record {
                Record::Plain => Header::new(Body::Inline, dst.len(), 0, 0),
                Record::Packet(header) => header,
                // (`Rings::next` keeps a switch to itself; were one to come
                // out, it would be passed over as a wake-up is.)
                Record::Switch => Header::new(Body::Wake, 0, 0, 0),
            };
            (Read::Data(header, false), ring)
        }))
    }

    /// Before a blocking receive reads its socket, the rings being dry:
    /// spins on them, then arms their doorbells. `Some(true)`: a record
    /// came; `Some(false)`: read the socket without waiting (busy-polling,
    /// or a message waits for descriptors, whose expiry needs a deadline);
    /// `None`: armed, block in the read.
    #[cold]
    fn before_read(&self, state: &mut RecvState) -> Option<bool> {
        let busy = Config::busy_poll_now();
        let RecvState { rings, waiting, .. } = state;
        if !waiting.is_empty() {
            // Its descriptors are on the socket already (sent before any
            // later record was written).
            return Some(false);
        }
        let far = Instant::now() + DESCRIPTOR_WAIT;
        if rings.spin(|_| false, far, busy) {
            return Some(true);
        }
        if busy {
            return Some(false);
        }
        match rings.park(|_| false) {
            true => Some(true),
            false => None,
        }
    }

    /// Before a wait on the socket until `deadline`: spins on the rings,
    /// then arms their doorbells. `true` if a record came (read it, no
    /// wait); `false`: wait on the socket, which a writer now rings.
    #[cold]
    fn wait_rings(&self, state: &mut RecvState, deadline: Instant) -> bool {
        let busy = Config::busy_poll_now();
        let RecvState { rings, waiting, .. } = state;
        let blocked = |id| waiting.iter().any(|m| m.ring == Some(id));
        if rings.spin(blocked, deadline, busy) {
            return true;
        }
        // Busy: back to the socket's read, then spin again.
        busy || rings.park(blocked)
    }

    /// Whether any sender is left: the socket has not hung up.
    fn senders_left(&self) -> bool {
        !Os::hung_up(self.fd())
    }
}
