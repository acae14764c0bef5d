//! [`IoIter`]: the source iterator, one enum over every kind.

use std::io::IoSlice;

use super::{Chunks, Discard, Mapping, Slices, Ubuf};

/// A source of bytes to send, over any kind of buffer.
///
/// The variants are numbered densely, hottest first (`#[repr(u8)]` pins the
/// tag to 0..=4), so every method is one `match` whose arms the compiler
/// inlines: no indirect call on the hot path. The copy is
/// `#[inline(always)]`, and each kind's common case (the copy ends inside the
/// current segment) is a few instructions around one `memcpy`, with segment
/// walks out of line: the whole dispatch then sits in the caller's loop (in
/// the `iter` suite of `courier-bench` this beats a vtable and a
/// function-pointer table). See the [module docs](super) for the kinds and
/// the naming of the copies.
///
/// A source is `Clone`: cloning saves the position (Linux `iov_iter_state`),
/// and assigning the clone back restores it.
#[derive(Clone, Debug)]
#[repr(u8)]
pub enum IoIter<'a> {
    /// 0: one contiguous buffer (`ITER_UBUF`).
    Ubuf(Ubuf<'a>) = 0,
    /// 1: borrowed `IoSlice`s (`ITER_IOVEC`).
    Slices(Slices<'a>) = 1,
    /// 2: owned chunks (`ITER_BVEC`).
    Chunks(Chunks<'a>) = 2,
    /// 3: a shared-memory mapping.
    Mapping(Mapping<'a>) = 3,
    /// 4: zeros (`ITER_DISCARD` read as a source).
    Discard(Discard) = 4,
}

/// Expands to a `match` that runs `$body` with `$k` bound to the kind.
macro_rules! dispatch {
    ($self:expr, $k:ident => $body:expr) => {
        match $self {
            IoIter::Ubuf($k) => $body,
            IoIter::Slices($k) => $body,
            IoIter::Chunks($k) => $body,
            IoIter::Mapping($k) => $body,
            IoIter::Discard($k) => $body,
        }
    };
}

impl<'a> IoIter<'a> {
    /// A source over one buffer.
    #[inline]
    pub fn ubuf(buf: &'a [u8]) -> Self {
        IoIter::Ubuf(Ubuf::new(buf))
    }

    /// A source over borrowed slices, in order (empty slices are skipped).
    #[inline]
    pub fn slices(slices: &'a [IoSlice<'a>]) -> Self {
        IoIter::Slices(Slices::new(slices))
    }

    /// A source over owned chunks, in order (empty chunks are skipped).
    #[inline]
    pub fn chunks(chunks: &'a [Vec<u8>]) -> Self {
        IoIter::Chunks(Chunks::new(chunks))
    }

    /// A source over a shared-memory mapping.
    #[inline]
    pub fn mapping(mapping: Mapping<'a>) -> Self {
        IoIter::Mapping(mapping)
    }

    /// A source of `len` zero bytes.
    #[inline]
    pub fn discard(len: usize) -> Self {
        IoIter::Discard(Discard::new(len))
    }

    /// Bytes not consumed yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        dispatch!(self, k => k.remaining())
    }

    /// Consumes `n` bytes without reading them: after `sendmsg` sent `n`
    /// bytes of what [`io_slices`](Self::io_slices) handed it.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        dispatch!(self, k => k.advance(n))
    }

    /// The unconsumed bytes of the current segment; empty exactly when
    /// `remaining() == 0`.
    #[inline]
    pub fn chunk(&self) -> &'a [u8] {
        dispatch!(self, k => k.chunk())
    }

    /// Copies `min(dst.len(), remaining)` bytes out of the iterator into
    /// `dst` and consumes them; returns the count. (Linux `copy_from_iter`.)
    #[inline(always)]
    pub fn copy_from_iter(&mut self, dst: &mut [u8]) -> usize {
        dispatch!(self, k => k.copy_from_iter(dst))
    }

    /// Writes the unconsumed segments into `out` without copying a byte, the
    /// first one starting where the last [`advance`](Self::advance) stopped;
    /// returns the number of entries written: at most
    /// `min(out.len(), IOV_MAX)`, and 0 only when nothing remains or `out`
    /// is empty.
    ///
    /// The entries borrow the data (`'a`), not the iterator, so one array
    /// serves a whole send loop: `n = io_slices(&mut iov)`,
    /// `sent = sendmsg(&iov[..n])`, `advance(sent)`, until
    /// `remaining() == 0`.
    #[inline]
    pub fn io_slices(&self, out: &mut [IoSlice<'a>]) -> usize {
        dispatch!(self, k => k.io_slices(out))
    }
}

impl<'a> From<&'a [u8]> for IoIter<'a> {
    fn from(buf: &'a [u8]) -> Self {
        IoIter::ubuf(buf)
    }
}

impl<'a> From<&'a [IoSlice<'a>]> for IoIter<'a> {
    fn from(slices: &'a [IoSlice<'a>]) -> Self {
        IoIter::slices(slices)
    }
}

impl<'a> From<&'a [Vec<u8>]> for IoIter<'a> {
    fn from(chunks: &'a [Vec<u8>]) -> Self {
        IoIter::chunks(chunks)
    }
}
