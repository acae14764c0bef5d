//! A blocked sender's message, lent to the receiver that frees a slot: the bounded flavors'
//! (`array`, `one`) hand-off.
//!
//! A sender that finds the channel full registers on the senders' wait list with a
//! [`SendPacket`] on its stack that holds its message, and parks. A receiver that frees a slot
//! claims a registered sender and, before waking it (outside the list's lock), moves the
//! packet's message into a slot it reserves, so the channel is full again at once and the next
//! receiver need not wait for the sender to be scheduled (Go's `chanrecv` does the same with a
//! waiting sender's value). If it finds no room (another sender got there first), it tells the
//! sender to retry with its message.
//!
//! ```text
//!   sender                               receiver (has claimed the sender's entry)
//!   ------                               --------
//!   packet = PENDING, message            reserve a slot
//!   register, re-check, park             ok:   move the message into it, DELIVERED
//!   claimed: wait until not PENDING      full: RETRY
//!   DELIVERED: done; RETRY: take the     unpark the sender
//!   message back and try again
//! ```

use std::mem::MaybeUninit;
use std::time::Instant;

use crate::chan::backoff::Backoff;
use crate::chan::context::{Context, Operation, Selected};
use crate::chan::wait_list::{Entry, SyncWaitList};
use crate::sync::atomic::{AtomicU8, Ordering};
use crate::sync::UnsafeCell;

/// A blocked sender's message, on its stack, for a receiver to move into a freed slot.
pub(crate) struct SendPacket<T> {
    /// Initialised while `state` is PENDING (and after RETRY: the sender takes it back).
    msg: UnsafeCell<MaybeUninit<T>>,
    state: AtomicU8,
}

/// The sender waits; its message is in the packet.
const PENDING: u8 = 0;
/// A receiver moved the message into the channel: the send is complete.
const DELIVERED: u8 = 1;
/// A receiver claimed the sender but found no room: the sender retries with its message.
const RETRY: u8 = 2;

impl<T> SendPacket<T> {
    /// The packet a blocked sender registered `entry` with; `None` for a `Select`'s
    /// registration, which only wants waking.
    ///
    /// # Safety
    /// The caller must ensure:
    /// - `entry` comes from the senders' wait list of a channel of `T`, on which only
    ///   [`wait_for_receiver`] registers packets;
    /// - the caller claimed `entry` (so the sender waits in [`wait`](Self::wait), and nobody
    ///   else touches the packet until its state leaves PENDING).
    #[inline]
    pub(crate) unsafe fn of(entry: &Entry) -> Option<&SendPacket<T>> {
        // SAFETY: a non-null packet registered by `wait_for_receiver` lives on the blocked
        // sender's stack until its state leaves PENDING, which only the claimer (the caller)
        // changes.
        (!entry.packet.is_null()).then(|| unsafe { &*(entry.packet as *const SendPacket<T>) })
    }

    /// Moves the message out to `write` (which puts it into the slot the caller reserved), then
    /// tells the sender its send is complete.
    ///
    /// # Safety
    /// The caller must ensure the packet came from [`of`](Self::of), and that it calls
    /// `deliver` or [`retry`](Self::retry) once.
    pub(crate) unsafe fn deliver(&self, write: impl FnOnce(T)) {
        // SAFETY: PENDING packets hold an initialised message; the caller moves it out once.
        let msg = self.msg.with(|p| unsafe { p.read().assume_init() });
        write(msg);
        // SYNC POINT: hands the packet back. Partner: the Acquire load in `wait`.
        self.state.store(DELIVERED, Ordering::Release);
    }

    /// Tells the sender that there was no room: it takes its message back and tries again.
    pub(crate) fn retry(&self) {
        // SYNC POINT: as in `deliver`.
        self.state.store(RETRY, Ordering::Release);
    }

    /// Waits (briefly: the claimer is running) until a claimer has decided; `true`: delivered.
    fn wait(&self) -> bool {
        let mut backoff = Backoff::new();
        loop {
            // SYNC POINT: partner: the Release stores in `deliver` and `retry`.
            match self.state.load(Ordering::Acquire) {
                PENDING => backoff.snooze(),
                state => return state == DELIVERED,
            }
        }
    }
}

/// Steps 1-3 of the blocking protocol for a sender of a full bounded channel: registers `oper`
/// on `senders` with `msg` in a hand-off packet, re-checks with `ready` (SeqCst loads: the
/// waiter's half of the Dekker pair in `SyncWaitList::register`) and aborts the wait if there
/// is room after all, then parks until a receiver claims it, the channel is disconnected or
/// `deadline` passes. With `poll_claim`, the sender polls its claim word before it parks.
///
/// `Ok(())`: a receiver moved the message into the channel. `Err(msg)`: the caller retries
/// its send (or reports the timeout or the disconnection) with the message.
pub(crate) fn wait_for_receiver<T>(
    senders: &SyncWaitList,
    oper: Operation,
    msg: T,
    deadline: Option<Instant>,
    poll_claim: bool,
    ready: impl FnOnce() -> bool,
) -> Result<(), T> {
    let packet = SendPacket {
        msg: UnsafeCell::new(MaybeUninit::new(msg)),
        state: AtomicU8::new(PENDING),
    };
    let delivered = Context::with(|cx| {
        senders.register_with_packet(oper, &packet as *const SendPacket<T> as *mut (), cx);
        if ready() {
            let _ = cx.try_select(Selected::Aborted);
        }
        match cx.wait_until(deadline, poll_claim) {
            Selected::Aborted | Selected::Disconnected => {
                senders.unregister(oper);
                false
            }
            // A receiver made room and claimed us: it moved the message into the slot it
            // freed (DELIVERED), or could not (RETRY).
            Selected::Operation(_) | Selected::Waiting => packet.wait(),
        }
    });
    if delivered {
        return Ok(());
    }
    // SAFETY: not delivered: no one else touches the packet any more, and its message is still
    // initialised (only `deliver` moves it out).
    Err(packet.msg.with(|p| unsafe { p.read().assume_init() }))
}
