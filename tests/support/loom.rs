//! What the loom models share (`tests/loom_*.rs`).

use std::future::poll_fn;
use std::task::{Poll, Waker};

use loom::model::Builder;

/// Explore `f`'s interleavings: every one with up to `LOOM_MAX_PREEMPTIONS`
/// preemptions (2 unless the variable says otherwise: every model within
/// seconds, and the planted missing `Acquire` is caught; 3 explores more,
/// in minutes).
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.check(f);
}

/// Block this (loom) thread until `ready` says so, polling it again only
/// when the waker it was given is woken: a wake that never comes is a
/// deadlock, which loom reports.
#[allow(dead_code)] // not every model has waiters
pub fn block_until(mut ready: impl FnMut(&Waker) -> bool) {
    loom::future::block_on(poll_fn(|cx| {
        if ready(cx.waker()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }));
}
