//! Descriptors inside typed messages: `ipc::IpcFd` and `ipc::as_fd`, in one
//! process and across a real one, many more than one descriptor packet
//! carries (253), past the per-message limit, from a hostile peer, and into
//! a receiver that is out of descriptors.
//!
//! The child roles run in this test binary re-executed (`/proc/self/exe`),
//! as `ipc_xprocess.rs` does: only `child_entry` runs there, reading its
//! role from `COURIER_FD_ROLE`.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::Duration;

use courier::ipc::{
    self, IpcBytesReceiver, IpcError, IpcFd, IpcOneShotServer, IpcReceiver, IpcSender,
    IpcSharedMemory, TryRecvError, WireError, MAX_FDS,
};
use serde::{Deserialize, Serialize};

mod common;
use common::fd_check;
use common::wire::{fd_packet_at, header, header_many, raw_send, seqpacket_pair, wire_error};

const ROLE: &str = "COURIER_FD_ROLE";
const SERVER: &str = "COURIER_FD_SERVER";
const PATIENCE: Duration = Duration::from_secs(60);
/// Descriptors one descriptor packet carries (Linux's `SCM_MAX_FD`).
const PER_PACKET: usize = 253;

/// A file of `bytes` whose name is already gone.
fn file_with(bytes: &[u8]) -> File {
    let path = std::env::temp_dir().join(format!(
        "courier-ipc-fd-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.write_all(bytes).unwrap();
    file.rewind().unwrap();
    file
}

/// One of each: what the parent hands its child.
#[derive(Serialize, Deserialize)]
struct Kit {
    file: IpcFd,
    #[serde(with = "courier::ipc::as_fd")]
    stream: UnixStream,
    #[serde(with = "courier::ipc::as_fd")]
    listener: TcpListener,
    /// What the child found in the file.
    reply: IpcSender<String>,
}

#[test]
fn descriptors_of_every_kind_arrive_and_work_in_one_process() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Kit>().unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (reply, replies) = ipc::channel::<String>().unwrap();
    tx.send(Kit {
        file: file_with(b"a file's bytes").into(),
        stream: theirs,
        listener,
        reply,
    })
    .unwrap();
    let kit = rx.recv().unwrap();
    let mut text = String::new();
    File::from(kit.file).read_to_string(&mut text).unwrap();
    kit.reply.send(text).unwrap();
    assert_eq!(replies.recv().unwrap(), "a file's bytes");
    (&kit.stream).write_all(b"ping").unwrap();
    let mut ping = [0u8; 4];
    (&ours).read_exact(&mut ping).unwrap();
    assert_eq!(&ping, b"ping");
    let client = TcpStream::connect(addr).unwrap();
    let (accepted, _) = kit.listener.accept().unwrap();
    assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
}

/// The child's side: receives one `Kit` and uses each descriptor.
fn serve_kit(server: String) {
    let (tx, rx) = ipc::channel::<Kit>().unwrap();
    IpcSender::<IpcSender<Kit>>::connect(server)
        .unwrap()
        .send(tx)
        .unwrap();
    let kit = rx.recv().unwrap();
    let mut text = String::new();
    File::from(kit.file).read_to_string(&mut text).unwrap();
    kit.reply.send(text).unwrap();
    (&kit.stream).write_all(b"from the child").unwrap();
    let (mut accepted, _) = kit.listener.accept().unwrap();
    accepted.write_all(b"accepted by the child").unwrap();
}

/// Starts this binary as a child playing `role`, connected through a
/// one-shot server whose first message is of type `T`.
fn spawn_child<T>(role: &str) -> (std::process::Child, T)
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    let (server, name) = IpcOneShotServer::<T>::new().unwrap();
    let child = common::child_command(&[(ROLE, role), (SERVER, &name)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (_rx, first) = server.accept_timeout(PATIENCE).expect("the child connects");
    (child, first)
}

#[test]
fn a_child_process_gets_a_file_a_socket_and_a_listener_and_uses_each() {
    let _check = fd_check();
    let (mut child, to_child) = spawn_child::<IpcSender<Kit>>("kit");
    let (ours, theirs) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (reply, replies) = ipc::channel::<String>().unwrap();
    to_child
        .send(Kit {
            file: file_with(b"read in the child").into(),
            stream: theirs,
            listener,
            reply,
        })
        .unwrap();
    assert_eq!(
        replies.try_recv_timeout(PATIENCE).unwrap(),
        "read in the child"
    );
    let mut from_child = [0u8; 14];
    (&ours).read_exact(&mut from_child).unwrap();
    assert_eq!(&from_child, b"from the child");
    let mut client = TcpStream::connect(addr).unwrap();
    let mut greeting = String::new();
    client.read_to_string(&mut greeting).unwrap();
    assert_eq!(greeting, "accepted by the child");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_message_with_as_many_descriptors_as_fit_arrives_and_one_more_is_refused() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<IpcFd>>().unwrap();
    let file = file_with(b"x");
    let fds = |n: usize| -> Vec<IpcFd> {
        (0..n)
            .map(|_| IpcFd::from(OwnedFd::from(file.try_clone().unwrap())))
            .collect()
    };
    tx.send(fds(MAX_FDS)).unwrap();
    assert_eq!(rx.recv().unwrap().len(), MAX_FDS);
    // One more than a message carries: an error before anything is sent,
    // and the channel goes on.
    assert!(matches!(tx.send(fds(MAX_FDS + 1)), Err(IpcError::Io(_))));
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_millis(50)),
        Err(TryRecvError::Empty)
    ));
    tx.send(fds(3)).unwrap();
    assert_eq!(rx.recv().unwrap().len(), 3);
}

