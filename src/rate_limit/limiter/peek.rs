//! Telling how long a request would wait, on copies of the state: nothing
//! is booked, cached, swept or made.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{CLOCK_SLACK, Limiter, name_id};
use crate::clock::Nanos;
use crate::key::{KeyHash, KeyTexts};
use crate::rate_limit::policy::Policy;
use crate::store::Idle;

impl Limiter {
    /// How long a request of cost 1 on `key` arriving now would wait,
    /// booking nothing and changing no state (see
    /// [`RateLimitHandle::peek_wait`](super::RateLimitHandle::peek_wait)).
    pub(crate) fn peek_wait(&self, key: KeyHash, parts: &dyn Fn() -> KeyTexts) -> Duration {
        if !self.is_enabled() || self.is_dry_run() {
            return Duration::ZERO;
        }
        // On Redis: what this replica knows without asking, a refusal it
        // remembers.
        if let Some(wait) = self.peek_remote(key) {
            return wait;
        }
        let policy = self.policy.load();
        let now = self.timeline.now();
        let (index, moved) = if policy.has_rules() {
            self.peek_rule(&policy, key, now, parts)
        } else {
            (0, false)
        };
        let rule = &policy.compiled[index];
        if rule.dry_run {
            return Duration::ZERO;
        }
        let horizon = self
            .horizon
            .load(Ordering::Relaxed)
            .saturating_add(CLOCK_SLACK);
        // Behind the waiters already in the key's line, as a request in
        // wait mode would be.
        let mut at = self.lines.floor(key, now, horizon).max(now);
        for table in &rule.tables {
            at = at.max(table.peek(key, now, 1, horizon, moved));
        }
        Duration::from_nanos(at - now)
    }

    /// [`rule_of`](Self::rule_of) without writing anything down: the rule
    /// `key` would be held to now, and whether it would arrive in it from
    /// another (so starting spent).
    fn peek_rule(
        &self,
        policy: &Policy,
        key: KeyHash,
        now: Nanos,
        parts: &dyn Fn() -> KeyTexts,
    ) -> (usize, bool) {
        let slot = self.rules.peek(key, |_, slot| slot.copied());
        if let Some(slot) = slot.filter(|s| s.generation == policy.generation) {
            return (slot.rule as usize, false);
        }
        let index = policy.find(parts().parts());
        let moved = match slot.filter(|s| s.generation != 0) {
            Some(slot) => slot.name != name_id(&policy.compiled[index].name) && !slot.is_idle(now),
            None => index != 0 && policy.compiled[0].tables.iter().any(|t| t.in_use(key, now)),
        };
        (index, moved)
    }
}
