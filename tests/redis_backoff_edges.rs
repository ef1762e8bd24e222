//! Backoff429Layer on Redis at its edges: a stalled Redis costs a request
//! one timeout, not one per call. Each test starts a `redis-server` of its
//! own (see `support/redis.rs`).

#![cfg(feature = "redis")]

use testkit::redis as redis_server;

use std::convert::Infallible;
use std::time::Duration;

use redis_server::RedisServer;
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::error::{BoxError, CoolingDown};
use tower_throttle::key::HeaderKey;
use tower_throttle::redis::{OnError, RedisStore};

const TIMEOUT: Duration = Duration::from_millis(50);
/// What a request may take past the timeout: the task's turn to run.
const SLACK: Duration = Duration::from_millis(20);

/// A request to `route`, which the upstream answers with `status`.
fn request(route: &str, status: u16) -> http::Request<()> {
    http::Request::builder()
        .header("x-route", route)
        .header("x-status", status.to_string())
        .body(())
        .expect("valid request")
}

/// Answers as each request asks (`x-status`, and `x-retry` as its
/// `Retry-After`).
async fn upstream(req: http::Request<()>) -> Result<http::Response<()>, Infallible> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let status = header("x-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let mut res = http::Response::builder().status(status);
    if let Some(retry) = header("x-retry") {
        res = res.header("retry-after", retry);
    }
    Ok(res.body(()).expect("valid response"))
}

async fn send<S>(svc: &mut S, req: http::Request<()>) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(req).await
}

#[tokio::test]
async fn a_429_through_a_stalled_redis_ends_within_one_timeout() {
    let Some(server) = RedisServer::start("a_429_through_a_stalled_redis") else {
        return;
    };
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix("stall:")
        .expect("a prefix without braces")
        .with_timeout(TIMEOUT)
        .with_on_error(OnError::Open);
    let mut svc = tower::ServiceBuilder::new()
        .layer(
            Backoff429Layer::new(HeaderKey::new("x-route").expect("valid header name"))
                .with_store(store),
        )
        .service_fn(upstream);
    // Connected, and Redis answers.
    send(&mut svc, request("warm", 200)).await.expect("passed");
    // Redis stops answering (every client paused) for a second.
    let mut conn = server.connection();
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "1000", "ALL"][..])
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    // Failing open: the read times out, the upstream's 429 comes back, and
    // its report to Redis does not hold it for another timeout.
    let start = Instant::now();
    let res = send(&mut svc, request("openai", 429))
        .await
        .expect("passed on");
    let took = start.elapsed();
    assert_eq!(res.status(), 429);
    assert!(took <= TIMEOUT + SLACK, "the 429 took {took:?}");
}

#[tokio::test]
async fn a_cooldown_longer_than_redis_counts_is_still_shared() {
    let Some(server) = RedisServer::start("a_cooldown_longer_than_redis_counts") else {
        return;
    };
    let make = || {
        let store = RedisStore::new(&server.url())
            .expect("valid URL")
            .with_prefix("long:")
            .expect("a prefix without braces")
            .with_timeout(Duration::from_secs(2))
            .with_on_error(OnError::Closed);
        tower::ServiceBuilder::new()
            .layer(
                Backoff429Layer::new(HeaderKey::new("x-route").expect("valid header name"))
                    .with_max_cooldown(Duration::MAX)
                    .with_store(store),
            )
            .service_fn(upstream)
    };
    let (mut a, mut b) = (make(), make());
    // An upstream that says: not for 300,000 years (past what a 64-bit
    // count of microseconds holds, added to now).
    let mut req = request("openai", 429);
    req.headers_mut().insert(
        "x-retry",
        http::HeaderValue::from_static("9500000000000000"),
    );
    let res = send(&mut a, req).await.expect("passed on");
    assert_eq!(res.status(), 429);
    let err = send(&mut b, request("openai", 200))
        .await
        .expect_err("cooling on the other replica too");
    let cooling = err
        .downcast_ref::<CoolingDown>()
        .unwrap_or_else(|| panic!("expected CoolingDown, got {err}"));
    assert!(
        cooling.retry_after > Duration::from_secs(100 * 365 * 86_400),
        "{:?}",
        cooling.retry_after
    );
}

/// The shared cooldown's generation only grows, even once the route's
/// state has expired (a quiet route's is deleted): replicas keep the largest
/// they saw and send it with each request, so a generation that started
/// again from 0 would make 429s already in flight count as fresh, and the
/// streak would grow faster than the 429s that say something new.
#[tokio::test]
async fn the_cooldown_generation_grows_across_the_state_expiring() {
    let Some(server) = RedisServer::start("generation_grows") else {
        return;
    };
    let script = redis::Script::new(include_str!("../src/backoff/cooldown.lua"));
    let mut conn = server.connection();
    let t0: u64 = 1_800_000_000_000_000;
    // mode, generation sent under, advised wait, forget_after, now, delays.
    let mut call = |mode: &str, seen: u64, now: u64| -> (u64, u64) {
        let reply: Vec<i64> = script
            .key("route:cd")
            .arg(mode)
            .arg(seen)
            .arg(if mode == "429" { "1000" } else { "" })
            .arg(0)
            .arg(now)
            .arg(1000)
            .invoke(&mut conn)
            .expect("the script runs");
        (reply[2] as u64, reply[3] as u64)
    };
    let (_, first) = call("429", 0, t0);
    // Quiet, then a success: the state is deleted.
    call("ok", first, t0 + 5_000);
    let exists: bool = redis::cmd("EXISTS")
        .arg("route:cd")
        .query(&mut server.connection())
        .expect("EXISTS");
    assert!(!exists, "the quiet route's state was deleted");
    // Two requests sent under `first` come back 429: the first starts a
    // new cooldown, the second was in flight before it and adds nothing.
    let (streak, second) = call("429", first, t0 + 6_000);
    assert_eq!(streak, 1);
    assert!(second > first, "{second} after {first}");
    let (streak, _) = call("429", first, t0 + 6_001);
    assert_eq!(
        streak, 1,
        "a 429 in flight before the cooldown counted as fresh"
    );
}
