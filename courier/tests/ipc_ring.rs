//! The shared-memory ring (`Config::ring`): a sender's small messages
//! without descriptors travel through a sealed memfd ("courier-ring") that
//! both processes map, set up on the sender's second send; messages with
//! descriptors, or larger than [`RING_RECORD_MAX`], keep the socket and
//! region routes. These tests check what must hold whichever route a message
//! takes: every message arrives once, intact, in its sender's order across
//! routes; a killed sender's messages already written are received, then
//! `Disconnected` comes within a second; receiver sets, timed receives and
//! fibers see ring channels as any other.
//!
//! Every test runs twice, in module `ring_on` (the default settings) and in
//! module `ring_off` (`Config::ring` false here, `COURIER_IPC_RING=0` in the
//! children): the same checks, on both paths. The `ring_on` runs also check,
//! after traffic, that the receiving process holds the ring's memfd
//! ([`ring_in_use`]), and the
//! `ring_off` runs that it holds none.
//!
//! Child processes are this binary re-executed (`/proc/self/exe`), running
//! only `child_entry`, which reads its role from `COURIER_RING_ROLE`, as in
//! `ipc_xprocess.rs`. Every test holds the binary's serial lock
//! ([`fd_check`]): they change the process's settings, and each checks that
//! no descriptor is left open.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use courier::fiber;
use courier::ipc::{
    self, IpcError, IpcFd, IpcOneShotServer, IpcReceiver, IpcReceiverSet, IpcSelectionResult,
    IpcSender, TryRecvError, RING_RECORD_MAX,
};
use rustix::fs::{self, MemfdFlags};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

mod common;
mod watchdog;
use common::{fd_check, spawn_child_entry, with_config};
use watchdog::with_watchdog;

const ROLE: &str = "COURIER_RING_ROLE";
const SERVER: &str = "COURIER_RING_SERVER";
const ID: &str = "COURIER_RING_ID";
const COUNT: &str = "COURIER_RING_COUNT";
/// How long a child may take to start and connect (a loaded CI machine).
const PATIENCE: Duration = Duration::from_secs(60);
/// The watchdog's limit for one test.
const LIMIT: Duration = Duration::from_secs(300);
/// The bound a receiver must meet after its sender is killed.
const DEATH_SHOWS: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Messages: checksummed, their sizes and contents following from their
// sender and number, so the receiver knows what each must be.

/// A message of the load: `payload` is a slice of [`pool`] chosen by
/// `(sender, seq)`, and `check` a checksum of all three.
#[derive(Serialize, Deserialize)]
struct Msg {
    sender: u32,
    seq: u64,
    payload: ByteBuf,
    check: [u8; 8],
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key(sender: u32, seq: u64) -> u64 {
    mix(u64::from(sender) << 40 ^ seq)
}

const POOL_LEN: usize = 512 << 10;

/// Bytes every payload is cut from, the same in every process.
fn pool() -> &'static [u8] {
    static POOL: OnceLock<Vec<u8>> = OnceLock::new();
    POOL.get_or_init(|| {
        (0..POOL_LEN as u64 / 8)
            .flat_map(|i| mix(i ^ 0x5eed).to_le_bytes())
            .collect()
    })
}

/// The payload of message `seq` of `sender`, `len` bytes long.
fn payload(sender: u32, seq: u64, len: usize) -> &'static [u8] {
    let at = (key(sender, seq) >> 7) as usize % (POOL_LEN - len + 1);
    &pool()[at..at + len]
}

/// A checksum of a message's sender, number and payload (a word at a time:
/// the tests run in debug builds).
fn checksum(sender: u32, seq: u64, payload: &[u8]) -> [u8; 8] {
    let mut h = key(sender, seq) ^ payload.len() as u64;
    let mut words = payload.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap()))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.to_le_bytes()
}

/// A message's size.
enum Size {
    /// A payload of this many bytes.
    Payload(usize),
    /// A payload that makes the whole message, as it travels, this many bytes.
    Encoded(usize),
}

