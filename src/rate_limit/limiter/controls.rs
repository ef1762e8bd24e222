//! The limiter's live controls: new quotas and rules kept spent, the
//! switches, what it holds and how much.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Limiter;
use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::rate_limit::policy::{Compiled, Policy};
use crate::rate_limit::quota::Quota;
use crate::rate_limit::rule::{Rule, check_names};
use crate::rate_limit::table::Table;

impl Limiter {
    /// Replace the default quotas and the rules. Keys keep what they have
    /// spent: a quota that stays in place is retuned without minting
    /// capacity, one that changes algorithm carries each key's units in
    /// use, and a key whose rule changes starts the new one spent.
    pub(crate) fn retune(&self, default: Vec<Quota>, rules: Vec<Rule>) -> Result<(), ConfigError> {
        check_names(&rules)?;
        self.check_remote_quotas(&default, &rules)?;
        let _one_at_a_time = self.retuning.lock();
        let old = self.policy.load_full();
        if old.compiled[0].quotas == default && old.rules == rules {
            // Nothing changes (a reload that kept the limits): no new
            // generation, no floors, no log line.
            return Ok(());
        }
        let now = self.timeline.now();
        let policy = Policy::build(
            old.generation.wrapping_add(1).max(1),
            &default,
            rules,
            Some(&old),
            self.timeline.epoch_offset(),
            now,
            self.seed.global(),
            // Each key of a table kept gets its floor as its state is
            // converted, under its lock: no request can be booked between.
            &|key| self.lines.hold_back_key(key, now),
        );
        // Tables made anew (another algorithm, a quota added), which know
        // nothing of what was booked under the old ones.
        let fresh: Vec<Arc<Table>> = policy
            .compiled
            .iter()
            .flat_map(|c| &c.tables)
            .filter(|t| {
                !old.compiled
                    .iter()
                    .flat_map(|c| &c.tables)
                    .any(|o| Arc::ptr_eq(o, t))
            })
            .cloned()
            .collect();
        // A quota that changed algorithm keeps what each key spent under the
        // old one; again once the policy is in force, for what was admitted
        // under the old tables meanwhile (carrying never frees, so twice
        // takes no more than once).
        let replaced = policy.replaced(&old);
        for (was, table) in &replaced {
            table.carry_from(was, now);
        }
        self.hold_back(now, &fresh, true);
        tracing::info!(
            default = ?policy.compiled[0].quotas,
            rules = policy.rules.len(),
            "rate limit retuned"
        );
        let generation = policy.generation;
        self.policy.store(Arc::new(policy));
        self.generation.store(generation, Ordering::Release);
        self.forget_remote_refusals();
        // Once more for waiters booked under the old policy meanwhile.
        self.hold_back(now, &fresh, false);
        let now = self.timeline.now();
        for (was, table) in &replaced {
            table.carry_from(was, now);
        }
        Ok(())
    }

    /// Requests booked before a retune go before every request booked
    /// after it: each key with waiters gets a floor at its last waiter's
    /// instant, and `fresh` tables leave it nothing before then (every key
    /// with a floor the first time, only those whose floor rose after).
    fn hold_back(&self, now: Nanos, fresh: &[Arc<Table>], first: bool) {
        for (key, floor, raised) in self.lines.hold_back(now) {
            if first || raised {
                for table in fresh {
                    table.fill_until(key, now, floor);
                }
            }
        }
    }

    pub(crate) fn set_enabled(&self, enabled: bool) {
        // Logged only when it changes: setting what is already set (a
        // config applied again, a layer built) is not news.
        if self.enabled.swap(enabled, Ordering::Relaxed) != enabled {
            tracing::info!(enabled, "rate limit switched");
        }
    }

    #[inline]
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn is_dry_run(&self) -> bool {
        self.dry_run.load(Ordering::Relaxed)
    }

    pub(crate) fn set_dry_run(&self, dry_run: bool) {
        if self.dry_run.swap(dry_run, Ordering::Relaxed) != dry_run {
            tracing::info!(dry_run, "rate limit dry run switched");
        }
    }

    /// The default quotas and the rules in force.
    pub(crate) fn config(&self) -> (Vec<Quota>, Vec<Rule>) {
        let policy = self.policy.load();
        (policy.compiled[0].quotas.clone(), policy.rules.clone())
    }

    /// How many keys hold state, counting each key once per quota.
    pub(crate) fn len(&self) -> usize {
        self.tables().iter().map(|t| t.len()).sum()
    }

    /// Drop every idle key's state now.
    pub(crate) fn evict_idle(&self) -> usize {
        let now = self.timeline.now();
        self.rules.evict_idle(now);
        self.tables().iter().map(|t| t.evict_idle(now)).sum()
    }

    fn tables(&self) -> Vec<Arc<Table>> {
        let policy = self.policy.load();
        policy
            .compiled
            .iter()
            .flat_map(|c: &Compiled| c.tables.iter().cloned())
            .collect()
    }
}
