//! The crate's insides the loom models (`tests/loom_*.rs`) drive; built
//! only under `cfg(loom)`, and no part of the crate's API.

#![allow(missing_debug_implementations)]

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::concurrency::{Acquire, Granted, KeyState, Lane, Permit, Permits, QueueTicket};
use crate::key::KeyHash;
use crate::rate_limit::lines::Lines;
use crate::stats::{Event, KeyTracking, Stats, StatsSnapshot};

/// How long a due waiter gives way to one booked ahead of it.
pub const GRACE: Duration = crate::rate_limit::lines::GRACE;
/// How long one past its grace but polled gets once woken to go first.
pub const HANDOVER: Duration = crate::rate_limit::lines::HANDOVER;

/// One key's permits and queue.
pub struct Key {
    state: Arc<KeyState>,
    stats: Arc<Stats>,
    /// Keeps the single key's counts readable by the stats.
    _permits: Option<Arc<Permits>>,
}

impl Key {
    /// The one key of a layer keyed by `GlobalKey`: it counts its
    /// admissions in its word, and moves them out every two.
    pub fn single(max: usize) -> Self {
        let permits = Permits::for_model(max);
        Self {
            state: permits.single().clone(),
            stats: permits.stats.clone(),
            _permits: Some(permits),
        }
    }

    /// A key of a keyed layer, counted in the stats (apart, with
    /// `per_key`), made outside the store.
    pub fn keyed(max: usize, per_key: bool) -> Self {
        let tracking = KeyTracking::up_to(if per_key { 8 } else { 0 });
        let stats = Arc::new(Stats::new(tracking).tracking_in_flight());
        Self {
            state: KeyState::for_model(max, stats.clone()),
            stats,
            _permits: None,
        }
    }

    /// Take a permit, or join the queue if it has fewer than `max_queue`.
    pub fn acquire(&self, max_queue: usize) -> Acquired {
        match self
            .state
            .acquire(max_queue, Lane::ONE, None, &|| "k".to_owned())
        {
            Acquire::Granted(permit) => Acquired::Granted(permit),
            Acquire::Queued(ticket) => Acquired::Queued(Waiting(ticket)),
            Acquire::Full | Acquire::TooLong(_) => Acquired::Full,
        }
    }

    /// Let at most `max` out from now on.
    pub fn retune(&self, max: u64) {
        self.state.retune(max);
    }

    /// The key's inside, read under its lock.
    pub fn rest(&self) -> Rest {
        self.state.inside()
    }

    /// The key's stats now.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

/// A key's inside, read under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rest {
    /// Permits out (including ones handed to waiters).
    pub out: u64,
    /// The word says requests wait.
    pub queued_flag: bool,
    /// Requests in the queue.
    pub waiters: usize,
    /// Permits handed to waiters not yet sent (single key).
    pub granted: u64,
    /// Admissions still counted in the word (single key).
    pub in_word: u64,
    /// Admissions moved out of the word (single key).
    pub carried: u64,
    /// Admitted and left, as the single key counts them.
    pub own_counts: (u64, u64),
    /// The lock-free path may take a permit.
    pub free: bool,
}

/// What [`Key::acquire`] decided.
pub enum Acquired {
    /// A permit, at once.
    Granted(Permit),
    /// A place in the queue.
    Queued(Waiting),
    /// The queue is full.
    Full,
}

/// A place in a key's queue.
pub struct Waiting(QueueTicket);

impl Waiting {
    /// Ready once the permit was handed over; else the waker is kept.
    pub fn poll_granted(&self, cx: &mut Context<'_>) -> Poll<()> {
        // No lanes in the models: nothing is ever pushed out.
        self.0.poll_granted(cx).map(|_| ())
    }

    /// The handed-over permit (after [`Waiting::poll_granted`] was ready).
    pub fn into_granted(self) -> Handed {
        Handed(self.0.into_granted())
    }

    /// Give up: `Ok` when the place left the queue, else the permit it was
    /// handed meanwhile.
    pub fn give_up(self) -> Result<Duration, Handed> {
        self.0.give_up().map_err(Handed)
    }
}

/// A permit handed to a waiter not yet sent; dropped, it passes on.
pub struct Handed(Granted);

impl Handed {
    /// The request is sent.
    pub fn enter(self) -> Permit {
        self.0.enter()
    }
}

/// The wait lines of a rate limiter, used for one key.
#[derive(Default)]
pub struct Line(Lines);

const KEY: KeyHash = KeyHash(1);

impl Line {
    /// Join the line, due at `due`.
    pub fn join(&self, due: Instant) -> u64 {
        self.0.join(KEY, 0, due)
    }

    /// A request that could go at `now`: its turn if it must line up
    /// behind due waiters.
    pub fn join_if_due(&self, now: Instant) -> Option<u64> {
        self.0.join_if_due(KEY, 0, now)
    }

    /// Whether `turn` may go now (`None`), else when to look again;
    /// `waker` is woken sooner if those ahead leave or hand over. `now` is
    /// read under the line's lock.
    pub fn check(
        &self,
        turn: u64,
        waker: &Waker,
        now: impl FnOnce() -> Instant,
    ) -> Option<Instant> {
        self.0.check_at(KEY, turn, waker, now)
    }

    /// Leave the line (gone, or given up).
    pub fn leave(&self, turn: u64) {
        self.0.leave(KEY, turn);
    }

    /// No line left, and no waiter counted.
    pub fn is_empty(&self) -> bool {
        self.0.keys() == 0 && self.0.waiting() == 0
    }
}

/// A layer's stats, fed events directly.
pub struct Counters(Stats);

impl Counters {
    /// Stats following requests in flight, with up to `per_key` keys
    /// counted apart.
    pub fn new(per_key: usize) -> Self {
        Self(Stats::new(KeyTracking::up_to(per_key)).tracking_in_flight())
    }

    fn record(&self, key: u64, event: Event) {
        self.0.record(KeyHash(key), event, &|| format!("k{key}"));
    }

    /// A request on `key` joined a queue.
    pub fn queued(&self, key: u64) {
        self.record(key, Event::Queued);
    }

    /// It left the queue, admitted or not.
    pub fn dequeued(&self, key: u64, admitted: bool) {
        self.record(key, Event::Dequeued(admitted.then_some(Duration::ZERO)));
    }

    /// A request on `key` went in flight.
    pub fn entered(&self, key: u64) {
        self.record(key, Event::Entered);
    }

    /// It left the flight.
    pub fn left(&self, key: u64) {
        self.record(key, Event::Left);
    }

    /// A request on `key` was refused.
    pub fn rejected(&self, key: u64) {
        self.record(key, Event::Rejected);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.0.snapshot()
    }
}