/// The contents of `file`, read from its start.
fn contents(file: impl Into<File>) -> String {
    let mut file = file.into();
    let mut text = String::new();
    file.rewind().unwrap();
    file.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn a_thousand_files_in_one_message_arrive_in_order_and_work() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(u32, Vec<IpcFd>, u32)>().unwrap();
    let files: Vec<IpcFd> = (0..1000)
        .map(|i| file_with(format!("file {i}").as_bytes()).into())
        .collect();
    tx.send((7, files, 9)).unwrap();
    // And a message after it, in order.
    tx.send((1, vec![file_with(b"after").into()], 2)).unwrap();
    let (before, files, after) = rx.recv().unwrap();
    assert_eq!((before, files.len(), after), (7, 1000, 9));
    for (i, file) in files.into_iter().enumerate() {
        assert_eq!(contents(file), format!("file {i}"));
    }
    let (_, files, _) = rx.recv().unwrap();
    assert_eq!(contents(files.into_iter().next().unwrap()), "after");
}

#[test]
fn a_thousand_channel_ends_in_one_message_arrive_in_order_and_work() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<IpcSender<u32>>>().unwrap();
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..1000).map(|_| ipc::channel::<u32>().unwrap()).unzip();
    tx.send(senders).unwrap();
    let senders = rx.recv().unwrap();
    assert_eq!(senders.len(), 1000);
    for (i, sender) in senders.iter().enumerate() {
        sender.send(i as u32).unwrap();
    }
    for (i, receiver) in receivers.iter().enumerate() {
        assert_eq!(receiver.recv().unwrap(), i as u32);
    }
}

/// Channels, shared-memory regions and plain descriptors, each the `i`th.
#[derive(Serialize, Deserialize)]
struct Mixed {
    items: Vec<(IpcSender<u32>, IpcSharedMemory, IpcFd)>,
    /// Bytes enough, if large, to send the payload by region or fragments,
    /// whose carrier comes last, past the descriptors of the items.
    bytes: serde_bytes::ByteBuf,
}

