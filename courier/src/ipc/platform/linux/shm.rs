//! Sealed memfd regions that carry large payloads.
//!
//! A payload too large for one packet does not travel through the socket
//! (unless [`crate::ipc::LargeMessages::Fragments`] is chosen): the sender copies it into a memfd region and passes
//! the descriptor; the receiver copies it out. That is the same two copies
//! as the socket path, without tens of fragment syscalls, and with no second
//! thread needed for a send that is larger than the socket buffer.
//!
//! Page faults, not copies, dominate large transfers into fresh memory (8 MiB
//! costs ~0.3 ms into mapped memory and ~4.8 ms into fresh memory on this
//! machine), so regions are **reused on both sides**:
//!
//! * the sender keeps a small pool of regions ([`Pool`]); a region is free
//!   again once the receiver has copied the payload out and cleared the
//!   region's state word;
//! * the receiver keeps the mappings of the last few regions it saw
//!   ([`MapCache`]), keyed by inode, so a reused region is neither mapped nor
//!   faulted in again.
//!
//! ```text
//!  region (memfd, sealed: F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
//!  +----------------+-------------------------------------------------+
//!  | state: u32     | payload (the message's `total` bytes)           |
//!  | 0 free, 1 busy |                                                 |
//!  +----------------+-------------------------------------------------+
//!  0                REGION_HEADER (64)                          st_size
//! ```
//!
//! # Trust
//! The receiver never trusts the sender's region: it checks the seals (so the
//! region cannot shrink under the mapping, which would raise `SIGBUS`) and the
//! size against the header's `total` before mapping. A sender that keeps
//! writing into a region it sent can only corrupt the bytes of its own
//! message, which the receiver copies out once and then validates like any
//! other payload. A receiver that clears the state word early can only make
//! the sender overwrite the bytes it is still copying.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{self, MapFlags, ProtFlags};

use crate::ipc::err::WireError;

use super::Split;

/// Bytes before the payload: the state word, padded to a cache line.
pub(crate) const REGION_HEADER: usize = 64;

const FREE: u32 = 0;
const BUSY: u32 = 1;

/// Regions a sender's pool keeps for reuse.
const POOL_REGIONS: usize = 2;
/// Mappings a receiver keeps for reuse.
const CACHED_MAPPINGS: usize = 4;
/// Mappings are made in whole pages.
const PAGE: usize = 4096;
/// Smallest region created, so that a range of sizes shares one region.
const MIN_REGION: usize = 256 * 1024;

