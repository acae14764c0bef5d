//! A receiver's rings (see [`super::ring`]): reading them in turn, holding
//! a ring behind its message that waits for descriptors, descriptor
//! packets that come before their record, and waiting: spin, then park.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::pending::DESCRIPTOR_WAIT;
use super::ring::{Reader, Record};
use super::RecvError;
use crate::ipc::err::WireError;
use crate::ipc::platform::{Memory, Os, OwnedFd, Transport};
use crate::ipc::wire::FdPacket;

/// Rings one receiver maps at most (each holds a descriptor and 68 KiB of
/// address space); a sender's ring past this is refused (`BadRing`).
pub(crate) const MAX_RINGS: usize = 1024;
/// Descriptor packets kept for records not yet read. A writer sends a
/// record's descriptor packets before its next record, so a reader that
/// reads the rings before the socket meets few: those of a record written
/// after it looked, one message a ring (up to 17 packets, for 4,096
/// descriptors).
const MAX_ORPHANS: usize = 64;
/// The shortest and longest spin before a receiver parks. The longest is a
/// few cross-CPU wake-ups: past it, parking costs less than the spin.
const SPIN_MIN: Duration = Duration::from_micros(2);
const SPIN_MAX: Duration = Duration::from_micros(50);
/// A busy-polling receiver looks at its socket this often.
const BUSY_SLICE: Duration = Duration::from_micros(20);

/// The rings of one receiver.
#[derive(Debug, Default)]
pub(crate) struct Rings {
    list: Vec<RingIn>,
    next_id: u32,
    /// Where the next look starts, so that one busy ring cannot starve the
    /// others.
    turn: usize,
    /// Descriptor packets whose record was not read yet (a reader reads
    /// the socket and the rings in turn, so it may see a message's
    /// descriptors first).
    orphans: VecDeque<Orphan>,
    /// How long to spin before parking (learned; `0`: not yet).
    spin: Duration,
    /// When the last wait began, while it lasts: how long the next record
    /// took to come teaches the spin.
    waiting_since: Option<Instant>,
}

#[derive(Debug)]
struct RingIn {
    reader: Reader,
    /// The ring's memfd, which moves with the receiver.
    fd: OwnedFd,
    /// Names the ring for the messages of it that wait for descriptors.
    id: u32,
    /// The tag of the message that announced it, which marks its writer's
    /// switch from the socket on the socket.
    tag: u64,
    /// Its writer switched from the socket to the ring: the ring's records
    /// wait for the socket's mark of the switch (see `Writer::answer`).
    fenced: bool,
    /// The mark came first.
    marked: bool,
}

#[derive(Debug)]
pub(super) struct Orphan {
    pub(super) packet: FdPacket,
    pub(super) fds: Vec<OwnedFd>,
    pub(super) truncated: bool,
    since: Instant,
}

impl Rings {
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Maps the ring `fd` a sender announced.
    pub(super) fn install(&mut self, fd: OwnedFd, tag: u64) -> Result<(), WireError> {
        let mut reader = Reader::open(Os::borrow(&fd))?;
        if self.list.len() >= MAX_RINGS {
            // Its writer goes on through the socket: nothing is lost.
            reader.answer(false);
            reader.moved();
            return Err(WireError::BadRing("too many rings"));
        }
        reader.answer(true);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.list.push(RingIn {
            reader,
            fd,
            id,
            tag,
            fenced: false,
            marked: false,
        });
        Ok(())
    }

