//! One quota's keyed state and clock: what every clone of a rate-limit
//! service shares.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::algorithm::{Acquire, Algorithm, FixedWindow, Gcra, Grant, SlidingWindow};
use super::quota::{Algorithm as Kind, Quota};
use crate::clock::{ClockSource, Nanos, Timeline, saturating_nanos};
use crate::key::{KeyHash, KeySeed};
use crate::store::Store;

/// A booking of capacity on one key: enough to give it back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    key: KeyHash,
    grant: Grant,
}

/// What the limiter decided for one request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Go now.
    Now(Ticket),
    /// Go at `until`; the capacity is booked.
    Later { until: Instant, ticket: Ticket },
    /// Refused; nothing consumed.
    Denied { retry_after: Duration },
    /// The request costs more than the key can ever admit at once.
    TooCostly { capacity: u32 },
}

enum Engine {
    TokenBucket(Gcra, Store<<Gcra as Algorithm>::State>),
    SlidingWindow(SlidingWindow, Store<<SlidingWindow as Algorithm>::State>),
    FixedWindow(FixedWindow, Store<<FixedWindow as Algorithm>::State>),
}

/// Dispatch once on the algorithm, then run monomorphic code.
macro_rules! with_engine {
    ($engine:expr, |$alg:ident, $store:ident| $body:expr) => {
        match $engine {
            Engine::TokenBucket($alg, $store) => $body,
            Engine::SlidingWindow($alg, $store) => $body,
            Engine::FixedWindow($alg, $store) => $body,
        }
    };
}

pub(crate) struct Limiter {
    timeline: Timeline,
    seed: KeySeed,
    engine: Engine,
    quota: Quota,
    /// The longest wait ever allowed on this limiter, in nanoseconds: how far
    /// ahead a booking can legitimately be.
    horizon: AtomicU64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("quota", &self.quota)
            .field("keys", &self.len())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    pub(crate) fn new(quota: Quota, clock: ClockSource) -> Self {
        let timeline = Timeline::new(clock);
        let period = saturating_nanos(quota.period());
        // Idle keys are looked for about once a period, at least every
        // second and at most every minute.
        let sweep_every = period.clamp(1_000_000_000, 60_000_000_000);
        let engine = match quota.algorithm() {
            Kind::TokenBucket => {
                let emission = period.div_ceil(u64::from(quota.limit()));
                Engine::TokenBucket(Gcra::new(emission, quota.burst()), Store::new(sweep_every))
            }
            Kind::SlidingWindow => Engine::SlidingWindow(
                SlidingWindow::new(quota.limit(), period),
                Store::new(sweep_every),
            ),
            Kind::FixedWindow => Engine::FixedWindow(
                FixedWindow::new(quota.limit(), period, timeline.epoch_offset()),
                Store::new(sweep_every),
            ),
        };
        Self {
            timeline,
            seed: KeySeed::default(),
            engine,
            quota,
            horizon: AtomicU64::new(0),
        }
    }

    pub(crate) fn seed(&self) -> &KeySeed {
        &self.seed
    }

    pub(crate) fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Admit `cost` units on `key` now, or book them at most `max_wait` ahead.
    #[inline]
    pub(crate) fn acquire(&self, key: KeyHash, cost: u32, max_wait: Duration) -> Decision {
        if cost > self.quota.burst() {
            return Decision::TooCostly {
                capacity: self.quota.burst(),
            };
        }
        // A zero cost would take nothing; count it as one so it cannot slip
        // past a key that is full.
        let cost = cost.max(1);
        let now = self.timeline.now();
        let max_wait = saturating_nanos(max_wait);
        let mut horizon = self.horizon.load(Ordering::Relaxed);
        if max_wait > horizon {
            horizon = max_wait;
            self.horizon.fetch_max(max_wait, Ordering::Relaxed);
        }
        let outcome = with_engine!(&self.engine, |alg, store| store.with(key, now, |state| alg
            .acquire(state, now, cost, max_wait, horizon)));
        match outcome {
            Acquire::Now(grant) => Decision::Now(Ticket { key, grant }),
            Acquire::Later(grant) => Decision::Later {
                until: self.timeline.instant(grant.at),
                ticket: Ticket { key, grant },
            },
            Acquire::Denied { retry_after } => Decision::Denied {
                retry_after: Duration::from_nanos(retry_after),
            },
        }
    }

    /// The admitted request did not count: give its capacity back.
    pub(crate) fn refund(&self, ticket: &Ticket) {
        let now = self.timeline.now();
        with_engine!(&self.engine, |alg, store| store.with_existing(
            ticket.key,
            |state| alg.refund(state, now, &ticket.grant)
        ));
    }

    /// A booked request left before its instant.
    pub(crate) fn cancel(&self, ticket: &Ticket) {
        let now = self.timeline.now();
        with_engine!(&self.engine, |alg, store| store.with_existing(
            ticket.key,
            |state| alg.cancel(state, now, &ticket.grant)
        ));
    }

    /// How many keys hold state.
    pub(crate) fn len(&self) -> usize {
        with_engine!(&self.engine, |_alg, store| store.len())
    }

    /// Drop every idle key's state now.
    pub(crate) fn evict_idle(&self) -> usize {
        let now = self.timeline.now();
        with_engine!(&self.engine, |_alg, store| store.evict_idle(now))
    }

    #[allow(dead_code)]
    pub(crate) fn now(&self) -> Nanos {
        self.timeline.now()
    }
}
