//! Property tests of `courier::buf` against a model: the concatenation of the
//! segments as one flat `Vec<u8>`.
//!
//! Every kind of source and destination is built from one random segment
//! layout, driven by a random schedule of operations, and compared with the
//! model after every step.

use std::io::IoSlice;
use std::mem::MaybeUninit;

use courier::buf::{copy_iter, Discard, IoIter, IoIterMut, Mapping, MappingMut, RawIoVec, IOV_MAX};
use proptest::prelude::*;

/// Cases per property; small under valgrind (`scripts/valgrind-buf.sh`).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(256),
        ..ProptestConfig::default()
    }
}

/// The five kinds, by their dense number.
const KINDS: u8 = 5;

/// A random segment layout: 0..8 segments of 0..64 bytes (empty segments
/// included on purpose), filled with distinct-looking bytes.
fn layout() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)
}

/// A schedule of step sizes; each step is taken modulo what is left + 1.
fn schedule() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..200, 1..40)
}

/// What a source of `kind` over `segs` must yield.
fn model(kind: u8, segs: &[Vec<u8>]) -> Vec<u8> {
    let flat = segs.concat();
    if kind == 4 {
        vec![0; flat.len()]
    } else {
        flat
    }
}

/// Builds a source of `kind` over `segs` and runs `f` on it.
fn with_source<R>(kind: u8, segs: &[Vec<u8>], f: impl FnOnce(IoIter<'_>) -> R) -> R {
    let flat = segs.concat();
    let slices: Vec<IoSlice<'_>> = segs.iter().map(|s| IoSlice::new(s)).collect();
    match kind {
        0 => f(IoIter::ubuf(&flat)),
        1 => f(IoIter::slices(&slices)),
        2 => f(IoIter::chunks(segs)),
        3 => {
            // SAFETY: `flat` is borrowed for the whole call and not written.
            let m = unsafe { Mapping::from_raw_parts(flat.as_ptr(), flat.len()) };
            f(IoIter::mapping(m))
        }
        _ => f(IoIter::discard(flat.len())),
    }
}

/// Fresh, truly uninitialised boxes of the given lengths.
fn uninit_boxes(lens: &[usize]) -> Vec<Box<[MaybeUninit<u8>]>> {
    lens.iter().map(|&n| Box::new_uninit_slice(n)).collect()
}

/// Builds a destination of `kind` with segments of `lens` over uninitialised
/// memory, runs `f` on it, and returns `f`'s result with the filled bytes
/// read back through the public API (the model of what landed).
fn with_dest<R>(kind: u8, lens: &[usize], f: impl FnOnce(&mut IoIterMut<'_>) -> R) -> (R, Vec<u8>) {
    let total: usize = lens.iter().sum();
    match kind {
        0 | 3 => {
            let mut flat = Box::new_uninit_slice(total);
            let mut it = if kind == 0 {
                IoIterMut::ubuf(&mut flat)
            } else {
                // SAFETY: `flat` is exclusively borrowed for the life of `it`.
                IoIterMut::mapping(unsafe {
                    MappingMut::from_raw_parts(flat.as_mut_ptr().cast(), total)
                })
            };
            let r = f(&mut it);
            let got = match &it {
                IoIterMut::Ubuf(u) => u.filled_bytes().to_vec(),
                IoIterMut::Mapping(m) => m.filled_bytes().to_vec(),
                _ => unreachable!(),
            };
            (r, got)
        }
        1 => {
            let mut boxes = uninit_boxes(lens);
            let mut refs: Vec<&mut [MaybeUninit<u8>]> =
                boxes.iter_mut().map(|b| &mut b[..]).collect();
            let mut it = IoIterMut::slices(&mut refs);
            let r = f(&mut it);
            let IoIterMut::Slices(s) = &it else {
                unreachable!()
            };
            let got = (0..lens.len())
                .flat_map(|i| s.filled_segment(i).to_vec())
                .collect();
            (r, got)
        }
        2 => {
            let mut boxes = uninit_boxes(lens);
            let mut it = IoIterMut::chunks(&mut boxes);
            let r = f(&mut it);
            let IoIterMut::Chunks(s) = &it else {
                unreachable!()
            };
            let got = (0..lens.len())
                .flat_map(|i| s.filled_segment(i).to_vec())
                .collect();
            (r, got)
        }
        _ => {
            let mut it = IoIterMut::discard(total);
            let r = f(&mut it);
            (r, Vec::new())
        }
    }
}

/// Simulates the kernel: writes `data` into the iovecs in order, as
/// `recvmsg` would, and returns how many bytes it wrote.
fn kernel_write(iov: &[RawIoVec<'_>], data: &[u8]) -> usize {
    let mut done = 0;
    for v in iov {
        let k = v.len().min(data.len() - done);
        // SAFETY: each entry came from `io_vecs` of a destination that is
        // still mutably borrowed, so it covers `v.len()` writable bytes that
        // nothing else accesses; `k <= v.len()`.
        unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), v.base(), k) };
        done += k;
    }
    done
}

