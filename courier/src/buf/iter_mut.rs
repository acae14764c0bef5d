//! [`IoIterMut`]: the destination iterator, one enum over every kind.

use std::mem::MaybeUninit;

use super::raw::RawIoVec;
use super::{ChunksMut, Discard, MappingMut, SlicesMut, UbufMut};

/// Room to receive into, over any kind of buffer, none of which needs to be
/// initialised.
///
/// Variants are numbered like [`IoIter`](super::IoIter)'s. See the
/// [module docs](super) for the kinds and the naming of the copies.
///
/// # Invariant
///
/// The first [`filled`](Self::filled) bytes of the destination (in segment
/// order) are initialised. Safe code moves the cursor only by writing
/// ([`copy_to_iter`](Self::copy_to_iter)); the `unsafe`
/// [`advance`](Self::advance) moves it on the caller's word that the kernel
/// wrote those bytes. So unsafe code may trust `filled()` to `set_len` the
/// buffers it lent, as [`fill_spare`](super::fill_spare) does.
#[derive(Debug)]
#[repr(u8)]
pub enum IoIterMut<'a> {
    /// 0: one contiguous buffer, e.g. a `Vec`'s spare capacity.
    Ubuf(UbufMut<'a>) = 0,
    /// 1: borrowed uninitialised slices.
    Slices(SlicesMut<'a>) = 1,
    /// 2: owned uninitialised chunks.
    Chunks(ChunksMut<'a>) = 2,
    /// 3: a writable shared-memory mapping.
    Mapping(MappingMut<'a>) = 3,
    /// 4: count and drop (`ITER_DISCARD`).
    Discard(Discard) = 4,
}

/// Expands to a `match` that runs `$body` with `$k` bound to the kind.
macro_rules! dispatch {
    ($self:expr, $k:ident => $body:expr) => {
        match $self {
            IoIterMut::Ubuf($k) => $body,
            IoIterMut::Slices($k) => $body,
            IoIterMut::Chunks($k) => $body,
            IoIterMut::Mapping($k) => $body,
            IoIterMut::Discard($k) => $body,
        }
    };
}

impl<'a> IoIterMut<'a> {
    /// A destination over one buffer, e.g. `vec.spare_capacity_mut()`.
    #[inline]
    pub fn ubuf(buf: &'a mut [MaybeUninit<u8>]) -> Self {
        IoIterMut::Ubuf(UbufMut::new(buf))
    }

    /// A destination over borrowed slices, filled in order.
    #[inline]
    pub fn slices(slices: &'a mut [&'a mut [MaybeUninit<u8>]]) -> Self {
        IoIterMut::Slices(SlicesMut::new(slices))
    }

    /// A destination over owned chunks, filled in order.
    #[inline]
    pub fn chunks(chunks: &'a mut [Box<[MaybeUninit<u8>]>]) -> Self {
        IoIterMut::Chunks(ChunksMut::new(chunks))
    }

    /// A destination over a writable shared-memory mapping.
    #[inline]
    pub fn mapping(mapping: MappingMut<'a>) -> Self {
        IoIterMut::Mapping(mapping)
    }

    /// A destination that counts and drops `len` bytes.
    #[inline]
    pub fn discard(len: usize) -> Self {
        IoIterMut::Discard(Discard::new(len))
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> usize {
        dispatch!(self, k => k.remaining())
    }

    /// Bytes written (or, for a discard, dropped) so far. By the type's
    /// invariant, that many bytes at the front of the destination are
    /// initialised.
    #[inline]
    pub fn filled(&self) -> usize {
        dispatch!(self, k => k.filled())
    }

    /// Copies `min(src.len(), remaining)` bytes of `src` into the iterator's
    /// buffers; returns the count. (Linux `copy_to_iter`.)
    #[inline(always)]
    pub fn copy_to_iter(&mut self, src: &[u8]) -> usize {
        dispatch!(self, k => k.copy_to_iter(src))
    }

    /// Writes the room left into `out` as [`RawIoVec`]s for `recvmsg`, the
    /// first one starting where the last write stopped; returns the number of
    /// entries written: at most `min(out.len(), IOV_MAX)`, and 0 only when no
    /// room remains or `out` is empty. A discard's entries point at a
    /// per-thread sink.
    ///
    /// The entries borrow `self` mutably: nothing else touches the memory
    /// while the kernel may write to it. Concatenate several destinations by
    /// filling consecutive parts of one array.
    #[inline]
    pub fn io_vecs<'s>(&'s mut self, out: &mut [RawIoVec<'s>]) -> usize {
        dispatch!(self, k => k.io_vecs(out))
    }
}

impl<'a> From<&'a mut [MaybeUninit<u8>]> for IoIterMut<'a> {
    fn from(buf: &'a mut [MaybeUninit<u8>]) -> Self {
        IoIterMut::ubuf(buf)
    }
}

impl<'a> From<&'a mut [u8]> for IoIterMut<'a> {
    /// A destination over initialised bytes (overwritten, never
    /// de-initialised).
    fn from(buf: &'a mut [u8]) -> Self {
        IoIterMut::Ubuf(UbufMut::from_init(buf))
    }
}
