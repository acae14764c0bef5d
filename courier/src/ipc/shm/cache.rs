//! The receiver's side of the region protocol: the mappings it keeps, and
//! the regions it holds.

use std::sync::atomic::Ordering;

use super::copy::{copy_raw, Copied};
use super::*;
use crate::ipc::transport::Split;

/// A region a receiver keeps mapped.
struct Held {
    /// `(st_dev, st_ino)`: the same region arriving again by descriptor.
    key: (u64, u64),
    /// The name kept messages use for it (see [`Route::Kept`]).
    token: u64,
    /// `Some` if the region is held (its state says `HELD`, and kept messages
    /// may name it): the descriptor, so the region can move with the
    /// receiver ([`MapCache::take_kept`]), and its place under the budget.
    /// `None`: mapped for reuse only, its descriptor comes with each message.
    held: Option<(OwnedFd, Counted)>,
    map: Mapping,
}

impl Held {
    /// Marks the region done with by the message copied out of it: held
    /// (the receiver keeps it, and says how far it maps it) or free.
    fn done_with(&self) {
        let map = &self.map;
        let state = match self.held {
            Some(_) => {
                map.mapped().store(map.len() as u64, Ordering::Relaxed);
                HELD
            }
            None => FREE,
        };
        // SYNC POINT: sender's `Acquire` in `Region::claim`: the copy is
        // done before the sender may overwrite the payload.
        map.state().store(state, Ordering::Release);
    }

    /// Whether the receiver may unmap the region now: no message can name it.
    fn releasable(&self) -> bool {
        self.held.is_none() || self.map.release()
    }
}

/// A receiver's cache of mapped regions, most recently used last.
#[derive(Default)]
pub(crate) struct MapCache {
    entries: Vec<Held>,
}

impl std::fmt::Debug for MapCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapCache")
            .field("mapped", &self.entries.len())
            .finish()
    }
}

impl Drop for MapCache {
    fn drop(&mut self) {
        // Let go of every region no message names (`HELD` -> `FREE`), so that
        // its sender passes the descriptor again: a receiver rebuilt from a
        // duplicate of this one's socket does not hold them. A region a kept
        // message in flight names stays as it is.
        for entry in &self.entries {
            entry.releasable();
        }
    }
}

/// A region that moves with its receiver, as [`MapCache::take_kept`] gives it.
pub(crate) struct KeptRegion {
    pub token: u64,
    /// How far it was mapped (the new owner maps as far, no farther than
    /// the region is long).
    pub len: u64,
    pub fd: OwnedFd,
}

/// How a copy out of a region ended.
#[derive(Debug)]
pub(crate) enum Progress {
    /// The payload is all copied: `true` if the predicted byte string went
    /// to its own buffer.
    Done(bool),
    /// A streamed payload had not all arrived when the receive had to
    /// return ([`Stream::pause`]): what came is copied, the region stays
    /// mapped and busy, and [`MapCache::resume`] goes on.
    Paused(PausedCopy),
}

/// A streamed copy put aside (see [`Progress::Paused`]).
pub(crate) struct PausedCopy {
    /// The region (`st_dev`, `st_ino`) and the message's tag: the cache
    /// entry the copy reads, unless `own`.
    key: (u64, u64),
    token: u64,
    /// Payload bytes copied so far.
    done: usize,
    /// Whether the receive that paused it copied anything.
    pub progressed: bool,
    /// Whether the copy so far sent the predicted string to its own buffer.
    pub split: bool,
    /// The region's mapping, if the cache could not keep it.
    own: Option<Mapping>,
    /// The region's descriptor, for a message that brought one: it goes
    /// with the message if the receiver moves (`None` if it could not be
    /// kept, or for a kept message, whose region moves as held).
    pub fd: Option<OwnedFd>,
}

impl std::fmt::Debug for PausedCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PausedCopy")
            .field("done", &self.done)
            .field("split", &self.split)
            .field("cached", &self.own.is_none())
            .finish()
    }
}

