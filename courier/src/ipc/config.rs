//! Process-wide settings of the `ipc` layer.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// How a message too large for one packet travels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LargeMessages {
    /// Copied once into a pooled, sealed memfd region whose descriptor is
    /// sent: one copy in, one copy out, no fragment stream, and a sender that
    /// does not wait for the receiver to read, up to
    /// [`Config::max_region_bytes_in_flight`] (the default).
    #[default]
    SharedMemory,
    /// Fragmented over a socket dedicated to the message, as ipc-channel
    /// does: the send blocks until the receiver has read all but the last
    /// socket buffer's worth.
    Fragments,
}

/// Settings that apply to every channel of the process.
///
/// ```
/// use courier::ipc::Config;
/// let mut config = Config::global();
/// config.max_message_size = 64 << 20; // refuse messages above 64 MiB
/// Config::set_global(config);
/// # Config::set_global(Config::default());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The largest payload a receiver accepts, in bytes (default 1 GiB).
    /// A message that claims more is refused before anything is allocated.
    /// A receiver can lower or raise it for itself
    /// (`IpcReceiver::set_max_message_size`).
    pub max_message_size: u64,
    /// How messages too large for one packet (about 208 KiB with Linux's
    /// default socket buffer) travel. With `SharedMemory` (the default),
    /// messages over 7 KiB up to one packet also go through a region once
    /// the receiver holds one that is free (after its first such message,
    /// which passes the descriptor, no descriptor is passed: two copies beat
    /// the kernel's from 8 KiB), and through the socket otherwise; with
    /// `Fragments`, no region is ever used.
    pub large_messages: LargeMessages,
    /// How long a receiver waits for the rest of a fragmented message, or
    /// for the whole of a streamed region payload (1 MiB and up), before it
    /// gives up with `WireError::FragmentTimeout` (default 30 s): the time
    /// receives spend waiting for the rest, or, for a receive that may not
    /// block and gets none of it, this long since any of it last came. A
    /// blocking `recv` of such a message waits for it; `try_recv`,
    /// a timed receive past its deadline, and a receiver set's reads wait
    /// about a millisecond, then return empty-handed and leave the message
    /// to the next receive, which goes on where the last stopped. So a peer
    /// that begins a message and never completes it delays a set's other
    /// channels by about that millisecond per select, not by this timeout.
    pub fragment_timeout: Duration,
    /// How many payload bytes a sender may have in flight to one receiver in
    /// shared-memory regions (sent, and not yet copied out by it) before its
    /// large messages go in fragments instead (default 256 MiB; threads
    /// sending at once can each take it one message past). The regions
    /// themselves are rounded up to a power of two, so the memory they hold
    /// is up to twice this. A region message
    /// never waits for its receiver, so without a bound a receiver that
    /// stops reading (stuck, or hostile) would let its sender create a region
    /// for every message the socket buffer has room for, each as large as
    /// the message: gigabytes, charged to the sender. A fragmented send
    /// waits for the receiver to read, as a socket does: back-pressure. (So
    /// a thread that sends more than this to itself before it receives
    /// blocks for good, as it would with ipc-channel far sooner.) A single
    /// message larger than the bound still goes by region when nothing else
    /// is in flight.
    pub max_region_bytes_in_flight: u64,
    /// How deeply a typed message's value may nest (default 128, as
    /// `serde_json`'s limit): structs, enums, options, sequences and maps
    /// within each other. Decoding recurses once per level, so without a
    /// limit a message of a recursive type (a tree, a linked list) a few
    /// hundred kilobytes long would overflow the receiving thread's stack;
    /// past it, the message fails with [`WireError::TooDeep`].
    ///
    /// [`WireError::TooDeep`]: super::WireError::TooDeep
    pub max_decode_depth: u32,
    /// How much memory decoding a typed message may allocate, as a multiple
    /// of the message's size (default 8), and never less than
    /// [`DECODE_BUDGET_MIN`] (16 MiB). A message's size bounds what it
    /// costs to receive, but not what it decodes to: an empty `Vec` is one
    /// byte on the wire and 24 in memory, and a sequence of zero-sized
    /// elements is no bytes at all. So decoding charges every sequence and
    /// map element (its in-memory size, growing as the collection does) and
    /// every string, and fails the message with [`WireError::DecodeBudget`]
    /// before it would allocate more; no element count a peer claims is
    /// trusted. Values behind a `Box` inside a collection's elements are
    /// not charged (see SECURITY.md).
    ///
    /// [`WireError::DecodeBudget`]: super::WireError::DecodeBudget
    pub decode_budget_factor: u32,
    /// Whether a sender's small messages travel through a ring of shared
    /// memory it sets up with its receiver on its second send (default
    /// `true`, or `false` if the environment variable `COURIER_IPC_RING` is
    /// `0` or `off` when the process first reads its settings). Messages up
    /// to [`RING_RECORD_MAX`] bytes then cost no system call while the
    /// receiver is awake; a receiver that waits spins briefly and then
    /// sleeps on its socket, and a sender rings it only then. Messages that
    /// carry descriptors or are larger keep their routes, and each sender's
    /// order holds across them (see `docs/ring.md`). With `false`, every
    /// message goes through the socket, as ipc-channel's do.
    pub ring: bool,
    /// Whether a receiver waiting for ring messages spins until one comes
    /// instead of sleeping (default `false`): the lowest latency a shared
    /// ring gives, for a whole CPU per waiting receiver. Its socket (other
    /// senders, disconnection) is still looked at every few microseconds.
    pub busy_poll: bool,
}

