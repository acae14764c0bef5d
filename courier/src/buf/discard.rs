//! Kind 4: discard (Linux `ITER_DISCARD`).
//!
//! As a destination it counts bytes and drops them: `copy_to_iter` touches no
//! memory, and for `recvmsg` its iovecs all point at one per-thread sink whose
//! contents are never read. As a source it is a run of zeros (a hole), which
//! is what padding needs.

use std::cell::UnsafeCell;
use std::io::IoSlice;
use std::mem::MaybeUninit;

use super::raw::RawIoVec;
use super::IOV_MAX;

/// Bytes of the per-thread receive sink, and of the static zero block: one
/// iovec covers at most this much of a discard.
const SINK_LEN: usize = 64 * 1024;

/// What a discard source reads as.
static ZEROS: [u8; SINK_LEN] = [0; SINK_LEN];

thread_local! {
    /// Where `recvmsg` writes the bytes of a [`Discard`] destination.
    ///
    /// Only the kernel ever writes it and nobody reads it; `UnsafeCell` makes
    /// those writes legal through a pointer derived from a shared borrow. It
    /// is allocated on first use, so threads that never discard through
    /// `recvmsg` pay nothing. [`RawIoVec`] is `!Send`, so a pointer into this
    /// thread's sink cannot reach another thread.
    static SINK: Box<[UnsafeCell<MaybeUninit<u8>>]> =
        (0..SINK_LEN).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
}

/// Counts and drops bytes as a destination; reads as zeros as a source.
#[derive(Clone, Debug)]
pub struct Discard {
    /// Length at construction.
    len: usize,
    /// Bytes left.
    remaining: usize,
}

impl Discard {
    /// A discard of `len` bytes.
    #[inline]
    pub fn new(len: usize) -> Self {
        Self {
            len,
            remaining: len,
        }
    }

    /// Bytes left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Bytes consumed so far: dropped (as a destination) or produced as
    /// zeros (as a source).
    #[inline]
    pub fn filled(&self) -> usize {
        self.len - self.remaining
    }

    /// Consumes `n` bytes. Safe in both directions: a discard has no memory
    /// that could be left uninitialised.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining, "advance past the end of the discard");
        self.remaining -= n;
    }

    // ----- as a destination -----

    /// Counts and drops `min(src.len(), remaining)` bytes; returns the count.
    #[inline]
    pub fn copy_to_iter(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.remaining);
        self.remaining -= n;
        n
    }

    /// Writes iovecs covering the bytes left into `out`, every one pointing at
    /// this thread's sink; returns the number of entries written, at most
    /// `min(out.len(), IOV_MAX)`.
    pub fn io_vecs<'s>(&'s mut self, out: &mut [RawIoVec<'s>]) -> usize {
        if self.remaining == 0 || out.is_empty() {
            return 0;
        }
        let sink = SINK.with(|s| UnsafeCell::raw_get(s.as_ptr()));
        fill_repeated(self.remaining, out, |len| RawIoVec::new(sink, len))
    }

    // ----- as a source -----

    /// Zeros, as many as the next iovec would carry (empty when done).
    #[inline]
    pub fn chunk(&self) -> &'static [u8] {
        &ZEROS[..self.remaining.min(SINK_LEN)]
    }

    /// Writes `min(dst.len(), remaining)` zeros into `dst` and consumes them;
    /// returns the count.
    #[inline]
    pub fn copy_from_iter(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.remaining);
        dst[..n].fill(0);
        self.remaining -= n;
        n
    }

    /// Writes `IoSlice`s of zeros covering the bytes left into `out`; returns
    /// the number of entries written, at most `min(out.len(), IOV_MAX)`.
    pub fn io_slices<'a>(&self, out: &mut [IoSlice<'a>]) -> usize {
        fill_repeated(self.remaining, out, |len| IoSlice::new(&ZEROS[..len]))
    }
}

/// Fills `out` with entries of at most `SINK_LEN` bytes each until `len`
/// bytes are covered or `min(out.len(), IOV_MAX)` entries are written.
fn fill_repeated<E>(mut len: usize, out: &mut [E], entry: impl Fn(usize) -> E) -> usize {
    let max = out.len().min(IOV_MAX);
    let mut filled = 0;
    while len > 0 && filled < max {
        let k = len.min(SINK_LEN);
        out[filled] = entry(k);
        filled += 1;
        len -= k;
    }
    filled
}
