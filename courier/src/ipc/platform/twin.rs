//! The in-process twin of the transport: packets and regions in memory
//! only, no system call.
//!
//! It implements [`Transport`] and [`Memory`] as the contract states them,
//! and nothing more, so that the conformance suite (`conformance`) can tell
//! what the contract promises from what Linux happens to do; the portable
//! layers above can be exercised on it without sockets.
//!
//! A "descriptor" ([`TwinFd`]) is a shared handle: cloning it is `dup`,
//! dropping the last clone is `close`. An endpoint's packets wait in its
//! peer's inbound queue, unbounded (a send never waits). A region is a
//! page-aligned heap allocation that every mapping of it points into, as
//! every mapping of a memfd shows the same pages.
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::{Memory, Packet, RegionMap, Transport, FDS_PER_PACKET, SMALL_HEAD};
use crate::buf::RawIoVec;

/// The twin implementation of the contract.
#[derive(Debug)]
pub(crate) enum Twin {}

/// The longest packet (Linux's default with a 208 KiB send buffer).
const MAX_PACKET: usize = 212_992 - 32;
/// A region's mappings start on a page, as a real mapping does.
const PAGE: usize = 4096;

/// An owned descriptor of the twin: an endpoint or a region.
#[derive(Clone, Debug)]
pub(crate) struct TwinFd(Arc<Handle>);

/// What a descriptor refers to; dropped when its last descriptor is.
#[derive(Debug)]
enum Handle {
    End(End),
    Region(Arc<File>),
}

/// One end of a pair.
#[derive(Debug)]
struct End {
    link: Arc<Link>,
    side: usize,
}

/// A pair: an inbound queue per end, and which ends are closed.
#[derive(Debug, Default)]
struct Link {
    queues: [Mutex<VecDeque<TwinPacket>>; 2],
    /// Signalled on every packet and every close.
    changed: Condvar,
    closed: [AtomicBool; 2],
}

/// A packet in a queue.
#[derive(Debug)]
struct TwinPacket {
    bytes: Vec<u8>,
    fds: Vec<TwinFd>,
}

