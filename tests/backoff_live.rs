//! Backoff429Layer's settings changed while it runs, through its handle and
//! from a config section; and `max_backoff = 0`, a fixed cooldown.

#![cfg(feature = "test-util")]

use std::convert::Infallible;
use std::time::Duration;

use tower::{Layer, Service, ServiceExt};
use tower_throttle::backoff::{Backoff429Layer, BackoffHandle, ExponentialBackoff};
use tower_throttle::config::{BackoffConfig, StackConfig};
use tower_throttle::error::{BoxError, CoolingDown};
use tower_throttle::key::HeaderKey;

/// An upstream answering with the status the request's `x-answer` names,
/// and the `Retry-After` its `x-retry-after` names.
fn upstream()
-> impl Service<http::Request<()>, Response = http::Response<()>, Error = Infallible, Future: Send>
+ Clone {
    tower::service_fn(|req: http::Request<()>| async move {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = header("x-answer")
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        let mut response = http::Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
        if let Some(after) = header("x-retry-after") {
            if let Ok(value) = http::HeaderValue::try_from(after) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        Ok::<_, Infallible>(response)
    })
}

fn answer(status: u16) -> http::Request<()> {
    http::Request::builder()
        .header("x-model", "m")
        .header("x-answer", status)
        .body(())
        .expect("valid request")
}

fn layer() -> Backoff429Layer<HeaderKey> {
    Backoff429Layer::new(HeaderKey::new("x-model").expect("valid"))
}

/// Send `req`; the status, or the cooldown's remaining time if refused.
async fn send<S>(svc: &S, req: http::Request<()>) -> Result<u16, Duration>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError> + Clone,
{
    match svc.clone().oneshot(req).await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(e) => Err(e
            .downcast_ref::<CoolingDown>()
            .map(|c| c.retry_after)
            .expect("a cooldown")),
    }
}

fn remaining(handle: &BackoffHandle) -> Option<Duration> {
    handle.cooldown(&["m"]).map(|c| c.remaining)
}

#[tokio::test(start_paused = true)]
async fn max_backoff_zero_is_a_fixed_cooldown_of_initial_backoff() {
    let built = layer()
        .with_initial_backoff(Duration::from_secs(2))
        .with_max_backoff(Duration::ZERO);
    let section =
        StackConfig::from_toml("[backoff]\ninitial_backoff = \"2s\"\nmax_backoff = \"0s\"\n")
            .and_then(|c| c.validate())
            .and_then(|s| s.backoff_layer(HeaderKey::new("x-model")?))
            .expect("valid")
            .expect("a backoff section");
    for layer in [built, section] {
        let handle = layer.handle();
        let svc = layer.layer(upstream());
        // Every 429 of a streak cools the route for 2 s: no doubling, and
        // not zero.
        for streak in 1..=4 {
            assert_eq!(send(&svc, answer(429)).await, Ok(429));
            assert_eq!(
                remaining(&handle),
                Some(Duration::from_secs(2)),
                "429 number {streak}"
            );
            assert_eq!(send(&svc, answer(200)).await, Err(Duration::from_secs(2)));
            tokio::time::advance(Duration::from_secs(2)).await;
        }
    }
    let fixed = ExponentialBackoff::new(Duration::from_secs(2), Duration::ZERO);
    assert_eq!(fixed.base(40), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn backoff_lengths_jitter_and_503_handling_change_live_through_the_handle() {
    let layer = layer().with_initial_backoff(Duration::from_secs(1));
    let handle = layer.handle();
    let svc = layer.layer(upstream());
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert_eq!(remaining(&handle), Some(Duration::from_secs(1)));
    tokio::time::advance(Duration::from_secs(1)).await;

    // Longer, while the route keeps its streak: its second 429 is the new
    // rule's second length.
    handle.set_backoff(ExponentialBackoff::new(
        Duration::from_secs(5),
        Duration::from_secs(60),
    ));
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert_eq!(remaining(&handle), Some(Duration::from_secs(10)));
    tokio::time::advance(Duration::from_secs(10)).await;

    // A cap on anything a response starts.
    handle.set_max_cooldown(Duration::from_secs(7));
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert_eq!(remaining(&handle), Some(Duration::from_secs(7)));
    tokio::time::advance(Duration::from_secs(7)).await;
    handle.set_max_cooldown(Duration::from_secs(300));

    // Jitter: within its ratio of the base length.
    handle.set_backoff(
        ExponentialBackoff::new(Duration::from_secs(8), Duration::ZERO)
            .with_jitter(0.5)
            .expect("valid"),
    );
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    let jittered = remaining(&handle).expect("cooling");
    assert!(
        (Duration::from_secs(4)..=Duration::from_secs(12)).contains(&jittered),
        "{jittered:?}"
    );
    assert_eq!(handle.backoff().jitter(), 0.5);
    tokio::time::advance(Duration::from_secs(12)).await;

    // 503 with Retry-After: ignored, then obeyed once switched on.
    let unavailable = || {
        let mut req = answer(503);
        req.headers_mut()
            .insert("x-retry-after", http::HeaderValue::from_static("3"));
        req
    };
    assert_eq!(send(&svc, unavailable()).await, Ok(503));
    assert_eq!(remaining(&handle), None);
    handle.set_on_503(true);
    assert_eq!(send(&svc, unavailable()).await, Ok(503));
    assert_eq!(remaining(&handle), Some(Duration::from_secs(3)));
}

#[tokio::test(start_paused = true)]
async fn a_config_section_applies_to_a_running_layer_and_a_bad_one_changes_nothing() {
    let layer = layer();
    let handle = layer.handle();
    let svc = layer.layer(upstream());
    let section = BackoffConfig {
        initial_backoff: Some(Duration::from_secs(4)),
        max_backoff: Some(Duration::ZERO),
        on_503: Some(true),
        ..BackoffConfig::default()
    };
    handle.apply(&section).expect("valid");
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert_eq!(remaining(&handle), Some(Duration::from_secs(4)));

    let mut bad = section.clone();
    bad.initial_backoff = Some(Duration::from_secs(1));
    bad.jitter = Some(1.5);
    let error = handle.apply(&bad).unwrap_err();
    assert_eq!(error.field, "jitter");
    assert_eq!(handle.backoff().initial(), Duration::from_secs(4));
}

#[tokio::test(start_paused = true)]
async fn backoff_switched_off_passes_a_cooling_route_and_back_on_resumes_its_cooldown() {
    let layer = layer().with_initial_backoff(Duration::from_secs(10));
    let handle = layer.handle();
    let svc = layer.layer(upstream());
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert!(send(&svc, answer(200)).await.is_err());
    handle.set_enabled(false);
    assert!(!handle.is_enabled());
    // Off: the cooling route passes, and its 429s start nothing.
    assert_eq!(send(&svc, answer(200)).await, Ok(200));
    assert_eq!(send(&svc, answer(429)).await, Ok(429));
    assert_eq!(handle.stats().cooldowns_started, 1);
    tokio::time::advance(Duration::from_secs(4)).await;
    // On again: the earlier cooldown, 6 s left of it.
    handle.set_enabled(true);
    assert_eq!(send(&svc, answer(200)).await, Err(Duration::from_secs(6)));
}
