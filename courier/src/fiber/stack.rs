//! Fiber stacks from a pool, after Ruby's fiber pool (Ruby feature #15997):
//! creating a fiber on a fresh `mmap`ed stack costs about 10 µs, on a reused
//! one well under 1 µs, so the pool is the whole game.
//!
//! ```text
//!  one mapping (a chunk) of N stacks, lowest address first
//!  +-------+-------------+-------+-------------+-----+-------+-------------+
//!  | guard | stack 0     | guard | stack 1     | ... | guard | stack N-1   |
//!  | page  | (grows down)| page  |             |     | page  |             |
//!  +-------+-------------+-------+-------------+-----+-------+-------------+
//!  PROT_NONE              PROT_NONE                   PROT_NONE
//! ```
//!
//! * **Chunks grow geometrically**: 8 stacks in the first mapping, then 16,
//!   32 ... up to [`MAX_CHUNK`] a mapping, so a program with a handful of
//!   fibers maps little and one with a million makes few `mmap` calls.
//! * **A freed stack goes on a LIFO free list**: the next fiber gets the stack
//!   whose top pages are still in the cache and mapped in. Each thread keeps a
//!   few stacks of its own ([`LOCAL_CACHE`]) in front of the shared list, so a
//!   spawn and a finish take no lock in the steady state.
//! * **Memory goes back to the kernel by policy**: a freed stack keeps its
//!   pages (giving them back with `madvise` on every release made reuse 6-10x
//!   slower in Ruby's measurements). Two marks decide, coldest stacks first:
//!   past [`HIGH_WATER`] (4,096) free stacks with their pages, the pages of
//!   the colder ones go back (`MADV_FREE`, once a stack), and the stacks stay
//!   mapped, so a burst that comes again reuses them at the cost of a page
//!   fault; past [`UNMAP_MARK`] (16,384) free stacks in all, the coldest are
//!   unmapped with their guard pages, so that a burst of fibers does not
//!   leave the process near its `vm.max_map_count` for good (where every
//!   later `mmap`, a thread's stack or a large allocation, would fail).
//! * **Every guard page splits the kernel's mapping** (a `PROT_NONE` page in
//!   the middle of a read-write one): a stack costs two entries against
//!   `vm.max_map_count` (65,530 by default), so about 32,000 fibers fit at the
//!   default, as with may's and corosensei's own stacks. Past that, a spawn
//!   fails with an error naming the setting; a million fibers need
//!   `sysctl -w vm.max_map_count=2100000` (two entries a stack, plus room).
//! * **A stack overflow is named**: it hits the guard page, and the `SIGSEGV`
//!   handler (on the thread's alternate signal stack, which Rust's runtime
//!   sets up for every thread it starts) recognises the pool's guard pages and
//!   reports `fiber <name> overflowed its <N> KiB stack` before it aborts.
//!   Any other fault goes on to the handler that was there before.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use corosensei::stack::{Stack, StackPointer};
use rustix::mm::{self, Advice, MapFlags, MprotectFlags, ProtFlags};

/// A page: the guard below each stack.
const PAGE: usize = 4096;
/// Stacks of the first mapping.
const FIRST_CHUNK: usize = 8;
/// Most stacks one mapping holds.
const MAX_CHUNK: usize = 1024;
/// Stacks a thread keeps in front of the shared free list.
const LOCAL_CACHE: usize = 16;
/// Free stacks kept with their pages.
const HIGH_WATER: usize = 4096;
/// Free stacks kept mapped (with their pages or not).
const UNMAP_MARK: usize = 16_384;

/// A stack of the pool: `size` usable bytes above a guard page. Dropping it
/// gives it back to the pool it came from.
pub(crate) struct PooledStack {
    /// The lowest usable byte (the guard page is just below).
    bottom: NonNull<u8>,
    size: usize,
}

// SAFETY: a stack is a range of memory owned by whoever holds the
// `PooledStack`; it holds no thread-bound state, and a fiber that moves to
// another worker takes its stack along.
unsafe impl Send for PooledStack {}

