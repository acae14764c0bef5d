//! The channel's `try_send`, `send`, `try_recv` and `recv`, and the
//! blocking receive's claim ahead of `tail` (see the parent module's docs).

use std::time::Instant;

use super::{
    at_or_past, Block, Channel, Claim, ListToken, ABANDON, BLOCK_CAP, GONE, HAS_NEXT, LAP, SHIFT,
    WRITE,
};
use crate::chan::context::{Context, Operation};
use crate::chan::err::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::chan::wait_list::loom_seqcst_fence;
use crate::sync::atomic::Ordering;

impl<T> Channel<T> {
    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.send(msg, None).map_err(|e| match e {
            SendTimeoutError::Disconnected(m) => TrySendError::Disconnected(m),
            SendTimeoutError::Timeout(_) => unreachable!("an unbounded send never waits"),
        })
    }

    pub(crate) fn send(
        &self,
        msg: T,
        _deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        let token = &mut ListToken::default();
        self.reserve_send(token);
        // SAFETY: `reserve_send` always succeeds, once for this token.
        unsafe { self.write_reserved(token, msg) }.map_err(SendTimeoutError::Disconnected)
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let token = &mut ListToken::default();
        if self.reserve_recv(token) {
            // SAFETY: `reserve_recv` returned true for this token.
            unsafe { self.read_reserved(token) }.map_err(|()| TryRecvError::Disconnected)
        } else {
            Err(TryRecvError::Empty)
        }
    }

    /// Receives: the common case inline (a backlog, `HAS_NEXT`: the message is there, or its
    /// sender is writing it), everything else out of line, so that the callers' frames carry
    /// only what the common case needs.
    #[inline]
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        let token = &mut ListToken::default();
        match self.claim(token, false) {
            Claim::Filled => {
                // SAFETY: `claim` claimed this position for this call.
                let got = unsafe { self.read_reserved(token) };
                got.map_err(|()| RecvTimeoutError::Disconnected)
            }
            Claim::No => self.recv_slow(deadline),
            // Without `ahead`, a claim is `Filled` or nothing.
            Claim::Ahead(_) => unreachable!("a claim that may not claim ahead did"),
        }
    }

    /// [`recv`](Self::recv) in every case.
    #[inline(never)]
    fn recv_slow(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        // No time to wait: a position claimed ahead would only be given up again. (Not under
        // loom, whose models pass a deadline already passed to reach that giving up, which a
        // real deadline reaches when it passes during the claim.)
        if !cfg!(loom) && deadline.is_some_and(|d| Instant::now() >= d) {
            return self.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            });
        }
        let token = &mut ListToken::default();
        loop {
            let ready = match self.claim(token, true) {
                Claim::Filled => true,
                // Given up: the position is abandoned; `tail` tells empty from disconnected.
                Claim::Ahead(position) => {
                    self.wait_claimed(token, position, deadline) || self.reserve_recv(token)
                }
                // Fast path, then a spin while a sender is about to deliver.
                Claim::No => {
                    self.reserve_recv(token)
                        || self
                            .receivers
                            .poll_spinning_first(deadline, || {
                                self.reserve_recv(token).then_some(())
                            })
                            .is_some()
                }
            };
            if ready {
                // SAFETY: the token holds a position claimed by this call and, if it was
                // claimed ahead, written.
                let got = unsafe { self.read_reserved(token) };
                return got.map_err(|()| RecvTimeoutError::Disconnected);
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(RecvTimeoutError::Timeout);
                }
            }
            self.receivers
                .park_unless(Operation::hook(token), deadline, false, || {
                    !self.is_empty() || self.is_disconnected()
                });
        }
    }

    /// Claims the position at `head` without reading `tail`. With `HAS_NEXT` a message is
    /// there (or its sender is writing it): [`Claim::Filled`], as `reserve_recv` would have
    /// claimed it, minus a second look at `head`. Otherwise, if `ahead` allows, the position
    /// may be ahead of every sender (see "Receivers that claim ahead" in the module docs):
    /// [`Claim::Ahead`]. [`Claim::No`]: not here (the first block, a block's last slot, a lost
    /// race, or no `HAS_NEXT` and not `ahead`).
    #[inline(always)]
    fn claim(&self, token: &mut ListToken, ahead: bool) -> Claim {
        let head = self.head.index.load(Ordering::Acquire);
        let block = self.head.block.load(Ordering::Acquire);
        let offset = (head >> SHIFT) % LAP;
        if (!ahead && head & HAS_NEXT == 0) || offset + 1 >= BLOCK_CAP || block.is_null() {
            return Claim::No;
        }
        // SYNC POINT: as in `reserve_recv_loop` (SeqCst: the registering re-check and the
        // senders' Dekker pair with the wait list order claims against `tail`'s CAS). The step
        // keeps `HAS_NEXT`, as `next_head` does.
        let claimed = self
            .head
            .index
            .compare_exchange(
                head,
                head + (1 << SHIFT),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok();
        if !claimed {
            return Claim::No;
        }
        token.block = block as *const u8;
        token.offset = offset;
        match head & HAS_NEXT != 0 {
            true => Claim::Filled,
            false => Claim::Ahead(head),
        }
    }

    /// Waits for the message at `position`, claimed ahead into `token`, spinning and polling as
    /// a receiver of an empty channel does, until `deadline` at the latest, or until the
    /// senders disconnect. `false`: the wait ended and no sender had claimed the position: it is
    /// given up for good.
    fn wait_claimed(&self, token: &ListToken, position: usize, deadline: Option<Instant>) -> bool {
        // SAFETY: the block is live until our slot is finished, which is up to us.
        let slot = unsafe { &(*(token.block as *const Block<T>)).slots[token.offset] };
        // SYNC POINT: partner: the sender's Release store of WRITE; `read_reserved` reads the
        // message after its own Acquire load of the state.
        let written = || slot.state.load(Ordering::Acquire) & WRITE != 0;
        if written() {
            return true;
        }
        // Spin on the slot alone, then poll between yields until the message, the deadline or
        // the senders' disconnection. The disconnect mark is on `tail`, which this wait stays
        // off; the wait list keeps a copy, on a line that waiters write as they register, so
        // only the polls between yields read it (reading it in the spin too measures the same,
        // within the noise of `AB_CAP=unbounded AB_RECEIVERS=4 buffered_ab 4 5 barrier`).
        if self
            .receivers
            .spin(&mut || written().then_some(()))
            .is_none()
        {
            let _ = self.receivers.poll(deadline, || {
                (written() || self.receivers.is_disconnected()).then_some(())
            });
        }
        if written() {
            return true;
        }
        // SYNC POINT: the receiver's half of the Dekker pair in `write_reserved` (module docs).
        // Until WRITE or ABANDON the state is 0, so a CAS says all a `fetch_or` would.
        if slot
            .state
            .compare_exchange(0, ABANDON, Ordering::SeqCst, Ordering::Acquire)
            .is_err()
        {
            return true;
        }
        loom_seqcst_fence();
        let tail = self.tail.index.load(Ordering::SeqCst);
        if at_or_past(position, tail) {
            // No sender had claimed it; the one that does will see ABANDON and wait for this.
            slot.state.fetch_or(GONE, Ordering::Release);
            return false;
        }
        // A sender has claimed it, and may not have seen the mark: withdraw it and wait for the
        // write. The CAS fails only if that sender's plain store of WRITE already erased it.
        let _ = slot
            .state
            .compare_exchange(ABANDON, 0, Ordering::AcqRel, Ordering::Acquire);
        slot.wait_write();
        true
    }

    // ===== `Select::ready` support =====

    pub(crate) fn watch_recv(&self, oper: Operation, cx: &Context) -> bool {
        self.receivers.watch(oper, cx);
        !self.is_empty() || self.is_disconnected()
    }

    pub(crate) fn unwatch_recv(&self, oper: Operation) {
        self.receivers.unwatch(oper);
    }
}
