//! `iter`: what dispatching on the kind of a buffer costs, and how far
//! `copy_to_iter` is from a plain `memcpy`.
//!
//! # The dispatch experiment (cases `dispatch_*`)
//!
//! The Linux patch that renumbered the `ITER_*` constants to be dense (David
//! Howells, "iov_iter: Renumber the ITER_* constants in uio.h", LKML, October
//! 2018) was measured with a test program that copied a 32 MiB and a 1 MiB
//! source in 128-byte chunks through
//! `copy_to_iter`, switching the iterator's kind before every chunk in the
//! order 0 1 2 3 4 5 5 4 3 2 1 0 (forwards then backwards, so the branch
//! predictor cannot learn a short cycle), and reported the thread CPU time of
//! each pass over many samples as TOTAL LOWEST HIGHEST MEAN STDDEV.
//!
//! Here the five kinds of [`IoIterMut`] take turns in the order
//! 0 1 2 3 4 4 3 2 1 0. Each kind owns a destination sized to exactly the
//! chunks it receives (the `ubuf`, `mapping` and `chunks` kinds one region
//! each, the `slices` kind a region cut into 4 KiB slices, the `chunks` kind
//! 4 KiB boxes; the discard kind counts), so one pass writes each destination
//! front to back, as the patch's test pass wrote its one buffer. Three strategies
//! dispatch the same per-kind code, courier's kind types:
//!
//! | subject | dispatch |
//! | --- | --- |
//! | `courier` | the `IoIterMut` enum: one `match` on a dense `u8` tag, every arm inlined |
//! | `courier-dyn` | `&mut dyn Dst`, one vtable call per chunk |
//! | `courier-fnptr` | a table of five `fn` pointers indexed by the kind number |
//!
//! `dispatch_copy_*` copies the chunks; `dispatch_nocopy_*` only moves each
//! destination's cursor over the chunk (the test program's "comment out all
//! the memcpy calls"), to isolate the cost of dispatch. The figure is
//! `pass_cpu_ns`, the thread CPU time of one pass over the whole source
//! (`--stats` adds the test program's TOTAL LOWEST HIGHEST MEAN STDDEV
//! columns). Strategies take turns
//! sample by sample, so all three see the same machine.
//!
//! # Against the floor (case `copy_1m_64k`)
//!
//! `copy_to_iter` of a 1 MiB source in 64 KiB chunks into a 1 MiB
//! destination through the `IoIterMut` enum (`courier`), against
//! `copy_from_slice` of the same chunks into the same memory (`floor`); the
//! two take turns sample by sample. The target is `courier` within 5% of
//! `floor`.

// The no-copy passes use `IoIterMut::advance`, whose contract (the bytes are
// initialised) holds because every destination here is initialised up front.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::mem::MaybeUninit;

use courier::buf::{ChunksMut, Discard, IoIterMut, MappingMut, SlicesMut, UbufMut};

use crate::harness::measure::thread_cpu_ns;
use crate::harness::mem::{CopyPair, APART};
use crate::harness::{Case, Ctx, Result};

/// Bytes per `copy_to_iter` call in the dispatch experiment (the test
/// program's `chunksize`).
pub const CHUNK: usize = 128;

/// The number of kinds.
const KINDS: usize = 5;

/// The order the kinds take turns in: forwards, then backwards.
const ORDER: [u8; 2 * KINDS] = [0, 1, 2, 3, 4, 4, 3, 2, 1, 0];

/// The segment size of the `slices` and `chunks` destinations.
const PAGE: usize = 4096;

/// Source sizes of the dispatch experiment (the test program's `bufsize`).
pub const DISPATCH_SIZES: [usize; 2] = [32 << 20, 1 << 20];

/// Subjects of the dispatch experiment, in the order they take turns.
pub const STRATEGIES: [&str; 3] = ["courier", "courier-dyn", "courier-fnptr"];

// ===== destinations =====