proptest! {
    #![proptest_config(config())]

    /// Copying through a source in random chunk sizes yields exactly the
    /// concatenation of its segments.
    #[test]
    fn source_copy_equals_concatenation(kind in 0..KINDS, segs in layout(), steps in schedule()) {
        let want = model(kind, &segs);
        let got = with_source(kind, &segs, |mut it| {
            let mut got = Vec::new();
            prop_assert_eq!(it.remaining(), want.len());
            for s in steps.iter().cycle().take(want.len() + steps.len()) {
                let mut buf = vec![0xEEu8; s % (it.remaining() + 2)];
                let before = it.remaining();
                let n = it.copy_from_iter(&mut buf);
                prop_assert_eq!(n, buf.len().min(before));
                prop_assert_eq!(it.remaining(), before - n);
                got.extend_from_slice(&buf[..n]);
                if it.remaining() == 0 { break; }
            }
            let mut rest = vec![0u8; it.remaining()];
            it.copy_from_iter(&mut rest);
            got.extend_from_slice(&rest);
            prop_assert_eq!(it.chunk(), &[][..]);
            Ok(got)
        })?;
        prop_assert_eq!(got, want);
    }

    /// A send loop (fill at most `width` iovecs, send part of them, advance,
    /// repeat) lands every byte exactly once, in order; after each partial
    /// advance the iovecs start exactly at the first unsent byte.
    #[test]
    fn send_loop_lands_every_byte_once(
        kind in 0..KINDS, segs in layout(), steps in schedule(), width in 1usize..5,
    ) {
        let want = model(kind, &segs);
        let got = with_source(kind, &segs, |mut it| {
            let mut wire = Vec::new();
            let mut turn = 0;
            while it.remaining() > 0 {
                let mut iov = [IoSlice::new(&[]); 4];
                let n = it.io_slices(&mut iov[..width]);
                prop_assert!(n >= 1 && n <= width);
                prop_assert!(iov[..n].iter().all(|s| !s.is_empty()));
                let offered: Vec<u8> = iov[..n].iter().flat_map(|s| s.to_vec()).collect();
                // The offered bytes are the next unsent ones.
                prop_assert_eq!(&offered[..], &want[wire.len()..wire.len() + offered.len()]);
                let mut sent = steps[turn % steps.len()] % (offered.len() + 1);
                if sent == 0 && turn % 2 == 1 {
                    sent = 1; // zero-byte sends are tested, but not forever
                }
                turn += 1;
                wire.extend_from_slice(&offered[..sent]);
                it.advance(sent);
                prop_assert_eq!(it.remaining(), want.len() - wire.len());
                prop_assert_eq!(it.chunk().first(), want.get(wire.len()));
            }
            Ok(wire)
        })?;
        prop_assert_eq!(got, want);
    }

    /// Interleaving `advance`, `copy_from_iter` and cloning (save/restore)
    /// keeps the position exact.
    #[test]
    fn advance_and_copy_interleave(kind in 0..KINDS, segs in layout(), steps in schedule()) {
        let want = model(kind, &segs);
        with_source(kind, &segs, |mut it| {
            let mut pos = 0;
            for (i, s) in steps.iter().enumerate() {
                let k = s % (it.remaining() + 1);
                if i % 3 == 0 {
                    let saved = it.clone();
                    it.advance(k);
                    it = saved;
                } else if i % 2 == 0 {
                    it.advance(k);
                    pos += k;
                } else {
                    let mut buf = vec![0u8; k];
                    prop_assert_eq!(it.copy_from_iter(&mut buf), k);
                    prop_assert_eq!(&buf[..], &want[pos..pos + k]);
                    pos += k;
                }
                prop_assert_eq!(it.remaining(), want.len() - pos);
                // Wide-enough iovecs cover exactly the rest.
                let mut iov = vec![IoSlice::new(&[]); 16];
                let n = it.io_slices(&mut iov);
                let rest: Vec<u8> = iov[..n].iter().flat_map(|s| s.to_vec()).collect();
                prop_assert_eq!(&rest[..], &want[pos..]);
            }
            Ok(())
        })?;
    }

    /// Copying into a destination in random chunk sizes writes exactly the
    /// prefix of the input that fits; a discard counts it exactly.
    #[test]
    fn dest_copy_equals_concatenation(
        kind in 0..KINDS, segs in layout(), data in prop::collection::vec(any::<u8>(), 0..400),
        steps in schedule(),
    ) {
        let lens: Vec<usize> = segs.iter().map(Vec::len).collect();
        let cap: usize = lens.iter().sum();
        let (copied, got) = with_dest(kind, &lens, |it| {
            let mut done = 0;
            for s in steps.iter().cycle().take(steps.len() + data.len()) {
                let k = s % (data.len() - done + 1);
                let before = it.remaining();
                let n = it.copy_to_iter(&data[done..done + k]);
                assert_eq!(n, k.min(before));
                assert_eq!(it.remaining(), before - n);
                done += n;
                assert_eq!(it.filled(), done);
                if done == data.len() || it.remaining() == 0 { break; }
            }
            done += it.copy_to_iter(&data[done..]);
            done
        });
        prop_assert_eq!(copied, data.len().min(cap));
        if kind != 4 {
            prop_assert_eq!(&got[..], &data[..copied]);
        }
    }

    /// A receive loop through `io_vecs` (at most `width` entries per call)
    /// and the `unsafe` `advance` fills every byte exactly once.
    #[test]
    fn receive_loop_fills_every_byte_once(
        kind in 0..KINDS, segs in layout(), data in prop::collection::vec(any::<u8>(), 0..400),
        steps in schedule(), width in 1usize..5,
    ) {
        let lens: Vec<usize> = segs.iter().map(Vec::len).collect();
        let cap: usize = lens.iter().sum();
        let (arrived, got) = with_dest(kind, &lens, |it| {
            let mut done = 0;
            let mut turn = 0;
            while it.remaining() > 0 && done < data.len() {
                let mut iov = [RawIoVec::EMPTY; 4];
                let n = it.io_vecs(&mut iov[..width]);
                assert!(n >= 1 && n <= width);
                let room: usize = iov[..n].iter().map(RawIoVec::len).sum();
                let mut k = steps[turn % steps.len()] % (room + 1);
                if k == 0 && turn % 2 == 1 {
                    k = 1; // empty receives are tested, but not forever
                }
                let k = k.min(data.len() - done);
                turn += 1;
                let wrote = kernel_write(&iov[..n], &data[done..done + k]);
                assert_eq!(wrote, k);
                // SAFETY: `kernel_write` initialised the first `k` bytes
                // the iovecs cover, which start at the cursor.
                unsafe { it.advance(k) };
                done += k;
                assert_eq!(it.filled(), done);
            }
            done
        });
        prop_assert_eq!(arrived, data.len().min(cap));
        if kind != 4 {
            prop_assert_eq!(&got[..], &data[..arrived]);
        }
    }

    /// `copy_iter` moves `min(src, dst)` bytes between any two kinds.
    #[test]
    fn copy_iter_between_any_kinds(
        src_kind in 0..KINDS, dst_kind in 0..KINDS, segs in layout(), dst_segs in layout(),
    ) {
        let want = model(src_kind, &segs);
        let lens: Vec<usize> = dst_segs.iter().map(Vec::len).collect();
        let cap: usize = lens.iter().sum();
        let (n, got) = with_dest(dst_kind, &lens, |dst| {
            with_source(src_kind, &segs, |mut src| {
                let n = copy_iter(dst, &mut src);
                assert_eq!(src.remaining(), want.len() - n);
                n
            })
        });
        prop_assert_eq!(n, want.len().min(cap));
        if dst_kind != 4 {
            prop_assert_eq!(&got[..], &want[..n]);
        }
    }
}