/// A shared mapping of a whole memfd, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is an address range owned by this value alone; the
// memory is shared with other processes, and every access to it goes through
// raw copies or the `AtomicU32` state word, never through Rust references to
// the payload.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`.
    fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, Errno> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint) aliases no
        // Rust object.
        let ptr = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Errno::NOMEM)?;
        Ok(Mapping { ptr, len })
    }

    /// The region's state word.
    fn state(&self) -> &AtomicU32 {
        // SAFETY: the mapping is at least `REGION_HEADER` bytes, page-aligned
        // (so aligned for `u32`), lives as long as `self`, and the word is
        // only ever accessed atomically, by both processes.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().cast::<u32>()) }
    }

    fn payload(&self) -> *mut u8 {
        // SAFETY: `REGION_HEADER < len`, so the offset stays in the mapping.
        unsafe { self.ptr.as_ptr().add(REGION_HEADER) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // reference into the mapping outlives `self`.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A region owned by the sender.
pub(crate) struct Region {
    fd: OwnedFd,
    map: Mapping,
}

impl Region {
    /// A sealed region with room for at least `payload` bytes.
    fn create(payload: usize) -> Result<Region, Errno> {
        let len = (payload + REGION_HEADER)
            .max(MIN_REGION)
            .next_power_of_two();
        let fd = fs::memfd_create(
            "courier-payload",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        fs::ftruncate(&fd, len as u64)?;
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = Mapping::map(fd.as_fd(), len)?;
        Ok(Region { fd, map })
    }

    fn capacity(&self) -> usize {
        self.map.len - REGION_HEADER
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Copies `parts` (`total` bytes in all) into the payload area and marks
    /// the region busy.
    fn fill(&mut self, parts: &[IoSlice<'_>], total: usize) {
        assert!(total <= self.capacity(), "region too small for its payload");
        let mut at = 0;
        for part in parts {
            assert!(at + part.len() <= total, "parts longer than their total");
            // SAFETY: `at + part.len() <= total <= capacity` (asserted), so
            // the destination range lies in the mapping's payload area; the
            // source is a live slice and cannot overlap our mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.map.payload().add(at), part.len())
            };
            at += part.len();
        }
        self.map.state().store(BUSY, Ordering::Relaxed);
    }
}

/// A sender's pool of regions (one per destination: see `OsSender`).
#[derive(Default)]
pub(crate) struct Pool {
    regions: Mutex<Vec<Region>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

impl Pool {
    /// A region holding a copy of `parts`, ready to send. Give it back with
    /// [`Pool::put`] once it has been sent.
    pub(crate) fn take_filled(&self, parts: &[IoSlice<'_>]) -> Result<Region, Errno> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let reused = {
            let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
            // SYNC POINT: receiver's `Release` store of FREE in `MapCache::copy_out`;
            // after it, the receiver no longer reads the payload we overwrite.
            let free = regions.iter().position(|r| {
                r.capacity() >= total && r.map.state().load(Ordering::Acquire) == FREE
            });
            free.map(|i| regions.swap_remove(i))
        };
        let mut region = match reused {
            Some(region) => region,
            None => Region::create(total)?,
        };
        region.fill(parts, total);
        Ok(region)
    }

    /// Returns a sent region to the pool; it is reused once the receiver
    /// frees it. A full pool forgets its oldest region (the receiver may still
    /// hold it; its mapping keeps the memory alive until it is done).
    pub(crate) fn put(&self, region: Region) {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        if regions.len() >= POOL_REGIONS {
            regions.remove(0);
        }
        regions.push(region);
    }
}

/// A receiver's cache of mapped regions, keyed by inode.
#[derive(Default)]
pub(crate) struct MapCache {
    entries: Vec<(u64, u64, Mapping)>,
}

impl std::fmt::Debug for MapCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapCache")
            .field("mapped", &self.entries.len())
            .finish()
    }
}

impl MapCache {
    /// Validates the region `fd` and appends its `total` payload bytes to
    /// `dst`, then marks the region free for its sender. With `split`, if
    /// the payload is long enough, the predicted byte string goes to its own
    /// buffer instead (`true` returned; see `ipc::split`).
    pub(crate) fn copy_out(
        &mut self,
        fd: &OwnedFd,
        total: usize,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<bool, WireError> {
        let stat = fs::fstat(fd).map_err(|_| WireError::BadRegion)?;
        let size = usize::try_from(stat.st_size).map_err(|_| WireError::BadRegion)?;
        if size < REGION_HEADER || size - REGION_HEADER < total {
            return Err(WireError::BadRegion);
        }
        // Map what the message needs, never the size the peer chose for the
        // file (a sealed sparse file of terabytes would map fine and eat the
        // address space).
        let need = (REGION_HEADER + total).next_multiple_of(PAGE);
        let key = (stat.st_dev, stat.st_ino);
        let i = match self
            .entries
            .iter()
            .position(|(d, ino, m)| (*d, *ino) == key && m.len >= need)
        {
            Some(i) => i,
            None => {
                // Seals are never removed, and a cached inode is alive (our
                // mapping holds it) so cannot be reused: checking a region
                // once, when it is first mapped, is enough.
                let seals = fs::fcntl_get_seals(fd).map_err(|_| WireError::BadRegion)?;
                if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
                    return Err(WireError::BadRegion);
                }
                let map =
                    Mapping::map(fd.as_fd(), need.min(size)).map_err(|_| WireError::BadRegion)?;
                self.entries.retain(|(d, ino, _)| (*d, *ino) != key);
                if self.entries.len() >= CACHED_MAPPINGS {
                    self.entries.remove(0);
                }
                self.entries.push((key.0, key.1, map));
                self.entries.len() - 1
            }
        };
        let map = &self.entries[i].2;
        let src = map.payload();
        // The sender may still write the source: we copy raw bytes, never form
        // a reference to them, and the result is validated as untrusted input.
        let split = split.filter(|s| s.layout.at + s.layout.len <= total);
        let split_off = split.is_some();
        // Sealed against shrinking, and `size - REGION_HEADER >= total`: the
        // `total` payload bytes after the header stay mapped, and every range
        // copied below lies within them.
        match split {
            Some(Split { layout, string }) => {
                let end = layout.at + layout.len;
                string.clear();
                // SAFETY: `[0, at)` is within the payload (see above).
                unsafe { append_raw(dst, src, layout.at)? };
                // SAFETY: `[at, end)` is within the payload, `end <= total`.
                unsafe { append_raw(string, src.add(layout.at), layout.len)? };
                // SAFETY: `[end, total)` is within the payload.
                unsafe { append_raw(dst, src.add(end), total - end)? };
            }
            // SAFETY: `[0, total)` is the payload.
            None => unsafe { append_raw(dst, src, total)? },
        }
        // SYNC POINT: sender's `Acquire` load in `Pool::take_filled`.
        map.state().store(FREE, Ordering::Release);
        Ok(split_off)
    }
}

/// Appends the `n` bytes at `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes and not overlap `dst`'s buffer.
unsafe fn append_raw(dst: &mut Vec<u8>, src: *const u8, n: usize) -> Result<(), WireError> {
    dst.try_reserve_exact(n).map_err(|_| WireError::TooLarge {
        claimed: n as u64,
        limit: 0,
    })?;
    let spare = dst.spare_capacity_mut();
    // SAFETY: the caller vouches for `src`; `spare` has room for `n` bytes
    // (reserved above) and is memory of our own, so cannot overlap it.
    unsafe { std::ptr::copy_nonoverlapping(src, spare.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: the copy above initialised `n` bytes after `len`.
    unsafe { dst.set_len(dst.len() + n) };
    Ok(())
}
