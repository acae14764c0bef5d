//! Random tags: what ties a message to its descriptor packet, and names a
//! region the receiver holds.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::ipc::platform::{Os, Process};

/// A fresh tag for a message with descriptors, from the kernel's generator:
/// unique across threads and processes, and unguessable by another sender on
/// the same channel (so it cannot slip its descriptors into someone else's
/// message), even one that receives this thread's other messages: tags are
/// independent random numbers, not a stream an observer could extrapolate.
///
/// Each thread keeps a pool of [`TAG_POOL`] tags filled by one `getrandom`
/// call: asking the kernel for every tag cost one system call per message
/// (~0.3 µs); 128 at once make it about 3 ns a message, for 1 KiB a thread.
/// A forked child inherits its parent's pools, so `fork` bumps
/// [`FORKS`] and a pool filled before the last fork is refilled: parent and
/// child never share tags.
pub(crate) fn random_tag() -> u64 {
    TAGS.with_borrow_mut(|pool| {
        let forks = FORKS.load(Ordering::Relaxed);
        if pool.left == 0 || pool.filled_at != Some(forks) {
            watch_forks();
            kernel_random(&mut pool.tags);
            pool.left = pool.tags.len();
            pool.filled_at = Some(forks);
        }
        pool.left -= 1;
        pool.tags[pool.left]
    })
}

/// Tags drawn from the kernel at once.
const TAG_POOL: usize = 128;

/// A thread's unused tags.
struct TagPool {
    tags: [u64; TAG_POOL],
    /// Tags not handed out yet: `tags[..left]`.
    left: usize,
    /// The [`FORKS`] count when the pool was filled.
    filled_at: Option<u64>,
}

thread_local! {
    static TAGS: RefCell<TagPool> = const {
        RefCell::new(TagPool {
            tags: [0; TAG_POOL],
            left: 0,
            filled_at: None,
        })
    };
}

/// Forks this process has seen since tags were first drawn (in the child of
/// each fork, one more than in its parent).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Forks this process has seen (see [`FORKS`]); watched from the first call.
pub(crate) fn forks() -> u64 {
    watch_forks();
    FORKS.load(Ordering::Relaxed)
}

/// Registers the `fork` hook that bumps [`FORKS`] in the child, once.
fn watch_forks() {
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    static WATCHING: Once = Once::new();
    WATCHING.call_once(|| {
        // (`in_child` only does an atomic add, which is async-signal-safe.)
        let registered = Os::on_fork_in_child(in_child);
        // Only for lack of memory; a child could then hand out the rest of
        // its parent's pool (the same tags as the parent, until refilled).
        debug_assert!(registered, "pthread_atfork failed");
    });
}

/// Fills `out` from the kernel's generator.
fn kernel_random(out: &mut [u64; TAG_POOL]) {
    let mut bytes = [0u8; TAG_POOL * 8];
    if Os::fill_random(&mut bytes).is_err() {
        // No kernel generator (pre-3.17): fall back to std's random seeds.
        out.iter_mut().for_each(|tag| *tag = fallback_random());
        return;
    }
    for (tag, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        *tag = u64::from_le_bytes(chunk.try_into().expect("8-byte chunks"));
    }
}

fn fallback_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    /// Without the refill, a forked child's next tag would equal its
    /// parent's next tag (both take the next one of the same pool).
    #[test]
    fn a_forked_child_draws_other_tags_than_its_parent() {
        let _ = random_tag();
        let (read, write) = rustix::pipe::pipe().unwrap();
        // SAFETY: the child only draws a tag (a thread-local, an atomic
        // load, `getrandom`) and writes it to a pipe before `_exit`; it
        // takes no lock another thread could have held at the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let tag = random_tag().to_le_bytes();
            let _ = rustix::io::write(&write, &tag);
            // SAFETY: ends the child without running the parent's exit hooks.
            unsafe { libc::_exit(0) };
        }
        drop(write);
        let mut child = [0u8; 8];
        let mut got = 0;
        while got < child.len() {
            let n = rustix::io::read(&read, &mut child[got..]).unwrap();
            assert_ne!(n, 0, "the child wrote no tag");
            got += n;
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_ne!(u64::from_le_bytes(child), random_tag());
    }

    #[test]
    fn tags_do_not_repeat_within_a_thread() {
        let tags: std::collections::HashSet<u64> = (0..10_000).map(|_| random_tag()).collect();
        assert_eq!(tags.len(), 10_000);
    }
}
