//! Load: 1, 8 and 64 sender threads, and 8 child processes, send messages of
//! mixed sizes (1 B to 4 MiB, the large ones rare) to one receiver and to a
//! receiver set. Every message must arrive exactly once, intact, and in its
//! sender's order.
//!
//! The messages of the whole file number `COURIER_LOAD_MESSAGES` (default
//! 1,000,000), shared evenly between its eight runs. A message's length and
//! contents follow from its sender and its number, and its first byte is its
//! sender, so the receiver regenerates what it must be and compares.
//!
//! Child processes are the test binary re-executed (`/proc/self/exe`), as in
//! `ipc_xprocess.rs`.

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::Duration;

use courier::ipc::{
    self, IpcBytesReceiver, IpcBytesSender, IpcOneShotServer, IpcReceiverSet, IpcSelectionResult,
    IpcSender,
};
use serde_bytes::ByteBuf;

mod common;
mod watchdog;
use common::fd_check;
use watchdog::with_watchdog;

const ROLE: &str = "COURIER_LOAD_ROLE";
const SERVER: &str = "COURIER_LOAD_SERVER";
const ID: &str = "COURIER_LOAD_ID";
const COUNT: &str = "COURIER_LOAD_COUNT";
const PATIENCE: Duration = Duration::from_secs(60);
/// The watchdog's limit for one run.
const LIMIT: Duration = Duration::from_secs(600);
/// Runs in this file, each sending its share of the messages.
const RUNS: u64 = 8;

