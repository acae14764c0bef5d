//! `ipc`: courier's cross-process channels against ipc-channel.
//!
//! # `sendrecv_<size>`: the table of ipc-channel PR #68
//! The table of ipc-channel's "Optimisations (and cleanups) of Linux backend"
//! (<https://github.com/servo/ipc-channel/pull/68>): one message sent, then received, by one thread on one channel, for sizes
//! 1 B … 8 MiB doubling (24 sizes with `--full`; 13 in the quick run). Subjects:
//!
//! | subject | what one operation is |
//! | --- | --- |
//! | `courier` | `IpcSender<Vec<u8>>::send(value)` + `value = recv()` |
//! | `courier-socket` | `courier` with [`Config::ring`](cr::Config::ring) off: every message through the socket |
//! | `courier-serde-bytes` | the same with the payload in a `#[serde(with = "serde_bytes")]` field |
//! | `courier-bytes` | `IpcBytesSender::send(&data)` + `recv()` |
//! | `ipc-channel` | ipc-channel's `IpcSender<Vec<u8>>`, as `courier` |
//! | `ipc-channel-bytes` | ipc-channel's bytes channel, as `courier-bytes` |
//! | `floor` | below 7 KiB: `send(2)` + `recv(2)` of the bytes on a socketpair into a reused buffer; from 7 KiB: `send` + `recv` of a 40-byte header, and two `memcpy`s of the payload between warm buffers placed apart (in and out: the least a transport does that copies through memory it shares, as courier's regions do from 7 KiB; below that the kernel's one copy each way is cheaper) |
//!
//! Typed subjects send the value they received last (both crates take `T`
//! by value): an application sends what it built or was given, and a clone
//! per message would add an allocation and a copy that no channel causes.
//! ipc-channel cannot send a message larger than its socket buffer
//! and receive it on the same thread (the send blocks until the receiver
//! reads), so above that size its send runs on a scoped thread per message,
//! as ipc-channel's own `benches/platform.rs` does.
//!
//! `courier`'s settings are process-wide, so every courier subject puts its
//! own in force before it creates its channels and at the start of every
//! sample (a few relaxed stores, outside the per-message loop): `courier`,
//! `courier-bytes` and `courier-serde-bytes` run with the settings the run
//! found (the ring on, unless `COURIER_IPC_RING=0`), `courier-socket` with
//! the ring off.
//!
//! # `select_<k>of16`: receiver sets
//! One thread sends a `u64` on k of the 16 typed channels in a receiver set
//! (each channel in turn), then selects until all k messages are in and
//! decodes each (`IpcReceiverSet::select` + `IpcMessage::to`), for k = 1
//! (one ready channel among 16 idle ones) and k = 16 (all ready); per message.
//! Subjects: `courier` and `ipc-channel`, with each crate's own set, and
//! `floor`: the same packets, 8 bytes, on raw socketpairs under one `epoll`
//! instance (a `send(2)` per message, an `epoll_wait` per wait and a
//! `recv(2)` per ready socket: the system calls a set cannot do without).
//!
//! # `shm_<size>`, `shm_new_<size>`: shared memory inside messages
//! `IpcSharedMemory` on each crate's typed channel, by one thread, per
//! message, for regions of 4 KiB to 4 MiB: `shm` sends the region it
//! received last and receives it, then reads one byte of every page of it
//! (what a receiver that uses the region cannot avoid: mapping it and
//! faulting its pages in); `shm_new` first creates the region with
//! `from_bytes` (the cost of sharing fresh bytes), then does the same. The
//! regions are the crates' own (courier: a sealed memfd, checked on arrival;
//! ipc-channel: an unsealed one, mapped again at every clone and send).
//!
//! # `rtt_<placement>_<size>`: round trips between two processes
//! A child echoes every message back on a second channel; both crates use
//! their own one-shot server to bootstrap and bytes channels to carry the
//! payload; every round trip is timed on its own (p50, p99), the subjects
//! (each with its own child) taking turns in rounds. Placements: `pinned`
//! (both processes on one CPU) and `split` (one CPU each). Sizes: 64 B,
//! 4 KiB and 64 KiB, plus 1 MiB and 8 MiB, where courier's
//! whole-message region and ipc-channel's fragment stream part ways: on one
//! CPU the fragments' small hot kernel buffer wins, on two the region does.
//!
//! | subject | settings, in both processes |
//! | --- | --- |
//! | `courier` | as the run found them (the ring on; a waiting receiver spins briefly, then sleeps) |
//! | `courier-socket` | the ring off: every message through the socket |
//! | `courier-busypoll` | [`Config::busy_poll`](cr::Config::busy_poll) on: a waiting receiver spins |
//! | `ipc-channel` | its bytes channels |
//! | `floor` | 64 B to 64 KiB: one packet each way on a bare `SOCK_SEQPACKET` socketpair |
//!
//! A busy-polling child would spin through the other subjects' turns too
//! (on their CPU, when pinned), so `courier-busypoll`'s child spins only
//! during its own: before each of its turns the parent sends it a 1-byte
//! message (`[1]`, no payload size of these cases) that turns its busy
//! polling on, and before any other subject's turn one (`[0]`) that turns
//! it off; the child echoes each once it is in force. Both are untimed.
//!
//! # `oneway_64b_<placement>`: a stream between two processes
//! See `ipc_oneway.rs`.
//!
//! # `stream`: async streams under tokio
//! See `ipc_stream.rs`.

