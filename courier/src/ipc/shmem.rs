//! Shared memory that travels inside messages: ipc-channel's
//! `IpcSharedMemory`, over a sealed memfd.
//!
//! A region is created once, with its bytes, and then sent by embedding it
//! in a message, any number of times and to any number of processes; every
//! copy maps the same memory, so sending it costs a descriptor, not its
//! bytes. Serialized, a region is the index of its descriptor in the
//! message's table (see [`super::handles`]), or nothing for an
//! empty one.
#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::ops::Deref;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::handles::{self, Descriptor};
use super::shm::SharedRegion;

/// A region of shared memory that can be sent inside messages; every
/// process it reaches maps the same bytes. It dereferences to `[u8]`.
///
/// # Against ipc-channel
/// - A received region is checked before it is mapped: it must be shared
///   memory sealed against shrinking and growing (an unsealed one could be
///   truncated under the mapping and raise `SIGBUS` on the next read; ipc-channel
///   maps whatever it is given), and the regions of one message may add up to
///   no more than the receiver's size limit left after the message's bytes
///   (reading a region's pages allocates them). A region that fails is a
///   [`SerDeError`](crate::ipc::SerDeError), and its descriptor is closed.
/// - `clone` shares the mapping (a reference count); ipc-channel duplicates
///   the descriptor and maps it again, at every clone and at every send. The
///   bytes seen are the same either way: one memory, however many mappings.
/// - A dropped region (up to 32 MiB) stays mapped for a while, and one
///   that arrives is looked up there first: a region that goes out and
///   comes back (a buffer lent to a worker) finds its pages mapped, where a
///   fresh mapping would fault every page in again (~0.4 ms for 4 MiB
///   here). At most 4 regions and 32 MiB are kept, each with a descriptor;
///   [`IpcSharedMemory::unmap_dropped`] lets go of them at once.
/// - `from_bytes` writes the bytes into the file with `write(2)`, one pass
///   in the kernel, instead of a copy that faults in every page of a fresh
///   mapping; `from_byte(0, len)` touches nothing.
/// - [`IpcSharedMemory::try_from_bytes`] and [`try_from_byte`](IpcSharedMemory::try_from_byte)
///   report a failure to create the region (out of memory or descriptors),
///   where the ipc-channel names panic.
///
/// # Who may write
/// Every holder of a region, in every process it reached, may write it
/// ([`IpcSharedMemory::deref_mut`], unsafe for that reason), so the bytes
/// behind a `&[u8]` can change while it is held unless the application
/// keeps to one writer at a time, as with ipc-channel. A `&[u8]` whose bytes
/// change is outside Rust's rules, so code that cannot trust its peers
/// should copy a region out (`take`, `to_vec`) before it parses it: the
/// checks on arrival keep the mapping itself valid (no `SIGBUS`), not its
/// bytes still.
///
/// # Dropped regions stay mapped
/// A region whose last copy here is dropped stays mapped, parked: at most 4
/// regions and 32 MiB, oldest let go first; one that arrives again, as the
/// same open file (checked with `kcmp(2)`), reuses the mapping.
/// [`unmap_dropped`](Self::unmap_dropped) lets go of them at once. This
/// includes the regions of a message refused for a later field: they were
/// mapped and checked, and are dropped with the message.
///
/// ```
/// use courier::ipc::{self, IpcSharedMemory};
///
/// let (tx, rx) = ipc::channel::<IpcSharedMemory>().unwrap();
/// let region = IpcSharedMemory::from_bytes(b"a frame");
/// tx.send(region.clone()).unwrap();
/// let received = rx.recv().unwrap();
/// assert_eq!(&received[..], b"a frame");
/// assert_eq!(received, region);
/// ```
#[derive(Clone, Default)]
pub struct IpcSharedMemory {
    /// `None`: empty (no region: `mmap` cannot map zero bytes).
    region: Option<Arc<SharedRegion>>,
}

impl IpcSharedMemory {
    /// A region holding a copy of `bytes`.
    ///
    /// # Panics
    /// If the region cannot be created (out of memory or descriptors); see
    /// [`try_from_bytes`](Self::try_from_bytes).
    pub fn from_bytes(bytes: &[u8]) -> IpcSharedMemory {
        Self::try_from_bytes(bytes)
            .unwrap_or_else(|e| panic!("cannot create a shared memory region: {e}"))
    }