// SAFETY: `base` and `limit` name a range of `size` read-write bytes above
// a `PROT_NONE` guard page (set up by `Chunk::map` before the stack is handed
// out, and never changed while it is), so an overflow faults on the guard;
// `size` is at least one page, more than `MIN_STACK_SIZE`, and both ends are
// page-aligned, so aligned to `STACK_ALIGNMENT`.
unsafe impl Stack for PooledStack {
    fn base(&self) -> StackPointer {
        let top = self.bottom.as_ptr() as usize + self.size;
        StackPointer::new(top).expect("a mapped address is never zero")
    }

    fn limit(&self) -> StackPointer {
        // The limit includes the guard page (see the trait's docs).
        StackPointer::new(self.bottom.as_ptr() as usize - PAGE).expect("above the zero page")
    }
}

impl Drop for PooledStack {
    fn drop(&mut self) {
        release(StackSlot {
            bottom: self.bottom,
            size: self.size,
        });
    }
}

/// A free stack, in a list.
#[derive(Clone, Copy)]
struct StackSlot {
    bottom: NonNull<u8>,
    size: usize,
}

// SAFETY: a free stack is memory no one uses; the slot is only its address.
unsafe impl Send for StackSlot {}

/// The shared free stacks of one stack size.
struct Pool {
    size: usize,
    /// Free stacks, LIFO: the warmest at the back, the coldest at the front.
    free: VecDeque<StackSlot>,
    /// The first `advised` free stacks have given their pages back.
    advised: usize,
    /// Stacks the next mapping holds.
    next_chunk: usize,
    /// Free stacks kept with their pages.
    high_water: usize,
    /// Free stacks kept mapped.
    unmap_mark: usize,
}

impl Pool {
    fn new(size: usize) -> Pool {
        Pool {
            size,
            free: VecDeque::new(),
            advised: 0,
            next_chunk: FIRST_CHUNK,
            high_water: HIGH_WATER,
            unmap_mark: UNMAP_MARK,
        }
    }

    /// The warmest free stack.
    fn pop(&mut self) -> Option<StackSlot> {
        let slot = self.free.pop_back()?;
        self.advised = self.advised.min(self.free.len());
        Some(slot)
    }

    /// Puts a stack freed just now at the warm end, and applies the marks.
    fn push(&mut self, slot: StackSlot) {
        self.free.push_back(slot);
        while self.free.len() > self.unmap_mark {
            let cold = self.free.pop_front().expect("longer than the mark");
            self.advised = self.advised.saturating_sub(1);
            // SAFETY: a free stack and its guard page are used by no one and
            // referenced by nothing (the free list held the only record of
            // them): the range is ours to unmap.
            let _ = unsafe { mm::munmap(cold.bottom.as_ptr().sub(PAGE).cast(), cold.size + PAGE) };
        }
        while self.free.len() - self.advised > self.high_water {
            let cold = self.free[self.advised];
            // SAFETY: a free stack is used by no one: its contents may go
            // (the next fiber on it starts from an empty stack).
            let _ =
                unsafe { mm::madvise(cold.bottom.as_ptr().cast(), cold.size, Advice::LinuxFree) };
            self.advised += 1;
        }
    }
}

/// The pools, one per stack size in use (few: a runtime's size, and any a
/// builder asked for).
static POOLS: Mutex<Vec<Pool>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's cache of free stacks, in front of the shared lists.
    static LOCAL: RefCell<Vec<StackSlot>> = const { RefCell::new(Vec::new()) };
}

/// The usable bytes of a stack asked for as `size` bytes: whole pages.
fn rounded(size: usize) -> usize {
    size.max(PAGE).next_multiple_of(PAGE)
}

impl PooledStack {
    /// Whether this is the stack [`take`] would give for `size` bytes.
    pub(crate) fn fits(&self, size: usize) -> bool {
        self.size == rounded(size)
    }
}

