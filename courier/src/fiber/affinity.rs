//! Worker threads bound to CPUs of their own.
//!
//! A runtime with a worker per CPU binds each worker to its CPU (see
//! [`RuntimeBuilder::bind_workers`](super::RuntimeBuilder::bind_workers)). Left
//! to the kernel, two workers share one CPU for milliseconds at a time in a
//! virtual machine: a worker woken from its sleep is placed on its waker's
//! CPU whenever the other CPU's idle virtual CPU has been descheduled by the
//! host (the guest counts it as busy, not idle), and they stay stacked there
//! until load balancing moves one, a few milliseconds later. A ring of fibers
//! on two workers that pauses for 20 ms between runs of a few milliseconds
//! took 66-80 ns a message unbound and 40-54 ns bound (about 35 without the
//! pauses): a bound worker runs where it slept.
//!
//! A thread inherits the binding of the thread that starts it, so the
//! threads courier itself starts from a worker (the blocking pool's, the
//! router's, a stream's) are given back the CPUs the runtime was built with.

use std::cell::Cell;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

thread_local! {
    /// On a bound worker: the CPUs the threads it starts may run on.
    static UNBOUND: Cell<Option<CpuSet>> = const { Cell::new(None) };
}

/// The CPUs the threads the calling thread starts may run on (the whole set,
/// and each in order): its own, or on a bound worker those it was bound
/// from; `None` if the kernel does not say.
pub(crate) fn allowed() -> Option<(CpuSet, Vec<usize>)> {
    let set = match for_new_thread() {
        Some(set) => set,
        None => sched_getaffinity(None).ok()?,
    };
    let cpus = (0..CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect();
    Some((set, cpus))
}

/// Binds the calling thread (a worker) to `cpu`; threads it starts get
/// `unbound` back. A kernel that refuses (a CPU taken offline since, a
/// seccomp filter) leaves the worker unbound.
pub(crate) fn bind(cpu: usize, unbound: CpuSet) {
    let mut only = CpuSet::new();
    only.set(cpu);
    if sched_setaffinity(None, &only).is_ok() {
        UNBOUND.with(|u| u.set(Some(unbound)));
    }
}

/// What a thread about to be started by the calling one should run on
/// instead of the caller's binding: `Some` on a bound worker. Give it to
/// [`restore`] first thing in the new thread.
pub(crate) fn for_new_thread() -> Option<CpuSet> {
    UNBOUND.with(Cell::get)
}

/// Undoes, in a thread just started, the binding it inherited from a bound
/// worker ([`for_new_thread`]'s answer there).
pub(crate) fn restore(unbound: Option<CpuSet>) {
    if let Some(set) = unbound {
        // A refusal leaves the thread on its creator's CPU: slower, not wrong.
        let _ = sched_setaffinity(None, &set);
    }
}
