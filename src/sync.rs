//! The atomics and the lock of the modules the loom models check (the
//! concurrency permits, the rate limiter's wait lines, the stats): std's
//! atomics and parking_lot's `Mutex` in every normal build, plain
//! re-exports that cost nothing; loom's under `cfg(loom)`, so that
//! `tests/loom_*.rs` can explore every interleaving of their operations.
//! `Ordering` is std's in both (loom takes std's).

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};

/// loom's mutex with parking_lot's API: `lock` returns the guard (no
/// poisoning; a panic in a model ends the model anyway).
#[cfg(loom)]
#[derive(Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
