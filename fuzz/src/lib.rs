//! What the fuzz targets share: the typed message they decode, and a hostile
//! peer that plays a script of raw packets into a courier receiver's socket.
//!
//! # Scripts
//! A transport target's input is a script: a receiver choice byte (0: a
//! bytes receiver; 1: a receiver of [`Sample`]), then operations, each a
//! kind byte, a `u16` LE length and that many bytes:
//!
//! | kind | does |
//! | --- | --- |
//! | 0 `DATA` | writes the bytes as one packet on the channel |
//! | 1 `FDS` | writes the first 16 bytes as a descriptor packet, with descriptors attached: one for each descriptor the last data packet's header announced, of the kind the rest of the bytes say (0: a connected socket, 1: what the header's kind and body say, a fragment socket or a region; 2 and up: region `b - 2` of those made so far) |
//! | 2 `REGION` | makes a region: a `u32` LE size, then its first bytes (the rest is zero); a sealed memfd unless the size's top bit is set |
//! | 3 `FRAGMENT` | writes the bytes as one packet on the newest fragment socket |
//!
//! [`Script::record`] writes the same format from a real sender's packets,
//! which is how the seed corpus is made.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use courier::ipc::{self, IpcBytesReceiver, IpcReceiver, TryRecvError};
use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::net::{
    self, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags,
    SocketType,
};
use serde::{Deserialize, Serialize};

/// A typed message with what decoding must bound: a large byte string, nested
/// sequences, a recursive type, maps, zero-sized elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub id: u64,
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub parts: Vec<Vec<u8>>,
    pub tree: Tree,
    pub map: std::collections::BTreeMap<u16, Option<String>>,
    pub units: Vec<()>,
    pub tail: Option<Box<Sample>>,
}

/// A recursive type: nesting costs a level of decoding each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Tree {
    Leaf(u8),
    Node(Box<Tree>, Box<Tree>),
}

impl Sample {
    /// A sample whose byte string is `body_len` bytes long.
    pub fn new(id: u64, body_len: usize, depth: u32) -> Sample {
        let mut tree = Tree::Leaf(1);
        for i in 0..depth {
            tree = Tree::Node(Box::new(tree), Box::new(Tree::Leaf(i as u8)));
        }
        Sample {
            id,
            name: format!("sample {id}"),
            body: (0..body_len).map(|i| (i * 7 + id as usize) as u8).collect(),
            parts: vec![vec![], vec![1], vec![2, 3]],
            tree,
            map: [(1, None), (2, Some("two".to_owned()))].into(),
            units: vec![(); 3],
            tail: (depth > 0).then(|| Box::new(Sample::new(id + 1, 3, 0))),
        }
    }
}

const DATA: u8 = 0;
const FDS: u8 = 1;
const REGION: u8 = 2;
const FRAGMENT: u8 = 3;

/// Regions larger than this are cut to it (they are sparse, but a fuzzed
/// size must not make every run map a gigabyte).
const MAX_REGION: u32 = 8 << 20;
/// Descriptors attached to one descriptor packet, at most.
const MAX_ATTACHED: usize = 16;

/// The largest message the fuzzed receivers accept, and how long a stalled
/// message may take: small, so that neither allocation nor waiting decides
/// how fast the fuzzer goes.
pub fn configure() {
    ipc::Config::set_global(ipc::Config {
        max_message_size: 16 << 20,
        fragment_timeout: Duration::from_millis(20),
        ..ipc::Config::default()
    });
}

/// The number of descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn pair() -> (OwnedFd, OwnedFd) {
    net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap()
}

/// Writes one packet, without blocking (a full socket drops it).
fn send(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_ATTACHED))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    let _ = net::sendmsg(fd, &[IoSlice::new(bytes)], &mut control, flags);
}

