//! [`run_fibers`] and [`yield_fiber`] on courier's own fiber runtime, in the
//! shape of the test scheduler of `common/fibers.rs`, so that one suite runs
//! under both: every body becomes a fiber pinned to the one worker of a
//! runtime of its own (bodies share `Rc`s and `chan::local` ends, which stay
//! on one thread).
//!
//! Where the test scheduler reports a deadlock, this one waits: the caller's
//! watchdog fails the test instead. A seeded order (`run_fibers_in_order`) is
//! the runtime's own here: the `Park` contract promises no order, and the
//! runtime keeps none that a test could rely on.

use courier::fiber;

/// Lets the other ready fibers of the worker run.
pub fn yield_fiber() {
    fiber::yield_now();
}

/// Runs every body as a fiber of one worker, until all have finished; a
/// panic in one is resumed here.
pub fn run_fibers(bodies: Vec<Box<dyn FnOnce()>>) {
    run_fibers_in_order(bodies, None);
}

/// [`run_fibers`]; the seed is ignored (see the module docs).
pub fn run_fibers_in_order(bodies: Vec<Box<dyn FnOnce()>>, _shuffle: Option<u64>) {
    /// The bodies, on their way to the worker that runs them all.
    struct Bodies(Vec<Box<dyn FnOnce()>>);
    // SAFETY: the bodies and whatever they share (`Rc`s, `Cell`s, local
    // channel ends, with each other and with the caller) are used by one
    // thread at a time: the caller hands them to the worker and blocks in
    // `block_on` until every body has finished, and the worker runs them all
    // (pinned there by `spawn_local`); `block_on`'s channel orders the
    // caller's later reads after the worker's writes.
    unsafe impl Send for Bodies {}
    impl Bodies {
        fn into_inner(self) -> Vec<Box<dyn FnOnce()>> {
            self.0
        }
    }
    let bodies = Bodies(bodies);
    let rt = fiber::Runtime::builder()
        .workers(1)
        .build()
        .expect("a runtime of one worker");
    let first_panic = rt.block_on(move || {
        let handles: Vec<_> = bodies
            .into_inner()
            .into_iter()
            .map(fiber::spawn_local)
            .collect();
        let mut first_panic = None;
        for handle in handles {
            if let Err(panic) = handle.join() {
                first_panic.get_or_insert_with(|| describe(&*panic));
            }
        }
        first_panic
    });
    if let Some(message) = first_panic {
        panic!("a fiber panicked: {message}");
    }
}

fn describe(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}
