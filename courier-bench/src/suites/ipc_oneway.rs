//! `oneway_64b_<placement>`: a stream of 64-byte messages from one process
//! to another, in messages per second (`msgs_per_s`).
//!
//! A child sends, the parent receives. Every sample is one burst: the parent
//! writes the burst's length N to a control socket (a bare `SOCK_SEQPACKET`
//! socketpair, the same for every subject), the child sends N messages on
//! the subject's channel as fast as it can, and the parent receives all N.
//! The clock runs from just before the parent's control write to the return
//! of its last receive: end to end, so the start of every burst (the
//! child's wake-up, the parent's first) counts against the subject, and
//! nothing can be queued before the clock starts. `msgs_per_s` = N / that
//! time. Each subject's N is what it moves in about [`BURST`] (25 ms),
//! found in its warm-up (at least 1,000, at most 4,000,000), so that the
//! start, a few tens of µs even across CPUs, stays under 1% of a sample
//! for fast and slow subjects alike. The subjects take turns, one burst
//! each per round, starting one further along each round.
//!
//! | subject | the child sends | the parent receives |
//! | --- | --- | --- |
//! | `courier` | `IpcSender<Vec<u8>>::send(data.clone())` | `IpcReceiver::recv` |
//! | `courier-socket` | the same, with [`Config::ring`](courier::ipc::Config::ring) off in both processes | the same |
//! | `courier-bytes` | `IpcBytesSender::send(&data)` | `IpcBytesReceiver::recv` |
//! | `ipc-channel` | ipc-channel's `IpcSender<Vec<u8>>`, as `courier` | as `courier` |
//! | `ipc-channel-bytes` | ipc-channel's bytes channel, as `courier-bytes` | as `courier-bytes` |
//! | `floor` | `send(2)` of the 64 bytes on a bare `SOCK_SEQPACKET` socketpair | `recv(2)` into a reused buffer |
//!
//! A typed stream's sender builds every message it sends, so both typed
//! subjects send a fresh `Vec` (a 64-byte clone) each time. Placements:
//! `pinned`, both processes on one CPU (every hand-over between them is a
//! context switch, so messages move in batches as large as the channel
//! holds), and `split`, one CPU each (both run at once).

use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use courier::ipc as cr;
use ipc_channel::ipc as ic;
use rustix::net::SocketType;
use rustix::net::{recv, send, socketpair, AddressFamily, RecvFlags, SendFlags, SocketFlags};

use super::ipc::Setting;
use crate::harness::child::{self, inherited_fd, Affinity, Peer, Placement};
use crate::harness::measure::rotation;
use crate::harness::{size_label, Case, Ctx, Result};

/// The message size.
const SIZE: usize = 64;
/// How long a burst (one sample) lasts, about.
const BURST: Duration = Duration::from_millis(25);
/// Bounds of a burst, in messages.
const MIN_BURST: u64 = 1_000;
const MAX_BURST: u64 = 4_000_000;

/// What goes through the channel: `Vec<u8>` values or bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Typed,
    Bytes,
}

impl Kind {
    fn arg(self) -> String {
        match self {
            Kind::Typed => "typed",
            Kind::Bytes => "bytes",
        }
        .to_string()
    }

    fn parse(arg: Option<&String>) -> Result<Kind> {
        match arg.map(String::as_str) {
            Some("typed") => Ok(Kind::Typed),
            Some("bytes") => Ok(Kind::Bytes),
            other => Err(format!("message kind {other:?}").into()),
        }
    }
}

/// The parent's side of one subject: the child sending to it, the control
/// socket that starts a burst, and one receive.
struct Stream {
    name: &'static str,
    setting: Setting,
    ctl: OwnedFd,
    peer: Peer,
    recv: Box<dyn FnMut() -> Result<()>>,
    /// Messages per burst (found in the warm-up).
    n: u64,
}

