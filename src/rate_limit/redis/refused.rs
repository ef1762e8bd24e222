//! The local cache of keys Redis refused: a flood on a refused key costs no round trips.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Nanos, saturating_nanos};
use crate::key::KeyHash;
use crate::store::PassThrough;

/// Keys Redis refused, until they could be admitted again: a flood of
/// requests on a refused key costs no round trips.
pub(crate) struct Refused {
    inner: Mutex<Inner>,
    /// Moves on at every forget, under the lock: a refusal asked before a
    /// reset and heard after it (the reset's deletion raced its reply) is
    /// not remembered, or the key would stay refused here past the reset.
    forgets: AtomicU64,
    /// Numbers the questions asked of Redis, in the order they are sent.
    asks: AtomicU64,
}

struct Inner {
    keys: HashMap<u64, Refusal, BuildHasherDefault<PassThrough>>,
    /// The latest booking heard of a key, by the key's slot: the key and
    /// the question number then. A refusal of the key asked before it and
    /// heard after it (Redis may have run it first) is not remembered, or
    /// its wait would leave that booking out. Slots are shared by keys: a
    /// collision only misses that check, for a wait short by at most what
    /// the key booked meanwhile, for at most a second.
    booked: [(u64, u64); BOOKED_SLOTS],
}

/// Slots of [`Inner::booked`]: enough for the keys booked while a refusal
/// of theirs is in flight, which are few.
const BOOKED_SLOTS: usize = 256;

/// What the cache was at when a question was sent, given back to
/// [`Refused::insert`] with Redis's refusal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epoch {
    forgets: u64,
    number: u64,
}

#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The earliest a request of `cost` could be admitted, on the store's
    /// local clock (`RedisStore::local_micros`).
    until: u64,
    /// Until when the refusal is answered from here: at most
    /// [`CACHED_FOR`] after it was heard, since a reset, a new turn or a
    /// give-back on another replica changes Redis without telling this one.
    expires: u64,
    cost: u32,
    /// An index into the quotas of the policy generation below.
    slowest: usize,
    /// The limiter's policy generation the refusal was made under: a
    /// retune or a reset since (which may have heard it late) voids it.
    generation: u32,
}

/// At most this many refused keys are remembered; more are asked again.
const MAX_REFUSED: usize = 10_000;

/// The longest a refusal is answered from a replica's cache, in
/// microseconds: what another replica's reset, new turn or give-back can
/// take to be seen here. A flood on a refused key then costs one round
/// trip a second, not one per request.
const CACHED_FOR: u64 = 1_000_000;

impl Default for Refused {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                keys: HashMap::default(),
                booked: [(0, 0); BOOKED_SLOTS],
            }),
            forgets: AtomicU64::new(0),
            asks: AtomicU64::new(1),
        }
    }
}

/// The slot of `key` in [`Inner::booked`].
fn slot(key: u64) -> usize {
    // Key hashes are uniform already (seeded): their low bits will do.
    (key % BOOKED_SLOTS as u64) as usize
}

impl Refused {
    /// The wait and slowest quota of a request of `cost` on `key` at `now`
    /// under policy `generation` that is sure to be refused: one of the
    /// same cost was refused under it, and the instant it could go is still
    /// beyond `max_wait`. Only the same cost: a costlier request is refused
    /// too, but may have to wait longer, and its `retry_after` is exact.
    pub(crate) fn check(
        &self,
        key: KeyHash,
        cost: u32,
        max_wait: Nanos,
        now: u64,
        generation: u32,
    ) -> Option<(Duration, usize)> {
        let keys = &mut self.inner.lock().keys;
        let refusal = *keys.get(&key.0)?;
        if refusal.expires <= now || refusal.generation != generation {
            keys.remove(&key.0);
            return None;
        }
        let wait = Duration::from_micros(refusal.until - now);
        (cost == refusal.cost && saturating_nanos(wait) > max_wait)
            .then_some((wait, refusal.slowest))
    }

