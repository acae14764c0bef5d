//! Memory mappings owned by a value: anonymous private memory (the "freshly
//! mapped" memcpy target) and shared mappings of a memfd (the memory two
//! processes spin on).
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
