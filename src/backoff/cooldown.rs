//! The keyed cooldown table behind every clone of a backoff service: each
//! route's refusal streak, its cooldown, and the queue of requests waiting
//! for the cooldown to end.
//!
//! The queue is a per-key FIFO of one-shot wakers. Its head sleeps until the
//! cooldown's end (a tokio timer, no polling); when it goes to the inner
//! service it wakes the next, which finds the cooldown over and goes at once
//! unless a new refusal started another. Each waiter is woken exactly once,
//! and a waiter that is dropped passes the head on, so the queue never
//! stalls.
//!
//! Kept in one file (about 740 lines) on purpose: a route's streak, its
//! cooldown and its queue change together under the route's lock, and the
//! rules that keep a wake from being lost are read in one place.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::exponential::ExponentialBackoff;
use super::headers::{Reason, cooldown_from_headers};
use super::stats::CooldownEntry;
use crate::clock::{ClockSource, Nanos, Timeline, saturating_nanos};
use crate::error::CoolingDown;
use crate::key::{KeyHash, KeySeed};
use crate::redact::Quoted;
use crate::stats::{Event, KeyTracking, Stats};
use crate::store::{Idle, Store};

// The table's side of a cooldown shared through Redis.
#[cfg(feature = "redis")]
mod shared;

/// What a backoff layer is built with. All but `key_stats` can also change
/// live, through a [`BackoffHandle`](super::BackoffHandle).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) backoff: ExponentialBackoff,
    pub(crate) max_cooldown: Duration,
    pub(crate) on_503: bool,
    pub(crate) proactive: bool,
    pub(crate) key_stats: KeyTracking,
    /// Where cooldowns are shared with other replicas.
    pub(crate) store: Option<crate::redis::RedisStore>,
}

/// One waiter in a route's queue.
struct QueueEntry {
    id: u64,
    /// Wakes the waiter when it becomes the head; `None` for a waiter that
    /// arrived at an empty queue (it is the head from the start) or was
    /// already woken.
    wake: Option<oneshot::Sender<()>>,
}

/// One route's state.
#[derive(Default)]
pub(crate) struct Route {
    /// The key's text, kept once known so that a response can name it.
    text: Option<Arc<str>>,
    /// Consecutive 429 responses without a success in between.
    streak: u32,
    /// The engine-wide epoch of this route's latest cooldown start: requests
    /// sent before it carry an older one.
    generation: u64,
    /// The cooldown ends here.
    until: Nanos,
    /// A quiet route forgets its streak here.
    forget_at: Nanos,
    queue: VecDeque<QueueEntry>,
    next_id: u64,
    /// The shared cooldown's generation, as the store last said (see
    /// `Cooldowns::merge_shared`).
    #[cfg(feature = "redis")]
    shared_generation: u64,
}

impl Idle for Route {
    fn is_idle(&self, now: Nanos) -> bool {
        // The text is only a cache: it is read again on the next request.
        self.queue.is_empty() && self.until <= now && (self.streak == 0 || self.forget_at <= now)
    }
}

impl Route {
    /// Forget what a route quiet long enough to be swept as idle remembers:
    /// its streak, and its latest cooldown's generation (a swept route comes
    /// back at generation 0, so a response to a request sent before that
    /// cooldown counts as fresh there). A state swept and one not yet swept
    /// then decide alike.
    fn refresh(&mut self, now: Nanos) {
        if self.until <= now && (self.streak == 0 || self.forget_at <= now) {
            self.streak = 0;
            self.generation = 0;
        }
    }

    /// Take waiter `id` out of the queue; if it was the head, wake the next.
    fn remove(&mut self, id: u64) {
        if let Some(pos) = self.queue.iter().position(|s| s.id == id) {
            self.queue.remove(pos);
            if pos == 0 {
                self.wake_head();
            }
        }
    }

    fn wake_head(&mut self) {
        if let Some(tx) = self.queue.front_mut().and_then(|s| s.wake.take()) {
            // A waiter whose receiver is gone is on its way out; its own
            // drop takes it out of the queue and wakes the next.
            let _ = tx.send(());
        }
    }
}