/// Copies from payload byte `from` on out of a region the cache does not
/// keep (`map`, the whole region or at least `REGION_HEADER + skew + total`
/// bytes of it, checked by `copy_out`), and lets it go unless the copy
/// pauses.
#[allow(clippy::too_many_arguments)]
fn copy_once(
    map: Mapping,
    (key, token): ((u64, u64), u64),
    span: Span<'_>,
    from: usize,
    dst: &mut Vec<u8>,
    split: Option<Split<'_>>,
    fd: Option<OwnedFd>,
) -> Result<Progress, WireError> {
    // SAFETY: `copy_out` checked that `map` holds `REGION_HEADER + skew +
    // total` bytes of a region sealed against shrinking, for this span (a
    // resumed copy comes with the span it began with).
    let copied = unsafe { copy_raw(&map, span, from, dst, split) };
    if let Ok(Copied::Paused { done, split }) = copied {
        return Ok(Progress::Paused(PausedCopy {
            key,
            token,
            done,
            progressed: done > from,
            split,
            own: Some(map),
            fd,
        }));
    }
    // SYNC POINT: sender's `Acquire` in `Region::claim`.
    map.state().store(FREE, Ordering::Release);
    copied.map(Copied::into_progress)
}

/// Holds the region `fd`, mapped `len` bytes long, in `held` if the budget
/// allows; gives back what the copy keeps (`copy_from_last`'s `spare`): `fd`
/// if it is not held, and if the copy may pause, `fd` itself while a
/// duplicate is held (a duplicate that fails leaves the region unheld).
fn hold(
    held: &mut Option<(OwnedFd, Counted)>,
    fd: OwnedFd,
    len: usize,
    may_pause: bool,
) -> Option<OwnedFd> {
    let Some(counted) = Counted::held(len) else {
        return Some(fd);
    };
    if !may_pause {
        *held = Some((fd, counted));
        return None;
    }
    if let Ok(copy) = Os::duplicate(Os::borrow(&fd)) {
        *held = Some((copy, counted));
    }
    Some(fd)
}

