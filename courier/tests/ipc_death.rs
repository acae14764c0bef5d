//! A peer killed (`SIGKILL`) at every stage of a message: the survivor gets
//! `Disconnected` (or, for a set, `ChannelClosed`) within a second of the
//! kill, whatever it was waiting for, and no descriptor leaks.
//!
//! The test binary re-executes itself (`/proc/self/exe`) to run a child
//! role, as `ipc_xprocess.rs` does: the child runs only the `child_entry`
//! test, which reads its role from `COURIER_DEATH_ROLE`, connects to the
//! parent's one-shot server named in `COURIER_DEATH_SERVER`, gets the
//! message it was to send half way out, prints `ready`, and waits to be
//! killed. No `fork` of the threaded test harness is involved.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use courier::ipc::{
    self, IpcBytesReceiver, IpcBytesSender, IpcError, IpcOneShotServer, IpcReceiver,
    IpcReceiverSet, IpcSelectionResult, IpcSender,
};
use rustix::fs::{self, MemfdFlags, SealFlags};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

mod common;
mod watchdog;
use common::fd_check;
use common::wire::{fd_packet, header, raw_send};
use watchdog::with_watchdog;

const ROLE: &str = "COURIER_DEATH_ROLE";
const SERVER: &str = "COURIER_DEATH_SERVER";
/// The bound the survivor must meet after the kill.
const DEATH_SHOWS: Duration = Duration::from_secs(1);
/// How long a child may take to start and connect (a loaded CI machine).
const PATIENCE: Duration = Duration::from_secs(60);
/// The watchdog's limit for one test.
const LIMIT: Duration = Duration::from_secs(120);

/// Where a message's payload goes after its 40-byte header.
const CARRIER: u128 = 3;
/// A region's state word: a payload is in flight.
const BUSY: u32 = 1;
/// Bytes before a region's payload.
const REGION_HEADER: usize = 64;

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let server = std::env::var(SERVER).expect("server name");
    match role.as_str() {
        "before-connect" => {}
        "connected" => {
            // Connected, the bootstrap message never sent.
            let fd = raw_connect(&server);
            ready();
            park_forever(fd);
        }
        "waiting-for-fds" => {
            let tx = hand_receiver(&server);
            let mut packet = header(0, 1, 5, 0, 0x5eed);
            packet.extend_from_slice(b"first");
            raw_send(&owned(&tx), &packet, &[]);
            ready();
            park_forever(tx);
        }
        "mid-fragments" => {
            let tx = hand_receiver(&server);
            let (carrier_rx, carrier_tx) = common::wire::seqpacket_pair();
            let total = 1u64 << 20;
            let mut packet = header(1, 1, total, CARRIER, 0x7a9);
            packet.extend_from_slice(&[1; 4096]);
            raw_send(&owned(&tx), &packet, &[]);
            raw_send(&owned(&tx), &fd_packet(1, 0x7a9), &[carrier_rx.as_fd()]);
            drop(carrier_rx);
            for _ in 0..4 {
                raw_send(&carrier_tx, &[2; 4096], &[]);
            }
            ready();
            park_forever(carrier_tx);
        }
        "mid-stream" => {
            let tx = hand_receiver(&server);
            let total = 8usize << 20;
            let region = fs::memfd_create(
                "courier-death",
                MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
            )
            .unwrap();
            fs::ftruncate(&region, (REGION_HEADER + total) as u64).unwrap();
            // BUSY, a quarter filled, and the rest never comes.
            let mut words = [0u8; 32];
            words[0..4].copy_from_slice(&BUSY.to_le_bytes());
            words[16..24].copy_from_slice(&((total / 4) as u64).to_le_bytes());
            rustix::io::pwrite(&region, &words, 0).unwrap();
            rustix::io::pwrite(&region, &vec![3; total / 4], REGION_HEADER as u64).unwrap();
            fs::fcntl_add_seals(&region, SealFlags::SHRINK | SealFlags::GROW).unwrap();
            let mut packet = header(2, 1, total as u64, CARRIER, 0x57e);
            packet[7] = 1; // streamed
            raw_send(&owned(&tx), &packet, &[]);
            raw_send(&owned(&tx), &fd_packet(1, 0x57e), &[region.as_fd()]);
            ready();
            park_forever(region);
        }
        "kept-region" => {
            // Medium messages through a real sender: the parent comes to
            // hold this process's region, and the last messages name it.
            let tx = hand_receiver(&server);
            for i in 0..16u8 {
                tx.send(&vec![i; 64 << 10]).unwrap();
            }
            ready();
            park_forever(tx);
        }
        "not-reading" => {
            // Hands over a sender to a receiver this process never reads.
            let (tx, rx) = ipc::bytes_channel().unwrap();
            IpcSender::<IpcBytesSender>::connect(server)
                .unwrap()
                .send(tx)
                .unwrap();
            ready();
            park_forever(rx);
        }
        other => panic!("unknown role {other}"),
    }
    ready();
    park_forever(());
}

