//! A fiber's state word: how its parks and wake-ups meet (see `sched`'s
//! module docs for the diagram).
//!
//! Only the thread that runs the fiber touches the word: its home worker
//! once it has started (a wake-up from anywhere else travels to that worker
//! through its inbox, see `sched::unpark`), and before that whichever worker
//! took it off a run queue, which hands the fiber over with the queue's own
//! synchronisation. So it is a plain `Cell`: a park and a wake-up on one
//! worker cost no locked instruction.

use std::cell::Cell;

/// On a run queue (or about to be).
const QUEUED: u8 = 0;
/// Running.
const RUNNING: u8 = 1;
/// Running, with a wake-up token: its next park returns at once.
const NOTIFIED: u8 = 2;
/// Parked (suspended, or on its way to suspend): the next wake-up queues it.
const PARKED: u8 = 3;

/// The state of one fiber.
pub(crate) struct State(Cell<u8>);

impl State {
    /// A new fiber, queued to run.
    pub(crate) fn queued() -> State {
        State(Cell::new(QUEUED))
    }

    /// The worker starts a turn of the fiber: `true` if it was queued (new,
    /// or woken from a park). (A fiber that yielded is already `RUNNING`,
    /// or `NOTIFIED`, which the turn keeps.)
    #[inline]
    pub(crate) fn start_turn(&self) -> bool {
        let queued = self.0.get() == QUEUED;
        if queued {
            self.0.set(RUNNING);
        }
        queued
    }

    /// The running fiber is about to park: `false` if it had a wake-up
    /// token (taken now: the park returns at once), `true` if it is parked
    /// now and must suspend.
    #[inline]
    pub(crate) fn park(&self) -> bool {
        if self.0.get() == NOTIFIED {
            self.0.set(RUNNING);
            return false;
        }
        self.0.set(PARKED);
        true
    }

    /// A wake-up: makes the fiber's current or next park return. `true` if
    /// the caller must queue the fiber (it was parked); exactly one wake-up
    /// gets `true` for one park.
    #[inline]
    pub(crate) fn unpark(&self) -> bool {
        match self.0.get() {
            RUNNING => {
                self.0.set(NOTIFIED);
                false
            }
            PARKED => {
                self.0.set(QUEUED);
                true
            }
            // Already woken, or queued to run.
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_up_before_a_park_is_kept_and_one_after_queues_once() {
        let state = State::queued();
        assert!(state.start_turn(), "a new fiber's first turn starts it");
        assert!(!state.start_turn(), "a fiber that yielded is running");
        assert!(!state.unpark(), "a running fiber is not queued");
        assert!(!state.park(), "its token makes the park return");
        assert!(state.park(), "the next park suspends");
        assert!(state.unpark(), "the first wake-up queues it");
        assert!(!state.unpark(), "a second one finds it queued");
        assert!(state.start_turn(), "a woken fiber's turn starts it again");
        assert!(state.park());
    }
}