impl Stream {
    /// One burst of `n` messages, timed end to end.
    fn burst(&mut self, n: u64) -> Result<Duration> {
        self.setting.apply();
        let t0 = Instant::now();
        send(&self.ctl, &n.to_le_bytes(), SendFlags::empty())?;
        for _ in 0..n {
            (self.recv)()?;
        }
        Ok(t0.elapsed())
    }

    /// Warms the subject up and sets its burst length: bursts four times
    /// longer each until one lasts a quarter of [`BURST`].
    fn calibrate(&mut self) -> Result<()> {
        self.burst(MIN_BURST)?; // untimed: first sends set up what they set up
        let mut n = MIN_BURST;
        loop {
            let t = self.burst(n)?;
            if t >= BURST / 4 || n >= MAX_BURST {
                let scaled = n as f64 * BURST.as_secs_f64() / t.as_secs_f64().max(1e-9);
                self.n = (scaled as u64).clamp(MIN_BURST, MAX_BURST);
                return Ok(());
            }
            n *= 4;
        }
    }

    /// Stops the child (EOF on its control socket) and waits for it.
    fn finish(self) -> Result<()> {
        drop(self.ctl);
        drop(self.recv);
        Ok(self.peer.wait()?)
    }
}

fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Runs the cases.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    let samples = ctx.samples(20, 100);
    for placement in [Placement::Pinned, Placement::Split] {
        let name = format!("oneway_{}_{}", size_label(SIZE as u64), placement.label());
        let case = Case::new(name).bytes(SIZE as u64);
        if !ctx.wants(&case) {
            continue;
        }
        ctx.status(case.name());
        let placed = placement.enter()?;
        let mut streams = vec![
            courier(&placed, "courier", Kind::Typed, Setting::Found)?,
            courier(&placed, "courier-socket", Kind::Typed, Setting::Socket)?,
            courier(&placed, "courier-bytes", Kind::Bytes, Setting::Found)?,
            ipc_channel(&placed, "ipc-channel", Kind::Typed)?,
            ipc_channel(&placed, "ipc-channel-bytes", Kind::Bytes)?,
            floor(&placed)?,
        ];
        let rates = measure(&mut streams, samples);
        Setting::Found.apply();
        let rates = rates?;
        for (stream, rates) in streams.iter().zip(&rates) {
            ctx.record(&case, stream.name, "msgs_per_s", "msgs/s", rates);
        }
        let bursts: Vec<String> = streams
            .iter()
            .map(|s| format!("{} {}", s.name, s.n))
            .collect();
        ctx.note(format!(
            "{}: messages per burst: {}",
            case.name(),
            bursts.join(", ")
        ));
        for stream in streams {
            stream.finish()?;
        }
    }
    ctx.note(format!(
        "oneway_64b: a child streams 64 B messages to the parent in bursts of about {} ms ({samples} a subject, taking turns); \
         msgs_per_s = messages / time from the parent's start signal to its last receive (end to end); typed subjects send a fresh Vec each; \
         courier-socket = courier with Config.ring off; floor = send(2)/recv(2) on a bare SOCK_SEQPACKET socketpair",
        BURST.as_millis()
    ));
    Ok(())
}

/// Every subject's burst length, then `samples` rounds of one burst each:
/// messages per second of every burst, by subject.
fn measure(streams: &mut [Stream], samples: usize) -> Result<Vec<Vec<f64>>> {
    for stream in streams.iter_mut() {
        stream.calibrate()?;
    }
    let mut rates = vec![Vec::with_capacity(samples); streams.len()];
    for round in 0..samples {
        for i in rotation(round, streams.len()) {
            let stream = &mut streams[i];
            let n = stream.n;
            let t = stream.burst(n)?;
            rates[i].push(n as f64 / t.as_secs_f64());
        }
    }
    Ok(rates)
}

