//! What the route table does with a cooldown shared through Redis: the
//! state the store says, folded into this replica's; and what a watched
//! response names for the report back.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Cooldowns, Listed, Watch};
use crate::backoff::headers::Reason;
use crate::backoff::redis::SharedCooldown;
use crate::clock::saturating_nanos;
use crate::key::KeyHash;

impl Cooldowns {
    /// Fold the route's shared state, as the store says it (`shared`), into
    /// this replica's: the longer cooldown wins, the streak is the
    /// store's.
    pub(crate) fn merge_shared(&self, key: KeyHash, shared: SharedCooldown, text: &Arc<str>) {
        let now = self.timeline.now();
        let lengths = self.lengths();
        // Redis is outside this process: no cooldown read there lasts
        // longer than this replica would set one itself.
        let cooling = shared.cooling.min(lengths.max_cooldown);
        let until = now.saturating_add(saturating_nanos(cooling));
        let mut locked = self.routes.lock(key, now);
        let ((), route) = locked.get();
        route.refresh(now);
        route.streak = shared.streak;
        route.shared_generation = route.shared_generation.max(shared.generation);
        if route.text.is_none() {
            route.text = Some(text.clone());
        }
        // Nothing cooling there (most reads), or within a millisecond of
        // this replica's own: the same cooldown, seen through a round trip.
        // Neither starts one here, nor makes requests in flight stale.
        if until <= now || until <= route.until.saturating_add(1_000_000) {
            return;
        }
        let was_cooling = route.until > now;
        route.until = until;
        let forget_after = lengths.backoff.cap().min(lengths.max_cooldown);
        route.forget_at = until.saturating_add(saturating_nanos(forget_after));
        // The queue's head, asleep until the old end, looks again then.
        route.generation = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        drop(locked);
        if !was_cooling {
            self.started.fetch_add(1, Ordering::Relaxed);
        }
        let mut active = self.active.lock();
        if active.map.len() >= active.prune_at {
            active.prune(now);
        }
        active.map.insert(
            key.0,
            Listed {
                text: text.clone(),
                until,
                reason: Reason::Shared,
                status: 429,
            },
        );
        drop(active);
        self.stats.touch();
    }
}

impl Watch {
    /// The engine the watch reports to.
    pub(crate) fn engine(&self) -> &Arc<Cooldowns> {
        &self.engine
    }

    /// The route watched.
    pub(crate) fn key(&self) -> KeyHash {
        self.key
    }

    /// The route's name as it may be shown.
    pub(crate) fn text(&self) -> Arc<str> {
        self.text.clone()
    }
}