impl MapCache {
    /// Validates the region `fd`, which came with a message tagged `token`,
    /// and appends its `total` payload bytes, `skew` bytes into the payload
    /// area, to `dst`, then marks the region free for its sender (held, if
    /// this cache keeps it). With `split`, if the payload is long enough,
    /// the predicted byte string goes to its own buffer instead (`true`
    /// returned; see `ipc::split`).
    pub(crate) fn copy_out(
        &mut self,
        fd: OwnedFd,
        token: u64,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let extent = span.extent()?;
        // Seals first, then the size: a region sealed against shrinking can
        // no longer get shorter than what we map (a size read before the
        // seals could be stale, and mapping past the end raises `SIGBUS`).
        // Asking for seals also fails at once for anything but shared memory,
        // before `fstat` could wait on, say, a FUSE daemon.
        if !Os::sealed(Os::borrow(&fd)).map_err(|_| WireError::BadRegion)? {
            return Err(WireError::BadRegion);
        }
        // Which region (`st_dev`, `st_ino`), and its size.
        let (size, key) = Os::stat(Os::borrow(&fd)).map_err(|_| WireError::BadRegion)?;
        let size = usize::try_from(size).map_err(|_| WireError::BadRegion)?;
        if size < REGION_HEADER || size - REGION_HEADER < extent {
            return Err(WireError::BadRegion);
        }
        let need = (REGION_HEADER + extent).next_multiple_of(PAGE);
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            if self.entries[i].map.len() >= need {
                // Seals are never removed, and a cached inode is alive (our
                // mapping holds it) so cannot be reused: checking a region
                // once, when it is first mapped, is enough.
                let mut entry = self.entries.remove(i);
                entry.token = token;
                let spare = match entry.held {
                    None => hold(&mut entry.held, fd, entry.map.len(), span.may_pause()),
                    Some(_) => Some(fd),
                };
                self.entries.push(entry);
                return self.copy_from_last(span, 0, dst, split, spare);
            }
            // Mapped too short for this message: map it again below.
            drop(self.entries.remove(i));
        }
        not_hugetlbfs(Os::borrow(&fd))?;
        let len = if size <= MAP_WHOLE { size } else { need };
        let map = Os::map(Os::borrow(&fd), len).map_err(|_| WireError::BadRegion)?;
        if self.entries.len() >= CACHED_MAPPINGS {
            // Let go of the least recently used region no message names.
            match self.entries.iter().position(Held::releasable) {
                Some(i) => drop(self.entries.remove(i)),
                // All pinned: use this region once, and keep nothing.
                None => return copy_once(map, (key, token), span, 0, dst, split, Some(fd)),
            }
        }
        let mut held = None;
        // Over the budget: mapped for reuse, not held.
        let spare = hold(&mut held, fd, map.len(), span.may_pause());
        self.entries.push(Held {
            key,
            token,
            held,
            map,
        });
        self.copy_from_last(span, 0, dst, split, spare)
    }

    /// Appends the `total` payload bytes of the held region named `token`,
    /// `skew` bytes into its payload area, to `dst` (a [`Route::Kept`]
    /// message), as [`MapCache::copy_out`] does.
    pub(crate) fn copy_kept(
        &mut self,
        token: u64,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let extent = span.extent()?;
        let i = self
            .entries
            .iter()
            .position(|e| e.token == token && e.held.is_some())
            .ok_or(WireError::BadRegion)?;
        // Checked against our own mapping, never the peer's `mapped` word.
        if extent > self.entries[i].map.len().saturating_sub(REGION_HEADER) {
            self.skip_kept(token);
            return Err(WireError::BadRegion);
        }
        let held = self.entries.remove(i);
        self.entries.push(held);
        self.copy_from_last(span, 0, dst, split, None)
    }

    /// Goes on with a copy that [paused](Progress::Paused): `span` must
    /// describe the same payload as when it began (the same header), and
    /// `split` be given exactly if the copy so far used one
    /// ([`PausedCopy::split`]), with the string copied so far.
    pub(crate) fn resume(
        &mut self,
        paused: PausedCopy,
        span: Span<'_>,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
    ) -> Result<Progress, WireError> {
        let PausedCopy {
            key,
            token,
            done,
            own,
            fd,
            ..
        } = paused;
        if let Some(map) = own {
            return copy_once(map, (key, token), span, done, dst, split, fd);
        }
        // Nothing else of this receiver's used the cache meanwhile (its
        // receives finish this message first), so the entry is still mapped;
        // checked all the same, as `copy_kept` checks a kept message.
        let extent = span.extent()?;
        let i = (self.entries.iter())
            .position(|e| {
                e.key == key
                    && e.token == token
                    && e.map.len().saturating_sub(REGION_HEADER) >= extent
            })
            .ok_or(WireError::BadRegion)?;
        let entry = self.entries.remove(i);
        self.entries.push(entry);
        self.copy_from_last(span, done, dst, split, fd)
    }

    /// A kept message naming `token` was refused: the region is free again
    /// for its sender (and still held).
    pub(crate) fn skip_kept(&mut self, token: u64) {
        if let Some(entry) = (self.entries.iter()).find(|e| e.token == token && e.held.is_some()) {
            entry.map.state().store(HELD, Ordering::Release);
        }
    }

    /// Copies out of the most recently used entry, which maps at least
    /// `REGION_HEADER + skew + total` bytes, from payload byte `from` on, and
    /// marks it held (or free, if it is only mapped) unless the copy pauses.
    /// `spare`: the descriptor the message brought, if the entry did not
    /// keep it, for a copy that pauses (`PausedCopy::fd`).
    fn copy_from_last(
        &mut self,
        span: Span<'_>,
        from: usize,
        dst: &mut Vec<u8>,
        split: Option<Split<'_>>,
        spare: Option<OwnedFd>,
    ) -> Result<Progress, WireError> {
        let entry = self.entries.last_mut().ok_or(WireError::BadRegion)?;
        let map = &entry.map;
        // SAFETY: every caller checked `REGION_HEADER + skew + total <=
        // map.len()`, and a cached region is sealed against shrinking.
        let copied = unsafe { copy_raw(map, span, from, dst, split) };
        if let Ok(Copied::Paused { done, split }) = copied {
            // The region stays busy (the message is still being read), and
            // held if it was: a receiver that moves takes it along.
            let fd = spare;
            return Ok(Progress::Paused(PausedCopy {
                key: entry.key,
                token: entry.token,
                done,
                progressed: done > from,
                split,
                own: None,
                fd,
            }));
        }
        // (Also after a failed copy: the region is no use to this message
        // any more.)
        entry.done_with();
        copied.map(Copied::into_progress)
    }

    /// Gives up a copy that paused, for a message that failed meanwhile:
    /// the region goes back to its sender as after a failed copy.
    pub(crate) fn give_up(&mut self, paused: PausedCopy) {
        let PausedCopy {
            key, token, own, ..
        } = paused;
        match own {
            // SYNC POINT: sender's `Acquire` in `Region::claim`.
            Some(map) => map.state().store(FREE, Ordering::Release),
            None => {
                if let Some(entry) =
                    (self.entries.iter()).find(|e| e.key == key && e.token == token)
                {
                    entry.done_with();
                }
            }
        }
    }

    /// Empties the cache for a receiver that moves to another process: the
    /// regions no message can name are let go (their senders send the
    /// descriptor again), the others are returned, to travel with it.
    pub(crate) fn take_kept(&mut self) -> Vec<KeptRegion> {
        self.entries
            .drain(..)
            .filter(|e| !e.releasable())
            .filter_map(
                |Held {
                     token, held, map, ..
                 }| {
                    let (fd, _counted) = held?;
                    Some(KeptRegion {
                        token,
                        len: map.len() as u64,
                        fd,
                    })
                },
            )
            .collect()
    }

    /// Holds `region` again, in the process a receiver moved to, if the
    /// process's budget for held regions allows: else `Ok(false)`, and the
    /// messages that name it fail alone ([`WireError::BadRegion`]). The
    /// region is checked as if it had just arrived, and its mapping is
    /// charged to `budget`, what the message that brought it may still map
    /// (its receiver's size limit less what came before).
    pub(crate) fn hold(&mut self, region: KeptRegion, budget: &mut u64) -> Result<bool, WireError> {
        // Seals before size, as in `copy_out`.
        let sealed = Os::sealed(Os::borrow(&region.fd)).map_err(|_| WireError::BadRegion)?;
        not_hugetlbfs(Os::borrow(&region.fd))?;
        let (size, key) = Os::stat(Os::borrow(&region.fd)).map_err(|_| WireError::BadRegion)?;
        let len = usize::try_from(region.len).map_err(|_| WireError::BadRegion)?;
        let sane = sealed && region.len <= size && len > REGION_HEADER;
        if !sane {
            return Err(WireError::BadRegion);
        }
        if region.len > *budget {
            return Err(WireError::TooLarge {
                claimed: region.len,
                limit: *budget,
            });
        }
        *budget -= region.len;
        if self.entries.len() >= CACHED_MAPPINGS {
            return Ok(false);
        }
        // Counted before it is mapped: over the process's budget, it is not.
        let Some(counted) = Counted::held(len) else {
            return Ok(false);
        };
        let map = Os::map(Os::borrow(&region.fd), len).map_err(|_| WireError::BadRegion)?;
        self.entries.push(Held {
            key,
            token: region.token,
            held: Some((region.fd, counted)),
            map,
        });
        Ok(true)
    }
}

/// Hands back to its sender the region `fd` of a message this receiver
/// refused: the message will never be copied out, and its sender counts the
/// region in flight while it is busy ([`Config::max_region_bytes_in_flight`](crate::ipc::Config::max_region_bytes_in_flight)).
/// Anything but a sealed shared-memory region (a fragment carrier, or
/// whatever a peer sent) is left alone, as is a region not marked busy.
pub(crate) fn release_refused(fd: BorrowedFd<'_>) {
    // Seals before size, as in `MapCache::copy_out`.
    let sealed = Os::sealed(fd).is_ok_and(|sealed| sealed);
    if !sealed || not_hugetlbfs(fd).is_err() {
        return;
    }
    let long_enough = Os::stat(fd).is_ok_and(|(size, _)| size >= PAGE as u64);
    if let (true, Ok(map)) = (long_enough, Os::map(fd, PAGE)) {
        // SYNC POINT: sender's `Acquire` in `Region::claim` (nothing of the
        // payload was read).
        let _ = (map.state()).compare_exchange(BUSY, FREE, Ordering::Release, Ordering::Relaxed);
    }
}
