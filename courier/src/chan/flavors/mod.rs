//! The channel algorithms, one per file, each a `Channel<T>` with the same verbs
//! (`start_send`/`write`, `start_recv`/`read`, `send`, `recv`, `len`, `disconnect_*`), dispatched
//! by `chan::Flavor`:
//!
//! | flavor | file | algorithm |
//! | --- | --- | --- |
//! | `bounded(n)`, n ≥ 1 | [`array`](mod@array) | Vyukov's bounded MPMC array queue (a stamp per slot) |
//! | `unbounded()` | [`list`] | a linked list of fixed-size blocks, one CAS per message |
//! | `bounded(0)` | [`zero`] | rendezvous: a direct hand-off between a sender and a receiver |
//!
//! An operation is split in two so that `Select` can pick one and then complete it:
//! `start_*` reserves (a slot, a position, or a peer) and records the reservation in a
//! [`Token`]; `write`/`read` (unsafe: they trust the token) complete it.
#![allow(unsafe_code)]

pub(crate) mod array;
pub(crate) mod list;
pub(crate) mod zero;

/// What `start_send`/`start_recv` reserved, for the `write`/`read` that completes it.
#[derive(Default)]
pub(crate) struct Token {
    pub(crate) array: array::ArrayToken,
    pub(crate) list: list::ListToken,
    pub(crate) zero: zero::ZeroToken,
    /// The select that reserves with this token has registered and parked once already: it
    /// spins before registering only the first time (`Select::spin_before_registering`).
    pub(crate) waited: bool,
}

impl Token {
    /// Does the token hold a reservation that only its `write`/`read` gives back (a slot, a
    /// position, or a claimed peer's packet)? Not after a reservation on a disconnected channel.
    pub(crate) fn is_reserved(&self) -> bool {
        self.array.is_reserved() || self.list.is_reserved() || self.zero.is_reserved()
    }
}
