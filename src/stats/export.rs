//! `MetricsReporter`: the layers' counters through the `metrics` facade
//! (feature `metrics`), to whatever exporter the program installed
//! (Prometheus, StatsD, OpenTelemetry).
//!
//! The request path does not change: the layers keep counting in their
//! own striped counters, and the reporter reads their snapshots when it
//! reports (on a timer, or when asked) and moves the facade's counters and
//! gauges by what changed. Only a request that waited also records its
//! wait, as it ends, in a histogram.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ::metrics::{Histogram, Label, Unit};

use super::{KeyStats, OTHER_KEYS};
use crate::backoff::BackoffHandle;
use crate::concurrency::ConcurrencyHandle;
use crate::rate_limit::RateLimitHandle;

const ADMITTED: &str = "tower_throttle_admitted_total";
const REFUSED: &str = "tower_throttle_refused_total";
const WOULD_REFUSE: &str = "tower_throttle_would_refuse_total";
const WAITED: &str = "tower_throttle_waited_total";
const GIVEN_BACK: &str = "tower_throttle_given_back_total";
const WAIT_SECONDS: &str = "tower_throttle_wait_seconds";
const QUEUED: &str = "tower_throttle_queued";
const IN_FLIGHT: &str = "tower_throttle_in_flight";
const KEYS: &str = "tower_throttle_keys";
const COOLDOWNS: &str = "tower_throttle_cooldowns";
const COOLDOWNS_STARTED: &str = "tower_throttle_cooldowns_started_total";
const STORE_ERRORS: &str = "tower_throttle_store_errors_total";
const STORE_FALLBACKS: &str = "tower_throttle_store_fallbacks_total";

/// Reports the counters of the layers it is given through the `metrics`
/// facade, labelled `layer` (the name given here) and, for as many keys as
/// [`with_keys_per_layer`](Self::with_keys_per_layer) allows, `key`:
///
/// | metric | kind | what |
/// |---|---|---|
/// | `tower_throttle_admitted_total` | counter | requests let through |
/// | `tower_throttle_refused_total` | counter | requests refused |
/// | `tower_throttle_would_refuse_total` | counter | let through by a dry run that would refuse them |
/// | `tower_throttle_waited_total` | counter | admitted requests that waited first |
/// | `tower_throttle_given_back_total` | counter | bookings given back: not counted after all, left their wait, or settled for less (rate limits) |
/// | `tower_throttle_wait_seconds` | histogram | each of those waits (`layer` only) |
/// | `tower_throttle_queued` | gauge | requests waiting now |
/// | `tower_throttle_in_flight` | gauge | requests in flight now (concurrency, backoff) |
/// | `tower_throttle_keys` | gauge | key states held now (`layer` only) |
/// | `tower_throttle_cooldowns` | gauge | routes cooling down now (backoff; `layer` only) |
/// | `tower_throttle_cooldowns_started_total` | counter | cooldowns started (backoff; `layer` only) |
/// | `tower_throttle_store_errors_total` | counter | Redis calls that failed (`layer` only) |
/// | `tower_throttle_store_fallbacks_total` | counter | decisions made without Redis (`layer` only) |
///
/// Labels stay bounded: by default only each layer's totals are
/// reported. With `with_keys_per_layer(n)`, the first `n` keys a layer
/// counts apart (see `with_key_stats` on each layer: a key filter picks
/// which, so routes rather than callers) are labelled by key as the stats
/// show it (secret parts as fingerprints, never their text), for good, and
/// everything else is counted under `key="(other)"`: a layer's series then
/// add up to its totals (and no series without `key` is written). Counters never go down: a
/// `reset_stats` on a handle starts the layer's counts again from zero,
/// and the reporter adds what they count from there (what was counted
/// between the last report and the reset is not reported).
///
/// Install the program's recorder before the first report; reports cost
/// nothing on the request path, installed or not.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::key::GlobalKey;
/// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
/// use tower_throttle::stats::MetricsReporter;
///
/// # async fn run() -> Result<(), tower_throttle::error::ConfigError> {
/// let limit = RateLimitLayer::new(Quota::per_second(10)?, GlobalKey);
/// let reporter = MetricsReporter::new().with_rate_limit("api", &limit.handle());
/// // Every second, for as long as the program runs.
/// tokio::spawn(reporter.run(Duration::from_secs(1)));
/// # Ok(())
/// # }
/// ```
#[derive(Default)]
pub struct MetricsReporter {
    layers: Vec<Layer>,
    keys_per_layer: usize,
}

/// What a layer's counters stood at when last reported: its resets, and
/// each counter by label set.
#[derive(Default)]
struct Reported {
    resets: u64,
    totals: Last,
    /// The keys labelled apart, in the order first seen.
    labelled: Vec<String>,
    /// What each counter of [`COUNTS`] has reported since the last reset.
    sums: Sums,
}

/// Running sums of what was reported, per counter of [`COUNTS`]: for the
/// layer's total, its labelled keys together, and `(other)`.
#[derive(Default)]
struct Sums {
    all: [u64; COUNTS.len()],
    labelled: [u64; COUNTS.len()],
    other: [u64; COUNTS.len()],
}

