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
//! Each shard also holds the parameters its states are kept under, so a
//! retune converts a shard's states and swaps its parameters under one lock,
//! and no request ever reads a state under the wrong parameters.
//!
//! A state that says nothing a fresh state would not (a full bucket, an empty
//! window) is *idle*, and dropping it loses nothing. Idle states are swept
//! without a background task: a shard is swept when it has doubled since its
//! last sweep, and one shard per request is swept in rounds that start once
//! per `sweep_every`, so a flood of distinct keys gives its memory back once
//! the keys go quiet.
//!
//! A store may keep one key apart from the shards (see [`Store::pinning`]):
//! the key of a layer keyed by `GlobalKey`, which is then reached with no
//! shard choice, no hash-table probe and no sweeping.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use crate::clock::Nanos;
use crate::key::KeyHash;

/// A per-key state that can say whether it still matters.
pub(crate) trait Idle: Default + Send + 'static {
    /// True when dropping the state would change no decision.
    fn is_idle(&self, now: Nanos) -> bool;

    /// The state as one word, for one that fits in a [`FastWord`] (`None`:
    /// it does not, and is never published).
    fn to_word(&self) -> Option<u64> {
        None
    }

    /// The state a published word held (only called on a word
    /// [`Idle::to_word`] made).
    fn from_word(_word: u64) -> Self {
        Self::default()
    }
}

/// The pinned key's state published outside the lock, for an admission
/// that is one compare-and-swap (see `Limiter::acquire`'s fast path).
///
/// While the word holds a state ([`Store::publish`]), it is the state, and
/// the one under the lock is stale: every locked access to the pinned key
/// takes it back first (swapping in [`FastWord::UNPUBLISHED`], which makes
/// any compare-and-swap racing with it fail), so a locked path never sees
/// a state older than the last fast admission. Only a lock holder
/// publishes. A word belongs to one set of parameters: new parameters get
/// a new word (see [`Store::install_fast`]), so a compare-and-swap computed
/// under old ones cannot succeed on a state converted to new ones.
#[derive(Debug)]
pub(crate) struct FastWord(AtomicU64);

impl FastWord {
    /// Nothing published: the state is under the lock.
    pub(crate) const UNPUBLISHED: u64 = u64::MAX;

    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(Self::UNPUBLISHED))
    }

    /// The word now ([`FastWord::UNPUBLISHED`] or a state).
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Replace `current` by `new` if it is still there; else what is.
    #[inline]
    pub(crate) fn swap_if(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.0
            .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Take the published state back, leaving nothing published. Called
    /// under the pinned key's lock, where nobody publishes: a word seen
    /// unpublished stays so, and the swap is skipped.
    #[inline]
    fn take(&self) -> Option<u64> {
        if self.0.load(Ordering::Relaxed) == Self::UNPUBLISHED {
            return None;
        }
        let word = self.0.swap(Self::UNPUBLISHED, Ordering::AcqRel);
        (word != Self::UNPUBLISHED).then_some(word)
    }
}

const SHARDS: usize = 64;

/// The hash is cut into this many slices, each assigned to a shard.
const SLICES: usize = 1024;

/// Which shard each slice of the hash space goes to.
///
/// Shard `i` gets a share of the keys proportional to 2^(i/64), so the
/// shards' sizes are spread over one doubling. A hash table doubles when it
/// is 7/8 full, which halves its load; with equal shares every shard would
/// double at the same key count, and memory per live key would swing between
/// about 19 and 39 bytes as keys are added (36 at exactly a million). Spread,
/// the shards double one after another and a token-bucket key costs 28 to 30
/// bytes at any count. The biggest shard takes 2.1% of the keys instead of
/// 1.6%, which changes nothing for lock contention.
static SHARD_OF: [u8; SLICES] = shard_table();

