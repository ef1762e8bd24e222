//! `ConcurrencyHandle`: reads and resizes a running layer's permits.

use super::permits::Permits;
use crate::error::ConfigError;
use crate::home::Cell;
use crate::stats::{StatsSnapshot, StatsSubscription};

/// Live control and stats of a running
/// [`ConcurrencyLayer`](super::ConcurrencyLayer), shared by every service it
/// made; cheap to clone.
///
/// ```
/// use tower_throttle::concurrency::ConcurrencyLayer;
/// use tower_throttle::key::GlobalKey;
///
/// let layer = ConcurrencyLayer::new(4, GlobalKey)?;
/// let handle = layer.handle();
/// let stats = handle.stats();
/// assert_eq!(stats.aggregate.in_flight, Some(0));
/// assert_eq!(stats.aggregate.queued_now, 0);
///
/// // Resize at run time: requests in flight keep their permits.
/// handle.set_max_in_flight(2)?;
/// assert_eq!(handle.max_in_flight(), 2);
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyHandle {
    cell: Cell<Permits>,
}

handle_on_cell!(ConcurrencyHandle, Permits);

impl ConcurrencyHandle {
    /// The counters now: admitted, rejected (queue full or timed out),
    /// waited and total wait, queued now and in flight now.
    pub fn stats(&self) -> StatsSnapshot {
        self.cell.load().stats.snapshot()
    }

    /// A subscription that yields a snapshot whenever the counters move.
    pub fn subscribe(&self) -> StatsSubscription {
        // The single key's counts are read through the permits: keep them.
        let permits = self.cell.load_full();
        permits.stats.subscribe_keeping(permits.clone())
    }

    /// Zero the counters (admitted, refused, waited, wait times, keys not
    /// counted apart); the gauges (`queued_now`, `in_flight`) keep counting
    /// what is there, and no permit or waiter is touched.
    pub fn reset_stats(&self) {
        self.cell.load().stats.reset();
    }

    /// The most requests in flight per key.
    pub fn max_in_flight(&self) -> usize {
        self.cell.load().max()
    }

    /// Let at most `max_in_flight` requests per key be in flight from now
    /// on, for every key (a layer keyed by
    /// [`GlobalKey`](crate::key::GlobalKey) included). Nothing in flight is
    /// dropped. Lower: the requests in flight keep their permits, and
    /// requests waiting, or arriving, wait until fewer than the new limit
    /// are in flight. Higher: waiting requests get the new permits at once,
    /// in the order they came. Either way waiters keep their order.
    ///
    /// Zero is an error, as for [`ConcurrencyLayer::new`](super::ConcurrencyLayer::new);
    /// more than `u32::MAX` is taken as `u32::MAX`.
    pub fn set_max_in_flight(&self, max_in_flight: usize) -> Result<(), ConfigError> {
        if max_in_flight == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                "must be at least 1; with 0 no request could ever go through",
            ));
        }
        self.cell.load().set_max(max_in_flight);
        Ok(())
    }

    /// Switch the limit on or off. Off, no request waits or is refused
    /// (not even one without a key): waiting requests go at once, and the
    /// others pass to the inner service as they come. Requests in flight
    /// are still counted, so that back on, every key continues from what
    /// it has in flight: new requests wait until it is below the limit.
    pub fn set_enabled(&self, enabled: bool) {
        self.cell.load().set_enabled(enabled);
    }

    /// Whether the limit is on.
    pub fn is_enabled(&self) -> bool {
        self.cell.load().is_enabled()
    }

    /// How many keys hold state now: those with a request in flight or
    /// waiting, the last key of each live service, and idle keys not yet
    /// dropped (an idle key is dropped as it goes idle once its shard of
    /// the store holds more than 64 keys, so a few thousand at most stay).
    /// The one key of a layer keyed by
    /// [`GlobalKey`](crate::key::GlobalKey) counts while it has a request
    /// in flight or waiting.
    pub fn key_count(&self) -> usize {
        self.cell.load().key_count()
    }

    /// Drop the state of every idle key now, returning how many were
    /// dropped. Idle keys are also dropped as they go idle; this is for
    /// callers who want the last few gone at a moment of their choosing.
    pub fn evict_idle(&self) -> usize {
        self.cell.load().evict_idle()
    }
}
