//! `send`: `-c N` payloads of `--size` bytes through each reach, reported as
//! sends/s and cycles/send, next to the raw-syscall floor.
//!
//! The rump kernel send-path measurements (Antti Kantee, rumpkernel-users,
//! March 2014) timed a million 22-byte UDP `sendto()`s with `rdtsc` on both
//! sides. Here one **send** is one message sent and received by the same
//! thread, so queues never grow and every reach is measured doing the same
//! work: the floor is a `send` plus a `recv` on a `SOCK_SEQPACKET`
//! socketpair, straight syscalls. The `N` payloads are timed in samples of
//! 1000 (a tenth as many untimed first); the quoted figures are medians over
//! samples of sends/s (wall clock) and of `rdtsc` cycles per send.
//!
//! # Adding a reach
//!
//! Write one function `fn(&Sampler, size) -> Result<Sampled>` that builds the
//! channel, then returns `sampler.run(|ops| { for _ in 0..ops { send; recv }
//! ... })`, and add one line to [`REACHES`] naming its subject (`courier`,
//! `courier-chan`, `courier-local`, a peer crate). The loop is monomorphised
//! per reach: no dynamic call sits on the measured path.

use clap::{value_parser, Arg};

use crate::harness::measure::{Sampled, Sampler, CYCLES_UNIT};
use crate::harness::{Case, Ctx, Result};

use super::floor;

/// Payloads per sample.
const OPS_PER_SAMPLE: u64 = 1000;

/// One way for a message to travel, measured by this suite.
pub struct Reach {
    /// The subject in the report.
    pub subject: &'static str,
    /// What is measured, for the notes.
    pub about: &'static str,
    /// Sets up, then sends and receives `sampler`'s operations of `size` bytes.
    pub measure: fn(&Sampler, usize) -> Result<Sampled>,
}

/// Every reach, measured in this order.
pub static REACHES: &[Reach] = &[
    Reach {
        subject: "courier",
        about: "courier::ipc bytes channel: IpcBytesSender::send + IpcBytesReceiver::recv (process reach)",
        measure: courier_ipc,
    },
    Reach {
        subject: "courier-chan",
        about: "courier::chan bounded(1) between threads' ends, used by one thread: send + recv of the payload buffer",
        measure: courier_chan,
    },
    Reach {
        subject: "courier-local",
        about: "courier::chan::local (one thread, no atomics): send + recv of the payload buffer",
        measure: courier_local,
    },
    Reach {
        subject: "floor",
        about: "send(2) + recv(2) on a SOCK_SEQPACKET socketpair (rustix, no courier code)",
        measure: floor::sendrecv,
    },
];

/// The thread reach: the payload buffer moves through a `chan::bounded(1)`
/// and back (ownership moves; no allocation per message).
fn courier_chan(sampler: &Sampler, size: usize) -> Result<Sampled> {
    let (tx, rx) = courier::chan::bounded::<Vec<u8>>(1);
    let mut payload = vec![0x5a; size];
    sampler.run(|ops| {
        for _ in 0..ops {
            tx.send(std::mem::take(&mut payload))
                .map_err(|_| "receiver gone")?;
            payload = std::hint::black_box(rx.recv()?);
        }
        Ok::<_, crate::harness::Error>(())
    })
}

/// The fiber reach: the same through `chan::local`, which has no atomics.
fn courier_local(sampler: &Sampler, size: usize) -> Result<Sampled> {
    let (tx, rx) = courier::chan::local::channel::<Vec<u8>>();
    let mut payload = vec![0x5a; size];
    sampler.run(|ops| {
        for _ in 0..ops {
            tx.send(std::mem::take(&mut payload))
                .map_err(|_| "receiver gone")?;
            payload = std::hint::black_box(rx.recv()?);
        }
        Ok::<_, crate::harness::Error>(())
    })
}

/// The process reach: courier's bytes channel, one message sent and received.
fn courier_ipc(sampler: &Sampler, size: usize) -> Result<Sampled> {
    let (tx, rx) = courier::ipc::bytes_channel()?;
    let payload = vec![0x5a; size];
    Ok(sampler.run(|ops| {
        for _ in 0..ops {
            tx.send(&payload)?;
            std::hint::black_box(rx.recv()?);
        }
        Ok::<_, courier::ipc::IpcError>(())
    })?)
}

/// The suite's options.
pub fn args() -> Vec<Arg> {
    vec![
        Arg::new("count")
            .short('c')
            .long("count")
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..))
            .help("Payloads sent through each reach [quick: 100000, --full: 1000000]"),
        Arg::new("size")
            .long("size")
            .value_name("BYTES")
            .value_parser(value_parser!(u64).range(1..=65536))
            .help("Payload size in bytes [default: 22]"),
    ]
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let count = ctx
        .opt::<u64>("count")
        .unwrap_or(ctx.pick(100_000, 1_000_000));
    let size = ctx.opt::<u64>("size").unwrap_or(22);
    let per_sample = OPS_PER_SAMPLE.min(count);
    let default_samples = (count / per_sample) as usize;
    let samples = ctx.samples(default_samples, default_samples).max(1);
    let ops = (count / samples as u64).max(1);
    let sampler = Sampler::new(samples).ops(ops);
    let case = Case::sized("send", size);
    for reach in REACHES {
        ctx.status(format!("{} · {}", case.name(), reach.subject));
        let s = (reach.measure)(&sampler, size as usize)?;
        ctx.record(&case, reach.subject, "sends_per_s", "sends/s", &s.per_s());
        ctx.record(&case, reach.subject, "send_cycles", CYCLES_UNIT, &s.cycles);
        ctx.record(&case, reach.subject, "send_ns", "ns", &s.wall_ns);
        ctx.note(format!("{}: {}", reach.subject, reach.about));
    }
    ctx.note(format!(
        "{} sends of {size} B per reach ({samples} samples of {ops}, {} untimed first); \
         a send = one message sent and received in one thread; cycles = rdtsc",
        samples as u64 * ops,
        (samples / 10).max(1) as u64 * ops,
    ));
    Ok(())
}