    /// Where the cache is: taken before asking Redis, given back to
    /// [`insert`](Self::insert).
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch {
            forgets: self.forgets.load(Ordering::Acquire),
            number: self.asks.fetch_add(1, Ordering::AcqRel),
        }
    }

    /// Remember at `now` that a request of `cost` on `key` cannot go for
    /// `wait` under policy `generation`, unless something was forgotten,
    /// or the key booked, since [`epoch`](Self::epoch) said `asked`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert(
        &self,
        key: KeyHash,
        cost: u32,
        now: u64,
        wait: Duration,
        slowest: usize,
        generation: u32,
        asked: Epoch,
    ) {
        let until = now.saturating_add(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX));
        let mut inner = self.inner.lock();
        if self.forgets.load(Ordering::Acquire) != asked.forgets {
            return;
        }
        if matches!(inner.booked[slot(key.0)], (k, at) if k == key.0 && at > asked.number) {
            return;
        }
        let keys = &mut inner.keys;
        if keys.len() >= MAX_REFUSED && !keys.contains_key(&key.0) {
            keys.retain(|_, r| r.expires > now);
            if keys.len() >= MAX_REFUSED {
                return;
            }
        }
        let refusal = Refusal {
            until,
            expires: until.min(now.saturating_add(CACHED_FOR)),
            cost,
            slowest,
            generation,
        };
        keys.entry(key.0)
            .and_modify(|r| {
                // The cheaper refusal answers more of a flood (the cheaper
                // requests; the costlier ask Redis); one that is over, or
                // of an older policy, is replaced.
                if cost <= r.cost || r.expires <= now || r.generation != generation {
                    *r = refusal;
                }
            })
            .or_insert(refusal);
    }

    /// A request of `key` was booked: what it took makes a refusal of the
    /// key remembered here answer too short a wait (a request of 1 admitted
    /// after one of 57 was refused; the next of 57 waits for both), so it
    /// is forgotten and the next such request asks Redis. Not counted as a
    /// forget: refusals of other keys heard meanwhile still hold, so a
    /// flood on one key stays cached while others are admitted.
    pub(crate) fn booked(&self, key: KeyHash) {
        let number = self.asks.load(Ordering::Acquire);
        let mut inner = self.inner.lock();
        inner.keys.remove(&key.0);
        // A refusal of the key still in flight was asked before this.
        inner.booked[slot(key.0)] = (key.0, number);
    }

    /// Forget `key` (a reset), or every key (`None`: a retune).
    pub(crate) fn forget(&self, key: Option<KeyHash>) {
        let keys = &mut self.inner.lock().keys;
        self.forgets.fetch_add(1, Ordering::AcqRel);
        match key {
            Some(key) => {
                keys.remove(&key.0);
            }
            None => keys.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_key_is_refused_locally_until_it_could_go() {
        let refused = Refused::default();
        let key = KeyHash(1);
        refused.insert(
            key,
            2,
            1_000,
            Duration::from_micros(500),
            0,
            1,
            refused.epoch(),
        );
        // As costly, beyond max_wait: refused here.
        assert_eq!(
            refused.check(key, 2, 0, 1_100, 1),
            Some((Duration::from_micros(400), 0))
        );
        // Costlier: refused too, but its wait may be longer, which only
        // Redis can tell.
        assert_eq!(refused.check(key, 3, 0, 1_100, 1), None);
        // Under another policy generation (a retune, a reset): void.
        assert_eq!(refused.check(key, 2, 0, 1_100, 2), None);
        refused.insert(
            key,
            2,
            1_000,
            Duration::from_micros(500),
            0,
            1,
            refused.epoch(),
        );
        // Cheaper: Redis may admit it.
        assert_eq!(refused.check(key, 1, 0, 1_100, 1), None);
        // Within the wait allowed: Redis books it.
        assert_eq!(refused.check(key, 2, 400_000, 1_100, 1), None);
        // At the instant: asked again, and forgotten.
        assert_eq!(refused.check(key, 2, 0, 1_500, 1), None);
        assert!(refused.inner.lock().keys.is_empty());
    }

    #[test]
    fn a_booking_of_the_key_forgets_its_refusal_and_no_other() {
        let refused = Refused::default();
        for k in [1, 2] {
            refused.insert(
                KeyHash(k),
                57,
                0,
                Duration::from_secs(2),
                0,
                1,
                refused.epoch(),
            );
        }
        let asked = refused.epoch();
        refused.booked(KeyHash(1));
        assert_eq!(refused.check(KeyHash(1), 57, 0, 1, 1), None);
        assert!(refused.check(KeyHash(2), 57, 0, 1, 1).is_some());
        // A refusal asked before the booking is still remembered: the
        // booking voids no other key's.
        refused.insert(KeyHash(3), 57, 0, Duration::from_secs(2), 0, 1, asked);
        assert!(refused.check(KeyHash(3), 57, 0, 1, 1).is_some());
    }

    #[test]
    fn a_refusal_asked_before_a_booking_of_its_key_is_not_remembered() {
        // Redis may have run the refusal first: its wait leaves the
        // booking out.
        let refused = Refused::default();
        let two = Duration::from_secs(2);
        let before = refused.epoch();
        refused.booked(KeyHash(1));
        refused.insert(KeyHash(1), 57, 0, two, 0, 1, before);
        assert_eq!(refused.check(KeyHash(1), 57, 0, 1, 1), None);
        // Another key's, asked as early: remembered.
        refused.insert(KeyHash(2), 57, 0, two, 0, 1, before);
        assert!(refused.check(KeyHash(2), 57, 0, 1, 1).is_some());
        // The key's, asked after the booking: remembered.
        refused.insert(KeyHash(1), 57, 0, two, 0, 1, refused.epoch());
        assert!(refused.check(KeyHash(1), 57, 0, 1, 1).is_some());
    }

    #[test]
    fn a_long_refusal_is_answered_from_the_cache_for_a_second_at_most() {
        // Another replica's reset or new turn is not seen here: past a
        // second the key is asked again, whatever its wait.
        let refused = Refused::default();
        let key = KeyHash(1);
        let five_minutes = Duration::from_secs(300);
        refused.insert(key, 1, 0, five_minutes, 0, 1, refused.epoch());
        assert_eq!(
            refused.check(key, 1, 0, 999_999, 1),
            Some((five_minutes - Duration::from_micros(999_999), 0)),
            "the true wait, not the cache's"
        );
        assert_eq!(refused.check(key, 1, 0, 1_000_000, 1), None);
    }

    #[test]
    fn the_cache_of_refused_keys_is_bounded() {
        let refused = Refused::default();
        for k in 0..(MAX_REFUSED as u64 + 100) {
            refused.insert(
                KeyHash(k),
                1,
                0,
                Duration::from_secs(60),
                0,
                1,
                refused.epoch(),
            );
        }
        assert_eq!(refused.inner.lock().keys.len(), MAX_REFUSED);
        // Once those are over, new ones take their place.
        refused.insert(
            KeyHash(u64::MAX),
            1,
            61_000_000,
            Duration::from_secs(1),
            0,
            1,
            refused.epoch(),
        );
        assert_eq!(refused.inner.lock().keys.len(), 1);
    }
}
