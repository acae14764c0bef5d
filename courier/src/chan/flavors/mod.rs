//! The channel algorithms, one per file, each a `Channel<T>` with the same verbs
//! (`start_send`/`write`, `start_recv`/`read`, `send`, `recv`, `len`, `disconnect_*`), dispatched
//! by `chan::Flavor`:
//!
//! | flavor | file | algorithm |
//! | --- | --- | --- |
//! | `bounded(n)`, n ≥ 2 | [`array`](mod@array) | Vyukov's bounded MPMC array queue (a stamp per slot) |
//! | `bounded(1)` | [`one`] | one slot whose state word is the whole channel |
//! | `unbounded()` | [`list`] | a linked list of fixed-size blocks, one CAS per message |
//! | `bounded(0)` | [`zero`] | rendezvous: a direct hand-off between a sender and a receiver |
//! | `after(d)`, `at(t)` | [`at`] | one message, due at an instant; readiness read from the clock |
//! | `tick(d)` | [`tick`] | a message every period; readiness read from the clock |
//! | `never()` | [`never`](mod@never) | no message, never disconnected |
//!
//! An operation is split in two so that `Select` can pick one and then complete it:
//! `start_*` reserves (a slot, a position, or a peer) and records the reservation in a
//! [`Token`]; `write`/`read` (unsafe: they trust the token) complete it.
//!
//! A sender that waits on a full `array` or `one` channel lends its message to the receiver
//! that frees a slot ([`hand_off`]).
#![allow(unsafe_code)]

pub(crate) mod array;
pub(crate) mod at;
pub(crate) mod hand_off;
pub(crate) mod list;
pub(crate) mod never;
pub(crate) mod one;
pub(crate) mod tick;
pub(crate) mod zero;

/// What `start_send`/`start_recv` reserved, for the `write`/`read` that completes it.
#[derive(Default)]
pub(crate) struct Token {
    pub(crate) array: array::ArrayToken,
    pub(crate) one: one::OneToken,
    pub(crate) list: list::ListToken,
    pub(crate) zero: zero::ZeroToken,
    /// The message a timer flavor's `start_recv` took (`at`, `tick`): the instant it was due.
    pub(crate) timer: Option<std::time::Instant>,
    /// The select that reserves with this token has registered and parked once already: it
    /// spins before registering only the first time (`Select::spin_before_registering`).
    pub(crate) waited: bool,
}

impl Token {
    /// Does the token hold a reservation that only its `write`/`read` gives back (a slot, a
    /// position, or a claimed peer's packet)? Not after a reservation on a disconnected channel.
    pub(crate) fn is_reserved(&self) -> bool {
        self.array.is_reserved()
            || self.one.is_reserved()
            || self.list.is_reserved()
            || self.zero.is_reserved()
    }
}
