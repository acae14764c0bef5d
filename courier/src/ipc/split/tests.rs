//! Tests of the split decoder: a message read split reads as the whole.

use serde::{Deserialize, Serialize};

use super::*;

/// [`deserialize`], returning the layout it saw.
fn de<T: DeserializeOwned>(parts: Parts<'_>) -> Result<(T, Option<Layout>), SerDeError> {
    let seen = Cell::new(None);
    let limits = crate::ipc::Config::decode_limits_now(0);
    deserialize(parts, &seen, limits).map(|value| (value, seen.get()))
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Frame {
    id: u32,
    #[serde(with = "serde_bytes")]
    pixels: Vec<u8>,
    note: Option<String>,
}

fn frame() -> (Frame, Vec<u8>, Layout) {
    let frame = Frame {
        id: 300,
        pixels: (0..5000).map(|i| i as u8).collect(),
        note: Some("after".into()),
    };
    let bytes = postcard::to_allocvec(&frame).unwrap();
    // id: 2 bytes of varint; the length 5000: 2 bytes.
    let layout = Layout { at: 4, len: 5000 };
    assert_eq!(&bytes[layout.at..layout.at + 5], &frame.pixels[..5]);
    (frame, bytes, layout)
}

fn split(bytes: &[u8], at: usize, len: usize) -> (&[u8], Vec<u8>, &[u8]) {
    (
        &bytes[..at],
        bytes[at..at + len].to_vec(),
        &bytes[at + len..],
    )
}

#[test]
fn a_contiguous_message_reports_where_its_string_was() {
    let (frame, bytes, layout) = frame();
    let parts = Parts {
        head: &bytes,
        string: None,
        tail: &[],
    };
    let (got, seen) = de::<Frame>(parts).unwrap();
    assert_eq!(got, frame);
    assert_eq!(seen, Some(layout));
}

#[test]
fn the_split_off_string_is_handed_over_not_copied() {
    let (frame, bytes, layout) = frame();
    let (head, string, tail) = split(&bytes, layout.at, layout.len);
    let buffer = string.as_ptr();
    let parts = Parts {
        head,
        string: Some(string),
        tail,
    };
    let (got, seen) = de::<Frame>(parts).unwrap();
    assert_eq!(got, frame);
    assert_eq!(got.pixels.as_ptr(), buffer);
    assert_eq!(seen, Some(layout));
}

#[test]
fn a_wrong_prediction_falls_back_to_one_buffer() {
    let (frame, bytes, layout) = frame();
    for (at, len) in [(3, 5000), (5, 4000), (0, 100), (4, 5003), (10, 2)] {
        let (head, string, tail) = split(&bytes, at, len);
        let parts = Parts {
            head,
            string: Some(string),
            tail,
        };
        let (got, seen) = de::<Frame>(parts).unwrap();
        assert_eq!(got, frame, "split at {at}+{len}");
        assert_eq!(seen, Some(layout));
    }
}

#[test]
fn nested_strings_go_through_every_wrapper() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Ping,
        Frames(Vec<Option<Frame>>),
        Pair(u8, Frame),
    }
    let (frame, ..) = frame();
    let msg = Msg::Frames(vec![None, Some(frame)]);
    let bytes = postcard::to_allocvec(&msg).unwrap();
    let (got, seen) = de::<Msg>(Parts {
        head: &bytes,
        string: None,
        tail: &[],
    })
    .unwrap();
    assert_eq!(got, msg);
    let seen = seen.expect("the frame's pixels");
    let (head, string, tail) = split(&bytes, seen.at, seen.len);
    let buffer = string.as_ptr();
    let (got, _) = de::<Msg>(Parts {
        head,
        string: Some(string),
        tail,
    })
    .unwrap();
    let Msg::Frames(frames) = &got else {
        panic!("not frames")
    };
    assert_eq!(frames[1].as_ref().unwrap().pixels.as_ptr(), buffer);
    assert_eq!(got, msg);
    let pair = postcard::to_allocvec(&Msg::Pair(7, frame_only())).unwrap();
    assert_eq!(
        de::<Msg>(Parts {
            head: &pair,
            string: None,
            tail: &[]
        })
        .unwrap()
        .0,
        Msg::Pair(7, frame_only())
    );
    assert_eq!(
        de::<Msg>(Parts {
            head: &[0],
            string: None,
            tail: &[]
        })
        .unwrap()
        .0,
        Msg::Ping
    );
}

fn frame_only() -> Frame {
    frame().0
}

/// Splits `bytes` at `at` for `len` bytes (clamped to the input).
fn parts_at(bytes: &[u8], at: usize, len: usize) -> Parts<'_> {
    let at = at.min(bytes.len());
    let end = (at + len).min(bytes.len());
    Parts {
        head: &bytes[..at],
        string: Some(bytes[at..end].to_vec()),
        tail: &bytes[end..],
    }
}

fn whole(bytes: &[u8]) -> Parts<'_> {
    Parts {
        head: bytes,
        string: None,
        tail: &[],
    }
}

proptest::proptest! {
    /// Whatever the prediction, a message deserializes split exactly as
    /// it does whole: the same value, or an error both ways.
    #[test]
    fn any_split_of_a_message_reads_as_the_whole(
        id in proptest::prelude::any::<u32>(),
        pixels in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6000),
        note in proptest::option::of("[a-z]{0,40}"),
        at in 0usize..6100,
        len in 0usize..6100,
        exact in proptest::prelude::any::<bool>(),
    ) {
        let frame = Frame { id, pixels, note };
        let bytes = postcard::to_allocvec(&frame).unwrap();
        let (at, len) = match exact {
            // The true layout, when the string is long enough to be seen.
            true => de::<Frame>(whole(&bytes))
                .unwrap()
                .1
                .map_or((at, len), |l| (l.at, l.len)),
            false => (at, len),
        };
        let (got, _) = de::<Frame>(parts_at(&bytes, at, len)).unwrap();
        proptest::prop_assert_eq!(got, frame);
    }

    /// Garbage: never a panic, and split or whole agree.
    #[test]
    fn garbage_reads_alike_split_or_whole(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..5000),
        at in 0usize..5100,
        len in 0usize..5100,
    ) {
        let whole = de::<Frame>(whole(&bytes)).map(|(v, _)| v).ok();
        let split = de::<Frame>(parts_at(&bytes, at, len)).map(|(v, _)| v).ok();
        proptest::prop_assert_eq!(split, whole);
    }
}

#[test]
fn malformed_input_is_an_error_split_or_not() {
    let (_, bytes, layout) = frame();
    let cut = &bytes[..bytes.len() - 3];
    assert!(de::<Frame>(Parts {
        head: cut,
        string: None,
        tail: &[]
    })
    .is_err());
    let (head, string, _) = split(&bytes, layout.at, layout.len);
    assert!(de::<Frame>(Parts {
        head,
        string: Some(string),
        tail: &[0xff],
    })
    .is_err());
    assert_eq!(varint(&[0xff; 11]), None);
    assert_eq!(varint(&[0x80]), None);
    assert_eq!(varint(&[0x88, 0x27]), Some((5000, 2)));
}
