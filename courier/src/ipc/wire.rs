//! The wire format: the header every message starts with, and the packet
//! that carries a message's descriptors.
//!
//! A message is one `SOCK_SEQPACKET` packet when it fits. Its first 40 bytes
//! are this header, and the payload follows at an 8-byte-aligned offset:
//!
//! ```text
//!  0       4    5    6    7    8            16                         32          40
//!  +-------+----+----+----+----+------------+--------------------------+-----------+--------
//!  | magic |body|nfds|skew|flag| total      | kinds: 2 bits/descriptor | tag       | payload
//!  +-------+----+----+----+----+------------+--------------------------+-----------+--------
//!   u32 LE  u8   u8   u8   u8   u64 LE:      u128 LE, descriptor i at   u64 LE
//!                                payload of   bits 2i..2i+2
//!                                the message
//! ```
//!
//! * `body` says where the payload travels: [`Body::Inline`] (all of it in
//!   this packet), [`Body::Fragmented`] (the rest follows on a dedicated
//!   socket, the last descriptor), [`Body::SharedMemory`] (all of it in a
//!   sealed memfd region, the last descriptor), or [`Body::Kept`] (all of it
//!   in a region the receiver already holds, named by `tag`; no descriptors).
//!   Two bodies are not messages: [`Body::Ring`] hands the receiver the
//!   sender's shared-memory ring (its one descriptor; see
//!   `ipc::transport::ring`), and [`Body::Wake`] wakes a receiver that
//!   sleeps while records wait in a ring (no descriptors). Both have
//!   `total` 0.
//! * `nfds` is the number of descriptors the message carries and `kinds`
//!   says what each one is, so the receiver never guesses by `fstat` or by
//!   position (as ipc-channel does). Up to [`KINDS`] (64) descriptors, that
//!   is all; a message of more sets `nfds` to [`MANY`] (255) and writes its
//!   count in the first 4 bytes of `kinds` (u32 LE, the other 12 zero):
//!
//!   ```text
//!    5      16           20                        32
//!   +----+ ..+------------+-------------------------+
//!   |0xFF|   | count      | 0                       |
//!   +----+ ..+------------+-------------------------+
//!             u32 LE, 64 < count <= MAX_FDS + 1
//!   ```
//!
//!   Kinds need no room there: only the carrier is not a channel, and it is
//!   always last, so every descriptor of such a message is a channel but
//!   the last, which is the carrier if `body` has one. The common case, a
//!   message of at most 64 descriptors, decodes as fast as one of none but
//!   for its kinds (the long count is decoded out of line).
//! * `total` is the length of the whole payload: the receiver checks it
//!   against its limit *before* it allocates, and allocates exactly once.
//! * `skew` (regions only, below [`SKEW_ALIGN`]): how far past the region's
//!   header the payload starts. The sender skews the payload so that its
//!   second part, a typed message's byte string, starts on a cache line, as
//!   a bytes channel's payload does: `memcpy` between buffers that are not
//!   aligned alike runs 1.4-1.8x slower here (64 KiB), and that was the
//!   whole gap between the two at 32-128 KiB.
//! * `flag` bit 0, [`Header::streamed`] (regions only): the header was sent
//!   before the payload was written; the region says how far it is filled
//!   (see `shm`'s streaming).
//!
//! # Descriptors travel in packets of their own
//! A data packet never carries descriptors. A message with descriptors is
//! its data packet followed by 16-byte **descriptor packets** with the
//! descriptors attached (`SCM_RIGHTS`), matched to the message by `tag`:
//!
//! ```text
//!  0          4       6       8                 16
//!  +----------+-------+-------+-----------------+
//!  | FD_MAGIC | count | index | tag             |
//!  +----------+-------+-------+-----------------+
//!              u16 LE  u16 LE  u64 LE
//! ```
//!
//! So the receiver reads data packets with plain `recv(2)`, and needs
//! `recvmsg(2)` with a control buffer only after a header announced
//! descriptors: measured here, `recvmsg` with a control buffer and an iovec
//! costs about 16% more than `recv` for a 64-byte message, the whole margin a
//! channel has over a raw socket. Other senders' packets may come between a
//! data packet and its descriptor packet (two `sendmsg` calls are not one
//! atomic write), hence the tag.
//!
//! ## Many descriptors
//! One control message carries at most [`FDS_PER_PACKET`] descriptors
//! (Linux's `SCM_MAX_FD`, 253), so a message of more sends them in several
//! packets, in order: packet `index` (from 0) carries descriptors `253 *
//! index ..`, every packet but the last exactly 253, the last the rest
//! (`count` says how many, 1 to 253). A message of at most 253 descriptors
//! has one packet, index 0 (its bytes 4..8 read as a `u32` count). A sender
//! refuses a message of more than [`MAX_FDS`] before anything is sent.
//!
//! The receiver knows from the header how many packets to expect and what
//! each must hold, so it checks every packet's index and count (and the
//! descriptors actually attached) before it keeps its descriptors, and it
//! never allocates for a count it was told: it keeps the descriptors that
//! arrived. A packet out of order, miscounted, short of descriptors or cut
//! by the kernel (`MSG_CTRUNC`: the receiver is out of descriptors) fails
//! its message alone: the descriptors that came are closed, the message's
//! later packets are dropped as they come, and the channel goes on. A
//! packet under a tag no message waits for fails alone; a message whose
//! packets never all come is given up like one whose only packet never
//! comes.
//!
//! Everything here is decoded from bytes a peer wrote, so every field is
//! checked and every failure is a [`WireError`], never a panic.

