//! Subscriptions to a layer's stats: woken once per burst of changes.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;

use super::{Stats, StatsSnapshot};
use crate::sync::{AtomicBool, AtomicU64};

/// Wakes subscribers once per burst of changes.
#[derive(Default)]
pub(super) struct Hub {
    /// Set by the first change after a subscriber looked.
    pub(super) dirty: AtomicBool,
    /// Counts the bursts: a subscriber that saw an older epoch has news.
    pub(super) epoch: AtomicU64,
    pub(super) notify: Notify,
}

impl Hub {
    #[inline]
    pub(super) fn touch(&self) {
        // In a burst the flag is already set: one relaxed load, nothing else.
        if !self.dirty.load(Ordering::Relaxed) && !self.dirty.swap(true, Ordering::AcqRel) {
            self.epoch.fetch_add(1, Ordering::Release);
            self.notify.notify_waiters();
        }
    }
}

/// Delivers a fresh [`StatsSnapshot`] whenever the counters have moved since
/// the last one this subscription returned. Bursts coalesce: however many
/// requests happened in between, one snapshot tells of all of them.
pub struct StatsSubscription {
    pub(super) stats: Arc<Stats>,
    pub(super) seen: u64,
    pub(super) _keep: Option<Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for StatsSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatsSubscription")
            .field("seen", &self.seen)
            .finish()
    }
}

impl StatsSubscription {
    /// Wait until the counters move, then return a snapshot.
    pub async fn changed(&mut self) -> StatsSnapshot {
        let hub = &self.stats.hub;
        loop {
            let notified = hub.notify.notified();
            tokio::pin!(notified);
            // Register before looking, so a change in between is not missed.
            notified.as_mut().enable();
            let epoch = hub.epoch.load(Ordering::Acquire);
            if epoch != self.seen {
                self.seen = epoch;
                // Re-arm first, so changes during the snapshot wake us again.
                hub.dirty.store(false, Ordering::Release);
                return self.stats.snapshot();
            }
            notified.await;
        }
    }

    /// The counters now, without waiting.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

impl Stats {
    /// Wake subscribers for a change that is not one of the counted events
    /// (a layer's own state, such as a cooldown starting).
    #[inline]
    pub(crate) fn touch(&self) {
        self.hub.touch();
    }
}