/// Tells the parent that the child is where it should be killed.
fn ready() {
    println!("ready");
}

fn park_forever<T>(keep: T) -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        let _ = &keep;
    }
}

/// A duplicate of a channel end's socket, for writing raw packets into it.
fn owned(end: &impl AsFd) -> OwnedFd {
    end.as_fd().try_clone_to_owned().unwrap()
}

/// Connects to the server named `name` and sends nothing.
fn raw_connect(name: &str) -> OwnedFd {
    use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    net::connect(&fd, &SocketAddrUnix::new(name).unwrap()).unwrap();
    fd
}

/// Sends the parent the receiving end of a fresh bytes channel; returns the
/// sending end, the only one.
fn hand_receiver(server: &str) -> IpcBytesSender {
    let (tx, rx) = ipc::bytes_channel().unwrap();
    IpcSender::<IpcBytesReceiver>::connect(server.to_owned())
        .unwrap()
        .send(rx)
        .unwrap();
    tx
}

/// A child in a role, and its stdout.
struct Peer {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    /// Starts a child in `role`, serving the one-shot server `name`.
    fn spawn(role: &str, name: String) -> Peer {
        let mut child = common::spawn_child_entry(&[(ROLE, role), (SERVER, &name)]);
        let out = BufReader::new(child.stdout.take().unwrap());
        Peer { child, out }
    }

