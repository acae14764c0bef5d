//! Kinds 1 and 2: a list of segments, borrowed slices ([`Slices`],
//! [`SlicesMut`]) or owned chunks ([`Chunks`], [`ChunksMut`]).
//!
//! Both kinds walk an array of segments with one cursor, so they share one
//! generic implementation, [`Segments`] / [`SegmentsMut`], monomorphised per
//! segment type. The cursor is the kernel's: a segment index, an offset into
//! that segment, and a count of bytes left.
//!
//! ```text
//!   segs:   [ seg 0 ][ seg 1 (empty) ][ seg 2          ][ seg 3 ]
//!                                       ^ seg = 2
//!                                       |<- off ->|
//!                                                 |<---- remaining ---->|
//! ```
//!
//! Cursor invariant: while `remaining > 0`, `segs[seg]` is non-empty and
//! `off < segs[seg].len()`. Empty segments are skipped as soon as the cursor
//! reaches them, so every loop below makes progress on every turn.

use std::fmt;
use std::io::IoSlice;
use std::mem::MaybeUninit;

use super::raw::{self, RawIoVec};
use super::IOV_MAX;

mod sealed {
    pub trait Sealed {}
}

/// A segment type a source [`Segments`] can walk: something that is a run of
/// initialised bytes. Sealed.
pub trait Segment: sealed::Sealed {
    /// The segment's bytes.
    fn bytes(&self) -> &[u8];
}

/// A segment type a destination [`SegmentsMut`] can walk: a run of possibly
/// uninitialised bytes that the iterator may overwrite. Sealed.
pub trait SegmentMut: sealed::Sealed {
    /// The segment's memory, for reading the part known to be initialised.
    fn uninit(&self) -> &[MaybeUninit<u8>];

    /// The segment's memory, for writing.
    fn uninit_mut(&mut self) -> &mut [MaybeUninit<u8>];

    /// The segment's length in bytes.
    #[inline]
    fn len(&self) -> usize {
        self.uninit().len()
    }

    /// Whether the segment has no bytes.
    #[inline]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl sealed::Sealed for IoSlice<'_> {}
impl Segment for IoSlice<'_> {
    #[inline]
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl sealed::Sealed for Vec<u8> {}
impl Segment for Vec<u8> {
    #[inline]
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl sealed::Sealed for Box<[u8]> {}
impl Segment for Box<[u8]> {
    #[inline]
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl sealed::Sealed for &[u8] {}
impl Segment for &[u8] {
    #[inline]
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl sealed::Sealed for &mut [MaybeUninit<u8>] {}
impl SegmentMut for &mut [MaybeUninit<u8>] {
    #[inline]
    fn uninit(&self) -> &[MaybeUninit<u8>] {
        self
    }
    #[inline]
    fn uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        self
    }
}

impl sealed::Sealed for Box<[MaybeUninit<u8>]> {}
impl SegmentMut for Box<[MaybeUninit<u8>]> {
    #[inline]
    fn uninit(&self) -> &[MaybeUninit<u8>] {
        self
    }
    #[inline]
    fn uninit_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        self
    }
}

/// Kind 1 source: borrowed `IoSlice`s (Linux `ITER_IOVEC`).
pub type Slices<'a> = Segments<'a, IoSlice<'a>>;

/// Kind 2 source: owned chunks (Linux `ITER_BVEC`).
pub type Chunks<'a> = Segments<'a, Vec<u8>>;

/// Kind 1 destination: borrowed uninitialised slices.
pub type SlicesMut<'a> = SegmentsMut<'a, &'a mut [MaybeUninit<u8>]>;

/// Kind 2 destination: owned uninitialised chunks (pages of a pool).
pub type ChunksMut<'a> = SegmentsMut<'a, Box<[MaybeUninit<u8>]>>;

// ===== Segments: source =====

/// A source walking an array of segments.
#[derive(Clone, Debug)]
pub struct Segments<'a, T> {
    /// The segments, including those already consumed.
    segs: &'a [T],
    /// Index of the current segment.
    seg: usize,
    /// Bytes of `segs[seg]` already consumed.
    off: usize,
    /// Bytes left in `segs[seg][off..]` and all later segments.
    remaining: usize,
}

impl<'a, T: Segment> Segments<'a, T> {
    /// A source yielding the bytes of `segs`, in order.
    ///
    /// Panics if they total more than `usize::MAX` bytes (segments that
    /// alias one buffer can, on a 32-bit target).
    pub fn new(segs: &'a [T]) -> Self {
        let remaining = segs
            .iter()
            .try_fold(0usize, |sum, s| sum.checked_add(s.bytes().len()))
            .expect("segments total more than usize::MAX bytes");
        let mut it = Self {
            segs,
            seg: 0,
            off: 0,
            remaining,
        };
        it.skip_empty();
        it
    }