use std::cell::Cell;
use std::hint::black_box;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::OnceLock;
use std::time::Duration;

use courier::ipc as cr;
use ipc_channel::ipc as ic;
use serde::{Deserialize, Serialize};

use crate::harness::child::{self, Affinity, Peer, Placement};
use crate::harness::measure::{time_each_turns, Op, Ops, Sampler};
use crate::harness::mem::{CopyPair, APART};
use crate::harness::{Case, Ctx, Error, Result};

use super::floor;

/// A typed message whose payload goes as one copy.
#[derive(Serialize, Deserialize)]
struct Blob(#[serde(with = "serde_bytes")] Vec<u8>);

/// Bytes each sample should move, so that small sizes batch many messages.
const BYTES_PER_SAMPLE: usize = 1 << 20;

fn sizes(full: bool) -> Vec<usize> {
    if full {
        (0..24).map(|i| 1 << i).collect()
    } else {
        // Every other size of PR #68's table, and its largest.
        (0..24)
            .step_by(2)
            .map(|i| 1 << i)
            .chain([8 << 20])
            .collect()
    }
}

fn sampler(size: usize, samples: usize) -> Sampler {
    let ops = (BYTES_PER_SAMPLE / size).clamp(1, 2000) as u64;
    let samples = if size >= 1 << 20 {
        samples.min(20)
    } else {
        samples
    };
    Sampler::new(samples).warmup(3).ops(ops)
}

/// A subject: given the payload, its channels (set up, untimed) and what one
/// sample does with them, under `courier`'s settings for it (the peers and
/// the floor ignore them).
type Subject = (
    &'static str,
    Setting,
    for<'a> fn(&'a [u8]) -> Result<Ops<'a, Error>>,
);

const SUBJECTS: &[Subject] = &[
    ("courier", Setting::Found, courier_typed),
    ("courier-socket", Setting::Socket, courier_typed),
    ("courier-serde-bytes", Setting::Found, courier_serde_bytes),
    ("courier-bytes", Setting::Found, courier_bytes),
    ("ipc-channel", Setting::Found, ipc_channel_typed),
    ("ipc-channel-bytes", Setting::Found, ipc_channel_bytes),
    ("floor", Setting::Found, floor),
];

/// `courier::ipc`'s process-wide settings a subject runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setting {
    /// As the run found them (the ring on unless `COURIER_IPC_RING=0`).
    Found,
    /// The ring off: every message through the socket.
    Socket,
    /// A receiver waiting for ring messages spins.
    BusyPoll,
}

impl Setting {
    /// The child role's argument for this setting.
    pub(super) fn arg(self) -> String {
        match self {
            Setting::Found => "found",
            Setting::Socket => "socket",
            Setting::BusyPoll => "busypoll",
        }
        .to_string()
    }

    /// The setting a child role was given with [`Setting::arg`].
    pub(super) fn parse(arg: Option<&String>) -> Result<Setting> {
        match arg.map(String::as_str) {
            Some("found") => Ok(Setting::Found),
            Some("socket") => Ok(Setting::Socket),
            Some("busypoll") => Ok(Setting::BusyPoll),
            other => Err(format!("courier setting {other:?}").into()),
        }
    }