/// A courier subject: its child connects to a one-shot server and sends
/// over the receiver of the channel it streams on.
fn courier(placed: &Affinity, name: &'static str, kind: Kind, setting: Setting) -> Result<Stream> {
    setting.apply();
    let (ctl, theirs) = seqpacket_pair()?;
    let args = |server: String| [server, kind.arg(), setting.arg()];
    let timeout = Duration::from_secs(30);
    let (peer, recv): (Peer, Box<dyn FnMut() -> Result<()>>) = match kind {
        Kind::Typed => {
            let (server, server_name) = cr::IpcOneShotServer::<cr::IpcReceiver<Vec<u8>>>::new()?;
            let peer = placed.spawn(ROLE_COURIER, &args(server_name), &[theirs.as_fd()])?;
            let (_, rx) = server.accept_timeout(timeout)?;
            (
                peer,
                Box::new(move || {
                    black_box(rx.recv()?);
                    Ok(())
                }),
            )
        }
        Kind::Bytes => {
            let (server, server_name) = cr::IpcOneShotServer::<cr::IpcBytesReceiver>::new()?;
            let peer = placed.spawn(ROLE_COURIER, &args(server_name), &[theirs.as_fd()])?;
            let (_, rx) = server.accept_timeout(timeout)?;
            (
                peer,
                Box::new(move || {
                    black_box(rx.recv()?);
                    Ok(())
                }),
            )
        }
    };
    Setting::Found.apply();
    Ok(Stream {
        name,
        setting,
        ctl,
        peer,
        recv,
        n: MIN_BURST,
    })
}

/// An ipc-channel subject, set up as [`courier`]'s.
fn ipc_channel(placed: &Affinity, name: &'static str, kind: Kind) -> Result<Stream> {
    let (ctl, theirs) = seqpacket_pair()?;
    let (peer, recv): (Peer, Box<dyn FnMut() -> Result<()>>) = match kind {
        Kind::Typed => {
            let (server, server_name) = ic::IpcOneShotServer::<ic::IpcReceiver<Vec<u8>>>::new()?;
            let args = [server_name, kind.arg()];
            let peer = placed.spawn(ROLE_IPC_CHANNEL, &args, &[theirs.as_fd()])?;
            let (_, rx) = server.accept()?;
            (
                peer,
                Box::new(move || {
                    black_box(rx.recv()?);
                    Ok(())
                }),
            )
        }
        Kind::Bytes => {
            let (server, server_name) = ic::IpcOneShotServer::<ic::IpcBytesReceiver>::new()?;
            let args = [server_name, kind.arg()];
            let peer = placed.spawn(ROLE_IPC_CHANNEL, &args, &[theirs.as_fd()])?;
            let (_, rx) = server.accept()?;
            (
                peer,
                Box::new(move || {
                    black_box(rx.recv()?);
                    Ok(())
                }),
            )
        }
    };
    Ok(Stream {
        name,
        setting: Setting::Found,
        ctl,
        peer,
        recv,
        n: MIN_BURST,
    })
}

/// The floor: the 64 bytes as one packet each on a bare socketpair.
fn floor(placed: &Affinity) -> Result<Stream> {
    let (ctl, theirs) = seqpacket_pair()?;
    let (data, their_data) = seqpacket_pair()?;
    let peer = placed.spawn(ROLE_FLOOR, &[], &[theirs.as_fd(), their_data.as_fd()])?;
    let mut buf = [0u8; SIZE];
    let recv = Box::new(move || {
        let (got, _) = recv(&data, &mut buf[..], RecvFlags::empty())?;
        if got != SIZE {
            return Err(format!("received {got} of {SIZE} bytes").into());
        }
        Ok(())
    });
    Ok(Stream {
        name: "floor",
        setting: Setting::Found,
        ctl,
        peer,
        recv,
        n: MIN_BURST,
    })
}

/// The child roles.
pub const ROLE_COURIER: &str = "ipc-oneway-courier";
pub const ROLE_IPC_CHANNEL: &str = "ipc-oneway-ipc-channel";
pub const ROLE_FLOOR: &str = "ipc-oneway-floor";

