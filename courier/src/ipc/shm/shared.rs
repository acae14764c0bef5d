//! Regions the application holds: the memory behind `ipc::IpcSharedMemory`.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::Mutex;

use rustix::io::Errno;

use super::*;

// ===== regions the application holds (`ipc::IpcSharedMemory`) =====

/// A sealed memfd region mapped whole, shared with whichever processes it is
/// sent to: the memory behind `ipc::IpcSharedMemory`.
///
/// Unlike a payload region it has no header: every byte is the
/// application's, and both sides may write it. Its size is sealed
/// (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so a mapping of it never
/// reaches past the end of the file, and a received one is checked for that
/// before it is mapped.
///
/// # A region that comes back finds its mapping
/// Mapping a region is cheap; faulting its pages in is not: ~0.4 µs a page
/// here, 0.4 ms for 4 MiB, about all that a round trip of a touched region
/// costs (`courier-bench ipc --case shm`); even a one-page region's fresh
/// mapping, fault and `munmap` cost ~8 µs. Regions tend to travel back and
/// forth (a buffer handed to a worker and returned), and a sender usually
/// drops its copy once sent. So a dropped region stays mapped for a while,
/// [parked](Parked), and a region that
/// arrives is looked up there first, by inode: back from its trip, it reuses
/// the mapping with its pages already in. A parked region holds its memory
/// and a descriptor: at most [`PARKED_REGIONS`] of them and
/// [`PARKED_BYTES`] in all, the oldest let go first.
pub(crate) struct SharedRegion {
    /// Copies of `held.map`'s: a dereference reads two plain fields.
    ptr: NonNull<u8>,
    len: usize,
    /// `None` only while it is dropped (parked or let go).
    held: Option<Parked>,
}

/// A mapped region and its descriptor, in use or parked.
struct Parked {
    fd: OwnedFd,
    map: Mapping,
    /// Which file (`st_dev`, `st_ino`), once asked: received regions know it
    /// from their checks; created ones ask when they are parked.
    key: Option<(u64, u64)>,
}

/// Most regions parked at a time.
const PARKED_REGIONS: usize = 4;
/// Most bytes parked at a time (a larger region is never parked).
const PARKED_BYTES: usize = 32 << 20;

/// This process's parked regions, oldest first.
static PARKED: Mutex<Vec<Parked>> = Mutex::new(Vec::new());

// SAFETY: `ptr` points into the mapping `held` owns, which is unmapped only
// after this value is gone (or parked, unreachable through it). The bytes are
// shared memory that any holder in any process may write; that is the
// contract of `IpcSharedMemory` (its `deref_mut` is unsafe for that reason),
// not something a thread of this process can make worse.
unsafe impl Send for SharedRegion {}
// SAFETY: as for `Send`; `&SharedRegion` gives out only the pointer and the
// descriptor.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A zero-filled region of `len` bytes (`len > 0`). No page is touched:
    /// a fresh memfd reads as zeros, and pages are allocated as they are
    /// written.
    pub(crate) fn zeroed(len: usize) -> Result<SharedRegion, Errno> {
        let fd = Os::create_region("courier-shared", len)?;
        SharedRegion::seal_and_map(fd, len)
    }

    /// A region holding a copy of `bytes` (not empty).
    ///
    /// The bytes go in with `write(2)`: the kernel allocates the file's pages
    /// and copies into them in one pass, where a copy through a fresh mapping
    /// would take a page fault per page.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<SharedRegion, Errno> {
        let fd = Os::create_region("courier-shared", 0)?;
        Os::write_all(Os::borrow(&fd), bytes)?;
        SharedRegion::seal_and_map(fd, bytes.len())
    }

    /// A region of `len` bytes, each `byte`, written in as
    /// [`from_bytes`](Self::from_bytes) writes: where memory runs short
    /// (strict overcommit, a memory cgroup's limit) `write` says so, where
    /// filling a sparse mapping would meet it as `SIGBUS` at the first page
    /// that cannot be had.
    pub(crate) fn filled(len: usize, byte: u8) -> Result<SharedRegion, Errno> {
        let fd = Os::create_region("courier-shared", 0)?;
        let chunk = vec![byte; len.min(64 << 10)];
        let mut left = len;
        while left > 0 {
            let here = left.min(chunk.len());
            Os::write_all(Os::borrow(&fd), &chunk[..here])?;
            left -= here;
        }
        SharedRegion::seal_and_map(fd, len)
    }

    fn seal_and_map(fd: OwnedFd, len: usize) -> Result<SharedRegion, Errno> {
        Os::seal(Os::borrow(&fd))?;
        let map = Os::map(Os::borrow(&fd), len)?;
        Ok(SharedRegion::new(fd, map, None))
    }

    fn new(fd: OwnedFd, map: Mapping, key: Option<(u64, u64)>) -> SharedRegion {
        SharedRegion {
            ptr: map.non_null(),
            len: map.len(),
            held: Some(Parked { fd, map, key }),
        }
    }

    /// Maps a region that arrived in a message, after checking it: shared
    /// memory (not hugetlbfs, see [`not_hugetlbfs`]), sealed against
    /// shrinking and growing, not empty, and no larger than `budget`, which
    /// it is then charged to (the receiver's size limit covers the regions a
    /// message brings: touching a region's pages allocates them). A region
    /// parked here is taken back instead of mapped again.
    ///
    /// The mapping is writable, as the sender's is: a region sealed against
    /// writes, or a descriptor opened read-only, is refused here rather than
    /// fault when written through `deref_mut`.
    pub(crate) fn open(fd: OwnedFd, budget: &mut u64) -> Result<SharedRegion, WireError> {
        // Seals before size, as in `MapCache::copy_out`: a region sealed
        // against shrinking cannot get shorter than the size read after.
        if !Os::sealed(Os::borrow(&fd)).map_err(|_| WireError::BadRegion)? {
            return Err(WireError::BadRegion);
        }
        let (size, key) = Os::stat(Os::borrow(&fd)).map_err(|_| WireError::BadRegion)?;
        if size == 0 {
            // An empty region travels without a descriptor.
            return Err(WireError::BadRegion);
        }
        if size > *budget {
            return Err(WireError::TooLarge {
                claimed: size,
                limit: *budget,
            });
        }
        let len = usize::try_from(size).map_err(|_| WireError::BadRegion)?;
        let map = match unpark(key, len, Os::borrow(&fd)) {
            // The same open file as the parked one (`unpark` asks the kernel):
            // it passed these checks when it was first mapped, seals stay, and
            // it was opened writable.
            Some(map) => map,
            None => {
                not_hugetlbfs(Os::borrow(&fd))?;
                Os::map(Os::borrow(&fd), len).map_err(|_| WireError::BadRegion)?
            }
        };
        *budget -= size;
        Ok(SharedRegion::new(fd, map, Some(key)))
    }

    /// The first byte of the mapping (page-aligned, never null).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The region's size in bytes (not 0).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd, for sending.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        Os::borrow(&self.held.as_ref().expect("held until dropped").fd)
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            park(held);
        }
    }
}