/// The size of message `seq` of `sender`: mostly 1 to 128 bytes, one in
/// sixteen up to 1 KiB; in each thousand, one exactly [`RING_RECORD_MAX`]
/// bytes (the ring's largest) and one a byte more (the ring's smallest
/// refusal), and in every twenty thousand one of 256 KiB (a region).
fn size(sender: u32, seq: u64) -> Size {
    let h = key(sender, seq);
    match seq % 1000 {
        7 => Size::Encoded(RING_RECORD_MAX),
        57 => Size::Encoded(RING_RECORD_MAX + 1),
        _ if seq % 20_000 == 10_007 => Size::Payload(256 << 10),
        _ if h.is_multiple_of(16) => Size::Payload(129 + (h >> 8) as usize % 896),
        _ => Size::Payload(1 + (h >> 8) as usize % 128),
    }
}

/// The length of the payload of message `seq` of `sender`.
fn payload_len(sender: u32, seq: u64) -> usize {
    match size(sender, seq) {
        Size::Payload(n) => n,
        Size::Encoded(total) => {
            // The message with an empty payload, whose length takes one byte
            // of varint; a payload of 128 to 16383 bytes takes two.
            let empty = Msg {
                sender,
                seq,
                payload: ByteBuf::new(),
                check: [0; 8],
            };
            total - postcard::to_stdvec(&empty).unwrap().len() - 1
        }
    }
}

/// Message `seq` of `sender`.
fn message(sender: u32, seq: u64) -> Msg {
    let data = payload(sender, seq, payload_len(sender, seq));
    let msg = Msg {
        sender,
        seq,
        payload: ByteBuf::from(data),
        check: checksum(sender, seq, data),
    };
    if let Size::Encoded(total) = size(sender, seq) {
        debug_assert_eq!(postcard::to_stdvec(&msg).unwrap().len(), total);
    }
    msg
}

fn send_all(tx: &IpcSender<Msg>, sender: u32, from: u64, to: u64) {
    for seq in from..to {
        tx.send(message(sender, seq)).unwrap();
    }
}

/// Checks messages as they come: each its sender's next, intact.
struct Checker {
    next: Vec<u64>,
    received: u64,
}

impl Checker {
    fn new(senders: u32) -> Checker {
        Checker {
            next: vec![0; senders as usize],
            received: 0,
        }
    }

    fn check(&mut self, m: &Msg) {
        let (sender, seq) = (m.sender, m.seq);
        let next = self
            .next
            .get_mut(sender as usize)
            .unwrap_or_else(|| panic!("a message from unknown sender {sender}"));
        assert_eq!(
            seq, *next,
            "sender {sender}: message {seq} where {next} was due"
        );
        assert_eq!(
            m.check,
            checksum(sender, seq, &m.payload),
            "sender {sender}, message {seq}: bad checksum ({} bytes)",
            m.payload.len()
        );
        let len = payload_len(sender, seq);
        assert!(
            m.payload[..] == *payload(sender, seq, len),
            "sender {sender}, message {seq}: {} bytes, {len} expected, or not intact",
            m.payload.len()
        );
        *next += 1;
        self.received += 1;
    }

    /// Every sender sent `counts[sender]` messages and all of them came.
    fn done(&self, counts: &[u64]) {
        assert_eq!(self.next, counts, "messages received from each sender");
    }
}

// ---------------------------------------------------------------------------
// The ring's memfd, and the two runs of each test.

/// Whether this process holds a descriptor of a sender's ring: a memfd
/// named "courier-ring" (its `/proc/self/fd` link reads
/// `/memfd:courier-ring (deleted)`).
fn ring_in_use() -> bool {
    common::ring_fds() > 0
}

/// After traffic from live senders: with the ring on, this process (the
/// receiver's) holds a ring; with it off, none.
fn check_ring(ring: bool, when: &str) {
    if !ring {
        assert!(!ring_in_use(), "{when}: a ring's memfd with the ring off");
    } else {
        assert!(ring_in_use(), "{when}: no ring's memfd with the ring on");
    }
}

/// Runs `body(ring)` with `Config::ring` set to `ring`, under the serial
/// lock and descriptor check, and a watchdog.
fn run(name: &'static str, ring: bool, body: fn(bool)) {
    let _check = fd_check();
    with_watchdog(name, LIMIT, move || {
        with_config(|c| c.ring = ring, || body(ring));
    });
}

macro_rules! both_ways {
    ($($name:ident,)*) => {
        mod ring_on {
            $(
                #[test]
                fn $name() {
                    super::run(stringify!($name), true, super::$name);
                }
            )*
        }
        mod ring_off {
            $(
                #[test]
                fn $name() {
                    super::run(stringify!($name), false, super::$name);
                }
            )*
        }
    };
}