const fn shard_table() -> [u8; SLICES] {
    // 2^(1/64) in 32-bit fixed point.
    const STEP: u128 = 4_341_736_423;
    let mut cumulative = [0u128; SHARDS];
    let mut weight: u128 = 1 << 32;
    let mut total: u128 = 0;
    let mut i = 0;
    while i < SHARDS {
        total += weight;
        cumulative[i] = total;
        weight = (weight * STEP) >> 32;
        i += 1;
    }
    // Slice `s` goes to the shard whose cumulative share its midpoint falls
    // in.
    let mut table = [0u8; SLICES];
    let mut shard = 0;
    let mut slice = 0;
    while slice < SLICES {
        let point = (2 * slice as u128 + 1) * total / (2 * SLICES as u128);
        while point >= cumulative[shard] {
            shard += 1;
        }
        table[slice] = shard as u8;
        slice += 1;
    }
    table
}
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

pub(crate) struct ShardMap<V, P> {
    map: Map<V>,
    params: P,
    /// Sweep this shard once it holds this many states.
    sweep_at_len: usize,
}

/// One shard, on its own cache lines so that two cores working on two keys do
/// not slow each other down.
#[repr(align(128))]
struct Shard<V, P>(Mutex<ShardMap<V, P>>);

/// The key kept apart from the shards, with its state (none until used, and
/// none again once evicted idle) and the parameters it is kept under.
#[repr(align(128))]
struct Pinned<V, P> {
    key: u64,
    cell: Mutex<PinnedCell<V, P>>,
}

struct PinnedCell<V, P> {
    params: P,
    state: Option<V>,
    /// Where the state may be published (see [`FastWord`]).
    fast: Option<Arc<FastWord>>,
}

/// The pinned key's cell locked, with any published state taken back.
#[inline]
fn lock_cell<V: Idle, P>(cell: &Mutex<PinnedCell<V, P>>) -> MutexGuard<'_, PinnedCell<V, P>> {
    let mut cell = cell.lock();
    if let Some(word) = cell.fast.as_ref().and_then(|fast| fast.take()) {
        cell.state = Some(V::from_word(word));
    }
    cell
}

pub(crate) struct Store<V, P> {
    shards: Box<[Shard<V, P>]>,
    pinned: Option<Pinned<V, P>>,
    /// When the next sweeping round may start.
    round_due: AtomicU64,
    /// The next shard of the current round; `SHARDS` when no round is on.
    cursor: AtomicUsize,
    sweep_every: Nanos,
}

/// One key's state, locked, with the parameters it is kept under.
pub(crate) struct Locked<'a, V, P> {
    shard: MutexGuard<'a, ShardMap<V, P>>,
    key: u64,
}

impl<V: Idle, P> Locked<'_, V, P> {
    /// The state (a fresh one if the key had none) and its parameters.
    #[inline]
    pub(crate) fn get(&mut self) -> (&P, &mut V) {
        let ShardMap { map, params, .. } = &mut *self.shard;
        (params, map.entry(self.key).or_default())
    }

    /// Forget the key's state.
    pub(crate) fn remove(&mut self) {
        self.shard.map.remove(&self.key);
    }

    /// How many states the locked shard holds.
    pub(crate) fn shard_len(&self) -> usize {
        self.shard.map.len()
    }
}

/// One key's state, locked and looked up once, with a copy of the
/// parameters it is kept under: for callers that read and write the state
/// several times under one lock.
pub(crate) struct Slot<'a, V, P> {
    state: MappedMutexGuard<'a, V>,
    params: P,
    /// What [`Store::tidy`] has to do once the slot is released.
    tidy: Tidy,
}

/// The sweeping left to [`Store::tidy`] after a [`Slot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tidy {
    /// Nothing: the slot was the pinned key's.
    Nothing,
    /// A step of the sweeping round.
    Step,
    /// The step, and the slot's shard, which had grown enough to be swept.
    Crowded,
}