/// A stack of `size` usable bytes (rounded up to whole pages), from the pool.
pub(crate) fn take(size: usize) -> io::Result<PooledStack> {
    let size = rounded(size);
    let local = LOCAL.try_with(|local| {
        let mut local = local.borrow_mut();
        let i = local.iter().rposition(|s| s.size == size)?;
        Some(local.swap_remove(i))
    });
    if let Ok(Some(slot)) = local {
        return Ok(PooledStack {
            bottom: slot.bottom,
            size,
        });
    }
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let pool = match pools.iter().position(|p| p.size == size) {
        Some(i) => &mut pools[i],
        None => {
            pools.push(Pool::new(size));
            pools.last_mut().expect("just pushed")
        }
    };
    if pool.free.is_empty() {
        let count = pool.next_chunk;
        let chunk = Chunk::map(size, count)?;
        pool.next_chunk = (count * 2).min(MAX_CHUNK);
        // Highest first, so that the lowest stack is taken first.
        pool.free.extend((0..count).rev().map(|i| chunk.stack(i)));
    }
    let slot = pool.pop().expect("refilled above");
    Ok(PooledStack {
        bottom: slot.bottom,
        size,
    })
}

/// Gives a stack back: to this thread's cache, or the shared list.
fn release(slot: StackSlot) {
    let spilled = LOCAL.try_with(|local| {
        let mut local = local.borrow_mut();
        if local.len() < LOCAL_CACHE {
            local.push(slot);
            return None;
        }
        // Full: the coldest half goes to the shared list with this one.
        let mut spill: Vec<StackSlot> = local.drain(..LOCAL_CACHE / 2).collect();
        spill.push(slot);
        Some(spill)
    });
    let spill = match spilled {
        Ok(None) => return,
        Ok(Some(spill)) => spill,
        // The thread is exiting: straight to the shared list.
        Err(_) => vec![slot],
    };
    give_back(spill);
}

/// Puts `slots` on their pools' shared lists, and gives back the pages of
/// the free stacks past the high-water mark.
fn give_back(slots: Vec<StackSlot>) {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    for slot in slots {
        let Some(pool) = pools.iter_mut().find(|p| p.size == slot.size) else {
            continue;
        };
        pool.push(slot);
    }
}

/// Gives this thread's cached stacks back to the shared lists (a worker
/// that stops, so that its stacks are not stranded).
pub(crate) fn flush_local() {
    let slots = LOCAL
        .try_with(|local| std::mem::take(&mut *local.borrow_mut()))
        .unwrap_or_default();
    if !slots.is_empty() {
        give_back(slots);
    }
}

/// One mapping of `count` stacks. Never unmapped: its stacks are reused for
/// the life of the process.
struct Chunk {
    start: usize,
    size: usize,
}

impl Chunk {
    /// `mmap` of the chunk, then a guard page below each stack.
    fn map(size: usize, count: usize) -> io::Result<Chunk> {
        let stride = size + PAGE;
        let len = stride * count;
        // SAFETY: a fresh private mapping chosen by the kernel (null hint)
        // aliases no Rust object. `NORESERVE`: stacks are mostly untouched,
        // and must not count against the commit limit in full.
        let ptr = unsafe {
            mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::STACK,
            )
        }
        .map_err(io::Error::from)?;
        let start = ptr as usize;
        for i in 0..count {
            let guard = (start + i * stride) as *mut std::ffi::c_void;
            // SAFETY: the page lies inside the mapping just made, which no
            // one uses yet.
            if let Err(e) = unsafe { mm::mprotect(guard, PAGE, MprotectFlags::empty()) } {
                // SAFETY: the whole mapping is ours and unused.
                let _ = unsafe { mm::munmap(ptr, len) };
                return Err(map_count_error(e.into()));
            }
        }
        register_guards(start, len, size);
        Ok(Chunk { start, size })
    }

    fn stack(&self, i: usize) -> StackSlot {
        let bottom = self.start + i * (self.size + PAGE) + PAGE;
        StackSlot {
            bottom: NonNull::new(bottom as *mut u8).expect("a mapped address is never zero"),
            size: self.size,
        }
    }
}

/// The error of a guard page the kernel refused: with `ENOMEM` from
/// `mprotect`, the process's map count is at `vm.max_map_count`.
fn map_count_error(e: io::Error) -> io::Error {
    if e.raw_os_error() != Some(libc::ENOMEM) {
        return e;
    }
    let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned());
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!(
            "cannot map another fiber stack: the process has reached vm.max_map_count \
             ({limit}; each fiber stack takes two map entries); raise it, e.g. \
             `sysctl -w vm.max_map_count=2100000` for a million fibers"
        ),
    )
}

