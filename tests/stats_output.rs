//! What the layers write about keys chosen by clients: per-key stats that a
//! flood of made-up keys cannot take over, and key text that reaches no
//! error, stats name or log line with a raw control character in it.

#![cfg(feature = "test-util")]

use testkit::capture;

use std::convert::Infallible;
use std::time::Duration;

use capture::{capture_logs, forged_lines, log_text, stray_controls};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::{CoolingDown, RateLimited};
use tower_throttle::key::JsonFieldKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::stats::{KeyStats, OTHER_KEYS, StatsSnapshot};

/// A model name that forges a log line and clears the screen.
const INJECTED: &str = "x\n2026-12-01T00:00:00Z ERROR admin password reset\u{1b}[2J\0\r";
/// How it reads once escaped.
const ESCAPED: &str = r"x\n2026-12-01T00:00:00Z ERROR admin password reset\u{1b}[2J\0\r";

fn chat(model: &str) -> Request<String> {
    Request::new(serde_json::json!({ "model": model }).to_string())
}

fn ok(_req: Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new(String::new())))
}

fn too_many(_req: Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    let mut response = Response::new(String::new());
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    response
        .headers_mut()
        .insert("retry-after", http::HeaderValue::from_static("5"));
    std::future::ready(Ok(response))
}

fn entry<'a>(snapshot: &'a StatsSnapshot, key: &str) -> &'a KeyStats {
    snapshot
        .keys
        .iter()
        .find(|k| k.key == key)
        .unwrap_or_else(|| panic!("no {key} in {:?}", snapshot.keys))
}

/// Only the models a filter knows are counted by name; 40 made-up ones sent
/// first are added up as `(other)`, and the table never lists more than
/// `max_keys` names plus that one.
#[tokio::test(start_paused = true)]
async fn made_up_keys_sent_first_never_hide_a_known_key_from_the_stats() {
    const KNOWN: [&str; 2] = ["gpt-4o", "gpt-4o-mini"];
    let known = |model: &str| KNOWN.contains(&model);
    let rate = RateLimitLayer::new(Quota::per_minute(1000).unwrap(), JsonFieldKey::new("model"))
        .with_key_stats_where(2, known);
    let concurrency = ConcurrencyLayer::new(4, JsonFieldKey::new("model"))
        .unwrap()
        .with_key_stats_where(2, known);
    let backoff = Backoff429Layer::new(JsonFieldKey::new("model")).with_key_stats_where(2, known);
    let handles = (rate.handle(), concurrency.handle(), backoff.handle());
    let svc = tower::ServiceBuilder::new()
        .layer(backoff)
        .layer(concurrency)
        .layer(rate)
        .service_fn(ok);
    for i in 0..40 {
        let response = svc
            .clone()
            .oneshot(chat(&format!("junk-{i}")))
            .await
            .unwrap();
        drop(response);
    }
    for model in KNOWN {
        drop(svc.clone().oneshot(chat(model)).await.unwrap());
    }
    for (layer, snapshot) in [
        ("rate limit", handles.0.stats()),
        ("concurrency", handles.1.stats()),
        ("backoff", handles.2.stats().requests),
    ] {
        let names: Vec<&str> = snapshot.keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(names, [OTHER_KEYS, "gpt-4o", "gpt-4o-mini"], "{layer}");
        assert_eq!(entry(&snapshot, "gpt-4o").admitted, 1, "{layer}");
        assert_eq!(entry(&snapshot, OTHER_KEYS).admitted, 40, "{layer}");
        assert_eq!(snapshot.aggregate.admitted, 42, "{layer}");
    }
    // Requests in flight leave from where they were counted.
    let other = handles.1.stats();
    assert_eq!(entry(&other, OTHER_KEYS).in_flight, Some(0));
}

/// The names a test's filter accepts, changed as the test goes.
#[derive(Clone, Default)]
struct Accepted(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);

impl Accepted {
    fn set(&self, names: &[&'static str]) {
        *self.0.lock().unwrap() = names.to_vec();
    }

    fn filter(&self) -> impl Fn(&str) -> bool + Send + Sync + 'static {
        let names = self.0.clone();
        move |name| names.lock().unwrap().contains(&name)
    }
}

