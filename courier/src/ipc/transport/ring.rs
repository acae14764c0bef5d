//! The shared-memory ring: a sender's small messages, written into memory
//! its receiver maps, with no system call while the receiver is awake.
//!
//! # Layout
//! One sealed memfd of [`LEN`] bytes per sending end (an `OsSender` and its
//! clones in one process; a sender sent to another process sets up its own
//! there), created by the sender on its second send and passed to the
//! receiver in a [`Body::Ring`] message. Both map it whole:
//!
//! ```text
//!  0        8          64     128    192      4096                    4096 + DATA_LEN
//!  +--------+----------+------+------+--------+ ... +---------------------------+
//!  | MAGIC  | DATA_LEN | head | tail | parked |     | records                   |
//!  +--------+----------+------+------+--------+ ... +---------------------------+
//!   u64      u64        u64    u64    u32            8-byte aligned, never wrapping
//! ```
//!
//! `head` and `tail` count bytes from the start, never wrapping (a `u64`
//! does not run out): the writer owns `head`, the reader `tail`, each on a
//! cache line of its own. A record is a `u64` word (`kind << 32 | len`),
//! then `len` bytes, padded to 8:
//! * [`PLAIN`]: the payload of a message without descriptors;
//! * [`PACKET`]: a data packet as the socket would carry it (the wire
//!   header, then the inline payload): a message with descriptors (which
//!   follow on the socket, as ever), or the header of a region or
//!   fragmented message;
//! * [`PAD`]: filler to the end of the area (a record never wraps).
//!
//! # Order
//! Once a sender has a ring, **every** data packet it sends goes through
//! it; only descriptor packets (and the wake-up below) use the socket. A
//! sender's messages therefore reach the receiver in one sequence, whatever
//! their route: a payload too large for a record goes by region or
//! fragments with only its header in the ring. The receiver reads a record
//! that announces descriptors as it would the data packet, and holds the
//! ring's later records until the descriptors come (they were sent before
//! any later record was written, so they are already on the socket).
//!
//! # Waking
//! The socket is the doorbell. A receiver that finds every ring empty
//! spins for a while it learns (how long messages took to come), then sets
//! `parked` in each ring, looks once more, and waits on its socket as
//! before, in the kernel, a receiver set's `epoll`, a fiber's reactor or an
//! async task's: so every way to wait works unchanged, and a sender's death
//! still wakes it (the socket hangs up). A writer stores `head`, then reads
//! `parked` (both sequentially consistent: the store-load pair of
//! Dekker's protocol, against the reader's store to `parked` and load of
//! `head`); only if it was set does it clear it and send a
//! [`Body::Wake`] packet: one system call per sleep, none while the
//! receiver keeps up.
//!
//! # An untrusted peer
//! Either side may be hostile and may rewrite any byte of the ring at any
//! time. Each side keeps its own index privately and reads the other's once
//! per use, checking it against its own (`tail <= head <= tail + DATA_LEN`,
//! both aligned), and a record's word once, checking its kind and length
//! against the bytes published and the end of the area. Bytes are copied
//! out raw, never through a reference, and decoded from the copy. A check
//! that fails is [`WireError::BadRing`] for the reader (the ring is
//! dropped, the channel goes on) and an error for the writer's send; never
//! a panic, a read out of bounds or a wait that a peer can make endless.
//!
//! [`Body::Ring`]: crate::ipc::wire::Body::Ring
//! [`Body::Wake`]: crate::ipc::wire::Body::Wake
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::io::Errno;

use super::read::check;
use super::RecvError;
use crate::ipc::err::WireError;
use crate::ipc::platform::{BorrowedFd, Mapping, Memory, Os, OwnedFd, RegionMap, Transport};
use crate::ipc::wire::{Header, HEADER_LEN};