// ===== overflow reports =====

/// Mappings whose guard pages the `SIGSEGV` handler recognises: `(start,
/// len, stack size)`, appended once each, never removed (chunks live as long
/// as the process), read without a lock by the handler.
const MAX_CHUNKS: usize = 4096;
static CHUNKS: [[AtomicUsize; 3]; MAX_CHUNKS] =
    [const { [const { AtomicUsize::new(0) }; 3] }; MAX_CHUNKS];
static CHUNK_COUNT: AtomicUsize = AtomicUsize::new(0);

fn register_guards(start: usize, len: usize, size: usize) {
    install_handler();
    let i = CHUNK_COUNT.load(Ordering::Relaxed);
    if i < MAX_CHUNKS {
        CHUNKS[i][0].store(start, Ordering::Relaxed);
        CHUNKS[i][1].store(len, Ordering::Relaxed);
        CHUNKS[i][2].store(size, Ordering::Relaxed);
        // SYNC POINT: the handler's `Acquire` load of the count.
        CHUNK_COUNT.store(i + 1, Ordering::Release);
    }
}

/// The handler that was installed before ours (its action and flags),
/// called for faults that are not a fiber's overflow.
static PREVIOUS_ACTION: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_FLAGS: AtomicUsize = AtomicUsize::new(0);

fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sigaction` with a zeroed struct completed below; the
        // handler only reads atomics and a thread-local `Cell`, writes to
        // stderr and aborts, or calls the previous handler.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_segv as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGSEGV, &action, &mut previous) == 0 {
                PREVIOUS_ACTION.store(previous.sa_sigaction, Ordering::Relaxed);
                PREVIOUS_FLAGS.store(previous.sa_flags as usize, Ordering::Relaxed);
            }
        }
    });
}

/// The `SIGSEGV` handler: a fault on a pool guard page is a fiber's stack
/// overflow, reported by name before the process aborts.
extern "C" fn on_segv(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an `SA_SIGINFO` handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let count = CHUNK_COUNT.load(Ordering::Acquire).min(MAX_CHUNKS);
    for chunk in &CHUNKS[..count] {
        let start = chunk[0].load(Ordering::Relaxed);
        let len = chunk[1].load(Ordering::Relaxed);
        let size = chunk[2].load(Ordering::Relaxed);
        if addr >= start && addr < start + len && (addr - start) % (size + PAGE) < PAGE {
            report_overflow(size);
        }
    }
    // Not ours: the previous handler, or the default action (the fault
    // repeats once this returns, and kills the process).
    let previous = PREVIOUS_ACTION.load(Ordering::Relaxed);
    let flags = PREVIOUS_FLAGS.load(Ordering::Relaxed) as libc::c_int;
    if previous == libc::SIG_DFL || previous == libc::SIG_IGN {
        // SAFETY: restoring the default action is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
        }
    } else if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: `previous` was installed as an `SA_SIGINFO` handler, with
        // this signature.
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(previous) };
        handler(signal, info, context);
    } else {
        // SAFETY: `previous` was installed as a plain handler.
        let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous) };
        handler(signal);
    }
}

/// Writes `fiber <name> overflowed its <N> KiB stack` to stderr with
/// `write(2)` only (async-signal-safe), then aborts.
fn report_overflow(size: usize) -> ! {
    // The running fiber's name: it lives in the fiber, alive (it is the one
    // overflowing).
    let name = super::sched::current_name()
        .unwrap_or("<unnamed>")
        .as_bytes();
    let mut digits = [0u8; 20];
    let mut n = size / 1024;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for part in [
        &b"fiber "[..],
        name,
        b" overflowed its ",
        &digits[i..],
        b" KiB stack\n",
    ] {
        // SAFETY: `write` of a live buffer to stderr.
        let _ = unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_are_reused_last_in_first_out() {
        let size = 3 * PAGE;
        let a = take(size).unwrap();
        let b = take(size).unwrap();
        let (a_bottom, b_bottom) = (a.bottom, b.bottom);
        assert_ne!(a_bottom, b_bottom);
        drop(a);
        drop(b);
        // The last freed comes back first.
        let c = take(size).unwrap();
        assert_eq!(c.bottom, b_bottom);
        let d = take(size).unwrap();
        assert_eq!(d.bottom, a_bottom);
    }

    #[test]
    fn chunks_grow_geometrically() {
        let size = 5 * PAGE;
        // The first mapping holds 8 stacks, the second 16: 24 stacks in two
        // mappings, each mapping contiguous.
        let stacks: Vec<_> = (0..24).map(|_| take(size).unwrap()).collect();
        let stride = size + PAGE;
        let runs = stacks
            .windows(2)
            .filter(|w| w[1].bottom.as_ptr() as usize != w[0].bottom.as_ptr() as usize + stride)
            .count();
        assert_eq!(runs, 1, "24 stacks of a new size come from two mappings");
    }

    /// Resident pages of the range `[bottom, bottom + len)`.
    fn resident(bottom: NonNull<u8>, len: usize) -> usize {
        let mut vec = vec![0u8; len / PAGE];
        // SAFETY: `mincore` writes one byte a page of a mapped range into a
        // buffer that large.
        let r = unsafe { libc::mincore(bottom.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn past_the_marks_pages_go_back_then_mappings() {
        // A pool of its own, with small marks: 2 stacks keep their pages, 4
        // stay mapped.
        let size = 2 * PAGE;
        let chunk = Chunk::map(size, 8).unwrap();
        let mut pool = Pool::new(size);
        (pool.high_water, pool.unmap_mark) = (2, 4);
        let slots: Vec<_> = (0..6).map(|i| chunk.stack(i)).collect();
        for slot in &slots {
            // SAFETY: a stack of a chunk only this test uses.
            unsafe { std::ptr::write_bytes(slot.bottom.as_ptr(), 1, size) };
            assert_eq!(resident(slot.bottom, size), 2);
        }
        for &slot in &slots {
            pool.push(slot);
        }
        // Six freed: the two coldest unmapped, the next two advised, the two
        // warmest kept whole.
        // (Whether the kernel still maps the coldest cannot be asked here:
        // the other tests of this process map memory meanwhile, which may
        // land in the range just given back.)
        assert_eq!(pool.free.len(), 4);
        assert_eq!(pool.advised, 2);
        let kept: Vec<_> = pool.free.iter().map(|s| s.bottom).collect();
        let warmest: Vec<_> = slots[2..].iter().map(|s| s.bottom).collect();
        assert_eq!(kept, warmest, "the two coldest left the pool");
        assert_eq!(
            resident(slots[5].bottom, size),
            2,
            "a warm stack kept its pages"
        );
        assert_eq!(
            resident(slots[4].bottom, size),
            2,
            "a warm stack kept its pages"
        );
        // `MADV_FREE` pages may stay until memory runs short; they are
        // still mapped and usable either way.
        // SAFETY: an advised free stack is still mapped read-write.
        unsafe { std::ptr::write_bytes(slots[2].bottom.as_ptr(), 2, size) };
        // LIFO, and taking into the advised stacks moves the mark down.
        assert_eq!(pool.pop().map(|s| s.bottom), Some(slots[5].bottom));
        assert_eq!(pool.pop().map(|s| s.bottom), Some(slots[4].bottom));
        assert_eq!(pool.pop().map(|s| s.bottom), Some(slots[3].bottom));
        assert_eq!(pool.advised, 1);
    }

    #[test]
    fn a_stack_is_usable_to_its_top_and_guarded_below() {
        let stack = take(2 * PAGE).unwrap();
        let top = stack.base().get();
        let limit = stack.limit().get();
        assert_eq!(top - limit, 3 * PAGE);
        // SAFETY: the usable range of a stack nobody else has.
        unsafe {
            std::ptr::write_bytes(stack.bottom.as_ptr(), 0xa5, 2 * PAGE);
        }
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let guard = format!("{:x}-{:x} ---p", limit, limit + PAGE);
        assert!(maps.contains(&guard), "no guard page at {guard}");
    }
}
