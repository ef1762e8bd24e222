use std::fmt;
use std::sync::Arc;

use super::permits::Permits;
use crate::stats::{StatsSnapshot, StatsSubscription};

/// Stats of a running [`ConcurrencyLayer`](super::ConcurrencyLayer), shared
/// by every service it made; cheap to clone.
///
/// ```
/// use tower_throttle::concurrency::ConcurrencyLayer;
/// use tower_throttle::key::GlobalKey;
///
/// let layer = ConcurrencyLayer::new(4, GlobalKey)?;
/// let stats = layer.handle().stats();
/// assert_eq!(stats.aggregate.in_flight, Some(0));
/// assert_eq!(stats.aggregate.queued_now, 0);
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyHandle {
    permits: Arc<Permits>,
}

impl fmt::Debug for ConcurrencyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConcurrencyHandle")
            .field(&self.permits)
            .finish()
    }
}

impl ConcurrencyHandle {
    pub(crate) fn new(permits: Arc<Permits>) -> Self {
        Self { permits }
    }

    /// The counters now: admitted, rejected (queue full or timed out),
    /// waited and total wait, queued now and in flight now.
    pub fn stats(&self) -> StatsSnapshot {
        self.permits.stats.snapshot()
    }

    /// A subscription that yields a snapshot whenever the counters move.
    pub fn subscribe(&self) -> StatsSubscription {
        // The single key's counts are read through the permits: keep them.
        self.permits.stats.subscribe_keeping(self.permits.clone())
    }

    /// The most requests in flight per key.
    pub fn max_in_flight(&self) -> usize {
        self.permits.max()
    }

    /// How many keys hold state now: those with a request in flight or
    /// waiting, the last key of each live service, and idle keys not yet
    /// dropped (an idle key is dropped as it goes idle once its shard of
    /// the store holds more than 64 keys, so a few thousand at most stay).
    /// The one key of a layer keyed by
    /// [`GlobalKey`](crate::key::GlobalKey) counts while it has a request
    /// in flight or waiting.
    pub fn key_count(&self) -> usize {
        self.permits.key_count()
    }

    /// Drop the state of every idle key now, returning how many were
    /// dropped. Idle keys are also dropped as they go idle; this is for
    /// callers who want the last few gone at a moment of their choosing.
    pub fn evict_idle(&self) -> usize {
        self.permits.evict_idle()
    }
}
