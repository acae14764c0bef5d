//! How a fiber's result reaches the one that joins it: a state word and a
//! slot in the fiber's own control block. No channel, and no allocation for
//! a result that takes no room (a `()`); a result that does is boxed once.
//!
//! ```text
//!   RUNNING --finish--> DONE
//!      |                  ^
//!    join (registers)     | finish (wakes the joiner)
//!      v                  |
//!   WAITING(joiner's context, or joining fiber)
//! ```
//!
//! One joiner at most (a `JoinHandle` is not `Clone`, and `join` takes it).
//! A joiner that is a courier fiber registers itself (a counted pointer,
//! tagged) and parks on its own state word; any other registers its `chan`
//! context (a thread, a task of another scheduler).
#![allow(unsafe_code)]

use std::any::Any;

use std::sync::Arc;

use super::sched;
use crate::chan::context::{Context, Selected};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::UnsafeCell;

const RUNNING: usize = 0;
const DONE: usize = 1;
/// Set in a registered joiner's word when it is a fiber (`Arc<Fiber>`
/// pointers, as contexts', are aligned: the low bits are free).
const FIBER: usize = 2;

/// A finished fiber's result, its value boxed as `dyn Any` (the handle
/// knows its type).
pub(crate) type Outcome = Result<Box<dyn Any>, Box<dyn Any + Send>>;

pub(crate) struct JoinSlot {
    /// `RUNNING`, `DONE`, or the waiting joiner's context (an `Arc` turned
    /// into a pointer, owned by the word; never 0 or 1, being aligned).
    state: AtomicUsize,
    /// Written once, by the finishing fiber, before `DONE` is published;
    /// read once, by the joiner, after it saw `DONE`.
    result: UnsafeCell<Option<Outcome>>,
}

// SAFETY: the state word is atomic, and the result cell is written once by
// the finishing fiber and read once by the joiner after it saw `DONE`
// (`Release`/`Acquire`). The result leaves its fiber's thread only for a
// handle on another thread, and a `JoinHandle<T>` is `Send` only when `T`
// is: a value crosses threads only when its type may.
unsafe impl Send for JoinSlot {}
// SAFETY: as for `Send`.
unsafe impl Sync for JoinSlot {}

impl JoinSlot {
    pub(crate) fn new() -> JoinSlot {
        JoinSlot {
            state: AtomicUsize::new(RUNNING),
            result: UnsafeCell::new(None),
        }
    }

    /// The fiber has finished (its result is there).
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// The fiber publishes its result and wakes its joiner, if one waits.
    /// Called once.
    #[inline(always)]
    pub(crate) fn finish(&self, outcome: Outcome) {
        // SAFETY: only the finishing fiber writes the slot, once, and the
        // joiner reads it only after seeing `DONE`, published below.
        self.result
            .with_mut(|slot| unsafe { *slot = Some(outcome) });
        // SYNC POINT: `Release` publishes the result; `Acquire` takes the
        // joiner's context, published by its registering exchange.
        let before = self.state.swap(DONE, Ordering::AcqRel);
        if before != RUNNING && before & FIBER != 0 {
            // SAFETY: a word with `FIBER` set is a joining fiber's counted
            // pointer, tagged by `join_as_fiber`, whose ownership the swap
            // took over.
            let joiner = unsafe { Arc::from_raw((before & !FIBER) as *const sched::Fiber) };
            sched::unpark(&joiner);
        } else if before != RUNNING {
            // SAFETY: a word other than RUNNING (DONE is written only here,
            // once) is a context `join` turned into a pointer, whose
            // ownership the swap took over.
            let joiner = unsafe { Context::from_raw(before as *const ()) };
            // What the claim says does not matter: a joiner waits on one
            // thing, and only for it to end.
            if joiner.try_select(Selected::Aborted).is_ok() {
                joiner.unpark();
            }
        }
    }

    /// Waits for the result (parking the calling fiber or thread) and takes
    /// it. Called once.
    #[inline]
    pub(crate) fn join(&self) -> Outcome {
        if !self.is_done() {
            // A task of another scheduler run inside a fiber waits as that
            // task, on its context: parking the fiber would park its
            // scheduler's other tasks too.
            match sched::current() {
                Some(me) if Context::current_is_fiber() => self.join_as_fiber(me),
                _ => self.join_as_context(),
            }
        }
        // The claim is made after DONE is published, so DONE is seen here.
        debug_assert!(self.is_done());
        // SYNC POINT: pairs with `finish`'s swap (what the claim's `Acquire`
        // in `wait_until` already ordered; this load makes the rule local).
        let _ = self.state.load(Ordering::Acquire);
        // SAFETY: DONE: the result was written and nobody writes it again;
        // the one handle reads it once.
        let outcome = self.result.with_mut(|slot| unsafe { (*slot).take() });
        outcome.expect("a finished fiber left its result")
    }

    /// A courier fiber waits: it registers itself and parks until `finish`
    /// has published the result (no `chan` context, no claim).
    fn join_as_fiber(&self, me: &sched::Fiber) {
        let mine = Arc::into_raw(sched::current_arc(me)) as usize;
        debug_assert_eq!(mine & (FIBER | DONE), 0, "an Arc is aligned");
        // SYNC POINT: `Release` publishes the registration to `finish`'s
        // swap; on failure, `Acquire` sees the result.
        let registered = (self.state)
            .compare_exchange(RUNNING, mine | FIBER, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !registered {
            // Finished meanwhile: the registration was never shared.
            // SAFETY: `mine` came from `into_raw` just above.
            drop(unsafe { Arc::from_raw(mine as *const sched::Fiber) });
            return;
        }
        // `finish` unparks this fiber after it publishes DONE; a park that
        // returns before (spuriously, or for an older wake-up) parks again.
        while !self.is_done() {
            sched::park(me);
        }
    }

    /// Any other joiner waits on its `chan` context.
    fn join_as_context(&self) {
        {
            Context::with(|cx| {
                let mine = cx.clone().into_raw() as usize;
                // SYNC POINT: `Release` publishes the context to `finish`'s
                // swap; on failure, `Acquire` sees the result.
                match (self.state).compare_exchange(
                    RUNNING,
                    mine,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // The finisher claims the context, then unparks it.
                        let _ = cx.wait_until(None, false);
                    }
                    Err(_) => {
                        // Finished meanwhile: the context was never shared.
                        // SAFETY: `mine` came from `into_raw` just above.
                        drop(unsafe { Context::from_raw(mine as *const ()) });
                    }
                }
            });
        }
    }
}

#[cfg(all(test, loom))]
mod tests {
    use super::*;
    use crate::sync::Arc;
    use loom::thread;

    /// A fiber finishes on one thread while its joiner waits on another:
    /// the joiner gets the result, whichever comes first, and is never left
    /// waiting (loom reports a deadlock if a wake-up is lost).
    #[test]
    fn a_join_and_a_finish_meet_once() {
        loom::model(|| {
            let slot = Arc::new(JoinSlot::new());
            let finisher = {
                let slot = slot.clone();
                thread::spawn(move || slot.finish(Ok(Box::new(7u32))))
            };
            let outcome = slot.join();
            let value = outcome.ok().and_then(|v| v.downcast::<u32>().ok());
            assert_eq!(value.map(|v| *v), Some(7));
            finisher.join().unwrap();
            assert!(slot.is_done());
        });
    }
}
