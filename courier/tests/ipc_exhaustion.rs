//! Resources running out: a receiver that may open no more descriptors, and
//! a socket whose send buffer is too small for the packets courier would
//! send.
//!
//! The descriptor limit is lowered in a child process (the test binary
//! re-executed, as in `ipc_xprocess.rs`), never in the test harness.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use courier::ipc::{self, IpcBytesReceiver, IpcBytesSender, IpcError, IpcReceiver, IpcSender};
use rustix::net::sockopt;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

mod common;
mod watchdog;
use common::wire::{seqpacket_pair, wire_error};
use common::{fd_check, open_fds};
use watchdog::with_watchdog;

const ROLE: &str = "COURIER_EXHAUSTION_ROLE";
const LIMIT: Duration = Duration::from_secs(120);

/// The highest descriptor number this process has open.
fn highest_fd() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap()
}

/// In the child: receiving a message of 8 channel ends when only 2 more
/// descriptors may be opened fails that message alone, with a typed error
/// and nothing leaked; the channel, and another channel, go on.
fn nofile_child() {
    let (tx, rx) = ipc::channel::<Vec<IpcBytesSender>>().unwrap();
    let (other_tx, other_rx) = ipc::bytes_channel().unwrap();
    let ends: Vec<(IpcBytesSender, IpcBytesReceiver)> =
        (0..8).map(|_| ipc::bytes_channel().unwrap()).collect();
    let senders: Vec<IpcBytesSender> = ends
        .iter()
        .map(|(s, _)| IpcBytesSender::try_from(s.as_fd().try_clone_to_owned().unwrap()).unwrap())
        .collect();
    // Warm the receive path (its scratch area) before the limit.
    other_tx.send(b"warm").unwrap();
    assert_eq!(other_rx.recv().unwrap(), b"warm");
    tx.send(senders).unwrap();

    // Fill every hole below the highest descriptor, so that exactly two
    // more can be opened under the limit.
    let top = highest_fd();
    let mut placeholders = Vec::new();
    let highest = loop {
        let fd = rustix::io::dup(std::io::stderr().as_fd()).unwrap();
        let n = fd.as_raw_fd() as u64;
        placeholders.push(fd);
        if n >= top {
            break n;
        }
    };
    let before = open_fds();
    let limit = highest + 1 + 2;
    let old = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: old.maximum,
        },
    )
    .unwrap();
    match rx.recv() {
        Err(IpcError::Io(e)) => {
            let fault = wire_error(&e).unwrap_or_else(|| panic!("not a WireError: {e}"));
            eprintln!("descriptors past the limit: {fault:?}");
        }
        Err(IpcError::SerializationError(e)) => {
            assert!(e.wire_error().is_some(), "untyped: {e}")
        }
        Err(e) => panic!("expected a typed error, got {e:?}"),
        Ok(got) => panic!("received {} ends past the descriptor limit", got.len()),
    }
    assert_eq!(open_fds(), before, "descriptors leaked");
    // Other channels, and this one, go on.
    other_tx.send(b"other").unwrap();
    assert_eq!(other_rx.recv().unwrap(), b"other");
    tx.send(Vec::new()).unwrap();
    assert!(rx.recv().unwrap().is_empty());
    setrlimit(Resource::Nofile, old).unwrap();
    // And with room again, ends arrive.
    let (a, _a) = ipc::bytes_channel().unwrap();
    tx.send(vec![a]).unwrap();
    assert_eq!(rx.recv().unwrap().len(), 1);
    drop((ends, placeholders));
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "nofile" => nofile_child(),
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn descriptors_past_the_limit_fail_one_message_and_leak_nothing() {
    with_watchdog("descriptors_past_the_limit", LIMIT, || {
        let status = common::child_command(&[(ROLE, "nofile")])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the child failed: {status}");
    });
}

/// A sending end whose socket has the smallest send buffer the kernel
/// allows (about 4.5 KiB): packets of the size courier picks for this
/// process's sockets do not fit (`EMSGSIZE`, as `ENOBUFS` when the kernel
/// cannot allocate one), and courier sends in smaller packets instead.
fn small_buffer_pair() -> (OwnedFd, OwnedFd) {
    let (tx, rx) = seqpacket_pair();
    sockopt::set_socket_send_buffer_size(&tx, 1).unwrap();
    assert!(sockopt::socket_send_buffer_size(&tx).unwrap() < 16 << 10);
    (tx, rx)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_small_send_buffer_is_met_with_smaller_packets() {
    with_watchdog("a_small_send_buffer", LIMIT, || {
        let _check = fd_check();
        let sizes = [100, 3000, 10_000, 100_000, 300_000, 3 << 20];
        for large in [
            ipc::LargeMessages::SharedMemory,
            ipc::LargeMessages::Fragments,
        ] {
            let saved = ipc::Config::global();
            ipc::Config::set_global(ipc::Config {
                large_messages: large,
                ..saved
            });
            let (tx, rx) = small_buffer_pair();
            let tx = IpcBytesSender::try_from(tx).unwrap();
            let rx = IpcBytesReceiver::try_from(rx).unwrap();
            let reader = std::thread::spawn(move || {
                for (i, &len) in sizes.iter().enumerate() {
                    assert_eq!(rx.recv().unwrap(), pattern(len, i as u8), "{len} B");
                }
            });
            for (i, &len) in sizes.iter().enumerate() {
                tx.send(&pattern(len, i as u8))
                    .unwrap_or_else(|e| panic!("{large:?}, {len} B: {e}"));
            }
            reader.join().unwrap();
            ipc::Config::set_global(saved);
        }
    });
}

#[test]
fn a_small_send_buffer_carries_typed_messages_with_channels() {
    with_watchdog("typed_small_buffer", LIMIT, || {
        let _check = fd_check();
        let (tx, rx) = small_buffer_pair();
        let tx = IpcSender::<(Vec<u8>, IpcBytesSender)>::try_from(tx).unwrap();
        let rx = IpcReceiver::<(Vec<u8>, IpcBytesSender)>::try_from(rx).unwrap();
        let reader = std::thread::spawn(move || {
            for len in [10, 50_000] {
                let (data, reply) = rx.recv().unwrap();
                assert_eq!(data, pattern(len, 7));
                reply.send(&data[..1]).unwrap();
            }
        });
        for len in [10, 50_000] {
            let (reply_tx, reply_rx) = ipc::bytes_channel().unwrap();
            tx.send((pattern(len, 7), reply_tx)).unwrap();
            assert_eq!(reply_rx.recv().unwrap(), pattern(len, 7)[..1]);
        }
        reader.join().unwrap();
    });
}
