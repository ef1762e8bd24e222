//! Which keys a layer counts apart, and the bounded table of their counts.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::{Event, OTHER_KEYS, Tally};

/// Which keys a layer counts apart: at most `max_keys`, and of those only
/// the ones `filter` accepts (by the name the stats show).
#[derive(Clone, Default)]
pub(crate) struct KeyTracking {
    pub(crate) max_keys: usize,
    pub(crate) filter: Option<KeyFilter>,
}

/// Decides by a key's shown name whether it is counted apart.
pub(crate) type KeyFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl KeyTracking {
    /// Up to `max_keys` keys, each as it comes.
    pub(crate) fn up_to(max_keys: usize) -> Self {
        Self {
            max_keys,
            filter: None,
        }
    }

    /// Up to `max_keys` keys, those `filter` accepts.
    pub(crate) fn filtered(
        max_keys: usize,
        filter: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            max_keys,
            filter: Some(Arc::new(filter)),
        }
    }
}

impl fmt::Debug for KeyTracking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTracking")
            .field("max_keys", &self.max_keys)
            .field("filtered", &self.filter.is_some())
            .finish()
    }
}

/// The per-key table: the keys counted apart, and the rest added up.
#[derive(Default)]
pub(super) struct KeyTable {
    pub(super) keys: HashMap<u64, Tally>,
    pub(super) other: Option<Tally>,
    /// Requests in flight that were counted in `other`, by key (a layer
    /// that tracks in-flight only): when their key is counted apart later
    /// (a filter that accepts it once it proves real), they move with it.
    /// Bounded by the requests in flight: a key leaves at zero.
    pub(super) in_flight_as_other: HashMap<u64, u64>,
    /// Accepted keys met while the table was full (see `make_room`).
    pub(super) full_misses: u64,
}

impl KeyTable {
    pub(super) fn other(&mut self) -> &mut Tally {
        self.other.get_or_insert_with(|| Tally {
            text: OTHER_KEYS.to_owned(),
            ..Tally::default()
        })
    }

    pub(super) fn count_other(&mut self, event: Event) {
        self.other().count(event);
    }

    /// Count `event` of `key` in `other`, following its in-flight requests.
    pub(super) fn count_other_of(&mut self, key: u64, event: Event, tracks_in_flight: bool) {
        self.count_other(event);
        if !tracks_in_flight {
            return;
        }
        match event {
            Event::Entered => *self.in_flight_as_other.entry(key).or_default() += 1,
            Event::Left => {
                if let Some(n) = self.in_flight_as_other.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.in_flight_as_other.remove(&key);
                    }
                }
            }
            _ => {}
        }
    }

    /// Count `key` apart from now on as `text`, taking its requests in
    /// flight out of `other`.
    pub(super) fn insert(&mut self, key: u64, text: String) -> &mut Tally {
        let moved = self.in_flight_as_other.remove(&key).unwrap_or(0);
        if moved > 0 {
            // Their `Left` will find the key's own tally in flight.
            self.other().left += moved;
        }
        self.keys.entry(key).or_insert_with(|| Tally {
            text,
            carried: moved,
            ..Tally::default()
        })
    }

    /// Drop a key counted apart that nothing is in (no request in flight
    /// or queued) and that `keep` no longer accepts, adding its counts to
    /// `other`: room for a key the filter accepts now. Whether it did.
    pub(super) fn evict_one(&mut self, candidates: &[(u64, bool)]) -> bool {
        let found = candidates.iter().find(|&&(key, keep)| {
            !keep
                && self
                    .keys
                    .get(&key)
                    .is_some_and(|t| t.in_flight() == 0 && t.queued <= 0)
        });
        let Some(tally) = found.and_then(|&(key, _)| self.keys.remove(&key)) else {
            return false;
        };
        let other = self.other();
        other.admitted += tally.admitted;
        other.rejected += tally.rejected;
        other.would_reject += tally.would_reject;
        other.given_back += tally.given_back;
        other.waited += tally.waited;
        other.wait_nanos = other.wait_nanos.saturating_add(tally.wait_nanos);
        // Nothing in flight: what it admitted has all left (what it carried
        // left `other` when the key came in, or was never in it).
        other.left += tally.admitted;
        true
    }
}