impl<V, P> Slot<'_, V, P> {
    /// The parameters and the state.
    #[inline]
    pub(crate) fn get(&mut self) -> (&P, &mut V) {
        (&self.params, &mut self.state)
    }

    /// Pass to [`Store::tidy`] once the slot is released.
    #[inline]
    pub(crate) fn tidy(&self) -> Tidy {
        self.tidy
    }
}

impl<V: Idle, P: Clone> Store<V, P> {
    /// Lock `key`'s state (a fresh one if it had none), looked up once.
    /// Needs no clock reading, so the caller can read the clock under the
    /// lock; the sweeping a lock would do is left to [`Store::tidy`].
    #[inline]
    pub(crate) fn slot(&self, key: KeyHash) -> Slot<'_, V, P> {
        if let Some(cell) = self.pinned(key) {
            let cell = lock_cell(cell);
            let params = cell.params.clone();
            return Slot {
                state: MutexGuard::map(cell, |c| c.state.get_or_insert_with(V::default)),
                params,
                tidy: Tidy::Nothing,
            };
        }
        let shard = self.shard(key).0.lock();
        let tidy = if shard.map.len() >= shard.sweep_at_len {
            Tidy::Crowded
        } else {
            Tidy::Step
        };
        let params = shard.params.clone();
        let state = MutexGuard::map(shard, |s| s.map.entry(key.0).or_default());
        Slot {
            state,
            params,
            tidy,
        }
    }

    /// The sweeping that goes with a [`Store::slot`], after its lock is
    /// released: the slot's shard if it was crowded, and the round's next
    /// shard.
    #[inline]
    pub(crate) fn tidy(&self, key: KeyHash, now: Nanos, tidy: Tidy) {
        if tidy == Tidy::Nothing {
            // The pinned key's: other keys (named through a handle) are
            // swept by their own crowding and by evictions.
            return;
        }
        if tidy == Tidy::Crowded {
            let mut shard = self.shard(key).0.lock();
            if shard.map.len() >= shard.sweep_at_len {
                sweep(&mut shard, now);
            }
        }
        self.sweep_step(now);
    }

    /// Put `state` in for `key` if it has none.
    pub(crate) fn insert_if_absent(&self, key: KeyHash, state: impl FnOnce(&P) -> V) {
        if let Some(cell) = self.pinned(key) {
            let mut cell = lock_cell(cell);
            let PinnedCell {
                params,
                state: held,
                ..
            } = &mut *cell;
            if held.is_none() {
                *held = Some(state(params));
            }
            return;
        }
        let mut shard = self.shard(key).0.lock();
        let ShardMap { map, params, .. } = &mut *shard;
        if let Entry::Vacant(slot) = map.entry(key.0) {
            slot.insert(state(params));
        }
    }

    /// Forget `key`'s state, after `last` has looked at it (if it had one)
    /// under the same lock.
    pub(crate) fn remove_after(&self, key: KeyHash, last: impl FnOnce(&V)) {
        if let Some(cell) = self.pinned(key) {
            let mut cell = lock_cell(cell);
            if let Some(state) = cell.state.take() {
                last(&state);
            }
            return;
        }
        let mut shard = self.shard(key).0.lock();
        if let Some(state) = shard.map.get(&key.0) {
            last(state);
        }
        shard.map.remove(&key.0);
    }

    /// Forget `key`'s state.
    pub(crate) fn remove(&self, key: KeyHash) {
        if let Some(cell) = self.pinned(key) {
            lock_cell(cell).state = None;
            return;
        }
        self.shard(key).0.lock().map.remove(&key.0);
    }

    pub(crate) fn new(params: P, sweep_every: Nanos) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Shard(Mutex::new(ShardMap {
                    map: Map::default(),
                    params: params.clone(),
                    sweep_at_len: MIN_SWEEP_LEN,
                }))
            })
            .collect();
        Self {
            shards,
            pinned: None,
            round_due: AtomicU64::new(sweep_every),
            cursor: AtomicUsize::new(SHARDS),
            sweep_every: sweep_every.max(1),
        }
    }

    /// Keep `key` apart from the shards: its state is then a lock away,
    /// with no lookup. For a store whose requests mostly or only use one key.
    /// Such a store is reached through [`Store::slot`], not [`Store::lock`].
    pub(crate) fn pinning(mut self, key: KeyHash) -> Self {
        let params = self.shards[0].0.lock().params.clone();
        self.pinned = Some(Pinned {
            key: key.0,
            cell: Mutex::new(PinnedCell {
                params,
                state: None,
                fast: None,
            }),
        });
        self
    }

    /// Let the pinned key's state be published in `fast` (`None`: nowhere),
    /// taking back what an earlier word held: from now on only `fast` is
    /// published, so a compare-and-swap on the earlier word fails for good.
    pub(crate) fn install_fast(&self, fast: Option<Arc<FastWord>>) {
        if let Some(pinned) = &self.pinned {
            lock_cell(&pinned.cell).fast = fast;
        }
    }

    /// Publish the pinned key's state in `fast`, if `fast` is the word
    /// installed and the state fits in it. Returns whether it did.
    pub(crate) fn publish(&self, fast: &Arc<FastWord>) -> bool {
        let Some(pinned) = &self.pinned else {
            return false;
        };
        let mut cell = lock_cell(&pinned.cell);
        if !cell.fast.as_ref().is_some_and(|f| Arc::ptr_eq(f, fast)) {
            return false;
        }
        match cell.state.get_or_insert_with(V::default).to_word() {
            Some(word) if word != FastWord::UNPUBLISHED => {
                fast.0.store(word, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    #[inline]
    fn pinned(&self, key: KeyHash) -> Option<&Mutex<PinnedCell<V, P>>> {
        match &self.pinned {
            Some(pinned) if pinned.key == key.0 => Some(&pinned.cell),
            _ => None,
        }
    }

    #[inline]
    fn shard(&self, key: KeyHash) -> &Shard<V, P> {
        // The map itself uses the low bits (bucket) and the top 7 bits (tag):
        // take the slice from bits in between so neither loses entropy.
        &self.shards[usize::from(SHARD_OF[(key.0 >> 32) as usize % SLICES])]
    }

    /// Lock `key`'s shard. Callers that lock several stores at once lock them
    /// in one fixed order.
    #[inline]
    pub(crate) fn lock(&self, key: KeyHash, now: Nanos) -> Locked<'_, V, P> {
        assert!(self.pinned.is_none(), "a pinning store is reached by slot");
        self.sweep_step(now);
        let mut shard = self.shard(key).0.lock();
        if shard.map.len() >= shard.sweep_at_len {
            sweep(&mut shard, now);
        }
        Locked { shard, key: key.0 }
    }

    /// Run `f` on `key`'s state if it has one.
    pub(crate) fn with_existing(&self, key: KeyHash, f: impl FnOnce(&P, &mut V)) {
        if let Some(cell) = self.pinned(key) {
            let mut cell = lock_cell(cell);
            let PinnedCell { params, state, .. } = &mut *cell;
            if let Some(state) = state {
                f(params, state);
            }
            return;
        }
        let mut shard = self.shard(key).0.lock();
        let ShardMap { map, params, .. } = &mut *shard;
        if let Some(state) = map.get_mut(&key.0) {
            f(params, state);
        }
    }

    /// `f` of `key`'s parameters and state (`None`: it has none), changing
    /// nothing.
    pub(crate) fn peek<R>(&self, key: KeyHash, f: impl FnOnce(&P, Option<&V>) -> R) -> R {
        if let Some(cell) = self.pinned(key) {
            let cell = lock_cell(cell);
            return f(&cell.params, cell.state.as_ref());
        }
        let shard = self.shard(key).0.lock();
        f(&shard.params, shard.map.get(&key.0))
    }

    /// Run `f` on every state held, shard by shard under its lock.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&mut V)) {
        for shard in self.shards.iter() {
            shard.0.lock().map.values_mut().for_each(&mut f);
        }
        if let Some(pinned) = &self.pinned {
            if let Some(state) = &mut lock_cell(&pinned.cell).state {
                f(state);
            }
        }
    }

    /// Run `f` on every key's state held, read-only, shard by shard under
    /// its lock (the pinned key's taken back from its word first).
    pub(crate) fn each_state(&self, mut f: impl FnMut(&P, KeyHash, &V)) {
        for shard in self.shards.iter() {
            let shard = shard.0.lock();
            for (&key, state) in &shard.map {
                f(&shard.params, KeyHash(key), state);
            }
        }
        if let Some(pinned) = &self.pinned {
            let cell = lock_cell(&pinned.cell);
            if let Some(state) = &cell.state {
                f(&cell.params, KeyHash(pinned.key), state);
            }
        }
    }

    /// Move every shard to `params`, converting each state under the shard's
    /// lock with `convert(old, new, key, state)`.
    pub(crate) fn retune(&self, params: &P, mut convert: impl FnMut(&P, &P, KeyHash, &mut V)) {
        for shard in self.shards.iter() {
            let mut shard = shard.0.lock();
            let ShardMap {
                map, params: old, ..
            } = &mut *shard;
            for (&key, state) in map.iter_mut() {
                convert(old, params, KeyHash(key), state);
            }
            *old = params.clone();
        }
        if let Some(pinned) = &self.pinned {
            let mut cell = lock_cell(&pinned.cell);
            let PinnedCell {
                params: old, state, ..
            } = &mut *cell;
            if let Some(state) = state {
                convert(old, params, KeyHash(pinned.key), state);
            }
            *old = params.clone();
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

    /// Drop every state, idle or not, shard by shard, and give the memory
    /// back.
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.0.lock();
            shard.map = Map::default();
            shard.sweep_at_len = MIN_SWEEP_LEN;
        }
        if let Some(pinned) = &self.pinned {
            lock_cell(&pinned.cell).state = None;
        }
    }

    /// Drop every idle state now; returns how many were dropped.
    pub(crate) fn evict_idle(&self, now: Nanos) -> usize {
        let pinned = self.pinned.as_ref().map_or(0, |pinned| {
            let mut cell = lock_cell(&pinned.cell);
            let idle = cell.state.as_ref().is_some_and(|s| s.is_idle(now));
            if idle {
                cell.state = None;
            }
            usize::from(idle)
        });
        let swept: usize = self
            .shards
            .iter()
            .map(|shard| sweep(&mut shard.0.lock(), now))
            .sum();
        pinned + swept
    }

    /// Whether `key`'s shard is locked now.
    #[cfg(test)]
    pub(crate) fn is_locked(&self, key: KeyHash) -> bool {
        match self.pinned(key) {
            Some(cell) => cell.is_locked(),
            None => self.shard(key).0.is_locked(),
        }
    }

    /// How many keys hold state.
    pub(crate) fn len(&self) -> usize {
        let pinned = self
            .pinned
            .as_ref()
            .is_some_and(|pinned| lock_cell(&pinned.cell).state.is_some());
        let shards: usize = self
            .shards
            .iter()
            .map(|shard| shard.0.lock().map.len())
            .sum();
        usize::from(pinned) + shards
    }
}

/// Drop a shard's idle states and give memory back when most of it is unused.
fn sweep<V: Idle, P>(shard: &mut ShardMap<V, P>, now: Nanos) -> usize {
    let before = shard.map.len();
    shard.map.retain(|_, state| !state.is_idle(now));
    let len = shard.map.len();
    if shard.map.capacity() > 4 * len.max(16) {
        shard.map.shrink_to(2 * len);
    }
    shard.sweep_at_len = (2 * len).max(MIN_SWEEP_LEN);
    before - len
}

#[cfg(test)]
mod tests;
