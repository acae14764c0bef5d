//! Scatter-gather buffer iteration: the `iov_iter` of courier (after the
//! Linux `iov_iter` dispatch patch, which measured dense type numbers
//! dispatched by one `switch` fastest).
//!
//! Every byte courier moves goes through one of two iterators:
//!
//! * [`IoIter`], the **source** side: bytes to send. It reads out of the
//!   caller's buffers and hands them to `sendmsg` as an iovec array.
//! * [`IoIterMut`], the **destination** side: room to receive into. It writes
//!   into uninitialised memory (a `Vec`'s spare capacity, pooled pages, a
//!   shared-memory mapping) without zero-filling it first, and hands it to
//!   `recvmsg` as an array of [`RawIoVec`].
//!
//! The direction is in the type, never in a flag: Linux spent years removing
//! direction misannotations from `iov_iter` (its `data_source` bit); here a
//! source cannot be written and a destination cannot be read.
//!
//! # Kinds
//!
//! Each iterator is one enum whose variants are numbered densely, hottest
//! first, so a `match` lowers to a jump table or a short compare chain (seed
//! 004 measured that a `switch` over dense numbers beats bit tests, and the
//! kernel rejected function-pointer tables for their indirect calls; the
//! `iter` suite of `courier-bench` repeats that experiment in Rust).
//!
//! | # | kind | [`IoIter`] (source) | [`IoIterMut`] (destination) | Linux |
//! | --- | --- | --- | --- | --- |
//! | 0 | one buffer | [`Ubuf`] over `&[u8]` | [`UbufMut`] over `&mut [MaybeUninit<u8>]` | `ITER_UBUF` |
//! | 1 | borrowed slices | [`Slices`] over `&[IoSlice]` | [`SlicesMut`] over `&mut [&mut [MaybeUninit<u8>]]` | `ITER_IOVEC` |
//! | 2 | owned chunks | [`Chunks`] over `&[Vec<u8>]` | [`ChunksMut`] over `&mut [Box<[MaybeUninit<u8>]>]` | `ITER_BVEC` |
//! | 3 | a mapping | [`Mapping`] | [`MappingMut`] | (shared memory) |
//! | 4 | discard | [`Discard`]: reads as zeros | [`Discard`]: counts and drops | `ITER_DISCARD` |
//!
//! When the kind is known statically, use the kind's type directly: it has the
//! same methods as the enum and involves no dispatch at all.
//!
//! # Naming of the copies (as in Linux)
//!
//! The iterator is always the far end; the slice argument is the near end.
//!
//! * [`IoIterMut::copy_to_iter`]`(src)` copies **from `src` into** the
//!   iterator's buffers (Linux `copy_to_iter(addr, bytes, i)`: a `read`).
//! * [`IoIter::copy_from_iter`]`(dst)` copies **out of** the iterator **into
//!   `dst`** (Linux `copy_from_iter(addr, bytes, i)`: a `write`).
//! * [`copy_iter`] moves bytes from a source iterator into a destination one.
//!
//! Each returns how many bytes it copied, `min(slice length, remaining)`, and
//! advances the iterator by that much; a short copy is not an error.
//!
//! # Handing segments to the kernel
//!
//! A send loop fills an iovec array with the segments not sent yet, starting in
//! the middle of a segment after a partial send, and never copies a byte:
//!
//! ```
//! use courier::buf::{IoIter, IOV_MAX};
//! use std::io::IoSlice;
//!
//! let header = [1u8; 8];
//! let body = vec![2u8; 100];
//! let parts = [IoSlice::new(&header), IoSlice::new(&body)];
//! let mut it = IoIter::slices(&parts);
//! let mut iov = [IoSlice::new(&[]); 16];
//! while it.remaining() > 0 {
//!     let n = it.io_slices(&mut iov);
//!     assert!(n <= IOV_MAX);
//!     // let sent = rustix::net::sendmsg(fd, &iov[..n], ..)?;
//!     let sent = iov[..n].iter().map(|s| s.len()).sum::<usize>().min(50);
//!     it.advance(sent);
//! }
//! ```
//!
//! A receive fills [`RawIoVec`]s (laid out exactly like `struct iovec`) over
//! uninitialised memory, lets the kernel write, and then records how much it
//! wrote with the `unsafe` [`IoIterMut::advance`], whose contract is "these
//! bytes are initialised now". From then on [`IoIterMut::filled`] is a number
//! unsafe code may rely on; [`fill_spare`] does exactly that to grow a `Vec`.
//! No `&mut [u8]` over uninitialised bytes is ever created.
//!
//! # Cost
//!
//! The iterators never allocate and never copy descriptors beyond the iovec
//! array the caller lends them. Construction of [`Slices`]/[`Chunks`] sums the
//! segment lengths once (O(segments)); every other operation is O(segments
//! touched). The only per-thread state is a 64 KiB sink, allocated on first use
//! by a thread that receives into a [`Discard`] through `recvmsg`.

mod discard;
mod iter;
mod iter_mut;
mod raw;
mod segments;
mod ubuf;

pub use discard::Discard;
pub use iter::IoIter;
pub use iter_mut::IoIterMut;
pub use raw::{fill_spare, RawIoVec};
pub use segments::{
    Chunks, ChunksMut, Segment, SegmentMut, Segments, SegmentsMut, Slices, SlicesMut,
};
pub use ubuf::{Mapping, MappingMut, Ubuf, UbufMut};

/// The most iovecs one `sendmsg`/`recvmsg` accepts on Linux (`UIO_MAXIOV`).
///
/// `io_slices` and `io_vecs` never fill more than this many entries.
pub const IOV_MAX: usize = 1024;

/// Copies bytes out of `src` into `dst` until one of them runs out; returns how
/// many bytes moved. Both iterators advance by that many bytes.
///
/// This is the in-process transfer: no iovec arrays, one `memcpy` per pair of
/// overlapping segments.
///
/// ```
/// use courier::buf::{copy_iter, IoIter, IoIterMut};
/// use std::mem::MaybeUninit;
///
/// let mut src = IoIter::ubuf(b"hello, world");
/// let mut room = [MaybeUninit::<u8>::uninit(); 5];
/// let mut dst = IoIterMut::ubuf(&mut room);
/// assert_eq!(copy_iter(&mut dst, &mut src), 5);
/// assert_eq!(src.remaining(), 7);
/// ```
pub fn copy_iter(dst: &mut IoIterMut<'_>, src: &mut IoIter<'_>) -> usize {
    let mut total = 0;
    loop {
        let chunk = src.chunk();
        if chunk.is_empty() {
            return total;
        }
        let n = dst.copy_to_iter(chunk);
        src.advance(n);
        total += n;
        if n < chunk.len() {
            return total;
        }
    }
}