fn region(size: u32, contents: &[u8]) -> OwnedFd {
    let seal = size & 0x8000_0000 == 0;
    let size = (size & 0x7fff_ffff).min(MAX_REGION) as u64;
    let fd = fs::memfd_create(
        "courier-fuzz",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    fs::ftruncate(&fd, size).unwrap();
    let n = contents.len().min(size as usize);
    let _ = rustix::io::pwrite(&fd, &contents[..n], 0);
    if seal {
        fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    }
    fd
}

/// A hostile peer's half of a channel, playing a script.
struct Peer {
    channel: OwnedFd,
    /// The header of the last data packet, if it had one's length.
    header: Option<[u8; 40]>,
    regions: Vec<OwnedFd>,
    /// Write ends of fragment sockets, newest last.
    carriers: Vec<OwnedFd>,
    /// The other ends of the sockets sent as channel ends.
    peers: Vec<OwnedFd>,
}

impl Peer {
    fn play(&mut self, kind: u8, bytes: &[u8]) {
        match kind % 4 {
            DATA => {
                self.header = bytes.first_chunk::<40>().copied();
                send(self.channel.as_fd(), bytes, &[]);
            }
            FDS => {
                let (packet, how) = bytes.split_at(bytes.len().min(16));
                let attached = self.attachments(how);
                let fds: Vec<BorrowedFd<'_>> = attached.iter().map(|f| f.as_fd()).collect();
                send(self.channel.as_fd(), packet, &fds);
            }
            REGION => {
                let Some((size, contents)) = bytes.split_first_chunk::<4>() else {
                    return;
                };
                if self.regions.len() < MAX_ATTACHED {
                    self.regions
                        .push(region(u32::from_le_bytes(*size), contents));
                }
            }
            _ => {
                if let Some(carrier) = self.carriers.last() {
                    send(carrier.as_fd(), bytes, &[]);
                }
            }
        }
    }

    /// The descriptors to attach to a descriptor packet (see the module docs).
    fn attachments(&mut self, how: &[u8]) -> Vec<OwnedFd> {
        let (body, nfds, kinds) = match &self.header {
            Some(h) => (
                h[4],
                usize::from(h[5]),
                u128::from_le_bytes(h[16..32].try_into().unwrap()),
            ),
            None => (0, how.len(), 0),
        };
        (0..nfds.min(MAX_ATTACHED))
            .map(|i| {
                let choice = how.get(i).copied().unwrap_or(1);
                let carrier = (kinds >> (2 * i)) & 3 == 3;
                match choice {
                    0 => self.channel_end(),
                    1 if carrier && body == 1 => {
                        let (rx, tx) = pair();
                        self.carriers.push(tx);
                        rx
                    }
                    1 if carrier => self.region_fd(0),
                    1 => self.channel_end(),
                    r => self.region_fd(usize::from(r - 2)),
                }
            })
            .collect()
    }

    fn channel_end(&mut self) -> OwnedFd {
        let (end, other) = pair();
        self.peers.push(other);
        end
    }

    fn region_fd(&mut self, i: usize) -> OwnedFd {
        match self.regions.len() {
            0 => region(64 << 10, &[]),
            n => self.regions[i % n].try_clone().unwrap(),
        }
    }
}

/// Receives everything a receiver offers, until it has nothing more.
fn drain<T>(mut recv: impl FnMut() -> Result<T, TryRecvError>, mut each: impl FnMut(T)) {
    let mut empty = 0;
    for _ in 0..64 {
        match recv() {
            Ok(value) => {
                empty = 0;
                each(value);
            }
            Err(TryRecvError::Empty) => {
                empty += 1;
                if empty == 3 {
                    return;
                }
            }
            Err(TryRecvError::IpcError(ipc::IpcError::Disconnected)) => return,
            Err(TryRecvError::IpcError(_)) => {}
        }
    }
}

/// What receives the script's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// A bytes receiver, or a typed one by the script's first byte.
    BytesOrTyped,
    /// A receiver of receivers, each drained when it arrives.
    Moved,
}

/// Plays `script` into a fresh channel's receiver, receives everything it
/// yields, and checks that every descriptor is closed afterwards.
///
/// # Panics
/// On a descriptor leak (and wherever courier panics).
pub fn run(script: &[u8], reader: Reader) {
    let Some((&choice, mut ops)) = script.split_first() else {
        return;
    };
    ipc::IpcSharedMemory::unmap_dropped();
    let before = open_fds();
    {
        let (theirs, ours) = pair();
        let mut peer = Peer {
            channel: theirs,
            header: None,
            regions: Vec::new(),
            carriers: Vec::new(),
            peers: Vec::new(),
        };
        let mut count = 0;
        while let Some((&[kind, a, b], rest)) = ops.split_first_chunk::<3>() {
            let len = usize::from(u16::from_le_bytes([a, b])).min(rest.len());
            peer.play(kind, &rest[..len]);
            ops = &rest[len..];
            count += 1;
            if count == 256 {
                break;
            }
        }
        // Fragments stop here: the receiver reads the end of each stream.
        peer.carriers.clear();
        let wait = Duration::from_millis(1);
        match (reader, choice % 2) {
            (Reader::BytesOrTyped, 0) => {
                let rx = IpcBytesReceiver::try_from(ours).unwrap();
                drain(|| rx.try_recv_timeout(wait), drop);
            }
            (Reader::BytesOrTyped, _) => {
                let rx = IpcReceiver::<Sample>::try_from(ours).unwrap();
                drain(|| rx.try_recv_timeout(wait), drop);
            }
            (Reader::Moved, _) => {
                let rx = IpcReceiver::<IpcBytesReceiver>::try_from(ours).unwrap();
                drain(
                    || rx.try_recv_timeout(wait),
                    |moved| drain(|| moved.try_recv_timeout(wait), drop),
                );
            }
        }
        drop(peer);
    }
    ipc::IpcSharedMemory::unmap_dropped();
    let after = open_fds();
    assert!(
        after <= before,
        "descriptor leak: {after} open, {before} before"
    );
}