use super::err::WireError;
pub(crate) use super::platform::FDS_PER_PACKET;

/// Size of the header in bytes; payloads start 8-byte aligned right after it.
pub(crate) const HEADER_LEN: usize = 40;

/// Size of a descriptor packet.
pub(crate) const FD_PACKET_LEN: usize = 16;

/// A region's payload is skewed by less than this (see the module docs).
pub(crate) const SKEW_ALIGN: usize = 64;

/// The flag of a [`Header::streamed`] message.
const STREAMED: u8 = 1;

/// Identifies a data packet of courier's wire format, version 1.
const MAGIC: u32 = 0xC0C0_5201;

/// Identifies a descriptor packet.
const FD_MAGIC: u32 = 0xC0C0_5202;

/// What the first bytes of a packet say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PacketKind {
    Data,
    Fds,
}

impl PacketKind {
    /// Classifies a packet by its magic (`bytes` is at least 4 bytes long).
    pub fn of(bytes: &[u8]) -> Result<Self, WireError> {
        match bytes.first_chunk::<4>().map(|m| u32::from_le_bytes(*m)) {
            Some(MAGIC) => Ok(PacketKind::Data),
            Some(FD_MAGIC) => Ok(PacketKind::Fds),
            _ => Err(WireError::BadHeader("bad magic")),
        }
    }
}

/// A packet that carries (some of) a message's descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FdPacket {
    /// Descriptors attached to this packet (1 to [`FDS_PER_PACKET`]).
    pub count: usize,
    /// This packet's place among the message's descriptor packets, from 0.
    pub index: usize,
    /// The tag of the message.
    pub tag: u64,
}

impl FdPacket {
    /// The first packet of the message `tag`, carrying `count` descriptors.
    #[cfg(test)]
    pub fn first(count: usize, tag: u64) -> Self {
        FdPacket {
            count,
            index: 0,
            tag,
        }
    }

    /// How many descriptors packet `index` of a message of `nfds` must
    /// carry: [`FDS_PER_PACKET`] but for the last, which carries the rest
    /// (0 past the last).
    pub fn expected(nfds: usize, index: usize) -> usize {
        nfds.saturating_sub(index.saturating_mul(FDS_PER_PACKET))
            .min(FDS_PER_PACKET)
    }

