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
//! neither hash a key nor look one up.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::clock::Nanos;
use crate::key::{KeyHash, KeySeed};
use crate::stats::{Event, Stats};
use crate::store::{Idle, Store};

/// Set in a key's word while its queue has waiters.
const QUEUED: usize = 1 << (usize::BITS - 1);
/// The largest number of permits per key the word can count.
const MAX_PERMITS: usize = QUEUED - 1;

/// Idle states go when their last permit does (below), so the store never
/// needs to sweep on a timer; it still sweeps a shard that has doubled.
const NO_ROUNDS: Nanos = Nanos::MAX;

/// A shard keeps up to this many key states before dropping idle ones as
/// they go idle: a key used now and then keeps its state between requests
/// instead of making and freeing it each time, and at most `64 × LINGER`
/// idle states (4,096, about half a MiB) stay behind after a flood of keys.
const LINGER: usize = 64;

/// One waiting request.
struct Waiter {
    ticket: u64,
    /// The task to wake when the permit comes; `None` until first polled.
    waker: Option<Waker>,
    since: Instant,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    /// Oldest first; tickets strictly rising.
    waiters: VecDeque<Waiter>,
}

impl Queue {
    fn position(&self, ticket: u64) -> Option<usize> {
        self.waiters
            .binary_search_by_key(&ticket, |w| w.ticket)
            .ok()
    }
}

/// One key's permits and queue.
pub(crate) struct KeyState {
    /// Permits out (including ones handed to a waiter that has not yet
    /// noticed), plus [`QUEUED`] while the queue has waiters.
    word: AtomicUsize,
    queue: Mutex<Queue>,
    max: usize,
    key: KeyHash,
    stats: Arc<Stats>,
    /// To drop this state from the store once it is idle; `None` for the
    /// single key's state, which is not in the store.
    owner: Option<Weak<Permits>>,
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = self.word.load(Ordering::Relaxed);
        f.debug_struct("KeyState")
            .field("in_flight", &(word & MAX_PERMITS))
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
}

impl KeyState {
    fn new(max: usize, key: KeyHash, stats: Arc<Stats>, owner: Option<Weak<Permits>>) -> Arc<Self> {
        Arc::new(Self {
            word: AtomicUsize::new(0),
            queue: Mutex::new(Queue::default()),
            max,
            key,
            stats,
            owner,
        })
    }

    /// Take a permit, or join the queue when it has fewer than `max_queue`
    /// waiters. `text` names the key for per-key counters.
    #[inline]
    pub(crate) fn acquire(
        self: &Arc<Self>,
        max_queue: usize,
        text: &dyn Fn() -> String,
    ) -> Acquire {
        let mut word = self.word.load(Ordering::Relaxed);
        // Nobody waiting and a permit free: take it, no lock.
        while word & QUEUED == 0 && word < self.max {
            match self.word.compare_exchange_weak(
                word,
                word + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.stats.record(self.key, Event::Entered, text);
                    return Acquire::Granted(Permit {
                        state: self.clone(),
                    });
                }
                Err(now) => word = now,
            }
        }
        self.acquire_slow(max_queue, text)
    }

    #[cold]
    fn acquire_slow(self: &Arc<Self>, max_queue: usize, text: &dyn Fn() -> String) -> Acquire {
        let mut queue = self.queue.lock();
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if word & QUEUED != 0 {
                break;
            }
            // Nobody waits: a permit may have come back since we looked.
            let (next, granted) = if word < self.max {
                (word + 1, true)
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
                    self.stats.record(self.key, Event::Entered, text);
                    return Acquire::Granted(Permit {
                        state: self.clone(),
                    });
                }
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        if queue.waiters.len() >= max_queue {
            drop(queue);
            self.stats.record(self.key, Event::Rejected, text);
            return Acquire::Full;
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        let since = Instant::now();
        queue.waiters.push_back(Waiter {
            ticket,
            waker: None,
            since,
        });
        drop(queue);
        self.stats.record(self.key, Event::Queued, text);
        Acquire::Queued(QueueTicket {
            state: self.clone(),
            ticket,
            since,
            armed: true,
        })
    }

    /// Give a permit back: to the oldest waiter if there is one, else to the
    /// count. True when this left a key in the store with nothing out.
    #[inline]
    fn release(&self) -> bool {
        let mut word = self.word.load(Ordering::Relaxed);
        while word & QUEUED == 0 {
            match self.word.compare_exchange_weak(
                word,
                word.saturating_sub(1),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.stats.record(self.key, Event::Left, &String::new);
                    return word <= 1 && self.owner.is_some();
                }
                Err(now) => word = now,
            }
        }
        self.release_slow()
    }

    #[cold]
    fn release_slow(&self) -> bool {
        let mut queue = self.queue.lock();
        let Some(next) = queue.waiters.pop_front() else {
            // The last waiter left since we looked, and cleared the flag.
            let before = self.word.fetch_sub(1, Ordering::Release);
            drop(queue);
            self.stats.record(self.key, Event::Left, &String::new);
            return before & MAX_PERMITS <= 1 && self.owner.is_some();
        };
        if queue.waiters.is_empty() {
            self.word.fetch_and(!QUEUED, Ordering::Release);
        }
        drop(queue);
        // The permit passes on; the count stays.
        let stats = &self.stats;
        stats.record(self.key, Event::Left, &String::new);
        stats.record(
            self.key,
            Event::Dequeued(Some(next.since.elapsed())),
            &String::new,
        );
        stats.record(self.key, Event::Entered, &String::new);
        if let Some(waker) = next.waker {
            waker.wake();
        }
        false
    }

    /// Ready once `ticket` has been granted its permit; otherwise remember
    /// the task to wake.
    fn poll_granted(&self, ticket: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut queue = self.queue.lock();
        let Some(i) = queue.position(ticket) else {
            return Poll::Ready(());
        };
        let waiter = &mut queue.waiters[i];
        match &waiter.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => waiter.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Take `ticket` out of the queue. True when it was still waiting;
    /// false when it had been granted its permit, which the caller now holds.
    fn leave(&self, ticket: u64) -> bool {
        let mut queue = self.queue.lock();
        let Some(i) = queue.position(ticket) else {
            return false;
        };
        queue.waiters.remove(i);
        if queue.waiters.is_empty() {
            self.word.fetch_and(!QUEUED, Ordering::Release);
        }
        drop(queue);
        self.stats
            .record(self.key, Event::Dequeued(None), &String::new);
        true
    }

    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && self.word.load(Ordering::Acquire) == 0
    }
}

