//! `RateLimitHandle`: reads and changes a running layer's limits and state.

use std::time::Duration;

use super::config::Limits;
use super::limiter::Limiter;
use super::quota::Quota;
use super::rule::Rule;
use crate::error::ConfigError;
use crate::home::Cell;
use crate::key::KeyTexts;
use crate::stats::{StatsSnapshot, StatsSubscription};

/// Live control of a running rate limiter, shared by every service its layer
/// made; cheap to clone.
///
/// A handle taken from a layer follows it through the builder: taken before
/// [`with_quota`](super::RateLimitLayer::with_quota),
/// [`with_rule`](super::RateLimitLayer::with_rule),
/// [`with_key_stats`](super::RateLimitLayer::with_key_stats) or
/// [`with_clock`](super::RateLimitLayer::with_clock), it controls the
/// limiter those build, which the services use.
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
    cell: Cell<Limiter>,
}

handle_on_cell!(RateLimitHandle, Limiter);

impl RateLimitHandle {
    /// Switch limiting on or off. Off, every request passes untouched and
    /// nothing is counted; on again, each key continues from its state.
    pub fn set_enabled(&self, enabled: bool) {
        self.cell.load().set_enabled(enabled);
    }

    /// Whether limiting is on.
    pub fn is_enabled(&self) -> bool {
        self.cell.load().is_enabled()
    }

    /// Decide without enforcing (admit everything, count what would have
    /// been refused), or enforce again.
    pub fn set_dry_run(&self, dry_run: bool) {
        self.cell.load().set_dry_run(dry_run);
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
        self.cell.load().retune(default, rules)
    }

    /// Apply validated [`Limits`]: quotas and rules (as
    /// [`retune`](Self::retune)), the switch and dry run. The wait mode is
    /// a property of each service and stays as built.
    pub fn apply(&self, limits: &Limits) -> Result<(), ConfigError> {
        let limiter = self.cell.load();
        limiter.retune(limits.default.clone(), limits.rules.clone())?;
        limiter.set_dry_run(limits.dry_run);
        limiter.set_enabled(limits.enabled);
        Ok(())
    }

    /// Replace the default quotas, keeping the rules.
    ///
    /// On a limiter that keeps its state in Redis, quotas Redis cannot keep
    /// (see [`with_store`](super::RateLimitLayer::with_store)) are not
    /// applied, and a warning says so; [`retune`](Self::retune) returns the
    /// error instead.
    pub fn set_default(&self, default: Vec<Quota>) {
        let limiter = self.cell.load();
        let (_, rules) = limiter.config();
        // The rules were accepted before, so their names are unique: only a
        // store refuses, and that must not go unsaid.
        if let Err(e) = limiter.retune(default, rules) {
            tracing::warn!(error = %e, "rate limit: default quotas not changed");
        }
    }

    /// Replace the rules, keeping the default quotas.
    pub fn set_rules(&self, rules: Vec<Rule>) -> Result<(), ConfigError> {
        let limiter = self.cell.load();
        let (default, _) = limiter.config();
        limiter.retune(default, rules)
    }

    /// The default quotas and the rules in force.
    pub fn config(&self) -> (Vec<Quota>, Vec<Rule>) {
        self.cell.load().config()
    }

    /// Forget everything the key with these parts has spent, in every
    /// quota. It takes effect at once: requests already waiting keep their
    /// booked instants, and newcomers do not queue behind them. A request
    /// admitted before the reset whose outcome then does not count (see
    /// [`count_only`](super::RateLimitLayer::count_only)) gives nothing
    /// back: the reset already did, and a refund now could free what a
    /// request admitted since has taken.
    ///
    /// On a limiter that keeps its state in Redis, the key's state there is
    /// deleted by a task of its own: this returns before Redis has it.
    pub fn reset<S: AsRef<str>>(&self, parts: &[S]) {
        let limiter = self.cell.load();
        limiter.reset(Some(limiter.seed().hash_parts(parts)));
        limiter.forget_remote(parts, false);
    }

