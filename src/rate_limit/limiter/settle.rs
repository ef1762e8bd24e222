//! Giving capacity back, and forgetting it: refunds and cancellations of
//! tickets, a key's new turn, and resets of one key or of every key.
//!
//! A ticket names the policy generation it was booked under, and is given
//! back only under that generation, checked under the key's lock. A reset
//! moves the generation on twice, before and after it forgets, so that no
//! ticket booked before the reset or while it ran is given back into the
//! state that follows it: the reset already gave everything back, and a
//! refund then would free a unit a request booked since has taken.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Limiter, Ticket};
use crate::clock::Nanos;
use crate::key::KeyHash;
use crate::rate_limit::algorithm::Grant;
use crate::rate_limit::quota::{Algorithm, Quota, Unit};
use crate::rate_limit::table::Table;
use crate::stats::Event;

impl Limiter {
    /// Give a ticket's capacity back: the request did not count
    /// (`cancel == false`) or left the queue before its turn.
    pub(crate) fn give_back(&self, ticket: &Ticket, cancel: bool) {
        if self.give_back_remote(ticket, cancel) {
            return;
        }
        let key = ticket.key;
        let gave_back = std::cell::Cell::new(false);
        self.each_grant(ticket, |table, grant, _, now, current| {
            gave_back.set(true);
            if cancel {
                table.cancel(key, now, grant, current);
            } else {
                let settle = || current().then(|| self.lines.has_waiters(key));
                table.refund(key, now, grant, &settle);
            }
        });
        if gave_back.get() {
            self.gave_back(key);
        }
    }

    /// Count a booking of `key` given back: for a key already in the
    /// stats' table, else with the others (no name is needed).
    pub(super) fn gave_back(&self, key: KeyHash) {
        self.stats.record(key, Event::GivenBack, &String::new);
    }

    /// Settle a ticket at its real cost `actual` (see
    /// [`Settlement`](crate::rate_limit::Settlement)): in each quota that
    /// counts cost, the excess is given back or the shortfall charged.
    /// Nothing across a retune or a reset, as for a refund.
    pub(crate) fn settle(&self, ticket: &Ticket, actual: u32) {
        if self.settle_remote(ticket, actual) {
            return;
        }
        let key = ticket.key;
        let gave_back = std::cell::Cell::new(false);
        self.each_grant(ticket, |table, grant, quota, now, current| {
            if quota.unit() == Unit::Cost && grant.cost != actual {
                gave_back.set(gave_back.get() || actual < grant.cost);
                let settle = || current().then(|| self.lines.has_waiters(key));
                table.settle(key, now, grant, actual, &settle);
            }
        });
        if gave_back.get() {
            self.gave_back(key);
        }
    }

    /// Run `each` on every table of `ticket`'s rule, with its grant and
    /// quota, the time now, and a check, for under each key's lock, that the
    /// ticket is still the key's. Nothing after a retune or a reset: the
    /// ticket's tables may be gone, retuned or emptied, and keeping the
    /// capacity spent is the safe side.
    fn each_grant(
        &self,
        ticket: &Ticket,
        each: impl Fn(&Table, &Grant, &Quota, Nanos, &dyn Fn() -> bool),
    ) {
        let policy = self.policy.load();
        if policy.generation != ticket.generation {
            return;
        }
        let Some(rule) = policy.compiled.get(ticket.rule as usize) else {
            return;
        };
        let now = self.timeline.now();
        // Checked again under each key's lock: a reset that began since
        // has moved the generation on before forgetting the key.
        let current = || self.generation.load(Ordering::Acquire) == ticket.generation;
        let grants = rule.tables.iter().zip(&ticket.grants).zip(&rule.quotas);
        for ((table, grant), quota) in grants {
            each(table, grant, quota, now, &current);
        }
    }

    /// Start `key`'s new turn: its turn budgets are full again, its other
    /// quotas untouched. A ticket from the old turn gives nothing back to
    /// the new one.
    ///
    /// A grant names its turn by the instant the turn started, which tells
    /// turns apart unless the new one starts at the very instant the old
    /// one did (paused time, a coarse clock). When the turn forgotten
    /// started now (or later, booked ahead), the generation moves on under
    /// the key's lock, so no ticket from before gives anything back: this
    /// key's, nor, as it happens, any other's (the safe side, and only at
    /// such an instant). Out of the request path, which stays as it was.
    pub(crate) fn new_turn(&self, key: KeyHash) {
        // One at a time with retunes and resets, which also move the
        // generation on.
        let _one_at_a_time = self.retuning.lock();
        let now = self.timeline.now();
        let policy = self.policy.load_full();
        // It takes effect at once, whatever a retune left; but it refills
        // turn budgets only, and the floor may be all that keeps the key's
        // other quotas in order.
        let only_turns = policy
            .compiled
            .iter()
            .flat_map(|c| &c.quotas)
            .all(|q| q.algorithm() == Algorithm::TurnBudget);
        if only_turns {
            self.lines.lift(key);
        }
        for table in policy.compiled.iter().flat_map(|c| &c.tables) {
            table.forget_turn(key, now, &|| self.next_generation());
        }
    }

    /// Forget what `key` has spent in every quota, or (`None`) what every
    /// key has: it takes effect at once (waiting requests keep their booked
    /// instants, newcomers do not queue behind them). Tickets booked before
    /// give nothing back (see the module docs). The counters are kept.
    pub(crate) fn reset(&self, key: Option<KeyHash>) {
        // One at a time with retunes, which also move the generation on.
        let _one_at_a_time = self.retuning.lock();
        self.next_generation();
        let policy = self.policy.load();
        match key {
            Some(key) => {
                self.lines.lift(key);
                for table in policy.compiled.iter().flat_map(|c| &c.tables) {
                    table.forget(key);
                }
            }
            None => {
                self.lines.lift_all();
                for table in policy.compiled.iter().flat_map(|c| &c.tables) {
                    table.clear();
                }
                self.rules.clear();
            }
        }
        self.next_generation();
    }

    /// The policy in force under a new generation: the same tables, so no
    /// state is converted or lost, but tickets (and keys' cached rules)
    /// from before are told apart. The caller holds `retuning`.
    fn next_generation(&self) {
        let old = self.policy.load_full();
        let policy = old.renumbered(old.generation.wrapping_add(1).max(1));
        let generation = policy.generation;
        self.policy.store(Arc::new(policy));
        self.generation.store(generation, Ordering::Release);
    }
}
