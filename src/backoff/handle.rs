//! `BackoffHandle`: reads and changes a running layer's cooldowns and settings.

use std::time::Duration;

use super::BackoffConfig;
use super::cooldown::{Cooldowns, Lengths};
use super::exponential::ExponentialBackoff;
use super::stats::{BackoffSnapshot, BackoffSubscription, CooldownEntry};
use crate::error::ConfigError;
use crate::home::Cell;

/// A view of a running backoff layer, shared by every service it made, and
/// its live settings; cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backoff::{Backoff429Layer, ExponentialBackoff};
/// use tower_throttle::key::HostKey;
///
/// let layer = Backoff429Layer::new(HostKey);
/// let handle = layer.handle();
/// assert!(handle.cooldowns().is_empty());
/// assert_eq!(handle.stats().cooldowns_started, 0);
/// assert!(handle.cooldown(&["api.openai.com"]).is_none());
///
/// // Longer cooldowns from the next 429 on, with some jitter.
/// let backoff = ExponentialBackoff::new(Duration::from_secs(2), Duration::from_secs(120))
///     .with_jitter(0.1)?;
/// handle.set_backoff(backoff);
/// assert_eq!(handle.backoff(), backoff);
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct BackoffHandle {
    cell: Cell<Cooldowns>,
}

handle_on_cell!(BackoffHandle, Cooldowns);

impl BackoffHandle {
    /// Apply a `[backoff]` section's cooldown lengths, jitter, `on_503` and
    /// `proactive` to the running layer, a field left out taking its
    /// default; the mode and `max_wait` belong to the services built and
    /// are left as they are. Everything is checked before anything changes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::backoff::{Backoff429Layer, BackoffConfig};
    /// use tower_throttle::key::GlobalKey;
    ///
    /// let handle = Backoff429Layer::new(GlobalKey).handle();
    /// let mut config = BackoffConfig::default();
    /// config.initial_backoff = Some(Duration::from_secs(2));
    /// config.max_backoff = Some(Duration::ZERO); // a fixed 2 s
    /// handle.apply(&config)?;
    /// assert_eq!(handle.backoff().base(3).as_secs(), 2);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn apply(&self, config: &BackoffConfig) -> Result<(), ConfigError> {
        let live = config.live()?;
        self.set_backoff(live.backoff);
        self.set_max_cooldown(live.max_cooldown);
        self.set_on_503(live.on_503);
        self.set_proactive(live.proactive);
        Ok(())
    }

    /// The counters and the cooldowns in force now.
    pub fn stats(&self) -> BackoffSnapshot {
        let engine = self.cell.load();
        BackoffSnapshot::new(&engine, engine.stats.snapshot())
    }

    /// A subscription that yields a snapshot whenever the counters move or a
    /// cooldown starts.
    pub fn subscribe(&self) -> BackoffSubscription {
        let engine = self.cell.load_full();
        BackoffSubscription {
            inner: engine.stats.subscribe(),
            engine,
        }
    }

    /// Zero the counters (requests let through, refused, waited, wait
    /// times, cooldowns started); the gauge `queued_now` keeps counting what
    /// is there. Cooldowns in force, streaks and waiting requests are
    /// untouched.
    pub fn reset_stats(&self) {
        self.cell.load().reset_stats();
    }

    /// The routes cooling down now, with what is left and why, sorted by
    /// key.
    pub fn cooldowns(&self) -> Vec<CooldownEntry> {
        self.cell.load().cooldowns()
    }

    /// The cooldown of the key with these parts, if it is cooling down.
    pub fn cooldown<S: AsRef<str>>(&self, parts: &[S]) -> Option<CooldownEntry> {
        let engine = self.cell.load();
        engine.cooldown(engine.seed().hash_parts(parts))
    }

    /// Cooldowns started since the layer was built, or since the counters
    /// were last [reset](Self::reset_stats).
    pub fn cooldowns_started(&self) -> u64 {
        self.cell.load().cooldowns_started()
    }

    /// The exponential rule: lengths and jitter of the cooldowns a
    /// response does not give the length of.
    pub fn backoff(&self) -> ExponentialBackoff {
        self.cell.load().lengths().backoff
    }

    /// Use `backoff` for cooldowns that start from now on (the initial
    /// length, the cap, the jitter). Cooldowns already running keep their
    /// end; each route keeps its streak of 429s, so its next cooldown is
    /// the new rule's length for that streak.
    pub fn set_backoff(&self, backoff: ExponentialBackoff) {
        let engine = self.cell.load();
        let lengths = engine.lengths();
        engine.set_lengths(Lengths { backoff, ..lengths });
    }

    /// The longest cooldown anything can start.
    pub fn max_cooldown(&self) -> Duration {
        self.cell.load().lengths().max_cooldown
    }

    /// Let nothing start a cooldown longer than `max` from now on (a header
    /// or the rule). Cooldowns already running keep their end.
    pub fn set_max_cooldown(&self, max: Duration) {
        let engine = self.cell.load();
        let lengths = engine.lengths();
        engine.set_lengths(Lengths {
            max_cooldown: max,
            ..lengths
        });
    }

    /// Also cool a route down on 503 with `Retry-After`, or stop doing so,
    /// for responses read from now on.
    pub fn set_on_503(&self, on: bool) {
        self.cell.load().set_on_503(on);
    }

    /// Start cooldowns on successes that say the route is exhausted, or stop
    /// doing so, for responses read from now on.
    pub fn set_proactive(&self, on: bool) {
        self.cell.load().set_proactive(on);
    }

    /// Switch the layer on or off. Off, requests pass untouched (a route
    /// cooling down is not refused or held, not even the key is read) and
    /// responses start no cooldown; requests already waiting keep waiting
    /// for the end of their cooldown. Back on, each route continues from
    /// its state: a cooldown that has not ended yet is in force again.
    pub fn set_enabled(&self, enabled: bool) {
        self.cell.load().set_enabled(enabled);
    }

    /// Whether the layer is on.
    pub fn is_enabled(&self) -> bool {
        self.cell.load().is_enabled()
    }

    /// How many routes hold state now, idle ones not yet swept included.
    pub fn key_count(&self) -> usize {
        self.cell.load().len()
    }

    /// Drop the state of every idle route now (no cooldown, no waiter, no
    /// streak it still remembers), returning how many were dropped. Idle
    /// routes are also swept as requests arrive.
    pub fn evict_idle(&self) -> usize {
        self.cell.load().evict_idle()
    }
}
