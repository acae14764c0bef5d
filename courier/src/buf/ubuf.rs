//! Kinds 0 and 3: one contiguous buffer ([`Ubuf`], [`UbufMut`]) and a
//! shared-memory mapping ([`Mapping`], [`MappingMut`]).
//!
//! A mapping is a contiguous buffer whose memory came from `mmap` rather than
//! from a Rust borrow, so it wraps the buffer kinds and differs only in how it
//! is built (`from_raw_parts`, in `raw.rs`) and in its kind number.

use std::fmt;
use std::io::IoSlice;
use std::mem::MaybeUninit;

use super::raw::{self, RawIoVec};

// ===== Ubuf: source =====

/// A source over one contiguous buffer (kind 0, Linux `ITER_UBUF`).
///
/// The common case of a send: one buffer, no segment array to walk.
#[derive(Clone, Debug)]
pub struct Ubuf<'a> {
    /// The bytes not consumed yet.
    rest: &'a [u8],
}

impl<'a> Ubuf<'a> {
    /// A source yielding the bytes of `buf`.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Self { rest: buf }
    }

    /// Bytes not consumed yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Consumes `n` bytes without reading them (after `sendmsg` sent `n`).
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.rest.len(), "advance past the end of the buffer");
        self.rest = &self.rest[n..];
    }

    /// The unconsumed bytes of the current segment (empty when done).
    #[inline]
    pub fn chunk(&self) -> &'a [u8] {
        self.rest
    }

    /// Copies `min(dst.len(), remaining)` bytes out of the buffer into `dst`
    /// and consumes them; returns the count.
    #[inline]
    pub fn copy_from_iter(&mut self, dst: &mut [u8]) -> usize {
        // The common case fills all of `dst` (see `UbufMut::copy_to_iter`).
        let n = if dst.len() <= self.rest.len() {
            dst.copy_from_slice(&self.rest[..dst.len()]);
            dst.len()
        } else {
            let n = self.rest.len();
            dst[..n].copy_from_slice(self.rest);
            n
        };
        self.rest = &self.rest[n..];
        n
    }

    /// Writes the unconsumed bytes into `out` as (at most) one `IoSlice`;
    /// returns the number of entries written.
    #[inline]
    pub fn io_slices(&self, out: &mut [IoSlice<'a>]) -> usize {
        match out.first_mut() {
            Some(slot) if !self.rest.is_empty() => {
                *slot = IoSlice::new(self.rest);
                1
            }
            _ => 0,
        }
    }
}

// ===== Mapping: source =====

/// A source over a shared-memory mapping (kind 3).
///
/// Built from a borrow ([`Mapping::new`]) or from the raw base and length of a
/// mapping ([`Mapping::from_raw_parts`], `unsafe`). Behaves like [`Ubuf`].
#[derive(Clone, Debug)]
pub struct Mapping<'a> {
    pub(super) inner: Ubuf<'a>,
}

impl<'a> Mapping<'a> {
    /// A mapping source over bytes the caller already borrows.
    #[inline]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            inner: Ubuf::new(bytes),
        }
    }

    /// Bytes not consumed yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.inner.remaining()
    }

    /// Consumes `n` bytes without reading them.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.inner.advance(n);
    }

    /// The unconsumed bytes of the mapping.
    #[inline]
    pub fn chunk(&self) -> &'a [u8] {
        self.inner.chunk()
    }

    /// See [`Ubuf::copy_from_iter`].
    #[inline]
    pub fn copy_from_iter(&mut self, dst: &mut [u8]) -> usize {
        self.inner.copy_from_iter(dst)
    }

    /// See [`Ubuf::io_slices`].
    #[inline]
    pub fn io_slices(&self, out: &mut [IoSlice<'a>]) -> usize {
        self.inner.io_slices(out)
    }
}

// ===== UbufMut: destination =====

