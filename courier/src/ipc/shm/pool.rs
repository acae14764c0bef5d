//! The sender's side of the region protocol: regions, their claims, and
//! the pool that reuses them.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use rustix::io::Errno;

use super::*;
use crate::ipc::config::Config;
use crate::ipc::platform::{Memory, Os};
use crate::ipc::wire::SKEW_ALIGN;

/// A region owned by the sender.
pub(crate) struct Region {
    fd: OwnedFd,
    map: Mapping,
    /// The tag of the message that last carried the descriptor: the name
    /// the receiver knows the region by while it holds it.
    token: u64,
    /// Its place under [`MAX_KEPT_FDS`], for a region made for medium messages.
    _counted: Option<Counted>,
    /// Bytes of the file, from its start, whose pages are allocated.
    backed: usize,
    /// Made for one message ([`Take::Once`]): not pooled after it.
    once: bool,
    /// How far into the payload area the message in it reaches, since the
    /// pool handed it out: the bytes counted in flight
    /// ([`Config::max_region_bytes_in_flight`]).
    extent: usize,
}

/// How a filled region reaches the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The receiver holds the region: name it by its token.
    Kept(u64),
    /// Send the descriptor (and make the message's tag the new token).
    Descriptor,
}

impl Region {
    /// A sealed region with room for at least `payload` bytes.
    fn create(payload: usize) -> Result<Region, Errno> {
        let len = (payload + REGION_HEADER)
            .max(MIN_REGION)
            .next_power_of_two();
        let fd = Os::create_region("courier-payload", len)?;
        let backed = REGION_HEADER + payload;
        Os::allocate(Os::borrow(&fd), backed)?;
        Os::seal(Os::borrow(&fd))?;
        let map = Os::map(Os::borrow(&fd), len)?;
        // Claimed from the start (sent by descriptor).
        map.state().store(BUSY, Ordering::Relaxed);
        Ok(Region {
            fd,
            map,
            token: 0,
            _counted: None,
            backed,
            once: false,
            extent: payload,
        })
    }

    /// Allocates the file's pages up to `len` bytes, if a payload will reach
    /// further than any before (once per region and size, a comparison
    /// after that).
    fn back(&mut self, len: usize) -> Result<(), Errno> {
        if len > self.backed {
            Os::allocate(Os::borrow(&self.fd), len)?;
            self.backed = len;
        }
        Ok(())
    }

    /// Gives up a claim made for a payload that cannot be written after all,
    /// or whose message could not be sent.
    pub(crate) fn abandon(&self, route: Route) {
        match route {
            Route::Kept(_) => self.unclaim(),
            // Maybe held before: `FREE` makes the next message send the
            // descriptor again, which is always right.
            Route::Descriptor => self.map.state().store(FREE, Ordering::Release),
        }
    }

    fn capacity(&self) -> usize {
        self.map.len() - REGION_HEADER
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        Os::borrow(&self.fd)
    }

    /// Records the tag of the message that carries the descriptor.
    pub(crate) fn set_token(&mut self, token: u64) {
        self.token = token;
    }

