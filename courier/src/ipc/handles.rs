//! Channels inside messages: the descriptor tables serde works against.
//!
//! A channel end cannot be written into a byte stream; its descriptor has to
//! travel beside the bytes (`SCM_RIGHTS`). While a message is serialized,
//! every channel end found in it appends its descriptor to the thread's
//! *outgoing* table and writes only its index. While a message is
//! deserialized, the descriptors that arrived with it sit in the thread's
//! *incoming* table, and each channel end takes its own by index.
//!
//! Unlike ipc-channel, an index from the wire is checked: out of range or
//! taken twice is a [`SerDeError`], never a panic, and descriptors that no
//! channel end claimed are closed when deserialization ends (no fd leak).
//!
//! The outgoing table holds *duplicates* of the descriptors, owned until the
//! message is sent: a `Serialize` impl may serialize a temporary channel end
//! that is dropped before the send, and a borrowed number would then name a
//! closed descriptor, or worse, an unrelated file opened meanwhile.
//!
//! # Large byte strings go straight from the caller's memory
//! A `serde_bytes` field (or a long string) is handed to the serializer as a
//! slice that is only valid during that one call, so a serializer cannot
//! keep it for a later `sendmsg`. When the first walk over a message meets
//! such a slice that outweighs what came before it, it writes everything
//! else and notes where the slice belongs; a second walk then sends the
//! message *from inside the call that hands over the slice*, gathering the
//! first walk's bytes around it: the payload is copied once, by the kernel
//! (or once into a shared-memory region), as on a bytes channel. Two walks
//! over one value are serde practice (bincode 1 sized every message that
//! way). A `Serialize` impl whose second walk meets the slice at another
//! place or with another length is caught there, and the message is
//! serialized a third time, as a whole; one whose walks differ only in the
//! bytes (a value changing while it is serialized, through interior
//! mutability) sends the first walk's bytes around the second walk's slice,
//! a snapshot no less consistent than one walk over a changing value gives.
//! Channel ends and backlogs are taken on the first walk only and written
//! again, by index, on the later ones.

use std::cell::{Cell, RefCell};
use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use postcard::ser_flavors::Flavor;
use serde::de::DeserializeOwned;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::bytes_seq;
use super::config::Config;
use super::err::SerDeError;
use super::err::WireError;
use super::fd::SharedFd;
use super::platform::{Os, Transport, FDS_PER_PACKET};
use super::shm::SharedRegion;
use super::split::{self, Layout, Parts};
use super::transport::{Backlog, OsReceiver};

thread_local! {
    /// What the channel ends in the message being serialized hand over.
    static OUTGOING: RefCell<Outgoing> = const { RefCell::new(Outgoing::IDLE) };
    /// Descriptors that arrived with the message being deserialized.
    static INCOMING: RefCell<Option<Vec<Option<OwnedFd>>>> = const { RefCell::new(None) };
    /// Bytes of shared memory the message being deserialized may still
    /// bring: its receiver's size limit less the message's own bytes.
    static REGION_BUDGET: Cell<u64> = const { Cell::new(0) };
}

/// The outgoing side of the message being serialized. One per thread, kept
/// between messages (cleared, not rebuilt); a send nested in a `Serialize`
/// impl sets the outer message's aside while it runs.
struct Outgoing {
    /// A message is being serialized for an IPC send.
    active: bool,
    /// The message's descriptors (duplicates, or shared), in order.
    fds: Vec<Held>,
    /// Each serialized receiver's backlog (see `serialize_receiver`), in order.
    backlogs: Vec<Option<Backlog>>,
    /// On a later walk: how many descriptors the first one found, and how
    /// many descriptors and receivers this walk has written so far.
    again: Option<Again>,
    /// On a later walk: which socket each of the first walk's descriptors
    /// is, so that a later walk meeting other ends, or the same in another
    /// order, is refused rather than sending one end in another's place.
    first: Vec<SocketId>,
}

/// A descriptor's file (device and inode), which its duplicates share.
type SocketId = (u64, u64);

fn socket_id(fd: BorrowedFd<'_>) -> Option<SocketId> {
    Os::identity(fd)
}

impl Outgoing {
    const IDLE: Outgoing = Outgoing {
        active: false,
        fds: Vec::new(),
        backlogs: Vec::new(),
        again: None,
        first: Vec::new(),
    };
}

