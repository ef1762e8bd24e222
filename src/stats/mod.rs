//! Counters every layer keeps, snapshots of them, and a subscription that
//! wakes when they move.
//!
//! The request path only touches relaxed atomics on its thread's stripe, so
//! two cores counting do not share a cache line; a snapshot adds the stripes
//! up. A request may be counted in on one thread and out on another, so
//! while requests are moving the gauges (`queued_now`, `in_flight`) are
//! approximate; the totals are exact, and the gauges are once things settle. A subscriber is woken once per burst of changes, not
//! once per request: the first change after a subscriber looked sets a flag
//! and wakes it; further changes only see the flag set.
//!
//! ```
//! use tower_throttle::key::GlobalKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//!
//! let layer = RateLimitLayer::new(Quota::per_second(5)?, GlobalKey);
//! let snapshot = layer.handle().stats();
//! assert_eq!(snapshot.aggregate.admitted, 0);
//! # Ok::<(), tower_throttle::error::ConfigError>(())
//! ```

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use crate::key::KeyHash;
use crate::sync::{AtomicI64, AtomicU64, Mutex, MutexGuard};

#[cfg(feature = "metrics")]
mod export;
mod keys;
mod subscription;

#[cfg(feature = "metrics")]
pub use export::MetricsReporter;

use keys::KeyTable;
pub(crate) use keys::{KeyFilter, KeyTracking};
use subscription::Hub;
pub use subscription::StatsSubscription;

/// The name under which keys not counted apart are added up: those a
/// [filter](crate::rate_limit::RateLimitLayer::with_key_stats_where)
/// declined, and those beyond the table's size.
pub const OTHER_KEYS: &str = "(other)";

/// One key's counters (or the sum over all keys), as plain numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeyStats {
    /// The key as it may be shown: parts joined by `/`, secret parts as
    /// their [fingerprint](crate::redact::Fingerprint), the others with
    /// control characters [escaped](crate::redact::Escaped). `*` for the
    /// aggregate, [`OTHER_KEYS`] for the keys not counted apart.
    pub key: String,
    /// Requests let through to the inner service.
    pub admitted: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Requests a dry-run limit let through but would have refused.
    pub would_reject: u64,
    /// Bookings given back, in whole or in part: a request that did not
    /// count (refused further in, or an error a layer's counting policy
    /// does not count), one that left its wait before its turn, or one
    /// that cost less than it was charged (settled). Counted by rate
    /// limits as they give back (with Redis: as the give-back is sent; one
    /// a reset under way voids may still count); zero elsewhere.
    pub given_back: u64,
    /// Admitted requests that waited for their turn first.
    pub waited: u64,
    /// The time those requests waited, in total, in milliseconds.
    pub total_wait_ms: f64,
    /// The average wait of those that waited, in milliseconds.
    pub avg_wait_ms: f64,
    /// Requests waiting now.
    pub queued_now: u64,
    /// Requests in flight now: admitted and not yet finished. `None` for a
    /// layer that does not follow requests past admission (the rate
    /// limiter); left out of the serialized form then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
}

/// Counters of one layer at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// The sum over every key.
    pub aggregate: KeyStats,
    /// Per key, sorted by key text; empty unless per-key counting is on.
    /// Keys not counted apart are added up in one more entry,
    /// [`OTHER_KEYS`], listed once it has counted anything.
    pub keys: Vec<KeyStats>,
    /// Keys not counted apart because the per-key table was full.
    pub untracked_keys: u64,
    /// For a layer that keeps its state in a shared store (Redis): the
    /// calls that failed and what was decided without the store. `None`
    /// for state in process; left out of the serialized form then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreStats>,
    /// Twice the resets of the counters so far, odd while one was under
    /// way as the snapshot was taken: a reporter that sees it move knows
    /// they count from zero again, and trusts no count while it is odd.
    #[serde(skip)]
    pub(crate) resets: u64,
}

/// What a layer keeping its state in a shared store counts besides its
/// decisions, since its last stats reset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StoreStats {
    /// Calls to the store that failed or timed out.
    pub errors: u64,
    /// Decisions made without the store because a call failed (failing
    /// open: by the in-process fallback, or admitting).
    pub fallbacks: u64,
    /// Refusals made without a call, because the store refused the key a
    /// moment before and its `retry_after` has not passed.
    pub cached_refusals: u64,
}

