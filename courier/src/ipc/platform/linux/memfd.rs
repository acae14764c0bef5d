//! Sealed memfd regions and their shared mappings: the system calls behind
//! `ipc::shm`'s regions and `ipc::IpcSharedMemory`.
//!
//! # References
//! - [`memfd_create(2)`](https://man7.org/linux/man-pages/man2/memfd_create.2.html),
//!   [`fcntl(2)`](https://man7.org/linux/man-pages/man2/fcntl.2.html) (`F_ADD_SEALS`, `F_GET_SEALS`)
//! - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html),
//!   [`munmap(2)`](https://man7.org/linux/man-pages/man2/munmap.2.html),
//!   [`madvise(2)`](https://man7.org/linux/man-pages/man2/madvise.2.html) (`MADV_REMOVE`)
//! - [`fallocate(2)`](https://man7.org/linux/man-pages/man2/fallocate.2.html),
//!   [`fstat(2)`](https://man7.org/linux/man-pages/man2/fstat.2.html),
//!   [`fstatfs(2)`](https://man7.org/linux/man-pages/man2/fstatfs.2.html),
//!   [`kcmp(2)`](https://man7.org/linux/man-pages/man2/kcmp.2.html)

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{self, FallocateFlags, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{self, MapFlags, ProtFlags};

use super::super::RegionMap;

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`, then
/// `ftruncate(len)` unless `len` is 0: an unsealed file of `len` bytes
/// that reads as zeros.
pub(crate) fn create(name: &str, len: usize) -> Result<OwnedFd, Errno> {
    let fd = fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    if len > 0 {
        fs::ftruncate(&fd, len as u64)?;
    }
    Ok(fd)
}

/// `fcntl(F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)`: the
/// size is fixed for good.
pub(crate) fn seal(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    fs::fcntl_add_seals(fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
}

/// `fcntl(F_GET_SEALS)`: whether the file is sealed against shrinking and
/// growing. Fails at once for anything but shared memory (or hugetlbfs),
/// before an `fstat` could wait on, say, a FUSE daemon.
pub(crate) fn sealed(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    fs::fcntl_get_seals(fd).map(|seals| seals.contains(SealFlags::SHRINK | SealFlags::GROW))
}

/// `fstat`: the file's size and which file it is (`st_dev`, `st_ino`).
pub(crate) fn stat(fd: BorrowedFd<'_>) -> Result<(u64, (u64, u64)), Errno> {
    let st = fs::fstat(fd)?;
    let size = u64::try_from(st.st_size).map_err(|_| Errno::OVERFLOW)?;
    Ok((size, (st.st_dev, st.st_ino)))
}

/// `fstatfs`: whether the file lives on hugetlbfs.
pub(crate) fn on_hugetlbfs(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let fs = fs::fstatfs(fd)?;
    // `f_type`'s integer type differs between targets.
    #[allow(clippy::unnecessary_cast)]
    Ok(fs.f_type as i64 == libc::HUGETLBFS_MAGIC as i64)
}

/// `fallocate(fd, 0, 0, len)`, retried on `EINTR`: the pages of the first
/// `len` bytes are allocated (or the shortage is an error now, not a
/// `SIGBUS` at the first write through a mapping).
pub(crate) fn allocate(fd: BorrowedFd<'_>, len: usize) -> Result<(), Errno> {
    loop {
        match fs::fallocate(fd, FallocateFlags::empty(), 0, len as u64) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// `write(fd, bytes)` until all is written, retried on `EINTR`.
pub(crate) fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> Result<(), Errno> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(Errno::NOSPC),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `kcmp(getpid(), getpid(), KCMP_FILE, a, b)`: whether `a` and `b` are one
/// open file description; `false` if the kernel cannot say (no `kcmp`, a
/// seccomp filter).
pub(crate) fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    /// `KCMP_FILE` from `<linux/kcmp.h>`.
    const KCMP_FILE: libc::c_int = 0;
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: `kcmp` takes five integers and reads no memory of ours; the
    // descriptors are borrowed, so open for the call.
    let order = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            pid,
            KCMP_FILE,
            a.as_raw_fd() as libc::c_ulong,
            b.as_raw_fd() as libc::c_ulong,
        )
    };
    order == 0
}

/// A shared mapping of a file's first `len` bytes, unmapped on drop.
///
/// What its bytes mean, and how they may be accessed, is its owner's rule:
/// `ipc::shm`'s message regions use raw copies and atomic header words,
/// `IpcSharedMemory` its own.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is an address range owned by this value alone, and
// moving it moves that ownership; it holds no thread-bound state. How its
// memory may be accessed is its owner's rule, not the thread's.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, Errno> {
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
}

impl RegionMap for Mapping {
    #[inline]
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[inline]
    fn non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// `madvise(MADV_REMOVE)` over the whole mapping: a hole punched in the
    /// file, its pages freed (they read back as zeros).
    fn punch(&self) {
        // SAFETY: the range is exactly our own mapping; removing its pages
        // changes what it reads, never which memory is valid.
        let _ = unsafe { mm::madvise(self.ptr.as_ptr().cast(), self.len, mm::Advice::LinuxRemove) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no
        // reference into the mapping outlives `self`.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