/// A discard counts exactly, in both directions, and its iovecs cover exactly
/// what is left, in entries of at most 64 KiB.
#[test]
fn discard_counts_exactly() {
    let len = 1_000_003;
    let mut sink = Discard::new(len);
    let mut total = 0;
    for k in [0, 1, 7, 4096, 300_000, 2_000_000] {
        let src = vec![9u8; k];
        total += sink.copy_to_iter(&src);
        assert_eq!(sink.filled(), total);
        assert_eq!(sink.remaining(), len - total);
    }
    assert_eq!(total, len);

    let mut sink = IoIterMut::discard(len);
    let mut iov = [RawIoVec::EMPTY; 64];
    let n = sink.io_vecs(&mut iov);
    assert_eq!(iov[..n].iter().map(RawIoVec::len).sum::<usize>(), len);
    assert!(iov[..n]
        .iter()
        .all(|v| v.len() <= 64 * 1024 && !v.is_empty()));
    sink.copy_to_iter(&[1; 10]);
    assert_eq!(sink.remaining(), len - 10);

    let mut zeros = IoIter::discard(100);
    let mut buf = [7u8; 60];
    assert_eq!(zeros.copy_from_iter(&mut buf), 60);
    assert_eq!(buf, [0; 60]);
    assert_eq!(zeros.remaining(), 40);
}