#[derive(Clone, Copy)]
struct Again {
    fds: usize,
    next_fd: usize,
    next_receiver: usize,
}

/// A byte string at least this long may go straight from the caller's
/// memory (below it, a copy costs less than the second walk's overhead)...
const DIRECT_MIN: usize = 2048;
/// ... if it is at least this many times longer than what the message holds
/// before it (which the second walk serializes again, at a few ns a byte).
const DIRECT_RATIO: usize = 8;

/// Whether a byte string of `len` bytes, met after `before` other bytes,
/// is sent from the caller's memory. Both walks decide with this.
fn direct(len: usize, before: usize) -> bool {
    len >= DIRECT_MIN && len >= before.saturating_mul(DIRECT_RATIO)
}

/// Serializes `value` while collecting the descriptors of the channel ends
/// inside it, and sends it with `send`, which gets the message as gathered
/// parts and the descriptors. `buf` is scratch space (its contents are
/// replaced). See the module docs for when `value` is walked twice.
pub(crate) fn serialize_message<T: Serialize + ?Sized, R>(
    value: &T,
    buf: &mut Vec<u8>,
    send: impl FnOnce(&[IoSlice<'_>], &[BorrowedFd<'_>]) -> R,
) -> Result<R, SerDeError> {
    buf.clear();
    let _active = Active::enter();
    walk(value, buf, send)
}

/// The thread's outgoing table in use by one send, until dropped (also if a
/// `Serialize` impl panics): then the table is cleared, which closes the
/// duplicated descriptors, sent or not, and an outer send's table is back.
struct Active {
    /// The outer send's table, when this send is nested in its `Serialize`
    /// impl (rare: boxed, so that the usual send moves a word, not a table).
    outer: Option<Box<Outgoing>>,
}

impl Active {
    /// (While the thread's locals are torn down, as in a thread-local's `Drop` that sends, the
    /// table may be gone: the message is then sent without one, and a channel end in it fails
    /// to serialize, where a panic there would abort the process.)
    fn enter() -> Active {
        OUTGOING
            .try_with(|o| {
                let mut table = o.borrow_mut();
                let outer = table
                    .active
                    .then(|| Box::new(std::mem::replace(&mut *table, Outgoing::IDLE)));
                table.active = true;
                Active { outer }
            })
            .unwrap_or_else(|_| Active { outer: None })
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let outer = self.outer.take();
        let _ = OUTGOING.try_with(|o| {
            let mut table = o.borrow_mut();
            // Most messages carry no channel end and are walked once: the
            // table is as the send found it.
            if !table.fds.is_empty() || !table.backlogs.is_empty() || table.again.is_some() {
                table.fds.clear();
                table.backlogs.clear();
                table.again = None;
                table.first.clear();
            }
            table.active = false;
            if let Some(outer) = outer {
                *table = *outer;
            }
        });
    }
}