/// A cooldown, as listed.
struct Listed {
    text: Arc<str>,
    until: Nanos,
    reason: Reason,
    status: u16,
}

/// The routes cooling down now (and some that have just stopped, until the
/// next prune), for listing.
#[derive(Default)]
struct Active {
    map: HashMap<u64, Listed>,
    prune_at: usize,
}

impl Active {
    fn prune(&mut self, now: Nanos) {
        self.map.retain(|_, e| e.until > now);
        self.prune_at = (2 * self.map.len()).max(64);
    }
}

/// How long cooldowns last: read when a response starts one, swapped whole
/// by a handle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lengths {
    pub(crate) backoff: ExponentialBackoff,
    pub(crate) max_cooldown: Duration,
}

pub(crate) struct Cooldowns {
    timeline: Timeline,
    seed: KeySeed,
    routes: Store<Route, ()>,
    active: Mutex<Active>,
    lengths: ArcSwap<Lengths>,
    on_503: AtomicBool,
    proactive: AtomicBool,
    /// Off: requests pass untouched and responses are not read.
    enabled: AtomicBool,
    key_stats: KeyTracking,
    /// Where cooldowns are shared with other replicas.
    pub(crate) store: Option<crate::redis::RedisStore>,
    /// The store's counters (reported in the stats when there is a store).
    #[cfg(feature = "redis")]
    pub(crate) store_counters: Arc<crate::stats::StoreCounters>,
    /// Numbers cooldown starts across routes, so that a request can tell a
    /// cooldown that started after it was sent.
    epochs: AtomicU64,
    started: AtomicU64,
    pub(crate) stats: Arc<Stats>,
}

impl fmt::Debug for Cooldowns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cooldowns")
            .field("config", &self.config())
            .field("enabled", &self.is_enabled())
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What the table decided for one request.
pub(crate) enum Admit {
    /// Go now; watch the response.
    Go(Watch),
    /// Wait in the route's queue.
    Wait(QueueSlot, Option<oneshot::Receiver<()>>),
    /// Refused: the route is cooling down (reject mode, or a wait longer than
    /// allowed).
    Refused(CoolingDown),
}

/// What a head waiter finds when it looks.
pub(crate) enum Check {
    /// The route cools until then; sleep.
    Cooling(Instant),
    /// A new cooldown ends after the wait this request was allowed.
    TooLong(CoolingDown),
    /// Go, watching the response under the route's epoch now.
    Clear(Watch),
}

/// What a response is read against: the route it went to and the cooldown
/// epoch it was sent in.
pub(crate) struct Watch {
    engine: Arc<Cooldowns>,
    key: KeyHash,
    generation: u64,
    /// The route had a streak when the request was sent, so a success must
    /// end it.
    streak_open: bool,
    text: Arc<str>,
    /// The shared cooldown's generation when the request was sent.
    #[cfg(feature = "redis")]
    pub(crate) shared_generation: u64,
}

impl Cooldowns {
    pub(crate) fn new(config: Config) -> Self {
        let store_counters = Arc::new(crate::stats::StoreCounters::default());
        let stats = Stats::new(config.key_stats.clone());
        let stats = match &config.store {
            Some(_) => stats.with_store_counters(store_counters.clone()),
            None => stats,
        };
        Self {
            timeline: Timeline::new(ClockSource::Tokio),
            seed: KeySeed::default(),
            routes: Store::new((), 60_000_000_000),
            active: Mutex::new(Active::default()),
            lengths: ArcSwap::from_pointee(Lengths {
                backoff: config.backoff,
                max_cooldown: config.max_cooldown,
            }),
            on_503: AtomicBool::new(config.on_503),
            proactive: AtomicBool::new(config.proactive),
            enabled: AtomicBool::new(true),
            stats: Arc::new(stats),
            key_stats: config.key_stats,
            store: config.store,
            #[cfg(feature = "redis")]
            store_counters,
            epochs: AtomicU64::new(0),
            started: AtomicU64::new(0),
        }
    }

    pub(crate) fn seed(&self) -> &KeySeed {
        &self.seed
    }

