//! Threads for calls that would block a worker: a pool that grows on demand
//! and lets a thread go after it has idled for [`IDLE`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use super::affinity;
use crate::chan;

/// How long an idle thread of the pool waits for a job before it ends.
const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

struct Pool {
    jobs: chan::Sender<Job>,
    receiver: chan::Receiver<Job>,
    /// Threads waiting for a job.
    idle: AtomicUsize,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let (jobs, receiver) = chan::unbounded();
        Pool {
            jobs,
            receiver,
            idle: AtomicUsize::new(0),
        }
    })
}

/// Runs `job` on a thread of the pool: an idle one, or a new one.
pub(crate) fn run(job: Job) {
    let pool = pool();
    // Claim an idle thread, or start one.
    let claimed = pool
        .idle
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok();
    if !claimed {
        let receiver = pool.receiver.clone();
        let unbound = affinity::for_new_thread();
        let spawned = std::thread::Builder::new()
            .name("courier-blocking".to_owned())
            .spawn(move || {
                affinity::restore(unbound);
                let pool = self::pool();
                loop {
                    match receiver.recv_timeout(IDLE) {
                        Ok(job) => job(),
                        Err(_) => {
                            // Ends only if no job is on its way to it.
                            if pool
                                .idle
                                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok()
                            {
                                return;
                            }
                            continue;
                        }
                    }
                    pool.idle.fetch_add(1, Ordering::AcqRel);
                }
            });
        if spawned.is_err() {
            // No thread to be had: run it here, blocking the caller.
            job();
            return;
        }
    }
    let _ = pool.jobs.send(job);
}