    /// The settings in this process as the run found them, read once (the
    /// first time any is put in force), with this one's change.
    pub(super) fn config(self) -> cr::Config {
        static FOUND: OnceLock<cr::Config> = OnceLock::new();
        let mut config = *FOUND.get_or_init(cr::Config::global);
        match self {
            Setting::Found => {}
            Setting::Socket => config.ring = false,
            Setting::BusyPoll => config.busy_poll = true,
        }
        config
    }

    /// Puts these settings in force in this process.
    pub(super) fn apply(self) {
        cr::Config::set_global(self.config());
    }

    /// `ops`, with these settings put in force at the start of every sample.
    fn around<'a>(self, mut ops: Ops<'a, Error>) -> Ops<'a, Error> {
        Box::new(move |n| {
            self.apply();
            ops(n)
        })
    }
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    // Read the settings as found before any subject changes them.
    Setting::Found.apply();
    let samples = ctx.samples(30, 100);
    for size in sizes(ctx.full()) {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let case = Case::sized("sendrecv", size as u64);
        if !ctx.wants(&case) {
            continue;
        }
        ctx.status(case.name());
        let mut subjects = SUBJECTS
            .iter()
            .map(|&(_, setting, setup)| {
                setting.apply(); // before the channels are created
                Ok(setting.around(setup(&data)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let sampled = sampler(size, samples).interleave(&mut subjects);
        Setting::Found.apply();
        let sampled = sampled?;
        drop(subjects);
        for ((subject, _, _), s) in SUBJECTS.iter().zip(sampled) {
            ctx.record(&case, subject, "sendrecv_ns", "ns", &s.wall_ns);
        }
    }
    ctx.note("sendrecv: one message sent then received by one thread; typed subjects send the value they received last (no clone); subjects take turns, one sample each per round; courier-socket = courier with Config.ring off");
    ctx.note(format!(
        "ipc-channel above {} B sends from a scoped thread per message (its send blocks until read); \
         floor from 7 KiB = a 40-byte packet and two warm memcpys placed apart",
        ic_max_fragment()
    ));
    receiver_sets(ctx)?;
    shared_memory(ctx)?;
    super::ipc_router::run(ctx)?;
    super::ipc_fds::run(ctx)?;
    round_trips(ctx)?;
    super::ipc_oneway::run(ctx)?;
    super::ipc_stream::run(ctx)
}

/// `shm_<size>` and `shm_new_<size>`: see the module docs.
fn shared_memory(ctx: &mut Ctx<'_>) -> Result<()> {
    let samples = ctx.samples(30, 100);
    let sizes: &[usize] = if ctx.full() {
        &[4 << 10, 64 << 10, 1 << 20, 4 << 20]
    } else {
        &[64 << 10, 4 << 20]
    };
    for &size in sizes {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        for new in [false, true] {
            let case = Case::sized(if new { "shm_new" } else { "shm" }, size as u64);
            if !ctx.wants(&case) {
                continue;
            }
            ctx.status(case.name());
            let mut subjects = vec![courier_shm(&data, new)?, ipc_channel_shm(&data, new)?];
            let ops = (BYTES_PER_SAMPLE / size).clamp(1, 200) as u64;
            let sampled = Sampler::new(samples)
                .warmup(3)
                .ops(ops)
                .interleave(&mut subjects)?;
            drop(subjects);
            for (subject, s) in ["courier", "ipc-channel"].into_iter().zip(sampled) {
                ctx.record(&case, subject, "msg_ns", "ns", &s.wall_ns);
            }
        }
    }
    ctx.note(
        "shm_<size>: one thread sends the IpcSharedMemory it received last, receives it and reads \
         a byte of every page; shm_new_<size>: the same after creating it with from_bytes; per message",
    );
    Ok(())
}

/// Reads one byte of every page of `bytes`, as a receiver that uses a region
/// must at least do (each page of a fresh mapping faults once).
fn touch_pages(bytes: &[u8]) -> u8 {
    bytes.iter().step_by(4096).fold(0, |acc, &b| acc ^ b)
}

/// A `shm*` subject on the crate `$ipc` (`cr` or `ic`, whose
/// `IpcSharedMemory` APIs are the same).
macro_rules! shm_subject {
    ($name:ident, $ipc:ident) => {
        fn $name(data: &[u8], new: bool) -> Result<Ops<'_, Error>> {
            let (tx, rx) = $ipc::channel::<$ipc::IpcSharedMemory>()?;
            let mut region = Some($ipc::IpcSharedMemory::from_bytes(data));
            Ok(Box::new(move |ops| {
                for _ in 0..ops {
                    let sent = match new {
                        true => $ipc::IpcSharedMemory::from_bytes(data),
                        false => region.take().expect("received back"),
                    };
                    tx.send(sent)?;
                    let got = rx.recv()?;
                    black_box(touch_pages(&got));
                    region = Some(got);
                }
                Ok(())
            }))
        }
    };
}

shm_subject!(courier_shm, cr);
shm_subject!(ipc_channel_shm, ic);

/// Channels in the receiver set of the `select_*` cases.
const SET_CHANNELS: usize = 16;

/// `select_<k>of16`: k of a set's 16 channels get a message, then the set is
/// selected until all k are in, by one thread; per message.
fn receiver_sets(ctx: &mut Ctx<'_>) -> Result<()> {
    let samples = ctx.samples(30, 100);
    for ready in [1, SET_CHANNELS] {
        let case = Case::new(format!("select_{ready}of{SET_CHANNELS}"));
        if !ctx.wants(&case) {
            continue;
        }
        ctx.status(case.name());
        let mut subjects = vec![
            courier_set(ready)?,
            ipc_channel_set(ready)?,
            set_floor(ready)?,
        ];
        let ops = (2000 / ready * ready) as u64;
        let sampled = Sampler::new(samples)
            .warmup(3)
            .ops(ops)
            .interleave(&mut subjects)?;
        drop(subjects);
        for (subject, s) in ["courier", "ipc-channel", "floor"].into_iter().zip(sampled) {
            ctx.record(&case, subject, "msg_ns", "ns", &s.wall_ns);
        }
    }
    ctx.note(format!(
        "select_<k>of{SET_CHANNELS}: one thread sends a u64 on k of the {SET_CHANNELS} channels \
         of a receiver set (in turn), then selects until all k are in and decodes each; per message"
    ));
    Ok(())
}

/// Rounds of `ready` messages making up `ops` messages (at least one round:
/// the untimed warm turn asks for one message).
fn rounds(ops: u64, ready: usize) -> u64 {
    (ops / ready as u64).max(1)
}

/// A `select_*` subject, `$name`, on the crate `$ipc` (`cr` or `ic`: their
/// receiver sets have the same API, which is the point of courier's).
macro_rules! set_subject {
    ($name:ident, $ipc:ident) => {
        fn $name(ready: usize) -> Result<Ops<'static, Error>> {
            let mut set = $ipc::IpcReceiverSet::new()?;
            let mut txs = Vec::new();
            for _ in 0..SET_CHANNELS {
                let (tx, rx) = $ipc::channel::<u64>()?;
                set.add(rx)?;
                txs.push(tx);
            }
            let mut next = 0;
            Ok(Box::new(move |ops| {
                for _ in 0..rounds(ops, ready) {
                    for _ in 0..ready {
                        txs[next % SET_CHANNELS].send(next as u64)?;
                        next += 1;
                    }
                    let mut got = 0;
                    while got < ready {
                        for result in set.select()? {
                            black_box(result.unwrap().1.to::<u64>()?);
                            got += 1;
                        }
                    }
                }
                Ok(())
            }))
        }
    };
}

set_subject!(courier_set, cr);
set_subject!(ipc_channel_set, ic);

/// The `select_*` floor: 8-byte packets on 16 raw socketpairs watched by one
/// `epoll` instance; per message a `send(2)`, and per round an `epoll_wait`
/// and one `recv(2)` per ready socket, no serialization.
fn set_floor(ready: usize) -> Result<Ops<'static, Error>> {
    use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
    use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    let epoll = epoll::create(CreateFlags::CLOEXEC)?;
    let mut pairs = Vec::new();
    for key in 0..SET_CHANNELS {
        let (a, b) = net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        epoll::add(&epoll, &b, EventData::new_u64(key as u64), EventFlags::IN)?;
        pairs.push((a, b));
    }
    let mut events = Vec::with_capacity(SET_CHANNELS);
    let mut next = 0;
    let mut buf = [MaybeUninit::<u8>::uninit(); 64];
    Ok(Box::new(move |ops| {
        for _ in 0..rounds(ops, ready) {
            for _ in 0..ready {
                let word = (next as u64).to_le_bytes();
                net::send(&pairs[next % SET_CHANNELS].0, &word, SendFlags::NOSIGNAL)?;
                next += 1;
            }
            let mut got = 0;
            while got < ready {
                events.clear();
                epoll::wait(&epoll, rustix::buffer::spare_capacity(&mut events), None)?;
                for event in &events {
                    let rx = &pairs[event.data.u64() as usize].1;
                    black_box(net::recv(rx, &mut buf[..], RecvFlags::DONTWAIT)?);
                    got += 1;
                }
            }
        }
        Ok(())
    }))
}

