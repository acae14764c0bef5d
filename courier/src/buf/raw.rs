//! The unsafe corner of `buf`: every `unsafe` block and `unsafe fn` of the
//! module lives here.
//!
//! * [`RawIoVec`]: an iovec over possibly uninitialised memory, laid out
//!   exactly like `struct iovec` (checked at compile time).
//! * The casts between `u8` and `MaybeUninit<u8>` slices, in the two
//!   directions that are sound.
//! * The `unsafe` `advance` of every destination kind: the one place where
//!   bytes count as initialised without Rust having written them.
//! * `from_raw_parts` for the mapping kinds.
//! * [`fill_spare`], which turns "filled" into a `Vec` length.
//!
//! The argument that holds it together is the destination invariant: *the
//! first `filled()` bytes of a destination are initialised.* Safe code can
//! only move a destination's cursor by copying initialised bytes into it;
//! everything else that moves it is an `unsafe fn` below whose contract is
//! exactly that invariant. No `&mut [u8]` over uninitialised memory is ever
//! formed: the kernel gets raw pointers, and Rust code only sees the filled
//! prefix as `&[u8]`.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::mem::{self, MaybeUninit};
use std::{ptr, slice};

use super::{IoIterMut, Mapping, MappingMut, SegmentMut, SegmentsMut, Ubuf, UbufMut};

// ===== RawIoVec =====

/// One `struct iovec { void *iov_base; size_t iov_len; }` lent to the kernel
/// for writing: its memory may be uninitialised.
///
/// `std::io::IoSliceMut` cannot be used for this, because it is a
/// `&mut [u8]`, which must never cover uninitialised bytes. A `RawIoVec`
/// holds only a raw pointer, so the kernel can fill memory that Rust has never
/// written. The lifetime ties it to the mutable borrow of the destination that
/// produced it, and it is neither `Send` nor `Sync` (a discard's entries point
/// at a per-thread sink).
///
/// The layout equals `libc::iovec` (asserted at compile time), so an array of
/// them is an iovec array: pass [`RawIoVec::as_iovecs`] as `msg_iov`.
///
/// While entries are alive, the destination that lent them cannot be used:
///
/// ```compile_fail
/// use courier::buf::{RawIoVec, UbufMut};
/// use std::mem::MaybeUninit;
///
/// let mut mem = [MaybeUninit::uninit(); 8];
/// let mut room = UbufMut::new(&mut mem);
/// let mut iov = [RawIoVec::EMPTY; 1];
/// room.io_vecs(&mut iov);
/// room.copy_to_iter(b"racing the kernel"); // error: `room` is still lent
/// drop(iov);
/// ```
///
/// and they cannot leave the thread (a discard's point at a per-thread sink):
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// send(courier::buf::RawIoVec::EMPTY);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawIoVec<'a> {
    /// `iov_base`.
    base: *mut MaybeUninit<u8>,
    /// `iov_len`.
    len: usize,
    /// The destination this entry was lent from.
    _lent: PhantomData<&'a mut [MaybeUninit<u8>]>,
}

