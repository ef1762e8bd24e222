//! The keyed FIFO permit queue behind every clone of a concurrency service.
//!
//! Each live key has a [`KeyState`], found through the sharded [`Store`] and
//! shared (an `Arc`) by the permits and queue places of that key. A key state
//! is one atomic word (permits out, and a flag saying requests are waiting)
//! plus the queue of waiting requests, oldest first, behind its own lock:
//!
//! - while nobody waits, taking and giving back a permit is one
//!   compare-and-swap on the word, without a lock;
//! - joining, leaving or being served from the queue takes the key's lock.
//!   The flag is only set or cleared under that lock, from a word whose count
//!   is at the limit, so a permit given back either lands in the count before
//!   a newcomer looks, or goes to the oldest waiter: never lost, never taken
//!   by a newcomer ahead of a waiter.
//!
//! A permit given back while requests wait goes straight to the oldest one
//! (the count does not change), which is then woken: waiters never poll. A
//! waiter is found again by its ticket (tickets rise in arrival order, so the
//! queue is sorted by them and a binary search finds one); a ticket missing
//! from the queue has been granted its permit.
//!
//! A key state with no permit out, nobody waiting and nobody holding it is
//! idle. It is dropped from the store when its last permit goes back, once
//! its shard holds more than a few keys; the store also sweeps a shard that
//! has doubled. A service remembers the state of the last key it served, so a
//! hot key skips the store altogether (and stays in it while remembered).
//!
//! A layer keyed by [`GlobalKey`](crate::key::GlobalKey) has one key: its
//! state is made with the permits and is never in the store, so its requests
//! neither hash a key nor look one up. Unless keys are counted apart, that
//! state also counts its admissions in the upper half of its word, in the
//! same compare-and-swap that takes the permit, and the stats read them from
//! there at each snapshot: requests in flight are admissions less permits
//! out, so neither taking nor giving back a permit touches a stats counter.
//! The count moves to the queue's `carried` under the key's lock once it
//! reaches 2³⁰, long before it could reach the flag.
//!
//! Kept in one file (about 900 lines) on purpose: the word, the flag and
//! the queue are one protocol, and each transition is right only read
//! beside the others (the loom models in `tests/loom_permits.rs` check them
//! together).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Nanos;
use crate::key::{KeyHash, KeySeed};
use crate::stats::{Event, KeyTracking, Stats};
use crate::store::{Idle, Store};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard};

mod live;
#[cfg(loom)]
pub(crate) mod model;
mod waiters;

use waiters::{Waiter, Waiters};

/// Set in a key's word while its queue has waiters.
const QUEUED: u64 = 1 << 63;
/// The word's low half: permits out.
const OUT: u64 = u32::MAX as u64;
/// The largest number of permits per key the word can count.
const MAX_PERMITS: usize = u32::MAX as usize;
/// One admission, in the count a state that counts its own admissions keeps
/// in the word's upper half (bits 32 to 62).
const ADMITTED: u64 = 1 << 32;
/// Admissions the word holds before they are moved out to
/// [`Queue::carried`], far from the [`QUEUED`] bit. Two in the loom models,
/// so that they move out within a model.
const CARRY: u64 = if cfg!(loom) { 2 } else { 1 << 30 };
/// A word at or above this has waiters, or admissions to move out: the
/// lock-free path stands aside for the locked one.
const FREE_BELOW: u64 = CARRY * ADMITTED;

/// Idle states go when their last permit does (below), so the store never
/// needs to sweep on a timer; it still sweeps a shard that has doubled.
const NO_ROUNDS: Nanos = Nanos::MAX;

/// A shard keeps up to this many key states before dropping idle ones as
/// they go idle: a key used now and then keeps its state between requests
/// instead of making and freeing it each time, and at most `64 × LINGER`
/// idle states (4,096, about half a MiB) stay behind after a flood of keys.
const LINGER: usize = 64;

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiters: Waiters,
    /// Tickets pushed out of a full line to make room for a waiter of a
    /// shorter lane, until each notices.
    pushed_out: Vec<u64>,
    /// How long a permit is held, averaged over those reported to
    /// [`KeyState::learn_pace`] (a fair queue's turns): the line's pace,
    /// for [`KeyState::acquire`]'s `max_wait`. `None` until one that was
    /// waited for is.
    pace: Option<Duration>,
    /// Admissions moved out of the word of a state that counts its own.
    carried: u64,
    /// Permits out that a state counting its own handed to waiters not yet
    /// sent: out, but neither admitted nor in flight.
    granted: u64,
}

