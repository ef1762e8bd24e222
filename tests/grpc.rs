//! A real tonic server behind `RateLimitLayer` (and `ConcurrencyLayer`)
//! and `GrpcStatusLayer`, called by a real tonic client: a refused call
//! is the gRPC status a client expects, with its retry delay in
//! `RetryInfo` and `grpc-retry-pushback-ms`, on a unary and on a
//! streaming method, and no key text in its message.

#![cfg(feature = "tonic")]

use std::time::Duration;

use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower::ServiceBuilder;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::respond::{GrpcStatusLayer, PUSHBACK};

const KEY: &str = "grpc-secret-key-0123456789";

/// The health service (`grpc.health.v1`: `Check` is unary, `Watch`
/// streams) on an ephemeral port behind `$layer`: its URL. It stops with
/// the test's runtime.
macro_rules! serve {
    ($layer:expr) => {{
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let (_reporter, health) = tonic_health::server::health_reporter();
        let router = Server::builder().layer($layer).add_service(health);
        tokio::spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
        url
    }};
}

/// One call an hour per `x-api-key`, refusals as gRPC statuses.
macro_rules! rate_limited {
    () => {
        ServiceBuilder::new()
            .layer(GrpcStatusLayer::new())
            .layer(RateLimitLayer::new(
                Quota::per_hour(1).expect("valid"),
                HeaderKey::new("x-api-key").expect("valid"),
            ))
            .into_inner()
    };
}

/// A request to the health service, with `key` as its `x-api-key`.
fn with_key<T>(message: T, key: &str) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("x-api-key", key.parse().expect("ascii"));
    req
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// The delay a refused call's `RetryInfo` and pushback say, checked to
/// agree: RetryInfo exact, the pushback in whole milliseconds rounded up.
fn retry_delay(status: &Status) -> Duration {
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("a RetryInfo detail with a delay");
    let pushback: u128 = status
        .metadata()
        .get(PUSHBACK)
        .expect("a pushback")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("milliseconds");
    assert_eq!(pushback, delay.as_nanos().div_ceil(1_000_000), "{status:?}");
    delay
}

fn assert_no_key(status: &Status) {
    assert!(!status.message().contains(KEY), "{status:?}");
    assert!(!format!("{:?}", status.metadata()).contains(KEY));
}

async fn client(addr: &str) -> HealthClient<Channel> {
    let channel = Channel::from_shared(addr.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("the server is up");
    HealthClient::new(channel)
}

#[tokio::test]
async fn a_refused_unary_call_is_resource_exhausted_with_its_retry_delay() {
    let addr = serve!(rate_limited!());
    let mut health = client(&addr).await;
    health
        .check(with_key(check(), KEY))
        .await
        .expect("the first call of the hour");
    let refused = health
        .check(with_key(check(), KEY))
        .await
        .expect_err("the second is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let delay = retry_delay(&refused);
    assert!(
        delay > Duration::from_secs(3590) && delay <= Duration::from_secs(3600),
        "{delay:?}"
    );
    assert_no_key(&refused);
    // Another key has its own hour.
    health
        .check(with_key(check(), "another-key-0123456789"))
        .await
        .expect("another key's first call");
}

#[tokio::test]
async fn a_refused_streaming_call_is_resource_exhausted_too() {
    let addr = serve!(rate_limited!());
    let mut health = client(&addr).await;
    let mut stream = health
        .watch(with_key(check(), KEY))
        .await
        .expect("the first call of the hour")
        .into_inner();
    let first = stream.message().await.expect("a message");
    assert!(first.is_some());
    let refused = health
        .watch(with_key(check(), KEY))
        .await
        .expect_err("the second is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    retry_delay(&refused);
    assert_no_key(&refused);
}

#[tokio::test]
async fn a_full_concurrency_line_is_unavailable_without_a_delay() {
    let layer = ServiceBuilder::new()
        .layer(GrpcStatusLayer::new())
        .layer(
            ConcurrencyLayer::new(1, GlobalKey)
                .expect("valid")
                .with_max_queue(0),
        )
        .into_inner();
    let addr = serve!(layer);
    let mut health = client(&addr).await;
    // A watch holds its permit while its stream is open.
    let _open = health.watch(check()).await.expect("the first call");
    let refused = health.check(check()).await.expect_err("no permit free");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.get_details_retry_info().is_none());
    assert!(refused.metadata().get(PUSHBACK).is_none());
}
