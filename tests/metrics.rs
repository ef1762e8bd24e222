//! `MetricsReporter` through the `metrics` facade, seen by metrics-util's
//! debugging recorder: every counter and gauge moves as the layers work,
//! waits land in the histogram, counters never go down across a stats
//! reset, and key labels stay bounded under 10,000 keys.

#![cfg(all(feature = "metrics", feature = "test-util"))]

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::stats::MetricsReporter;

fn ok() -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<http::Response<()>, Infallible>> + Send,
> + Clone
+ Send {
    tower::service_fn(|_req: http::Request<()>| async { Ok(http::Response::new(())) })
}

fn request() -> http::Request<()> {
    http::Request::new(())
}

/// A recorder, and what it was told so far: counters added up over every
/// report (its snapshots drain them), the rest as last reported.
struct Seen {
    recorder: DebuggingRecorder,
    values: HashMap<(String, Labels), DebugValue>,
}

type Labels = Vec<(String, String)>;

impl Seen {
    fn new() -> Self {
        Self {
            recorder: DebuggingRecorder::new(),
            values: HashMap::new(),
        }
    }

    /// Report once into the recorder, and take in what it was told.
    fn report(&mut self, reporter: &MetricsReporter) -> &Self {
        metrics::with_local_recorder(&self.recorder, || reporter.report());
        for (key, _, _, value) in self.recorder.snapshotter().snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let (name, labels) = key.into_parts();
            let mut labels: Labels = labels
                .iter()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let entry = (name.as_str().to_owned(), labels);
            let value = match (self.values.get(&entry), value) {
                (Some(DebugValue::Counter(before)), DebugValue::Counter(more)) => {
                    DebugValue::Counter(before + more)
                }
                (_, value) => value,
            };
            self.values.insert(entry, value);
        }
        self
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut labels: Labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.values.get(&(name.to_owned(), labels))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.value(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{name} {labels:?}: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.value(name, labels) {
            Some(DebugValue::Gauge(g)) => g.into_inner(),
            other => panic!("{name} {labels:?}: {other:?}"),
        }
    }

    /// The samples of the last report.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.value(name, labels) {
            Some(DebugValue::Histogram(h)) => h.iter().map(|v| v.into_inner()).collect(),
            other => panic!("{name} {labels:?}: {other:?}"),
        }
    }

    /// Every `key` label value of `name`.
    fn keys(&self, name: &str) -> HashSet<String> {
        self.values
            .keys()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, labels)| labels.iter().find(|(k, _)| k == "key"))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

const API: &[(&str, &str)] = &[("layer", "api")];

#[tokio::test(start_paused = true)]
async fn rate_limit_counters_move_and_never_go_down() {
    let mut seen = Seen::new();
    let layer = RateLimitLayer::new(Quota::per_second(2).expect("valid"), GlobalKey);
    let handle = layer.handle();
    let svc = layer.layer(ok());
    let reporter = MetricsReporter::new().with_rate_limit("api", &handle);
    let readings = seen.report(&reporter);
    assert_eq!(readings.counter("tower_throttle_admitted_total", API), 0);
    for _ in 0..3 {
        let _ = svc.clone().oneshot(request()).await;
    }
    let readings = seen.report(&reporter);
    assert_eq!(readings.counter("tower_throttle_admitted_total", API), 2);
    assert_eq!(readings.counter("tower_throttle_refused_total", API), 1);
    assert_eq!(readings.gauge("tower_throttle_keys", API), 1.0);
    // A reset starts the layer's counts again; the reported ones go on.
    handle.reset_stats();
    let _ = svc.clone().oneshot(request()).await;
    let readings = seen.report(&reporter);
    assert_eq!(readings.counter("tower_throttle_refused_total", API), 2);
    assert_eq!(readings.counter("tower_throttle_admitted_total", API), 2);
}

/// A request the layer does not count after all (its upstream refused
/// it) gives its booking back, and the counter says so.
#[tokio::test(start_paused = true)]
async fn bookings_given_back_are_counted() {
    let mut seen = Seen::new();
    let layer = RateLimitLayer::new(Quota::per_second(5).expect("valid"), GlobalKey)
        .count_only(tower_throttle::rate_limit::CountUnlessRefused);
    let reporter = MetricsReporter::new().with_rate_limit("api", &layer.handle());
    let refused = tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, Infallible>(
            http::Response::builder()
                .status(429)
                .body(())
                .expect("valid"),
        )
    });
    let svc = layer.layer(refused);
    for _ in 0..3 {
        svc.clone().oneshot(request()).await.expect("answered");
    }
    let readings = seen.report(&reporter);
    assert_eq!(readings.counter("tower_throttle_admitted_total", API), 3);
    assert_eq!(readings.counter("tower_throttle_given_back_total", API), 3);
}