    /// Forget what every key has spent, in every quota, as
    /// [`reset`](Self::reset) does for one key: all flow state starts
    /// afresh, and the memory it held is given back. The counters are kept
    /// ([`reset_stats`](Self::reset_stats) zeroes them).
    ///
    /// On a limiter that keeps its state in Redis, this clears what this
    /// replica holds (its in-process state and its cache of refused keys),
    /// not the shared state in Redis: removing a whole prefix is for the
    /// operator (`redis-cli --scan --pattern 'PREFIX*'`), not for one replica.
    ///
    /// ```
    /// use tower_throttle::key::HeaderKey;
    /// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Quota::per_turn(4)?, HeaderKey::new("x-agent")?);
    /// let handle = layer.handle();
    /// handle.reset_all();
    /// assert_eq!(handle.key_count(), 0);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn reset_all(&self) {
        let limiter = self.cell.load();
        limiter.reset(None);
        limiter.forget_remote_refusals();
    }

    /// Start a new turn for the key with these parts: its turn budgets are
    /// full again. Other keys' turns are untouched. A request admitted in
    /// the old turn whose outcome then does not count gives back nothing to
    /// the new one.
    ///
    /// On a limiter that keeps its state in Redis, as for
    /// [`reset`](Self::reset): a task of its own deletes the turn budgets'
    /// state there.
    pub fn new_turn<S: AsRef<str>>(&self, parts: &[S]) {
        let limiter = self.cell.load();
        limiter.new_turn(limiter.seed().hash_parts(parts));
        limiter.forget_remote(parts, true);
    }

    /// The counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.cell.load().stats.snapshot()
    }

    /// A subscription that yields a snapshot whenever the counters move.
    pub fn subscribe(&self) -> StatsSubscription {
        self.cell.load().stats.subscribe()
    }

    /// Zero the counters (admitted, refused, waited, wait times, keys not
    /// counted apart); the gauges (`queued_now`) keep counting what is
    /// there. Nothing the limiter decides by changes: every key keeps what
    /// it has spent, and waiting requests their turns.
    pub fn reset_stats(&self) {
        self.cell.load().stats.reset();
    }

    /// How long a request of cost 1 on the key with these parts, arriving
    /// now, would wait for its turn (zero: it would go at once), without
    /// booking anything or changing any state: what the next request gets is
    /// the same whether or not this was asked.
    ///
    /// The wait counts the key's quotas (under its rule) and the requests
    /// already waiting on it. Whether the request would wait that long or
    /// be refused depends on the service's `max_wait`. Zero when limiting
    /// is off, in a dry run, and for a key without a quota. On a limiter
    /// that keeps its state in Redis (feature `redis`), what this replica
    /// knows without asking: the `retry_after` of a refusal it remembers,
    /// else zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::key::HeaderKey;
    /// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Quota::per_second(2)?, HeaderKey::new("x-api-key")?);
    /// let handle = layer.handle();
    /// // A fresh key would go at once.
    /// assert_eq!(handle.peek_wait(&["alice"]), Duration::ZERO);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn peek_wait<S: AsRef<str>>(&self, parts: &[S]) -> Duration {
        let limiter = self.cell.load();
        let key = limiter.seed().hash_parts(parts);
        limiter.peek_wait(key, &|| KeyTexts::of_parts(parts))
    }

    /// How many (key, quota) states are held now, idle ones not yet swept
    /// included.
    pub fn key_count(&self) -> usize {
        self.cell.load().len()
    }

    /// Drop the state of every idle key now, returning how many states were
    /// dropped. Idle keys are also swept as requests arrive; this is for
    /// callers who want the memory back at a moment of their choosing.
    pub fn evict_idle(&self) -> usize {
        self.cell.load().evict_idle()
    }
}