    /// Waits until the child says it is ready to be killed.
    fn wait_ready(&mut self) {
        let mut line = String::new();
        loop {
            line.clear();
            assert_ne!(
                self.out.read_line(&mut line).unwrap(),
                0,
                "the child ended before it was ready"
            );
            if line.trim() == "ready" {
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
}

/// A child in `role` that sends a receiver to this process: the child and
/// the receiver (of bytes, or of byte strings: the same on the wire).
fn peer_with_receiver<R>(role: &str) -> (Peer, R)
where
    R: for<'de> Deserialize<'de> + Serialize,
{
    let (server, name) = IpcOneShotServer::<R>::new().unwrap();
    let peer = Peer::spawn(role, name);
    let (_bootstrap, rx) = server.accept_timeout(PATIENCE).expect("child connects");
    (peer, rx)
}

/// Runs `recv` on a thread of its own, blocked by the time the peer is
/// killed; every result until `Disconnected` (typed errors for the message
/// cut short may come first) must come within [`DEATH_SHOWS`] of the kill.
fn disconnected_after_kill(
    peer: Peer,
    mut recv: impl FnMut() -> Result<Vec<u8>, IpcError> + Send + 'static,
) {
    let (tx, results) = mpsc::channel();
    let receiver = std::thread::spawn(move || loop {
        let result = recv();
        let end = matches!(result, Err(IpcError::Disconnected));
        tx.send((result.map(|m| m.len()), Instant::now())).unwrap();
        if end {
            return;
        }
    });
    // Let the receiver block (nothing below depends on it having done so).
    std::thread::sleep(Duration::from_millis(100));
    let killed = peer.kill();
    loop {
        let (result, at) = results
            .recv_timeout(PATIENCE)
            .expect("the receiver returns");
        if let Err(IpcError::Disconnected) = result {
            let took = at.saturating_duration_since(killed);
            assert!(took < DEATH_SHOWS, "Disconnected {took:?} after the kill");
            break;
        }
    }
    receiver.join().unwrap();
}

#[test]
fn killed_before_connecting() {
    with_watchdog("killed_before_connecting", LIMIT, || {
        let _check = fd_check();
        let (server, name) = IpcOneShotServer::<IpcBytesReceiver>::new().unwrap();
        let mut peer = Peer::spawn("before-connect", name);
        peer.wait_ready();
        let killed = peer.kill();
        // Nobody will connect: the server gives up at its timeout.
        match server.accept_timeout(Duration::from_millis(200)) {
            Err(IpcError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
            Err(e) => panic!("expected a timeout, got {e:?}"),
            Ok(_) => panic!("a dead child connected"),
        }
        assert!(killed.elapsed() < DEATH_SHOWS);
    });
}

#[test]
fn killed_connected_before_its_first_message() {
    with_watchdog("killed_connected_before_its_first_message", LIMIT, || {
        let _check = fd_check();
        let (server, name) = IpcOneShotServer::<IpcBytesReceiver>::new().unwrap();
        let mut peer = Peer::spawn("connected", name);
        peer.wait_ready();
        let killed = peer.kill();
        match server.accept_timeout(PATIENCE) {
            Err(IpcError::Disconnected) => {}
            Err(e) => panic!("expected Disconnected, got {e:?}"),
            Ok(_) => panic!("a message from nowhere"),
        }
        assert!(killed.elapsed() < DEATH_SHOWS);
    });
}

#[test]
fn killed_between_a_data_packet_and_its_descriptors() {
    with_watchdog(
        "killed_between_a_data_packet_and_its_descriptors",
        LIMIT,
        || {
            let _check = fd_check();
            let (mut peer, rx) = peer_with_receiver::<IpcBytesReceiver>("waiting-for-fds");
            peer.wait_ready();
            disconnected_after_kill(peer, move || rx.recv());
        },
    );
}

#[test]
fn killed_mid_fragments() {
    with_watchdog("killed_mid_fragments", LIMIT, || {
        let _check = fd_check();
        let (mut peer, rx) = peer_with_receiver::<IpcBytesReceiver>("mid-fragments");
        peer.wait_ready();
        disconnected_after_kill(peer, move || rx.recv());
    });
}

#[test]
fn killed_mid_stream() {
    with_watchdog("killed_mid_stream", LIMIT, || {
        let _check = fd_check();
        let (mut peer, rx) = peer_with_receiver::<IpcBytesReceiver>("mid-stream");
        peer.wait_ready();
        disconnected_after_kill(peer, move || rx.recv());
    });
}

#[test]
fn killed_while_its_region_is_kept() {
    with_watchdog("killed_while_its_region_is_kept", LIMIT, || {
        let _check = fd_check();
        let (mut peer, rx) = peer_with_receiver::<IpcBytesReceiver>("kept-region");
        for i in 0..16u8 {
            assert_eq!(rx.recv().unwrap(), vec![i; 64 << 10]);
        }
        peer.wait_ready();
        disconnected_after_kill(peer, move || rx.recv());
        ipc::IpcSharedMemory::unmap_dropped();
    });
}

#[test]
fn killed_while_blocking_a_send() {
    with_watchdog("killed_while_blocking_a_send", LIMIT, || {
        let _check = fd_check();
        let (server, name) = IpcOneShotServer::<IpcBytesSender>::new().unwrap();
        let mut peer = Peer::spawn("not-reading", name);
        let (_bootstrap, tx) = server.accept_timeout(PATIENCE).expect("child connects");
        peer.wait_ready();
        let (done, result) = mpsc::channel();
        let sender = std::thread::spawn(move || {
            let chunk = vec![9u8; 1024];
            let sent = loop {
                if let Err(e) = tx.send(&chunk) {
                    break e;
                }
            };
            done.send((sent.kind(), Instant::now())).unwrap();
        });
        // The socket buffer holds a few hundred of these: the sender blocks.
        std::thread::sleep(Duration::from_millis(300));
        let killed = peer.kill();
        let (kind, at) = result.recv_timeout(PATIENCE).expect("the send returns");
        assert_eq!(kind, std::io::ErrorKind::BrokenPipe);
        let took = at.saturating_duration_since(killed);
        assert!(took < DEATH_SHOWS, "send failed {took:?} after the kill");
        sender.join().unwrap();
    });
}

#[test]
fn killed_inside_a_receiver_set() {
    with_watchdog("killed_inside_a_receiver_set", LIMIT, || {
        let _check = fd_check();
        // One child stalls mid-fragments, one mid-stream, one between a data
        // packet and its descriptors; one channel's sender stays here.
        let mut set = IpcReceiverSet::new().unwrap();
        let mut peers = Vec::new();
        for role in ["mid-fragments", "mid-stream", "waiting-for-fds"] {
            let (mut peer, rx) = peer_with_receiver::<IpcReceiver<ByteBuf>>(role);
            peer.wait_ready();
            set.add(rx).unwrap();
            peers.push(peer);
        }
        let (_kept, rx) = ipc::channel::<ByteBuf>().unwrap();
        set.add(rx).unwrap();
        let (done, results) = mpsc::channel();
        let selector = std::thread::spawn(move || {
            let mut closed = 0;
            while closed < 3 {
                for result in set.select().unwrap_or_default() {
                    if let IpcSelectionResult::ChannelClosed(_) = result {
                        closed += 1;
                    }
                }
            }
            done.send(Instant::now()).unwrap();
            set
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut killed = Instant::now();
        for peer in peers {
            killed = peer.kill();
        }
        let at = results.recv_timeout(PATIENCE).expect("the set closes");
        let took = at.saturating_duration_since(killed);
        assert!(took < DEATH_SHOWS, "closed {took:?} after the kills");
        let set = selector.join().unwrap();
        drop(set);
    });
}