/// The memory one pass of the dispatch experiment writes, split by kind.
pub struct Dest {
    ubuf: Box<[MaybeUninit<u8>]>,
    slices: Box<[MaybeUninit<u8>]>,
    chunks: Vec<Box<[MaybeUninit<u8>]>>,
    mapping: Box<[MaybeUninit<u8>]>,
    discard: usize,
}

/// One destination iterator of each kind, as courier's kind types.
pub struct Kinds<'a> {
    ubuf: UbufMut<'a>,
    slices: SlicesMut<'a>,
    chunks: ChunksMut<'a>,
    mapping: MappingMut<'a>,
    discard: Discard,
}

/// Initialised memory, typed as the destinations take it.
fn initialised(len: usize) -> Box<[MaybeUninit<u8>]> {
    vec![MaybeUninit::new(1u8); len].into_boxed_slice()
}

impl Dest {
    /// Destinations for a source of `bufsize` bytes cut into [`CHUNK`]s that
    /// go to the kinds in `ORDER`: each kind gets room for exactly its
    /// chunks. All of it is initialised (as the test program `memset` its
    /// buffers).
    pub fn new(bufsize: usize) -> Dest {
        let mut room = [0usize; KINDS];
        for i in 0..bufsize / CHUNK {
            room[ORDER[i % ORDER.len()] as usize] += CHUNK;
        }
        let chunks = (0..room[2].div_ceil(PAGE))
            .map(|i| initialised(PAGE.min(room[2] - i * PAGE)))
            .collect();
        Dest {
            ubuf: initialised(room[0]),
            slices: initialised(room[1]),
            chunks,
            mapping: initialised(room[3]),
            discard: room[4],
        }
    }

