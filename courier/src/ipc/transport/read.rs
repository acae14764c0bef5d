//! The reads of one packet: small ones whole into the thread's scratch
//! area, larger ones scattered by `recvmsg` straight into the destination.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::mem::{ManuallyDrop, MaybeUninit};

use rustix::io::Errno;

use super::pending::RecvState;
use super::recv::{OsReceiver, Split, MAX_SPLIT_HEAD, SCATTER_MIN};
use super::RecvError;
use crate::buf::{fill_spare, RawIoVec, UbufMut};
use crate::ipc::err::WireError;
use crate::ipc::platform::{Os, OwnedFd, Packet, Transport};
use crate::ipc::split::Layout;
use crate::ipc::wire::{Body, FdPacket, Header, PacketKind, FD_PACKET_LEN, HEADER_LEN};

/// What one read delivered.
pub(super) enum Read {
    /// A data packet (checked against the limit and its own length); its
    /// payload is in the destination buffer, less the byte string split off
    /// into its own buffer if the flag is set (see [`Split`]).
    Data(Header, bool),
    /// A descriptor packet, and whether the kernel dropped some of its
    /// descriptors for lack of room (`MSG_CTRUNC`).
    Fds(FdPacket, Vec<OwnedFd>, bool),
    /// A packet to skip: a descriptor packet of a message we refused, read
    /// without a control buffer (the kernel closed its descriptors).
    Skip(FdPacket),
}

thread_local! {
    /// Where packets land that the destination had no room for, and where
    /// small messages are read whole. Allocated on first use, never
    /// initialised: the kernel writes only what arrives, so only pages that
    /// ever held data become resident.
    ///
    /// It has no destructor, so a receive can always reach it, also from
    /// another thread-local's `Drop` at thread exit; [`SCRATCH_OWNER`] frees
    /// the buffer instead.
    static SCRATCH: RefCell<ManuallyDrop<Vec<u8>>> =
        const { RefCell::new(ManuallyDrop::new(Vec::new())) };
    /// Frees [`SCRATCH`]'s buffer when the thread's locals are torn down.
    /// Touched when the buffer is allocated, so that it is registered for
    /// that; once it is gone, a receive that finds no buffer uses one of
    /// its own for that call, which nothing would free otherwise.
    static SCRATCH_OWNER: ScratchOwner = const { ScratchOwner };
}

/// See [`SCRATCH_OWNER`].
struct ScratchOwner;

impl Drop for ScratchOwner {
    fn drop(&mut self) {
        let _ = SCRATCH.with(|scratch| {
            scratch
                .try_borrow_mut()
                .map(|mut scratch| drop(std::mem::take(&mut **scratch)))
        });
    }
}

/// Runs `f` on the thread's scratch area, one packet long (see [`SCRATCH`]),
/// starting at a page boundary.
///
/// The kernel copies a packet out with `rep movsb`, which on this AMD Zen 3
/// guest runs ~17x slower for 4-256 KiB when the destination lies 1-31 bytes
/// past the source modulo 4 KiB (`courier-bench iter --case memcpy`; the
/// design note on the memcpy placement under `docs/`). A packet of a few KiB
/// starts at a page boundary in the kernel, and a `Vec` of a packet's size
/// is `mmap`ed by malloc, 16 bytes past one: exactly that distance.
/// `courier-bench ipc --case sendrecv_4k`, bytes, a malloc'd area against a
/// page-aligned one, the two builds in turn: 6.7-7.0 µs against 4.5-4.6
/// (ipc-channel 5.0-5.2); in a faster minute 4.8-4.9 against 3.4
/// (ipc-channel 3.9).
///
/// A receive from a thread-local's destructor, once [`SCRATCH_OWNER`] has
/// freed the thread's area, uses an area of its own for that one call.
#[inline]
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut [MaybeUninit<u8>]) -> R) -> R {
    SCRATCH.with_borrow_mut(|scratch| {
        // One call of `f` whichever area it gets: a second call site (for
        // the area of its own) kept `f` out of line, ~35 instructions a
        // small receive (callgrind, `floor_ab courier 64`).
        let room = Os::max_packet();
        let mut own = Vec::new();
        let area = match scratch.capacity() >= room + PAGE {
            true => &mut **scratch,
            false => grow_scratch(&mut own, scratch, room + PAGE),
        };
        let spare = area.spare_capacity_mut();
        let skip = spare.as_ptr().addr().next_multiple_of(PAGE) - spare.as_ptr().addr();
        f(&mut spare[skip..skip + room])
    })
}

/// The area for a receive that found the thread's too short (or freed):
/// the thread's, grown to `len`, while [`SCRATCH_OWNER`] can still free it,
/// else `own`, for this call only.
#[cold]
fn grow_scratch<'a>(own: &'a mut Vec<u8>, scratch: &'a mut Vec<u8>, len: usize) -> &'a mut Vec<u8> {
    let area = match SCRATCH_OWNER.try_with(|_| ()) {
        Ok(()) => scratch,
        Err(_) => own,
    };
    *area = Vec::with_capacity(len);
    area
}

