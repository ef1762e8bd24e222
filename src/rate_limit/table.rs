//! One quota's keyed state: a store of one algorithm's states.

use std::sync::Arc;

use super::algorithm::{
    FixedWindow, Gcra, Grant, Meter, SlidingCounter, SlidingWindow, TurnBudget,
};
use super::lines::{Lines, turn_for};
use super::quota::{Algorithm, Quota};
use crate::clock::{Nanos, Timeline, saturating_nanos};
use crate::key::KeyHash;
use crate::store::{FastWord, Idle, Slot, Store, Tidy};

/// A quota's states for every key, under one algorithm.
pub(crate) enum Table {
    TokenBucket(Store<<Gcra as Meter>::State, Gcra>),
    SlidingWindow(Store<<SlidingWindow as Meter>::State, SlidingWindow>),
    FixedWindow(Store<<FixedWindow as Meter>::State, FixedWindow>),
    TurnBudget(Store<<TurnBudget as Meter>::State, TurnBudget>),
    SlidingCounter(Store<<SlidingCounter as Meter>::State, SlidingCounter>),
}

/// Dispatch once on the algorithm, then run monomorphic code.
macro_rules! each {
    ($value:expr, $Enum:ident, |$inner:ident| $body:expr) => {
        match $value {
            $Enum::TokenBucket($inner) => $body,
            $Enum::SlidingWindow($inner) => $body,
            $Enum::FixedWindow($inner) => $body,
            $Enum::TurnBudget($inner) => $body,
            $Enum::SlidingCounter($inner) => $body,
        }
    };
}

