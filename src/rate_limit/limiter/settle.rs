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
use crate::key::KeyHash;
use crate::rate_limit::quota::Algorithm as Kind;

impl Limiter {
    /// Give a ticket's capacity back: the request did not count
    /// (`cancel == false`) or left the queue before its turn.
    pub(crate) fn give_back(&self, ticket: &Ticket, cancel: bool) {
        #[cfg(feature = "redis")]
        if let Some(grant) = &ticket.remote {
            if let Some(remote) = &self.remote {
                remote.give_back(grant.clone(), ticket.key, cancel);
            }
            return;
        }
        let policy = self.policy.load();
        // After a retune or a reset the ticket's tables may be gone,
        // retuned or emptied; keeping the capacity spent is the safe side.
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
        let key = ticket.key;
        for (table, grant) in rule.tables.iter().zip(&ticket.grants) {
            if cancel {
                table.cancel(key, now, grant, &current);
            } else {
                let settle = || current().then(|| self.lines.has_waiters(key));
                table.refund(key, now, grant, &settle);
            }
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
            .all(|q| q.algorithm() == Kind::TurnBudget);
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