    pub fn encode(&self) -> [u8; FD_PACKET_LEN] {
        debug_assert!(self.count <= FDS_PER_PACKET && self.index <= usize::from(u16::MAX));
        let mut out = [0u8; FD_PACKET_LEN];
        out[0..4].copy_from_slice(&FD_MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&(self.count as u16).to_le_bytes());
        out[6..8].copy_from_slice(&(self.index as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.tag.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let bytes: &[u8; FD_PACKET_LEN] = bytes
            .try_into()
            .map_err(|_| WireError::BadHeader("descriptor packet of the wrong size"))?;
        if u32::from_le_bytes(*bytes.first_chunk::<4>().unwrap_or(&[0; 4])) != FD_MAGIC {
            return Err(WireError::BadHeader("bad magic"));
        }
        let count = usize::from(u16::from_le_bytes(field(bytes, 4)));
        if count == 0 || count > FDS_PER_PACKET {
            return Err(WireError::BadHeader("descriptor packet count out of range"));
        }
        Ok(FdPacket {
            count,
            index: usize::from(u16::from_le_bytes(field(bytes, 6))),
            tag: u64::from_le_bytes(field(bytes, 8)),
        })
    }
}

/// The most descriptors one message may carry: channels, shared-memory
/// regions and [`IpcFd`](super::IpcFd)s together. A send of more fails
/// before anything is sent. A message of more than 253 (Linux's
/// `SCM_MAX_FD`) sends them in several descriptor packets.
pub const MAX_FDS: usize = 4096;

/// Descriptors of a message whose kinds the header spells out; a message of
/// more writes [`MANY`] in place of its count (see the module docs).
pub(crate) const KINDS: usize = 64;

/// The header's `nfds` byte of a message of more than [`KINDS`] descriptors.
const MANY: u8 = 0xFF;

/// Where a message's payload travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Body {
    /// The whole payload follows the header in this packet.
    Inline = 0,
    /// The first part follows the header; the rest arrives on a dedicated
    /// socket, the last descriptor of the message.
    Fragmented = 1,
    /// The payload lies in a sealed memfd region, the last descriptor.
    SharedMemory = 2,
    /// The payload lies in a region the receiver holds from an earlier
    /// [`Body::SharedMemory`] message, named by the header's tag (the tag of
    /// that message). The message carries no descriptors at all.
    Kept = 3,
    /// Not a message: the sender's shared-memory ring, its only descriptor,
    /// through which its later data packets come (`transport::ring`).
    /// `total` is 0.
    Ring = 4,
    /// Not a message: a sender wrote to its ring while the receiver slept.
    /// No descriptors, `total` 0.
    Wake = 5,
}

impl Body {
    /// Whether the message's last descriptor carries (part of) the payload
    /// (for a ring, the ring).
    pub fn has_carrier(self) -> bool {
        matches!(self, Body::Fragmented | Body::SharedMemory | Body::Ring)
    }
}

/// What a descriptor attached to a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum FdKind {
    /// One end of a courier channel (an `IpcSender` or `IpcReceiver`).
    Channel = 0,
    /// The carrier of the payload itself: the fragment socket or the payload
    /// region, as `body` says. Always the last descriptor, and only one.
    Carrier = 3,
}

impl FdKind {
    fn from_bits(bits: u8) -> Result<Self, WireError> {
        match bits {
            0 => Ok(FdKind::Channel),
            3 => Ok(FdKind::Carrier),
            _ => Err(WireError::BadHeader("unknown descriptor kind")),
        }
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub body: Body,
    pub nfds: usize,
    pub total: u64,
    kinds: u128,
    /// Matches the message to its descriptor packet.
    pub tag: u64,
    /// Where a region's payload starts, past its header (below [`SKEW_ALIGN`]).
    pub skew: u8,
    /// The region is filled while the receiver reads it.
    pub streamed: bool,
}

impl Header {
    /// A header for a message of `total` payload bytes with `channels` channel
    /// descriptors, plus one carrier descriptor if the body has one.
    pub fn new(body: Body, total: usize, channels: usize, tag: u64) -> Self {
        debug_assert!(channels <= MAX_FDS);
        debug_assert!(body != Body::Kept || channels == 0);
        let mut nfds = channels;
        let mut kinds = 0u128; // Channel is 0: only the carrier needs bits.
        if body.has_carrier() {
            if nfds < KINDS {
                kinds |= (FdKind::Carrier as u128) << (2 * nfds);
            }
            nfds += 1;
        }
        Header {
            body,
            nfds,
            total: total as u64,
            kinds,
            tag,
            skew: 0,
            streamed: false,
        }
    }

