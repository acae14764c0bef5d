//! Memory mappings owned by a value: anonymous private memory (the "freshly
//! mapped" memcpy target) and shared mappings of a memfd (the memory two
//! processes spin on); and a source and a destination placed a chosen
//! distance apart ([`CopyPair`]).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

/// A readable and writable mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// `len` bytes of fresh anonymous memory: no page is backed until first
    /// touched, so the first write to each page takes a fault.
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a null hint lets the kernel choose an address, so no
        // existing mapping is replaced.
        let ptr = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        Ok(Mapping::owning(ptr, len))
    }

    /// The first `len` bytes of `fd` (a memfd), shared with every other
    /// process that maps it.
    pub fn shared(fd: impl AsFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: as above, the kernel chooses the address.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        Ok(Mapping::owning(ptr, len))
    }

    fn owning(ptr: *mut std::ffi::c_void, len: usize) -> Mapping {
        Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
        }
    }

    /// The mapping's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` is mapped readable and writable for as
        // long as `self` lives, any byte is a valid `u8`, and `&mut self`
        // makes this the only reference into it from this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The start of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has no bytes (never: `mmap` refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 4 bytes at `offset` as an atomic, for flags and futex words that
    /// another process mapping the same memfd reads and writes concurrently.
    ///
    /// # Panics
    /// If `offset` is not 4-byte aligned or the word does not fit.
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len,
            "bad atomic offset {offset}"
        );
        // SAFETY: in bounds and 4-byte aligned (checked; the start is page-
        // aligned), mapped while `self` is borrowed, any bits are a valid
        // `AtomicU32`, and no `&mut` slice can coexist (`as_mut_slice` takes `&mut self`).
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and no
        // borrow of it outlives `self`.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A new memfd of `len` zero bytes, close-on-exec (pass it to a child with
/// [`super::child::spawn`]).
pub fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len)?;
    Ok(fd)
}

/// Where a copy's destination sits relative to its source, modulo 4 KiB
/// ([`CopyPair`]).
///
/// On an AMD EPYC (Zen 3) guest, glibc 2.36's `memcpy` of 4 KiB to 256 KiB
/// (its `rep movsb` range) runs at 1.7-1.9 GB/s instead of 30-60 when the
/// destination is 1 to 31 bytes past the source modulo 4 KiB
/// (`docs/memcpy-placement.md`; the `floor` suite's `memcpy_warm_aliased_64k`
/// measures it). Two same-sized heap
/// allocations made one after the other sit exactly there (a 16-byte chunk
/// header apart), so a floor measured with two `vec!`s can read 20 times
/// too slow.
pub const APART: usize = 256;
/// The placement that hits that slow case.
pub const ALIASED: usize = 16;

/// A source and a destination of `len` bytes in one allocation, the
/// destination `offset` bytes (modulo 4 KiB) past the source, whatever the
/// allocator does.
#[derive(Debug)]
pub struct CopyPair {
    buf: Vec<u8>,
    len: usize,
    dst: usize,
}

impl CopyPair {
    /// The source filled with `fill`, the destination zeroed.
    pub fn new(len: usize, offset: usize, fill: u8) -> CopyPair {
        let dst = len.next_multiple_of(4096) + offset % 4096;
        let mut buf = vec![0u8; dst + len];
        buf[..len].fill(fill);
        CopyPair { buf, len, dst }
    }

    /// The source (read-only) and the destination.
    pub fn split(&mut self) -> (&[u8], &mut [u8]) {
        let (src, dst) = self.buf.split_at_mut(self.dst);
        (&src[..self.len], &mut dst[..self.len])
    }

    /// The other way round: the source as the destination (`4096 -
    /// offset` bytes past the destination, modulo 4 KiB) and the
    /// destination as the (read-only) source, for a copy back.
    pub fn split_back(&mut self) -> (&mut [u8], &[u8]) {
        let (src, dst) = self.buf.split_at_mut(self.dst);
        (&mut src[..self.len], &dst[..self.len])
    }
}

/// Where Linux keeps the most mappings a process may have.
const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

/// `vm.max_map_count` raised for a case that maps more than its default
/// (65,530) allows, put back as it was on drop. A fiber's or a coroutine's
/// stack and the guard page below it are two mappings, so a hundred
/// thousand of them need more.
#[derive(Debug)]
pub struct MapCount {
    restore: Option<u64>,
}

impl MapCount {
    /// Room for at least `want` mappings: the limit as it is if it is
    /// enough, else raised if this process may (root). `None` if it stays
    /// below `want`.
    pub fn at_least(want: u64) -> Option<MapCount> {
        let now = map_count()?;
        if now >= want {
            return Some(MapCount { restore: None });
        }
        std::fs::write(MAX_MAP_COUNT, want.to_string()).ok()?;
        Some(MapCount { restore: Some(now) })
    }
}

impl Drop for MapCount {
    fn drop(&mut self) {
        if let Some(old) = self.restore {
            let _ = std::fs::write(MAX_MAP_COUNT, old.to_string());
        }
    }
}

/// `vm.max_map_count` now.
pub fn map_count() -> Option<u64> {
    std::fs::read_to_string(MAX_MAP_COUNT)
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_memory_starts_zeroed_and_is_writable() {
        let mut m = Mapping::anonymous(3 * 4096 + 1).unwrap();
        assert_eq!(m.len(), 3 * 4096 + 1);
        assert!(m.as_mut_slice().iter().all(|&b| b == 0));
        m.as_mut_slice().fill(7);
        assert!(m.as_mut_slice().iter().all(|&b| b == 7));
        assert_eq!(m.as_ptr() as usize % 4096, 0);
    }

    #[test]
    fn a_copy_pair_keeps_its_distance() {
        for offset in [APART, ALIASED] {
            let mut pair = CopyPair::new(64 << 10, offset, 3);
            let (src, dst) = pair.split();
            assert_eq!((src.len(), dst.len()), (64 << 10, 64 << 10));
            assert!(src.iter().all(|&b| b == 3) && dst.iter().all(|&b| b == 0));
            let distance = dst.as_ptr() as usize - src.as_ptr() as usize;
            assert_eq!(distance % 4096, offset);
        }
    }

    #[test]
    fn two_shared_mappings_of_one_memfd_see_each_other() {
        let fd = memfd("courier-bench-test", 4096).unwrap();
        let mut a = Mapping::shared(&fd, 4096).unwrap();
        let mut b = Mapping::shared(&fd, 4096).unwrap();
        a.as_mut_slice()[100] = 42;
        assert_eq!(b.as_mut_slice()[100], 42);
        a.atomic_u32(128)
            .store(7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            b.atomic_u32(128).load(std::sync::atomic::Ordering::Relaxed),
            7
        );
    }
}