/// The counters behind [`StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct StoreCounters {
    pub(crate) errors: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) cached_refusals: AtomicU64,
}

impl StoreCounters {
    /// Count one more.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> StoreStats {
        StoreStats {
            errors: self.errors.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            cached_refusals: self.cached_refusals.load(Ordering::Relaxed),
        }
    }

    fn reset(&self) {
        self.errors.store(0, Ordering::Relaxed);
        self.fallbacks.store(0, Ordering::Relaxed);
        self.cached_refusals.store(0, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Counters {
    admitted: AtomicU64,
    rejected: AtomicU64,
    would_reject: AtomicU64,
    given_back: AtomicU64,
    waited: AtomicU64,
    wait_nanos: AtomicU64,
    queued: AtomicI64,
    /// Requests that left the flight; in flight = admitted − left.
    left: AtomicU64,
}

/// One stripe of counters, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Stripe(Counters);

/// Two in the loom models, whose snapshots then read a few atomics only.
const STRIPES: usize = if cfg!(loom) { 2 } else { 16 };

/// This thread's stripe: threads take stripes in turn, so two cores count
/// on two cache lines whatever keys they serve (striping by key made two
/// threads on many keys share every stripe). Snapshots add the stripes up,
/// so an event and its reverse may land on different stripes.
#[cfg(not(loom))]
#[inline]
fn stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| {
        let mut i = stripe.get();
        if i == usize::MAX {
            i = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            stripe.set(i);
        }
        i
    })
}

/// In the loom models, a thread's stripe follows from its number in the
/// model (`ThreadId(n)`), so that every execution of a model touches the
/// same atomics (loom replays executions and must see the same ones);
/// threads share the stripes, as they do past sixteen threads.
#[cfg(loom)]
fn stripe() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.bytes().map(usize::from).sum::<usize>() % STRIPES
}

/// Plain counters for one key in the per-key table.
#[derive(Clone, Default)]
struct Tally {
    text: String,
    admitted: u64,
    rejected: u64,
    would_reject: u64,
    given_back: u64,
    waited: u64,
    wait_nanos: u64,
    queued: i64,
    left: u64,
    /// In flight when the counters were last reset: admitted before, not
    /// yet left.
    carried: u64,
}

impl Tally {
    /// Requests in flight: admitted (or carried over a reset), not yet
    /// left.
    fn in_flight(&self) -> u64 {
        self.carried
            .saturating_add(self.admitted)
            .saturating_sub(self.left)
    }

    /// Zero the counters, keeping the gauges: what is queued, and what is
    /// in flight (carried).
    fn reset(&mut self) {
        *self = Self {
            text: std::mem::take(&mut self.text),
            queued: self.queued,
            carried: self.in_flight(),
            ..Self::default()
        };
    }

    fn count(&mut self, event: Event) {
        match event {
            Event::Admitted | Event::Entered => self.admitted += 1,
            Event::Rejected => self.rejected += 1,
            Event::WouldReject => self.would_reject += 1,
            Event::GivenBack => self.given_back += 1,
            Event::Queued => self.queued += 1,
            Event::Dequeued(wait) => {
                self.queued -= 1;
                if let Some(wait) = wait {
                    self.waited += 1;
                    self.wait_nanos = self
                        .wait_nanos
                        .saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
                }
            }
            Event::Left => self.left += 1,
        }
    }
}

/// What happened to one request, as the counters see it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Admitted,
    Rejected,
    WouldReject,
    /// A booking was given back (see [`KeyStats::given_back`]).
    GivenBack,
    Queued,
    /// A waiter left the queue; `Some(wait)` when it went on to be admitted.
    Dequeued(Option<Duration>),
    /// A request was admitted and went in flight: counted as admitted, and
    /// as in flight until its [`Event::Left`]. A layer that tracks in-flight
    /// records every admission this way (one counter per event on the
    /// request path).
    Entered,
    /// A request in flight finished: its response ended, failed or was
    /// dropped.
    Left,
}