impl Queue {
    /// Whether `ticket` was pushed out (and forget it: it is told once).
    fn was_pushed_out(&mut self, ticket: u64) -> bool {
        let Some(i) = self.pushed_out.iter().position(|&t| t == ticket) else {
            return false;
        };
        self.pushed_out.swap_remove(i);
        true
    }
}

/// A request's lane in its key's line (see [`Waiters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    /// 0: the one lane of a line without fair share (not remembered as
    /// the last served).
    pub(crate) id: u64,
    /// Permits in a row per turn, at least 1.
    pub(crate) weight: u32,
}

impl Lane {
    /// The one lane of a line without fair share.
    pub(crate) const ONE: Lane = Lane { id: 0, weight: 1 };

    /// Lane `id`, of weight 1.
    #[cfg(test)]
    pub(crate) fn of(id: u64) -> Lane {
        Lane { id, weight: 1 }
    }
}

/// How a wait in the line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The permit is the waiter's.
    Granted,
    /// Pushed out of a full line by a waiter of a shorter lane.
    PushedOut,
}

/// One key's permits and queue.
pub(crate) struct KeyState {
    /// Permits out (including ones handed to a waiter that has not yet
    /// noticed), plus [`QUEUED`] while the queue has waiters; for a state
    /// that counts its own admissions, plus their number times [`ADMITTED`].
    word: AtomicU64,
    queue: Mutex<Queue>,
    /// Permits that may be out; changed live (under the key's lock) by
    /// [`KeyState::set_max`]. Read relaxed: a request that read the old
    /// value went before the change.
    max: AtomicU64,
    /// What taking a permit adds to the word: one permit out, and one
    /// admission for a state that counts its own.
    step: u64,
    key: KeyHash,
    /// The lane of the request that last got a permit (with lanes: see
    /// [`Waiters::push`]); lane 0 is not recorded.
    last_lane: AtomicU64,
    stats: Arc<Stats>,
    /// To drop this state from the store once it is idle; `None` for the
    /// single key's state, which is not in the store.
    owner: Option<Weak<Permits>>,
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = self.word.load(Ordering::Relaxed);
        f.debug_struct("KeyState")
            .field("in_flight", &(word & OUT))
            .field("queued", &(word & QUEUED != 0))
            .finish_non_exhaustive()
    }
}

/// What [`KeyState::acquire`] decided.
pub(crate) enum Acquire {
    /// A permit was taken.
    Granted(Permit),
    /// The request is in the queue.
    Queued(QueueTicket),
    /// The queue is at its limit; nothing was taken.
    Full,
    /// At the line's pace, the wait could take this long, more than the
    /// `max_wait` asked for; nothing was taken.
    TooLong(Duration),
}

