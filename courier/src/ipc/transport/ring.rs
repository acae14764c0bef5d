//! The shared-memory ring: a sender's small messages, written into memory
//! its receiver maps, with no system call while the receiver is awake.

/// Bytes of the ring's record area.
pub(crate) const DATA_LEN: usize = 64 << 10;
/// The largest record (its 8-byte head included).
pub(crate) const RECORD_MAX: usize = 8 << 10;
/// The largest message that travels through the ring.
pub(crate) const PAYLOAD_MAX: usize = RECORD_MAX - 8 - crate::ipc::wire::HEADER_LEN;