    /// Bytes not consumed yet.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Consumes `n` bytes without reading them (after `sendmsg` sent `n`).
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining, "advance past the end of the segments");
        self.walk(n, |_, _| ());
    }

    /// The unconsumed bytes of the current segment (empty when done).
    #[inline]
    pub fn chunk(&self) -> &'a [u8] {
        let segs: &'a [T] = self.segs;
        match segs.get(self.seg) {
            Some(s) if self.remaining > 0 => &s.bytes()[self.off..],
            _ => &[],
        }
    }

    /// Copies `min(dst.len(), remaining)` bytes out of the segments into
    /// `dst` and consumes them; returns the count.
    #[inline]
    pub fn copy_from_iter(&mut self, dst: &mut [u8]) -> usize {
        // Fast path, inlined: the copy ends inside the current segment.
        if let Some(s) = self.segs.get(self.seg) {
            let rest = &s.bytes()[self.off..];
            if dst.len() < rest.len() {
                dst.copy_from_slice(&rest[..dst.len()]);
                self.off += dst.len();
                self.remaining -= dst.len();
                return dst.len();
            }
        }
        self.copy_from_iter_walk(dst)
    }

    /// The general case of `copy_from_iter`, out of line so that the fast
    /// path stays small enough to inline into every caller.
    #[inline(never)]
    fn copy_from_iter_walk(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.remaining);
        self.walk(n, |piece, done| {
            dst[done..done + piece.len()].copy_from_slice(piece);
        });
        n
    }

    /// Writes the unconsumed segments into `out` as `IoSlice`s, the first one
    /// starting at the cursor (mid-segment after a partial advance); returns
    /// the number of entries written, at most `min(out.len(), IOV_MAX)`.
    pub fn io_slices(&self, out: &mut [IoSlice<'a>]) -> usize {
        let segs: &'a [T] = self.segs;
        let mut filled = 0;
        let mut off = self.off;
        let max = out.len().min(IOV_MAX);
        if self.remaining == 0 {
            return 0;
        }
        for s in &segs[self.seg..] {
            if filled == max {
                break;
            }
            let bytes = &s.bytes()[off..];
            off = 0;
            if !bytes.is_empty() {
                out[filled] = IoSlice::new(bytes);
                filled += 1;
            }
        }
        filled
    }

    /// Moves the cursor over `n <= remaining` bytes, handing each piece (a
    /// part of one segment) and the bytes walked before it to `step`.
    #[inline(always)]
    fn walk(&mut self, n: usize, mut step: impl FnMut(&'a [u8], usize)) {
        let segs: &'a [T] = self.segs;
        let mut done = 0;
        while done < n {
            let rest = &segs[self.seg].bytes()[self.off..];
            let k = rest.len().min(n - done);
            step(&rest[..k], done);
            done += k;
            self.remaining -= k;
            if k == rest.len() {
                self.seg += 1;
                self.off = 0;
                self.skip_empty();
            } else {
                self.off += k;
            }
        }
    }

    /// Restores the cursor invariant after the cursor entered a new segment.
    #[inline]
    fn skip_empty(&mut self) {
        while self.remaining > 0 && self.segs[self.seg].bytes().is_empty() {
            self.seg += 1;
        }
    }
}

// ===== SegmentsMut: destination =====

/// A destination walking an array of possibly uninitialised segments.
///
/// Invariant: the first [`filled`](SegmentsMut::filled) bytes, that is every
/// segment before the cursor and the first `off` bytes of the current one, are
/// initialised. Safe code only moves the cursor by writing
/// ([`SegmentsMut::copy_to_iter`]); the `unsafe` [`SegmentsMut::advance`]
/// moves it on the caller's word that the kernel wrote those bytes.
pub struct SegmentsMut<'a, T> {
    /// The segments, including those already filled.
    pub(super) segs: &'a mut [T],
    /// Index of the current segment.
    seg: usize,
    /// Bytes of `segs[seg]` already written.
    off: usize,
    /// Room left in `segs[seg][off..]` and all later segments.
    remaining: usize,
    /// Total room at construction.
    len: usize,
}