    /// This header, for a region payload that starts `skew` bytes late and
    /// is written after the header is sent if `streamed`.
    pub fn in_region(self, skew: usize, streamed: bool) -> Self {
        debug_assert!(matches!(self.body, Body::SharedMemory | Body::Kept));
        debug_assert!(skew < SKEW_ALIGN);
        Header {
            skew: skew as u8,
            streamed,
            ..self
        }
    }

    /// The kind of descriptor `i` (`i < nfds`).
    pub fn kind(&self, i: usize) -> FdKind {
        if i >= KINDS {
            // Past the header's kinds: a channel, or the carrier, last.
            return match i + 1 == self.nfds && self.body.has_carrier() {
                true => FdKind::Carrier,
                false => FdKind::Channel,
            };
        }
        // Kinds were validated by `decode`; `new` writes only valid ones.
        match (self.kinds >> (2 * i)) & 0b11 {
            3 => FdKind::Carrier,
            _ => FdKind::Channel,
        }
    }

    /// Number of channel descriptors (the carrier excluded).
    #[cfg(test)]
    pub fn channels(&self) -> usize {
        self.nfds - usize::from(self.body.has_carrier())
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = self.body as u8;
        out[6] = self.skew;
        out[7] = u8::from(self.streamed) * STREAMED;
        out[5] = self.nfds as u8;
        out[8..16].copy_from_slice(&self.total.to_le_bytes());
        out[16..32].copy_from_slice(&self.kinds.to_le_bytes());
        if self.nfds > KINDS {
            encode_count(&mut out, self.nfds);
        }
        out[32..40].copy_from_slice(&self.tag.to_le_bytes());
        out
    }

    /// Decodes and validates a header.
    #[inline]
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        // Fast path, the common case: inline, no skew, no flags, and as many
        // descriptors as the kinds can spell, all channels' or plain ones
        // (kinds 0): what a message with or without descriptors sends.
        const PLAIN: u64 = MAGIC as u64; // body 0, nfds 0, skew 0, flags 0
        const NFDS: u64 = 0xFF << 40;
        let nfds = usize::from(bytes[5]);
        if u64::from_le_bytes(field(bytes, 0)) & !NFDS == PLAIN
            && nfds <= KINDS
            && u128::from_le_bytes(field(bytes, 16)) == 0
        {
            let total = u64::from_le_bytes(field(bytes, 8));
            let tag = u64::from_le_bytes(field(bytes, 32));
            return Ok(Header {
                body: Body::Inline,
                nfds,
                total,
                kinds: 0,
                tag,
                skew: 0,
                streamed: false,
            });
        }
        Self::decode_slow(bytes)
    }

    /// The descriptor count of a message of more than [`KINDS`]: `nfds`
    /// is [`MANY`], and the count takes the place of the kinds.
    #[cold]
    fn decode_count(bytes: &[u8; HEADER_LEN], body: Body) -> Result<usize, WireError> {
        if bytes[5] != MANY {
            return Err(WireError::BadHeader("too many descriptors"));
        }
        if u128::from_le_bytes(field(bytes, 16)) >> 32 != 0 {
            return Err(WireError::BadHeader("kinds beside a descriptor count"));
        }
        let nfds = u32::from_le_bytes(field(bytes, 16)) as usize;
        if nfds <= KINDS || nfds > MAX_FDS + usize::from(body.has_carrier()) {
            return Err(WireError::BadHeader("descriptor count out of range"));
        }
        Ok(nfds)
    }

