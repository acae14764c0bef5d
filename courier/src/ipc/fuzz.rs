//! Entry points for the fuzz targets of `fuzz/` at the root of the
//! repository: the decoders a peer's bytes reach, called on any bytes, with
//! the checks a target makes of what they return. Built only with the
//! `fuzzing` feature, and no part of the public API.
//!
//! The transport (fragment reassembly, region copy-out, a moved receiver's
//! backlog) is fuzzed through the public API instead: raw packets written
//! into a socket that a courier receiver reads.

use std::cell::Cell;
use std::fmt::Debug;

use serde::de::DeserializeOwned;

use super::config::DecodeLimits;
use super::err::SerDeError;
use super::split::{self, Layout, Parts};
use super::wire::{FdPacket, Header, PacketKind, HEADER_LEN};

/// Decodes the first [`HEADER_LEN`] bytes of `bytes` as a data packet's
/// header (nothing if there are fewer). A header that decodes must encode
/// back to the same bytes, and name the kind of each of its descriptors,
/// the carrier last.
///
/// # Panics
/// If one of those checks fails.
pub fn header(bytes: &[u8]) {
    let _ = PacketKind::of(bytes);
    let Some(raw) = bytes.first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(header) = Header::decode(raw) else {
        return;
    };
    assert_eq!(PacketKind::of(raw), Ok(PacketKind::Data));
    assert_eq!(&header.encode(), raw, "a decoded header encodes back");
    assert_eq!(Header::decode(&header.encode()), Ok(header));
    for i in 0..header.nfds {
        let carrier = header.kind(i) == super::wire::FdKind::Carrier;
        assert_eq!(carrier, header.body.has_carrier() && i + 1 == header.nfds);
    }
}

/// Decodes `bytes` as a descriptor packet. One that decodes must encode back
/// to the same bytes.
///
/// # Panics
/// If it does not.
pub fn fd_packet(bytes: &[u8]) {
    let _ = PacketKind::of(bytes);
    if let Ok(packet) = FdPacket::decode(bytes) {
        assert_eq!(&packet.encode()[..], bytes, "a decoded packet encodes back");
        assert_eq!(PacketKind::of(bytes), Ok(PacketKind::Fds));
    }
}

/// What decoding may do: levels of nesting, and bytes it may allocate.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Levels of nesting.
    pub depth: u32,
    /// Bytes decoding may allocate.
    pub budget: u64,
}

impl From<Limits> for DecodeLimits {
    fn from(l: Limits) -> Self {
        DecodeLimits {
            depth: l.depth,
            budget: l.budget,
        }
    }
}

/// Decodes `payload` as a `T` from one contiguous buffer, as a receiver
/// does when it predicted no byte string; also returns where the first
/// large byte string sat (`(at, len)`), the layout a receiver would predict
/// for the next message.
pub fn decode_whole<T: DeserializeOwned>(
    payload: &[u8],
    limits: Limits,
) -> (Result<T, SerDeError>, Option<(usize, usize)>) {
    let seen = Cell::new(None);
    let parts = Parts {
        head: payload,
        string: None,
        tail: &[],
    };
    let value = split::deserialize(parts, &seen, limits.into());
    (value, seen.get().map(|l: Layout| (l.at, l.len)))
}

/// Decodes `payload` as a `T` as a receiver does that predicted a byte
/// string of `len` bytes at `at` and received it into a buffer of its own
/// (both clamped to the payload).
pub fn decode_split<T: DeserializeOwned>(
    payload: &[u8],
    at: usize,
    len: usize,
    limits: Limits,
) -> Result<T, SerDeError> {
    let at = at.min(payload.len());
    let len = len.min(payload.len() - at);
    let seen = Cell::new(None);
    let parts = Parts {
        head: &payload[..at],
        string: Some(payload[at..at + len].to_vec()),
        tail: &payload[at + len..],
    };
    split::deserialize(parts, &seen, limits.into())
}

/// Decodes `payload` whole and split (where the whole decode saw its byte
/// string, and at `at`, `len`): all three must agree, on the value or on
/// the failure.
///
/// # Panics
/// If they do not.
pub fn decode_agrees<T: DeserializeOwned + PartialEq + Debug>(
    payload: &[u8],
    at: usize,
    len: usize,
    limits: Limits,
) {
    let (whole, seen) = decode_whole::<T>(payload, limits);
    let mut splits = vec![(at, len)];
    splits.extend(seen);
    for (at, len) in splits {
        let split = decode_split::<T>(payload, at, len, limits);
        match (&whole, &split) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "split at {at}+{len}"),
            (Err(_), Err(_)) => {}
            _ => panic!("split at {at}+{len}: whole {whole:?}, split {split:?}"),
        }
    }
}