/// In a child: for every burst length read from the control socket
/// (descriptor 0), `send(n)`; returns at EOF.
fn serve(mut send_n: impl FnMut(u64) -> Result<()>) -> Result<()> {
    child::die_with_parent()?;
    let ctl = inherited_fd(0)?;
    let mut word = [0u8; 8];
    loop {
        let (got, _) = recv(&ctl, &mut word[..], RecvFlags::empty())?;
        match got {
            0 => return Ok(()), // EOF: the parent is done
            8 => send_n(u64::from_le_bytes(word))?,
            _ => return Err(format!("a {got}-byte burst length").into()),
        }
    }
}

/// Child role: streams courier messages. Args: server name, kind, setting.
pub fn stream_courier(args: &[String]) -> Result<()> {
    let name = args.first().ok_or("server name")?.clone();
    let kind = Kind::parse(args.get(1))?;
    Setting::parse(args.get(2))?.apply(); // before the channel is created
    let data = vec![7u8; SIZE];
    match kind {
        Kind::Typed => {
            let (tx, rx) = cr::channel::<Vec<u8>>()?;
            cr::IpcSender::<cr::IpcReceiver<Vec<u8>>>::connect(name)?.send(rx)?;
            serve(|n| {
                for _ in 0..n {
                    tx.send(data.clone())?;
                }
                Ok(())
            })
        }
        Kind::Bytes => {
            let (tx, rx) = cr::bytes_channel()?;
            cr::IpcSender::<cr::IpcBytesReceiver>::connect(name)?.send(rx)?;
            serve(|n| {
                for _ in 0..n {
                    tx.send(&data)?;
                }
                Ok(())
            })
        }
    }
}

/// Child role: streams ipc-channel messages. Args: server name, kind.
pub fn stream_ipc_channel(args: &[String]) -> Result<()> {
    let name = args.first().ok_or("server name")?.clone();
    let kind = Kind::parse(args.get(1))?;
    let data = vec![7u8; SIZE];
    match kind {
        Kind::Typed => {
            let (tx, rx) = ic::channel::<Vec<u8>>()?;
            ic::IpcSender::<ic::IpcReceiver<Vec<u8>>>::connect(name)?.send(rx)?;
            serve(|n| {
                for _ in 0..n {
                    tx.send(data.clone())?;
                }
                Ok(())
            })
        }
        Kind::Bytes => {
            let (tx, rx) = ic::bytes_channel()?;
            ic::IpcSender::<ic::IpcBytesReceiver>::connect(name)?.send(rx)?;
            serve(|n| {
                for _ in 0..n {
                    tx.send(&data)?;
                }
                Ok(())
            })
        }
    }
}

/// Child role: streams 64-byte packets on descriptor 1.
pub fn stream_floor(_args: &[String]) -> Result<()> {
    let data = inherited_fd(1)?;
    let msg = [7u8; SIZE];
    serve(|n| {
        for _ in 0..n {
            send(&data, &msg, SendFlags::empty())?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_args_round_trip() {
        for kind in [Kind::Typed, Kind::Bytes] {
            assert_eq!(Kind::parse(Some(&kind.arg())).unwrap(), kind);
        }
        for setting in [Setting::Found, Setting::Socket, Setting::BusyPoll] {
            assert_eq!(Setting::parse(Some(&setting.arg())).unwrap(), setting);
        }
        assert!(Kind::parse(None).is_err());
        assert!(Setting::parse(Some(&"ring".to_string())).is_err());
    }

    #[test]
    fn settings_change_only_their_field() {
        let found = Setting::Found.config();
        let socket = Setting::Socket.config();
        let busy = Setting::BusyPoll.config();
        assert!(!socket.ring && socket.busy_poll == found.busy_poll);
        assert!(busy.busy_poll && busy.ring == found.ring);
    }
}