/// Calls `f` with the descriptors of `held`, borrowed: from the stack for
/// as many as one descriptor packet carries (no allocation a message).
fn borrowed<R>(held: &[Held], f: impl FnOnce(&[BorrowedFd<'_>]) -> R) -> R {
    // (Most messages carry a few: a short array to fill.)
    match held.len() {
        0 => f(&[]),
        1..=8 => on_stack::<8, R>(held, f),
        9..=FDS_PER_PACKET => on_stack::<FDS_PER_PACKET, R>(held, f),
        _ => f(&held.iter().map(AsFd::as_fd).collect::<Vec<_>>()),
    }
}

/// [`borrowed`] for at most `N` (and at least one) descriptors.
#[inline]
fn on_stack<const N: usize, R>(held: &[Held], f: impl FnOnce(&[BorrowedFd<'_>]) -> R) -> R {
    // (The places past `held.len()` repeat the first one, never read.)
    let mut fds = [held[0].as_fd(); N];
    for (fd, held) in fds.iter_mut().zip(held) {
        *fd = held.as_fd();
    }
    f(&fds[..held.len()])
}

fn walk<T: Serialize + ?Sized, R>(
    value: &T,
    buf: &mut Vec<u8>,
    send: impl FnOnce(&[IoSlice<'_>], &[BorrowedFd<'_>]) -> R,
) -> Result<R, SerDeError> {
    // The flavor owns the buffer while it writes (a `&mut Vec` would make
    // every byte's push reload and store the length through memory).
    let measure = Measure {
        buf: std::mem::take(buf),
        skipped: None,
    };
    let skipped;
    (*buf, skipped) = bytes_seq::serialize_with_flavor(value, measure)?;
    let Some(skip) = skipped else {
        // The common case, one walk: send with the table's descriptors.
        return Ok(send_aside(|held| {
            borrowed(held, |fds| send(&[IoSlice::new(buf)], fds))
        }));
    };
    let fds = OUTGOING.try_with(|o| {
        let mut table = o.borrow_mut();
        let table = &mut *table;
        table.again = Some(Again {
            fds: table.fds.len(),
            next_fd: 0,
            next_receiver: 0,
        });
        // (A `fstat` a channel end, on the rare message that carries ends
        // and is walked again.)
        let first = table.fds.iter().map(|fd| socket_id(fd.as_fd()));
        table.first = first.map(|id| id.unwrap_or((u64::MAX, u64::MAX))).collect();
        std::mem::take(&mut table.fds)
    });
    let fds = fds.unwrap_or_default();
    let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|fd| fd.as_fd()).collect();
    let mut replay = Replay {
        small: buf,
        skip,
        written: 0,
        met: false,
        send: Some(send),
        fds: &fds,
        sent: None,
    };
    let walked = bytes_seq::serialize_with_flavor(value, &mut replay);
    // Sent before a later part of the walk failed: the message is out, and
    // reporting the failure would invite a retry that sends it twice.
    if let Some(sent) = replay.sent {
        return Ok(sent);
    }
    walked?;
    let send = replay.send.take().expect("not sent, so not taken");
    // The second walk differed from the first: a third one writes it all.
    let _ = OUTGOING.try_with(|o| {
        if let Some(again) = &mut o.borrow_mut().again {
            again.next_fd = 0;
            again.next_receiver = 0;
        }
    });
    buf.clear();
    bytes_seq::serialize_with_flavor(value, Whole(buf))?;
    Ok(send_aside(|_| send(&[IoSlice::new(buf)], &fds)))
}

/// Runs `send` (given the table's descriptors) with the thread's table idle
/// meanwhile: a send may park its fiber while the channel is full, and the
/// fibers its worker runs then send through the thread's table too. A table
/// that holds something (descriptors, backlogs, a second walk's counts) is
/// set aside whole, the usual empty one is only marked idle; either way no
/// borrow of it is held across `send`, and it is back as it was after.
fn send_aside<R>(send: impl FnOnce(&[Held]) -> R) -> R {
    let mine = OUTGOING.try_with(|o| {
        let mut table = o.borrow_mut();
        table.active = false;
        if table.backlogs.is_empty() && table.again.is_none() {
            // Descriptors alone, or nothing: their list is all there is to
            // set aside (moved, not the whole table).
            match table.fds.is_empty() {
                true => Aside::Nothing,
                false => Aside::Fds(std::mem::take(&mut table.fds)),
            }
        } else {
            Aside::Whole(Box::new(std::mem::replace(&mut *table, Outgoing::IDLE)))
        }
    });
    // (The table is gone while the thread's locals are torn down: the
    // message can hold no channel end, and goes without descriptors.)
    let sent = match &mine {
        Ok(Aside::Fds(fds)) => send(fds),
        Ok(Aside::Whole(table)) => send(&table.fds),
        Ok(Aside::Nothing) | Err(_) => send(&[]),
    };
    if let Ok(mine) = mine {
        let _ = OUTGOING.try_with(|o| {
            let mut table = o.borrow_mut();
            match mine {
                Aside::Nothing => table.active = true,
                // (Back for its allocation; `Active` empties it.)
                Aside::Fds(fds) => {
                    table.fds = fds;
                    table.active = true;
                }
                Aside::Whole(mine) => *table = *mine,
            }
        });
    }
    sent
}

/// What [`send_aside`] keeps of the thread's table while a send runs.
enum Aside {
    /// Nothing: the usual message, which holds no channel end.
    Nothing,
    /// The message's descriptors (the rest of the table is empty).
    Fds(Vec<Held>),
    /// Everything (receivers' backlogs, or a later walk's counts; rare,
    /// so boxed: the usual send moves a word or three, not a table).
    Whole(Box<Outgoing>),
}

/// Where a byte string sent from the caller's memory belongs.
#[derive(Clone, Copy, Debug)]
struct Skip {
    /// Bytes of the message before it.
    at: usize,
    len: usize,
}

/// The first walk: writes the message into a buffer, except the first byte
/// string that [`direct`] picks, which it only notes.
struct Measure {
    buf: Vec<u8>,
    skipped: Option<Skip>,
}

impl Flavor for Measure {
    type Output = (Vec<u8>, Option<Skip>);

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.buf.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if self.skipped.is_none() && direct(bytes.len(), self.buf.len()) {
            self.skipped = Some(Skip {
                at: self.buf.len(),
                len: bytes.len(),
            });
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<(Vec<u8>, Option<Skip>)> {
        Ok((self.buf, self.skipped))
    }
}

/// The second walk: writes nothing, counts, and sends the message from
/// inside the call that hands over the skipped byte string, if that call
/// comes where the first walk met it.
struct Replay<'a, 'f, F, R> {
    /// What the first walk wrote.
    small: &'a [u8],
    skip: Skip,
    /// Bytes this walk would have written so far (before the string).
    written: usize,
    /// Whether [`direct`] picked a string on this walk yet.
    met: bool,
    send: Option<F>,
    fds: &'a [BorrowedFd<'f>],
    sent: Option<R>,
}

impl<F, R> Flavor for &mut Replay<'_, '_, F, R>
where
    F: FnOnce(&[IoSlice<'_>], &[BorrowedFd<'_>]) -> R,
{
    type Output = ();

    #[inline]
    fn try_push(&mut self, _: u8) -> postcard::Result<()> {
        self.written += 1;
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if self.met || !direct(bytes.len(), self.written) {
            self.written += bytes.len();
            return Ok(());
        }
        self.met = true;
        if (self.written, bytes.len()) == (self.skip.at, self.skip.len) {
            let (before, after) = self.small.split_at(self.skip.at);
            let parts = [
                IoSlice::new(before),
                IoSlice::new(bytes),
                IoSlice::new(after),
            ];
            let send = self.send.take().expect("sent once: `met` guards");
            let fds = self.fds;
            self.sent = Some(send_aside(|_| send(&parts, fds)));
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// A postcard output that appends to a borrowed, reused `Vec`: one
/// `extend_from_slice` per field, so `serde_bytes` payloads go as one copy.
struct Whole<'a>(&'a mut Vec<u8>);

impl Flavor for Whole<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Deserializes a `T` from `parts` while the descriptors `fds` are available
/// to the channel ends inside it; closes the ones nobody took. Sets `seen`
/// to where the message's first large byte string sat (see [`split`]).
/// `limit` is the receiver's size limit: the shared-memory regions in the
/// message may add up to what its bytes leave of it ([`open_region`]).
pub(crate) fn deserialize_message<T: DeserializeOwned>(
    parts: Parts<'_>,
    fds: Vec<OwnedFd>,
    seen: &Cell<Option<Layout>>,
    limit: u64,
) -> Result<T, SerDeError> {
    // `split` may deserialize twice, which must not run into taken channel
    // ends: a message that carries channels never arrives split.
    debug_assert!(parts.string.is_none() || fds.is_empty());
    let table = if fds.is_empty() {
        None
    } else {
        Some(fds.into_iter().map(Some).collect())
    };
    /// Puts the outer table back when the message is read, or when a
    /// `Deserialize` impl panics: dropping what it takes out closes every
    /// descriptor no channel end claimed.
    struct Restore(Option<Vec<Option<OwnedFd>>>, u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            let ours = INCOMING
                .try_with(|i| std::mem::replace(&mut *i.borrow_mut(), outer))
                .ok()
                .flatten();
            if let Some(mut table) = ours {
                // The descriptors no channel end took close here; the
                // vector goes back for the next receive, collected in place
                // (an `Option<OwnedFd>` is an `OwnedFd`'s size; `filter_map`
                // keeps the allocation, where `flatten` makes a new one).
                table.clear();
                #[allow(clippy::filter_map_identity)]
                let table = table.into_iter().filter_map(|fd| fd).collect();
                Os::recycle_fds(table);
            }
            let _ = REGION_BUDGET.try_with(|b| b.set(self.1));
        }
    }
    let own = parts.head.len() + parts.string.as_ref().map_or(0, Vec::len) + parts.tail.len();
    let budget = limit.saturating_sub(own as u64);
    // While the thread's locals are torn down (a receive in a thread-local's
    // `Drop`), the table is gone: the message's descriptors are closed here,
    // and a channel end in it is an error (`deserialize_fd`).
    let _restore = Restore(
        INCOMING
            .try_with(|i| std::mem::replace(&mut *i.borrow_mut(), table))
            .unwrap_or_default(),
        REGION_BUDGET.replace(budget),
    );
    // Every message goes through the adapter, even one too short to hold a
    // byte string worth splitting off: it is what reads a `Vec<u8>` field as
    // one byte string (`bytes_seq`), which pays from a few dozen bytes, and
    // what bounds decoding (`split`'s limits). A message with no byte
    // sequence pays ~50 instructions for it (callgrind, a 5-field struct).
    split::deserialize(parts, seen, Config::decode_limits_now(own))
}

/// A descriptor the outgoing table keeps open until the message is sent.
enum Held {
    /// A duplicate, made for the table.
    Copy(OwnedFd),
    /// A descriptor the table shares with its owner (an `IpcFd`): no system
    /// call to keep it open.
    Shared(SharedFd),
}

impl AsFd for Held {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Held::Copy(fd) => fd.as_fd(),
            Held::Shared(fd) => (**fd)
                .as_ref()
                .expect("a shared descriptor is open while a send holds it")
                .as_fd(),
        }
    }
}

/// Writes a descriptor (a channel end's, a region's) as its index in the
/// outgoing table, which keeps a duplicate of it open until the message is
/// sent.
pub(crate) fn serialize_fd<S: Serializer>(
    fd: BorrowedFd<'_>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serialize_held(fd, serializer, || {
        // `F_DUPFD_CLOEXEC`: the copy lives until the message is sent.
        fd.try_clone_to_owned()
            .map(Held::Copy)
            .map_err(|e| format!("cannot duplicate a descriptor: {e}"))
    })
}

