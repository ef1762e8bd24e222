//! A handle taken at any point of a layer's builder controls the state the
//! built services use: the rate limiter, the concurrency permits, the
//! backoff table.

#![cfg(feature = "test-util")]

mod support;

use std::convert::Infallible;
use std::time::Duration;

use support::{Inner, request};
use tower::{Layer, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::clock::TokioClock;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::{CoolingDown, RateLimited};
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::redact::fingerprint;

fn key() -> HeaderKey {
    HeaderKey::new("x-key").expect("valid header name")
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_handle_taken_before_the_builder_controls_the_built_services() {
    let layer = RateLimitLayer::new(Quota::per_second(1).expect("valid"), key());
    let handle = layer.handle();
    let layer = layer
        .with_quota(Quota::per_minute(100).expect("valid"))
        .with_rule(
            Rule::new("vip", KeyPattern::parts(["vip"]).expect("valid"))
                .with_quota(Quota::per_second(5).expect("valid")),
        )
        .expect("valid rule")
        .with_key_stats(10)
        .with_clock(TokioClock);
    let svc = layer.layer(Inner::new());

    svc.clone()
        .oneshot(request("alice", 0))
        .await
        .expect("admitted");
    let refused = svc.clone().oneshot(request("alice", 1)).await.unwrap_err();
    assert!(refused.is::<RateLimited>());
    // The handle sees what the services did...
    let stats = handle.stats();
    assert_eq!((stats.aggregate.admitted, stats.aggregate.rejected), (1, 1));
    assert_eq!(stats.keys[0].key, fingerprint("alice").to_string());
    assert_eq!(handle.config().1.len(), 1, "the rule added after it");
    // ...and controls them: switched off, everything passes.
    handle.set_enabled(false);
    for seq in 2..5 {
        svc.clone()
            .oneshot(request("alice", seq))
            .await
            .expect("off");
    }
    handle.set_enabled(true);
    assert!(svc.clone().oneshot(request("alice", 5)).await.is_err());
    // A retune through it applies too.
    handle
        .retune(vec![Quota::per_second(10).expect("valid")], Vec::new())
        .expect("valid");
    tokio::time::advance(Duration::from_millis(100)).await;
    svc.clone()
        .oneshot(request("alice", 6))
        .await
        .expect("retuned");
}

#[tokio::test(start_paused = true)]
async fn a_retune_through_a_handle_taken_before_the_builder_is_kept_by_it() {
    let layer = RateLimitLayer::new(Quota::per_second(100).expect("valid"), key());
    let handle = layer.handle();
    handle
        .retune(vec![Quota::per_second(1).expect("valid")], Vec::new())
        .expect("valid");
    // Builder calls after the retune rebuild the limiter; they keep it.
    let layer = layer.with_key_stats(10).with_clock(TokioClock);
    assert_eq!(
        handle.config().0,
        vec![Quota::per_second(1).expect("valid")]
    );
    let layer = layer.with_quota(Quota::per_minute(100).expect("valid"));
    assert_eq!(
        handle.config().0.len(),
        2,
        "the retuned quota and the added one"
    );
    let svc = layer.layer(Inner::new());
    svc.clone()
        .oneshot(request("alice", 0))
        .await
        .expect("admitted");
    let refused = svc.clone().oneshot(request("alice", 1)).await;
    assert!(refused.is_err(), "1 a second, as retuned");
}

#[test]
fn a_concurrency_handle_taken_before_with_key_stats_controls_the_built_services() {
    let layer = ConcurrencyLayer::new(2, key()).expect("valid");
    let handle = layer.handle();
    let layer = layer.with_key_stats(10);
    let svc = layer.layer(Inner::new());
    let mut first = tokio_test::task::spawn(svc.clone().oneshot(request("alice", 0)));
    let held = tokio_test::assert_ready_ok!(first.poll());
    let stats = handle.stats();
    assert_eq!(
        stats.aggregate.in_flight,
        Some(1),
        "the handle sees the flight"
    );
    assert_eq!(stats.keys[0].key, fingerprint("alice").to_string());
    // Resized through the early handle: the second request waits.
    handle.set_max_in_flight(1).expect("valid");
    let mut second = tokio_test::task::spawn(svc.clone().oneshot(request("alice", 1)));
    tokio_test::assert_pending!(second.poll());
    drop(held);
    tokio_test::assert_ready_ok!(second.poll());
}

/// An upstream answering with the status the request's `x-answer` names.
fn upstream() -> impl tower::Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(|req: http::Request<()>| async move {
        let status = req
            .headers()
            .get("x-answer")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
        Ok::<_, Infallible>(response)
    })
}

fn answer(key: &str, status: u16) -> http::Request<()> {
    let mut req = request(key, 0);
    req.headers_mut()
        .insert("x-answer", http::HeaderValue::from(status));
    req
}

#[tokio::test(start_paused = true)]
async fn a_backoff_handle_taken_before_the_builder_controls_the_built_services() {
    let layer = Backoff429Layer::new(key());
    let handle = layer.handle();
    let layer = layer
        .with_initial_backoff(Duration::from_secs(3))
        .with_max_backoff(Duration::from_secs(30))
        .with_key_stats(10);
    let svc = layer.layer(upstream());
    let refused = svc
        .clone()
        .oneshot(answer("alice", 429))
        .await
        .expect("passed");
    assert_eq!(refused.status(), 429);
    let cooling = handle.cooldowns();
    assert_eq!(cooling.len(), 1, "the handle sees the cooldown");
    assert_eq!(cooling[0].remaining, Duration::from_secs(3));
    let error = svc.clone().oneshot(answer("alice", 200)).await.unwrap_err();
    assert!(error.is::<CoolingDown>());
    assert_eq!(
        handle.stats().requests.keys[0].key,
        fingerprint("alice").to_string()
    );
    // Switched off through it: the cooling route passes.
    handle.set_enabled(false);
    svc.clone()
        .oneshot(answer("alice", 200))
        .await
        .expect("off");
}

#[tokio::test(start_paused = true)]
async fn a_handle_taken_before_a_clone_is_rebuilt_stays_with_the_services_in_use() {
    let layer = RateLimitLayer::new(Quota::per_second(1).expect("valid"), key());
    let handle = layer.handle();
    let used = layer.layer(Inner::new());
    // The layer is in use: a rebuild makes a limiter of its own, which the
    // early handle does not follow, since `used` still runs on the first.
    let other = layer.with_quota(Quota::per_minute(100).expect("valid"));
    let other_handle = other.handle();
    used.clone()
        .oneshot(request("alice", 0))
        .await
        .expect("admitted");
    assert_eq!(handle.stats().aggregate.admitted, 1);
    assert_eq!(other_handle.stats().aggregate.admitted, 0);
    let other_svc = other.layer(Inner::new());
    other_svc
        .oneshot(request("alice", 1))
        .await
        .expect("its own limiter");
    assert_eq!(handle.stats().aggregate.admitted, 1);
    assert_eq!(other_handle.stats().aggregate.admitted, 1);
}