/// A whole data packet read into a buffer of our own: its header checked,
/// its payload copied into `dst` (empty).
fn data_packet(packet: &[u8], dst: &mut Vec<u8>, limit: u64) -> Result<Read, RecvError> {
    let (header, payload) = packet
        .split_first_chunk::<HEADER_LEN>()
        .ok_or(WireError::BadHeader("short packet"))?;
    let header = check(Header::decode(header)?, payload.len(), limit)?;
    dst.reserve(payload.len());
    fill_spare(dst, |room| room.copy_to_iter(payload));
    Ok(Read::Data(header, false))
}

/// A page: the scratch area starts on one.
const PAGE: usize = 4096;

impl OsReceiver {
    /// Reads one packet. A data packet's payload replaces `dst`'s contents;
    /// with descriptors awaited, descriptors attached to the packet are taken.
    pub(super) fn read(
        &self,
        state: &RecvState,
        dst: &mut Vec<u8>,
        split: Option<&mut Split<'_>>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        dst.clear();
        let room = Os::max_packet();
        // (A ring's records announce descriptors the socket does not.)
        let control = !state.waiting.is_empty() || !state.rings.is_empty();
        with_scratch(|scratch| {
            if !control && self.packet_guess.get() <= SCATTER_MIN {
                self.read_small(state, scratch, dst, limit, dontwait)
            } else if let Some(split) = split.filter(|s| {
                // A string that cannot fit one packet comes by region or
                // fragments (split there, if at all): allocate nothing for it.
                !control && s.layout.at <= MAX_SPLIT_HEAD && s.layout.at + s.layout.len <= room
            }) {
                self.read_split(scratch, dst, split, limit, dontwait)
            } else {
                self.read_scatter(&mut scratch[HEADER_LEN..], dst, limit, control, dontwait)
            }
        })
    }

    /// [`read_small`](Self::read_small) with the common case done in place:
    /// a packet holding a whole message without descriptors is copied into
    /// `dst` and done with (`Ok`); any other packet, or an error, is what
    /// `read_small` makes of it (`Err`), for `recv_message`'s loop. The
    /// loop's general path moves a `Read` and a `Header` through memory for
    /// it: this path costs a 64-byte send+receive a fifth fewer instructions
    /// (758 -> 600, `courier-bench --example floor_ab`).
    #[inline]
    pub(super) fn read_plain(
        &self,
        state: &RecvState,
        dst: &mut Vec<u8>,
        limit: u64,
        dontwait: bool,
    ) -> Result<(), Result<Read, RecvError>> {
        with_scratch(|scratch| {
            let len = Os::recv_whole(self.fd(), scratch, dontwait)
                .map_err(|e| Err(RecvError::from(e)))?;
            if let Some(packet) = scratch.get(..len) {
                // SAFETY: `recv` initialised the first `len` bytes of `scratch`.
                let packet = unsafe { assume_init(packet) };
                if let Some((header, payload)) = packet.split_first_chunk::<HEADER_LEN>() {
                    let total = payload.len() as u64;
                    if let Ok(h) = Header::decode(header) {
                        if h.body == Body::Inline
                            && h.nfds == 0
                            && h.total == total
                            && total <= limit
                        {
                            dst.clear();
                            dst.extend_from_slice(payload);
                            self.guess.set(payload.len());
                            self.packet_guess.set(payload.len());
                            return Ok(());
                        }
                    }
                }
            }
            Err(self.small_packet(state, scratch, len, dst, limit))
        })
    }

    /// `recv(2)` of the whole packet into `scratch`, then the payload copied
    /// into `dst`. Descriptors attached to the packet are discarded by the
    /// kernel (a data packet never legitimately has any).
    fn read_small(
        &self,
        state: &RecvState,
        scratch: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let len = Os::recv_whole(self.fd(), scratch, dontwait)?;
        self.small_packet(state, scratch, len, dst, limit)
    }