fn courier_typed(data: &[u8]) -> Result<Ops<'_, Error>> {
    courier_value(data.to_vec())
}

fn courier_serde_bytes(data: &[u8]) -> Result<Ops<'_, Error>> {
    courier_value(Blob(data.to_vec()))
}

/// Sends `value` and receives it back, per operation.
fn courier_value<'a, T>(value: T) -> Result<Ops<'a, Error>>
where
    T: Serialize + for<'de> Deserialize<'de> + 'a,
{
    let (tx, rx) = cr::channel::<T>()?;
    let mut value = Some(value);
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            tx.send(value.take().expect("received back"))?;
            value = Some(black_box(rx.recv()?));
        }
        Ok(())
    }))
}

fn courier_bytes(data: &[u8]) -> Result<Ops<'_, Error>> {
    let (tx, rx) = cr::bytes_channel()?;
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            tx.send(data)?;
            black_box(rx.recv()?);
        }
        Ok(())
    }))
}

fn ic_max_fragment() -> usize {
    ipc_channel::platform::OsIpcSender::get_max_fragment_size()
}

/// Sends `message` with `send` and receives with `recv`, on a scoped thread
/// when the message is too large for ipc-channel to send before it is
/// received.
fn ic_roundtrip<M: Send, T>(
    size: usize,
    message: M,
    send: impl FnOnce(M) -> Result<(), ipc_channel::IpcError> + Send,
    recv: impl FnOnce() -> Result<T, ipc_channel::IpcError>,
) -> Result<T> {
    if size <= ic_max_fragment() {
        send(message)?;
        return Ok(black_box(recv()?));
    }
    std::thread::scope(|s| {
        let sender = s.spawn(move || send(message));
        let received = black_box(recv()?);
        sender.join().map_err(|_| "ipc-channel sender panicked")??;
        Ok(received)
    })
}

