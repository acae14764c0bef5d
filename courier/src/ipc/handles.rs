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

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use postcard::ser_flavors::Flavor;
use serde::de::DeserializeOwned;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::err::SerDeError;
use super::platform::{Backlog, OsReceiver};

thread_local! {
    /// Descriptors of the channel ends in the message being serialized.
    static OUTGOING: RefCell<Option<Vec<OwnedFd>>> = const { RefCell::new(None) };
    /// Descriptors that arrived with the message being deserialized.
    static INCOMING: RefCell<Option<Vec<Option<OwnedFd>>>> = const { RefCell::new(None) };
}

/// Serializes `value` into `buf` (replacing its contents) while collecting
/// the descriptors of the channel ends inside it, then calls `send` with the
/// bytes and the descriptors.
pub(crate) fn serialize_message<T: Serialize + ?Sized, R>(
    value: &T,
    buf: &mut Vec<u8>,
    send: impl FnOnce(&[u8], &[BorrowedFd<'_>]) -> R,
) -> Result<R, SerDeError> {
    buf.clear();
    let outer = OUTGOING.with(|o| o.borrow_mut().replace(Vec::new()));
    let serialized = postcard::serialize_with_flavor(value, VecFlavor(buf));
    let owned = OUTGOING
        .with(|o| std::mem::replace(&mut *o.borrow_mut(), outer))
        .unwrap_or_default();
    serialized?;
    let fds: Vec<BorrowedFd<'_>> = owned.iter().map(|fd| fd.as_fd()).collect();
    Ok(send(buf, &fds))
}

/// Deserializes a `T` from `bytes` while the descriptors `fds` are available
/// to the channel ends inside it; closes the ones nobody took.
pub(crate) fn deserialize_message<T: DeserializeOwned>(
    bytes: &[u8],
    fds: Vec<OwnedFd>,
) -> Result<T, SerDeError> {
    let table = if fds.is_empty() {
        None
    } else {
        Some(fds.into_iter().map(Some).collect())
    };
    let outer = INCOMING.with(|i| std::mem::replace(&mut *i.borrow_mut(), table));
    let result = postcard::from_bytes(bytes);
    let unclaimed = INCOMING.with(|i| std::mem::replace(&mut *i.borrow_mut(), outer));
    drop(unclaimed); // closes every descriptor no channel end claimed
    Ok(result?)
}

/// A postcard output that appends to a borrowed, reused `Vec`: one
/// `extend_from_slice` per field, so `serde_bytes` payloads go as one copy.
struct VecFlavor<'a>(&'a mut Vec<u8>);

impl Flavor for VecFlavor<'_> {
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

/// Writes a channel end as the index of its descriptor in the outgoing table.
pub(crate) fn serialize_fd<S: Serializer>(
    fd: BorrowedFd<'_>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let index = OUTGOING.with(|o| {
        o.borrow_mut().as_mut().map(|table| {
            // `F_DUPFD_CLOEXEC`: the copy lives until the message is sent.
            let copy = fd.try_clone_to_owned()?;
            table.push(copy);
            Ok::<_, std::io::Error>(table.len() - 1)
        })
    });
    match index {
        Some(Ok(index)) => (index as u32).serialize(serializer),
        Some(Err(e)) => Err(S::Error::custom(format!(
            "cannot duplicate a channel descriptor: {e}"
        ))),
        None => Err(S::Error::custom(
            "a courier channel can only be serialized by an IPC send",
        )),
    }
}

/// Writes a receiving end: its descriptor's index, then what it had read off
/// its socket but not handed out, which leaves with it (the sending process
/// keeps nothing of it, so nothing arrives twice or is lost).
pub(crate) fn serialize_receiver<S: Serializer>(
    os: &OsReceiver,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    (FdIndex(os.fd()), os.take_backlog()).serialize(serializer)
}

/// Reads a receiving end written by [`serialize_receiver`].
pub(crate) fn deserialize_receiver<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<OsReceiver, D::Error> {
    let (fd, backlog) = <(Descriptor, Option<Backlog>)>::deserialize(deserializer)?;
    match backlog {
        None => Ok(OsReceiver::from_fd(fd.0)),
        Some(backlog) => OsReceiver::with_backlog(fd.0, backlog)
            .map_err(|e| D::Error::custom(format!("a moved receiver's backlog: {e}"))),
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

/// Reads a channel end's index and takes its descriptor from the incoming table.
pub(crate) fn deserialize_fd<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<OwnedFd, D::Error> {
    let index = u32::deserialize(deserializer)? as usize;
    INCOMING.with(|i| {
        let mut table = i.borrow_mut();
        let slot = table
            .as_mut()
            .ok_or_else(|| D::Error::custom("no descriptors arrived with this message"))?
            .get_mut(index)
            .ok_or_else(|| D::Error::custom(format!("channel index {index} out of range")))?;
        slot.take()
            .ok_or_else(|| D::Error::custom(format!("channel index {index} used twice")))
    })
}