    /// The packet of `len` bytes [`read_small`](Self::read_small) received
    /// into `scratch` (`len` exceeds `scratch.len()` if it did not fit).
    fn small_packet(
        &self,
        state: &RecvState,
        scratch: &[MaybeUninit<u8>],
        len: usize,
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Read, RecvError> {
        dst.clear();
        if len == 0 {
            return Err(self.empty_packet());
        }
        if len > scratch.len() {
            return Err(WireError::Truncated.into());
        }
        // SAFETY: `recv` initialised the first `len` bytes of `scratch`.
        let packet = unsafe { assume_init(&scratch[..len]) };
        if PacketKind::of(packet)? == PacketKind::Fds {
            // Its descriptors are lost (closed by the kernel): fine for a
            // refused message's, an error otherwise, since a descriptor
            // packet must follow an announcement, which switches to `recvmsg`.
            let fds = FdPacket::decode(packet)?;
            return match state.refused.iter().any(|r| r.tag == fds.tag) {
                true => Ok(Read::Skip(fds)),
                false => Err(WireError::BadHeader("descriptor packet without a message").into()),
            };
        }
        data_packet(packet, dst, limit)
    }

    /// One `recvmsg` scattering the header, then straight into `dst`'s spare
    /// capacity, then into `overflow`.
    pub(super) fn read_scatter(
        &self,
        overflow: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        limit: u64,
        control: bool,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let mut header = [MaybeUninit::<u8>::uninit(); HEADER_LEN];
        let mut head = UbufMut::new(&mut header);
        let mut tail = UbufMut::new(overflow);
        let packet = fill_spare(dst, |room| {
            self.recv_scattered((&mut head, room, &mut tail), control, dontwait)
        })?;
        if packet.len == 0 && !packet.truncated {
            return Err(self.empty_packet());
        }
        if packet.truncated {
            return Err(WireError::Truncated.into());
        }
        let head = head.filled_bytes();
        match PacketKind::of(head)? {
            PacketKind::Fds => {
                let fd_packet = FdPacket::decode(head.get(..FD_PACKET_LEN).unwrap_or(head))?;
                return Ok(Read::Fds(fd_packet, packet.fds, packet.control_truncated));
            }
            // Descriptors attached to a data packet are closed unread.
            PacketKind::Data => drop(packet.fds),
        }
        let header = Header::decode(
            head.try_into()
                .map_err(|_| WireError::BadHeader("short packet"))?,
        )?;
        let header = check(header, packet.len - HEADER_LEN, limit)?;
        // The part of the packet the destination had no room for.
        dst.extend_from_slice(tail.filled_bytes());
        Ok(Read::Data(header, false))
    }

    /// One `recvmsg`, without waiting, of the next packet whole into
    /// `scratch`, with its descriptors: a descriptor packet as it came, a
    /// data packet's payload copied into `dst`.
    ///
    /// One `iovec`, not [`read_scatter`](Self::read_scatter)'s header and
    /// overflow: the kernel takes a single-segment read as a plain user
    /// buffer, which spares it the `iovec` array's import and the per-segment
    /// copy (~50 ns of a one-descriptor message's 4 µs). For the packet
    /// that usually follows a ring record announcing descriptors: their
    /// descriptor packet, of [`FD_PACKET_LEN`] bytes, which nothing scatters.
    pub(super) fn read_whole(
        &self,
        scratch: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        limit: u64,
    ) -> Result<Read, RecvError> {
        let packet = {
            let mut whole = UbufMut::new(&mut *scratch);
            let mut iov = [RawIoVec::EMPTY; 1];
            let n = whole.io_vecs(&mut iov);
            Os::recv(self.fd(), &mut iov[..n], true, true)?
        };
        if packet.len == 0 && !packet.truncated {
            return Err(self.empty_packet());
        }
        if packet.truncated || packet.len > scratch.len() {
            return Err(WireError::Truncated.into());
        }
        // SAFETY: `recvmsg` initialised the first `packet.len` bytes of
        // `scratch`, its only segment.
        let bytes = unsafe { assume_init(&scratch[..packet.len]) };
        if PacketKind::of(bytes)? == PacketKind::Fds {
            let fd_packet = FdPacket::decode(bytes.get(..FD_PACKET_LEN).unwrap_or(bytes))?;
            return Ok(Read::Fds(fd_packet, packet.fds, packet.control_truncated));
        }
        // Descriptors attached to a data packet are closed unread.
        drop(packet.fds);
        dst.clear();
        data_packet(bytes, dst, limit)
    }

    /// One `recvmsg` scattering the header and the bytes before the predicted
    /// byte string into `scratch`, the string into its own buffer, the rest
    /// after it into `scratch`; `dst` gets the payload less the string. A
    /// packet that does not match the prediction (shorter, or with
    /// descriptors to come) is put back together in `dst`.
    fn read_split(
        &self,
        scratch: &mut [MaybeUninit<u8>],
        dst: &mut Vec<u8>,
        split: &mut Split<'_>,
        limit: u64,
        dontwait: bool,
    ) -> Result<Read, RecvError> {
        let Layout { at, len } = split.layout;
        let string = &mut *split.string;
        string.clear();
        string
            .try_reserve_exact(len)
            .map_err(|_| WireError::OutOfMemory {
                requested: len as u64,
            })?;
        let (front, back) = scratch.split_at_mut(HEADER_LEN + at);
        let mut front = UbufMut::new(front);
        let mut middle = UbufMut::new(&mut string.spare_capacity_mut()[..len]);
        let mut back = UbufMut::new(back);
        let packet = self.recv_scattered((&mut front, &mut middle, &mut back), false, dontwait)?;
        let in_middle = middle.filled();
        // SAFETY: `middle` (no longer used) covered the first `len` bytes of `string`'s spare
        // capacity, and its first `in_middle <= len` bytes were written.
        unsafe { string.set_len(in_middle) };
        if packet.len == 0 && !packet.truncated {
            return Err(self.empty_packet());
        }
        if packet.truncated {
            return Err(WireError::Truncated.into());
        }
        let front = front.filled_bytes();
        if PacketKind::of(front)? == PacketKind::Fds {
            let fd_packet = FdPacket::decode(front.get(..FD_PACKET_LEN).unwrap_or(front))?;
            return Ok(Read::Fds(fd_packet, packet.fds, packet.control_truncated));
        }
        let (header, head) = front
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(WireError::BadHeader("short packet"))?;
        let header = check(Header::decode(header)?, packet.len - HEADER_LEN, limit)?;
        dst.clear();
        dst.extend_from_slice(head);
        let split_off = in_middle == len && header.nfds == 0;
        if !split_off {
            dst.append(string);
        }
        dst.extend_from_slice(back.filled_bytes());
        Ok(Read::Data(header, split_off))
    }

    /// One `recvmsg` scattering the packet over `parts`, in order; each part
    /// records what the kernel wrote into it.
    fn recv_scattered(
        &self,
        (a, b, c): (&mut UbufMut<'_>, &mut UbufMut<'_>, &mut UbufMut<'_>),
        control: bool,
        dontwait: bool,
    ) -> Result<Packet<OwnedFd>, Errno> {
        let packet = {
            let mut iov = [RawIoVec::EMPTY; 3];
            let mut n = a.io_vecs(&mut iov);
            n += b.io_vecs(&mut iov[n..]);
            n += c.io_vecs(&mut iov[n..]);
            Os::recv(self.fd(), &mut iov[..n], control, dontwait)?
        };
        let mut left = packet.len;
        let mut advance = |part: &mut UbufMut<'_>| {
            let here = left.min(part.remaining());
            // SAFETY: `recvmsg` wrote `packet.len` bytes into the iovec
            // entries in order (one per part with room left), so the next
            // `here` bytes of this part, up to its room, are initialised.
            unsafe { part.advance(here) };
            left -= here;
        };
        advance(a);
        advance(b);
        advance(c);
        Ok(packet)
    }

    /// A read of zero bytes: the end of the stream if the peer is gone and
    /// nothing is queued, else an empty packet (courier never sends one).
    #[cold]
    fn empty_packet(&self) -> RecvError {
        let hung_up = Os::read_hung_up(self.fd());
        // A peer may send empty packets and then more before it leaves: the
        // stream ends only where no byte is queued behind. `FIONREAD` on a
        // `SOCK_SEQPACKET` socket counts the bytes of every queued packet, not
        // only the next one's (which a peek would see, and a second empty
        // packet would hide the message behind it). A run of empty packets at
        // the end still reads as the end.
        let more = || !matches!(Os::queued(self.fd()), Ok(0));
        match hung_up && !more() {
            true => RecvError::Disconnected,
            false => WireError::BadHeader("empty packet").into(),
        }
    }
}

/// Checks a data packet's header against the receiver's limit and against
/// the `inline` payload bytes that came with it, before anything is copied
/// or kept.
pub(super) fn check(header: Header, inline: usize, limit: u64) -> Result<Header, RecvError> {
    if header.total > limit {
        return Err(RecvError::Wire(
            WireError::TooLarge {
                claimed: header.total,
                limit,
            },
            Some(header),
        ));
    }
    let consistent = match header.body {
        Body::Inline => header.total == inline as u64,
        Body::Fragmented => header.total >= inline as u64,
        Body::SharedMemory | Body::Kept => inline == 0,
        Body::Ring | Body::Wake => inline == 0 && header.total == 0,
    };
    match consistent {
        true => Ok(header),
        false => Err(WireError::Truncated.into()),
    }
}

/// The bytes of `buf`, which the caller knows to be initialised.
///
/// # Safety
/// The caller must ensure that every byte of `buf` was written (by the
/// kernel, in this module's uses).
unsafe fn assume_init(buf: &[MaybeUninit<u8>]) -> &[u8] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the caller
    // guarantees every byte is initialised.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scratch area starts at a page boundary and holds a whole packet,
    /// on every use (see `with_scratch`).
    #[test]
    fn the_scratch_area_is_page_aligned() {
        for _ in 0..3 {
            with_scratch(|scratch| {
                assert_eq!(scratch.as_ptr().addr() % 4096, 0);
                assert_eq!(scratch.len(), Os::max_packet());
            });
        }
    }
}