/// Counts a layer keeps itself instead of in the stripes, added to the
/// aggregate at every snapshot: requests admitted, and requests that left.
/// It reads them from state that a subscription keeps alive (see
/// [`Stats::subscribe_keeping`]).
pub(crate) type Outside = Box<dyn Fn() -> (u64, u64) + Send + Sync>;

/// The counters of one layer, shared by its services.
pub(crate) struct Stats {
    stripes: Box<[Stripe]>,
    outside: Option<Outside>,
    keys: Option<Mutex<KeyTable>>,
    max_keys: usize,
    filter: Option<KeyFilter>,
    untracked: AtomicU64,
    /// Bumped before and after each reset (see [`StatsSnapshot::resets`]).
    resets: AtomicU64,
    /// The striped totals at the last reset, taken off every snapshot's
    /// counters (the stripes themselves are never written but by requests).
    baseline: Mutex<Tally>,
    /// Whether the layer reports requests in flight.
    tracks_in_flight: bool,
    /// A shared store's counters, for a layer that keeps its state in one.
    store: Option<Arc<StoreCounters>>,
    hub: Arc<Hub>,
    /// Each admitted wait, recorded as it ends once a
    /// [`MetricsReporter`] reports this layer.
    #[cfg(feature = "metrics")]
    waits: std::sync::OnceLock<::metrics::Histogram>,
}

impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stats")
            .field("per_key", &self.keys.is_some())
            .field("max_keys", &self.max_keys)
            .field("filtered", &self.filter.is_some())
            .field("tracks_in_flight", &self.tracks_in_flight)
            .finish_non_exhaustive()
    }
}

impl Stats {
    /// Counters for a layer; `tracking.max_keys` above zero also counts up
    /// to that many keys apart.
    pub(crate) fn new(tracking: KeyTracking) -> Self {
        let max_keys = tracking.max_keys;
        Self {
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            outside: None,
            keys: (max_keys > 0).then(|| Mutex::new(KeyTable::default())),
            max_keys,
            filter: tracking.filter,
            untracked: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            baseline: Mutex::new(Tally::default()),
            tracks_in_flight: false,
            store: None,
            hub: Arc::new(Hub::default()),
            #[cfg(feature = "metrics")]
            waits: std::sync::OnceLock::new(),
        }
    }

    /// Record each admitted wait in `histogram` from now on (the first
    /// histogram set stays).
    #[cfg(feature = "metrics")]
    pub(crate) fn record_waits_in(&self, histogram: ::metrics::Histogram) {
        let _ = self.waits.set(histogram);
    }