/// `io_slices` and `io_vecs` never fill more than `IOV_MAX` entries, and the
/// next call continues where the first stopped.
#[test]
fn iovecs_are_bounded_by_iov_max() {
    let segs: Vec<Vec<u8>> = (0..IOV_MAX + 10).map(|i| vec![i as u8; 3]).collect();
    let mut it = IoIter::chunks(&segs);
    let mut iov = vec![IoSlice::new(&[]); IOV_MAX + 100];
    assert_eq!(it.io_slices(&mut iov), IOV_MAX);
    it.advance(IOV_MAX * 3 - 1);
    let n = it.io_slices(&mut iov);
    assert_eq!(n, 11);
    assert_eq!(&*iov[0], &[(IOV_MAX - 1) as u8]);

    let mut boxes = uninit_boxes(&vec![2; IOV_MAX + 1]);
    let mut dst = IoIterMut::chunks(&mut boxes);
    let mut raw = vec![RawIoVec::EMPTY; IOV_MAX + 5];
    assert_eq!(dst.io_vecs(&mut raw), IOV_MAX);

    let mut sink = IoIterMut::discard(usize::MAX / 2);
    assert_eq!(sink.io_vecs(&mut raw), IOV_MAX);
}

/// `fill_spare` grows the vector by exactly what was written and refuses a
/// swapped-in iterator.
#[test]
fn fill_spare_grows_by_filled() {
    let mut v = Vec::with_capacity(10);
    v.push(1u8);
    let n = courier::buf::fill_spare(&mut v, |room| {
        assert_eq!(room.remaining(), 9);
        room.copy_to_iter(&[2, 3, 4])
    });
    assert_eq!((n, &v[..]), (3, &[1u8, 2, 3, 4][..]));

    let swapped = std::panic::catch_unwind(|| {
        let mut v = Vec::<u8>::with_capacity(10);
        courier::buf::fill_spare(&mut v, |room| {
            let leaked: &'static mut [MaybeUninit<u8>] = Box::leak(Box::new_uninit_slice(20));
            let mut other = courier::buf::UbufMut::new(leaked);
            other.copy_to_iter(&[5; 20]);
            std::mem::swap(room, &mut other);
        });
    });
    assert!(swapped.is_err());
}