fn send_and_check_mixed(n: usize, bytes: usize) {
    let (tx, rx) = ipc::channel::<Mixed>().unwrap();
    let mut receivers = Vec::new();
    let items = (0..n)
        .map(|i| {
            let (s, r) = ipc::channel::<u32>().unwrap();
            receivers.push(r);
            let region = IpcSharedMemory::from_bytes(format!("region {i}").as_bytes());
            (s, region, file_with(format!("file {i}").as_bytes()).into())
        })
        .collect();
    let payload = (0..bytes).map(|i| i as u8).collect::<Vec<u8>>();
    let mixed = Mixed {
        items,
        bytes: payload.clone().into(),
    };
    // From another thread: fragments wait for the receiver.
    let sender = std::thread::spawn(move || tx.send(mixed).unwrap());
    let got = rx.try_recv_timeout(PATIENCE).unwrap();
    sender.join().unwrap();
    assert_eq!(got.items.len(), n);
    assert!(got.bytes.as_slice() == payload.as_slice());
    for (i, (s, region, file)) in got.items.into_iter().enumerate() {
        s.send(i as u32).unwrap();
        assert_eq!(receivers[i].recv().unwrap(), i as u32);
        assert_eq!(&region[..], format!("region {i}").as_bytes());
        assert_eq!(contents(file), format!("file {i}"));
    }
    // Dropped regions stay mapped, a few, each with its descriptor.
    IpcSharedMemory::unmap_dropped();
}

#[test]
fn channels_regions_and_descriptors_mixed_past_one_packet() {
    let _check = fd_check();
    // 3 x 100 = 300 descriptors: two descriptor packets.
    send_and_check_mixed(100, 16);
    // With a payload in a region, then in fragments: the carrier is
    // descriptor 301, in the second packet.
    send_and_check_mixed(100, 1 << 20);
    let mut config = ipc::Config::global();
    let saved = config;
    config.large_messages = ipc::LargeMessages::Fragments;
    ipc::Config::set_global(config);
    send_and_check_mixed(100, 1 << 20);
    ipc::Config::set_global(saved);
    // 2 x 253 - 1 descriptors in items: with the carrier, exactly two full
    // packets.
    send_and_check_mixed(PER_PACKET * 2 / 3, 1 << 20);
}

// ===== A hostile peer =====

/// A raw socket to forge packets into, and a receiver reading it.
fn raw_pair() -> (OwnedFd, IpcBytesReceiver) {
    let (a, b) = seqpacket_pair();
    (a, IpcBytesReceiver::try_from(b).unwrap())
}

/// The peer's fault `result` reports (it must be one).
fn fault<T: std::fmt::Debug>(result: Result<T, TryRecvError>, what: &str) -> WireError {
    match result {
        Err(TryRecvError::IpcError(IpcError::Io(e))) => {
            wire_error(&e).unwrap_or_else(|| panic!("{what}: not a wire error: {e}"))
        }
        other => panic!("{what}: expected a wire error, got {other:?}"),
    }
}

/// `n` descriptors of one pipe's reading end (closed at the receiver once
/// refused or dropped).
fn pipes(n: usize) -> (OwnedFd, Vec<OwnedFd>) {
    let (r, w) = rustix::pipe::pipe().unwrap();
    let fds = (0..n).map(|_| r.try_clone().unwrap()).collect();
    (w, fds)
}

/// Sends descriptor packet `index` of the message `tag`, `count` claimed,
/// with `fds` attached.
fn send_fds(raw: &OwnedFd, count: usize, index: u16, tag: u64, fds: &[OwnedFd]) {
    let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    raw_send(raw, &fd_packet_at(count as u16, index, tag), &borrowed);
}

/// A plain message goes through: the channel went on.
fn goes_on(raw: &OwnedFd, rx: &IpcBytesReceiver) {
    let mut packet = header(0, 0, 2, 0, 0);
    packet.extend_from_slice(b"ok");
    raw_send(raw, &packet, &[]);
    assert_eq!(rx.try_recv_timeout(PATIENCE).unwrap(), b"ok");
}

