//! The keyed store's unit tests.

use super::*;

/// A state that goes idle at a set instant.
#[derive(Clone, Copy, Default)]
struct Until(Nanos);

impl Idle for Until {
    fn is_idle(&self, now: Nanos) -> bool {
        self.0 <= now
    }
}

#[test]
fn the_pinned_key_lives_apart_and_is_kept_like_any_other() {
    let pinned = KeyHash(99);
    let store: Store<Until, u32> = Store::new(1, Nanos::MAX).pinning(pinned);
    *store.slot(pinned).get().1 = Until(10);
    assert!(store.shards.iter().all(|s| s.0.lock().map.is_empty()));
    assert_eq!(store.len(), 1);
    // A retune converts it and moves it to the new parameters.
    store.retune(&2, |old, new, _, state| {
        assert_eq!((*old, *new), (1, 2));
        state.0 += 1;
    });
    let mut seen = None;
    store.with_existing(pinned, |params, state| seen = Some((*params, state.0)));
    assert_eq!(seen, Some((2, 11)));
    assert_eq!(store.evict_idle(10), 0);
    assert_eq!(store.evict_idle(11), 1);
    assert_eq!(store.len(), 0);
    store.with_existing(pinned, |_, _| panic!("evicted"));
    store.insert_if_absent(pinned, |params| Until(Nanos::from(*params)));
    assert_eq!(store.len(), 1);
    store.remove(pinned);
    assert_eq!(store.len(), 0);
    // Other keys still go to the shards.
    *store.slot(KeyHash(5 << 32)).get().1 = Until(10);
    assert_eq!(
        store
            .shards
            .iter()
            .map(|s| s.0.lock().map.len())
            .sum::<usize>(),
        1
    );
}

#[test]
fn shard_shares_are_spread_over_one_doubling() {
    let mut slices = [0usize; SHARDS];
    for &shard in SHARD_OF.iter() {
        slices[usize::from(shard)] += 1;
    }
    assert!(slices.iter().all(|&n| n > 0), "{slices:?}");
    // From 2^0 to 2^(63/64) of the smallest: 11 to 22 slices.
    assert_eq!((slices[0], slices[SHARDS - 1]), (11, 22));
    assert!(slices.iter().all(|&n| (11..=22).contains(&n)), "{slices:?}");
}

#[test]
fn shards_do_not_all_double_at_once() {
    // 64 Ki keys: with equal shares every shard would hold 1,024 keys,
    // just past 7/8 of 1,024 buckets, so all would sit at 2,048 buckets
    // (a load of 0.5). Spread, about half the shards are still at 1,024.
    let store: Store<Until, ()> = Store::new((), Nanos::MAX);
    let keys = 65_536u64;
    for key in 0..keys {
        let key = KeyHash(key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        *store.slot(key).get().1 = Until(Nanos::MAX);
    }
    let slots: usize = store
        .shards
        .iter()
        .map(|shard| shard.0.lock().map.capacity())
        .sum();
    let load = keys as f64 / (slots as f64 * 8.0 / 7.0);
    assert!(load > 0.55, "load {load:.3} over {slots} slots");
}

#[test]
fn a_crowded_shard_is_swept_when_its_slot_is_tidied() {
    // No sweeping round ever comes due: only crowding sweeps.
    let store: Store<Until, ()> = Store::new((), Nanos::MAX);
    let mut now = 0;
    for key in 0..200_000u64 {
        now += 1;
        // Spread the keys over the shards the way seeded hashes do.
        let key = KeyHash(key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut slot = store.slot(key);
        // Each key stays busy for 10 ns, then goes idle.
        *slot.get().1 = Until(now + 10);
        let tidy = slot.tidy();
        drop(slot);
        store.tidy(key, now, tidy);
    }
    // Without the crowding sweep all 200,000 would still be held.
    assert!(store.len() <= SHARDS * 2 * MIN_SWEEP_LEN, "{}", store.len());
}
