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
//!
//! Metrics: `msgs_per_s`, the throughput of the three threads; and
//! `router_cpu_ns`, the CPU time the routing thread spent per message (its
//! `/proc/self/task/<tid>/schedstat` run time over the sample, the thread
//! found by name: `courier-router`, ipc-channel's `router-proxy`, the floor's
//! `floor-forward`). The feeder's sends take about as long as the router's
//! receives, so the throughput of a router cheaper than the feeder is the
//! feeder's, and on two CPUs shared by three threads (and whatever else
//! runs) it follows their total CPU time; `router_cpu_ns` is the router's own
//! cost.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
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
    let warmup = 2;
    let (mut subjects, router_cpu): (Vec<Ops<'static, Error>>, Vec<RouterCpu>) = [
        courier_chan()?,
        courier_crossbeam()?,
        ipc_channel_crossbeam()?,
        floor()?,
    ]
    .into_iter()
    .unzip();
    let sampled = Sampler::new(samples)
        .warmup(warmup)
        .ops(messages)
        .interleave(&mut subjects)?;
    drop(subjects);
    for ((subject, s), cpu) in SUBJECTS.into_iter().zip(sampled).zip(router_cpu) {
        ctx.record(&case, subject, "msgs_per_s", "msgs/s", &s.per_s());
        let cpu = cpu.borrow();
        ctx.record(
            &case,
            subject,
            "router_cpu_ns",
            "ns",
            &cpu[warmup.min(cpu.len())..],
        );
    }
    ctx.note(format!(
        "router: {messages} u64s a sample from a feeder thread through the crate's global ROUTER \
         into an unbounded in-process channel, received and counted by the measuring thread; \
         per message; router_cpu_ns = the routing thread's CPU time (schedstat) per message"
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

/// The routing thread's CPU time per message of each sample (and of each
/// warm-up sample, first).
type RouterCpu = Rc<RefCell<Vec<f64>>>;

/// A subject with its routing thread's CPU times.
type Subject = (Ops<'static, Error>, RouterCpu);

/// A subject: the feeder, a receive that returns the next message, and the
/// name of the thread that routes the messages.
fn subject<R>(feeder: Feeder, mut recv: R, router: &str) -> Result<Subject>
where
    R: FnMut() -> Result<u64> + 'static,
{
    let schedstat = schedstat_of(router)?;
    let cpu = RouterCpu::default();
    let per_sample = Rc::clone(&cpu);
    let mut expected = 0u64;
    let ops: Ops<'static, Error> = Box::new(move |ops| {
        let before = run_time_ns(&schedstat)?;
        feeder.request(ops)?;
        for _ in 0..ops {
            let got = recv()?;
            if got != expected {
                return Err(format!("message {got} where {expected} was due").into());
            }
            expected += 1;
        }
        let spent = run_time_ns(&schedstat)?.saturating_sub(before);
        // (The untimed single message before each sample is not one.)
        if ops > 1 {
            per_sample.borrow_mut().push(spent as f64 / ops as f64);
        }
        Ok(())
    });
    Ok((ops, cpu))
}

/// The `schedstat` file of this process's thread named `name`. (A thread
/// names itself once it runs: one just spawned may not have yet.)
fn schedstat_of(name: &str) -> Result<PathBuf> {
    for _ in 0..1000 {
        for task in std::fs::read_dir("/proc/self/task")? {
            let task = task?.path();
            // (A thread that ended meanwhile has no `comm` left.)
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim_end() == name {
                return Ok(task.join("schedstat"));
            }
        }
        thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(format!("no thread named {name}").into())
}

/// Time a thread has spent on a CPU, ns: the first field of its `schedstat`.
fn run_time_ns(schedstat: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(schedstat)?;
    let field = text.split_whitespace().next().ok_or("empty schedstat")?;
    Ok(field.parse()?)
}

fn courier_chan() -> Result<Subject> {
    let (tx, rx) = cr::channel::<u64>()?;
    let routed = courier::router::ROUTER.route_ipc_receiver_to_new_chan_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    subject(feeder, move || Ok(routed.recv()?), "courier-router")
}

fn courier_crossbeam() -> Result<Subject> {
    let (tx, rx) = cr::channel::<u64>()?;
    let routed = courier::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    subject(feeder, move || Ok(routed.recv()?), "courier-router")
}

fn ipc_channel_crossbeam() -> Result<Subject> {
    let (tx, rx) = ic::channel::<u64>()?;
    let routed = ipc_channel::router::ROUTER.route_ipc_receiver_to_new_crossbeam_receiver(rx);
    let feeder = Feeder::start(move |n| tx.send(n).is_ok());
    subject(feeder, move || Ok(routed.recv()?), "router-proxy")
}

fn floor() -> Result<Subject> {
    use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    let (ours, theirs) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let (tx, routed) = courier::chan::unbounded::<u64>();
    // The forwarder ends when the feeder's end closes (a zero-length read).
    thread::Builder::new()
        .name("floor-forward".into())
        .spawn(move || {
            let mut word = [0u8; 8];
            while let Ok((8, _)) = net::recv(&theirs, &mut word[..], RecvFlags::empty()) {
                if tx.send(u64::from_le_bytes(word)).is_err() {
                    return;
                }
            }
        })?;
    let feeder =
        Feeder::start(move |n| net::send(&ours, &n.to_le_bytes(), SendFlags::NOSIGNAL).is_ok());
    subject(feeder, move || Ok(routed.recv()?), "floor-forward")
}