    /// Claims the region for a payload that reaches `extent` bytes into the
    /// payload area (its skew included): by its token if the receiver holds
    /// a mapping that covers it, else (if `take` allows) by descriptor, if
    /// no payload is in flight.
    fn claim(&self, extent: usize, take: Take) -> Option<Route> {
        if self.capacity() < extent {
            return None;
        }
        let state = self.map.state();
        // SYNC POINT: receiver's `Release` store in `MapCache::copy_from_last`
        // (or of `FREE`); after it, the receiver no longer reads the payload
        // we overwrite.
        let now = state.load(Ordering::Acquire);
        let covered = self.map.mapped().load(Ordering::Relaxed) >= (REGION_HEADER + extent) as u64;
        if now == HELD
            && covered
            && state
                .compare_exchange(HELD, HELD | BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Some(Route::Kept(self.token));
        }
        if take == Take::Kept {
            return None;
        }
        // The receiver may let go meanwhile (`HELD` -> `FREE`): read again.
        let now = state.load(Ordering::Acquire);
        let claimed = now & BUSY == 0
            && state
                .compare_exchange(now, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        claimed.then_some(Route::Descriptor)
    }

    /// Claimed as held, but sent by descriptor after all (the message carries
    /// channels): no kept message names it, so the receiver may let go of it
    /// even if this message is never read (refused, or given up).
    pub(crate) fn unhold(&self) {
        let _ = (self.map.state()).compare_exchange(
            HELD | BUSY,
            BUSY,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A kept message naming the region could not be sent: no payload is in
    /// flight after all.
    pub(crate) fn unclaim(&self) {
        let _ = self.map.state().compare_exchange(
            HELD | BUSY,
            HELD,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Copies `parts` (`total` bytes in all) into the payload area, `skew`
    /// bytes into it; if `streamed`, publishing how far every
    /// [`STREAM_CHUNK`] bytes (the receiver may be reading already).
    pub(crate) fn fill(
        &mut self,
        parts: &[IoSlice<'_>],
        skew: usize,
        total: usize,
        streamed: bool,
    ) {
        assert!(
            skew + total <= self.capacity(),
            "region too small for its payload"
        );
        let chunk = if streamed { STREAM_CHUNK } else { usize::MAX };
        let mut done = 0;
        for part in parts {
            let mut part = &part[..];
            assert!(done + part.len() <= total, "parts longer than their total");
            while !part.is_empty() {
                let n = part.len().min(chunk - done % chunk);
                // SAFETY: `skew + done + n <= skew + total <= capacity` (asserted):
                // the destination lies in the mapping's payload area; the source
                // is a live slice, which cannot overlap our mapping.
                unsafe {
                    let dst = self.map.payload().add(skew + done);
                    std::ptr::copy_nonoverlapping(part.as_ptr(), dst, n)
                };
                done += n;
                part = &part[n..];
                if streamed && done % chunk == 0 {
                    self.publish(done);
                }
            }
        }
        if streamed && done % chunk != 0 {
            self.publish(done);
        }
    }

    /// Readies the region for a streamed payload: nothing filled yet. Called
    /// before the message is sent: the `send` that announces it orders this
    /// store before the receiver's first look (the kernel's socket lock).
    pub(crate) fn open_stream(&self) {
        self.map.filled().store(0, Ordering::Release);
    }

    /// Tells the receiver that `filled` payload bytes are written.
    fn publish(&self, filled: usize) {
        // SYNC POINT: the receiver's `Acquire` in `Mapping::wait_filled`.
        self.map.filled().store(filled as u64, Ordering::Release);
        self.map.seq().fetch_add(1, Ordering::Release);
        Os::futex_wake(self.map.seq(), 1);
    }
}

/// A sender's pool of regions (one per destination: see `OsSender`).
#[derive(Default)]
pub(crate) struct Pool {
    regions: Mutex<Regions>,
    /// [`Take::Kept`] requests met by an empty pool: the first
    /// [`FIRST_REGION_AFTER`] go by socket, so that a channel carrying one
    /// or two messages (a reply channel) never pays for a region.
    kept_asks: AtomicU32,
}

/// A pool's regions, and the fork count they were made under: a forked
/// child forgets its parent's regions (both would claim them, and their
/// tokens would part ways as soon as one of them passed a descriptor again).
#[derive(Default)]
struct Regions {
    list: Vec<Region>,
    /// Regions the pool let go of while their message was in flight,
    /// watched until the receiver is done with them.
    sent: Vec<Sent>,
    forks: u64,
}

/// A region let go of by its pool (the pool keeps [`POOL_REGIONS`]) while
/// its message may be unread: its mapping, which keeps the memory alive and
/// shows the state word, and the message's extent. It is counted in flight
/// until the receiver has copied the message out or refused it (its `BUSY`
/// bit clear), or the channel fails ([`Pool::forget_sent`]); a message the
/// receiver gives up without its descriptor keeps it until then, counted,
/// which the bound limits. Then its pages are freed ([`discard`]).
struct Sent {
    map: Mapping,
    extent: usize,
}

/// Whether the message in a region is still to be copied out. A relaxed
/// load: nothing is read through the region on its account.
fn busy(map: &Mapping) -> bool {
    map.state().load(Ordering::Relaxed) & BUSY != 0
}

/// Frees the pages of a region the sender lets go of, then unmaps it:
/// `madvise(MADV_REMOVE)`, a hole punched in the whole file.
///
/// Its receiver may keep the descriptor and a mapping as long as it likes,
/// and it decides when the sender lets go of a region (its `BUSY` bit): were
/// the pages left in place, a receiver that clears the bit early and keeps
/// every descriptor would make its sender allocate a region per message,
/// none of them ever freed. Punched, the region holds no memory of the
/// sender's, whoever keeps it; a receiver that cleared the bit before it
/// was done copying reads zeros, which only spoils its own message. A
/// region the receiver writes into again is memory charged to the receiver.
///
/// # References
/// * `madvise(2)`, `MADV_REMOVE`; `fallocate(2)`, `FALLOC_FL_PUNCH_HOLE`
fn discard(map: Mapping) {
    // (No Rust reference points into the mapping: its bytes are only copied
    // raw, its header words read through atomics.)
    map.punch();
}

impl Regions {
    /// Payload bytes of the messages the receiver has not copied out yet
    /// (forgetting, first, the regions it is done with). Payload bytes, not
    /// regions' sizes, so that a large region reused for a small message
    /// counts as the message: the bound reads as bytes sent and not yet
    /// received.
    fn in_flight(&mut self) -> usize {
        self.prune();
        let sent: usize = self.sent.iter().map(|s| s.extent).sum();
        let pooled: usize = (self.list.iter())
            .filter(|r| busy(&r.map))
            .map(|r| r.extent)
            .sum();
        sent + pooled
    }

    /// Frees the regions let go of whose message the receiver is done with.
    fn prune(&mut self) {
        let mut i = 0;
        while i < self.sent.len() {
            match busy(&self.sent[i].map) {
                true => i += 1,
                false => discard(self.sent.swap_remove(i).map),
            }
        }
    }
}

impl Drop for Regions {
    /// The pool's regions no message is in flight in are freed (a receiver
    /// may keep them held); the others keep their messages, which the
    /// receiver may still read, and their memory until it lets go.
    fn drop(&mut self) {
        for region in std::mem::take(&mut self.list) {
            if !busy(&region.map) {
                discard(region.map);
            }
        }
        self.prune();
    }
}

impl Pool {
    /// The regions, once a fork since they were made has been dealt with.
    fn lock(&self) -> std::sync::MutexGuard<'_, Regions> {
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let forks = crate::ipc::transport::tag::forks();
        if regions.forks != forks {
            regions.list.clear();
            regions.sent.clear();
            regions.forks = forks;
        }
        regions
    }
}

/// How far into a region's payload area `parts` go: so far that the second
/// part (a typed message's byte string, the bulk of it) starts on a cache
/// line, as a bytes channel's one part does (see `wire`'s `skew`).
fn skew(parts: &[IoSlice<'_>]) -> usize {
    match parts {
        [head, _, ..] => (SKEW_ALIGN - head.len() % SKEW_ALIGN) % SKEW_ALIGN,
        _ => 0,
    }
}

/// [`Take::Kept`] requests an empty pool turns down before it creates a region.
const FIRST_REGION_AFTER: u32 = 2;

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

/// Which regions [`Pool::take`] may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Any free region, or a new one.
    Any,
    /// Only a region the receiver holds, or a first region for an empty
    /// pool that has been asked a few times (so the next message finds one
    /// held): for payloads the socket carries well, which would lose by
    /// passing a descriptor every time.
    Kept,
    /// A pooled region the receiver holds, else a new one for this message
    /// alone, let go once sent (its descriptor is not kept): a medium
    /// message that may not take the socket (its sender has a ring) and
    /// finds the process's budget of kept regions spent.
    Once,
}

impl Pool {
    /// A region with room for `parts` (`total` bytes) `skew` bytes into its
    /// payload area, to be filled ([`Region::fill`]) and sent by the route
    /// returned, and that skew; `None` if `take` allows none (or, for a
    /// medium message, none can be made). Give it back with [`Pool::put`]
    /// once it has been sent.
    pub(crate) fn take(
        &self,
        parts: &[IoSlice<'_>],
        total: usize,
        take: Take,
    ) -> Result<Option<(Region, Route, usize)>, Errno> {
        let skew = skew(parts);
        // In memory, so far below `usize::MAX`.
        let extent = total + skew;
        let reused = {
            let mut guard = self.lock();
            let regions = &mut guard.list;
            let claimed = (regions.iter().enumerate())
                .find_map(|(i, r)| r.claim(extent, take).map(|route| (i, route)));
            let mut counted = None;
            if claimed.is_none() && take == Take::Kept {
                // A second region when the first is busy (in flight, or left
                // busy by a message the receiver refused); none past that.
                let streak = match regions.len() {
                    0 => self.kept_asks.fetch_add(1, Ordering::Relaxed),
                    n if n < POOL_REGIONS => FIRST_REGION_AFTER,
                    _ => 0,
                };
                if streak < FIRST_REGION_AFTER {
                    return Ok(None);
                }
                counted = Counted::sender();
                if counted.is_none() {
                    return Ok(None);
                }
            }
            if claimed.is_none() && matches!(take, Take::Any | Take::Once) {
                // Back-pressure (see `Config::max_region_bytes_in_flight`):
                // past the bound, the message goes in fragments.
                let bound = Config::max_region_bytes_in_flight_now();
                let in_flight = guard.in_flight() as u64;
                if in_flight > 0 && in_flight.saturating_add(extent as u64) > bound {
                    return Ok(None);
                }
            }
            let regions = &mut guard.list;
            match claimed {
                Some((i, route)) => Ok((regions.swap_remove(i), route)),
                None => Err(counted),
            }
        };
        let (region, route) = match reused {
            Ok((mut region, route)) => {
                region.extent = extent;
                if let Err(e) = region.back(REGION_HEADER + extent) {
                    region.abandon(route);
                    self.put(region);
                    return match take {
                        Take::Kept => Ok(None),
                        _ => Err(e),
                    };
                }
                (region, route)
            }
            Err(counted) => {
                let mut region = match Region::create(extent) {
                    Ok(region) => region,
                    // A medium message still has the socket, whole. (A large
                    // one fails: in fragments, a thread sending to itself
                    // would block on its own receiver.)
                    Err(_) if take == Take::Kept => return Ok(None),
                    Err(e) => return Err(e),
                };
                region._counted = counted;
                region.once = take == Take::Once;
                (region, Route::Descriptor)
            }
        };
        Ok(Some((region, route, skew)))
    }

    /// Returns a sent region to the pool; it is reused once the receiver
    /// frees it. A full pool forgets its oldest region (the receiver may still
    /// hold it; its mapping keeps the memory alive until it is done).
    pub(crate) fn put(&self, region: Region) {
        let mut guard = self.lock();
        guard.prune();
        if region.once {
            let Region { map, extent, .. } = region;
            match busy(&map) {
                true => guard.sent.push(Sent { map, extent }),
                false => discard(map),
            }
            return;
        }
        if guard.list.len() >= POOL_REGIONS {
            let Region { map, extent, .. } = guard.list.remove(0);
            match busy(&map) {
                // Counted, and its memory kept, until the receiver is done.
                true => guard.sent.push(Sent { map, extent }),
                false => discard(map),
            }
        }
        guard.list.push(region);
    }

    /// Frees the regions let go of: the channel failed (its receiver is
    /// gone), so none of their messages will be read.
    pub(crate) fn forget_sent(&self) {
        for sent in std::mem::take(&mut self.lock().sent) {
            discard(sent.map);
        }
    }
}
