//! Backoff429Layer on Redis at its edges: a stalled Redis costs a request
//! one timeout, not one per call. Each test starts a `redis-server` of its
//! own (see `support/redis.rs`).

#[path = "support/redis.rs"]
mod redis_server;

use std::convert::Infallible;
use std::time::Duration;

use redis_server::RedisServer;
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::error::BoxError;
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

/// Answers as each request asks.
async fn upstream(req: http::Request<()>) -> Result<http::Response<()>, Infallible> {
    let status = req
        .headers()
        .get("x-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    Ok(http::Response::builder()
        .status(status)
        .body(())
        .expect("valid response"))
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
        .with_timeout(TIMEOUT)
        .on_error(OnError::Open);
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
