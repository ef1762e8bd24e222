use std::fmt;
use std::sync::Arc;

use super::cooldown::Cooldowns;
use super::stats::{BackoffSnapshot, BackoffSubscription, CooldownEntry};

/// A view of a running backoff layer, shared by every service it made;
/// cheap to clone.
///
/// ```
/// use tower_throttle::backoff::Backoff429Layer;
/// use tower_throttle::key::HostKey;
///
/// let layer = Backoff429Layer::new(HostKey);
/// let handle = layer.handle();
/// assert!(handle.cooldowns().is_empty());
/// assert_eq!(handle.stats().cooldowns_started, 0);
/// assert!(handle.cooldown(&["api.openai.com"]).is_none());
/// ```
#[derive(Clone)]
pub struct BackoffHandle {
    engine: Arc<Cooldowns>,
}

impl fmt::Debug for BackoffHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackoffHandle").field(&self.engine).finish()
    }
}

impl BackoffHandle {
    pub(crate) fn new(engine: Arc<Cooldowns>) -> Self {
        Self { engine }
    }

    /// The counters and the cooldowns in force now.
    pub fn stats(&self) -> BackoffSnapshot {
        BackoffSnapshot::new(&self.engine, self.engine.stats.snapshot())
    }

    /// A subscription that yields a snapshot whenever the counters move or a
    /// cooldown starts.
    pub fn subscribe(&self) -> BackoffSubscription {
        BackoffSubscription {
            engine: self.engine.clone(),
            inner: self.engine.stats.subscribe(),
        }
    }

    /// The routes cooling down now, with what is left and why, sorted by
    /// key.
    pub fn cooldowns(&self) -> Vec<CooldownEntry> {
        self.engine.cooldowns()
    }

    /// The cooldown of the key with these parts, if it is cooling down.
    pub fn cooldown<S: AsRef<str>>(&self, parts: &[S]) -> Option<CooldownEntry> {
        self.engine.cooldown(self.engine.seed().hash_parts(parts))
    }

    /// Cooldowns started since the layer was built.
    pub fn cooldowns_started(&self) -> u64 {
        self.engine.cooldowns_started()
    }

    /// How many routes hold state now, idle ones not yet swept included.
    pub fn key_count(&self) -> usize {
        self.engine.len()
    }

    /// Drop the state of every idle route now (no cooldown, no waiter, no
    /// streak it still remembers), returning how many were dropped. Idle
    /// routes are also swept as requests arrive.
    pub fn evict_idle(&self) -> usize {
        self.engine.evict_idle()
    }
}