#[test]
fn a_forged_message_of_many_descriptors_arrives_whole_or_fails_alone() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let (_w, fds) = pipes(300);
    let wait = Duration::from_secs(5);

    // Well formed: 253, then 47, in order.
    raw_send(&raw, &header_many(0, 300, 0, 1), &[]);
    send_fds(&raw, PER_PACKET, 0, 1, &fds[..PER_PACKET]);
    send_fds(&raw, 47, 1, 1, &fds[PER_PACKET..]);
    assert_eq!(rx.try_recv_timeout(wait).unwrap(), b"");

    // The second packet under another tag: that packet fails; the message
    // still waits, and its own packet completes it.
    raw_send(&raw, &header_many(0, 300, 0, 2), &[]);
    send_fds(&raw, PER_PACKET, 0, 2, &fds[..PER_PACKET]);
    send_fds(&raw, 47, 1, 3, &fds[PER_PACKET..]);
    assert_eq!(
        fault(rx.try_recv_timeout(wait), "wrong tag"),
        WireError::BadHeader("descriptor packet for no message")
    );
    send_fds(&raw, 47, 1, 2, &fds[PER_PACKET..]);
    assert_eq!(rx.try_recv_timeout(wait).unwrap(), b"");

    // Out of order: the message fails; its other packet is dropped quietly.
    raw_send(&raw, &header_many(0, 300, 0, 4), &[]);
    send_fds(&raw, 47, 1, 4, &fds[PER_PACKET..]);
    send_fds(&raw, PER_PACKET, 0, 4, &fds[..PER_PACKET]);
    assert_eq!(
        fault(rx.try_recv_timeout(wait), "out of order"),
        WireError::BadHeader("a descriptor packet out of order")
    );
    goes_on(&raw, &rx);

    // A packet claiming a full packet's count with fewer attached.
    raw_send(&raw, &header_many(0, 300, 0, 5), &[]);
    send_fds(&raw, PER_PACKET, 0, 5, &fds[..100]);
    assert_eq!(
        fault(rx.try_recv_timeout(wait), "short packet"),
        WireError::UnexpectedFds {
            announced: 300,
            received: 100
        }
    );
    // (Its second packet, if it came, would be dropped: it does not.)
    goes_on(&raw, &rx);

    // A packet whose count contradicts the header (the first must be full).
    raw_send(&raw, &header_many(0, 300, 0, 6), &[]);
    send_fds(&raw, 47, 0, 6, &fds[..47]);
    assert!(matches!(
        fault(rx.try_recv_timeout(wait), "short first packet"),
        WireError::UnexpectedFds { .. }
    ));
    goes_on(&raw, &rx);

    // An extra packet after the message is whole: that packet fails alone.
    raw_send(&raw, &header_many(0, 300, 0, 7), &[]);
    send_fds(&raw, PER_PACKET, 0, 7, &fds[..PER_PACKET]);
    send_fds(&raw, 47, 1, 7, &fds[PER_PACKET..]);
    send_fds(&raw, 1, 2, 7, &fds[..1]);
    assert_eq!(rx.try_recv_timeout(wait).unwrap(), b"");
    assert!(matches!(
        fault(rx.try_recv_timeout(wait), "extra packet"),
        WireError::BadHeader(_)
    ));
    goes_on(&raw, &rx);
}

#[test]
fn a_forged_count_of_descriptors_is_checked_before_anything_is_kept() {
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let wait = Duration::from_secs(5);
    // Counts no message may have: past the limit (the carrier aside), the
    // many-descriptor form for 64 or fewer, kinds beside a count.
    for (bytes, what) in [
        (header_many(0, MAX_FDS as u32 + 1, 0, 1), "past the limit"),
        (header_many(0, u32::MAX, 0, 1), "u32::MAX"),
        (header_many(0, 64, 0, 1), "64 in the long form"),
        (
            header(0, 0xFF, 0, (1 << 40) | 300, 1),
            "kinds beside a count",
        ),
        (header(0, 65, 0, 0, 1), "65 in the short form"),
    ] {
        raw_send(&raw, &bytes, &[]);
        assert!(
            matches!(
                fault(rx.try_recv_timeout(wait), what),
                WireError::BadHeader(_)
            ),
            "{what}"
        );
    }
    goes_on(&raw, &rx);
    // The most a message may claim is waited for, without allocating for
    // it: descriptors that never come, then the peer hangs up.
    raw_send(&raw, &header_many(0, MAX_FDS as u32, 0, 2), &[]);
    let (_w, fds) = pipes(PER_PACKET);
    send_fds(&raw, PER_PACKET, 0, 2, &fds);
    drop(fds);
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_millis(50)),
        Err(TryRecvError::Empty)
    ));
    drop(raw);
    assert_eq!(
        fault(rx.try_recv_timeout(wait), "hang-up"),
        WireError::Truncated
    );
    assert!(matches!(
        rx.try_recv_timeout(wait),
        Err(TryRecvError::IpcError(IpcError::Disconnected))
    ));
}