/// Parks a region no one here uses any more, if it is worth keeping; lets
/// go of the oldest parked ones past the bounds (outside the lock: `munmap`
/// of a touched region takes a while).
fn park(mut region: Parked) {
    let len = region.map.len();
    if len > PARKED_BYTES {
        return;
    }
    if region.key.is_none() {
        let Ok((_, key)) = Os::stat(Os::borrow(&region.fd)) else {
            return;
        };
        region.key = Some(key);
    }
    let mut evicted = Vec::new();
    {
        let mut parked = PARKED.lock().unwrap_or_else(|e| e.into_inner());
        // Two copies of one region received here map it twice: keep the
        // mapping dropped last.
        if let Some(i) = parked.iter().position(|p| p.key == region.key) {
            evicted.push(parked.remove(i));
        }
        parked.push(region);
        let mut bytes: usize = parked.iter().map(|p| p.map.len()).sum();
        while parked.len() > PARKED_REGIONS || bytes > PARKED_BYTES {
            let oldest = parked.remove(0);
            bytes -= oldest.map.len();
            evicted.push(oldest);
        }
    }
    drop(evicted);
}

/// Takes the parked mapping of the region `key`, if there is one of `len`
/// bytes and it is the very open file `fd` refers to; its descriptor is
/// closed (the caller has its own).
///
/// An inode number alone could name another file (memfd inode numbers are 32
/// bits before Linux 5.9, and wrap), and the same file reopened through
/// `/proc` read-only would skip the checks a fresh mapping makes: so a
/// region is reused only if `kcmp(KCMP_FILE)` says that `fd` and the parked
/// descriptor are one open file, which a round trip through `SCM_RIGHTS`
/// keeps. Where `kcmp` is not available (a kernel without it, a seccomp
/// filter), regions are mapped afresh.
fn unpark(key: (u64, u64), len: usize, fd: BorrowedFd<'_>) -> Option<Mapping> {
    let mut parked = PARKED.lock().unwrap_or_else(|e| e.into_inner());
    let i = parked.iter().position(|p| {
        p.key == Some(key) && p.map.len() == len && Os::same_file(Os::borrow(&p.fd), fd)
    })?;
    let found = parked.remove(i);
    drop(parked);
    Some(found.map)
}

/// Lets go of every parked region now (see "A region that comes back finds
/// its mapping" on [`SharedRegion`]).
pub(crate) fn unpark_all() {
    let parked = std::mem::take(&mut *PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    drop(parked);
}