fn ipc_channel_typed(data: &[u8]) -> Result<Ops<'_, Error>> {
    let (tx, rx) = ic::channel::<Vec<u8>>()?;
    let mut value = Some(data.to_vec());
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            let message = value.take().expect("received back");
            let send = |m| tx.send(m);
            value = Some(ic_roundtrip(data.len(), message, send, || rx.recv())?);
        }
        Ok(())
    }))
}

fn ipc_channel_bytes(data: &[u8]) -> Result<Ops<'_, Error>> {
    let (tx, rx) = ic::bytes_channel()?;
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            let send = |m: &[u8]| Ok(tx.send(m)?);
            ic_roundtrip(data.len(), data, send, || rx.recv())?;
        }
        Ok(())
    }))
}

/// Payloads from this size up have the copying floor (a header packet and
/// two `memcpy`s); below it, the socket's (courier's own crossover, where a
/// region starts to beat the kernel's copy: `SMALL_MAX` in its socket
/// module).
const COPY_FLOOR_MIN: usize = 7 * 1024;

/// The least a transport can do: the payload through the kernel in one
/// packet, or from [`COPY_FLOOR_MIN`] up, a header packet through the kernel
/// and the payload copied in and out of warm memory. The two copies use one
/// [`CopyPair`] placed [`APART`] (the copy in goes from its source to its
/// destination, the copy out back), so neither lands on this CPU's slow
/// `memcpy` placement, as two `Vec`s from the allocator can (with them the
/// 256 KiB floor read slower than the 1 MiB one; see
/// `docs/memcpy-placement.md`).
fn floor(data: &[u8]) -> Result<Ops<'_, Error>> {
    use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
    let pair = || {
        net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
    };
    let (a, b) = pair()?;
    if data.len() < COPY_FLOOR_MIN {
        let mut out = vec![MaybeUninit::<u8>::uninit(); data.len()];
        return Ok(Box::new(move |ops| {
            for _ in 0..ops {
                net::send(&a, data, SendFlags::NOSIGNAL)?;
                black_box(net::recv(&b, &mut out[..], RecvFlags::empty())?);
            }
            Ok(())
        }));
    }
    let header = [0u8; 40];
    let mut got = [MaybeUninit::<u8>::uninit(); 40];
    let mut pair = CopyPair::new(data.len(), APART, 7);
    Ok(Box::new(move |ops| {
        for _ in 0..ops {
            net::send(&a, &header, SendFlags::NOSIGNAL)?;
            black_box(net::recv(&b, &mut got[..], RecvFlags::empty())?);
            let (src, dst) = pair.split();
            dst.copy_from_slice(black_box(src));
            let (dst, src) = pair.split_back();
            dst.copy_from_slice(black_box(src));
            black_box(&mut pair);
        }
        Ok(())
    }))
}