/// One layer being reported.
struct Layer {
    name: Arc<str>,
    handle: Handle,
    /// What each counter stood at when last reported.
    last: Mutex<Reported>,
    /// Set at the first report, with the recorder installed then.
    waits: OnceLock<()>,
}

enum Handle {
    RateLimit(RateLimitHandle),
    Concurrency(ConcurrencyHandle),
    Backoff(BackoffHandle),
}

impl fmt::Debug for MetricsReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.layers.iter().map(|l| &*l.name).collect();
        f.debug_struct("MetricsReporter")
            .field("layers", &names)
            .field("keys_per_layer", &self.keys_per_layer)
            .finish()
    }
}

impl MetricsReporter {
    /// A reporter of no layer yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn with(mut self, name: &str, handle: Handle) -> Self {
        self.layers.push(Layer {
            name: Arc::from(name),
            handle,
            last: Mutex::default(),
            waits: OnceLock::new(),
        });
        self
    }

    /// Report the rate-limit layer of `handle` as `name`.
    pub fn with_rate_limit(self, name: &str, handle: &RateLimitHandle) -> Self {
        self.with(name, Handle::RateLimit(handle.clone()))
    }

    /// Report the concurrency layer of `handle` as `name`.
    pub fn with_concurrency(self, name: &str, handle: &ConcurrencyHandle) -> Self {
        self.with(name, Handle::Concurrency(handle.clone()))
    }

    /// Report the backoff layer of `handle` as `name`.
    pub fn with_backoff(self, name: &str, handle: &BackoffHandle) -> Self {
        self.with(name, Handle::Backoff(handle.clone()))
    }

    /// Label up to `n` keys of each layer apart (of those the layer counts
    /// apart), the rest as `key="(other)"`; 0 (the default): each layer's
    /// totals only.
    pub fn with_keys_per_layer(mut self, n: usize) -> Self {
        self.keys_per_layer = n;
        self
    }

    /// Report every `every`, for ever: spawn it on the program's runtime.
    pub async fn run(self, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.report();
        }
    }

    /// Report now: move each counter by what its layer counted since the
    /// last report, and set each gauge.
    pub fn report(&self) {
        describe();
        for layer in &self.layers {
            self.report_layer(layer);
        }
    }

    fn report_layer(&self, layer: &Layer) {
        layer.waits.get_or_init(|| {
            let histogram = ::metrics::histogram!(WAIT_SECONDS, "layer" => layer.name.to_string());
            layer.handle.record_waits_in(histogram);
        });
        // Held from the snapshot on: two reports at once must not store
        // their totals out of order.
        let mut reported = layer.last.lock().unwrap_or_else(|e| e.into_inner());
        let (snapshot, keys, cooldowns) = match &layer.handle {
            Handle::RateLimit(h) => (h.stats(), h.key_count(), None),
            Handle::Concurrency(h) => (h.stats(), h.key_count(), None),
            Handle::Backoff(h) => {
                let stats = h.stats();
                let cooldowns = (stats.cooldowns.len(), stats.cooldowns_started);
                (stats.requests, h.key_count(), Some(cooldowns))
            }
        };
        let name = layer.name.to_string();
        let just_layer = vec![Label::new("layer", name.clone())];
        ::metrics::gauge!(KEYS, just_layer.clone()).set(keys as f64);
        if let Some((now, _)) = cooldowns {
            ::metrics::gauge!(COOLDOWNS, just_layer.clone()).set(now as f64);
        }
        // Counts read while a reset was under way are not trusted; the
        // next report reads them.
        if snapshot.resets % 2 == 1 {
            return;
        }
        // Reset since: every count starts again from zero.
        if reported.resets != snapshot.resets {
            *reported = Reported {
                resets: snapshot.resets,
                labelled: std::mem::take(&mut reported.labelled),
                ..Reported::default()
            };
        }
        let Reported {
            totals,
            labelled,
            sums,
            ..
        } = &mut *reported;
        if let Some((_, started)) = cooldowns {
            let started = moved(totals, COOLDOWNS_STARTED, None, started);
            ::metrics::counter!(COOLDOWNS_STARTED, just_layer.clone()).increment(started);
        }
        if let Some(store) = &snapshot.store {
            let errors = moved(totals, STORE_ERRORS, None, store.errors);
            ::metrics::counter!(STORE_ERRORS, just_layer.clone()).increment(errors);
            let fallbacks = moved(totals, STORE_FALLBACKS, None, store.fallbacks);
            ::metrics::counter!(STORE_FALLBACKS, just_layer.clone()).increment(fallbacks);
        }
        let all = &snapshot.aggregate;
        if self.keys_per_layer == 0 {
            for (metric, read) in COUNTS {
                let by = moved(totals, metric, None, read(all));
                ::metrics::counter!(metric, just_layer.clone()).increment(by);
            }
            gauges(
                &just_layer,
                all.queued_now as f64,
                all.in_flight.map(|n| n as f64),
            );
            return;
        }
        // The keys labelled apart: the first seen, kept for good (a key
        // moving in and out of the set would be counted twice).
        for entry in &snapshot.keys {
            if labelled.len() < self.keys_per_layer
                && entry.key != OTHER_KEYS
                && !labelled.contains(&entry.key)
            {
                labelled.push(entry.key.clone());
            }
        }
        let mut queued_other = all.queued_now as f64;
        let mut in_flight_other = all.in_flight.map(|n| n as f64);
        for key in labelled.iter() {
            let entry = snapshot.keys.iter().find(|e| e.key == *key);
            let labels = vec![
                Label::new("layer", name.clone()),
                Label::new("key", key.clone()),
            ];
            for (i, (metric, read)) in COUNTS.into_iter().enumerate() {
                let by = match entry {
                    Some(e) => moved(totals, metric, Some(key), read(e)),
                    // Forgotten by the layer's table: when it comes back
                    // it counts from zero.
                    None => {
                        totals.remove(&(metric, Some(key.clone())));
                        0
                    }
                };
                sums.labelled[i] += by;
                ::metrics::counter!(metric, labels.clone()).increment(by);
            }
            let queued = entry.map_or(0.0, |e| e.queued_now as f64);
            let in_flight = all
                .in_flight
                .map(|_| entry.and_then(|e| e.in_flight).unwrap_or(0) as f64);
            queued_other -= queued;
            if let (Some(other), Some(mine)) = (&mut in_flight_other, in_flight) {
                *other -= mine;
            }
            gauges(&labels, queued, in_flight);
        }
        // Every other key: what the layer counted less what the labelled
        // keys did, since the last reset. Kept as running sums, so a key's
        // count read ahead of the layer's total (the two are not read at
        // one instant) is made up at the next report, never counted twice.
        let other = vec![Label::new("layer", name), Label::new("key", OTHER_KEYS)];
        for (i, (metric, read)) in COUNTS.into_iter().enumerate() {
            sums.all[i] += moved(totals, metric, None, read(all));
            let due = sums.all[i].saturating_sub(sums.labelled[i]);
            let by = due.saturating_sub(sums.other[i]);
            sums.other[i] += by;
            ::metrics::counter!(metric, other.clone()).increment(by);
        }
        gauges(
            &other,
            queued_other.max(0.0),
            in_flight_other.map(|n| n.max(0.0)),
        );
    }
}