    /// A region of `length` bytes, each `byte`.
    ///
    /// # Panics
    /// If the region cannot be created; see [`try_from_byte`](Self::try_from_byte).
    pub fn from_byte(byte: u8, length: usize) -> IpcSharedMemory {
        Self::try_from_byte(byte, length)
            .unwrap_or_else(|e| panic!("cannot create a shared memory region: {e}"))
    }

    /// A region holding a copy of `bytes`, or why it could not be created.
    pub fn try_from_bytes(bytes: &[u8]) -> Result<IpcSharedMemory, io::Error> {
        if bytes.is_empty() {
            return Ok(IpcSharedMemory::default());
        }
        Ok(IpcSharedMemory::wrap(SharedRegion::from_bytes(bytes)?))
    }

    /// A region of `length` bytes, each `byte`, or why it could not be
    /// created. With `byte == 0` no page is touched until used (so memory
    /// that runs short later shows as `SIGBUS` at the page that cannot be
    /// had, as with any sparse mapping); any other byte is written in by the
    /// kernel, which reports a shortage as an error.
    pub fn try_from_byte(byte: u8, length: usize) -> Result<IpcSharedMemory, io::Error> {
        if length == 0 {
            return Ok(IpcSharedMemory::default());
        }
        let region = match byte {
            0 => SharedRegion::zeroed(length)?,
            _ => SharedRegion::filled(length, byte)?,
        };
        Ok(IpcSharedMemory::wrap(region))
    }

    fn wrap(region: SharedRegion) -> IpcSharedMemory {
        IpcSharedMemory {
            region: Some(Arc::new(region)),
        }
    }

    /// The bytes, writable.
    ///
    /// # Safety
    /// No other reference to these bytes may be in use meanwhile: not
    /// through a clone of this value, nor through a copy of the region in
    /// another process, which sees every write. (The same contract as
    /// ipc-channel's: keep to one holder at a time, for example by sending
    /// the region on and dropping it.)
    pub unsafe fn deref_mut(&mut self) -> &mut [u8] {
        match &self.region {
            // SAFETY: the mapping is `len()` bytes, writable, and lives as
            // long as `self`; the caller guarantees that nothing else reads
            // or writes it while the returned borrow lives.
            Some(region) => unsafe {
                std::slice::from_raw_parts_mut(region.as_ptr(), region.len())
            },
            None => &mut [],
        }
    }

    /// Lets go at once of the dropped regions this process keeps mapped in
    /// case they come back (see the module docs): their memory, unless
    /// another process still holds them, and their descriptors.
    pub fn unmap_dropped() {
        super::shm::unpark_all();
    }

    /// The bytes, copied into a vector (the region stays with whoever else
    /// holds it). Always `Some`: the `Option` is ipc-channel's signature.
    pub fn take(self) -> Option<Vec<u8>> {
        Some(self.to_vec())
    }
}

impl Deref for IpcSharedMemory {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        let Some(region) = &self.region else {
            return &[];
        };
        // What is assumed (as ipc-channel assumes it): nothing writes these
        // bytes while the slice is in use. Writers in this process are
        // excluded by `deref_mut`'s contract; a peer process that breaks it
        // can change the bytes under the slice (see the type's docs).
        // SAFETY: the mapping is `len()` bytes, readable, and lives as long
        // as `self`; no writer while the slice lives, as assumed above.
        unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) }
    }
}

impl PartialEq for IpcSharedMemory {
    /// Compares the bytes.
    fn eq(&self, other: &IpcSharedMemory) -> bool {
        **self == **other
    }
}

impl Eq for IpcSharedMemory {}

impl fmt::Debug for IpcSharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcSharedMemory")
            .field("len", &self.len())
            .field("bytes", &&self[..self.len().min(32)])
            .finish()
    }
}

impl Serialize for IpcSharedMemory {
    /// Writes the index of a duplicate of the region's descriptor, which
    /// the send passes along; only an IPC send can serialize a non-empty
    /// region.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.region
            .as_ref()
            .map(|region| RegionFd(region.fd()))
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for IpcSharedMemory {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Some(Descriptor(fd)) = Option::<Descriptor>::deserialize(deserializer)? else {
            return Ok(IpcSharedMemory::default());
        };
        let region = handles::open_region(fd).map_err(super::split::fault)?;
        Ok(IpcSharedMemory::wrap(region))
    }
}

/// A region's descriptor, written as its index in the outgoing table.
struct RegionFd<'a>(BorrowedFd<'a>);

impl Serialize for RegionFd<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        handles::serialize_fd(self.0, serializer)
    }
}
