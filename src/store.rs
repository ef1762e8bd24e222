//! The keyed state store: one small state per live key, shared by every clone
//! of a service.
//!
//! Sharded maps behind short critical sections. Keys are stored as their
//! 64-bit seeded hash ([`KeyHash`]), not as text: a live key then costs its
//! state plus 8 bytes, extraction never allocates, and two distinct keys share
//! a state only with probability about n²/2⁶⁵ (one in 36 million with a
//! million live keys), which a sender cannot aim for because the seed is
//! random per limiter.
//!
//! A state that says nothing a fresh state would not (a full bucket, an empty
//! window) is *idle*, and dropping it loses nothing. Idle states are swept
//! without a background task: a shard is swept when it has doubled since its
//! last sweep, and one shard per request is swept in rounds that start once
//! per `sweep_every`, so a flood of distinct keys gives its memory back once
//! the keys go quiet.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::clock::Nanos;
use crate::key::KeyHash;

/// A per-key state that can say whether it still matters.
pub(crate) trait Idle: Default + Send + 'static {
    /// True when dropping the state would change no decision.
    fn is_idle(&self, now: Nanos) -> bool;
}

const SHARDS: usize = 64;
/// A shard smaller than this is never swept for its size alone.
const MIN_SWEEP_LEN: usize = 1024;

/// The keys are already seeded hashes; hashing them again would only cost.
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in so it stays correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

struct ShardMap<V> {
    map: Map<V>,
    /// Sweep this shard once it holds this many states.
    sweep_at_len: usize,
}

/// One shard, on its own cache lines so that two cores working on two keys do
/// not slow each other down.
#[repr(align(128))]
struct Shard<V>(Mutex<ShardMap<V>>);

pub(crate) struct Store<V> {
    shards: Box<[Shard<V>]>,
    /// When the next sweeping round may start.
    round_due: AtomicU64,
    /// The next shard of the current round; `SHARDS` when no round is on.
    cursor: AtomicUsize,
    sweep_every: Nanos,
}

impl<V: Idle> Store<V> {
    pub(crate) fn new(sweep_every: Nanos) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Shard(Mutex::new(ShardMap {
                    map: Map::default(),
                    sweep_at_len: MIN_SWEEP_LEN,
                }))
            })
            .collect();
        Self {
            shards,
            round_due: AtomicU64::new(sweep_every),
            cursor: AtomicUsize::new(SHARDS),
            sweep_every: sweep_every.max(1),
        }
    }

    #[inline]
    fn shard(&self, key: KeyHash) -> &Shard<V> {
        // The map itself uses the low bits (bucket) and the top 7 bits (tag):
        // take the shard from bits in between so neither loses entropy.
        &self.shards[(key.0 >> 32) as usize % SHARDS]
    }

    /// Run `f` on `key`'s state, creating a fresh state if there is none.
    #[inline]
    pub(crate) fn with<T>(&self, key: KeyHash, now: Nanos, f: impl FnOnce(&mut V) -> T) -> T {
        self.sweep_step(now);
        let mut shard = self.shard(key).0.lock();
        let out = f(shard.map.entry(key.0).or_default());
        if shard.map.len() >= shard.sweep_at_len {
            sweep(&mut shard, now);
        }
        out
    }

    /// Run `f` on `key`'s state if it has one.
    pub(crate) fn with_existing(&self, key: KeyHash, f: impl FnOnce(&mut V)) {
        let mut shard = self.shard(key).0.lock();
        if let Some(state) = shard.map.get_mut(&key.0) {
            f(state);
        }
    }

    /// Amortised sweeping: while a round is on, each call sweeps the next
    /// shard; a round starts once per `sweep_every`.
    #[inline]
    fn sweep_step(&self, now: Nanos) {
        let cursor = self.cursor.load(Ordering::Relaxed);
        if cursor < SHARDS {
            if self
                .cursor
                .compare_exchange(cursor, cursor + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // A busy shard is skipped this round rather than waited for.
                if let Some(mut shard) = self.shards[cursor].0.try_lock() {
                    sweep(&mut shard, now);
                }
            }
        } else if now >= self.round_due.load(Ordering::Relaxed) {
            self.round_due
                .store(now.saturating_add(self.sweep_every), Ordering::Relaxed);
            self.cursor.store(0, Ordering::Relaxed);
        }
    }

    /// Drop every idle state now; returns how many were dropped.
    pub(crate) fn evict_idle(&self, now: Nanos) -> usize {
        self.shards
            .iter()
            .map(|shard| sweep(&mut shard.0.lock(), now))
            .sum()
    }

    /// How many keys hold state.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().map.len())
            .sum()
    }
}

/// Drop a shard's idle states and give memory back when most of it is unused.
fn sweep<V: Idle>(shard: &mut ShardMap<V>, now: Nanos) -> usize {
    let before = shard.map.len();
    shard.map.retain(|_, state| !state.is_idle(now));
    let len = shard.map.len();
    if shard.map.capacity() > 4 * len.max(16) {
        shard.map.shrink_to(2 * len);
    }
    shard.sweep_at_len = (2 * len).max(MIN_SWEEP_LEN);
    before - len
}