    /// Runs `f` on fresh iterators over the destinations (building them is
    /// not part of a timed pass).
    pub fn with_kinds<R>(&mut self, f: impl FnOnce(Kinds<'_>) -> R) -> R {
        let mut pages: Vec<&mut [MaybeUninit<u8>]> = self.slices.chunks_mut(PAGE).collect();
        f(Kinds {
            ubuf: UbufMut::new(&mut self.ubuf),
            slices: SlicesMut::new(&mut pages),
            chunks: ChunksMut::new(&mut self.chunks),
            mapping: MappingMut::new(&mut self.mapping),
            discard: Discard::new(self.discard),
        })
    }
}

// ===== strategy 1: the enum =====

/// One pass through the `IoIterMut` enum: `COPY` copies each chunk, otherwise
/// the cursor only moves over it. Returns the bytes that went through.
#[inline(never)]
pub fn pass_enum<const COPY: bool>(
    its: &mut [IoIterMut<'_>; KINDS],
    src: &[u8],
    order: &[u8; 2 * KINDS],
) -> usize {
    let mut moved = 0;
    let mut turn = 0;
    for chunk in src.chunks_exact(CHUNK) {
        let it = &mut its[order[turn] as usize];
        turn = if turn + 1 == order.len() { 0 } else { turn + 1 };
        if COPY {
            moved += it.copy_to_iter(chunk);
        } else {
            // SAFETY: every destination was initialised by `Dest::new`, so
            // the bytes the cursor moves over are initialised.
            unsafe { it.advance(chunk.len()) };
            moved += chunk.len();
        }
    }
    moved
}

/// The kinds as one array of the enum.
fn as_enum(k: Kinds<'_>) -> [IoIterMut<'_>; KINDS] {
    [
        IoIterMut::Ubuf(k.ubuf),
        IoIterMut::Slices(k.slices),
        IoIterMut::Chunks(k.chunks),
        IoIterMut::Mapping(k.mapping),
        IoIterMut::Discard(k.discard),
    ]
}

// ===== strategy 2: trait objects =====

/// A destination behind a vtable.
pub trait Dst {
    /// `copy_to_iter`.
    fn copy(&mut self, src: &[u8]) -> usize;
    /// Moves the cursor over `n` initialised bytes.
    fn skip(&mut self, n: usize);
}

macro_rules! impl_dst {
    ($($t:ty),*) => {$(
        impl Dst for $t {
            #[inline]
            fn copy(&mut self, src: &[u8]) -> usize {
                self.copy_to_iter(src)
            }
            #[inline]
            fn skip(&mut self, n: usize) {
                // SAFETY: the destinations of this suite are initialised
                // (`Dest::new`), so the bytes skipped are.
                unsafe { self.advance(n) }
            }
        }
    )*};
}
impl_dst!(UbufMut<'_>, SlicesMut<'_>, ChunksMut<'_>, MappingMut<'_>);

impl Dst for Discard {
    #[inline]
    fn copy(&mut self, src: &[u8]) -> usize {
        self.copy_to_iter(src)
    }
    #[inline]
    fn skip(&mut self, n: usize) {
        self.advance(n);
    }
}

/// One pass through trait objects.
#[inline(never)]
pub fn pass_dyn<const COPY: bool>(
    dsts: &mut [&mut dyn Dst; KINDS],
    src: &[u8],
    order: &[u8; 2 * KINDS],
) -> usize {
    let mut moved = 0;
    let mut turn = 0;
    for chunk in src.chunks_exact(CHUNK) {
        let d = &mut dsts[order[turn] as usize];
        turn = if turn + 1 == order.len() { 0 } else { turn + 1 };
        if COPY {
            moved += d.copy(chunk);
        } else {
            d.skip(chunk.len());
            moved += chunk.len();
        }
    }
    moved
}

// ===== strategy 3: a function-pointer table =====

/// One entry of the operations table.
pub type Op = fn(&mut Kinds<'_>, &[u8]) -> usize;

/// `copy_to_iter` per kind, indexed by the kind number.
pub static COPY_OPS: [Op; KINDS] = [
    |k, s| k.ubuf.copy_to_iter(s),
    |k, s| k.slices.copy_to_iter(s),
    |k, s| k.chunks.copy_to_iter(s),
    |k, s| k.mapping.copy_to_iter(s),
    |k, s| k.discard.copy_to_iter(s),
];

/// "Move the cursor over `s`" per kind, indexed by the kind number.
pub static SKIP_OPS: [Op; KINDS] = [
    |k, s| {
        k.ubuf.skip(s.len());
        s.len()
    },
    |k, s| {
        k.slices.skip(s.len());
        s.len()
    },
    |k, s| {
        k.chunks.skip(s.len());
        s.len()
    },
    |k, s| {
        k.mapping.skip(s.len());
        s.len()
    },
    |k, s| {
        k.discard.advance(s.len());
        s.len()
    },
];

/// One pass through a function-pointer table.
#[inline(never)]
pub fn pass_fnptr(
    kinds: &mut Kinds<'_>,
    ops: &[Op; KINDS],
    src: &[u8],
    order: &[u8; 2 * KINDS],
) -> usize {
    let mut moved = 0;
    let mut turn = 0;
    for chunk in src.chunks_exact(CHUNK) {
        let op = ops[order[turn] as usize];
        turn = if turn + 1 == order.len() { 0 } else { turn + 1 };
        moved += op(kinds, chunk);
    }
    moved
}

// ===== measurement =====

/// Thread CPU nanoseconds of one pass of `strategy` (an index into
/// [`STRATEGIES`]) over `src` into `dest`, copying or not.
pub fn time_pass(strategy: usize, copy: bool, dest: &mut Dest, src: &[u8]) -> u64 {
    // The order goes through `black_box` so the compiler cannot unroll the
    // loop by ten and resolve every turn's kind statically.
    let order = black_box(&ORDER);
    let (ns, moved) = dest.with_kinds(|mut k| match strategy {
        0 => {
            let mut its = as_enum(k);
            let t0 = thread_cpu_ns();
            let moved = if copy {
                pass_enum::<true>(&mut its, src, order)
            } else {
                pass_enum::<false>(&mut its, src, order)
            };
            (thread_cpu_ns() - t0, moved)
        }
        1 => {
            let mut dsts: [&mut dyn Dst; KINDS] = [
                &mut k.ubuf,
                &mut k.slices,
                &mut k.chunks,
                &mut k.mapping,
                &mut k.discard,
            ];
            let dsts = black_box(&mut dsts);
            let t0 = thread_cpu_ns();
            let moved = if copy {
                pass_dyn::<true>(dsts, src, order)
            } else {
                pass_dyn::<false>(dsts, src, order)
            };
            (thread_cpu_ns() - t0, moved)
        }
        _ => {
            let ops = black_box(if copy { &COPY_OPS } else { &SKIP_OPS });
            let t0 = thread_cpu_ns();
            let moved = pass_fnptr(&mut k, ops, src, order);
            (thread_cpu_ns() - t0, moved)
        }
    });
    assert_eq!(moved, src.len() / CHUNK * CHUNK, "a pass lost bytes");
    ns
}

/// `samples` passes of every strategy over a `bufsize` source (after a tenth
/// as many untimed), taking turns; returns the CPU ns of each pass, per
/// strategy.
pub fn dispatch(bufsize: usize, copy: bool, samples: usize) -> [Vec<f64>; 3] {
    let src = vec![1u8; bufsize];
    let mut dest = Dest::new(bufsize);
    let mut out: [Vec<f64>; 3] = Default::default();
    let warmup = (samples / 10).max(1);
    for j in 0..warmup + samples {
        for t in 0..STRATEGIES.len() {
            // Rotate who goes first, so none always follows the same one.
            let s = (j + t) % STRATEGIES.len();
            let ns = time_pass(s, copy, &mut dest, &src);
            if j >= warmup {
                out[s].push(ns as f64);
            }
        }
    }
    out
}

/// Bytes and chunk size of the floor case.
pub const FLOOR_BYTES: usize = 1 << 20;
/// Chunk size of the floor case.
pub const FLOOR_CHUNK: usize = 64 << 10;

/// One 1 MiB copy in 64 KiB chunks through `copy_to_iter`.
#[inline(never)]
pub fn copy_courier(dst: &mut [u8], src: &[u8]) -> usize {
    let mut it = IoIterMut::from(dst);
    let mut moved = 0;
    for chunk in src.chunks(FLOOR_CHUNK) {
        moved += it.copy_to_iter(chunk);
    }
    moved
}

/// The same copy with `copy_from_slice`: the floor.
#[inline(never)]
pub fn copy_floor(dst: &mut [u8], src: &[u8]) -> usize {
    for (d, s) in dst.chunks_mut(FLOOR_CHUNK).zip(src.chunks(FLOOR_CHUNK)) {
        d.copy_from_slice(s);
    }
    src.len()
}

/// `samples` samples of `ops` copies each for `courier` and `floor`, taking
/// turns; returns CPU ns per copy, `[courier, floor]`.
pub fn floor_copy(samples: usize, ops: usize) -> [Vec<f64>; 2] {
    // One destination for both subjects, so neither gets better-placed memory,
    // and placed where no CPU's memcpy is slow (`mem::APART`: two `vec!`s made
    // in turn measured both subjects at 2.9 GB/s on an AMD EPYC guest; see
    // docs/memcpy-placement.md).
    let mut pair = CopyPair::new(FLOOR_BYTES, APART, 1);
    let (src, dst) = pair.split();
    let mut out: [Vec<f64>; 2] = Default::default();
    let warmup = (samples / 10).max(1);
    for j in 0..warmup + samples {
        for t in 0..2 {
            let s = (j + t) % 2;
            let t0 = thread_cpu_ns();
            for _ in 0..ops {
                let n = if s == 0 {
                    copy_courier(black_box(&mut *dst), black_box(src))
                } else {
                    copy_floor(black_box(&mut *dst), black_box(src))
                };
                assert_eq!(n, FLOOR_BYTES);
            }
            let ns = (thread_cpu_ns() - t0) as f64 / ops as f64;
            if j >= warmup {
                out[s].push(ns);
            }
        }
    }
    out
}

// ===== the suite =====

/// Runs the suite.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let samples = ctx.samples(200, 8000);
    for bufsize in DISPATCH_SIZES {
        for copy in [true, false] {
            let family = if copy {
                "dispatch_copy"
            } else {
                "dispatch_nocopy"
            };
            let case = Case::sized(family, bufsize as u64);
            ctx.status(format!("{} · {}", case.name(), STRATEGIES.join(", ")));
            let figures = dispatch(bufsize, copy, samples);
            for (subject, ns) in STRATEGIES.iter().zip(&figures) {
                ctx.record(&case, subject, "pass_cpu_ns", "ns", ns);
            }
        }
    }

    let case = Case::new("copy_1m_64k");
    ctx.status(format!("{} · courier, floor", case.name()));
    let ops = 16;
    let [courier, floor] = floor_copy(samples, ops);
    ctx.record(&case, "courier", "copy_cpu_ns", "ns", &courier);
    ctx.record(&case, "floor", "copy_cpu_ns", "ns", &floor);

    ctx.note(format!(
        "dispatch_*: one pass = the whole source in {CHUNK} B chunks, the kind switching \
         before every chunk in the order 0 1 2 3 4 4 3 2 1 0 (ubuf, slices, chunks, mapping, \
         discard); courier = enum match, courier-dyn = &mut dyn, courier-fnptr = fn-pointer \
         table; nocopy = cursor moves only; {samples} passes per strategy, taking turns"
    ));
    ctx.note(format!(
        "copy_1m_64k: 1 MiB in 64 KiB chunks; courier = IoIterMut::copy_to_iter, floor = \
         copy_from_slice, same memory ({APART} B apart modulo 4 KiB); CPU ns per 1 MiB, {samples} samples \
         of {ops} copies; target: courier within 5% of floor"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of an initialised destination.
    fn read(mem: &[MaybeUninit<u8>]) -> Vec<u8> {
        // SAFETY: every byte of a `Dest` is initialised (`Dest::new`), and a
        // pass only overwrites bytes with bytes.
        mem.iter().map(|b| unsafe { b.assume_init() }).collect()
    }

    #[test]
    fn every_strategy_moves_every_byte_and_writes_the_same() {
        let bufsize = 64 * 1024 + 3 * CHUNK;
        let src: Vec<u8> = (0..bufsize).map(|i| (i % 251) as u8).collect();
        let mut images = Vec::new();
        for s in 0..STRATEGIES.len() {
            let mut dest = Dest::new(bufsize);
            time_pass(s, true, &mut dest, &src);
            let chunks: Vec<u8> = dest.chunks.iter().flat_map(|c| read(c)).collect();
            images.push([
                read(&dest.ubuf),
                read(&dest.slices),
                chunks,
                read(&dest.mapping),
            ]);
            // The no-copy pass moves every byte too (asserted inside).
            time_pass(s, false, &mut Dest::new(bufsize), &src);
        }
        assert!(images.windows(2).all(|w| w[0] == w[1]));
        // Kind 0 (ubuf) takes turns 0 and 9 of every ten.
        let ubuf = &images[0][0];
        assert_eq!(&ubuf[..CHUNK], &src[..CHUNK]);
        assert_eq!(&ubuf[CHUNK..2 * CHUNK], &src[9 * CHUNK..10 * CHUNK]);
        // Kind 3 (mapping) takes turns 3 and 6.
        let mapping = &images[0][3];
        assert_eq!(&mapping[..CHUNK], &src[3 * CHUNK..4 * CHUNK]);
    }

    #[test]
    fn the_floor_case_copies_the_same_bytes() {
        let src: Vec<u8> = (0..FLOOR_BYTES).map(|i| (i % 253) as u8).collect();
        let mut a = vec![0u8; FLOOR_BYTES];
        let mut b = vec![0u8; FLOOR_BYTES];
        assert_eq!(copy_courier(&mut a, &src), FLOOR_BYTES);
        assert_eq!(copy_floor(&mut b, &src), FLOOR_BYTES);
        assert_eq!(a, src);
        assert_eq!(b, src);
    }
}
