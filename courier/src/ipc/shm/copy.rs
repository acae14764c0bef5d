//! Copying a payload out of its region, as the sender writes it if it is
//! streamed.
#![allow(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::*;
use crate::ipc::platform::{Memory, Os};
use crate::ipc::transport::Split;

/// Where a message's payload lies in its region, and how it is written.
pub(crate) struct Span<'a> {
    /// Bytes into the payload area the payload starts (below `SKEW_ALIGN`).
    pub skew: usize,
    pub total: usize,
    /// `Some` for a streamed payload: how to wait for the rest.
    pub stream: Option<Stream<'a>>,
}

impl Span<'_> {
    /// Whether a copy of it may pause ([`Stream::pause`]).
    pub(super) fn may_pause(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.pause.is_some())
    }

    /// How far into the payload area the payload reaches.
    pub(super) fn extent(&self) -> Result<usize, WireError> {
        self.skew
            .checked_add(self.total)
            .ok_or(WireError::BadRegion)
    }
}

/// How a receiver waits for the rest of a streamed payload.
pub(crate) struct Stream<'a> {
    /// When to give up on it.
    pub deadline: Instant,
    /// When to stop waiting and put the copy aside
    /// ([`Progress::Paused`]); `None`: wait until the deadline. Looked at
    /// before every wait, so a peer that keeps writing a little cannot keep
    /// the receive past it either.
    pub pause: Option<Instant>,
    /// Whether to spin before sleeping (not for a copy that stalled last
    /// time: its sender is not writing).
    pub spin: bool,
    /// Whether a sender is left that could write the rest.
    pub alive: &'a dyn Fn() -> bool,
}

impl Mapping {
    /// Waits until a streamed payload of `total` bytes is filled past
    /// `done`, and returns how far (at most `total`); `None` if the stream's
    /// pause comes first.
    fn wait_filled(
        &self,
        done: usize,
        total: usize,
        stream: &Stream<'_>,
    ) -> Result<Option<usize>, WireError> {
        let mut alive = true;
        let mut spin_until = None;
        loop {
            let seq = self.seq().load(Ordering::Acquire);
            // SYNC POINT: the sender's `Release` in `Region::publish`: the
            // bytes below `filled` are written. A peer may store anything
            // here; it only decides which of its own bytes we copy.
            let filled = self.filled().load(Ordering::Acquire);
            let filled = usize::try_from(filled).unwrap_or(usize::MAX).min(total);
            // All of it there: copied whatever the clock says (the rest of
            // the copy waits for nothing).
            if filled == total && total > done {
                return Ok(Some(total));
            }
            // Then the clock, whatever the progress: a peer that creeps (a
            // byte at a time, just often enough) must outlast neither the
            // deadline nor the receive's pause.
            let now = Instant::now();
            if now >= stream.deadline {
                return Err(WireError::FragmentTimeout);
            }
            if stream.pause.is_some_and(|pause| now >= pause) {
                return Ok(None);
            }
            if filled > done {
                return Ok(Some(filled));
            }
            // Looked again after the last sender was seen gone (it may have
            // finished just before it went): nothing more will come.
            if !alive {
                return Err(WireError::Truncated);
            }
            let now = Instant::now();
            let until = *spin_until.get_or_insert_with(|| match stream.spin && Os::smp() {
                true => now + STREAM_SPIN,
                false => now,
            });
            if now < until {
                std::hint::spin_loop();
                continue;
            }
            if now >= stream.deadline {
                return Err(WireError::FragmentTimeout);
            }
            if stream.pause.is_some_and(|pause| now >= pause) {
                return Ok(None);
            }
            alive = (stream.alive)();
            if !alive {
                continue;
            }
            let until = stream
                .pause
                .map_or(stream.deadline, |p| p.min(stream.deadline));
            let nap = until.saturating_duration_since(now).min(STREAM_POLL);
            // Shared (not `PRIVATE`): the word lives in memory another
            // process maps. `EAGAIN` (`seq` moved), a timeout or `EINTR`:
            // look again.
            if crate::fiber::in_fiber() {
                // A fiber must not sleep in the kernel (its worker would):
                // it naps on its worker's timers, a little at a time.
                crate::fiber::sleep(
                    Duration::from_micros(200).min(until.saturating_duration_since(now)),
                );
                continue;
            }
            Os::futex_wait(self.seq(), seq, nap);
        }
    }
}

/// How [`copy_raw`] ended.
pub(super) enum Copied {
    /// All of it: `true` if the string went to its own buffer.
    Done(bool),
    /// The stream paused after `done` payload bytes (`split`: the string so
    /// far went to its own buffer).
    Paused { done: usize, split: bool },
}

