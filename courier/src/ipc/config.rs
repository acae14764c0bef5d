//! Process-wide settings of the `ipc` layer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// Payloads of this many bytes or more travel through a pooled, sealed
    /// memfd region instead of the socket (default 64 KiB). `usize::MAX`
    /// turns regions off: large messages are then fragmented over a
    /// dedicated socket, as ipc-channel does.
    pub shm_threshold: usize,
    /// How long a receiver waits for the next fragment of a fragmented
    /// message before it gives up with `WireError::FragmentTimeout`
    /// (default 30 s).
    pub fragment_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { max_message_size: 1 << 30, shm_threshold: 64 * 1024, fragment_timeout: Duration::from_secs(30) }
    }
}

static MAX_MESSAGE_SIZE: AtomicU64 = AtomicU64::new(1 << 30);
static SHM_THRESHOLD: AtomicU64 = AtomicU64::new(64 * 1024);
static FRAGMENT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(30_000);

impl Config {
    /// The settings in force.
    pub fn global() -> Config {
        // Relaxed: each setting is an independent value, read at the start
        // of an operation; no other memory is published through them.
        Config {
            max_message_size: MAX_MESSAGE_SIZE.load(Ordering::Relaxed),
            shm_threshold: usize::try_from(SHM_THRESHOLD.load(Ordering::Relaxed)).unwrap_or(usize::MAX),
            fragment_timeout: Duration::from_millis(FRAGMENT_TIMEOUT_MS.load(Ordering::Relaxed)),
        }
    }

    /// [`Config::max_message_size`] in force (one load, for the receive path).
    #[inline]
    pub(crate) fn max_message_size_now() -> u64 {
        MAX_MESSAGE_SIZE.load(Ordering::Relaxed)
    }

    /// [`Config::shm_threshold`] in force (one load, for the send path).
    #[inline]
    pub(crate) fn shm_threshold_now() -> usize {
        usize::try_from(SHM_THRESHOLD.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// Replaces the settings for operations that start from now on.
    pub fn set_global(config: Config) {
        MAX_MESSAGE_SIZE.store(config.max_message_size, Ordering::Relaxed);
        SHM_THRESHOLD.store(config.shm_threshold as u64, Ordering::Relaxed);
        let ms = u64::try_from(config.fragment_timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        FRAGMENT_TIMEOUT_MS.store(ms, Ordering::Relaxed);
    }
}