    /// What the table runs with now.
    pub(crate) fn config(&self) -> Config {
        let lengths = self.lengths();
        Config {
            backoff: lengths.backoff,
            max_cooldown: lengths.max_cooldown,
            on_503: self.on_503.load(Ordering::Relaxed),
            proactive: self.proactive.load(Ordering::Relaxed),
            key_stats: self.key_stats.clone(),
            store: self.store.clone(),
        }
    }

    pub(crate) fn lengths(&self) -> Lengths {
        **self.lengths.load()
    }

    pub(crate) fn set_lengths(&self, lengths: Lengths) {
        self.lengths.store(Arc::new(lengths));
    }

    pub(crate) fn set_on_503(&self, on: bool) {
        self.on_503.store(on, Ordering::Relaxed);
    }

    pub(crate) fn set_proactive(&self, on: bool) {
        self.proactive.store(on, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub(crate) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Zero the counters: the stats' and the cooldowns started. Cooldowns,
    /// streaks and waiters are untouched.
    pub(crate) fn reset_stats(&self) {
        self.started.store(0, Ordering::Relaxed);
        self.stats.reset();
    }

    /// Let a request on `key` go, queue it, or refuse it. `text` names the
    /// key; it is called once per route state, outside any lock.
    pub(crate) fn admit(
        self: &Arc<Self>,
        key: KeyHash,
        max_wait: Duration,
        text: &dyn Fn() -> Arc<str>,
    ) -> Admit {
        let mut named: Option<Arc<str>> = None;
        loop {
            let now = self.timeline.now();
            let mut locked = self.routes.lock(key, now);
            let ((), route) = locked.get();
            let name = match (&route.text, named.take()) {
                (Some(name), _) => name.clone(),
                (None, Some(name)) => {
                    route.text = Some(name.clone());
                    name
                }
                (None, None) => {
                    // Extraction may be costly (a JSON body): not under the lock.
                    drop(locked);
                    named = Some(text());
                    continue;
                }
            };
            route.refresh(now);
            let cooling = route.until > now;
            let record = |event| self.stats.record(key, event, &|| name.to_string());
            if !cooling && (route.queue.is_empty() || max_wait.is_zero()) {
                let watch = self.watch(key, route, name.clone());
                drop(locked);
                record(Event::Admitted);
                return Admit::Go(watch);
            }
            let wait = route.until.saturating_sub(now);
            if max_wait.is_zero() || wait > saturating_nanos(max_wait) {
                drop(locked);
                record(Event::Rejected);
                let retry_after = Duration::from_nanos(wait);
                tracing::debug!(
                    key = %Quoted(&name),
                    ?retry_after,
                    "backoff: refused while cooling down"
                );
                return Admit::Refused(CoolingDown::new(name.to_string(), retry_after));
            }
            let id = route.next_id;
            route.next_id += 1;
            let (wake, rx) = if route.queue.is_empty() {
                (None, None)
            } else {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            };
            route.queue.push_back(QueueEntry { id, wake });
            drop(locked);
            record(Event::Queued);
            tracing::debug!(
                key = %Quoted(&name),
                wait = ?Duration::from_nanos(wait),
                "backoff: waiting for the cooldown to end"
            );
            let slot = QueueSlot {
                engine: self.clone(),
                key,
                id,
                text: name,
                arrived: now,
                deadline: now.saturating_add(saturating_nanos(max_wait)),
                armed: true,
            };
            return Admit::Wait(slot, rx);
        }
    }

    fn watch(self: &Arc<Self>, key: KeyHash, route: &Route, text: Arc<str>) -> Watch {
        Watch {
            engine: self.clone(),
            key,
            generation: route.generation,
            streak_open: route.streak > 0,
            text,
            #[cfg(feature = "redis")]
            shared_generation: route.shared_generation,
        }
    }

    /// Read a response to a request sent under `watch`: what it said that
    /// a shared cooldown must hear (a 429, a 503 with a wait, a success
    /// ending a streak or advising a wait), if anything.
    fn observe(&self, watch: &Watch, status: StatusCode, headers: &HeaderMap) -> Option<Said> {
        // A gRPC refusal, read as the HTTP status it stands for (its wait
        // is read from the answer as it came).
        let answered = status;
        let status = super::grpc::as_http_status(answered, headers);
        let refused = status == StatusCode::TOO_MANY_REQUESTS;
        let unavailable =
            status == StatusCode::SERVICE_UNAVAILABLE && self.on_503.load(Ordering::Relaxed);
        let success = status.is_success();
        // Switched off since the request went: its response is not read.
        if !(refused || unavailable || success) || !self.is_enabled() {
            return None;
        }
        let proactive = self.proactive.load(Ordering::Relaxed);
        if success && !watch.streak_open && !proactive {
            return None;
        }
        // The lengths in force as the response is read.
        let lengths = self.lengths();
        let advised = if refused || unavailable || proactive {
            cooldown_from_headers(answered, headers, SystemTime::now(), lengths.max_cooldown)
        } else {
            None
        };
        let said = match advised {
            _ if refused => Said::Refused(advised.map(|(wait, _)| wait)),
            Some((wait, _)) if unavailable => Said::Unavailable(wait),
            None if unavailable => return None,
            _ => Said::Succeeded(advised.map(|(wait, _)| wait)),
        };
        let now = self.timeline.now();
        let mut locked = self.routes.lock(watch.key, now);
        let ((), route) = locked.get();
        route.refresh(now);
        if route.text.is_none() {
            route.text = Some(watch.text.clone());
        }
        // A response to a request sent before the route's latest cooldown
        // started says nothing new about the streak: it was in flight.
        let fresh = watch.generation >= route.generation;
        let forget_after = lengths.backoff.cap().min(lengths.max_cooldown);
        let start = if refused {
            if fresh {
                route.streak = route.streak.saturating_add(1);
                // The quiet time that forgets the streak runs from this 429
                // too: one that starts no cooldown (a wait of zero) still
                // counts in the streak.
                let quiet = now.saturating_add(saturating_nanos(forget_after));
                route.forget_at = route.forget_at.max(quiet);
            }
            match advised {
                Some(advised) => Some(advised),
                None if fresh => {
                    let streak = route.streak;
                    let wait = lengths.backoff.delay(streak).min(lengths.max_cooldown);
                    Some((wait, Reason::Exponential { streak }))
                }
                // Already covered by the cooldown that started since.
                None => None,
            }
        } else if unavailable {
            advised
        } else {
            if fresh {
                route.streak = 0;
            }
            // Read from the headers only when proactive.
            advised
        };
        if let Some((wait, reason)) = start {
            self.start(
                route,
                watch,
                now,
                wait,
                reason,
                status.as_u16(),
                forget_after,
            );
        }
        Some(said)
    }

    /// Cool `route` down for `wait` from `now`, unless it already cools
    /// longer; its streak is forgotten once it has been quiet for
    /// `forget_after` after that.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        route: &mut Route,
        watch: &Watch,
        now: Nanos,
        wait: Duration,
        reason: Reason,
        status: u16,
        forget_after: Duration,
    ) {
        let until = now.saturating_add(saturating_nanos(wait));
        if until <= route.until || until <= now {
            return;
        }
        let was_cooling = route.until > now;
        route.until = until;
        route.forget_at = until.saturating_add(saturating_nanos(forget_after));
        route.generation = self.epochs.fetch_add(1, Ordering::Relaxed) + 1;
        if !was_cooling {
            self.started.fetch_add(1, Ordering::Relaxed);
        }
        let text = route.text.clone().unwrap_or_else(|| watch.text.clone());
        tracing::debug!(
            key = %Quoted(&text),
            ?wait,
            ?reason,
            status,
            "backoff: route cooling down"
        );
        let mut active = self.active.lock();
        if active.map.len() >= active.prune_at {
            active.prune(now);
        }
        active.map.insert(
            watch.key.0,
            Listed {
                text,
                until,
                reason,
                status,
            },
        );
        drop(active);
        self.stats.touch();
    }

    /// The cooldowns in force, sorted by key.
    pub(crate) fn cooldowns(&self) -> Vec<CooldownEntry> {
        let now = self.timeline.now();
        let mut active = self.active.lock();
        active.prune(now);
        let mut list: Vec<CooldownEntry> = active
            .map
            .values()
            .map(|e| {
                CooldownEntry::new(
                    &e.text,
                    Duration::from_nanos(e.until - now),
                    e.reason,
                    e.status,
                )
            })
            .collect();
        drop(active);
        list.sort_by(|a, b| a.key.cmp(&b.key));
        list
    }

    /// The cooldown of the key with these parts, if it is cooling down.
    pub(crate) fn cooldown(&self, key: KeyHash) -> Option<CooldownEntry> {
        let now = self.timeline.now();
        let active = self.active.lock();
        let e = active.map.get(&key.0).filter(|e| e.until > now)?;
        Some(CooldownEntry::new(
            &e.text,
            Duration::from_nanos(e.until - now),
            e.reason,
            e.status,
        ))
    }

    pub(crate) fn cooldowns_started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    pub(crate) fn len(&self) -> usize {
        self.routes.len()
    }

    pub(crate) fn evict_idle(&self) -> usize {
        let now = self.timeline.now();
        self.active.lock().prune(now);
        self.routes.evict_idle(now)
    }
}

impl Watch {
    /// Read the response this watch was made for; what it said, for a
    /// shared cooldown.
    pub(crate) fn observe(&self, status: StatusCode, headers: &HeaderMap) -> Option<Said> {
        self.engine.observe(self, status, headers)
    }
}

/// What a response said that a shared cooldown must hear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Said {
    /// 429, with the wait its headers advised, if any.
    Refused(Option<Duration>),
    /// 503 with an advised wait (without one it says nothing).
    Unavailable(Duration),
    /// A success, with the wait its headers advised (proactive), if any.
    Succeeded(Option<Duration>),
}

