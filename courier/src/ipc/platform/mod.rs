//! The transport contract between the portable `ipc` layer and an OS.

#[cfg(target_os = "linux")]
pub(crate) mod linux;

pub(crate) use linux::poller::Poller;
pub(crate) use linux::{futex, memfd, random, socket};

/// The most descriptors one packet carries (the receiver's control buffer
/// is sized for that many).
pub(crate) const FDS_PER_PACKET: usize = 64;

/// The longest header [`socket::send_small`] puts before a small payload.
pub(crate) const SMALL_HEAD: usize = 64;

/// What one receive of a packet delivered.
pub(crate) struct Packet<Fd> {
    /// Bytes written into the buffers, in order.
    pub len: usize,
    /// Descriptors that came with the packet, already owned: dropping the
    /// packet closes them.
    pub fds: Vec<Fd>,
    /// The packet was longer than the buffers (`MSG_TRUNC`); the rest is lost.
    pub truncated: bool,
    /// Descriptors were dropped for lack of room (`MSG_CTRUNC`).
    pub control_truncated: bool,
}