/// A key counted as `(other)` (its filter did not accept it yet: a route
/// not yet answered) takes its requests in flight with it once accepted,
/// so it never shows nothing in flight while its requests hold permits.
#[tokio::test(start_paused = true)]
async fn a_key_accepted_later_takes_its_requests_in_flight_with_it() {
    let accepted = Accepted::default();
    let layer = ConcurrencyLayer::new(10, JsonFieldKey::new("model"))
        .unwrap()
        .with_key_stats_where(4, accepted.filter());
    let handle = layer.handle();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let svc = layer.layer(service_fn(move |_req: Request<String>| {
        let gate = held.clone();
        async move {
            drop(gate.acquire().await.unwrap());
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    }));
    // Three requests while the filter accepts nothing: counted as other.
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot(chat("m1"))))
        .collect();
    tokio::task::yield_now().await;
    let other = handle.stats();
    assert_eq!(
        entry(&other, OTHER_KEYS).in_flight,
        Some(3),
        "{:?}",
        other.keys
    );
    accepted.set(&["m1"]);
    let fourth = tokio::spawn(svc.clone().oneshot(chat("m1")));
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    let stats = handle.stats();
    assert_eq!(entry(&stats, "m1").in_flight, Some(4), "{:?}", stats.keys);
    assert_eq!(
        entry(&stats, OTHER_KEYS).in_flight,
        Some(0),
        "{:?}",
        stats.keys
    );
    gate.add_permits(4);
    for call in calls.into_iter().chain([fourth]) {
        drop(call.await.unwrap().unwrap());
    }
    let stats = handle.stats();
    assert_eq!(entry(&stats, "m1").in_flight, Some(0));
    assert_eq!(entry(&stats, OTHER_KEYS).in_flight, Some(0));
    assert_eq!(entry(&stats, OTHER_KEYS).admitted, 3);
    assert_eq!(entry(&stats, "m1").admitted, 1);
}

/// With the table full, a key the filter accepts takes the place of an idle
/// one it no longer accepts (a made-up name aged out); its counts go to
/// `(other)`, so the keys still add up to the aggregate. A key with a
/// request in flight keeps its place.
#[tokio::test(start_paused = true)]
async fn an_idle_key_the_filter_no_longer_accepts_gives_its_place() {
    let accepted = Accepted::default();
    accepted.set(&["junk-1", "junk-2"]);
    let layer = ConcurrencyLayer::new(10, JsonFieldKey::new("model"))
        .unwrap()
        .with_key_stats_where(2, accepted.filter());
    let handle = layer.handle();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let svc = layer.layer(service_fn(move |req: Request<String>| {
        let gate = held.clone();
        async move {
            if req.body().contains("junk-1") {
                drop(gate.acquire().await.unwrap());
            }
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    }));
    let busy = tokio::spawn(svc.clone().oneshot(chat("junk-1")));
    tokio::task::yield_now().await;
    drop(svc.clone().oneshot(chat("junk-2")).await.unwrap());
    // Neither is accepted any more; the real model is.
    accepted.set(&["real", "real-2"]);
    drop(svc.clone().oneshot(chat("real")).await.unwrap());
    let stats = handle.stats();
    let names: Vec<&str> = stats.keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        names,
        [OTHER_KEYS, "junk-1", "real"],
        "the busy key kept its place"
    );
    assert_eq!(
        entry(&stats, OTHER_KEYS).admitted,
        1,
        "junk-2's count moved there"
    );
    assert_eq!(entry(&stats, OTHER_KEYS).in_flight, Some(0));
    // Nothing idle to give its place: counted as other.
    drop(svc.clone().oneshot(chat("real-2")).await.unwrap());
    assert_eq!(entry(&handle.stats(), OTHER_KEYS).admitted, 2);
    gate.add_permits(1);
    drop(busy.await.unwrap().unwrap());
    let stats = handle.stats();
    let by_key: u64 = stats.keys.iter().map(|k| k.admitted).sum();
    assert_eq!(by_key, stats.aggregate.admitted);
}