/// Bytes of the ring's record area.
pub(crate) const DATA_LEN: usize = 64 << 10;
/// The largest record (its 8-byte word included).
pub(crate) const RECORD_MAX: usize = 8 << 10;
/// The largest message that travels through the ring (room for a record's
/// word and a wire header besides).
pub(crate) const PAYLOAD_MAX: usize = RECORD_MAX - 8 - HEADER_LEN;
/// The size of a ring's memfd.
pub(crate) const LEN: usize = DATA_AT + DATA_LEN;
/// The memfd's name, as `/proc/<pid>/fd` shows it (`memfd:courier-ring`).
pub(crate) const NAME: &str = "courier-ring";

/// "courier ring, version 1".
const MAGIC: u64 = u64::from_le_bytes(*b"cring\0\0\x01");
const HEAD_AT: usize = 64;
/// The CPU the writer last wrote from (plus one; 0: not known), beside
/// `head`, which it writes anyway: a reader on the same CPU does not spin.
const WRITER_CPU_AT: usize = 72;
const TAIL_AT: usize = 128;
const PARKED_AT: usize = 192;
const CLOSED_AT: usize = 196;
const READER_GONE_AT: usize = 200;
/// The reader's answer to the announcement: [`ACCEPTED`] or [`REFUSED`]
/// (0 until it reads it).
const ANSWER_AT: usize = 204;
const ACCEPTED: u32 = 1;
const REFUSED: u32 = 2;
const DATA_AT: usize = 4096;

/// The payload of a message without descriptors.
const PLAIN: u64 = 1;
/// A wire data packet: header, then inline payload.
const PACKET: u64 = 2;
/// Filler to the end of the area.
const PAD: u64 = 3;
/// The writer's first record: its messages came by socket until here (see
/// `Writer::accepted`).
const SWITCH: u64 = 4;

/// A ring's mapping, and its shared words.
struct Shared {
    map: Mapping,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("len", &self.map.len())
            .finish()
    }
}

impl Shared {
    /// The `u64` word at `at`, shared with the peer.
    fn u64_at(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(8) && at + 8 <= self.map.len());
        // SAFETY: the mapping (`LEN` bytes, page-aligned) lives as long as `self`; `at` is
        // 8-aligned and in bounds (below `DATA_AT`, or a record offset checked against `DATA_LEN`);
        // shared memory is only accessed through atomics or raw copies: an atomic may alias it.
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU64>() }
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at.is_multiple_of(4) && at + 4 <= DATA_AT);
        // SAFETY: as `u64_at`, for a 4-aligned word below `DATA_AT`.
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU32>() }
    }

    fn head(&self) -> &AtomicU64 {
        self.u64_at(HEAD_AT)
    }

    fn tail(&self) -> &AtomicU64 {
        self.u64_at(TAIL_AT)
    }

    fn writer_cpu(&self) -> &AtomicU32 {
        self.u32_at(WRITER_CPU_AT)
    }

    fn parked(&self) -> &AtomicU32 {
        self.u32_at(PARKED_AT)
    }

    fn closed(&self) -> &AtomicU32 {
        self.u32_at(CLOSED_AT)
    }

    fn reader_gone(&self) -> &AtomicU32 {
        self.u32_at(READER_GONE_AT)
    }

    fn answer(&self) -> &AtomicU32 {
        self.u32_at(ANSWER_AT)
    }

    /// The record area's byte `offset` (`offset <= DATA_LEN`: an empty
    /// record's bytes start at the area's end when its word is the last).
    fn data(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= DATA_LEN);
        // SAFETY: `DATA_AT + offset <= LEN`: inside the mapping or one past
        // its end, which a pointer may point to (and nothing is read there).
        unsafe { self.map.as_ptr().add(DATA_AT + offset) }
    }
}

/// Whether `head` may follow `tail`: at most a full area ahead, aligned.
fn sane(tail: u64, head: u64) -> bool {
    head >= tail && head - tail <= DATA_LEN as u64 && (head | tail).is_multiple_of(8)
}

// ===== Writer =====