/// A destination over one contiguous, possibly uninitialised buffer (kind 0),
/// typically a `Vec`'s spare capacity.
///
/// Invariant: `buf[..filled]` is initialised. Safe code only grows `filled` by
/// writing ([`UbufMut::copy_to_iter`]); the `unsafe` [`UbufMut::advance`]
/// grows it on the caller's word that the kernel wrote those bytes.
pub struct UbufMut<'a> {
    /// The whole buffer lent to the iterator.
    pub(super) buf: &'a mut [MaybeUninit<u8>],
    /// How many bytes at the front of `buf` have been written.
    pub(super) filled: usize,
}

impl<'a> UbufMut<'a> {
    /// A destination over `buf`; nothing in it needs to be initialised.
    #[inline]
    pub fn new(buf: &'a mut [MaybeUninit<u8>]) -> Self {
        Self { buf, filled: 0 }
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.filled
    }

    /// Bytes written so far, all at the front of the buffer.
    #[inline]
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Copies `min(src.len(), remaining)` bytes of `src` into the buffer;
    /// returns the count.
    #[inline]
    pub fn copy_to_iter(&mut self, src: &[u8]) -> usize {
        let room = &mut self.buf[self.filled..];
        // The common case copies all of `src`: a length the caller often
        // knows at compile time, which turns a small copy into a few moves.
        let n = if src.len() <= room.len() {
            room[..src.len()].copy_from_slice(raw::as_uninit(src));
            src.len()
        } else {
            let n = room.len();
            room.copy_from_slice(raw::as_uninit(&src[..n]));
            n
        };
        self.filled += n;
        n
    }

    /// Writes the room left into `out` as (at most) one [`RawIoVec`], for
    /// `recvmsg`; returns the number of entries written.
    ///
    /// The iovec borrows `self` mutably, so nothing else can touch the buffer
    /// while the kernel may write to it.
    #[inline]
    pub fn io_vecs<'s>(&'s mut self, out: &mut [RawIoVec<'s>]) -> usize {
        let rest = &mut self.buf[self.filled..];
        match out.first_mut() {
            Some(slot) if !rest.is_empty() => {
                *slot = RawIoVec::new(rest.as_mut_ptr(), rest.len());
                1
            }
            _ => 0,
        }
    }

    /// Whether this iterator covers exactly the `len` bytes at `base`
    /// (the identity check of [`fill_spare`](super::fill_spare)).
    #[inline]
    pub(super) fn covers(&self, base: *const MaybeUninit<u8>, len: usize) -> bool {
        std::ptr::eq(self.buf.as_ptr(), base) && self.buf.len() == len
    }
}

impl fmt::Debug for UbufMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UbufMut")
            .field("len", &self.buf.len())
            .field("filled", &self.filled)
            .finish()
    }
}

// ===== MappingMut: destination =====

/// A destination over a writable shared-memory mapping (kind 3).
///
/// Built from a borrow ([`MappingMut::new`]) or from the raw base and length
/// of a mapping ([`MappingMut::from_raw_parts`], `unsafe`). Behaves like
/// [`UbufMut`].
#[derive(Debug)]
pub struct MappingMut<'a> {
    pub(super) inner: UbufMut<'a>,
}

impl<'a> MappingMut<'a> {
    /// A mapping destination over memory the caller already borrows.
    #[inline]
    pub fn new(buf: &'a mut [MaybeUninit<u8>]) -> Self {
        Self {
            inner: UbufMut::new(buf),
        }
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.inner.remaining()
    }

    /// Bytes written so far, all at the front of the mapping.
    #[inline]
    pub fn filled(&self) -> usize {
        self.inner.filled()
    }

    /// See [`UbufMut::copy_to_iter`].
    #[inline]
    pub fn copy_to_iter(&mut self, src: &[u8]) -> usize {
        self.inner.copy_to_iter(src)
    }

    /// See [`UbufMut::io_vecs`].
    #[inline]
    pub fn io_vecs<'s>(&'s mut self, out: &mut [RawIoVec<'s>]) -> usize {
        self.inner.io_vecs(out)
    }
}