both_ways! {
    load_from_threads_and_processes,
    descriptors_keep_their_place_across_processes,
    descriptors_keep_their_place_in_one_process,
    a_killed_sender_disconnects_a_parked_receiver,
    a_killed_senders_unread_messages_all_arrive,
    a_receiver_set_gets_everything_then_closes,
    timed_receives,
    a_fiber_receives_from_a_child,
}

// ---------------------------------------------------------------------------
// Child processes.

/// What the parent hands a child, once it has connected.
#[derive(Serialize, Deserialize)]
enum Ends {
    /// A sender of the load's messages.
    Plain(IpcSender<Msg>),
    /// A sender of messages with descriptors, and where their channels reply.
    Mixed(IpcSender<Mixed>, IpcSender<u64>),
}

/// A child process playing a role.
struct Kid {
    child: Child,
    out: BufReader<ChildStdout>,
    /// Where the parent sends the child its ends; dropping it tells a child
    /// that waits for it to finish.
    ctl: Option<IpcSender<Ends>>,
}

impl Kid {
    /// Starts a child in `role` (sender `id`, `count` messages) with the ring
    /// on or off, and hands it `ends`.
    fn spawn(role: &str, ring: bool, id: u32, count: u64, ends: Ends) -> Kid {
        let (server, name) = IpcOneShotServer::<IpcSender<Ends>>::new().unwrap();
        let (id, count) = (id.to_string(), count.to_string());
        let mut child = spawn_child_entry(&[
            (ROLE, role),
            (SERVER, &name),
            (ID, &id),
            (COUNT, &count),
            ("COURIER_IPC_RING", if ring { "1" } else { "0" }),
        ]);
        let out = BufReader::new(child.stdout.take().unwrap());
        let (_bootstrap, ctl) = server.accept_timeout(PATIENCE).expect("the child connects");
        ctl.send(ends).unwrap();
        Kid {
            child,
            out,
            ctl: Some(ctl),
        }
    }

    /// Waits until the child prints `line`.
    fn wait_for(&mut self, line: &str) {
        let mut got = String::new();
        loop {
            got.clear();
            let n = self.out.read_line(&mut got).unwrap();
            assert_ne!(n, 0, "the child ended before it said {line:?}");
            if got.trim() == line {
                return;
            }
        }
    }

    /// Kills the child with `SIGKILL` and reaps it; returns when it died.
    fn kill(mut self) -> Instant {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        Instant::now()
    }

    /// Lets the child finish and checks that it succeeded.
    fn finish(mut self) {
        drop(self.ctl.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child: {status}");
    }
}

/// A child left behind by a failed test (one that parks, or waits for its
/// `ctl`) is killed, not left to hold the harness's output open.
impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let server = std::env::var(SERVER).expect("server name");
    let id: u32 = std::env::var(ID).unwrap().parse().unwrap();
    let count: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    let (ctl_tx, ctl) = ipc::channel::<Ends>().unwrap();
    IpcSender::<IpcSender<Ends>>::connect(server)
        .unwrap()
        .send(ctl_tx)
        .unwrap();
    match (role.as_str(), ctl.recv().unwrap()) {
        ("send", Ends::Plain(tx)) => send_all(&tx, id, 0, count),
        ("park", Ends::Plain(tx)) => {
            send_all(&tx, id, 0, count);
            println!("sent");
            // Until killed (or, orphaned by a parent that died, a while).
            std::thread::sleep(PATIENCE * 2);
            drop(tx);
            std::process::exit(1);
        }
        ("paced", Ends::Plain(tx)) => {
            paced(&tx, id, count);
            // Until the parent has timed its empty receive.
            let _ = ctl.recv();
        }
        ("mixed", Ends::Mixed(tx, reply)) => send_mixed(&tx, &reply, count),
        (role, _) => panic!("no role {role} with these ends"),
    }
}

// ---------------------------------------------------------------------------
// 1. Load: eight threads and four processes, one receiver.