impl Handle {
    fn record_waits_in(&self, histogram: Histogram) {
        match self {
            Self::RateLimit(h) => h.record_waits_in(histogram),
            Self::Concurrency(h) => h.record_waits_in(histogram),
            Self::Backoff(h) => h.record_waits_in(histogram),
        }
    }
}

/// What each counter stood at when last reported, by metric and key
/// (`None`: the layer's total, which no key's text can stand for).
type Last = HashMap<(&'static str, Option<String>), u64>;

/// Reads one counter of a key's stats.
type Read = fn(&KeyStats) -> u64;

/// The counters reported per key, and how each is read.
const COUNTS: [(&str, Read); 5] = [
    (ADMITTED, |e| e.admitted),
    (REFUSED, |e| e.rejected),
    (WOULD_REFUSE, |e| e.would_reject),
    (WAITED, |e| e.waited),
    (GIVEN_BACK, |e| e.given_back),
];

/// What counter `name` of `key` counted since the last report, now that
/// it stands at `total`. A total below the last (the key's count started
/// again, its state dropped and made anew) moves nothing: what it counts
/// from there moves it.
fn moved(last: &mut Last, name: &'static str, key: Option<&String>, total: u64) -> u64 {
    let before = last.insert((name, key.cloned()), total).unwrap_or(0);
    total.saturating_sub(before)
}

fn gauges(labels: &[Label], queued: f64, in_flight: Option<f64>) {
    ::metrics::gauge!(QUEUED, labels.to_vec()).set(queued);
    if let Some(in_flight) = in_flight {
        ::metrics::gauge!(IN_FLIGHT, labels.to_vec()).set(in_flight);
    }
}

/// Each metric's help text and unit, for exporters that show them.
fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    // A table: one line a metric, read as the list it is.
    let counters = [
        (ADMITTED, "Requests let through."),
        (REFUSED, "Requests refused."),
        (
            WOULD_REFUSE,
            "Requests a dry-run limit let through but would have refused.",
        ),
        (WAITED, "Admitted requests that waited first."),
        (
            GIVEN_BACK,
            "Bookings given back: not counted after all, left their wait, or settled for less.",
        ),
        (COOLDOWNS_STARTED, "Cooldowns started."),
        (STORE_ERRORS, "Calls to the shared store that failed."),
        (STORE_FALLBACKS, "Decisions made without the shared store."),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    let gauges = [
        (QUEUED, "Requests waiting now."),
        (IN_FLIGHT, "Requests in flight now."),
        (KEYS, "Key states held now."),
        (COOLDOWNS, "Routes cooling down now."),
    ];
    for (name, help) in gauges {
        describe_gauge!(name, Unit::Count, help);
    }
    describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "How long admitted requests waited."
    );
}