/// Why a record was not written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Push {
    /// No room until the receiver reads more.
    Full,
    /// The record is larger than [`RECORD_MAX`].
    TooLarge,
    /// The receiver's index is out of bounds: the ring is unusable.
    Corrupt,
    /// The receiver is gone (it said so as it went).
    Gone,
}

/// The sending end of a ring.
#[derive(Debug)]
pub(crate) struct Writer {
    shared: Shared,
    /// Where the next record goes (ours alone; the shared copy is only
    /// ever written).
    head: u64,
    /// The receiver's `tail` when last read: room is at least
    /// `DATA_LEN - (head - tail)`.
    tail: u64,
    /// Records written: every [`CPU_EVERY`]th says where the writer runs.
    written: u32,
    /// Whether the reader took the ring on (see [`Writer::answer`]).
    accepted: bool,
}

/// What the reader said of a ring, so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing yet: keep to the socket.
    Pending,
    /// Taken on: the [`SWITCH`] record is written; records from the
    /// socket's mark of the switch on (the caller sends it).
    Accepted,
    /// Refused (it has too many): the socket, for good.
    Refused,
}

/// How often a writer tells its reader which CPU it runs on (a process
/// moves between CPUs rarely; asking costs a few nanoseconds).
const CPU_EVERY: u32 = 64;

impl Writer {
    /// A new ring, and its memfd to send to the receiver.
    pub(crate) fn create() -> Result<(Writer, OwnedFd), Errno> {
        let fd = Os::create_region(NAME, LEN)?;
        // Pages reserved now: a full tmpfs fails here, not later with
        // `SIGBUS` on a write into the mapping.
        Os::allocate(Os::borrow(&fd), LEN)?;
        let map = Os::map(Os::borrow(&fd), LEN)?;
        Os::seal(Os::borrow(&fd))?;
        let shared = Shared { map };
        shared.u64_at(0).store(MAGIC, Ordering::Relaxed);
        shared.u64_at(8).store(DATA_LEN as u64, Ordering::Relaxed);
        let writer = Writer {
            shared,
            head: 0,
            tail: 0,
            written: 0,
            accepted: false,
        };
        Ok((writer, fd))
    }

    /// Whether the reader took the ring on. Until it has, the writer sends
    /// through its socket, so that a ring the reader cannot take (too many,
    /// or one it cannot map) loses nothing. Once it has, the first record
    /// is a [`SWITCH`], and the caller marks the switch on the socket: the
    /// reader reads its socket up to the mark before the ring's next
    /// records, and so gets the messages sent before the switch first.
    pub(crate) fn answer(&mut self) -> Answer {
        if self.accepted {
            return Answer::Accepted;
        }
        // SYNC POINT: the reader's `Release` store of its answer.
        match self.shared.answer().load(Ordering::Acquire) {
            ACCEPTED => {}
            0 => return Answer::Pending,
            _ => return Answer::Refused,
        }
        match self.record(SWITCH, None, &[], 0) {
            Ok(_) => {
                self.accepted = true;
                Answer::Accepted
            }
            // (A ring with no room before its first record is a reader's
            // forgery: the socket it is.)
            Err(_) => Answer::Refused,
        }
    }