/// Messages of the load, all senders together: 1,000,000 (about 5 s a run
/// in the debug build on 2 cores, through the socket), or
/// `COURIER_RING_MESSAGES`.
fn load_total() -> u64 {
    std::env::var("COURIER_RING_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn load_from_threads_and_processes(ring: bool) {
    const THREADS: u32 = 8;
    const PROCESSES: u32 = 4;
    let senders = THREADS + PROCESSES;
    let total = load_total();
    let counts: Vec<u64> = (0..u64::from(senders))
        .map(|i| total / u64::from(senders) + u64::from(i < total % u64::from(senders)))
        .collect();
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|id| {
            let (tx, count) = (tx.clone(), counts[id as usize]);
            std::thread::spawn(move || send_all(&tx, id, 0, count))
        })
        .collect();
    let kids: Vec<Kid> = (THREADS..senders)
        .map(|id| {
            let count = counts[id as usize];
            Kid::spawn("send", ring, id, count, Ends::Plain(tx.clone()))
        })
        .collect();
    drop(tx);
    let mut checker = Checker::new(senders);
    while checker.received < total {
        checker.check(&rx.recv().unwrap());
        if checker.received == total / 2 {
            check_ring(ring, "half way through the load");
        }
    }
    checker.done(&counts);
    for t in threads {
        t.join().unwrap();
    }
    for kid in kids {
        kid.finish();
    }
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

// ---------------------------------------------------------------------------
// 2. Messages with and without descriptors, from one sender.

/// A message that may carry a descriptor (a memfd holding `seq`) and a
/// channel (where the receiver sends `seq` back).
#[derive(Serialize, Deserialize)]
struct Mixed {
    seq: u64,
    payload: ByteBuf,
    file: Option<IpcFd>,
    reply: Option<IpcSender<u64>>,
}

/// Messages of the descriptor tests.
const MIXED: u64 = 600;
/// The sender id of [`Mixed`] payloads.
const MIXED_SENDER: u32 = 99;

/// The payload length of mixed message `seq`: every eleventh past
/// [`RING_RECORD_MAX`], every fiftieth 100 KiB, every thirteenth just within
/// it, the others small.
fn mixed_len(seq: u64) -> usize {
    if seq % 50 == 25 {
        100 << 10
    } else if seq % 11 == 5 {
        RING_RECORD_MAX + 64
    } else if seq.is_multiple_of(13) {
        RING_RECORD_MAX - 64
    } else {
        1 + seq as usize % 200
    }
}

/// Mixed message `seq`: every third carries a file, every seventh a channel.
fn mixed(seq: u64, reply: &IpcSender<u64>) -> Mixed {
    let file = (seq % 3 == 2).then(|| {
        let fd = fs::memfd_create("ipc-ring-test", MemfdFlags::CLOEXEC).unwrap();
        rustix::io::pwrite(&fd, &seq.to_le_bytes(), 0).unwrap();
        IpcFd::from(fd)
    });
    Mixed {
        seq,
        payload: ByteBuf::from(payload(MIXED_SENDER, seq, mixed_len(seq))),
        file,
        reply: (seq % 7 == 3).then(|| reply.clone()),
    }
}

fn send_mixed(tx: &IpcSender<Mixed>, reply: &IpcSender<u64>, count: u64) {
    for seq in 0..count {
        tx.send(mixed(seq, reply)).unwrap();
    }
}

/// Receives the mixed messages `0..count` in order, each whole, its file
/// readable and its channel working.
fn receive_mixed(rx: &IpcReceiver<Mixed>, replies: &IpcReceiver<u64>, count: u64, ring: bool) {
    for seq in 0..count {
        let m = rx.recv().unwrap();
        assert_eq!(m.seq, seq, "message {} where {seq} was due", m.seq);
        assert!(
            m.payload[..] == *payload(MIXED_SENDER, seq, mixed_len(seq)),
            "message {seq}: {} bytes, {} expected, or not intact",
            m.payload.len(),
            mixed_len(seq)
        );
        assert_eq!(m.file.is_some(), seq % 3 == 2, "message {seq}'s file");
        if let Some(file) = m.file {
            let mut bytes = Vec::new();
            file.into::<File>().read_to_end(&mut bytes).unwrap();
            assert_eq!(bytes, seq.to_le_bytes(), "message {seq}'s file's contents");
        }
        assert_eq!(m.reply.is_some(), seq % 7 == 3, "message {seq}'s channel");
        if let Some(reply) = m.reply {
            reply.send(seq).unwrap();
            assert_eq!(replies.recv().unwrap(), seq);
        }
        if seq == count / 2 {
            check_ring(ring, "half way through the mixed messages");
        }
    }
}

fn descriptors_keep_their_place_across_processes(ring: bool) {
    let (tx, rx) = ipc::channel::<Mixed>().unwrap();
    let (reply, replies) = ipc::channel::<u64>().unwrap();
    let kid = Kid::spawn("mixed", ring, 0, MIXED, Ends::Mixed(tx, reply));
    receive_mixed(&rx, &replies, MIXED, ring);
    kid.finish();
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

fn descriptors_keep_their_place_in_one_process(ring: bool) {
    let (tx, rx) = ipc::channel::<Mixed>().unwrap();
    let (reply, replies) = ipc::channel::<u64>().unwrap();
    let sender = std::thread::spawn(move || send_mixed(&tx, &reply, MIXED));
    receive_mixed(&rx, &replies, MIXED, ring);
    sender.join().unwrap();
    assert!(matches!(rx.recv(), Err(IpcError::Disconnected)));
}

// ---------------------------------------------------------------------------
// 3. A sender killed with SIGKILL.

fn a_killed_sender_disconnects_a_parked_receiver(ring: bool) {
    const COUNT: u64 = 2000;
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let kid = Kid::spawn("park", ring, 0, COUNT, Ends::Plain(tx));
    let (drained_tx, drained) = mpsc::channel();
    let (result_tx, result) = mpsc::channel();
    let receiver = std::thread::spawn(move || {
        let mut checker = Checker::new(1);
        while checker.received < COUNT {
            checker.check(&rx.recv().unwrap());
        }
        drained_tx.send(()).unwrap();
        // Parks here: the child sends no more.
        let last = rx.recv().map(|m| m.seq);
        result_tx.send((last, Instant::now())).unwrap();
    });
    drained.recv_timeout(PATIENCE).expect("the messages come");
    check_ring(ring, "before the kill");
    // Time for the receiver to spin, give up and sleep on its socket.
    std::thread::sleep(Duration::from_millis(200));
    let killed = kid.kill();
    let (last, at) = result.recv_timeout(PATIENCE).expect("the receive returns");
    assert!(
        matches!(last, Err(IpcError::Disconnected)),
        "after the kill: {last:?}"
    );
    let took = at.saturating_duration_since(killed);
    assert!(took < DEATH_SHOWS, "Disconnected {took:?} after the kill");
    receiver.join().unwrap();
}

fn a_killed_senders_unread_messages_all_arrive(ring: bool) {
    // Few enough that the socket holds them all with the ring off (the
    // first 100 include one of exactly RING_RECORD_MAX bytes and one a byte
    // over, which leaves the ring).
    const COUNT: u64 = 100;
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let mut kid = Kid::spawn("park", ring, 0, COUNT, Ends::Plain(tx));
    kid.wait_for("sent");
    let killed = kid.kill();
    let mut checker = Checker::new(1);
    while checker.received < COUNT {
        let m = rx
            .recv()
            .unwrap_or_else(|e| panic!("after {} of {COUNT} messages: {e:?}", checker.received));
        checker.check(&m);
        if checker.received == COUNT / 2 {
            check_ring(ring, "reading a dead sender's messages");
        }
    }
    match rx.recv() {
        Err(IpcError::Disconnected) => {}
        other => panic!("after the last message: {:?}", other.map(|m| m.seq)),
    }
    assert!(killed.elapsed() < PATIENCE);
}

// ---------------------------------------------------------------------------
// 4. Receiver sets, timed receives, fibers.

fn a_receiver_set_gets_everything_then_closes(ring: bool) {
    const EACH: u64 = 3000;
    let mut set = IpcReceiverSet::new().unwrap();
    // Senders 0 and 1 are threads here, 2 and 3 children; each its channel.
    let mut sender_of = std::collections::HashMap::new();
    let mut threads = Vec::new();
    let mut kids = Vec::new();
    for sender in 0..4u32 {
        let (tx, rx) = ipc::channel::<Msg>().unwrap();
        sender_of.insert(set.add(rx).unwrap(), sender);
        if sender < 2 {
            threads.push(std::thread::spawn(move || send_all(&tx, sender, 0, EACH)));
        } else {
            kids.push(Kid::spawn("send", ring, sender, EACH, Ends::Plain(tx)));
        }
    }
    let mut checker = Checker::new(4);
    let mut open = sender_of.clone();
    while !open.is_empty() {
        for result in set.try_select_timeout(PATIENCE).unwrap() {
            match result {
                IpcSelectionResult::MessageReceived(id, message) => {
                    let m = message.to::<Msg>().unwrap();
                    assert!(open.contains_key(&id), "a message on {id} after it closed");
                    assert_eq!(m.sender, sender_of[&id], "a message on another's channel");
                    checker.check(&m);
                    if checker.received == 2 * EACH {
                        check_ring(ring, "half way through the set's messages");
                    }
                }
                IpcSelectionResult::ChannelClosed(id) => {
                    let sender = open.remove(&id).expect("closed twice, or unknown");
                    assert_eq!(
                        checker.next[sender as usize], EACH,
                        "channel {id} closed before its last message"
                    );
                }
            }
        }
    }
    checker.done(&[EACH; 4]);
    for t in threads {
        t.join().unwrap();
    }
    for kid in kids {
        kid.finish();
    }
}

/// Sends `count` messages, then, 50 ms later, one more.
fn paced(tx: &IpcSender<Msg>, sender: u32, count: u64) {
    send_all(tx, sender, 0, count);
    std::thread::sleep(Duration::from_millis(50));
    send_all(tx, sender, count, count + 1);
}

/// Receives [`paced`]'s messages: the late one within a 1 s timeout, then
/// nothing in 20 ms (the sender still there); then `finish` lets the sender
/// go, and the timed receive reports it gone.
fn receive_paced(rx: &IpcReceiver<Msg>, count: u64, ring: bool, finish: impl FnOnce()) {
    let mut checker = Checker::new(1);
    while checker.received < count {
        checker.check(&rx.try_recv_timeout(PATIENCE).unwrap());
    }
    let start = Instant::now();
    checker.check(&rx.try_recv_timeout(Duration::from_secs(1)).unwrap());
    assert!(start.elapsed() < Duration::from_secs(1));
    check_ring(ring, "after the paced messages");
    let start = Instant::now();
    let wait = Duration::from_millis(20);
    match rx.try_recv_timeout(wait) {
        Err(TryRecvError::Empty) => {}
        other => panic!("expected Empty, got {:?}", other.map(|m| m.seq)),
    }
    let waited = start.elapsed();
    assert!(waited >= wait, "returned after {waited:?}");
    assert!(waited < Duration::from_secs(1), "returned after {waited:?}");
    finish();
    match rx.try_recv_timeout(PATIENCE) {
        Err(TryRecvError::IpcError(IpcError::Disconnected)) => {}
        other => panic!("expected Disconnected, got {:?}", other.map(|m| m.seq)),
    }
}

fn timed_receives(ring: bool) {
    const COUNT: u64 = 3;
    // From a child process.
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let kid = Kid::spawn("paced", ring, 0, COUNT, Ends::Plain(tx));
    receive_paced(&rx, COUNT, ring, || kid.finish());
    // From a thread of this one.
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let (go_tx, go) = mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        paced(&tx, 0, COUNT);
        let _ = go.recv();
    });
    receive_paced(&rx, COUNT, ring, move || {
        drop(go_tx);
        sender.join().unwrap();
    });
}

fn a_fiber_receives_from_a_child(ring: bool) {
    const COUNT: u64 = 5000;
    let rt = fiber::Runtime::builder().workers(1).build().unwrap();
    let (tx, rx) = ipc::channel::<Msg>().unwrap();
    let kid = Kid::spawn("send", ring, 0, COUNT, Ends::Plain(tx));
    rt.block_on(move || {
        let receiver = fiber::spawn(move || {
            let mut checker = Checker::new(1);
            while checker.received < COUNT {
                checker.check(&rx.recv().unwrap());
                if checker.received == COUNT / 2 {
                    check_ring(ring, "half way through a fiber's messages");
                }
            }
            checker.done(&[COUNT]);
            rx
        });
        let rx = receiver.join().unwrap();
        // The fiber waits again (parked by the time the child is reaped, or
        // soon after), and its sender goes.
        let last = fiber::spawn(move || rx.recv().map(|m| m.seq));
        fiber::sleep(Duration::from_millis(50));
        kid.finish();
        let last = last.join().unwrap();
        assert!(matches!(last, Err(IpcError::Disconnected)), "{last:?}");
    });
}