impl Drop for End {
    fn drop(&mut self) {
        self.link.closed[self.side].store(true, Ordering::Release);
        // Packets queued for a closed end are never read: their
        // descriptors close with it.
        let unread = std::mem::take(&mut *lock(&self.link.queues[self.side]));
        // (Taken the lock to order the store with a waiter's check.)
        drop(lock(&self.link.queues[1 - self.side]));
        self.link.changed.notify_all();
        drop(unread);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TwinFd {
    fn end(&self) -> Result<&End, Errno> {
        match &*self.0 {
            Handle::End(end) => Ok(end),
            Handle::Region(_) => Err(Errno::NOTSOCK),
        }
    }

    fn file(&self) -> Result<&Arc<File>, Errno> {
        match &*self.0 {
            Handle::Region(file) => Ok(file),
            Handle::End(_) => Err(Errno::INVAL),
        }
    }
}

impl End {
    fn inbound(&self) -> MutexGuard<'_, VecDeque<TwinPacket>> {
        lock(&self.link.queues[self.side])
    }

    fn peer_closed(&self) -> bool {
        self.link.closed[1 - self.side].load(Ordering::Acquire)
    }

    /// The next packet, waiting for one unless `dontwait`; `None`: the peer
    /// is gone and the queue drained.
    fn next(
        &self,
        dontwait: bool,
        take: impl FnOnce(&mut VecDeque<TwinPacket>) -> usize,
    ) -> Result<Option<usize>, Errno> {
        let mut queue = self.inbound();
        loop {
            if !queue.is_empty() {
                return Ok(Some(take(&mut queue)));
            }
            if self.peer_closed() {
                return Ok(None);
            }
            if dontwait {
                return Err(Errno::AGAIN);
            }
            queue = self
                .link
                .changed
                .wait(queue)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Copies `bytes` over `iov` in order; the bytes copied.
fn scatter(bytes: &[u8], iov: &mut [RawIoVec<'_>]) -> usize {
    let mut at = 0;
    for v in iov {
        let n = v.len().min(bytes.len() - at);
        // SAFETY: a `RawIoVec` lends `len()` writable bytes at `base()`
        // exclusively to this call (`UbufMut::io_vecs`), and `n <= len()`;
        // `bytes` is our own queue's memory, which cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), v.base(), n) };
        at += n;
    }
    at
}

impl Transport for Twin {
    type Fd = TwinFd;
    type BorrowedFd<'a> = &'a TwinFd;

    const SMALL_MAX: usize = 7 * 1024;

    fn borrow(fd: &TwinFd) -> &TwinFd {
        fd
    }

    fn pair() -> Result<(TwinFd, TwinFd), Errno> {
        let link = Arc::new(Link::default());
        let end = |side| {
            TwinFd(Arc::new(Handle::End(End {
                link: link.clone(),
                side,
            })))
        };
        Ok((end(0), end(1)))
    }

    fn max_packet() -> usize {
        MAX_PACKET
    }

    fn send(fd: &TwinFd, iov: &[IoSlice<'_>], fds: &[&TwinFd]) -> Result<usize, Errno> {
        let end = fd.end()?;
        let len: usize = iov.iter().map(|s| s.len()).sum();
        if len > MAX_PACKET {
            return Err(Errno::MSGSIZE);
        }
        if fds.len() > FDS_PER_PACKET {
            return Err(Errno::TOOMANYREFS);
        }
        let mut bytes = Vec::with_capacity(len);
        iov.iter().for_each(|s| bytes.extend_from_slice(s));
        let packet = TwinPacket {
            bytes,
            fds: fds.iter().map(|&fd| fd.clone()).collect(),
        };
        let mut peer = lock(&end.link.queues[1 - end.side]);
        if end.peer_closed() {
            return Err(Errno::PIPE);
        }
        peer.push_back(packet);
        drop(peer);
        end.link.changed.notify_all();
        Ok(len)
    }

    fn try_send_small<const H: usize>(
        fd: &TwinFd,
        header: &[u8; H],
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Errno> {
        assert!(total <= Self::SMALL_MAX && H <= SMALL_HEAD);
        let mut iov = vec![IoSlice::new(header)];
        iov.extend(parts.iter().map(|p| IoSlice::new(p)));
        Self::send(fd, &iov, &[])
    }

    fn try_send(fd: &TwinFd, iov: &[IoSlice<'_>], fds: &[&TwinFd]) -> Result<usize, Errno> {
        // Queues are unbounded: there is always room.
        Self::send(fd, iov, fds)
    }

    fn wait_writable(fd: &TwinFd, _deadline: Option<Instant>) -> io::Result<bool> {
        fd.end()?;
        Ok(true)
    }

    fn send_queue(fd: &TwinFd) -> Result<(usize, usize), Errno> {
        fd.end()?;
        Ok((0, usize::MAX))
    }

    fn recv(
        fd: &TwinFd,
        iov: &mut [RawIoVec<'_>],
        control: bool,
        dontwait: bool,
    ) -> Result<Packet<TwinFd>, Errno> {
        let end = fd.end()?;
        let mut out = Packet {
            len: 0,
            fds: Vec::new(),
            truncated: false,
            control_truncated: false,
        };
        end.next(dontwait, |queue| {
            let packet = queue.pop_front().expect("not empty");
            out.len = scatter(&packet.bytes, iov);
            out.truncated = out.len < packet.bytes.len();
            if control {
                out.fds = packet.fds;
            }
            out.len
        })?;
        Ok(out)
    }

    fn recv_whole(
        fd: &TwinFd,
        buf: &mut [MaybeUninit<u8>],
        dontwait: bool,
    ) -> Result<usize, Errno> {
        let end = fd.end()?;
        let got = end.next(dontwait, |queue| {
            let packet = queue.pop_front().expect("not empty");
            let n = packet.bytes.len().min(buf.len());
            buf[..n].copy_from_slice(as_uninit(&packet.bytes[..n]));
            packet.bytes.len()
        })?;
        Ok(got.unwrap_or(0))
    }

    fn peek<'b>(fd: &TwinFd, buf: &'b mut [MaybeUninit<u8>]) -> Result<&'b [u8], Errno> {
        let end = fd.end()?;
        let mut n = 0;
        end.next(true, |queue| {
            let bytes = &queue.front().expect("not empty").bytes;
            n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(as_uninit(&bytes[..n]));
            n
        })?;
        // SAFETY: the first `n` bytes of `buf` were copied in above.
        Ok(unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n) })
    }

    fn wait_readable(fd: &TwinFd, deadline: Instant) -> io::Result<bool> {
        let end = fd.end()?;
        let mut queue = end.inbound();
        loop {
            if !queue.is_empty() || end.peer_closed() {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            queue = (end.link.changed.wait_timeout(queue, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn hung_up(fd: &TwinFd) -> bool {
        fd.end().is_ok_and(End::peer_closed)
    }

    fn read_hung_up(fd: &TwinFd) -> bool {
        fd.end().map_or(true, End::peer_closed)
    }

    fn queued(fd: &TwinFd) -> Result<usize, Errno> {
        Ok(fd.end()?.inbound().iter().map(|p| p.bytes.len()).sum())
    }

    fn check_channel_end(fd: &TwinFd) -> Result<(), &'static str> {
        match fd.end() {
            Ok(end) if !end.link.closed[end.side].load(Ordering::Acquire) => Ok(()),
            _ => Err("a channel end is not an endpoint"),
        }
    }

    fn identity(fd: &TwinFd) -> Option<(u64, u64)> {
        Some((0, Arc::as_ptr(&fd.0).addr() as u64))
    }

    fn duplicate(fd: &TwinFd) -> Result<TwinFd, Errno> {
        Ok(fd.clone())
    }
}

/// `bytes` as uninitialised-or-not bytes.
fn as_uninit(bytes: &[u8]) -> &[MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the slice is
    // shared, so nothing can write uninitialised bytes through it.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) }
}

// ===== regions =====

/// A region: zeroed, page-aligned memory, which its mappings point into.
#[derive(Debug)]
struct File {
    storage: Mutex<Storage>,
    sealed: AtomicBool,
}

#[derive(Debug)]
struct Storage {
    ptr: NonNull<u8>,
    /// Bytes allocated (a whole number of pages, at least one).
    cap: usize,
    /// The region's size.
    size: usize,
    /// Where `write_all` appends.
    offset: usize,
    /// Live mappings: the memory cannot move while there are any.
    maps: usize,
}

// SAFETY: `ptr` is a heap allocation owned by the `File`, reached only
// under its mutex (or through a mapping, whose accesses are its owner's
// rule, as with a real shared mapping).
unsafe impl Send for Storage {}

impl Storage {
    fn new(size: usize) -> Result<Storage, Errno> {
        let cap = size.max(1).next_multiple_of(PAGE);
        let layout = Layout::from_size_align(cap, PAGE).map_err(|_| Errno::NOMEM)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Errno::NOMEM)?;
        Ok(Storage {
            ptr,
            cap,
            size,
            offset: 0,
            maps: 0,
        })
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, PAGE).expect("checked at allocation");
        // SAFETY: `ptr` was allocated with this layout, and no mapping is
        // left (each holds the `File`).
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A mapping of a twin region: keeps the region alive.
#[derive(Debug)]
pub(crate) struct TwinMap {
    file: Arc<File>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: as for `Storage`: the memory is the region's, kept alive by `file`.
unsafe impl Send for TwinMap {}

impl Drop for TwinMap {
    fn drop(&mut self) {
        lock(&self.file.storage).maps -= 1;
    }
}

impl RegionMap for TwinMap {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn punch(&self) {
        // SAFETY: `ptr..ptr + len` lies in the region's allocation (`map`
        // checked), alive while `self` is; no Rust reference points into it.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len) };
    }
}

impl Memory for Twin {
    type Mapping = TwinMap;

    fn create_region(_name: &str, len: usize) -> Result<TwinFd, Errno> {
        let file = File {
            storage: Mutex::new(Storage::new(len)?),
            sealed: AtomicBool::new(false),
        };
        Ok(TwinFd(Arc::new(Handle::Region(Arc::new(file)))))
    }

    fn seal(fd: &TwinFd) -> Result<(), Errno> {
        fd.file()?.sealed.store(true, Ordering::Release);
        Ok(())
    }

    fn sealed(fd: &TwinFd) -> Result<bool, Errno> {
        Ok(fd.file()?.sealed.load(Ordering::Acquire))
    }

    fn stat(fd: &TwinFd) -> Result<(u64, (u64, u64)), Errno> {
        let file = fd.file()?;
        let size = lock(&file.storage).size as u64;
        Ok((size, (1, Arc::as_ptr(file).addr() as u64)))
    }

    fn on_hugetlbfs(fd: &TwinFd) -> Result<bool, Errno> {
        fd.file().map(|_| false)
    }

    fn allocate(fd: &TwinFd, len: usize) -> Result<(), Errno> {
        match len <= lock(&fd.file()?.storage).size {
            true => Ok(()),
            false => Err(Errno::PERM),
        }
    }

    fn write_all(fd: &TwinFd, bytes: &[u8]) -> Result<(), Errno> {
        let file = fd.file()?;
        let mut storage = lock(&file.storage);
        let end = storage.offset + bytes.len();
        if end > storage.size && file.sealed.load(Ordering::Acquire) {
            return Err(Errno::PERM);
        }
        if end > storage.cap {
            if storage.maps > 0 {
                return Err(Errno::NOSPC);
            }
            let mut grown = Storage::new(end)?;
            // SAFETY: both allocations are ours and distinct; the old one
            // holds `size` initialised bytes, the new one room for `end`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    storage.ptr.as_ptr(),
                    grown.ptr.as_ptr(),
                    storage.size,
                )
            };
            (grown.size, grown.offset) = (storage.size, storage.offset);
            *storage = grown;
        }
        let at = storage.offset;
        // SAFETY: `at + bytes.len() = end <= cap`: within the allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), storage.ptr.as_ptr().add(at), bytes.len())
        };
        storage.offset = end;
        storage.size = storage.size.max(end);
        Ok(())
    }

    fn same_file(a: &TwinFd, b: &TwinFd) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    fn map(fd: &TwinFd, len: usize) -> Result<TwinMap, Errno> {
        let file = fd.file()?;
        let mut storage = lock(&file.storage);
        if len == 0 || len > storage.cap {
            return Err(Errno::INVAL);
        }
        storage.maps += 1;
        Ok(TwinMap {
            file: file.clone(),
            ptr: storage.ptr,
            len,
        })
    }

    fn futex_wait(word: &AtomicU32, expected: u32, _timeout: Duration) {
        // A spurious return, which the contract allows: the caller looks again.
        if word.load(Ordering::Acquire) == expected {
            std::thread::yield_now();
        }
    }

    fn futex_wake(_word: &AtomicU32, _n: u32) {}

    fn smp() -> bool {
        std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
    }

    fn current_cpu() -> Option<u32> {
        None
    }
}
