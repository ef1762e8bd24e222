//! What the loom models (`tests/loom_permits.rs`, through
//! [`crate::loom_api`]) need of a key state: a state made outside the store,
//! and its inside read at rest.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{ADMITTED, FREE_BELOW, KeyState, OUT, Permits, QUEUED};
use crate::key::KeyHash;
use crate::loom_api::Rest;
use crate::stats::{KeyTracking, Stats};

impl KeyState {
    /// A key's state as the store makes it (counted in `stats`), but kept
    /// outside the store: the models leave the store (and its idle-state
    /// dropping) out.
    pub(crate) fn for_model(max: usize, stats: Arc<Stats>) -> Arc<Self> {
        Self::new(max, KeyHash(1), stats, None, false)
    }

    /// The state's inside, read under its lock.
    pub(crate) fn inside(&self) -> Rest {
        let own_counts = self.own_counts();
        let queue = self.queue.lock();
        let word = self.word.load(Ordering::Acquire);
        Rest {
            out: word & OUT,
            queued_flag: word & QUEUED != 0,
            waiters: queue.waiters.len(),
            granted: queue.granted,
            in_word: (word & !QUEUED) / ADMITTED,
            carried: queue.carried,
            own_counts,
            free: word < FREE_BELOW,
        }
    }

    /// Let at most `max` out from now on (a retune of this one key).
    pub(crate) fn retune(&self, max: u64) {
        self.set_max(max);
    }
}

impl Permits {
    /// The permits of a layer keyed by `GlobalKey`, with no per-key stats:
    /// its state counts its admissions in its word.
    pub(crate) fn for_model(max: usize) -> Arc<Self> {
        Self::new(max, KeyTracking::default())
    }
}