    /// The kinds of `nfds` descriptors of a `body` message: a carrier's
    /// bits at the last if it has one (a channel's are 0).
    fn carrier_bits(body: Body, nfds: usize) -> u128 {
        match nfds.checked_sub(1) {
            Some(last) if body.has_carrier() => (FdKind::Carrier as u128) << (2 * last),
            _ => 0,
        }
    }

    /// What is wrong with `kinds`, which are not [`Self::carrier_bits`].
    #[cold]
    fn kinds_fault(body: Body, nfds: usize, kinds: u128) -> WireError {
        for i in 0..nfds.min(KINDS) {
            let kind = match FdKind::from_bits(((kinds >> (2 * i)) & 0b11) as u8) {
                Ok(kind) => kind,
                Err(e) => return e,
            };
            let carrier_expected = i + 1 == nfds && body.has_carrier();
            if (kind == FdKind::Carrier) != carrier_expected {
                break;
            }
        }
        WireError::BadHeader("carrier descriptor misplaced or missing")
    }

    #[cold]
    fn decode_slow(bytes: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        if u32::from_le_bytes(field(bytes, 0)) != MAGIC {
            return Err(WireError::BadHeader("bad magic"));
        }
        if bytes[7] & !STREAMED != 0 {
            return Err(WireError::BadHeader("unknown flag"));
        }
        let body = match bytes[4] {
            0 => Body::Inline,
            1 => Body::Fragmented,
            2 => Body::SharedMemory,
            3 => Body::Kept,
            4 => Body::Ring,
            5 => Body::Wake,
            _ => return Err(WireError::BadHeader("unknown body")),
        };
        let nfds = usize::from(bytes[5]);
        let (nfds, kinds) = match nfds <= KINDS {
            true => (nfds, u128::from_le_bytes(field(bytes, 16))),
            false => (Self::decode_count(bytes, body)?, 0),
        };
        let total = u64::from_le_bytes(field(bytes, 8));
        if nfds < KINDS && kinds >> (2 * nfds) != 0 {
            return Err(WireError::BadHeader("kinds beyond the descriptor count"));
        }
        let tag = u64::from_le_bytes(field(bytes, 32));
        let skew = bytes[6];
        if usize::from(skew) >= SKEW_ALIGN {
            return Err(WireError::BadHeader("skew past a cache line"));
        }
        let streamed = bytes[7] & STREAMED != 0;
        if (skew != 0 || streamed) && !matches!(body, Body::SharedMemory | Body::Kept) {
            return Err(WireError::BadHeader("skew or stream without a region"));
        }
        let header = Header {
            body,
            nfds,
            total,
            kinds,
            tag,
            skew,
            streamed,
        };
        // Every descriptor a channel's, but the last a carrier if the body
        // has one: one word compared, not a kind a descriptor. (A message
        // of more than `KINDS` has no kinds: all channels.)
        if nfds <= KINDS && kinds != Self::carrier_bits(body, nfds) {
            return Err(Self::kinds_fault(body, nfds, kinds));
        }
        if body.has_carrier() && nfds == 0 {
            return Err(WireError::BadHeader("carrier descriptor missing"));
        }
        if body == Body::Kept && nfds != 0 {
            return Err(WireError::BadHeader("descriptors with a kept region"));
        }
        let control = match body {
            Body::Ring => nfds != 1,
            Body::Wake => nfds != 0,
            _ => false,
        };
        if control || (matches!(body, Body::Ring | Body::Wake) && total != 0) {
            return Err(WireError::BadHeader("a ring or wake-up that is not one"));
        }
        Ok(header)
    }
}

/// Writes the count of a message of more than [`KINDS`] descriptors in
/// place of its kinds (all implicit, so `kinds` is 0 there).
#[cold]
fn encode_count(out: &mut [u8; HEADER_LEN], nfds: usize) {
    out[5] = MANY;
    out[16..20].copy_from_slice(&(nfds as u32).to_le_bytes());
}