    /// The next record of a ring that `blocked` does not hold back, into
    /// `dst`, and its ring. A ring found corrupt is dropped (`BadRing`);
    /// one whose writer is gone is dropped once read dry.
    pub(super) fn next(
        &mut self,
        blocked: impl Fn(u32) -> bool,
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Option<(Record, u32)>, RecvError> {
        let n = self.list.len();
        let mut i = 0;
        while i < n.min(self.list.len()) {
            let at = (self.turn + i) % self.list.len();
            let ring = &mut self.list[at];
            i += 1;
            if ring.fenced || blocked(ring.id) {
                continue;
            }
            match ring.reader.next(dst, limit) {
                Ok(Some(Record::Switch)) => {
                    ring.fenced = !ring.marked;
                }
                Ok(Some(record)) => {
                    let id = ring.id;
                    self.turn = at + 1;
                    self.learn();
                    return Ok(Some((record, id)));
                }
                Ok(None) if ring.reader.finished() => {
                    self.list.swap_remove(at);
                }
                Ok(None) => {}
                Err(e @ RecvError::Wire(WireError::BadRing(_), _)) => {
                    self.list.swap_remove(at);
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Whether a ring that `blocked` does not hold back may have a record.
    pub(super) fn ready(&self, blocked: impl Fn(u32) -> bool) -> bool {
        (self.list.iter()).any(|r| !r.fenced && !blocked(r.id) && r.reader.ready())
    }

    /// The socket's mark of a writer's switch to its ring, `tag`: the
    /// ring's records may be read (now, or when the switch is read).
    pub(super) fn mark(&mut self, tag: u64) {
        if let Some(ring) = self.list.iter_mut().find(|r| r.tag == tag) {
            ring.marked = !ring.fenced;
            ring.fenced = false;
        }
    }

    /// The socket ended: no mark will come. `true` if a ring waited for
    /// one.
    pub(super) fn unfence(&mut self) -> bool {
        let mut any = false;
        for ring in &mut self.list {
            any |= std::mem::take(&mut ring.fenced);
        }
        any
    }

    /// Arms every ring's doorbell before the receiver waits on its socket;
    /// `true` (and disarmed) if a record came meanwhile.
    pub(super) fn park(&self, blocked: impl Fn(u32) -> bool) -> bool {
        let mut any = false;
        for ring in &self.list {
            any |= ring.reader.park() && !ring.fenced && !blocked(ring.id);
        }
        if any {
            self.unpark();
        }
        any
    }

    /// A receive begins: disarms the doorbells, and times the wait afresh.
    pub(super) fn begin(&mut self) {
        self.waiting_since = None;
        self.unpark();
    }

    /// Disarms every ring's doorbell.
    pub(super) fn unpark(&self) {
        for ring in &self.list {
            ring.reader.unpark();
        }
    }

    /// Spins until a ring has a record (`true`) or the learned spin, or
    /// `deadline`, passes. Not on a single CPU (the writer cannot run while
    /// we spin), nor in a fiber whose worker has other fibers to run.
    /// With `busy`, spins a slice whatever was learned.
    pub(super) fn spin(
        &mut self,
        blocked: impl Fn(u32) -> bool,
        deadline: Instant,
        busy: bool,
    ) -> bool {
        let start = Instant::now();
        let since = *self.waiting_since.get_or_insert(start);
        if self.spin.is_zero() {
            self.spin = SPIN_MAX;
        }
        let budget = match busy {
            true => BUSY_SLICE,
            false if !self.worth_spinning(&blocked) => return false,
            false => self.spin.saturating_sub(start - since),
        };
        let until = deadline.min(start + budget);
        // Busy on the writers' CPU: they run only when we give way.
        let cpu = Os::current_cpu();
        let give_way = busy && self.list.iter().all(|r| r.reader.writer_here(cpu));
        loop {
            for _ in 0..32 {
                if self.ready(&blocked) {
                    return true;
                }
                std::hint::spin_loop();
            }
            if give_way {
                std::thread::yield_now();
            }
            if Instant::now() >= until {
                if !busy {
                    // Spun for nothing: spin less next time.
                    self.spin = (self.spin / 2).max(SPIN_MIN);
                }
                return false;
            }
        }
    }

    /// Whether a writer may write while we spin: one of them last ran on
    /// another CPU, and we are not a fiber whose worker has other fibers
    /// to run.
    fn worth_spinning(&self, blocked: impl Fn(u32) -> bool) -> bool {
        let cpu = Os::current_cpu();
        crate::chan::context::current_may_spin()
            && self
                .list
                .iter()
                .any(|r| !blocked(r.id) && !r.reader.writer_here(cpu))
    }

    /// A record came: spin next time about twice as long as it took, if it
    /// came within the longest spin.
    fn learn(&mut self) {
        if let Some(since) = self.waiting_since.take() {
            let took = since.elapsed();
            if took <= SPIN_MAX {
                self.spin = (took * 2).clamp(SPIN_MIN, SPIN_MAX);
            }
        }
    }

    /// Keeps a descriptor packet whose message has not been read from its
    /// ring yet; the oldest goes (its descriptors closed) past
    /// [`MAX_ORPHANS`].
    pub(super) fn stash(
        &mut self,
        packet: FdPacket,
        fds: Vec<OwnedFd>,
        truncated: bool,
    ) -> Result<(), WireError> {
        self.orphans.push_back(Orphan {
            packet,
            fds,
            truncated,
            since: Instant::now(),
        });
        if self.orphans.len() > MAX_ORPHANS {
            self.orphans.pop_front();
            return Err(WireError::BadHeader("descriptor packet for no message"));
        }
        Ok(())
    }

    /// Whether any descriptor packet waits for its record.
    #[inline]
    pub(super) fn has_orphans(&self) -> bool {
        !self.orphans.is_empty()
    }

    /// The kept descriptor packets of the message `tag`, in order.
    pub(super) fn orphans_of(&mut self, tag: u64) -> Vec<Orphan> {
        let mut mine = Vec::new();
        let mut i = 0;
        while i < self.orphans.len() {
            match self.orphans[i].packet.tag == tag {
                true => mine.extend(self.orphans.remove(i)),
                false => i += 1,
            }
        }
        mine
    }

    /// Drops the kept descriptor packets no record claimed in time.
    pub(super) fn expire_orphans(&mut self) -> Option<WireError> {
        let before = self.orphans.len();
        self.orphans.retain(|o| o.since.elapsed() < DESCRIPTOR_WAIT);
        (self.orphans.len() < before)
            .then_some(WireError::BadHeader("descriptor packet for no message"))
    }

    /// The rings' memfds and tags, for a receiver that moves to another
    /// process (where each was read to is in the ring itself).
    pub(super) fn take_fds(&mut self) -> Vec<(OwnedFd, u64)> {
        self.orphans.clear();
        let mut fds = Vec::with_capacity(self.list.len());
        for mut ring in self.list.drain(..) {
            ring.reader.moved();
            fds.push((ring.fd, ring.tag));
        }
        fds
    }
}