    /// The same counters, also reporting a shared store's in every
    /// snapshot.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_store_counters(mut self, counters: Arc<StoreCounters>) -> Self {
        self.store = Some(counters);
        self
    }

    /// The same counters, also reporting requests in flight
    /// ([`Event::Entered`] / [`Event::Left`]) in every snapshot.
    pub(crate) fn tracking_in_flight(mut self) -> Self {
        self.tracks_in_flight = true;
        self
    }

    /// The same counters, plus those `outside` returns at each snapshot.
    pub(crate) fn counting_outside(mut self, outside: Outside) -> Self {
        self.outside = Some(outside);
        self
    }

    /// Count `event` for `key`; `text` names the key the first time the
    /// per-key table sees it.
    #[inline]
    pub(crate) fn record(&self, key: KeyHash, event: Event, text: &dyn Fn() -> String) {
        let c = &self.stripes[stripe()].0;
        match event {
            Event::Admitted => c.admitted.fetch_add(1, Ordering::Relaxed),
            Event::Rejected => c.rejected.fetch_add(1, Ordering::Relaxed),
            Event::WouldReject => c.would_reject.fetch_add(1, Ordering::Relaxed),
            Event::GivenBack => c.given_back.fetch_add(1, Ordering::Relaxed),
            Event::Queued => c.queued.fetch_add(1, Ordering::Relaxed) as u64,
            Event::Dequeued(wait) => {
                if let Some(wait) = wait {
                    c.waited.fetch_add(1, Ordering::Relaxed);
                    let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                    c.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
                    // Off the admission path: only a request that waited.
                    #[cfg(feature = "metrics")]
                    if let Some(waits) = self.waits.get() {
                        waits.record(wait.as_secs_f64());
                    }
                }
                c.queued.fetch_sub(1, Ordering::Relaxed) as u64
            }
            Event::Entered => c.admitted.fetch_add(1, Ordering::Relaxed),
            Event::Left => c.left.fetch_add(1, Ordering::Relaxed),
        };
        if let Some(keys) = &self.keys {
            self.record_key(keys, key, event, text);
        }
        self.hub.touch();
    }

    fn record_key(
        &self,
        keys: &Mutex<KeyTable>,
        key: KeyHash,
        event: Event,
        text: &dyn Fn() -> String,
    ) {
        let mut table = keys.lock();
        if let Some(tally) = table.keys.get_mut(&key.0) {
            // A request that came while its key was added up with the
            // others (a filter that accepted the key only later) leaves
            // from there, or the gauges of both would drift for good.
            let came_as_other = match event {
                Event::Left => tally.in_flight() == 0,
                Event::Dequeued(_) => tally.queued <= 0,
                _ => false,
            };
            if came_as_other {
                table.count_other_of(key.0, event, self.tracks_in_flight);
            } else {
                tally.count(event);
            }
            return;
        }
        if matches!(event, Event::Dequeued(_) | Event::Left | Event::GivenBack) {
            // A key leaves the table only with nothing in it: one not in it
            // when its request leaves (or gives back) was not in it when
            // the request came either, or has been forgotten since; it is
            // added up with the others.
            table.count_other_of(key.0, event, self.tracks_in_flight);
            return;
        }
        let mut name = None;
        if let Some(filter) = &self.filter {
            // The name and the filter may cost something (and the filter
            // is the user's code): not under the lock.
            drop(table);
            let shown = text();
            let tracked = filter(&shown);
            table = keys.lock();
            if !tracked {
                table.count_other_of(key.0, event, self.tracks_in_flight);
                return;
            }
            name = Some(shown);
            // Another request on this key may have put it in meanwhile.
            if let Some(tally) = table.keys.get_mut(&key.0) {
                tally.count(event);
                return;
            }
        }
        if table.keys.len() >= self.max_keys {
            if let (Some(filter), Some(_)) = (&self.filter, &name) {
                // The table is full, and the filter accepts this key: make
                // room by dropping an idle key it no longer accepts (a
                // made-up name aged out of what the filter tracks). Looked
                // for on one such event in 64: it reads every key.
                table.full_misses = table.full_misses.wrapping_add(1);
                if table.full_misses % 64 == 1 {
                    table = self.make_room(keys, table, filter);
                }
            }
        }
        if table.keys.len() >= self.max_keys {
            self.untracked.fetch_add(1, Ordering::Relaxed);
            table.count_other_of(key.0, event, self.tracks_in_flight);
            return;
        }
        let text = name.unwrap_or_else(text);
        table.insert(key.0, text).count(event);
    }

    /// Drop one idle key `filter` declines, if any: the filter runs
    /// outside the lock, on the names of the keys idle when it was taken.
    fn make_room<'a>(
        &self,
        keys: &'a Mutex<KeyTable>,
        table: MutexGuard<'a, KeyTable>,
        filter: &KeyFilter,
    ) -> MutexGuard<'a, KeyTable> {
        let idle: Vec<(u64, String)> = table
            .keys
            .iter()
            .filter(|(_, t)| t.in_flight() == 0 && t.queued <= 0)
            .map(|(&k, t)| (k, t.text.clone()))
            .collect();
        drop(table);
        let judged: Vec<(u64, bool)> = idle
            .into_iter()
            .map(|(k, text)| (k, filter(&text)))
            .collect();
        let mut table = keys.lock();
        table.evict_one(&judged);
        table
    }

    /// The aggregate's counters as the stripes (and the counts kept
    /// outside) hold them, never reset.
    fn totals(&self) -> Tally {
        let mut all = Tally {
            text: "*".to_owned(),
            ..Tally::default()
        };
        for stripe in self.stripes.iter() {
            let c = &stripe.0;
            all.admitted += c.admitted.load(Ordering::Relaxed);
            all.rejected += c.rejected.load(Ordering::Relaxed);
            all.would_reject += c.would_reject.load(Ordering::Relaxed);
            all.given_back += c.given_back.load(Ordering::Relaxed);
            all.waited += c.waited.load(Ordering::Relaxed);
            all.wait_nanos = all
                .wait_nanos
                .saturating_add(c.wait_nanos.load(Ordering::Relaxed));
            all.queued += c.queued.load(Ordering::Relaxed);
            all.left += c.left.load(Ordering::Relaxed);
        }
        if let Some(outside) = &self.outside {
            let (admitted, left) = outside();
            all.admitted += admitted;
            all.left += left;
        }
        all
    }

    /// The counters now.
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let resets = self.resets.load(Ordering::Acquire);
        let mut all = self.totals();
        // In flight from the totals themselves; the counters since the last
        // reset. Each stripe only grows, so a later sum is never below the
        // baseline.
        let in_flight = all.in_flight();
        {
            let base = self.baseline.lock();
            all.admitted = all.admitted.saturating_sub(base.admitted);
            all.rejected = all.rejected.saturating_sub(base.rejected);
            all.would_reject = all.would_reject.saturating_sub(base.would_reject);
            all.given_back = all.given_back.saturating_sub(base.given_back);
            all.waited = all.waited.saturating_sub(base.waited);
            all.wait_nanos = all.wait_nanos.saturating_sub(base.wait_nanos);
        }
        let mut keys: Vec<KeyStats> = self
            .keys
            .as_ref()
            .map(|keys| {
                let table = keys.lock();
                table
                    .keys
                    .values()
                    .chain(&table.other)
                    .map(|t| self.render(t, t.in_flight()))
                    .collect()
            })
            .unwrap_or_default();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        StatsSnapshot {
            aggregate: self.render(&all, in_flight),
            keys,
            untracked_keys: self.untracked.load(Ordering::Relaxed),
            store: self.store.as_ref().map(|s| s.snapshot()),
            // A reset began or ended while the counts were read: odd.
            resets: if self.resets.load(Ordering::Acquire) == resets {
                resets
            } else {
                resets | 1
            },
        }
    }

    /// Zero the counters, per key and in all; the gauges (queued, in
    /// flight) keep counting what is there.
    pub(crate) fn reset(&self) {
        // Odd while the counters are being zeroed.
        self.resets.fetch_add(1, Ordering::AcqRel);
        *self.baseline.lock() = self.totals();
        if let Some(store) = &self.store {
            store.reset();
        }
        if let Some(keys) = &self.keys {
            let mut table = keys.lock();
            let KeyTable { keys, other, .. } = &mut *table;
            keys.values_mut()
                .chain(other.as_mut())
                .for_each(Tally::reset);
        }
        self.untracked.store(0, Ordering::Relaxed);
        self.resets.fetch_add(1, Ordering::AcqRel);
        self.hub.touch();
    }

    fn render(&self, t: &Tally, in_flight: u64) -> KeyStats {
        let total_wait_ms = t.wait_nanos as f64 / 1e6;
        KeyStats {
            key: t.text.clone(),
            admitted: t.admitted,
            rejected: t.rejected,
            would_reject: t.would_reject,
            given_back: t.given_back,
            waited: t.waited,
            total_wait_ms,
            avg_wait_ms: if t.waited == 0 {
                0.0
            } else {
                total_wait_ms / t.waited as f64
            },
            // Gauges can read a hair below zero between a stripe's increment
            // and decrement of another request; never show that.
            queued_now: t.queued.max(0) as u64,
            // Read stripe by stripe, a request may be seen leaving but not
            // arriving; never show less than nothing.
            in_flight: self.tracks_in_flight.then_some(in_flight),
        }
    }

    /// A subscription to changes of these counters.
    pub(crate) fn subscribe(self: &Arc<Self>) -> StatsSubscription {
        StatsSubscription {
            stats: self.clone(),
            seen: self.hub.epoch.load(Ordering::Acquire),
            _keep: None,
        }
    }

    /// A subscription that also keeps `keep` alive: what the counts
    /// [outside](Self::counting_outside) these are read from.
    pub(crate) fn subscribe_keeping(
        self: &Arc<Self>,
        keep: Arc<dyn Any + Send + Sync>,
    ) -> StatsSubscription {
        StatsSubscription {
            _keep: Some(keep),
            ..self.subscribe()
        }
    }
}

#[cfg(test)]
mod tests;