/// A request's place in its route's queue. Dropped before the request goes
/// on, it leaves the queue and wakes the next waiter if it was the head.
pub(crate) struct QueueSlot {
    engine: Arc<Cooldowns>,
    key: KeyHash,
    id: u64,
    text: Arc<str>,
    arrived: Nanos,
    deadline: Nanos,
    armed: bool,
}

impl QueueSlot {
    /// Look at the route as its head waiter.
    pub(crate) fn check(&self) -> Check {
        let engine = &self.engine;
        let now = engine.timeline.now();
        let mut locked = engine.routes.lock(self.key, now);
        let ((), route) = locked.get();
        route.refresh(now);
        if route.until <= now {
            return Check::Clear(engine.watch(self.key, route, self.text.clone()));
        }
        if route.until > self.deadline {
            let retry_after = Duration::from_nanos(route.until - now);
            return Check::TooLong(CoolingDown::new(self.text.to_string(), retry_after));
        }
        Check::Cooling(engine.timeline.instant(route.until))
    }

    /// Take this slot out of its route's queue, once: the time it left, or
    /// `None` if it had already left (a released slot is dropped later).
    fn step_out(&mut self) -> Option<Nanos> {
        if !self.armed {
            return None;
        }
        self.armed = false;
        let now = self.engine.timeline.now();
        self.engine
            .routes
            .lock(self.key, now)
            .get()
            .1
            .remove(self.id);
        Some(now)
    }

    /// The request has gone to the inner service: leave the queue and wake
    /// the next waiter.
    pub(crate) fn release(&mut self) {
        let Some(now) = self.step_out() else { return };
        let engine = &*self.engine;
        let waited = Duration::from_nanos(now.saturating_sub(self.arrived));
        let text = || self.text.to_string();
        engine
            .stats
            .record(self.key, Event::Dequeued(Some(waited)), &text);
        engine.stats.record(self.key, Event::Admitted, &text);
    }

    /// Leave the queue without going on; `refused` counts it as refused.
    pub(crate) fn leave(&mut self, refused: bool) {
        if self.step_out().is_none() {
            return;
        }
        let engine = &*self.engine;
        let text = || self.text.to_string();
        engine.stats.record(self.key, Event::Dequeued(None), &text);
        if refused {
            engine.stats.record(self.key, Event::Rejected, &text);
            tracing::debug!(
                key = %Quoted(&self.text),
                "backoff: refused after waiting: the cooldown grew"
            );
        }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.leave(false);
    }
}
