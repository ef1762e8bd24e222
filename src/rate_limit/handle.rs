use std::fmt;
use std::sync::Arc;

use super::config::Limits;
use super::limiter::Limiter;
use super::quota::Quota;
use super::rule::Rule;
use crate::error::ConfigError;
use crate::stats::{StatsSnapshot, StatsSubscription};

/// Live control of a running rate limiter, shared by every service its layer
/// made; cheap to clone.
///
/// ```
/// use tower_throttle::key::HeaderKey;
/// use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
///
/// let layer = RateLimitLayer::new(Quota::per_minute(60)?, HeaderKey::new("x-api-key")?);
/// let handle = layer.handle();
///
/// // Tighten the default and give one client its own quota, at run time.
/// handle.retune(
///     vec![Quota::per_minute(30)?],
///     vec![Rule::new("batch", KeyPattern::parts(["batch-*"])?).with_quota(Quota::per_hour(100)?)],
/// )?;
/// // Switch limiting off without touching the service stack.
/// handle.set_enabled(false);
/// assert!(!handle.is_enabled());
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RateLimitHandle {
    limiter: Arc<Limiter>,
}

impl fmt::Debug for RateLimitHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitHandle")
            .field(&self.limiter)
            .finish()
    }
}

impl RateLimitHandle {
    pub(crate) fn new(limiter: Arc<Limiter>) -> Self {
        Self { limiter }
    }

    /// Switch limiting on or off. Off, every request passes untouched and
    /// nothing is counted; on again, each key continues from its state.
    pub fn set_enabled(&self, enabled: bool) {
        self.limiter.set_enabled(enabled);
    }

    /// Whether limiting is on.
    pub fn is_enabled(&self) -> bool {
        self.limiter.is_enabled()
    }

    /// Decide without enforcing (admit everything, count what would have
    /// been refused), or enforce again.
    pub fn set_dry_run(&self, dry_run: bool) {
        self.limiter.set_dry_run(dry_run);
    }

    /// Replace the default quotas and the rules at once.
    ///
    /// Keys keep what they have spent: a quota that stays in place (same
    /// rule name, same position, same algorithm) is retuned without minting
    /// capacity — a spent bucket stays spent when its burst or rate changes —
    /// and a key whose rule changes starts its new rule spent. Requests
    /// already waiting keep their booked instants, whether the new quota is
    /// faster or slower; every request booked after the retune goes after
    /// them, the new quota taking over at the last waiter's instant.
    /// Duplicate rule names are an error and change nothing.
    pub fn retune(&self, default: Vec<Quota>, rules: Vec<Rule>) -> Result<(), ConfigError> {
        self.limiter.retune(default, rules)
    }

    /// Apply validated [`Limits`]: quotas and rules (as
    /// [`retune`](Self::retune)), the switch and dry run. The wait mode is
    /// a property of each service and stays as built.
    pub fn apply(&self, limits: &Limits) -> Result<(), ConfigError> {
        self.limiter
            .retune(limits.default.clone(), limits.rules.clone())?;
        self.limiter.set_dry_run(limits.dry_run);
        self.limiter.set_enabled(limits.enabled);
        Ok(())
    }

    /// Replace the default quotas, keeping the rules.
    pub fn set_default(&self, default: Vec<Quota>) {
        let (_, rules) = self.limiter.config();
        // The rules were accepted before, so their names are unique.
        let _ = self.limiter.retune(default, rules);
    }

    /// Replace the rules, keeping the default quotas.
    pub fn set_rules(&self, rules: Vec<Rule>) -> Result<(), ConfigError> {
        let (default, _) = self.limiter.config();
        self.limiter.retune(default, rules)
    }

    /// The default quotas and the rules in force.
    pub fn config(&self) -> (Vec<Quota>, Vec<Rule>) {
        self.limiter.config()
    }

    /// Forget everything the key with these parts has spent, in every quota.
    pub fn reset<S: AsRef<str>>(&self, parts: &[S]) {
        self.limiter
            .forget(self.limiter.seed().hash_parts(parts), false);
    }

    /// Start a new turn for the key with these parts: its turn budgets are
    /// full again. Other keys' turns are untouched.
    pub fn new_turn<S: AsRef<str>>(&self, parts: &[S]) {
        self.limiter
            .forget(self.limiter.seed().hash_parts(parts), true);
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.limiter.stats.snapshot()
    }

    /// A subscription that yields a snapshot whenever the counters move.
    pub fn subscribe(&self) -> StatsSubscription {
        self.limiter.stats.subscribe()
    }

    /// How many (key, quota) states are held now, idle ones not yet swept
    /// included.
    pub fn key_count(&self) -> usize {
        self.limiter.len()
    }

    /// Drop the state of every idle key now, returning how many states were
    /// dropped. Idle keys are also swept as requests arrive; this is for
    /// callers who want the memory back at a moment of their choosing.
    pub fn evict_idle(&self) -> usize {
        self.limiter.evict_idle()
    }
}