#[tokio::test(start_paused = true)]
async fn each_wait_lands_in_the_histogram() {
    let mut seen = Seen::new();
    let layer = RateLimitLayer::new(Quota::per_second(1).expect("valid"), GlobalKey)
        .with_max_wait(Duration::from_secs(10));
    let reporter = MetricsReporter::new().with_rate_limit("api", &layer.handle());
    // The first report attaches the histogram.
    seen.report(&reporter);
    let svc = layer.layer(ok());
    let calls: Vec<_> = (0..3).map(|_| svc.clone().oneshot(request())).collect();
    for call in futures::future::join_all(calls).await {
        call.expect("admitted after its wait");
    }
    let readings = seen.report(&reporter);
    assert_eq!(readings.counter("tower_throttle_waited_total", API), 2);
    let mut waits = readings.histogram("tower_throttle_wait_seconds", API);
    waits.sort_by(f64::total_cmp);
    assert_eq!(waits, [1.0, 2.0]);
}

#[tokio::test(start_paused = true)]
async fn concurrency_and_backoff_gauges_follow_what_is_there() {
    let mut seen = Seen::new();
    let concurrency = ConcurrencyLayer::new(1, GlobalKey).expect("valid");
    let backoff = Backoff429Layer::new(GlobalKey);
    let reporter = MetricsReporter::new()
        .with_concurrency("upstream", &concurrency.handle())
        .with_backoff("provider", &backoff.handle());
    let slow = tower::service_fn(|_req: http::Request<()>| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok::<_, Infallible>(
            http::Response::builder()
                .status(429)
                .header("retry-after", "30")
                .body(())
                .expect("valid"),
        )
    });
    let svc = concurrency.layer(backoff.layer(slow));
    let first = tokio::spawn(svc.clone().oneshot(request()));
    let second = tokio::spawn(svc.clone().oneshot(request()));
    tokio::task::yield_now().await;
    let upstream: &[(&str, &str)] = &[("layer", "upstream")];
    let provider: &[(&str, &str)] = &[("layer", "provider")];
    let readings = seen.report(&reporter);
    assert_eq!(readings.gauge("tower_throttle_in_flight", upstream), 1.0);
    assert_eq!(readings.gauge("tower_throttle_queued", upstream), 1.0);
    first.await.expect("no panic").expect("answered");
    let _ = second.await.expect("no panic");
    let readings = seen.report(&reporter);
    assert_eq!(readings.gauge("tower_throttle_in_flight", upstream), 0.0);
    assert_eq!(
        readings.counter("tower_throttle_admitted_total", upstream),
        2
    );
    assert_eq!(readings.gauge("tower_throttle_cooldowns", provider), 1.0);
    assert_eq!(
        readings.counter("tower_throttle_cooldowns_started_total", provider),
        1
    );
    // The second was refused by the cooldown the first started.
    assert_eq!(
        readings.counter("tower_throttle_refused_total", provider),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn key_labels_stay_bounded_under_ten_thousand_keys() {
    let mut seen = Seen::new();
    let layer = RateLimitLayer::new(
        Quota::per_second(1).expect("valid"),
        HeaderKey::new("x-route").expect("valid"),
    )
    .with_key_stats(100);
    let reporter = MetricsReporter::new()
        .with_rate_limit("api", &layer.handle())
        .with_keys_per_layer(20);
    let mut svc = layer.layer(ok());
    for n in 0..10_000 {
        let req = http::Request::builder()
            .header("x-route", format!("route-{n}"))
            .body(())
            .expect("valid");
        svc.ready()
            .await
            .expect("ready")
            .call(req)
            .await
            .expect("admitted");
    }
    let readings = seen.report(&reporter);
    let keys = readings.keys("tower_throttle_admitted_total");
    assert_eq!(keys.len(), 21, "{keys:?}");
    assert!(keys.contains("(other)"));
    let other = readings.counter(
        "tower_throttle_admitted_total",
        &[("layer", "api"), ("key", "(other)")],
    );
    assert_eq!(other, 10_000 - 20);
    // No series without `key`: a layer's series add up to its total.
    assert!(
        readings
            .value("tower_throttle_admitted_total", API)
            .is_none()
    );
}

/// Keys labelled apart stay labelled; a key arriving later, even first in
/// order, is counted under `(other)`, and nothing is counted twice.
#[tokio::test(start_paused = true)]
async fn labelled_keys_stay_and_the_series_add_up() {
    let mut seen = Seen::new();
    let layer = RateLimitLayer::new(
        Quota::per_second(100).expect("valid"),
        HeaderKey::new("x-route").expect("valid"),
    )
    .with_key_stats(100);
    let reporter = MetricsReporter::new()
        .with_rate_limit("api", &layer.handle())
        .with_keys_per_layer(2);
    let svc = layer.layer(ok());
    let send = async |route: &str, times: usize| {
        for _ in 0..times {
            let req = http::Request::builder()
                .header("x-route", route)
                .body(())
                .expect("valid");
            svc.clone().oneshot(req).await.expect("admitted");
        }
    };
    send("b", 3).await;
    // A key whose text is the one the layer's total is shown as.
    send("*", 2).await;
    seen.report(&reporter);
    send("a", 5).await;
    send("b", 1).await;
    seen.report(&reporter);
    let readings = seen.report(&reporter);
    let admitted = |key| {
        readings.counter(
            "tower_throttle_admitted_total",
            &[("layer", "api"), ("key", key)],
        )
    };
    assert_eq!(
        (admitted("b"), admitted("*"), admitted("(other)")),
        (4, 2, 5)
    );
    let a = [("layer", "api"), ("key", "a")];
    assert!(
        readings
            .value("tower_throttle_admitted_total", &a)
            .is_none()
    );
}