/// [`serialize_fd`] for a descriptor shared by `Arc`: the table keeps a
/// reference, not a duplicate (no `dup` and `close` a descriptor).
pub(crate) fn serialize_shared_fd<S: Serializer>(
    fd: &SharedFd,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let borrowed = (**fd)
        .as_ref()
        .ok_or_else(|| S::Error::custom("an IpcFd without its descriptor"))?
        .as_fd();
    serialize_held(borrowed, serializer, || Ok(Held::Shared(Arc::clone(fd))))
}

fn serialize_held<S: Serializer>(
    fd: BorrowedFd<'_>,
    serializer: S,
    hold: impl FnOnce() -> Result<Held, String>,
) -> Result<S::Ok, S::Error> {
    let index = OUTGOING.try_with(|o| {
        let mut table = o.borrow_mut();
        let table = &mut *table;
        if !table.active {
            return Err("a courier channel can only be serialized by an IPC send".to_owned());
        }
        match &mut table.again {
            None => {
                table.fds.push(hold()?);
                Ok(table.fds.len() - 1)
            }
            Some(again) if again.next_fd < again.fds => {
                let index = again.next_fd;
                if socket_id(fd) != Some(table.first[index]) {
                    return Err(CHANGED.to_owned());
                }
                again.next_fd += 1;
                Ok(index)
            }
            Some(_) => Err(CHANGED.to_owned()),
        }
    });
    let index = index.unwrap_or_else(|_| {
        Err("a courier channel cannot be sent while its thread's locals are torn down".to_owned())
    });
    match index {
        // The same byte a `u32` below 128 is written as (postcard's
        // varint), pushed rather than copied from a scratch array.
        Ok(index @ 0..0x80) => (index as u8).serialize(serializer),
        Ok(index) => (index as u32).serialize(serializer),
        Err(why) => Err(S::Error::custom(why)),
    }
}