// ===== round trips between two processes =====

/// Round-trip sizes, with the share of the round trips each makes: above one
/// packet (1 MiB, 8 MiB) a round trip costs 0.3-8 ms, so fewer are timed.
const RTT_SIZES: [(usize, usize); 5] =
    [(64, 1), (4096, 1), (65536, 1), (1 << 20, 10), (8 << 20, 40)];

/// The largest round trip the socket floor makes (one packet each way).
const MAX_FLOOR_RTT: usize = 65536;

/// The bootstrap message: the child's request sender and reply receiver.
type CourierBoot = (cr::IpcBytesSender, cr::IpcBytesReceiver);
type IpcChannelBoot = (ic::IpcBytesSender, ic::IpcBytesReceiver);

/// Rounds in which the subjects of a round-trip case take turns.
const RTT_ROUNDS: usize = 10;

/// The courier subjects of the round-trip cases, each with its own child.
const RTT_COURIER: [(&str, Setting); 3] = [
    ("courier", Setting::Found),
    ("courier-socket", Setting::Socket),
    ("courier-busypoll", Setting::BusyPoll),
];

/// The 1-byte messages that turn a `courier-busypoll` child's busy polling
/// on and off (no round trip of these cases is 1 byte long).
const SPIN: u8 = 1;
const PARK: u8 = 0;

/// Starts an echo child with `setting`, returning it and its ends.
fn courier_echo(placed: &Affinity, setting: Setting) -> Result<(Peer, CourierBoot)> {
    setting.apply(); // before the channels are created
    let (server, name) = cr::IpcOneShotServer::<CourierBoot>::new()?;
    let peer = placed.spawn("ipc-echo-courier", &[name, setting.arg()], &[])?;
    let (_rx, ends) = server.accept_timeout(Duration::from_secs(30))?;
    Setting::Found.apply();
    Ok((peer, ends))
}