impl<'a, T: SegmentMut> SegmentsMut<'a, T> {
    /// A destination over `segs`, filled in order; nothing in them needs to be
    /// initialised.
    pub fn new(segs: &'a mut [T]) -> Self {
        let len = segs.iter().map(|s| s.len()).sum();
        let mut it = Self {
            segs,
            seg: 0,
            off: 0,
            remaining: len,
            len,
        };
        it.skip_empty();
        it
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Bytes written so far, in segment order.
    #[inline]
    pub fn filled(&self) -> usize {
        self.len - self.remaining
    }

    /// How many bytes at the front of segment `index` have been written (and
    /// so are initialised): all of it for segments before the cursor, a
    /// prefix for the current one, none after. Read them with
    /// [`filled_segment`](Self::filled_segment).
    pub fn filled_in(&self, index: usize) -> usize {
        use std::cmp::Ordering;
        match index.cmp(&self.seg) {
            Ordering::Less => self.segs[index].len(),
            Ordering::Equal => self.off,
            Ordering::Greater => 0,
        }
    }

    /// Copies `min(src.len(), remaining)` bytes of `src` into the segments;
    /// returns the count.
    #[inline]
    pub fn copy_to_iter(&mut self, src: &[u8]) -> usize {
        // Fast path, inlined: the copy ends inside the current segment.
        if let Some(s) = self.segs.get_mut(self.seg) {
            let room = &mut s.uninit_mut()[self.off..];
            if src.len() < room.len() {
                room[..src.len()].copy_from_slice(raw::as_uninit(src));
                self.off += src.len();
                self.remaining -= src.len();
                return src.len();
            }
        }
        self.copy_to_iter_walk(src)
    }

    /// The general case of `copy_to_iter`, out of line so that the fast path
    /// stays small enough to inline into every caller.
    #[inline(never)]
    fn copy_to_iter_walk(&mut self, src: &[u8]) -> usize {
        let n = src.len().min(self.remaining);
        self.walk(n, |piece, done| {
            piece.copy_from_slice(raw::as_uninit(&src[done..done + piece.len()]));
        });
        n
    }

    /// Writes the room left into `out` as [`RawIoVec`]s for `recvmsg`, the
    /// first one starting at the cursor; returns the number of entries
    /// written, at most `min(out.len(), IOV_MAX)`.
    ///
    /// The iovecs borrow `self` mutably, so nothing else can touch the
    /// segments while the kernel may write to them.
    pub fn io_vecs<'s>(&'s mut self, out: &mut [RawIoVec<'s>]) -> usize {
        let mut filled = 0;
        let mut off = self.off;
        let max = out.len().min(IOV_MAX);
        if self.remaining == 0 {
            return 0;
        }
        for s in &mut self.segs[self.seg..] {
            if filled == max {
                break;
            }
            let room = &mut s.uninit_mut()[off..];
            off = 0;
            if !room.is_empty() {
                out[filled] = RawIoVec::new(room.as_mut_ptr(), room.len());
                filled += 1;
            }
        }
        filled
    }

    /// Moves the cursor over `n <= remaining` bytes, handing each piece (a
    /// part of one segment) and the bytes walked before it to `step`.
    ///
    /// This is what makes bytes count as filled: `step` must initialise every
    /// piece. `copy_to_iter` writes them; only the `unsafe` `advance` in
    /// `raw.rs` passes a step that does not, on its caller's promise.
    #[inline(always)]
    pub(super) fn walk(&mut self, n: usize, mut step: impl FnMut(&mut [MaybeUninit<u8>], usize)) {
        assert!(n <= self.remaining, "advance past the end of the segments");
        let mut done = 0;
        while done < n {
            let rest = &mut self.segs[self.seg].uninit_mut()[self.off..];
            let rest_len = rest.len();
            let k = rest_len.min(n - done);
            step(&mut rest[..k], done);
            done += k;
            self.remaining -= k;
            if k == rest_len {
                self.seg += 1;
                self.off = 0;
                self.skip_empty();
            } else {
                self.off += k;
            }
        }
    }

    /// Restores the cursor invariant after the cursor entered a new segment.
    #[inline]
    fn skip_empty(&mut self) {
        while self.remaining > 0 && self.segs[self.seg].is_empty() {
            self.seg += 1;
        }
    }
}

impl<T> fmt::Debug for SegmentsMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentsMut")
            .field("segments", &self.segs.len())
            .field("seg", &self.seg)
            .field("off", &self.off)
            .field("remaining", &self.remaining)
            .finish()
    }
}