/// A later walk over a message met more channel ends than the first.
const CHANGED: &str = "the message changed while it was serialized";

/// Writes a receiving end: its descriptor's index, then what it had read off
/// its socket but not handed out, which leaves with it (the sending process
/// keeps nothing of it, so nothing arrives twice or is lost).
pub(crate) fn serialize_receiver<S: Serializer>(
    os: &OsReceiver,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    // The backlog is taken out of its slot while it is written (writing it
    // reaches the table again, for its descriptors), then put back.
    let slot = OUTGOING.try_with(|o| {
        let mut table = o.borrow_mut();
        let table = &mut *table;
        if !table.active {
            return None;
        }
        Some(match &mut table.again {
            None => {
                table.backlogs.push(os.take_backlog());
                table.backlogs.len() - 1
            }
            Some(again) => {
                again.next_receiver += 1;
                again.next_receiver - 1
            }
        })
    });
    let Some(slot) = slot.ok().flatten() else {
        // Not inside a send: fails at the descriptor, and takes nothing.
        return (FdIndex(os.fd()), None::<Backlog>).serialize(serializer);
    };
    let take = |o: &RefCell<Outgoing>| o.borrow_mut().backlogs.get_mut(slot).map(Option::take);
    let Some(backlog) = OUTGOING.with(take) else {
        return Err(S::Error::custom(CHANGED));
    };
    let written = (FdIndex(os.fd()), &backlog).serialize(serializer);
    OUTGOING.with(|o| {
        if let Some(kept) = o.borrow_mut().backlogs.get_mut(slot) {
            *kept = backlog;
        }
    });
    written
}

