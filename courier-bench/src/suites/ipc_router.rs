//! `ipc` suite, case `router`: messages a second through a router into an
//! in-process channel, courier's `router` against ipc-channel's.
//!
//! A feeder thread sends `u64`s on an IPC channel whose receiver is routed
//! by the crate's global `ROUTER` into an unbounded in-process channel; the
//! measuring thread asks the feeder for a sample's messages (100,000 with
//! `--full`, 20,000 in the quick run) and receives them all, checking their
//! order. One operation is one message: three threads (feeder, router,
//! receiver) on the machine's CPUs, the figure is their throughput. The
//! subjects take turns, one sample each per round.
//!
//! | subject | route |
//! | --- | --- |
//! | `courier` | `courier::router::ROUTER.route_ipc_receiver_to_new_chan_receiver` |
//! | `courier-crossbeam` | `courier::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver` |
//! | `ipc-channel` | `ipc_channel::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver` |
//! | `floor` | 8-byte packets on a bare `SOCK_SEQPACKET` socketpair, forwarded by a thread of their own (a blocking `recv(2)` each, no `epoll`, no serialization) into a `courier::chan` channel |
//!
//! The floor is the least any router over sockets pays: a `send(2)` and a
//! `recv(2)` a message, and a hand-over between threads. A router serving
//! many receivers adds an `epoll_wait` per batch of ready messages.

use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use courier::ipc as cr;
use ipc_channel::ipc as ic;

use crate::harness::measure::{Ops, Sampler};
use crate::harness::{Case, Ctx, Error, Result};

/// The subjects, in the order they are set up and recorded.
const SUBJECTS: [&str; 4] = ["courier", "courier-crossbeam", "ipc-channel", "floor"];

/// Measures the `router` case.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let case = Case::new("router");
    if !ctx.wants(&case) {
        return Ok(());
    }
    ctx.status(case.name());
    let messages: u64 = ctx.pick(20_000, 100_000);
    let samples = ctx.samples(10, 30);
    let mut subjects: Vec<Ops<'static, Error>> = vec![
        courier_chan()?,
        courier_crossbeam()?,
        ipc_channel_crossbeam()?,
        floor()?,
    ];
    let sampled = Sampler::new(samples)
        .warmup(2)
        .ops(messages)
        .interleave(&mut subjects)?;
    drop(subjects);
    for (subject, s) in SUBJECTS.into_iter().zip(sampled) {
        ctx.record(&case, subject, "msgs_per_s", "msgs/s", &s.per_s());
    }
    ctx.note(format!(
        "router: {messages} u64s a sample from a feeder thread through the crate's global ROUTER \
         into an unbounded in-process channel, received and counted by the measuring thread; \
         per message"
    ));
    Ok(())
}

/// A thread that sends, on request, that many consecutive `u64`s. Dropping
/// it ends the thread, which drops its IPC sender: the route closes.
struct Feeder {
    go: Option<mpsc::Sender<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl Feeder {
    /// Starts the thread; `send` sends one message (`false`: the channel is
    /// gone).
    fn start(mut send: impl FnMut(u64) -> bool + Send + 'static) -> Feeder {
        let (go, orders) = mpsc::channel::<u64>();
        let thread = thread::spawn(move || {
            let mut next = 0;
            for count in orders {
                for _ in 0..count {
                    if !send(next) {
                        return;
                    }
                    next += 1;
                }
            }
        });
        Feeder {
            go: Some(go),
            thread: Some(thread),
        }
    }

    /// Asks for `count` more messages.
    fn request(&self, count: u64) -> Result<()> {
        let go = self.go.as_ref().expect("feeder running");
        go.send(count).map_err(|_| "the feeder stopped".into())
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        drop(self.go.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A subject: the feeder, and a receive that returns the next message.
fn subject<R>(feeder: Feeder, mut recv: R) -> Ops<'static, Error>
where
    R: FnMut() -> Result<u64> + 'static,
{
    let mut expected = 0u64;
    Box::new(move |ops| {
        feeder.request(ops)?;
        for _ in 0..ops {
            let got = recv()?;
            if got != expected {
                return Err(format!("message {got} where {expected} was due").into());
            }
            expected += 1;
        }
        Ok(())
    })
}

fn courier_chan() -> Result<Ops<'static, Error>> {
    let (tx, rx) = cr::channel::<u64>()?;
    let routed = courier::router::ROUTER.route_ipc_receiver_to_new_chan_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    Ok(subject(feeder, move || Ok(routed.recv()?)))
}

fn courier_crossbeam() -> Result<Ops<'static, Error>> {
    let (tx, rx) = cr::channel::<u64>()?;
    let routed = courier::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    Ok(subject(feeder, move || Ok(routed.recv()?)))
}

fn ipc_channel_crossbeam() -> Result<Ops<'static, Error>> {
    let (tx, rx) = ic::channel::<u64>()?;
    let routed = ipc_channel::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    Ok(subject(feeder, move || Ok(routed.recv()?)))
}

fn floor() -> Result<Ops<'static, Error>> {
    use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    let (ours, theirs) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let (tx, routed) = courier::chan::unbounded::<u64>();
    // The forwarder ends when the feeder's end closes (a zero-length read).
    thread::spawn(move || {
        let mut word = [0u8; 8];
        while let Ok((8, _)) = net::recv(&theirs, &mut word[..], RecvFlags::empty()) {
            if tx.send(u64::from_le_bytes(word)).is_err() {
                return;
            }
        }
    });
    let feeder =
        Feeder::start(move |n| net::send(&ours, &n.to_le_bytes(), SendFlags::NOSIGNAL).is_ok());
    Ok(subject(feeder, move || Ok(routed.recv()?)))
}
