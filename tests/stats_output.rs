//! What the layers write about keys chosen by clients: per-key stats that a
//! flood of made-up keys cannot take over, and key text that reaches no
//! error, stats name or log line with a raw control character in it.

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
