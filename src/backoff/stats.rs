//! What the backoff layer reports: cooldowns in force, snapshots and subscriptions.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::cooldown::Cooldowns;
use super::headers::Reason;
use crate::stats::{StatsSnapshot, StatsSubscription};

/// One route cooling down.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CooldownEntry {
    /// The key as it may be shown (see [`KeyStats::key`](crate::stats::KeyStats::key)).
    pub key: String,
    /// How long the cooldown has left (serialized as `remaining_ms`).
    #[serde(rename = "remaining_ms", serialize_with = "millis")]
    pub remaining: Duration,
    /// Where its length came from: a header, or the exponential rule.
    pub reason: Reason,
    /// The status of the response that started it: 429, 503, or a success
    /// that said the route was exhausted.
    pub status: u16,
}

impl CooldownEntry {
    pub(crate) fn new(key: &str, remaining: Duration, reason: Reason, status: u16) -> Self {
        Self {
            key: key.to_owned(),
            remaining,
            reason,
            status,
        }
    }
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// The counters and cooldowns of one backoff layer at one moment.
///
/// In [`requests`](Self::requests), `admitted` counts requests let through,
/// `rejected` those refused with
/// [`CoolingDown`](crate::error::CoolingDown), and `waited`/`queued_now` those
/// held until a cooldown ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BackoffSnapshot {
    /// What happened to requests, on the shared counters.
    pub requests: StatsSnapshot,
    /// Cooldowns started since the layer was built (a cooldown made longer
    /// while it lasts is not counted again).
    pub cooldowns_started: u64,
    /// Routes cooling down now, sorted by key.
    pub cooldowns: Vec<CooldownEntry>,
}

impl BackoffSnapshot {
    pub(crate) fn new(engine: &Cooldowns, requests: StatsSnapshot) -> Self {
        Self {
            requests,
            cooldowns_started: engine.cooldowns_started(),
            cooldowns: engine.cooldowns(),
        }
    }
}

/// Delivers a fresh [`BackoffSnapshot`] whenever the counters have moved or
/// a cooldown has started since the last one it returned; bursts coalesce.
///
/// A cooldown that merely runs out wakes nobody: the next snapshot no longer
/// lists it.
pub struct BackoffSubscription {
    pub(crate) engine: Arc<Cooldowns>,
    pub(crate) inner: StatsSubscription,
}

impl fmt::Debug for BackoffSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffSubscription")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl BackoffSubscription {
    /// Wait until something moves, then return a snapshot.
    pub async fn changed(&mut self) -> BackoffSnapshot {
        let requests = self.inner.changed().await;
        BackoffSnapshot::new(&self.engine, requests)
    }

    /// The counters and cooldowns now, without waiting.
    pub fn snapshot(&self) -> BackoffSnapshot {
        BackoffSnapshot::new(&self.engine, self.inner.snapshot())
    }
}