/// Checks that a descriptor can be a channel end: a `SOCK_SEQPACKET` Unix
/// socket connected to a peer. A peer may send any descriptor in an end's
/// place, and this names the fault when the message is read rather than at
/// the end's first use (a `getsockopt` and a `getpeername` a channel end
/// received). An unconnected or listening socket passes for one by type
/// alone, and then every read fails (`ENOTCONN`): never a message, never the
/// end of the stream. (A socket whose peer is gone is still connected, and
/// reads as disconnected, as it should.)
pub(crate) fn check_channel_end(fd: BorrowedFd<'_>) -> Result<(), WireError> {
    Os::check_channel_end(fd).map_err(WireError::BadDescriptor)
}

/// Reads a receiving end written by [`serialize_receiver`].
pub(crate) fn deserialize_receiver<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<OsReceiver, D::Error> {
    let (fd, backlog) = <(Descriptor, Option<Backlog>)>::deserialize(deserializer)?;
    check_channel_end(fd.0.as_fd()).map_err(split::fault)?;
    match backlog {
        None => Ok(OsReceiver::from_fd(fd.0)),
        Some(backlog) => {
            let charged = REGION_BUDGET.with(|b| {
                let mut budget = b.get();
                let receiver = OsReceiver::with_backlog(fd.0, backlog, &mut budget);
                b.set(budget);
                receiver
            });
            charged.map_err(split::fault)
        }
    }
}

/// A borrowed descriptor, written like [`Descriptor`].
struct FdIndex<'a>(BorrowedFd<'a>);

impl Serialize for FdIndex<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_fd(self.0, serializer)
    }
}

/// A descriptor that travels inside a message by its index in the
/// message's descriptor table, like a channel end.
#[derive(Debug)]
pub(crate) struct Descriptor(pub(crate) OwnedFd);

impl Serialize for Descriptor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_fd(self.0.as_fd(), serializer)
    }
}

impl<'de> Deserialize<'de> for Descriptor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_fd(deserializer).map(Descriptor)
    }
}

/// Reads a descriptor's index and takes the descriptor from the incoming table.
pub(crate) fn deserialize_fd<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<OwnedFd, D::Error> {
    let index = u32::deserialize(deserializer)? as usize;
    let taken = INCOMING.try_with(|i| {
        let mut table = i.borrow_mut();
        let slot = table
            .as_mut()
            .ok_or(WireError::BadDescriptor(
                "no descriptors arrived with this message",
            ))?
            .get_mut(index)
            .ok_or(WireError::BadDescriptor("descriptor index out of range"))?;
        slot.take()
            .ok_or(WireError::BadDescriptor("descriptor index used twice"))
    });
    let taken = taken.unwrap_or(Err(WireError::BadDescriptor(
        "a courier channel cannot be received while its thread's locals are torn down",
    )));
    taken.map_err(split::fault)
}

/// Maps a shared-memory region whose descriptor arrived with the message
/// being deserialized, and charges its size to the message's budget (see
/// [`deserialize_message`]).
pub(crate) fn open_region(fd: OwnedFd) -> Result<SharedRegion, WireError> {
    REGION_BUDGET.with(|b| {
        let mut budget = b.get();
        let region = SharedRegion::open(fd, &mut budget);
        b.set(budget);
        region
    })
}