/// Messages each run sends, in all its senders.
fn per_run() -> u64 {
    let total = std::env::var("COURIER_LOAD_MESSAGES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1_000_000);
    (total / RUNS).max(1)
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The length of message `seq` of sender `id`: mostly up to 256 bytes, one
/// in a hundred up to 8 KiB, one in two thousand up to 256 KiB, one in
/// fifty thousand (and each run's second message) 4 MiB.
fn length(id: u32, seq: u64) -> usize {
    if id == 0 && seq == 1 {
        return 4 << 20;
    }
    let h = mix(u64::from(id) << 40 ^ seq);
    match h % 50_000 {
        0 => 4 << 20,
        n if n % 2000 == 0 => 8192 + (h >> 20) as usize % (248 << 10),
        n if n % 100 == 0 => 257 + (h >> 20) as usize % 7936,
        _ => 1 + (h >> 20) as usize % 256,
    }
}

/// Message `seq` of sender `id`: its first byte is `id`, the rest a
/// checksum stream of `(id, seq)`.
fn message(id: u32, seq: u64) -> Vec<u8> {
    let len = length(id, seq);
    let mut data = vec![0u8; len];
    let seed = mix(u64::from(id) << 40 ^ seq ^ 0x5151);
    let mut words = data.chunks_exact_mut(8);
    let mut i = 0u64;
    for w in &mut words {
        w.copy_from_slice(&(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
        i += 1;
    }
    let last = (seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes();
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
    data[0] = id as u8;
    data
}

/// Checks every message as it comes: its sender's next, and intact.
#[derive(Default)]
struct Checker {
    next: HashMap<u32, u64>,
    received: u64,
}

impl Checker {
    fn check(&mut self, data: &[u8]) {
        let id = u32::from(*data.first().expect("an empty message"));
        let seq = self.next.entry(id).or_default();
        let expected = message(id, *seq);
        assert!(
            data == expected,
            "sender {id}, message {seq}: {} bytes, {} expected, or not intact",
            data.len(),
            expected.len()
        );
        *seq += 1;
        self.received += 1;
    }

    /// Every sender sent `each` messages and all of them came.
    fn done(&self, senders: u32, each: u64) {
        assert_eq!(self.next.len(), senders as usize, "senders heard from");
        for (id, &n) in &self.next {
            assert_eq!(n, each, "messages from sender {id}");
        }
    }
}

/// Where senders send: one receiver, or one of the channels of a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    One,
    Set,
}

/// Channels of the set.
const SET_CHANNELS: u32 = 4;

/// A sender's end: bytes for the single receiver, byte strings for a set.
enum End {
    Bytes(IpcBytesSender),
    Typed(IpcSender<ByteBuf>),
}

impl End {
    fn send(&self, data: Vec<u8>) {
        match self {
            End::Bytes(tx) => tx.send(&data).unwrap(),
            End::Typed(tx) => tx.send(ByteBuf::from(data)).unwrap(),
        }
    }
}

fn send_all(end: End, id: u32, count: u64) {
    for seq in 0..count {
        end.send(message(id, seq));
    }
}

/// What a run's senders are.
#[derive(Clone, Copy, Debug)]
enum Senders {
    Threads(u32),
    Processes(u32),
}

impl Senders {
    fn count(self) -> u32 {
        match self {
            Senders::Threads(n) | Senders::Processes(n) => n,
        }
    }
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "send");
    let server = std::env::var(SERVER).unwrap();
    let id: u32 = std::env::var(ID).unwrap().parse().unwrap();
    let count: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    type Ends = (Option<IpcBytesSender>, Option<IpcSender<ByteBuf>>);
    let (tx, rx) = ipc::channel::<Ends>().unwrap();
    IpcSender::<IpcSender<Ends>>::connect(server)
        .unwrap()
        .send(tx)
        .unwrap();
    let end = match rx.recv().unwrap() {
        (Some(tx), _) => End::Bytes(tx),
        (_, Some(tx)) => End::Typed(tx),
        _ => panic!("no end"),
    };
    send_all(end, id, count);
    std::process::exit(0);
}

fn spawn_sender(id: u32, count: u64, end: End) -> Child {
    type Ends = (Option<IpcBytesSender>, Option<IpcSender<ByteBuf>>);
    let (server, name) = IpcOneShotServer::<IpcSender<Ends>>::new().unwrap();
    let (id, count) = (id.to_string(), count.to_string());
    let child =
        common::child_command(&[(ROLE, "send"), (SERVER, &name), (ID, &id), (COUNT, &count)])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
    let (_rx, requests) = server.accept_timeout(PATIENCE).expect("child connects");
    let ends = match end {
        End::Bytes(tx) => (Some(tx), None),
        End::Typed(tx) => (None, Some(tx)),
    };
    requests.send(ends).unwrap();
    child
}

/// One run: `senders` send this run's share of the messages to `target`.
fn load(senders: Senders, target: Target) {
    let _check = fd_check();
    let n = senders.count();
    let each = per_run() / u64::from(n);
    // The ends, one per sender, and what receives.
    let mut ends = Vec::new();
    let mut one = None::<IpcBytesReceiver>;
    let mut set = None::<IpcReceiverSet>;
    match target {
        Target::One => {
            let (tx, rx) = ipc::bytes_channel().unwrap();
            ends.extend((0..n).map(|_| End::Bytes(tx.clone())));
            one = Some(rx);
        }
        Target::Set => {
            let mut s = IpcReceiverSet::new().unwrap();
            let mut txs = Vec::new();
            for _ in 0..SET_CHANNELS {
                let (tx, rx) = ipc::channel::<ByteBuf>().unwrap();
                s.add(rx).unwrap();
                txs.push(tx);
            }
            ends.extend((0..n).map(|i| End::Typed(txs[(i % SET_CHANNELS) as usize].clone())));
            set = Some(s);
        }
    }
    let mut threads = Vec::new();
    let mut children = Vec::new();
    for (id, end) in ends.into_iter().enumerate() {
        let id = id as u32;
        match senders {
            Senders::Threads(_) => {
                threads.push(std::thread::spawn(move || send_all(end, id, each)))
            }
            Senders::Processes(_) => children.push(spawn_sender(id, each, end)),
        }
    }
    let mut checker = Checker::default();
    let total = each * u64::from(n);
    if let Some(rx) = one {
        while checker.received < total {
            checker.check(&rx.try_recv_timeout(PATIENCE).unwrap());
        }
    }
    if let Some(mut set) = set {
        let mut closed = 0;
        while closed < SET_CHANNELS {
            for result in set.try_select_timeout(PATIENCE).unwrap() {
                match result {
                    IpcSelectionResult::MessageReceived(_, message) => {
                        checker.check(&message.to::<ByteBuf>().unwrap())
                    }
                    IpcSelectionResult::ChannelClosed(_) => closed += 1,
                }
            }
        }
        assert_eq!(checker.received, total);
    }
    checker.done(n, each);
    for t in threads {
        t.join().unwrap();
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

macro_rules! load_tests {
    ($($name:ident: $senders:expr, $target:expr;)*) => {$(
        #[test]
        fn $name() {
            with_watchdog(stringify!($name), LIMIT, || load($senders, $target));
        }
    )*};
}

load_tests! {
    one_thread_to_one_receiver: Senders::Threads(1), Target::One;
    eight_threads_to_one_receiver: Senders::Threads(8), Target::One;
    sixty_four_threads_to_one_receiver: Senders::Threads(64), Target::One;
    eight_processes_to_one_receiver: Senders::Processes(8), Target::One;
    one_thread_to_a_set: Senders::Threads(1), Target::Set;
    eight_threads_to_a_set: Senders::Threads(8), Target::Set;
    sixty_four_threads_to_a_set: Senders::Threads(64), Target::Set;
    eight_processes_to_a_set: Senders::Processes(8), Target::Set;
}
