//! Typed decoding through `ipc::split`: a payload decoded whole and with its
//! byte string received apart (where a receiver would predict it, and
//! anywhere else) gives the same value or fails either way, within the
//! depth limit and the allocation budget.
//!
//! Input: two bytes of split offset, two of split length, one choosing the
//! limits, then the payload (a postcard-encoded `Sample` in the seeds).
#![no_main]

use courier::ipc::fuzz::{decode_agrees, Limits};
use courier_fuzz::Sample;

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    let Some((&[a0, a1, l0, l1, limits], payload)) = input.split_first_chunk::<5>() else {
        return;
    };
    let at = usize::from(u16::from_le_bytes([a0, a1]));
    let len = usize::from(u16::from_le_bytes([l0, l1]));
    let limits = match limits % 3 {
        // The defaults: 128 levels, 8 times the message, at least 16 MiB.
        0 => Limits {
            depth: 128,
            budget: (payload.len() as u64 * 8).max(courier::ipc::DECODE_BUDGET_MIN),
        },
        // Tight ones, so that both limits trip.
        1 => Limits {
            depth: 6,
            budget: payload.len() as u64 * 2,
        },
        _ => Limits {
            depth: 3,
            budget: 64,
        },
    };
    decode_agrees::<Sample>(payload, at, len, limits);
    decode_agrees::<Vec<Vec<u8>>>(payload, at, len, limits);
});