/// Without a filter, the first `max_keys` keys are counted by name and the
/// rest added up as `(other)`: the table never grows past `max_keys + 1`.
#[tokio::test(start_paused = true)]
async fn keys_beyond_max_keys_are_added_up_as_other() {
    let layer = RateLimitLayer::new(Quota::per_minute(1000).unwrap(), JsonFieldKey::new("model"))
        .with_key_stats(3);
    let handle = layer.handle();
    let mut svc = layer.layer(service_fn(ok));
    for i in 0..10 {
        svc.ready()
            .await
            .unwrap()
            .call(chat(&format!("m{i}")))
            .await
            .unwrap();
    }
    let stats = handle.stats();
    let names: Vec<&str> = stats.keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(names, [OTHER_KEYS, "m0", "m1", "m2"]);
    assert_eq!(entry(&stats, OTHER_KEYS).admitted, 7);
    assert_eq!(stats.untracked_keys, 7);
}

/// A key with a line feed, an escape sequence, NUL and CR in it: every
/// error, stats name, cooldown and log line shows it escaped, and no log
/// line is forged.
#[tokio::test(start_paused = true)]
async fn control_characters_in_a_key_never_reach_an_error_a_stats_name_or_a_log_line() {
    capture_logs();
    let rate = RateLimitLayer::new(Quota::per_minute(1).unwrap(), JsonFieldKey::new("model"))
        .with_key_stats(10)
        .with_max_wait(Duration::from_secs(120));
    let rate_handle = rate.handle();
    let mut limited = rate.layer(service_fn(ok));
    // Admitted, then one that waits its turn (logged), then one refused.
    limited
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap();
    limited
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap();
    let strict = RateLimitLayer::new(Quota::per_minute(1).unwrap(), JsonFieldKey::new("model"))
        .with_key_stats(10);
    let strict_handle = strict.handle();
    let mut strict = strict.layer(service_fn(ok));
    strict
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap();
    let refused = strict
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap_err();
    let refused = refused.downcast_ref::<RateLimited>().unwrap();

    let concurrency = ConcurrencyLayer::new(1, JsonFieldKey::new("model"))
        .unwrap()
        .with_max_queue(0)
        .with_key_stats(10);
    let concurrency_handle = concurrency.handle();
    let svc = concurrency.layer(service_fn(ok));
    let held = svc.clone().oneshot(chat(INJECTED)).await.unwrap();
    let full = svc.clone().oneshot(chat(INJECTED)).await.unwrap_err();
    drop(held);

    let backoff = Backoff429Layer::new(JsonFieldKey::new("model")).with_key_stats(10);
    let backoff_handle = backoff.handle();
    let mut cooled = backoff.layer(service_fn(too_many));
    cooled
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap();
    let cooling = cooled
        .ready()
        .await
        .unwrap()
        .call(chat(INJECTED))
        .await
        .unwrap_err();
    let cooling = cooling.downcast_ref::<CoolingDown>().unwrap();

    let mut shown = vec![
        ("RateLimited", refused.to_string()),
        ("QueueFull", full.to_string()),
        ("CoolingDown", cooling.to_string()),
    ];
    for (layer, snapshot) in [
        ("rate limit (wait)", rate_handle.stats()),
        ("rate limit", strict_handle.stats()),
        ("concurrency", concurrency_handle.stats()),
        ("backoff", backoff_handle.stats().requests),
    ] {
        let names: Vec<String> = snapshot.keys.into_iter().map(|k| k.key).collect();
        assert_eq!(names, [ESCAPED], "{layer} stats names");
    }
    let cooldowns: Vec<String> = backoff_handle
        .cooldowns()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(cooldowns, [ESCAPED]);
    shown.push(("log", log_text()));
    for (what, text) in &shown {
        assert!(
            text.contains(ESCAPED),
            "{what} does not show the key escaped: {text}"
        );
        assert_eq!(stray_controls(text), [], "{what}: {text:?}");
        assert_eq!(
            forged_lines(text, "2026-12-01T00:00:00Z ERROR admin"),
            Vec::<&str>::new(),
            "{what}"
        );
    }
    let logs = log_text();
    for event in [
        "rate limit: waiting for turn",
        "rate limit: refused",
        "concurrency: queue full",
        "backoff: route cooling down",
        "backoff: refused while cooling down",
    ] {
        assert!(
            logs.lines()
                .any(|l| l.contains(event) && l.contains(ESCAPED)),
            "no `{event}` line with the key escaped:\n{logs}"
        );
    }
}
