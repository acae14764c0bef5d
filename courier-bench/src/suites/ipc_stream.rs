//! `stream`, a case of the `ipc` suite: messages a second through
//! `IpcReceiver::to_stream` under tokio, courier's `asynch` against
//! ipc-channel's (both crates' feature `async`).
//!
//! A sender thread sends `ops` `u64`s on a typed channel as fast as it can;
//! a task on a tokio multi-thread runtime of two workers (tokio's default on
//! a two-CPU machine) takes them from the channel's stream with
//! `next().await` and counts them. One sample is `ops` messages, from the
//! sender's first send to the task's last `next()`; the figure is messages a
//! second (`msgs_per_s`). Each subject keeps its channel, stream and sender
//! thread for the whole run, and the subjects take turns, one sample each
//! per round.
//!
//! | subject | the stream |
//! | --- | --- |
//! | `courier` | `courier::asynch::IpcStream`: the task receives from the socket itself, and waits on courier's stream reactor (one `epoll` thread per process) only when the socket is dry |
//! | `ipc-channel` | `ipc_channel::asynch::IpcStream`: ipc-channel's router thread receives each message and forwards it through a `futures` unbounded channel |
//! | `floor` | no stream: a plain thread takes the messages from courier's channel with the blocking `recv()` (what a stream adds nothing to) |

use std::fmt::Display;
use std::sync::mpsc;
use std::thread;

use courier::ipc as cr;
use futures_core::Stream;
use futures_util::StreamExt;
use ipc_channel::ipc as ic;
use tokio::runtime::Runtime;

use crate::harness::measure::{Ops, Sampler};
use crate::harness::{Case, Ctx, Error, Result};

/// Messages per sample.
const OPS: u64 = 20_000;

/// Measures the `stream` case.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let case = Case::new("stream");
    if !ctx.wants(&case) {
        return Ok(());
    }
    ctx.status(case.name());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    let mut subjects = vec![courier(&rt)?, ipc_channel(&rt)?, floor()?];
    let sampled = Sampler::new(ctx.samples(30, 100))
        .warmup(3)
        .ops(OPS)
        .interleave(&mut subjects)?;
    drop(subjects);
    for (subject, s) in ["courier", "ipc-channel", "floor"].into_iter().zip(sampled) {
        ctx.record(&case, subject, "msgs_per_s", "msgs/s", &s.per_s());
    }
    ctx.note(format!(
        "stream: a sender thread sends {OPS} u64s per sample, a task on a 2-worker tokio runtime \
         takes them with IpcStream::next().await; floor = a thread taking them with courier's \
         blocking recv(), no stream; messages a second"
    ));
    Ok(())
}

fn courier(rt: &Runtime) -> Result<Ops<'_, Error>> {
    let (tx, rx) = cr::channel::<u64>()?;
    Ok(subject(rt, rx.to_stream(), move |n| tx.send(n).is_ok()))
}

fn ipc_channel(rt: &Runtime) -> Result<Ops<'_, Error>> {
    let (tx, rx) = ic::channel::<u64>()?;
    Ok(subject(rt, rx.to_stream(), move |n| tx.send(n).is_ok()))
}

/// The `floor` subject: courier's channel, received by a thread with the
/// blocking `recv()`.
fn floor() -> Result<Ops<'static, Error>> {
    let (tx, rx) = cr::channel::<u64>()?;
    let send = sender(move |n| tx.send(n).is_ok());
    let (receive, receive_rx) = mpsc::channel::<u64>();
    let (done_tx, done) = mpsc::channel::<Result<(), String>>();
    thread::spawn(move || {
        while let Ok(n) = receive_rx.recv() {
            let got = (0..n).try_for_each(|_| rx.recv().map(drop).map_err(|e| e.to_string()));
            if done_tx.send(got).is_err() {
                return;
            }
        }
    });
    Ok(Box::new(move |ops| {
        send.send(ops)?;
        receive.send(ops)?;
        Ok(done.recv()??)
    }))
}

/// A thread that sends as many messages as it is told, with `send` (which
/// says whether the receiver is still there); it ends when the returned
/// sender of orders is dropped.
fn sender(mut send: impl FnMut(u64) -> bool + Send + 'static) -> mpsc::Sender<u64> {
    let (orders, orders_rx) = mpsc::channel::<u64>();
    thread::spawn(move || {
        while let Ok(n) = orders_rx.recv() {
            for i in 0..n {
                if !send(i) {
                    return;
                }
            }
        }
    });
    orders
}

/// A subject: a sender thread that sends as many messages as it is told
/// (with `send`, which says whether the receiver is still there), and
/// `stream`, whose messages a task on `rt` counts.
fn subject<'a, S, E>(
    rt: &'a Runtime,
    stream: S,
    send: impl FnMut(u64) -> bool + Send + 'static,
) -> Ops<'a, Error>
where
    S: Stream<Item = Result<u64, E>> + Unpin + Send + 'static,
    E: Display,
{
    let orders = sender(send);
    let mut stream = Some(stream);
    Box::new(move |ops| {
        let mut s = stream.take().ok_or("the stream was lost")?;
        orders.send(ops)?;
        let task = rt.spawn(async move {
            let mut got = 0;
            while got < ops {
                match s.next().await {
                    Some(Ok(_)) => got += 1,
                    Some(Err(e)) => return Err(format!("stream: {e}")),
                    None => return Err("stream: ended early".to_owned()),
                }
            }
            Ok(s)
        });
        stream = Some(rt.block_on(task)??);
        Ok(())
    })
}
