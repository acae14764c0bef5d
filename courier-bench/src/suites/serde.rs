//! `serde`: the measurement behind courier's wire format.
//!
//! courier encodes typed messages with postcard (subject `courier`); the
//! maintained alternative with serde support, bitcode, is measured beside it
//! on the same values (bincode is unmaintained; wincode has no serde support).
//! One operation is an encode into a new `Vec` plus a decode of the result.
//!
//! | case | value |
//! | --- | --- |
//! | `small` | a struct of four integers, a bool and a 12-byte string |
//! | `strings` | 100 strings of 16 bytes |
//! | `vec_u8_<size>` | a `Vec<u8>` through serde's sequence path |
//! | `serde_bytes_<size>` | the same bytes in a `#[serde(with = "serde_bytes")]` field |

use std::hint::black_box;

use ::serde::de::DeserializeOwned;
use ::serde::{Deserialize, Serialize};

use crate::harness::measure::{Sampled, Sampler};
use crate::harness::{Case, Ctx, Result};

#[derive(Clone, Serialize, Deserialize)]
struct Small {
    id: u64,
    x: i32,
    y: i32,
    flags: u16,
    ok: bool,
    name: String,
}

#[derive(Clone, Serialize, Deserialize)]
struct Bytes(#[serde(with = "serde_bytes")] Vec<u8>);

/// Runs the suite.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let samples = ctx.samples(30, 200);
    let small = Small {
        id: 1 << 40,
        x: -5,
        y: 77,
        flags: 3,
        ok: true,
        name: "hello, world".into(),
    };
    measure_both(ctx, Case::new("small"), samples, 2000, &small)?;
    let strings: Vec<String> = (0..100).map(|i| format!("string number {i:03}")).collect();
    measure_both(ctx, Case::new("strings"), samples, 200, &strings)?;
    for size in [4096usize, 65536] {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let ops = (1 << 20) / size as u64;
        measure_both(ctx, Case::sized("vec_u8", size as u64), samples, ops, &data)?;
        measure_both(
            ctx,
            Case::sized("serde_bytes", size as u64),
            samples,
            ops,
            &Bytes(data),
        )?;
    }
    ctx.note("one op = encode into a new Vec + decode; courier = postcard");
    Ok(())
}

fn measure_both<T>(ctx: &mut Ctx<'_>, case: Case, samples: usize, ops: u64, value: &T) -> Result<()>
where
    T: Serialize + DeserializeOwned,
{
    let sampler = Sampler::new(samples).ops(ops);
    ctx.status(format!("{} · courier", case.name()));
    let s = postcard_roundtrip(&sampler, value)?;
    ctx.record(&case, "courier", "roundtrip_ns", "ns", &s.wall_ns);
    ctx.record_value(
        &case,
        "courier",
        "encoded_bytes",
        "B",
        postcard::to_stdvec(value)?.len() as f64,
    );
    ctx.status(format!("{} · bitcode", case.name()));
    let s = bitcode_roundtrip(&sampler, value)?;
    ctx.record(&case, "bitcode", "roundtrip_ns", "ns", &s.wall_ns);
    ctx.record_value(
        &case,
        "bitcode",
        "encoded_bytes",
        "B",
        bitcode::serialize(value)?.len() as f64,
    );
    Ok(())
}

fn postcard_roundtrip<T: Serialize + DeserializeOwned>(
    sampler: &Sampler,
    value: &T,
) -> Result<Sampled> {
    Ok(sampler.run(|ops| {
        for _ in 0..ops {
            let bytes = postcard::to_allocvec(black_box(value))?;
            black_box(postcard::from_bytes::<T>(&bytes)?);
        }
        Ok::<_, postcard::Error>(())
    })?)
}

fn bitcode_roundtrip<T: Serialize + DeserializeOwned>(
    sampler: &Sampler,
    value: &T,
) -> Result<Sampled> {
    Ok(sampler.run(|ops| {
        for _ in 0..ops {
            let bytes = bitcode::serialize(black_box(value))?;
            black_box(bitcode::deserialize::<T>(&bytes)?);
        }
        Ok::<_, bitcode::Error>(())
    })?)
}