/// Writes scripts from what real senders send.
#[derive(Default)]
pub struct Script {
    bytes: Vec<u8>,
    /// Regions made so far.
    regions: u8,
}

impl Script {
    /// A script for the receiver chosen by `choice` (see the module docs).
    pub fn new(choice: u8) -> Script {
        Script {
            bytes: vec![choice],
            regions: 0,
        }
    }

    /// Appends one operation.
    pub fn op(&mut self, kind: u8, bytes: &[u8]) {
        let len = bytes.len().min(u16::MAX as usize);
        self.bytes.push(kind);
        self.bytes.extend_from_slice(&(len as u16).to_le_bytes());
        self.bytes.extend_from_slice(&bytes[..len]);
    }

    /// Reads everything a real sender writes on `fd` until it is closed,
    /// and writes it down: data packets, descriptor packets with what each
    /// descriptor is, regions (their first `keep` bytes, and their size),
    /// and fragments. A fragmented message is cut to `keep` bytes a packet
    /// (and its header's total to what is left), so that seeds stay small.
    pub fn record(&mut self, fd: &OwnedFd, keep: usize) {
        let mut body = 0;
        let mut left = 0;
        loop {
            let (bytes, fds) = recv(fd);
            if bytes.is_empty() && fds.is_empty() {
                return;
            }
            if fds.is_empty() {
                let mut bytes = bytes;
                if bytes.len() >= 40 {
                    body = bytes[4];
                }
                if body == 1 {
                    let first = (bytes.len() - 40).min(keep);
                    let total = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
                    let rest = (total as usize - (bytes.len() - 40)).min(3 * keep);
                    left = rest;
                    bytes.truncate(40 + first);
                    bytes[8..16].copy_from_slice(&((first + rest) as u64).to_le_bytes());
                }
                self.op(DATA, &bytes);
                continue;
            }
            let mut how = Vec::new();
            for fd in &fds {
                let stat = fs::fstat(fd).unwrap();
                if fs::FileType::from_raw_mode(stat.st_mode) == fs::FileType::Socket {
                    // A channel end, or (last, in a fragmented message) the
                    // fragment socket: the header's kinds say which.
                    how.push(1);
                } else {
                    let size = stat.st_size as u64;
                    let mut first = vec![0u8; (size as usize).min(keep)];
                    let n = rustix::io::pread(fd, &mut first, 0).unwrap_or(0);
                    first.truncate(n);
                    let size = size.min(u64::from(MAX_REGION)) as u32;
                    let mut op = size.to_le_bytes().to_vec();
                    op.extend_from_slice(&first);
                    self.op(REGION, &op);
                    how.push(2 + self.regions);
                    self.regions = self.regions.saturating_add(1);
                }
            }
            let mut op = bytes.clone();
            op.extend_from_slice(&how);
            self.op(FDS, &op);
            if body == 1 {
                let carrier = fds.last().unwrap();
                loop {
                    let (mut fragment, _) = recv(carrier);
                    if fragment.is_empty() {
                        break;
                    }
                    fragment.truncate(keep.min(left));
                    left -= fragment.len();
                    if !fragment.is_empty() {
                        self.op(FRAGMENT, &fragment);
                    }
                }
            }
            body = 0;
        }
    }

    /// The script.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// One packet and its descriptors (an empty packet with none: the end).
fn recv(fd: &OwnedFd) -> (Vec<u8>, Vec<OwnedFd>) {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut buf = vec![0u8; 1 << 20];
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(64))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = net::recvmsg(
        fd,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .unwrap();
    buf.truncate(msg.bytes);
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    (buf, fds)
}