// `RawIoVec` is `struct iovec`: same size, alignment and field offsets.
const _: () = {
    assert!(mem::size_of::<RawIoVec<'static>>() == mem::size_of::<libc::iovec>());
    assert!(mem::align_of::<RawIoVec<'static>>() == mem::align_of::<libc::iovec>());
    assert!(mem::offset_of!(RawIoVec<'static>, base) == mem::offset_of!(libc::iovec, iov_base));
    assert!(mem::offset_of!(RawIoVec<'static>, len) == mem::offset_of!(libc::iovec, iov_len));
};

impl<'a> RawIoVec<'a> {
    /// An entry covering nothing, to initialise arrays:
    /// `[RawIoVec::EMPTY; 16]`.
    pub const EMPTY: Self = Self {
        base: ptr::null_mut(),
        len: 0,
        _lent: PhantomData,
    };

    /// An entry over `len` bytes at `base`. Building one is safe; what makes
    /// it usable is the `&'s mut` borrow its caller (an `io_vecs`) holds.
    #[inline]
    pub(super) fn new(base: *mut MaybeUninit<u8>, len: usize) -> Self {
        Self {
            base,
            len,
            _lent: PhantomData,
        }
    }

    /// `iov_base`.
    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.base.cast()
    }

    /// `iov_len`.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `iov_len` is 0.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `vecs` as the `struct iovec *` that `recvmsg`'s `msg_iov` (or `readv`)
    /// takes. The pointer is valid while `vecs` is, and the memory it
    /// describes while the destinations that filled `vecs` stay borrowed.
    #[inline]
    pub fn as_iovecs(vecs: &mut [RawIoVec<'a>]) -> *mut libc::iovec {
        vecs.as_mut_ptr().cast()
    }
}

impl Default for RawIoVec<'_> {
    fn default() -> Self {
        Self::EMPTY
    }
}

// ===== casts between u8 and MaybeUninit<u8> =====

/// Views initialised bytes as possibly uninitialised ones, to copy them into
/// a destination with `copy_from_slice`.
#[inline(always)]
pub(super) fn as_uninit(bytes: &[u8]) -> &[MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the size and alignment of `u8`, and every
    // `u8` is a valid `MaybeUninit<u8>`. The view is shared, so nothing can
    // write an uninitialised value back through it.
    unsafe { &*(ptr::from_ref(bytes) as *const [MaybeUninit<u8>]) }
}

impl<'a> UbufMut<'a> {
    /// A destination over initialised bytes, which it overwrites.
    ///
    /// Receiving into memory that is initialised already is always allowed;
    /// this is also how a caller makes [`UbufMut::advance`]'s contract
    /// trivially true.
    #[inline]
    pub fn from_init(buf: &'a mut [u8]) -> Self {
        // The caller's `&mut [u8]` requires the bytes to stay initialised, and
        // they do: the view never leaves this `UbufMut`, which writes through it
        // only copies of initialised bytes (`copy_to_iter`) and lends it only to
        // the kernel (`io_vecs`), which writes bytes too.
        // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; initialised, as above.
        let buf = unsafe { &mut *(ptr::from_mut(buf) as *mut [MaybeUninit<u8>]) };
        Self::new(buf)
    }

    /// The bytes written so far.
    #[inline]
    pub fn filled_bytes(&self) -> &[u8] {
        let filled = &self.buf[..self.filled];
        // SAFETY: by the `UbufMut` invariant, `buf[..filled]` is
        // initialised, and `MaybeUninit<u8>` has the layout of `u8`.
        unsafe { &*(ptr::from_ref(filled) as *const [u8]) }
    }

    /// Records that the next `n` bytes were written outside Rust, by the
    /// kernel after `recvmsg` returned `n` for this iterator's
    /// [`io_vecs`](UbufMut::io_vecs).
    ///
    /// # Safety
    /// The caller must ensure:
    /// - the first `n` bytes of the room left (where `io_vecs` pointed) are
    ///   initialised.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub unsafe fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining(), "advance past the end of the buffer");
        self.filled += n;
    }
}

impl<'a, T: SegmentMut> SegmentsMut<'a, T> {
    /// The bytes written so far into segment `index`
    /// ([`filled_in`](SegmentsMut::filled_in) of them).
    ///
    /// # Panics
    /// If `index` is out of bounds.
    pub fn filled_segment(&self, index: usize) -> &[u8] {
        let filled = &self.segs[index].uninit()[..self.filled_in(index)];
        // SAFETY: by the `SegmentsMut` invariant, the first `filled_in(index)`
        // bytes of segment `index` are initialised, and `MaybeUninit<u8>`
        // has the layout of `u8`.
        unsafe { &*(ptr::from_ref(filled) as *const [u8]) }
    }

    /// Records that the next `n` bytes were written outside Rust, by the
    /// kernel after `recvmsg` returned `n` for this iterator's
    /// [`io_vecs`](SegmentsMut::io_vecs).
    ///
    /// # Safety
    /// The caller must ensure:
    /// - the first `n` bytes of the room left, in segment order (where the
    ///   entries of `io_vecs` pointed), are initialised.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub unsafe fn advance(&mut self, n: usize) {
        // The step writes nothing: the caller vouches for the bytes.
        self.walk(n, |_, _| ());
    }
}

// ===== Mapping =====

impl<'a> Mapping<'a> {
    /// A mapping source over `len` bytes at `base`, e.g. a region of a
    /// sealed `memfd` mapped with `mmap`.
    ///
    /// # Safety
    /// The caller must ensure, as for [`slice::from_raw_parts`]:
    /// - `base` is valid for reads of `len` bytes for `'a` (mapped, and
    ///   unmapped only after `'a`), unless `len == 0`;
    /// - the bytes are not written during `'a`, by this process or by any
    ///   other process sharing the mapping (a sealed or not-yet-shared
    ///   region);
    /// - `len <= isize::MAX`.
    #[inline]
    pub unsafe fn from_raw_parts(base: *const u8, len: usize) -> Self {
        if len == 0 {
            return Self::new(&[]);
        }
        // SAFETY: the caller's contract is `from_raw_parts`' (u8 needs no
        // alignment, and mapped memory is initialised).
        let bytes = unsafe { slice::from_raw_parts(base, len) };
        Self {
            inner: Ubuf::new(bytes),
        }
    }
}

impl<'a> MappingMut<'a> {
    /// A mapping destination over `len` bytes at `base`, e.g. a region of a
    /// `memfd` mapped writable with `mmap`.
    ///
    /// # Safety
    /// The caller must ensure, as for [`slice::from_raw_parts_mut`]:
    /// - `base` is valid for reads and writes of `len` bytes for `'a`
    ///   (mapped writable, and unmapped only after `'a`), unless `len == 0`;
    /// - nothing else reads or writes those bytes during `'a`, in this
    ///   process or in any other process sharing the mapping;
    /// - `len <= isize::MAX`.
    #[inline]
    pub unsafe fn from_raw_parts(base: *mut u8, len: usize) -> Self {
        if len == 0 {
            return Self::new(&mut []);
        }
        // SAFETY: the caller's contract is `from_raw_parts_mut`'s; the bytes
        // need not be initialised since they are `MaybeUninit`.
        let buf = unsafe { slice::from_raw_parts_mut(base.cast::<MaybeUninit<u8>>(), len) };
        Self::new(buf)
    }

    /// The bytes written so far.
    #[inline]
    pub fn filled_bytes(&self) -> &[u8] {
        self.inner.filled_bytes()
    }

    /// See [`UbufMut::advance`].
    ///
    /// # Safety
    /// The caller must ensure:
    /// - the first `n` bytes of the room left are initialised.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub unsafe fn advance(&mut self, n: usize) {
        // SAFETY: the caller's contract is the inner buffer's.
        unsafe { self.inner.advance(n) }
    }
}

// ===== IoIterMut =====

impl IoIterMut<'_> {
    /// Records that the next `n` bytes were written outside Rust: after
    /// `recvmsg` returned `n` for entries produced by
    /// [`io_vecs`](IoIterMut::io_vecs), or when the destination was built
    /// from initialised memory.
    ///
    /// Bytes of a discard need no initialising; advancing one is always safe
    /// (use [`Discard::advance`](super::Discard::advance) directly).
    ///
    /// # Safety
    /// The caller must ensure:
    /// - the first `n` bytes of the room left, in segment order, are
    ///   initialised.
    ///
    /// # Panics
    /// If `n > self.remaining()`.
    #[inline]
    pub unsafe fn advance(&mut self, n: usize) {
        match self {
            // SAFETY: the caller's contract, forwarded to the kind.
            IoIterMut::Ubuf(k) => unsafe { k.advance(n) },
            // SAFETY: the caller's contract, forwarded to the kind.
            IoIterMut::Slices(k) => unsafe { k.advance(n) },
            // SAFETY: the caller's contract, forwarded to the kind.
            IoIterMut::Chunks(k) => unsafe { k.advance(n) },
            // SAFETY: the caller's contract, forwarded to the kind.
            IoIterMut::Mapping(k) => unsafe { k.advance(n) },
            IoIterMut::Discard(k) => k.advance(n),
        }
    }
}

// ===== fill_spare =====

/// Lends `vec`'s spare capacity to `f` as a [`UbufMut`], then grows
/// `vec.len()` by the bytes `f` filled. Nothing is zeroed first.
///
/// ```
/// use courier::buf::fill_spare;
///
/// let mut v = Vec::with_capacity(16);
/// v.extend_from_slice(b"ab");
/// let n = fill_spare(&mut v, |room| room.copy_to_iter(b"cdef"));
/// assert_eq!((n, &v[..]), (4, &b"abcdef"[..]));
/// ```
///
/// To receive, `f` fills iovecs with [`UbufMut::io_vecs`] (and with more
/// destinations, e.g. a discard tail, after them), calls `recvmsg`, and
/// records what arrived with the `unsafe` [`UbufMut::advance`].
///
/// # Panics
/// If `f` replaced the iterator it was lent (e.g. with `mem::swap`) by one
/// over other memory; `vec` is left unchanged then.
pub fn fill_spare<R>(vec: &mut Vec<u8>, f: impl FnOnce(&mut UbufMut<'_>) -> R) -> R {
    let len = vec.len();
    let spare = vec.spare_capacity_mut();
    let (base, room) = (spare.as_ptr(), spare.len());
    let mut it = UbufMut::new(spare);
    let out = f(&mut it);
    assert!(
        it.covers(base, room),
        "fill_spare: the closure replaced the iterator it was lent"
    );
    let filled = it.filled();
    // SAFETY: `it` covers exactly `vec`'s spare capacity (checked above), so
    // by the `UbufMut` invariant the `filled <= room = capacity - len` bytes
    // after `vec`'s initialised prefix are initialised too.
    unsafe { vec.set_len(len + filled) };
    out
}