impl KeyState {
    /// A state for at most `max` permits out (`max <= MAX_PERMITS`). One
    /// that `counts_itself` counts its admissions and departures in its own
    /// word rather than in `stats` (see [`Permits::new`]).
    fn new(
        max: usize,
        key: KeyHash,
        stats: Arc<Stats>,
        owner: Option<Weak<Permits>>,
        counts_itself: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            word: AtomicU64::new(0),
            queue: Mutex::new(Queue::default()),
            max: AtomicU64::new(max as u64),
            step: if counts_itself { ADMITTED + 1 } else { 1 },
            key,
            last_lane: AtomicU64::new(0),
            stats,
            owner,
        })
    }

    fn counts_itself(&self) -> bool {
        self.step != 1
    }

    /// Count a request going in flight.
    #[inline]
    fn entered(&self, text: &dyn Fn() -> String) {
        if self.counts_itself() {
            // Counted in the word already; subscribers still hear of it.
            self.stats.touch();
        } else {
            self.stats.record(self.key, Event::Entered, text);
        }
    }

    /// Count a request leaving the flight.
    #[inline]
    fn left(&self) {
        if self.counts_itself() {
            self.stats.touch();
        } else {
            self.stats.record(self.key, Event::Left, &String::new);
        }
    }

    /// The word, once admissions due to move out of it have moved to
    /// `queue.carried` (under the key's lock, which `queue` is). Lock-free
    /// takers stop at `FREE_BELOW`, and every locked one calls this first, so
    /// the count stays far below the `QUEUED` bit.
    fn carry(&self, queue: &mut Queue) -> u64 {
        let word = self.word.load(Ordering::Relaxed);
        if word & !QUEUED < FREE_BELOW {
            return word;
        }
        queue.carried += CARRY;
        self.word.fetch_sub(CARRY * ADMITTED, Ordering::Relaxed) - CARRY * ADMITTED
    }

    /// Requests admitted and requests that left, for a state that counts
    /// its own: read under the key's lock, so no carry is seen half done.
    fn own_counts(&self) -> (u64, u64) {
        let queue = self.queue.lock();
        let word = self.word.load(Ordering::Acquire);
        let admitted = queue.carried + ((word & !QUEUED) >> 32);
        let in_flight = (word & OUT).saturating_sub(queue.granted);
        (admitted, admitted.saturating_sub(in_flight))
    }

    /// Take a permit, or join the queue in `lane` (see [`Waiters`]) when
    /// it has fewer than `max_queue` waiters, or room can be made, and,
    /// with a `max_wait`, when the longest its wait can take at the line's
    /// pace (the permits that can go before it as the lanes take their
    /// turns: see [`Waiters::turns_for`]) is within it.
    /// `text` names the key for per-key counters.
    #[inline(always)]
    pub(crate) fn acquire(
        self: &Arc<Self>,
        max_queue: usize,
        lane: Lane,
        max_wait: Option<Duration>,
        text: &dyn Fn() -> String,
    ) -> Acquire {
        let mut word = self.word.load(Ordering::Relaxed);
        // Read once, as the field it was before it could change: a request
        // that read the old limit goes before the change.
        let max = self.max.load(Ordering::Relaxed);
        // Nobody waiting and a permit free: take it, no lock.
        while word < FREE_BELOW && word & OUT < max {
            match self.word.compare_exchange_weak(
                word,
                word + self.step,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if lane.id != 0 {
                        self.last_lane.store(lane.id, Ordering::Relaxed);
                    }
                    self.entered(text);
                    return Acquire::Granted(Permit {
                        state: self.clone(),
                    });
                }
                Err(now) => word = now,
            }
        }
        self.acquire_slow(max_queue, lane, max_wait, text)
    }

    #[cold]
    #[inline(never)]
    fn acquire_slow(
        self: &Arc<Self>,
        max_queue: usize,
        lane: Lane,
        max_wait: Option<Duration>,
        text: &dyn Fn() -> String,
    ) -> Acquire {
        let mut queue = self.queue.lock();
        let mut word = self.carry(&mut queue);
        loop {
            if word & QUEUED != 0 {
                break;
            }
            // Nobody waits: a permit may have come back since we looked.
            let (next, granted) = if word & OUT < self.max.load(Ordering::Relaxed) {
                (word + self.step, true)
            } else if max_queue == 0 {
                drop(queue);
                self.stats.record(self.key, Event::Rejected, text);
                return Acquire::Full;
            } else {
                // All out: say that requests wait, from exactly this word, so
                // a permit given back meanwhile is seen (the swap fails).
                (word | QUEUED, false)
            };
            match self
                .word
                .compare_exchange(word, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if granted => {
                    drop(queue);
                    if lane.id != 0 {
                        self.last_lane.store(lane.id, Ordering::Relaxed);
                    }
                    self.entered(text);
                    return Acquire::Granted(Permit {
                        state: self.clone(),
                    });
                }
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        if let Some(max_wait) = max_wait {
            let turns = queue.waiters.turns_for(lane.id, lane.weight);
            let longest = queue
                .pace
                .unwrap_or_default()
                .saturating_mul(u32::try_from(turns).unwrap_or(u32::MAX));
            if longest > max_wait {
                if queue.waiters.is_empty() {
                    // The flag was set for this request alone.
                    self.word.fetch_and(!QUEUED, Ordering::Release);
                }
                drop(queue);
                self.stats.record(self.key, Event::Rejected, text);
                return Acquire::TooLong(longest);
            }
        }
        let mut pushed_out = None;
        if queue.waiters.len() >= max_queue {
            // Never waiting makes no room either.
            let out = if max_queue == 0 {
                None
            } else {
                queue.waiters.push_out_for(lane.id)
            };
            match out {
                Some(out) => {
                    queue.pushed_out.push(out.ticket);
                    pushed_out = out.waker;
                }
                None => {
                    drop(queue);
                    self.stats.record(self.key, Event::Rejected, text);
                    return Acquire::Full;
                }
            }
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        let since = Instant::now();
        let last = self.last_lane.load(Ordering::Relaxed);
        queue.waiters.push(
            Waiter {
                ticket,
                lane: lane.id,
                weight: lane.weight,
                waker: None,
            },
            last,
        );
        drop(queue);
        if let Some(waker) = pushed_out {
            waker.wake();
        }
        self.stats.record(self.key, Event::Queued, text);
        Acquire::Queued(QueueTicket {
            state: self.clone(),
            ticket,
            since,
            armed: true,
        })
    }

    /// Give a permit back: to the oldest waiter if there is one, else to the
    /// count. `entered`: its request reached the inner service, and leaves
    /// the flight now. True when this left a key in the store with nothing
    /// out.
    #[inline]
    fn release(&self, entered: bool) -> bool {
        let mut word = self.word.load(Ordering::Relaxed);
        while word & QUEUED == 0 {
            match self.word.compare_exchange_weak(
                word,
                word - u64::from(word & OUT != 0),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if entered {
                        self.left();
                    }
                    return word & OUT <= 1 && self.owner.is_some();
                }
                Err(now) => word = now,
            }
        }
        self.release_slow(entered)
    }

    #[cold]
    fn release_slow(&self, entered: bool) -> bool {
        let queue = self.queue.lock();
        self.release_locked(queue, entered)
    }

    /// [`release`](Self::release) under the key's lock.
    fn release_locked(&self, mut queue: MutexGuard<'_, Queue>, entered: bool) -> bool {
        // More out than the limit allows (it was lowered while they were
        // out): the permit is not passed on; the waiters wait until fewer
        // than the limit are out.
        let over = self.word.load(Ordering::Relaxed) & OUT > self.max.load(Ordering::Relaxed);
        let next = if over { None } else { queue.waiters.pop_next() };
        if let Some(next) = &next {
            self.last_lane.store(next.lane, Ordering::Relaxed);
        }
        let Some(next) = next else {
            // Nobody waits (or the last waiter left since we looked, and
            // cleared the flag).
            let before = self.word.fetch_sub(1, Ordering::Release);
            drop(queue);
            if entered {
                self.left();
            }
            return before & OUT <= 1 && self.owner.is_some();
        };
        // The permit passes on; the count of permits out stays. The waiter
        // still waits (for the inner service now), and counts as admitted
        // once it is sent ([`Granted::enter`]): it may yet be dropped.
        if self.counts_itself() {
            queue.granted += 1;
        }
        if queue.waiters.is_empty() {
            self.word.fetch_and(!QUEUED, Ordering::Release);
        }
        drop(queue);
        if entered {
            self.left();
        }
        if let Some(waker) = next.waker {
            waker.wake();
        }
        false
    }

    /// A permit was held `took` and is about to be given back: learn the
    /// line's pace from it, averaged over about four. Only a permit that
    /// others waited for says how fast the line moves; one nobody waited
    /// for can only say it moves faster now (so a pace learned in a slow
    /// spell does not refuse every wait after it).
    fn learn_pace(&self, took: Duration) {
        let mut queue = self.queue.lock();
        let waited_for = !queue.waiters.is_empty();
        queue.pace = match queue.pace {
            Some(pace) if waited_for || took < pace => {
                Some(pace.saturating_mul(3).saturating_add(took) / 4)
            }
            None if waited_for => Some(took),
            unchanged => unchanged,
        };
    }

    /// A permit handed to a waiter that was dropped before it was sent:
    /// give it back, the request counted neither admitted nor in flight.
    fn abandon(&self) -> bool {
        self.stats
            .record(self.key, Event::Dequeued(None), &String::new);
        if self.counts_itself() {
            let mut queue = self.queue.lock();
            queue.granted -= 1;
            return self.release_locked(queue, false);
        }
        self.release(false)
    }

    /// A waiter handed a permit was sent `waited` after it joined the
    /// queue (its turn, then the inner service's readiness): count it
    /// admitted and in flight.
    fn entered_after(&self, waited: Duration) {
        if self.counts_itself() {
            let mut queue = self.queue.lock();
            self.carry(&mut queue);
            self.word.fetch_add(ADMITTED, Ordering::Relaxed);
            queue.granted -= 1;
            drop(queue);
        }
        self.stats
            .record(self.key, Event::Dequeued(Some(waited)), &String::new);
        self.entered(&String::new);
    }

    /// Ready once `ticket` has been granted its permit or pushed out;
    /// otherwise remember the task to wake.
    fn poll_granted(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<Turn> {
        let mut queue = self.queue.lock();
        let Some(waiter) = queue.waiters.get_mut(ticket) else {
            if queue.was_pushed_out(ticket) {
                drop(queue);
                self.stats
                    .record(self.key, Event::Dequeued(None), &String::new);
                return Poll::Ready(Turn::PushedOut);
            }
            return Poll::Ready(Turn::Granted);
        };
        match &waiter.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => waiter.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Take `ticket` out of the queue. True when it was still waiting (or
    /// had been pushed out); false when it had been granted its permit,
    /// which the caller now holds.
    fn leave(&self, ticket: u64) -> bool {
        let mut queue = self.queue.lock();
        if queue.waiters.remove(ticket).is_none() {
            if queue.was_pushed_out(ticket) {
                drop(queue);
                self.stats
                    .record(self.key, Event::Dequeued(None), &String::new);
                return true;
            }
            return false;
        }
        if queue.waiters.is_empty() {
            self.word.fetch_and(!QUEUED, Ordering::Release);
        }
        drop(queue);
        self.stats
            .record(self.key, Event::Dequeued(None), &String::new);
        true
    }

    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && self.word.load(Ordering::Acquire) & (QUEUED | OUT) == 0
    }
}

/// A key's place in the store.
#[derive(Default)]
pub(crate) struct StoreEntry(Option<Arc<KeyState>>);

impl Idle for StoreEntry {
    fn is_idle(&self, _now: Nanos) -> bool {
        // Under the shard lock, which every new holder of the state takes
        // (or it already holds the state): nobody can appear meanwhile.
        self.0.as_ref().is_none_or(KeyState::is_idle)
    }
}

/// The per-key permits of one layer, shared by its services.
pub(crate) struct Permits {
    /// Permits per key, as configured (see [`Permits::limit`]).
    max: AtomicUsize,
    /// Off: every key may have any number out (see [`Permits::limit`]).
    enabled: AtomicBool,
    /// Changes of `max` and `enabled` one at a time, each applied to every
    /// key before the next.
    changing: Mutex<()>,
    store: Store<StoreEntry, ()>,
    /// The state of the one key of a layer keyed by
    /// [`GlobalKey`](crate::key::GlobalKey): always at hand, never hashed
    /// nor looked up, never in the store.
    single: Arc<KeyState>,
    seed: KeySeed,
    pub(crate) stats: Arc<Stats>,
    me: Weak<Permits>,
}

impl fmt::Debug for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permits")
            .field("max_in_flight", &self.max())
            .field("enabled", &self.is_enabled())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Permits {
    /// Permits for at most `max` requests in flight per key (`max > 0`,
    /// checked by the layer); `key_stats` says which keys are counted apart.
    pub(crate) fn new(max: usize, key_stats: KeyTracking) -> Arc<Self> {
        let max = max.min(MAX_PERMITS);
        let seed = KeySeed::default();
        // The key with no parts: what `seed.hash` makes of `GlobalKey`.
        let global = seed.hash_parts::<&str>(&[]);
        Arc::new_cyclic(|me: &Weak<Self>| {
            // The single key counts its requests in flight in its own word,
            // with the atomic operations that take and give back permits,
            // rather than with two more on the stats; a snapshot adds them
            // in. Counted apart, its requests go to the per-key table.
            let counts_itself = key_stats.max_keys == 0;
            let mut stats = Stats::new(key_stats).tracking_in_flight();
            if counts_itself {
                let me = me.clone();
                stats = stats.counting_outside(Box::new(move || {
                    me.upgrade()
                        .map_or((0, 0), |permits| permits.single.own_counts())
                }));
            }
            let stats = Arc::new(stats);
            Self {
                max: AtomicUsize::new(max),
                enabled: AtomicBool::new(true),
                changing: Mutex::new(()),
                store: Store::new((), NO_ROUNDS),
                single: KeyState::new(max, global, stats.clone(), None, counts_itself),
                seed,
                stats,
                me: me.clone(),
            }
        })
    }

    /// The state of the one key of a layer keyed by
    /// [`GlobalKey`](crate::key::GlobalKey).
    #[inline]
    pub(crate) fn single(&self) -> &Arc<KeyState> {
        &self.single
    }

    pub(crate) fn seed(&self) -> &KeySeed {
        &self.seed
    }

    /// Permits per key, as configured.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    /// `key`'s state, made if it has none.
    pub(crate) fn key_state(&self, key: KeyHash) -> Arc<KeyState> {
        let mut locked = self.store.lock(key, 0);
        let ((), slot) = locked.get();
        slot.0
            .get_or_insert_with(|| {
                KeyState::new(
                    self.limit() as usize,
                    key,
                    self.stats.clone(),
                    Some(self.me.clone()),
                    false,
                )
            })
            .clone()
    }

    /// Drop `state` from the store if it is idle but for its caller's hold
    /// and its shard is past [`LINGER`].
    fn forget_if_idle(&self, state: &Arc<KeyState>) {
        let mut locked = self.store.lock(state.key, 0);
        if locked.shard_len() <= LINGER {
            return;
        }
        let ((), slot) = locked.get();
        let idle = slot.0.as_ref().is_some_and(|held| {
            Arc::ptr_eq(held, state)
                && Arc::strong_count(held) == 2
                && held.word.load(Ordering::Acquire) & (QUEUED | OUT) == 0
        });
        if idle {
            locked.remove();
        }
    }

    /// How many keys hold state: those with a request in flight or waiting,
    /// those a service remembers, and idle ones not yet dropped; the single
    /// key counts while it has a request in flight or waiting.
    pub(crate) fn key_count(&self) -> usize {
        let single = self.single.word.load(Ordering::Relaxed) & (QUEUED | OUT) != 0;
        self.store.len() + usize::from(single)
    }

    /// Drop every idle key state now.
    pub(crate) fn evict_idle(&self) -> usize {
        self.store.evict_idle(0)
    }
}

/// The right to have one request in flight on a key. Dropping it gives the
/// permit back: to the oldest request waiting on the key, if any.
///
/// A [`ConcurrencyLayer`](super::ConcurrencyLayer) puts the permit of each
/// request into its response (see [`HoldPermit`](super::HoldPermit)).
pub struct Permit {
    state: Arc<KeyState>,
}

impl Permit {
    /// This permit was held `took` (a fair queue's turn): its key's line
    /// learns its pace from it.
    pub(crate) fn held_for(&self, took: Duration) {
        self.state.learn_pace(took);
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        if self.state.release(true) {
            forget_if_idle(&self.state);
        }
    }
}

/// A permit handed to a waiter that has not reached the inner service yet
/// (still counted as queued). It becomes a [`Permit`], and its request
/// counts as admitted, only when the request is sent ([`Granted::enter`]);
/// dropped before, it passes the permit on and the request counts as
/// neither admitted nor in flight.
pub(crate) struct Granted {
    state: Arc<KeyState>,
    /// When the request joined the queue.
    since: Instant,
    /// Cleared once it became a permit.
    live: bool,
}

impl Granted {
    /// The request is being sent: count it, and hold the permit as any
    /// request in flight does.
    pub(crate) fn enter(mut self) -> Permit {
        self.live = false;
        self.state.entered_after(self.since.elapsed());
        Permit {
            state: self.state.clone(),
        }
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if self.live && self.state.abandon() {
            forget_if_idle(&self.state);
        }
    }
}

/// Called by the last-but-one holder of `state` as it lets go: when only
/// the store would be left holding an idle state, drop it from the store
/// (nobody else would notice it is idle).
fn forget_if_idle(state: &Arc<KeyState>) {
    if Arc::strong_count(state) == 2 && state.word.load(Ordering::Relaxed) & (QUEUED | OUT) == 0 {
        if let Some(owner) = state.owner.as_ref().and_then(Weak::upgrade) {
            owner.forget_if_idle(state);
        }
    }
}

/// The key state a service served last, kept so that a run of requests on
/// one key skips the store.
#[derive(Default)]
pub(crate) struct LastKey(Option<(KeyHash, Arc<KeyState>)>);

impl LastKey {
    /// `key`'s state: the one kept, or from `permits` (and kept).
    #[inline]
    pub(crate) fn state(&mut self, key: KeyHash, permits: &Permits) -> &Arc<KeyState> {
        if !matches!(&self.0, Some((last, _)) if *last == key) {
            self.replace(key, permits);
        }
        // Kept by now: the closure does not run.
        &self
            .0
            .get_or_insert_with(|| (key, permits.key_state(key)))
            .1
    }

    #[cold]
    fn replace(&mut self, key: KeyHash, permits: &Permits) {
        let state = permits.key_state(key);
        if let Some((_, old)) = self.0.replace((key, state)) {
            forget_if_idle(&old);
        }
    }
}

impl Drop for LastKey {
    fn drop(&mut self) {
        if let Some((_, state)) = self.0.take() {
            forget_if_idle(&state);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

/// A place in a key's queue. Dropped before its permit is taken, it leaves
/// the queue, or gives back the permit it was granted in the meantime.
pub(crate) struct QueueTicket {
    state: Arc<KeyState>,
    ticket: u64,
    since: Instant,
    /// Cleared once the place has become a permit or been given up.
    armed: bool,
}

impl QueueTicket {
    /// When the request joined the queue.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// Whether its key's line has a known pace (see [`KeyState::acquire`]).
    pub(crate) fn paced(&self) -> bool {
        self.state.queue.lock().pace.is_some()
    }

    /// Ready once the permit has been granted, or the place pushed out.
    pub(crate) fn poll_granted(&self, cx: &mut Context<'_>) -> Poll<Turn> {
        self.state.poll_granted(self.ticket, cx)
    }

    /// Give up waiting: `Ok(waited)` when the ticket left the queue, or the
    /// permit when it had been granted in the meantime.
    pub(crate) fn give_up(mut self) -> Result<Duration, Granted> {
        self.armed = false;
        if self.state.leave(self.ticket) {
            let state = &self.state;
            state.stats.record(state.key, Event::Rejected, &String::new);
            Ok(self.since.elapsed())
        } else {
            Err(self.granted())
        }
    }

    /// The place was pushed out (as [`poll_granted`](Self::poll_granted)
    /// said): count the request refused.
    pub(crate) fn pushed_out(mut self) {
        self.armed = false;
        let state = &self.state;
        state.stats.record(state.key, Event::Rejected, &String::new);
    }

    /// The granted permit; only after [`poll_granted`](Self::poll_granted)
    /// was ready.
    pub(crate) fn into_granted(mut self) -> Granted {
        self.armed = false;
        self.granted()
    }

    fn granted(&self) -> Granted {
        Granted {
            state: self.state.clone(),
            since: self.since,
            live: true,
        }
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if self.armed && !self.state.leave(self.ticket) {
            // Granted, but nobody will use it: pass it on.
            drop(self.granted());
        }
    }
}

impl fmt::Debug for QueueTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueTicket")
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
