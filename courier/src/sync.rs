//! The one door to synchronisation primitives: `std` in normal builds, `loom` under `cfg(loom)`.
//!
//! Every atomic, cell, lock and thread operation of the lock-free code goes through this module,
//! so that `RUSTFLAGS="--cfg loom"` swaps all of them for loom's model-checked twins at once
//! (tokio's `src/loom/mod.rs` and crossbeam-utils' `src/lib.rs` do the same). Code that imports
//! `std::sync::atomic` directly escapes the model checker; don't.
//!
//! [`UnsafeCell`] is loom's shape everywhere (`with`/`with_mut` closures instead of `get`), so
//! that loom can check each access of a cell against concurrent ones.
#![allow(dead_code, unused_imports)]

#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// Atomics (`std::sync::atomic` or `loom::sync::atomic`).
pub(crate) mod atomic {
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering,
    };

    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering,
    };
}

/// Threads: current handle, park/unpark, yield.
pub(crate) mod thread {
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, park_timeout, yield_now, Thread};

    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, yield_now, Thread};

    /// loom has no clock: a timed park is an untimed one (models never use deadlines).
    #[cfg(loom)]
    pub(crate) fn park_timeout(_: std::time::Duration) {
        park();
    }
}

/// `arc`'s value, to change, if `arc` holds its only strong count: what `Arc::get_mut`
/// answers, with a load where `get_mut` makes a locked compare-exchange of the weak count. (For
/// `std`'s `Arc`, which is what the fiber runtime and `IpcFd` count with under loom too.)
///
/// # Safety
/// No `Weak` of the allocation exists, and while the borrow lives nothing reaches the value
/// through a pointer that holds no count.
#[allow(unsafe_code)]
#[inline]
pub(crate) unsafe fn unique_arc<T>(arc: &mut std::sync::Arc<T>) -> Option<&mut T> {
    if std::sync::Arc::strong_count(arc) != 1 {
        return None;
    }
    // SYNC POINT: pairs with the `Release` decrement of every other count that went: what
    // their holders did to the value happens before the caller's writes.
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the only strong count is the caller's and no `Weak` or uncounted pointer reaches
    // the value (the caller's promise), so the returned borrow, which holds `arc`, is exclusive.
    Some(unsafe { &mut *std::sync::Arc::as_ptr(arc).cast_mut() })
}

/// A busy-wait hint: `pause` on x86; a scheduling point for loom.
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::hint::spin_loop();
}

/// `core::cell::UnsafeCell` with loom's access-checked API.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T: ?Sized>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    pub(crate) const fn new(data: T) -> Self {
        Self(core::cell::UnsafeCell::new(data))
    }

    #[inline(always)]
    pub(crate) fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

#[cfg(not(loom))]
impl<T: ?Sized> UnsafeCell<T> {
    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with an exclusive raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
