//! Writes the seed corpus (`fuzz/corpus/<target>/`) from real messages:
//! courier senders write into a socket whose other end is recorded as a
//! script (see `courier_fuzz::Script`).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds`

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use courier::ipc::fuzz::{decode_whole, Limits};
use courier::ipc::{self, IpcBytesReceiver, IpcBytesSender, IpcSender, LargeMessages};
use courier_fuzz::{Sample, Script};
use rustix::net::{self, AddressFamily, SendFlags, SocketFlags, SocketType};

/// Bytes kept of each region and fragment.
const KEEP: usize = 256;

fn pair() -> (OwnedFd, OwnedFd) {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// Records what `send` sends on a channel end made from a raw socket.
fn record(choice: u8, large: LargeMessages, send: impl FnOnce(OwnedFd) + Send) -> Vec<u8> {
    ipc::Config::set_global(ipc::Config {
        large_messages: large,
        ..ipc::Config::default()
    });
    let (ours, theirs) = pair();
    let mut script = Script::new(choice);
    std::thread::scope(|s| {
        s.spawn(move || send(ours));
        script.record(&theirs, KEEP);
    });
    script.into_bytes()
}

fn bytes_sender(fd: OwnedFd) -> IpcBytesSender {
    IpcBytesSender::try_from(fd).unwrap()
}

fn typed_sender<T: serde::Serialize + for<'de> serde::Deserialize<'de>>(
    fd: OwnedFd,
) -> IpcSender<T> {
    IpcSender::try_from(fd).unwrap()
}

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// The operations of a script: (kind, bytes).
fn ops(script: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut rest = &script[1..];
    while let Some((&[kind, a, b], tail)) = rest.split_first_chunk::<3>() {
        let len = usize::from(u16::from_le_bytes([a, b])).min(tail.len());
        out.push((kind, &tail[..len]));
        rest = &tail[len..];
    }
    out
}

/// A receiver that has read messages it has not handed out (one waiting
/// for its descriptors) and holds regions, as it is when it is sent on.
fn busy_receiver() -> (IpcBytesSender, IpcBytesReceiver) {
    ipc::Config::set_global(ipc::Config::default());
    let (tx, rx) = ipc::bytes_channel().unwrap();
    for i in 0..4u8 {
        let data = vec![i; 64 << 10];
        tx.send(&data).unwrap();
        assert_eq!(rx.recv().unwrap(), data);
    }
    // A header announcing one descriptor whose packet never comes.
    let mut header = Vec::new();
    header.extend_from_slice(&0xC0C0_5201u32.to_le_bytes());
    header.extend_from_slice(&[0, 1, 0, 0]);
    header.extend_from_slice(&5u64.to_le_bytes());
    header.extend_from_slice(&0u128.to_le_bytes());
    header.extend_from_slice(&0x5eedu64.to_le_bytes());
    header.extend_from_slice(b"first");
    net::send(tx.as_fd(), &header, SendFlags::NOSIGNAL).unwrap();
    tx.send(b"second").unwrap();
    assert_eq!(rx.recv().unwrap(), b"second");
    tx.send(b"third").unwrap();
    (tx, rx)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let shm = LargeMessages::SharedMemory;
    let frag = LargeMessages::Fragments;
    let mut scripts: Vec<(&str, &str, Vec<u8>)> = Vec::new();

    // Inline messages, bytes and typed (the typed ones with a byte string
    // long enough to be received apart from the second message on).
    let s = record(0, shm, |fd| {
        let tx = bytes_sender(fd);
        for len in [0, 5, 100, 5000] {
            tx.send(&vec![0xA5; len]).unwrap();
        }
    });
    scripts.push(("fragments", "inline-bytes", s));
    let s = record(1, shm, |fd| {
        let tx = typed_sender::<Sample>(fd);
        for (id, len, depth) in [(1, 10, 2), (2, 3000, 1), (3, 3000, 1), (4, 9000, 0)] {
            tx.send(Sample::new(id, len, depth)).unwrap();
        }
    });
    scripts.push(("region", "inline-typed", s));

    // Fragmented messages (cut to a few small packets).
    for (name, choice) in [("fragmented-bytes", 0), ("fragmented-typed", 1)] {
        let s = record(choice, frag, move |fd| {
            if choice == 0 {
                bytes_sender(fd).send(&vec![7; 300_000]).unwrap();
            } else {
                typed_sender::<Sample>(fd)
                    .send(Sample::new(5, 300_000, 1))
                    .unwrap();
            }
        });
        scripts.push(("fragments", name, s));
    }
    // A message with channels, fragmented.
    let s = record(0, frag, |fd| {
        let (a, _) = ipc::bytes_channel().unwrap();
        typed_sender::<(IpcBytesSender, serde_bytes::ByteBuf)>(fd)
            .send((a, vec![1; 250_000].into()))
            .unwrap();
    });
    scripts.push(("fragments", "fragmented-with-channel", s));

    // Region messages: by descriptor, streamed, typed.
    for (name, choice, len) in [
        ("region-bytes", 0, 300_000),
        ("region-streamed", 0, 2 << 20),
        ("region-typed", 1, 400_000),
    ] {
        let s = record(choice, shm, move |fd| {
            if choice == 0 {
                let tx = bytes_sender(fd);
                tx.send(&vec![3; len]).unwrap();
                tx.send(&vec![4; len]).unwrap();
            } else {
                typed_sender::<Sample>(fd)
                    .send(Sample::new(6, len, 1))
                    .unwrap();
            }
        });
        scripts.push(("region", name, s));
    }

    // Moved receivers: a plain one, and one with a backlog and held regions.
    let s = record(0, shm, |fd| {
        let (_tx, rx) = ipc::bytes_channel().unwrap();
        typed_sender::<IpcBytesReceiver>(fd).send(rx).unwrap();
    });
    scripts.push(("backlog", "moved-plain", s));
    let (_keep, busy) = busy_receiver();
    let s = record(0, shm, move |fd| {
        typed_sender::<IpcBytesReceiver>(fd).send(busy).unwrap();
    });
    scripts.push(("backlog", "moved-with-backlog", s));

    scripts.push(("region", "ring-records", ring_script()));

    let mut headers = Vec::new();
    let mut fd_packets = Vec::new();
    for (target, name, script) in &scripts {
        write(&root, target, name, script);
        for (kind, bytes) in ops(script) {
            if kind == 0
                && bytes.len() >= 40
                && !headers.iter().any(|h: &Vec<u8>| h[..] == bytes[..40])
            {
                headers.push(bytes[..40].to_vec());
            }
            if kind == 1 && bytes.len() >= 16 {
                fd_packets.push(bytes[..16].to_vec());
            }
        }
    }
    for (i, h) in headers.iter().enumerate() {
        write(&root, "header", &format!("header-{i:02}"), h);
    }
    fd_packets.dedup();
    for (i, p) in fd_packets.iter().enumerate() {
        write(&root, "fd_packet", &format!("fd-packet-{i:02}"), p);
    }

    // Typed payloads: the split where the whole decode saw the byte string.
    let limits = Limits {
        depth: 128,
        budget: 16 << 20,
    };
    for (i, (len, depth)) in [(0, 0), (10, 3), (3000, 1), (5000, 0), (2048, 8)]
        .into_iter()
        .enumerate()
    {
        let payload = postcard::to_allocvec(&Sample::new(i as u64, len, depth)).unwrap();
        let (value, seen) = decode_whole::<Sample>(&payload, limits);
        assert!(value.is_ok());
        let (at, len) = seen.unwrap_or((0, 0));
        let mut seed = Vec::new();
        seed.extend_from_slice(&(at as u16).to_le_bytes());
        seed.extend_from_slice(&(len as u16).to_le_bytes());
        seed.push(0);
        seed.extend_from_slice(&payload);
        write(&root, "split_decode", &format!("sample-{i:02}"), &seed);
    }
    let nested: Vec<Vec<u8>> = vec![vec![], vec![1; 3000], vec![2, 3]];
    let payload = postcard::to_allocvec(&nested).unwrap();
    let mut seed = vec![0, 0, 0, 0, 1];
    seed.extend_from_slice(&payload);
    write(&root, "split_decode", "nested", &seed);
}

/// A sender's shared-memory ring, announced and holding records (plain
/// payloads of several lengths), written by hand in the layout of
/// `courier::ipc`'s `transport::ring`: the fuzzer mutates a ring that a
/// receiver maps and reads through its real receive path. (A script's
/// operation writes at most 64 KiB, so the end of the record area, and a
/// wrap, are the fuzzer's to reach through the indices.)
fn ring_script() -> Vec<u8> {
    const DATA_AT: usize = 4096;
    const DATA_LEN: usize = 64 << 10;
    const PLAIN: u64 = 1;
    let mut area = vec![0u8; DATA_AT];
    area[..8].copy_from_slice(b"cring\0\0\x01");
    area[8..16].copy_from_slice(&(DATA_LEN as u64).to_le_bytes());
    for len in [0, 5, 64, 300] {
        let word = (PLAIN << 32) | len as u64;
        area.extend_from_slice(&word.to_le_bytes());
        area.extend_from_slice(&vec![0x5A; len]);
        area.resize(area.len().next_multiple_of(8), 0);
    }
    let head = (area.len() - DATA_AT) as u64;
    area[64..72].copy_from_slice(&head.to_le_bytes());

    let mut script = Script::new(0);
    let mut op = ((DATA_AT + DATA_LEN) as u32).to_le_bytes().to_vec();
    op.extend_from_slice(&area);
    script.op(2, &op);
    // The announcement: body 4 (a ring), one descriptor, the carrier.
    let tag = 0x5eed_u64;
    let mut header = vec![0u8; 40];
    header[..4].copy_from_slice(&0xC0C0_5201u32.to_le_bytes());
    header[4] = 4;
    header[5] = 1;
    header[16] = 3;
    header[32..40].copy_from_slice(&tag.to_le_bytes());
    script.op(0, &header);
    // Its descriptor packet, attaching region 0.
    let mut packet = vec![0u8; 16];
    packet[..4].copy_from_slice(&0xC0C0_5202u32.to_le_bytes());
    packet[4..6].copy_from_slice(&1u16.to_le_bytes());
    packet[8..16].copy_from_slice(&tag.to_le_bytes());
    packet.push(2);
    script.op(1, &packet);
    script.into_bytes()
}