/// The `N` bytes of `bytes` at offset `at` (constant offsets inside the header).
fn field<const N: usize, const L: usize>(bytes: &[u8; L], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_every_body() {
        for (body, channels) in [
            (Body::Inline, 0),
            (Body::Inline, 5),
            (Body::Fragmented, 3),
            (Body::SharedMemory, 63),
            (Body::Kept, 0),
        ] {
            let mut h = Header::new(body, 12345, channels, 0xfeed_beef);
            if matches!(body, Body::SharedMemory | Body::Kept) {
                h = h.in_region(SKEW_ALIGN - 1, true);
            }
            let d = Header::decode(&h.encode()).unwrap();
            assert_eq!(d, h);
            assert_eq!(d.channels(), channels);
            for i in 0..channels {
                assert_eq!(d.kind(i), FdKind::Channel);
            }
            if body.has_carrier() {
                assert_eq!(d.kind(channels), FdKind::Carrier);
            }
        }
        let p = FdPacket {
            count: 7,
            index: 3,
            tag: u64::MAX,
        };
        assert_eq!(FdPacket::decode(&p.encode()), Ok(p));
        assert_eq!(PacketKind::of(&p.encode()), Ok(PacketKind::Fds));
        assert_eq!(
            PacketKind::of(&Header::new(Body::Inline, 0, 0, 0).encode()),
            Ok(PacketKind::Data)
        );
    }

    #[test]
    fn many_descriptors_roundtrip_with_implicit_kinds() {
        for (body, channels) in [
            (Body::Inline, KINDS),
            (Body::Inline, KINDS + 1),
            (Body::Inline, MAX_FDS),
            (Body::SharedMemory, KINDS - 1),
            (Body::SharedMemory, KINDS),
            (Body::Fragmented, 1000),
            (Body::SharedMemory, MAX_FDS),
        ] {
            let h = Header::new(body, 7, channels, 42);
            let bytes = h.encode();
            assert_eq!(Header::decode(&bytes), Ok(h), "{body:?} {channels}");
            let nfds = channels + usize::from(body.has_carrier());
            assert_eq!(h.nfds, nfds);
            assert_eq!(bytes[5] == MANY, nfds > KINDS);
            for i in 0..nfds {
                let carrier = body.has_carrier() && i + 1 == nfds;
                assert_eq!(h.kind(i) == FdKind::Carrier, carrier, "{body:?} {i}");
            }
        }
        // Descriptor packets: every one full but the last.
        assert_eq!(FdPacket::expected(300, 0), FDS_PER_PACKET);
        assert_eq!(FdPacket::expected(300, 1), 300 - FDS_PER_PACKET);
        assert_eq!(FdPacket::expected(300, 2), 0);
        assert_eq!(FdPacket::expected(2 * FDS_PER_PACKET, 1), FDS_PER_PACKET);
        assert_eq!(FdPacket::expected(1, usize::MAX), 0);
    }

    #[test]
    fn rejects_malformed_headers() {
        let good = Header::new(Body::Fragmented, 10, 1, 1).encode();
        let mut bad = good;
        bad[0] ^= 1;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        assert!(PacketKind::of(&bad).is_err());
        let mut bad = good;
        bad[4] = 9;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A skew on a body with no region, a skew too large, the reserved byte.
        let mut bad = good;
        bad[6] = 1;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        let mut bad = Header::new(Body::Kept, 10, 0, 1).encode();
        bad[6] = SKEW_ALIGN as u8;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        let mut bad = good;
        bad[7] = STREAMED;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        let mut bad = Header::new(Body::Kept, 10, 0, 1).encode();
        bad[7] = 2;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A fragmented body whose carrier is not last.
        let mut bad = good;
        bad[16] = 0b0011;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A kind no descriptor has, and a carrier on a body without one,
        // each named.
        let mut bad = Header::new(Body::Inline, 0, 3, 0).encode();
        bad[16] = 0b01_0000;
        let unknown = WireError::BadHeader("unknown descriptor kind");
        assert_eq!(Header::decode(&bad), Err(unknown));
        bad[16] = 0b11_0000;
        let misplaced = WireError::BadHeader("carrier descriptor misplaced or missing");
        assert_eq!(Header::decode(&bad), Err(misplaced));
        // A carrier's body whose last descriptor is a channel.
        let mut bad = good;
        bad[16] = 0;
        assert_eq!(Header::decode(&bad), Err(misplaced));
        // Kinds set for descriptors that are not there.
        let mut bad = Header::new(Body::Inline, 0, 0, 0).encode();
        bad[17] = 1;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A non-inline body with no descriptor at all.
        let mut bad = Header::new(Body::Inline, 0, 0, 0).encode();
        bad[4] = Body::SharedMemory as u8;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A kept region with descriptors.
        let mut bad = Header::new(Body::Inline, 0, 1, 0).encode();
        bad[4] = Body::Kept as u8;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // Too many descriptors announced.
        let mut bad = Header::new(Body::Inline, 0, 0, 0).encode();
        bad[5] = 65;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        // A long count where a short one fits, past the limit, or with kinds.
        let many = |count: u32| {
            let mut bad = Header::new(Body::Inline, 0, 0, 0).encode();
            bad[5] = MANY;
            bad[16..20].copy_from_slice(&count.to_le_bytes());
            bad
        };
        assert!(Header::decode(&many(KINDS as u32 + 1)).is_ok());
        for count in [0, 1, KINDS as u32, MAX_FDS as u32 + 1, u32::MAX] {
            assert!(matches!(
                Header::decode(&many(count)),
                Err(WireError::BadHeader(_))
            ));
        }
        let mut bad = many(300);
        bad[20] = 1;
        assert!(matches!(Header::decode(&bad), Err(WireError::BadHeader(_))));
        let mut bad = many(MAX_FDS as u32 + 1);
        bad[4] = Body::SharedMemory as u8;
        assert!(Header::decode(&bad).is_ok(), "the carrier past the limit");
        // Descriptor packets counting none, or more than a packet carries.
        for count in [0u16, FDS_PER_PACKET as u16 + 1, u16::MAX] {
            let mut bad = FdPacket::first(1, 9).encode();
            bad[4..6].copy_from_slice(&count.to_le_bytes());
            assert!(FdPacket::decode(&bad).is_err());
        }
        // Descriptor packets of the wrong size or magic.
        assert!(FdPacket::decode(&[0; 15]).is_err());
        assert!(FdPacket::decode(&[0; 16]).is_err());
        assert!(PacketKind::of(&[1, 2]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), HEADER_LEN)) {
            let header: [u8; HEADER_LEN] = bytes.clone().try_into().unwrap();
            if let Ok(h) = Header::decode(&header) {
                proptest::prop_assert_eq!(h.encode(), header);
            }
            if let Ok(p) = FdPacket::decode(&bytes[..FD_PACKET_LEN]) {
                proptest::prop_assert_eq!(&p.encode()[..], &bytes[..FD_PACKET_LEN]);
            }
            let _ = PacketKind::of(&bytes);
        }

        #[test]
        fn the_fast_path_agrees_with_every_check(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), HEADER_LEN),
            nfds in 0u8..=255,
            shaped in proptest::prelude::any::<bool>(),
        ) {
            let mut header: [u8; HEADER_LEN] = bytes.try_into().unwrap();
            if shaped {
                // What the fast path looks for, but for the count.
                header[..4].copy_from_slice(&MAGIC.to_le_bytes());
                header[4] = 0;
                header[5] = nfds;
                header[6] = 0;
                header[7] = 0;
                header[16..32].fill(0);
            }
            proptest::prop_assert_eq!(Header::decode(&header), Header::decode_slow(&header));
        }
    }
}