    /// Writes one record: `header` (if any) then `parts`, `total` bytes of
    /// them. `Ok(true)` if the receiver was parked: the caller rings it.
    pub(crate) fn push(
        &mut self,
        header: Option<&[u8; HEADER_LEN]>,
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<bool, Push> {
        let kind = if header.is_some() { PACKET } else { PLAIN };
        self.record(kind, header, parts, total)
    }

    fn record(
        &mut self,
        kind: u64,
        header: Option<&[u8; HEADER_LEN]>,
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<bool, Push> {
        // (Same cache line as `parked`, read below anyway.)
        if self.shared.reader_gone().load(Ordering::Relaxed) != 0 {
            return Err(Push::Gone);
        }
        let head_len = header.map_or(0, |h| h.len());
        let len = head_len + total;
        if len > RECORD_MAX - 8 {
            return Err(Push::TooLarge);
        }
        let need = 8 + len.next_multiple_of(8);
        let offset = (self.head % DATA_LEN as u64) as usize;
        let pad = match offset + need > DATA_LEN {
            true => DATA_LEN - offset,
            false => 0,
        };
        if self.head + (pad + need) as u64 - self.tail > DATA_LEN as u64 {
            // SYNC POINT: the reader's `Release` store of `tail` after it
            // copied the records below it out: their bytes may be reused.
            let tail = self.shared.tail().load(Ordering::Acquire);
            if !sane(tail, self.head) {
                return Err(Push::Corrupt);
            }
            self.tail = tail;
            if self.head + (pad + need) as u64 - tail > DATA_LEN as u64 {
                return Err(Push::Full);
            }
        }
        let mut at = offset;
        if pad > 0 {
            let word = (PAD << 32) | (pad - 8) as u64;
            self.shared
                .u64_at(DATA_AT + at)
                .store(word, Ordering::Relaxed);
            at = 0;
        }
        let mut dst = self.shared.data(at + 8);
        let mut copy = |bytes: &[u8]| {
            // SAFETY: the record's `len` bytes lie within `[at + 8, at + need)`, inside the area
            // (`at + need <= DATA_LEN`), in room the reader gave back (`tail` above); the reader
            // copies them raw only after `head` publishes them.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
                dst = dst.add(bytes.len());
            }
        };
        if let Some(header) = header {
            copy(header);
        }
        for part in parts {
            copy(part);
        }
        if self.written.is_multiple_of(CPU_EVERY) {
            let cpu = Os::current_cpu().map_or(0, |cpu| cpu.wrapping_add(1));
            self.shared.writer_cpu().store(cpu, Ordering::Relaxed);
        }
        self.written = self.written.wrapping_add(1);
        self.shared
            .u64_at(DATA_AT + at)
            .store((kind << 32) | len as u64, Ordering::Relaxed);
        self.head += (pad + need) as u64;
        // SYNC POINT: the reader's `Acquire` load of `head` (the record is
        // written); `SeqCst` with the load of `parked` below, against the
        // reader's `park` (store `parked`, then load `head`): one of the
        // two sees the other's store.
        self.shared.head().store(self.head, Ordering::SeqCst);
        let parked = self.shared.parked();
        Ok(parked.load(Ordering::SeqCst) != 0 && parked.swap(0, Ordering::SeqCst) != 0)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The reader drops the ring once it has read it dry. (A writer
        // that dies without this leaves the ring mapped until the receiver
        // goes; see `docs/ring.md`.)
        self.shared.closed().store(1, Ordering::Release);
    }
}

// ===== Reader =====

/// What the next record held.
#[derive(Debug)]
pub(crate) enum Record {
    /// A message without descriptors; its payload is in the destination.
    Plain,
    /// A data packet, checked against the limit; its inline payload is in
    /// the destination.
    Packet(Header),
    /// The writer's messages came by socket until here: read the socket
    /// up to the mark of the switch before this ring's next records.
    Switch,
}

/// The receiving end of a ring.
#[derive(Debug)]
pub(crate) struct Reader {
    shared: Shared,
    /// Where the next record starts (ours alone).
    tail: u64,
    /// The writer's `head` when last read (checked then): records up to it
    /// are read without touching its cache line again.
    head: u64,
    /// Moved to another process with its receiver: dropping this copy
    /// does not tell the writer the reader is gone.
    moved: bool,
}

impl Reader {
    /// Maps the ring `fd` a sender announced, after checking that it is
    /// one: sealed shared memory of exactly [`LEN`] bytes, with the magic.
    pub(crate) fn open(fd: BorrowedFd<'_>) -> Result<Reader, WireError> {
        // Seals first, then the size (see `MapCache::copy_out`).
        if !Os::sealed(fd).unwrap_or(false) {
            return Err(WireError::BadRing("not sealed shared memory"));
        }
        match Os::stat(fd) {
            Ok((size, _)) if size == LEN as u64 => {}
            _ => return Err(WireError::BadRing("not the size of a ring")),
        }
        if !matches!(Os::on_hugetlbfs(fd), Ok(false)) {
            return Err(WireError::BadRing("not shared memory"));
        }
        let map = Os::map(fd, LEN).map_err(|_| WireError::BadRing("not mappable"))?;
        let shared = Shared { map };
        if shared.u64_at(0).load(Ordering::Relaxed) != MAGIC
            || shared.u64_at(8).load(Ordering::Relaxed) != DATA_LEN as u64
        {
            return Err(WireError::BadRing("not a ring of this version"));
        }
        // A ring that moved with its receiver goes on where it was read to.
        let tail = shared.tail().load(Ordering::Acquire);
        if !tail.is_multiple_of(8) {
            return Err(WireError::BadRing("index out of bounds"));
        }
        Ok(Reader {
            shared,
            tail,
            head: tail,
            moved: false,
        })
    }

    /// Whether a record may be there (a peer can make this lie; `next`
    /// checks).
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        // SYNC POINT: the writer's store of `head` (see `next`).
        self.shared.head().load(Ordering::Acquire) != self.tail
    }

    /// Whether the writer last wrote from the CPU this thread runs on
    /// (then spinning would only keep it from writing).
    pub(crate) fn writer_here(&self, cpu: Option<u32>) -> bool {
        let writer = self.shared.writer_cpu().load(Ordering::Relaxed);
        cpu.is_some_and(|cpu| writer == cpu.wrapping_add(1))
    }

    /// Whether the writer is gone and every record read.
    pub(crate) fn finished(&self) -> bool {
        self.shared.closed().load(Ordering::Acquire) != 0 && !self.ready()
    }

    /// Reads the next record into `dst` (its contents replaced): `None` if
    /// there is none. A record over `limit` is skipped and refused
    /// (`TooLarge`, with its header if it has one); a corrupt ring is
    /// `BadRing`, and the ring must be dropped.
    pub(crate) fn next(
        &mut self,
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Option<Record>, RecvError> {
        // A writer pads only to reach the area's start, so never twice in
        // a row: a peer that publishes padding for ever cannot keep us here.
        let mut padded = false;
        loop {
            if self.head == self.tail {
                // SYNC POINT: the writer's `SeqCst` store of `head`, after
                // the records below it were written.
                let head = self.shared.head().load(Ordering::Acquire);
                if head == self.tail {
                    return Ok(None);
                }
                if !sane(self.tail, head) {
                    return Err(WireError::BadRing("index out of bounds").into());
                }
                self.head = head;
            }
            let head = self.head;
            let offset = (self.tail % DATA_LEN as u64) as usize;
            let word = self.shared.u64_at(DATA_AT + offset).load(Ordering::Relaxed);
            let (kind, len) = (word >> 32, (word & 0xFFFF_FFFF) as usize);
            // The record within the area, and within what was published.
            let room = DATA_LEN - offset;
            let need = 8 + len.next_multiple_of(8);
            if need > room || need as u64 > head - self.tail || len > RECORD_MAX - 8 {
                return Err(WireError::BadRing("record out of bounds").into());
            }
            let start = self.tail;
            let skip = |reader: &mut Self| {
                reader.tail = start + need as u64;
                // SYNC POINT: the writer's `Acquire` load of `tail` before
                // it reuses the bytes we are done with.
                reader.shared.tail().store(reader.tail, Ordering::Release);
            };
            match kind {
                PAD if need == room && !padded => {
                    padded = true;
                    skip(self);
                }
                PAD => return Err(WireError::BadRing("padding out of place").into()),
                PLAIN => {
                    if len as u64 > limit {
                        skip(self);
                        return Err(RecvError::Wire(
                            WireError::TooLarge {
                                claimed: len as u64,
                                limit,
                            },
                            None,
                        ));
                    }
                    self.copy_out(offset + 8, len, dst);
                    skip(self);
                    return Ok(Some(Record::Plain));
                }
                PACKET if len >= HEADER_LEN => {
                    let mut bytes = [0u8; HEADER_LEN];
                    // SAFETY: `HEADER_LEN <= len` bytes at `offset + 8`
                    // lie within the record, inside the area (checked
                    // above); copied raw, decoded from our copy.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.shared.data(offset + 8),
                            bytes.as_mut_ptr(),
                            HEADER_LEN,
                        );
                    }
                    let inline = len - HEADER_LEN;
                    let header = Header::decode(&bytes)
                        .map_err(RecvError::from)
                        .and_then(|h| check(h, inline, limit));
                    let header = match header {
                        Ok(header) => header,
                        Err(e) => {
                            skip(self);
                            return Err(e);
                        }
                    };
                    self.copy_out(offset + 8 + HEADER_LEN, inline, dst);
                    skip(self);
                    return Ok(Some(Record::Packet(header)));
                }
                SWITCH if len == 0 => {
                    skip(self);
                    return Ok(Some(Record::Switch));
                }
                _ => return Err(WireError::BadRing("unknown record").into()),
            }
        }
    }