impl Copied {
    /// The progress of a copy that did not pause.
    pub(super) fn into_progress(self) -> Progress {
        match self {
            Copied::Done(split) => Progress::Done(split),
            Copied::Paused { .. } => unreachable!("a paused copy is put aside first"),
        }
    }
}

/// Copies the payload of `map` that `span` describes to `dst` (with
/// `split`, the predicted string to its own buffer; `true` if so), as it is
/// written if it is streamed, from payload byte `from` on: a copy that
/// paused goes on with the same `dst`, and `split` given exactly if it used
/// one before (the string so far in its buffer).
///
/// # Safety
/// `map` must map at least `REGION_HEADER + span.skew + span.total` bytes of
/// a region sealed against shrinking.
pub(super) unsafe fn copy_raw(
    map: &Mapping,
    span: Span<'_>,
    from: usize,
    dst: &mut Vec<u8>,
    split: Option<Split<'_>>,
) -> Result<Copied, WireError> {
    let Span {
        skew,
        total,
        stream,
    } = span;
    // SAFETY: `REGION_HEADER + skew` is within the mapping (the caller's promise).
    let src = unsafe { map.payload().add(skew) };
    // The sender may still write the source: we copy raw bytes, never form
    // a reference to them, and the result is validated as untrusted input.
    let fits =
        |s: &Split<'_>| (s.layout.at.checked_add(s.layout.len)).is_some_and(|end| end <= total);
    let mut split = split.filter(fits);
    // Room for all of it first: a stream arrives in pieces.
    match &mut split {
        // Going on: room was made before, but for the payload alone if the
        // string was put back in place since (`dst` then holds it too).
        _ if from > 0 => {
            if split.is_none() {
                reserve(dst, total.saturating_sub(dst.len()))?;
            }
        }
        Some(s) => {
            s.string.clear();
            reserve(s.string, s.layout.len)?;
            reserve(dst, total - s.layout.len)?;
        }
        None => reserve(dst, total)?,
    }
    let mut done = from;
    while done < total {
        let ready = match &stream {
            Some(stream) => match map.wait_filled(done, total, stream)? {
                Some(ready) => ready,
                None => {
                    let split = split.is_some();
                    return Ok(Copied::Paused { done, split });
                }
            },
            None => total,
        };
        // SAFETY: `done < ready <= total`: within the payload.
        unsafe { append_range(src, done..ready, dst, split.as_mut())? };
        done = ready;
    }
    Ok(Copied::Done(split.is_some()))
}

/// Makes room for `n` more bytes in `v`, exactly.
fn reserve(v: &mut Vec<u8>, n: usize) -> Result<(), WireError> {
    v.try_reserve_exact(n).map_err(|_| WireError::OutOfMemory {
        requested: n as u64,
    })
}

/// Appends payload bytes `range` (the payload starts at `src`) where they
/// belong: to `dst`, or with `split`, the string's to its own buffer.
///
/// # Safety
/// `src + range` must be valid for reads and not overlap the buffers.
unsafe fn append_range(
    src: *const u8,
    range: std::ops::Range<usize>,
    dst: &mut Vec<u8>,
    split: Option<&mut Split<'_>>,
) -> Result<(), WireError> {
    let Some(split) = split else {
        // SAFETY: the caller's promise.
        return unsafe { append_raw(dst, src.add(range.start), range.len()) };
    };
    let (at, end) = (split.layout.at, split.layout.at + split.layout.len);
    // Before the string, the string, after it.
    for (i, (lo, hi)) in [(0, at), (at, end), (end, usize::MAX)]
        .into_iter()
        .enumerate()
    {
        let (from, to) = (range.start.max(lo), range.end.min(hi));
        if from < to {
            let out = if i == 1 {
                &mut *split.string
            } else {
                &mut *dst
            };
            // SAFETY: `[from, to)` lies within `range`: the caller's promise.
            unsafe { append_raw(out, src.add(from), to - from)? };
        }
    }
    Ok(())
}

/// Appends the `n` bytes at `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes and not overlap `dst`'s buffer.
unsafe fn append_raw(dst: &mut Vec<u8>, src: *const u8, n: usize) -> Result<(), WireError> {
    dst.try_reserve_exact(n)
        .map_err(|_| WireError::OutOfMemory {
            requested: n as u64,
        })?;
    let spare = dst.spare_capacity_mut();
    // SAFETY: the caller vouches for `src`; `spare` has room for `n` bytes
    // (reserved above) and is memory of our own, so cannot overlap it.
    unsafe { std::ptr::copy_nonoverlapping(src, spare.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: the copy above initialised `n` bytes after `len`.
    unsafe { dst.set_len(dst.len() + n) };
    Ok(())
}
