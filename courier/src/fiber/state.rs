//! A fiber's state word: how a park and an unpark meet without a lock (see
//! `sched`'s module docs for the diagram), in one place so that loom can
//! check it (`scripts/loom.sh`).

use crate::sync::atomic::{AtomicU8, Ordering};

/// On a run queue (or about to be).
const QUEUED: u8 = 0;
/// Running, or suspended on its way to park.
const RUNNING: u8 = 1;
/// Running, with a wake-up token: its next park returns at once.
const NOTIFIED: u8 = 2;
/// Parked: the next unpark queues it.
const PARKED: u8 = 3;

/// The state of one fiber.
pub(crate) struct State(AtomicU8);

impl State {
    /// A new fiber, queued to run.
    pub(crate) fn queued() -> State {
        State(AtomicU8::new(QUEUED))
    }

    /// The worker starts a turn of the fiber. (A fiber that yielded is
    /// already `RUNNING`, or `NOTIFIED`, which the turn keeps.)
    #[inline]
    pub(crate) fn start_turn(&self) {
        // SYNC POINT: the waker's `Release` in `unpark` (what it wrote before
        // waking is seen by the turn). A queued fiber's word changes only
        // here (`unpark` leaves `QUEUED` alone), so a load and a store do
        // what a compare-and-swap would, without a locked instruction.
        if self.0.load(Ordering::Acquire) == QUEUED {
            self.0.store(RUNNING, Ordering::Relaxed);
        }
    }

    /// The running fiber takes its wake-up token, if it has one: then its
    /// park returns at once.
    #[inline]
    pub(crate) fn take_token(&self) -> bool {
        // Most parks find no token: a plain load says so, with no locked
        // instruction. (Only the running fiber leaves `NOTIFIED`, so a token
        // seen here stays until the exchange below takes it.)
        if self.0.load(Ordering::Relaxed) != NOTIFIED {
            return false;
        }
        // SYNC POINT: the waker's `Release` in `unpark`.
        (self.0)
            .compare_exchange(NOTIFIED, RUNNING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The worker, after the fiber suspended to park: `true` if it is parked
    /// now (the next unpark queues it), `false` if an unpark came on its way
    /// (it must run again: its park returns).
    #[inline]
    pub(crate) fn commit_park(&self) -> bool {
        // SYNC POINT: `AcqRel` with the waker's CAS in `unpark`: either the
        // waker sees `PARKED` (and queues), or this sees `NOTIFIED`.
        match (self.0).compare_exchange(RUNNING, PARKED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(_) => {
                self.0.store(QUEUED, Ordering::Relaxed);
                false
            }
        }
    }

    /// A waker: makes the fiber's current or next park return. `true` if
    /// the caller must queue the fiber (it was parked); exactly one waker
    /// gets `true` for one park.
    #[inline]
    pub(crate) fn unpark(&self) -> bool {
        let mut state = self.0.load(Ordering::Relaxed);
        loop {
            let next = match state {
                RUNNING => NOTIFIED,
                PARKED => QUEUED,
                // Already woken, or queued to run.
                _ => return false,
            };
            // SYNC POINT: `Release`, with the `Acquire` of `start_turn` or
            // `take_token` (and `commit_park`'s).
            match (self.0).compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return next == QUEUED,
                Err(now) => state = now,
            }
        }
    }
}

#[cfg(all(test, loom))]
mod tests {
    use super::*;
    use crate::sync::atomic::AtomicUsize;
    use crate::sync::Arc;
    use loom::thread;

    /// A fiber parks while another thread unparks it: its park returns
    /// (token, requeue or queue by the waker) exactly once, whatever the
    /// interleaving; no wake-up is lost and none queues it twice.
    #[test]
    fn a_park_and_an_unpark_meet_exactly_once() {
        loom::model(|| {
            let state = Arc::new(State::queued());
            state.start_turn();
            let queued_by_waker = Arc::new(AtomicUsize::new(0));
            let waker = {
                let (state, queued) = (state.clone(), queued_by_waker.clone());
                thread::spawn(move || {
                    if state.unpark() {
                        queued.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            // The fiber parks: a token, or a suspension the worker commits.
            let returned_at_once = state.take_token();
            let requeued_by_worker = !returned_at_once && !state.commit_park();
            waker.join().unwrap();
            let queued = queued_by_waker.load(Ordering::Relaxed);
            let wakes = usize::from(returned_at_once) + usize::from(requeued_by_worker) + queued;
            assert_eq!(wakes, 1, "the park must return exactly once");
        });
    }

    /// Two wakers, one park: still one wake-up, and the other leaves at
    /// most a token for the next park.
    #[test]
    fn two_unparks_queue_a_parked_fiber_once() {
        loom::model(|| {
            let state = Arc::new(State::queued());
            state.start_turn();
            assert!(state.commit_park());
            let queued = Arc::new(AtomicUsize::new(0));
            let wakers: Vec<_> = (0..2)
                .map(|_| {
                    let (state, queued) = (state.clone(), queued.clone());
                    thread::spawn(move || {
                        if state.unpark() {
                            queued.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for w in wakers {
                w.join().unwrap();
            }
            assert_eq!(queued.load(Ordering::Relaxed), 1);
        });
    }
}