    /// Copies `len` bytes of the area from `offset` into `dst`, replacing
    /// its contents (`offset + len <= DATA_LEN`, checked by the caller).
    fn copy_out(&self, offset: usize, len: usize, dst: &mut Vec<u8>) {
        dst.clear();
        dst.reserve(len);
        // SAFETY: the source is `len` bytes inside the area (the caller checked), copied raw (no
        // reference into the mapping, which the writer may rewrite); `dst` has room for `len`
        // (reserved above), all of which the copy initialises before `set_len`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.shared.data(offset), dst.as_mut_ptr(), len);
            dst.set_len(len);
        }
    }

    /// Arms the doorbell: a writer that writes from now on rings the
    /// socket. `true` if a record came meanwhile (then disarm and read).
    pub(crate) fn park(&self) -> bool {
        self.shared.parked().store(1, Ordering::SeqCst);
        // SYNC POINT: against the writer's `SeqCst` store of `head` and
        // load of `parked` (see `Writer::push`).
        self.shared.head().load(Ordering::SeqCst) != self.tail
    }

    /// Disarms the doorbell (a load only, when it is not armed).
    #[inline]
    pub(crate) fn unpark(&self) {
        let parked = self.shared.parked();
        if parked.load(Ordering::Relaxed) != 0 {
            parked.store(0, Ordering::Relaxed);
        }
    }

    /// Tells the writer the ring is taken on (`true`) or refused.
    pub(crate) fn answer(&self, accept: bool) {
        let answer = if accept { ACCEPTED } else { REFUSED };
        // SYNC POINT: the writer's `Acquire` load in `Writer::answer`.
        self.shared.answer().store(answer, Ordering::Release);
    }

    /// This copy of the ring goes away because its receiver moves to
    /// another process, which maps the ring afresh.
    pub(crate) fn moved(&mut self) {
        self.moved = true;
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if !self.moved {
            // A writer's sends fail from now on, as they would on the
            // socket. (A reader that dies without this is seen by the
            // writer when the ring fills: its socket has hung up.)
            self.shared.reader_gone().store(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::ipc::wire::Body;

    fn pair() -> (Writer, Reader, OwnedFd) {
        let (writer, fd) = Writer::create().unwrap();
        let reader = Reader::open(Os::borrow(&fd)).unwrap();
        (writer, reader, fd)
    }

    fn bytes(n: usize, seed: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + seed * 7) as u8).collect()
    }

    /// Records of every size come back whole and in order, plain and with a
    /// header, across many wraps of the area; a full ring says so.
    #[test]
    fn records_come_back_in_order_across_wraps() {
        let (mut writer, mut reader, _fd) = pair();
        let mut dst = Vec::new();
        let sizes = [0, 1, 7, 8, 64, 1000, 4095, PAYLOAD_MAX];
        for round in 0..200 {
            let n = sizes[round % sizes.len()];
            let payload = bytes(n, round);
            let packet = round % 3 == 0;
            let header = Header::new(Body::Inline, n, 1, round as u64).encode();
            let parts = [IoSlice::new(&payload)];
            let header = packet.then_some(&header);
            assert_eq!(writer.push(header, &parts, n), Ok(false));
            match reader.next(&mut dst, u64::MAX).unwrap() {
                Some(Record::Plain) => assert!(!packet),
                Some(Record::Packet(h)) => {
                    assert!(packet);
                    assert_eq!((h.tag, h.nfds), (round as u64, 1));
                }
                other => panic!("record {round}: {other:?}"),
            }
            assert_eq!(dst, payload, "record {round}");
        }
        assert!(reader.next(&mut dst, u64::MAX).unwrap().is_none());
        // Full, then room again once read.
        let payload = bytes(1000, 0);
        let parts = [IoSlice::new(&payload)];
        let mut written = 0;
        while writer.push(None, &parts, 1000) == Ok(false) {
            written += 1;
        }
        assert_eq!(writer.push(None, &parts, 1000), Err(Push::Full));
        assert!(written >= DATA_LEN / 1016 - 1, "{written} records fit");
        assert!(reader.next(&mut dst, u64::MAX).unwrap().is_some());
        assert!(writer.push(None, &parts, 1000).is_ok());
        let too_large = vec![0; RECORD_MAX];
        assert_eq!(
            writer.push(None, &[IoSlice::new(&too_large)], RECORD_MAX),
            Err(Push::TooLarge)
        );
    }

    /// An empty record whose word is the area's last eight bytes, plain
    /// and with a header ending there, is written and read like any other.
    #[test]
    fn a_record_may_end_at_the_end_of_the_area() {
        let (mut writer, mut reader, _fd) = pair();
        let mut dst = Vec::new();
        for header in [None, Some(Header::new(Body::Inline, 0, 0, 7).encode())] {
            let last = 8 + header.as_ref().map_or(0, |h| h.len());
            // Fill up to `last` bytes before the end of the area.
            let filler = bytes(1016, 0);
            let mut left = DATA_LEN - (writer.head % DATA_LEN as u64) as usize;
            while left != last {
                let len = (left - last - 8).min(1016);
                writer
                    .push(None, &[IoSlice::new(&filler[..len])], len)
                    .unwrap();
                assert!(matches!(
                    reader.next(&mut dst, u64::MAX),
                    Ok(Some(Record::Plain))
                ));
                left -= 8 + len;
            }
            writer.push(header.as_ref(), &[], 0).unwrap();
            match reader.next(&mut dst, u64::MAX).unwrap() {
                Some(Record::Plain) => assert!(header.is_none()),
                Some(Record::Packet(h)) => assert_eq!(h.tag, 7),
                other => panic!("{other:?}"),
            }
            assert!(dst.is_empty());
            assert_eq!(writer.head % DATA_LEN as u64, 0);
        }
    }

    /// A parked reader is rung once by the next record, then not again; a
    /// reader that goes tells its writer.
    #[test]
    fn a_parked_reader_is_rung_once() {
        let (mut writer, mut reader, _fd) = pair();
        let parts = [IoSlice::new(b"hello")];
        assert!(!reader.park());
        assert_eq!(writer.push(None, &parts, 5), Ok(true));
        assert_eq!(writer.push(None, &parts, 5), Ok(false));
        assert!(reader.park(), "records are there");
        reader.unpark();
        assert_eq!(writer.push(None, &parts, 5), Ok(false));
        let mut dst = Vec::new();
        for _ in 0..3 {
            assert!(reader.next(&mut dst, u64::MAX).unwrap().is_some());
        }
        assert!(!reader.finished());
        drop(reader);
        assert_eq!(writer.push(None, &parts, 5), Err(Push::Gone));
    }

    /// A writer keeps to its socket until the reader answers; once it
    /// accepts, a switch record comes first; a refusal is final.
    #[test]
    fn a_ring_is_used_once_its_reader_takes_it_on() {
        let (mut writer, mut reader, _fd) = pair();
        let mut dst = Vec::new();
        assert_eq!(writer.answer(), Answer::Pending);
        reader.answer(true);
        assert_eq!(writer.answer(), Answer::Accepted);
        assert_eq!(writer.answer(), Answer::Accepted, "one switch");
        writer.push(None, &[IoSlice::new(b"after")], 5).unwrap();
        assert!(matches!(
            reader.next(&mut dst, 100),
            Ok(Some(Record::Switch))
        ));
        assert!(matches!(
            reader.next(&mut dst, 100),
            Ok(Some(Record::Plain))
        ));
        assert_eq!(dst, b"after");
        assert!(reader.next(&mut dst, 100).unwrap().is_none());

        let (mut writer, reader, _fd) = pair();
        reader.answer(false);
        assert_eq!(writer.answer(), Answer::Refused);
    }

    /// A record over the receiver's limit is skipped and refused; the next
    /// one is read.
    #[test]
    fn a_record_over_the_limit_is_refused_alone() {
        let (mut writer, mut reader, _fd) = pair();
        let big = bytes(500, 1);
        writer.push(None, &[IoSlice::new(&big)], 500).unwrap();
        writer.push(None, &[IoSlice::new(b"ok")], 2).unwrap();
        let mut dst = Vec::new();
        assert!(matches!(
            reader.next(&mut dst, 100),
            Err(RecvError::Wire(
                WireError::TooLarge { claimed: 500, .. },
                None
            ))
        ));
        assert!(matches!(
            reader.next(&mut dst, 100),
            Ok(Some(Record::Plain))
        ));
        assert_eq!(dst, b"ok");
    }

    /// A hostile peer rewrites every byte of the ring while both ends use
    /// it: the reader gets records or typed errors, the writer writes or is
    /// refused, and neither panics, reads out of bounds or hangs.
    #[test]
    fn a_scribbled_ring_gives_errors_never_a_crash_or_a_hang() {
        let (mut writer, mut reader, fd) = pair();
        let attacker = Os::map(Os::borrow(&fd), LEN).unwrap();
        let base = attacker.as_ptr().addr();
        let stop = Arc::new(AtomicBool::new(false));
        let scribbler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15_u64;
                while !stop.load(Ordering::Relaxed) {
                    // xorshift: offsets anywhere, values anything, and the
                    // indices and words it likes best.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = match x % 4 {
                        0 => HEAD_AT,
                        1 => TAIL_AT,
                        _ => (x as usize >> 8) % (LEN / 8) * 8,
                    };
                    let value = match x % 5 {
                        0 => x >> 3 << 3,
                        1 => ((x % 64) << 32) | ((x >> 40) % 9000),
                        _ => x.rotate_left(17),
                    };
                    // SAFETY: `at` is an 8-aligned offset inside the
                    // attacker's own mapping of the ring; a word is written
                    // atomically, as a peer would.
                    let word = unsafe { &*((base + at) as *const AtomicU64) };
                    word.store(value, Ordering::Relaxed);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_millis(300);
        let (mut read, mut refused, mut pushed) = (0u64, 0u64, 0u64);
        let mut dst = Vec::new();
        let payload = bytes(100, 3);
        while Instant::now() < deadline {
            let started = Instant::now();
            match reader.next(&mut dst, 1 << 20) {
                Ok(Some(_)) => {
                    read += 1;
                    assert!(dst.len() <= RECORD_MAX);
                }
                Ok(None) => {}
                Err(RecvError::Wire(..)) => refused += 1,
                Err(e) => panic!("not a wire error: {e:?}"),
            }
            assert!(
                started.elapsed() < Duration::from_millis(100),
                "a read hung"
            );
            if writer.push(None, &[IoSlice::new(&payload)], 100).is_ok() {
                pushed += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        scribbler.join().unwrap();
        assert!(read + refused + pushed > 0);
        drop(attacker);
    }
}