fn round_trips(ctx: &mut Ctx<'_>) -> Result<()> {
    let all = ctx.pick(2000, 20000);
    // Not `Unpinned`: left to the scheduler, each subject's child lands on
    // the parent's CPU or the other one by chance (a 6 µs or an 80 µs round
    // trip), so subjects measured side by side compare placements, not
    // transports. `Pinned` and `Split` are those two cases, controlled.
    for placement in [Placement::Pinned, Placement::Split] {
        for (size, share) in RTT_SIZES {
            let n = all / share;
            let warmup = (n / 10).min(200);
            let data = vec![7u8; size];
            let case = Case::sized(format!("rtt_{}", placement.label()), size as u64);
            if !ctx.wants(&case) {
                continue;
            }
            ctx.status(case.name());
            let placed = placement.enter()?;

            let mut couriers = Vec::new();
            for (_, setting) in RTT_COURIER {
                couriers.push(courier_echo(&placed, setting)?);
            }
            let (server, name) = ic::IpcOneShotServer::<IpcChannelBoot>::new()?;
            let ic_peer = placed.spawn("ipc-echo-ipc-channel", &[name], &[])?;
            let (_rx, (ic_tx, ic_rx)) = server.accept()?;
            // The socket floor is one packet each way; larger payloads have none.
            let floor = match size <= MAX_FLOOR_RTT {
                true => Some(floor::socket_echo(&placed, size)?),
                false => None,
            };

            let mut subjects: Vec<(&str, Setting, Op<'_, Error>)> = Vec::new();
            for ((subject, setting), (_, (tx, rx))) in RTT_COURIER.iter().zip(&couriers) {
                let data = &data;
                let op: Op<'_, Error> = Box::new(move || {
                    tx.send(data)?;
                    black_box(rx.recv()?);
                    Ok(())
                });
                subjects.push((subject, *setting, op));
            }
            subjects.push((
                "ipc-channel",
                Setting::Found,
                Box::new(|| {
                    ic_tx.send(&data)?;
                    black_box(ic_rx.recv()?);
                    Ok(())
                }),
            ));
            if let Some((socket, _)) = &floor {
                let mut round_trip = floor::socket_round_trip(socket, size);
                subjects.push(("floor", Setting::Found, Box::new(move || Ok(round_trip()?))));
            }
            let settings: Vec<Setting> = subjects.iter().map(|s| s.1).collect();
            let (names, mut ops): (Vec<_>, Vec<_>) =
                subjects.into_iter().map(|(n, _, op)| (n, op)).unzip();
            // The busy-polling child and whether it spins now.
            let busy = RTT_COURIER
                .iter()
                .position(|(_, s)| *s == Setting::BusyPoll)
                .map(|i| &couriers[i].1);
            let spinning = Cell::new(false);
            let spin = |on: bool| -> Result<()> {
                if let Some((tx, rx)) = busy.filter(|_| spinning.get() != on) {
                    Setting::Found.apply();
                    tx.send(&[if on { SPIN } else { PARK }])?;
                    rx.recv()?;
                    spinning.set(on);
                }
                Ok(())
            };
            let each = time_each_turns(warmup, n, RTT_ROUNDS, &mut ops, |i| {
                spin(settings[i] == Setting::BusyPoll)?;
                settings[i].apply();
                Ok(())
            });
            let parked = spin(false);
            Setting::Found.apply();
            let (each, ()) = (each?, parked?);
            drop(ops);
            for (subject, each) in names.into_iter().zip(&each) {
                ctx.record_latencies(&case, subject, "rtt", each);
            }

            drop((ic_tx, ic_rx));
            for (peer, ends) in couriers {
                drop(ends); // the child sees its request channel close and exits
                peer.wait()?;
            }
            ic_peer.wait()?;
            if let Some((socket, peer)) = floor {
                drop(socket); // EOF: the child exits
                peer.wait()?;
            }
        }
    }
    ctx.note(format!(
        "rtt: {all} round trips per case (1 MiB: a tenth, 8 MiB: a fortieth), each timed alone, the subjects taking turns in {RTT_ROUNDS} rounds; \
         the child echoes on a second bytes channel; courier-socket = courier with Config.ring off, courier-busypoll = with Config.busy_poll on \
         (in both processes; the child spins only during its own turns); floor = the same over a bare SOCK_SEQPACKET socketpair; \
         split = one CPU each (a cross-CPU wake-up per hop)"
    ));
    Ok(())
}

/// Child role: echoes courier bytes messages until the parent hangs up,
/// under the `Setting` its second argument names. A `busypoll` child
/// starts with busy polling off and turns it on and off at the parent's
/// 1-byte `SPIN` and `PARK` messages (echoed like any other).
pub fn echo_courier(args: &[String]) -> Result<()> {
    child::die_with_parent()?;
    let name = args.first().ok_or("server name")?.clone();
    let setting = Setting::parse(args.get(1))?;
    // Before the channels are created; a busy poller spins only on request.
    match setting {
        Setting::BusyPoll => Setting::Found.apply(),
        other => other.apply(),
    }
    let (req_tx, req_rx) = cr::bytes_channel()?;
    let (rep_tx, rep_rx) = cr::bytes_channel()?;
    cr::IpcSender::<CourierBoot>::connect(name)?.send((req_tx, rep_rx))?;
    loop {
        match req_rx.recv() {
            Ok(msg) => {
                if setting == Setting::BusyPoll && msg.len() == 1 {
                    match msg[0] {
                        SPIN => Setting::BusyPoll.apply(),
                        _ => Setting::Found.apply(),
                    }
                }
                rep_tx.send_vectored(&[IoSlice::new(&msg)])?
            }
            Err(cr::IpcError::Disconnected) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Child role: echoes ipc-channel bytes messages until the parent hangs up.
pub fn echo_ipc_channel(args: &[String]) -> Result<()> {
    child::die_with_parent()?;
    let name = args.first().ok_or("server name")?.clone();
    let (req_tx, req_rx) = ic::bytes_channel()?;
    let (rep_tx, rep_rx) = ic::bytes_channel()?;
    ic::IpcSender::<IpcChannelBoot>::connect(name)?.send((req_tx, rep_rx))?;
    loop {
        match req_rx.recv() {
            Ok(msg) => rep_tx.send(&msg)?,
            Err(ipc_channel::IpcError::Disconnected) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