/// The child's side of the `EMFILE` tests: with room for only `room` more
/// descriptors, it receives a message of many, then one of one.
fn serve_out_of_descriptors(server: String, room: u64) {
    let (tx, rx) = ipc::channel::<Vec<IpcFd>>().unwrap();
    let (report, reports) = ipc::channel::<Vec<String>>().unwrap();
    IpcSender::<(IpcSender<Vec<IpcFd>>, IpcReceiver<Vec<String>>)>::connect(server)
        .unwrap()
        .send((tx, reports))
        .unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    // Room for `room` more descriptors than are open now (the soft limit
    // only: the hard one stays).
    let limit = rustix::process::Rlimit {
        current: Some(open + room),
        maximum: rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum,
    };
    let mut got = Vec::new();
    match rustix::process::setrlimit(rustix::process::Resource::Nofile, limit) {
        Ok(()) => {
            got.push(match rx.recv() {
                Ok(fds) => format!("ok {}", fds.len()),
                Err(e) => format!("err {e}"),
            });
            got.push(match rx.recv() {
                Ok(fds) => format!("ok {}", fds.len()),
                Err(e) => format!("err {e}"),
            });
        }
        Err(e) => got.push(format!("setrlimit: {e}")),
    }
    report.send(got).unwrap();
}

#[test]
fn a_receiver_out_of_descriptors_gets_an_error_for_that_message_and_goes_on() {
    let _check = fd_check();
    let (mut child, (to_child, reports)) =
        spawn_child::<(IpcSender<Vec<IpcFd>>, IpcReceiver<Vec<String>>)>("emfile");
    let many: Vec<IpcFd> = (0..40).map(|_| file_with(b"y").into()).collect();
    if let Err(e) = to_child.send(many) {
        panic!("{e:?}; child: {:?}", child.wait());
    }
    to_child.send(vec![file_with(b"z").into()]).unwrap();
    let got = reports.try_recv_timeout(PATIENCE);
    let got = got.unwrap_or_else(|e| panic!("{e:?}; child: {:?}", child.wait()));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("err"), "the message of 40: {got:?}");
    assert_eq!(got[1], "ok 1", "the message after it: {got:?}");
    assert!(child.wait().unwrap().success());
}

/// A receiver out of descriptors in the second of three descriptor packets
/// (room for 300: the first packet's 253 fit, the second's do not): an error
/// for that message, what came closed, the third packet dropped, and the
/// next message arrives.
#[test]
fn a_receiver_out_of_descriptors_part_way_through_many_packets_goes_on() {
    let _check = fd_check();
    let (mut child, (to_child, reports)) =
        spawn_child::<(IpcSender<Vec<IpcFd>>, IpcReceiver<Vec<String>>)>("emfile_many");
    let file = file_with(b"y");
    let many: Vec<IpcFd> = (0..600)
        .map(|_| OwnedFd::from(file.try_clone().unwrap()).into())
        .collect();
    if let Err(e) = to_child.send(many) {
        panic!("{e:?}; child: {:?}", child.wait());
    }
    to_child.send(vec![file_with(b"z").into()]).unwrap();
    let got = reports.try_recv_timeout(PATIENCE);
    let got = got.unwrap_or_else(|e| panic!("{e:?}; child: {:?}", child.wait()));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("err") && got[0].contains("control data truncated"),
        "the message of 600: {got:?}"
    );
    assert_eq!(got[1], "ok 1", "the message after it: {got:?}");
    assert!(child.wait().unwrap().success());
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let server = std::env::var(SERVER).expect("server name");
    match role.as_str() {
        "kit" => serve_kit(server),
        "emfile" => serve_out_of_descriptors(server, 8),
        "emfile_many" => serve_out_of_descriptors(server, 300),
        other => panic!("no role {other}"),
    }
}