/// The largest message, in bytes, that travels through a sender's ring
/// (see [`Config::ring`]); larger ones take the socket or a region.
pub const RING_RECORD_MAX: usize = crate::ipc::transport::ring::PAYLOAD_MAX;

/// The smallest decoding budget a message gets, whatever its size (see
/// [`Config::decode_budget_factor`]).
pub const DECODE_BUDGET_MIN: u64 = 16 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            max_message_size: 1 << 30,
            large_messages: LargeMessages::SharedMemory,
            fragment_timeout: Duration::from_secs(30),
            max_region_bytes_in_flight: 256 << 20,
            max_decode_depth: 128,
            decode_budget_factor: 8,
            ring: true,
            busy_poll: false,
        }
    }
}

static MAX_MESSAGE_SIZE: AtomicU64 = AtomicU64::new(1 << 30);
static LARGE_MESSAGES: AtomicU8 = AtomicU8::new(0);
static FRAGMENT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(30_000);
static REGION_BYTES_IN_FLIGHT: AtomicU64 = AtomicU64::new(256 << 20);
static DECODE_DEPTH: AtomicU32 = AtomicU32::new(128);
static DECODE_FACTOR: AtomicU32 = AtomicU32::new(8);
/// `RING_UNSET` until the settings are first read (then the environment
/// decides), else `RING_ON` or `RING_OFF`.
static RING: AtomicU8 = AtomicU8::new(RING_UNSET);
static BUSY_POLL: AtomicBool = AtomicBool::new(false);
const RING_UNSET: u8 = 0;
const RING_ON: u8 = 1;
const RING_OFF: u8 = 2;

// Relaxed everywhere below: each setting is an independent value, read at
// the start of an operation; no other memory is published through them.

impl Config {
    /// The settings in force.
    pub fn global() -> Config {
        Config {
            max_message_size: MAX_MESSAGE_SIZE.load(Ordering::Relaxed),
            large_messages: Self::large_messages_now(),
            fragment_timeout: Duration::from_millis(FRAGMENT_TIMEOUT_MS.load(Ordering::Relaxed)),
            max_region_bytes_in_flight: REGION_BYTES_IN_FLIGHT.load(Ordering::Relaxed),
            max_decode_depth: DECODE_DEPTH.load(Ordering::Relaxed),
            decode_budget_factor: DECODE_FACTOR.load(Ordering::Relaxed),
            ring: Self::ring_now(),
            busy_poll: Self::busy_poll_now(),
        }
    }

    /// Replaces the settings for operations that start from now on.
    pub fn set_global(config: Config) {
        MAX_MESSAGE_SIZE.store(config.max_message_size, Ordering::Relaxed);
        LARGE_MESSAGES.store(config.large_messages as u8, Ordering::Relaxed);
        let ms = u64::try_from(config.fragment_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        FRAGMENT_TIMEOUT_MS.store(ms, Ordering::Relaxed);
        REGION_BYTES_IN_FLIGHT.store(config.max_region_bytes_in_flight, Ordering::Relaxed);
        DECODE_DEPTH.store(config.max_decode_depth, Ordering::Relaxed);
        DECODE_FACTOR.store(config.decode_budget_factor, Ordering::Relaxed);
        let ring = if config.ring { RING_ON } else { RING_OFF };
        RING.store(ring, Ordering::Relaxed);
        BUSY_POLL.store(config.busy_poll, Ordering::Relaxed);
    }

    /// [`Config::ring`] in force: the environment's word until a program
    /// sets it.
    pub(crate) fn ring_now() -> bool {
        match RING.load(Ordering::Relaxed) {
            RING_ON => true,
            RING_OFF => false,
            _ => {
                let off = std::env::var("COURIER_IPC_RING")
                    .is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false" | "no"));
                let ring = if off { RING_OFF } else { RING_ON };
                // A program's own setting, if one raced in, wins.
                let _ =
                    RING.compare_exchange(RING_UNSET, ring, Ordering::Relaxed, Ordering::Relaxed);
                RING.load(Ordering::Relaxed) == RING_ON
            }
        }
    }

    /// [`Config::busy_poll`] in force.
    #[inline]
    pub(crate) fn busy_poll_now() -> bool {
        BUSY_POLL.load(Ordering::Relaxed)
    }

    /// The limits on decoding a typed message of `len` bytes in force
    /// ([`Config::max_decode_depth`], [`Config::decode_budget_factor`]).
    pub(crate) fn decode_limits_now(len: usize) -> DecodeLimits {
        let factor = u64::from(DECODE_FACTOR.load(Ordering::Relaxed));
        DecodeLimits {
            depth: DECODE_DEPTH.load(Ordering::Relaxed),
            budget: factor.saturating_mul(len as u64).max(DECODE_BUDGET_MIN),
        }
    }

    /// [`Config::max_region_bytes_in_flight`] in force.
    pub(crate) fn max_region_bytes_in_flight_now() -> u64 {
        REGION_BYTES_IN_FLIGHT.load(Ordering::Relaxed)
    }

    /// [`Config::max_message_size`] in force (one load, for the receive path).
    #[inline]
    pub(crate) fn max_message_size_now() -> u64 {
        MAX_MESSAGE_SIZE.load(Ordering::Relaxed)
    }

    /// [`Config::large_messages`] in force (one load, for the send path).
    #[inline]
    pub(crate) fn large_messages_now() -> LargeMessages {
        match LARGE_MESSAGES.load(Ordering::Relaxed) {
            0 => LargeMessages::SharedMemory,
            _ => LargeMessages::Fragments,
        }
    }
}

/// What decoding one typed message may do (see [`Config::decode_limits_now`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeLimits {
    /// Levels of nesting.
    pub depth: u32,
    /// Bytes it may allocate.
    pub budget: u64,
}