/// One key's state in one table, locked.
pub(crate) enum Held<'a> {
    TokenBucket(Slot<'a, <Gcra as Meter>::State, Gcra>),
    SlidingWindow(Slot<'a, <SlidingWindow as Meter>::State, SlidingWindow>),
    FixedWindow(Slot<'a, <FixedWindow as Meter>::State, FixedWindow>),
    TurnBudget(Slot<'a, <TurnBudget as Meter>::State, TurnBudget>),
    SlidingCounter(Slot<'a, <SlidingCounter as Meter>::State, SlidingCounter>),
}

/// What a request asks of its quotas.
#[derive(Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) cost: u32,
    /// See [`Limiter::horizon_for`](super::limiter::Limiter).
    pub(crate) horizon: Nanos,
    pub(crate) max_wait: Nanos,
    /// Report what remains.
    pub(crate) info: bool,
    /// The line to join (see [`turn_for`]), and the floor a retune may
    /// have left on the key (see [`Lines::floor`]); none in reject mode and
    /// in a dry run, where nobody waits.
    pub(crate) line: Option<&'a Lines>,
}

/// What one quota decided on its own (see [`Table::admit`]).
pub(crate) enum One {
    /// Refused: the time until it would admit.
    Refused { wait: Nanos },
    /// Booked; with the units left and the time until all are, when asked,
    /// and the turn in the key's line when it joined one.
    Booked {
        grant: Grant,
        remaining: Option<(u32, Nanos)>,
        turn: Option<u64>,
    },
}

/// The whole decision of a key under one quota, monomorphic: lock, read the
/// clock under the lock, decide, book, release, tidy. The common case (a
/// layer with one quota) runs only this.
#[inline]
fn admit_in<M: Meter>(
    store: &Store<M::State, M>,
    key: KeyHash,
    timeline: &Timeline,
    ask: Ask<'_>,
) -> (One, Nanos) {
    let mut slot = store.slot(key);
    let now = timeline.now();
    let (alg, state) = slot.get();
    let mut at = alg.earliest(state, now, ask.cost, ask.horizon);
    if let Some(line) = ask.line {
        at = at.max(line.floor(key, now, ask.horizon));
    }
    let one = if at - now > ask.max_wait {
        One::Refused { wait: at - now }
    } else {
        let grant = alg.book(state, now, at, ask.cost);
        // As of the instant the request goes, which its response reports
        // (now, unless it waits: in a dry run nobody does).
        let goes = if ask.line.is_some() { at } else { now };
        let remaining = ask.info.then(|| alg.remaining(state, goes));
        let turn = turn_for(ask.line, key, at, now, timeline);
        One::Booked {
            grant,
            remaining,
            turn,
        }
    };
    let tidy = slot.tidy();
    drop(slot);
    store.tidy(key, now, tidy);
    (one, now)
}

/// The parameters a quota's algorithm runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Params {
    TokenBucket(Gcra),
    SlidingWindow(SlidingWindow),
    FixedWindow(FixedWindow),
    TurnBudget(TurnBudget),
    SlidingCounter(SlidingCounter),
}

impl Params {
    pub(crate) fn of(quota: &Quota, epoch_offset: Nanos) -> Self {
        let period = saturating_nanos(quota.period());
        match quota.algorithm() {
            Algorithm::TokenBucket => Self::TokenBucket(Gcra::new(
                period.div_ceil(u64::from(quota.limit())),
                quota.burst(),
            )),
            Algorithm::SlidingWindow => {
                Self::SlidingWindow(SlidingWindow::new(quota.limit(), period))
            }
            Algorithm::FixedWindow => {
                Self::FixedWindow(FixedWindow::new(quota.limit(), period, epoch_offset))
            }
            Algorithm::TurnBudget => Self::TurnBudget(TurnBudget::new(quota.limit(), period)),
            Algorithm::SlidingWindowCounter => {
                Self::SlidingCounter(SlidingCounter::new(quota.limit(), period, epoch_offset))
            }
        }
    }
}

impl Table {
    #[cfg(test)]
    fn is_locked(&self, key: KeyHash) -> bool {
        each!(self, Table, |s| s.is_locked(key))
    }

    /// A table with `global` (the key with no parts) kept apart from the
    /// shards, so that a layer keyed by `GlobalKey` skips the lookup.
    pub(crate) fn new(params: Params, sweep_every: Nanos, global: KeyHash) -> Self {
        match params {
            Params::TokenBucket(p) => Self::TokenBucket(Store::new(p, sweep_every).pinning(global)),
            Params::SlidingWindow(p) => {
                Self::SlidingWindow(Store::new(p, sweep_every).pinning(global))
            }
            Params::FixedWindow(p) => Self::FixedWindow(Store::new(p, sweep_every).pinning(global)),
            Params::TurnBudget(p) => Self::TurnBudget(Store::new(p, sweep_every).pinning(global)),
            Params::SlidingCounter(p) => {
                Self::SlidingCounter(Store::new(p, sweep_every).pinning(global))
            }
        }
    }

    /// Whether `params` can be applied to this table in place (same
    /// algorithm).
    pub(crate) fn accepts(&self, params: &Params) -> bool {
        matches!(
            (self, params),
            (Self::TokenBucket(_), Params::TokenBucket(_))
                | (Self::SlidingWindow(_), Params::SlidingWindow(_))
                | (Self::FixedWindow(_), Params::FixedWindow(_))
                | (Self::TurnBudget(_), Params::TurnBudget(_))
                | (Self::SlidingCounter(_), Params::SlidingCounter(_))
        )
    }

    /// Apply new parameters of the same algorithm, converting every key's
    /// state without minting capacity. `hold(key)` runs for each key as it
    /// is converted, under its lock, and says its last waiter's instant
    /// (see [`Lines::hold_back_key`]).
    pub(crate) fn retune(&self, params: &Params, now: Nanos, hold: &dyn Fn(KeyHash) -> Nanos) {
        match (self, params) {
            (Self::TokenBucket(s), Params::TokenBucket(p)) => {
                s.retune(p, |old, new, key, state| {
                    let booked = hold(key);
                    new.retune(old, state, now, booked)
                })
            }
            (Self::SlidingWindow(s), Params::SlidingWindow(p)) => {
                s.retune(p, |old, new, key, state| {
                    let booked = hold(key);
                    new.retune(old, state, now, booked)
                })
            }
            (Self::FixedWindow(s), Params::FixedWindow(p)) => {
                s.retune(p, |old, new, key, state| {
                    let booked = hold(key);
                    new.retune(old, state, now, booked)
                })
            }
            (Self::TurnBudget(s), Params::TurnBudget(p)) => s.retune(p, |old, new, key, state| {
                let booked = hold(key);
                new.retune(old, state, now, booked)
            }),
            (Self::SlidingCounter(s), Params::SlidingCounter(p)) => {
                s.retune(p, |old, new, key, state| {
                    let booked = hold(key);
                    new.retune(old, state, now, booked)
                })
            }
            _ => {}
        }
    }

    /// Carry what each key has spent in `old`, a table of another algorithm
    /// this one replaces: a key that used 3 of its 3 stays refused, whatever
    /// the new algorithm (see [`Meter::hold_spent`]). What each
    /// algorithm remembers differs (a log, a count, an arrival time), so
    /// the units in use now are what carries: as if all were taken now,
    /// which never frees anything earlier than the new quota would.
    pub(crate) fn carry_from(&self, old: &Table, now: Nanos) {
        let mut spent = Vec::new();
        each!(old, Table, |s| s.each_state(|alg, key, state| {
            if !state.is_idle(now) {
                let used = alg.capacity().saturating_sub(alg.remaining(state, now).0);
                if used > 0 {
                    spent.push((key, used));
                }
            }
        }));
        // Applied after the old table's locks are released: no lock of one
        // table is ever held while taking one of the other.
        each!(self, Table, |s| for &(key, used) in &spent {
            let mut slot = s.slot(key);
            let (alg, state) = slot.get();
            alg.hold_spent(state, now, used);
            let tidy = slot.tidy();
            drop(slot);
            s.tidy(key, now, tidy);
        });
    }

    /// Let the pinned (global) key's state be published in `fast` (`None`:
    /// nowhere); see [`FastWord`]. Only a token bucket's state fits in a
    /// word.
    pub(crate) fn install_fast(&self, fast: Option<Arc<FastWord>>) {
        if let Self::TokenBucket(s) = self {
            s.install_fast(fast);
        }
    }

    /// Publish the pinned key's state in `fast`, if it is the word
    /// installed. Returns whether it did.
    pub(crate) fn publish(&self, fast: &Arc<FastWord>) -> bool {
        match self {
            Self::TokenBucket(s) => s.publish(fast),
            _ => false,
        }
    }

    /// Lock `key`'s state. Pass [`Held::tidy`] to [`Table::tidy`] once
    /// it is released.
    #[inline]
    pub(crate) fn lock(&self, key: KeyHash) -> Held<'_> {
        match self {
            Self::TokenBucket(s) => Held::TokenBucket(s.slot(key)),
            Self::SlidingWindow(s) => Held::SlidingWindow(s.slot(key)),
            Self::FixedWindow(s) => Held::FixedWindow(s.slot(key)),
            Self::TurnBudget(s) => Held::TurnBudget(s.slot(key)),
            Self::SlidingCounter(s) => Held::SlidingCounter(s.slot(key)),
        }
    }

    /// Decide and book on this quota alone; see [`admit_in`]. Returns the
    /// clock reading it decided at.
    #[inline]
    pub(crate) fn admit(&self, key: KeyHash, timeline: &Timeline, ask: Ask<'_>) -> (One, Nanos) {
        each!(self, Table, |s| admit_in(s, key, timeline, ask))
    }

    /// Sweeping after a [`Table::lock`]; see [`Store::tidy`].
    #[inline]
    pub(crate) fn tidy(&self, key: KeyHash, now: Nanos, tidy: Tidy) {
        each!(self, Table, |s| s.tidy(key, now, tidy))
    }

    /// Give `grant` back (see [`Meter::refund`]). `settle` runs under
    /// the key's lock: `None` when the grant is no longer the key's to give
    /// back (a reset forgot it), else whether requests wait on the key
    /// (waiters join under this lock, so none is missed).
    pub(crate) fn refund(
        &self,
        key: KeyHash,
        now: Nanos,
        grant: &Grant,
        settle: &dyn Fn() -> Option<bool>,
    ) {
        each!(self, Table, |s| s.with_existing(key, |alg, state| {
            if let Some(waiting) = settle() {
                alg.refund(state, now, grant, waiting);
            }
        }))
    }

    /// Settle a grant at `actual` (see [`Meter::settle`]), if `settle`
    /// says under the key's lock that the grant is still the key's (and
    /// whether requests wait on it). A charge makes the key's state if it
    /// has gone idle; a refund has nothing to give back to one.
    pub(crate) fn settle(
        &self,
        key: KeyHash,
        now: Nanos,
        grant: &Grant,
        actual: u32,
        settle: &dyn Fn() -> Option<bool>,
    ) {
        if actual < grant.cost {
            each!(self, Table, |s| s.with_existing(key, |alg, state| {
                if let Some(waiting) = settle() {
                    alg.settle(state, now, grant, actual, waiting);
                }
            }))
        } else {
            each!(self, Table, |s| {
                let mut slot = s.slot(key);
                let (alg, state) = slot.get();
                if let Some(waiting) = settle() {
                    alg.settle(state, now, grant, actual, waiting);
                }
                let tidy = slot.tidy();
                drop(slot);
                s.tidy(key, now, tidy);
            })
        }
    }

    /// Undo a waiter's booking (see [`Meter::cancel`]), if `current`
    /// says under the key's lock that it is still the key's.
    pub(crate) fn cancel(
        &self,
        key: KeyHash,
        now: Nanos,
        grant: &Grant,
        current: &dyn Fn() -> bool,
    ) {
        each!(self, Table, |s| s.with_existing(key, |alg, state| {
            if current() {
                alg.cancel(state, now, grant);
            }
        }))
    }

    /// Whether `key` has state here that is not idle.
    pub(crate) fn in_use(&self, key: KeyHash, now: Nanos) -> bool {
        let mut in_use = false;
        each!(self, Table, |s| s
            .with_existing(key, |_, state| in_use = !state.is_idle(now)));
        in_use
    }

    /// For a key that arrives from another rule: start it with nothing
    /// available until `at`, unless it already has state here.
    pub(crate) fn start_spent(&self, key: KeyHash, at: Nanos) {
        each!(self, Table, |s| s.insert_if_absent(key, |alg| {
            let mut state = Default::default();
            alg.fill_until(&mut state, at);
            state
        }))
    }

    /// Leave nothing available to `key` until `at`, whatever its state: a
    /// table that replaced another while the key had waiters, or a key
    /// that moved back to a rule it has state in. `now` is the time now:
    /// the sweep that follows must judge other keys idle as of now, not as
    /// of `at`, or it drops states (this one's neighbours' fills) that are
    /// idle only by then.
    pub(crate) fn fill_until(&self, key: KeyHash, now: Nanos, at: Nanos) {
        each!(self, Table, |s| {
            let mut slot = s.slot(key);
            let (alg, state) = slot.get();
            alg.fill_until(state, at);
            let tidy = slot.tidy();
            drop(slot);
            s.tidy(key, now, tidy);
        })
    }

    /// The earliest instant `cost` units on `key` would fit, computed on a
    /// copy of its state: nothing is booked, dropped or swept. `spent`: the
    /// key would arrive from another rule, so a state it does not have here
    /// would start spent (see [`Table::start_spent`]).
    pub(crate) fn peek(
        &self,
        key: KeyHash,
        now: Nanos,
        cost: u32,
        horizon: Nanos,
        spent: bool,
    ) -> Nanos {
        each!(self, Table, |s| s.peek(key, |alg, state| {
            let mut copy = state.cloned().unwrap_or_default();
            if spent && state.is_none() {
                alg.fill_until(&mut copy, now);
            }
            alg.earliest(&mut copy, now, cost, horizon)
        }))
    }

    /// Forget the key's state (a reset, or a new turn).
    pub(crate) fn forget(&self, key: KeyHash) {
        each!(self, Table, |s| s.remove(key))
    }

    /// A turn budget's new turn for `key`: forget its turn, after calling
    /// `same_instant` under the key's lock if that turn started at `now` or
    /// later (a new turn could then start at the very instant it did).
    /// Other algorithms keep their state.
    pub(crate) fn forget_turn(&self, key: KeyHash, now: Nanos, same_instant: &dyn Fn()) {
        if let Self::TurnBudget(s) = self {
            s.remove_after(key, |turn| {
                if turn.started() >= now {
                    same_instant();
                }
            });
        }
    }

    /// Forget every key's state.
    pub(crate) fn clear(&self) {
        each!(self, Table, |s| s.clear())
    }

    pub(crate) fn len(&self) -> usize {
        each!(self, Table, |s| s.len())
    }

    pub(crate) fn evict_idle(&self, now: Nanos) -> usize {
        each!(self, Table, |s| s.evict_idle(now))
    }
}

impl Held<'_> {
    #[inline]
    pub(crate) fn tidy(&self) -> Tidy {
        each!(self, Held, |h| h.tidy())
    }

    #[inline]
    pub(crate) fn earliest(&mut self, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        each!(self, Held, |h| {
            let (alg, state) = h.get();
            alg.earliest(state, now, cost, horizon)
        })
    }

    #[inline]
    pub(crate) fn book(&mut self, now: Nanos, at: Nanos, cost: u32) -> Grant {
        each!(self, Held, |h| {
            let (alg, state) = h.get();
            alg.book(state, now, at, cost)
        })
    }

    /// Units available now and the time until all are.
    pub(crate) fn remaining(&mut self, now: Nanos) -> (u32, Nanos) {
        each!(self, Held, |h| {
            let (alg, state) = h.get();
            alg.remaining(state, now)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, OnceLock};

    use tokio::time::Instant;

    use super::*;
    use crate::clock::{Clock, ClockSource};

    /// A clock that notes whether the key's state was locked when it was
    /// read.
    struct LockProbe {
        table: OnceLock<Arc<Table>>,
        key: KeyHash,
        locked: AtomicBool,
    }

    impl std::fmt::Debug for LockProbe {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("LockProbe")
        }
    }

    const GLOBAL: KeyHash = KeyHash(7);

    impl Clock for Arc<LockProbe> {
        fn now(&self) -> Instant {
            if let Some(table) = self.table.get() {
                self.locked
                    .store(table.is_locked(self.key), Ordering::SeqCst);
            }
            Instant::now()
        }
    }

    #[test]
    fn a_fill_far_ahead_sweeps_other_keys_as_of_now() {
        // A retune fills each key with waiters up to its last waiter's
        // instant; the sweeps that go with those fills must not judge the
        // other keys' fills idle as of a later key's instant, or an early
        // key loses its fill and its next request goes before its waiters.
        let table = Table::new(Params::TurnBudget(TurnBudget::new(1, 1_000)), 1, GLOBAL);
        let early = KeyHash(1 << 32);
        table.fill_until(early, 0, 10);
        for i in 2..2_000u64 {
            table.fill_until(KeyHash(i << 32), 0, 1_000_000);
        }
        assert!(table.in_use(early, 0), "the early key's fill was swept");
    }

    #[test]
    fn the_clock_is_read_while_the_key_is_held() {
        // Read before the lock, a request that waited for it could see a
        // state booked by a later reading and take it for a clock that ran
        // backwards. A key in a shard, and the pinned global key.
        for key in [KeyHash(42 << 32), GLOBAL] {
            let probe = Arc::new(LockProbe {
                table: OnceLock::new(),
                key,
                locked: AtomicBool::new(false),
            });
            let timeline = Timeline::new(ClockSource::of(probe.clone()));
            let quota = Quota::per_second(10).expect("valid quota");
            let table = Arc::new(Table::new(Params::of(&quota, 0), Nanos::MAX, GLOBAL));
            assert!(probe.table.set(table.clone()).is_ok());
            let ask = Ask {
                cost: 1,
                horizon: 0,
                max_wait: 0,
                info: false,
                line: None,
            };
            let (one, _) = table.admit(key, &timeline, ask);
            assert!(matches!(one, One::Booked { .. }));
            assert!(probe.locked.load(Ordering::SeqCst), "read outside the lock");
        }
    }
}