/// A key's place in the store.
#[derive(Default)]
pub(crate) struct Slot(Option<Arc<KeyState>>);

impl Idle for Slot {
    fn is_idle(&self, _now: Nanos) -> bool {
        // Under the shard lock, which every new holder of the state takes
        // (or it already holds the state): nobody can appear meanwhile.
        self.0.as_ref().is_none_or(KeyState::is_idle)
    }
}

/// The per-key permits of one layer, shared by its services.
pub(crate) struct Permits {
    max: usize,
    store: Store<Slot, ()>,
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
            .field("max_in_flight", &self.max)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Permits {
    /// Permits for at most `max` requests in flight per key (`max > 0`,
    /// checked by the layer); `key_stats` keys counted apart.
    pub(crate) fn new(max: usize, key_stats: usize) -> Arc<Self> {
        let max = max.min(MAX_PERMITS);
        let seed = KeySeed::default();
        let stats = Arc::new(Stats::new(key_stats).tracking_in_flight());
        // The key with no parts: what `seed.hash` makes of `GlobalKey`.
        let single = KeyState::new(max, seed.hash_parts::<&str>(&[]), stats.clone(), None);
        Arc::new_cyclic(|me| Self {
            max,
            store: Store::new((), NO_ROUNDS),
            single,
            seed,
            stats,
            me: me.clone(),
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

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// `key`'s state, made if it has none.
    pub(crate) fn key_state(&self, key: KeyHash) -> Arc<KeyState> {
        let mut locked = self.store.lock(key, 0);
        let ((), slot) = locked.get();
        slot.0
            .get_or_insert_with(|| {
                KeyState::new(self.max, key, self.stats.clone(), Some(self.me.clone()))
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
                && held.word.load(Ordering::Acquire) == 0
        });
        if idle {
            locked.remove();
        }
    }

    /// How many keys hold state: those with a request in flight or waiting,
    /// those a service remembers, and idle ones not yet dropped; the single
    /// key counts while it has a request in flight or waiting.
    pub(crate) fn key_count(&self) -> usize {
        let single = self.single.word.load(Ordering::Relaxed) != 0;
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

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        if self.state.release() {
            forget_if_idle(&self.state);
        }
    }
}

/// Called by the last-but-one holder of `state` as it lets go: when only
/// the store would be left holding an idle state, drop it from the store
/// (nobody else would notice it is idle).
fn forget_if_idle(state: &Arc<KeyState>) {
    if Arc::strong_count(state) == 2 && state.word.load(Ordering::Relaxed) == 0 {
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

    /// Ready once the permit has been granted.
    pub(crate) fn poll_granted(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.state.poll_granted(self.ticket, cx)
    }

    /// Give up waiting: `Ok(waited)` when the ticket left the queue, or the
    /// permit when it had been granted in the meantime.
    pub(crate) fn give_up(mut self) -> Result<Duration, Permit> {
        self.armed = false;
        if self.state.leave(self.ticket) {
            let state = &self.state;
            state.stats.record(state.key, Event::Rejected, &String::new);
            Ok(self.since.elapsed())
        } else {
            Err(Permit {
                state: self.state.clone(),
            })
        }
    }

    /// The granted permit; only after [`poll_granted`](Self::poll_granted)
    /// was ready.
    pub(crate) fn into_permit(mut self) -> Permit {
        self.armed = false;
        Permit {
            state: self.state.clone(),
        }
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        if self.armed && !self.state.leave(self.ticket) {
            // Granted, but nobody will use it: pass it on.
            drop(Permit {
                state: self.state.clone(),
            });
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
