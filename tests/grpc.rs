//! A real tonic server behind `RateLimitLayer` (and `ConcurrencyLayer`)
//! and `GrpcStatusLayer`, called by a real tonic client: a refused call
//! is the gRPC status a client expects, with its retry delay in
//! `RetryInfo` and `grpc-retry-pushback-ms`, on a unary and on a
//! streaming method, and no key text in its message. And a tonic client
//! behind `Backoff429Layer`: a server's pushback cools the route for its
//! time; a pushback saying "do not retry" cools nothing.

#![cfg(feature = "tonic")]

use std::time::Duration;

use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;
use tower::Layer;
use tower::ServiceBuilder;
use tower_throttle::backoff::{Backoff429, Backoff429Layer, BackoffHandle, Reason};
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::CoolingDown;
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

/// A health client of the server at `addr` behind `Backoff429Layer` (one
/// route), and the layer's handle.
async fn backoff_client(
    addr: &str,
) -> (HealthClient<Backoff429<Channel, GlobalKey>>, BackoffHandle) {
    let channel = Channel::from_shared(addr.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("the server is up");
    let backoff = Backoff429Layer::new(GlobalKey);
    let handle = backoff.handle();
    (HealthClient::new(backoff.layer(channel)), handle)
}

/// Calls that reached the server, counted by a layer in front of it.
type Reached = std::sync::Arc<std::sync::atomic::AtomicUsize>;

fn counting(
    reached: &Reached,
) -> impl Fn(http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> + Clone + use<> {
    let reached = reached.clone();
    move |req| {
        reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        req
    }
}

fn reached(reached: &Reached) -> usize {
    reached.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn a_servers_pushback_cools_the_clients_route_for_its_time() {
    let count = Reached::default();
    let server_layer = ServiceBuilder::new()
        .map_request(counting(&count))
        .layer(GrpcStatusLayer::new())
        .layer(RateLimitLayer::new(
            Quota::per_minute(1).expect("valid"),
            GlobalKey,
        ))
        .into_inner();
    let addr = serve!(server_layer);
    let (mut health, handle) = backoff_client(&addr).await;
    health.check(check()).await.expect("the first call");
    let pushed_back = health.check(check()).await.expect_err("one a minute");
    assert_eq!(pushed_back.code(), Code::ResourceExhausted);
    // The route cools for what the server's RetryInfo said, read exactly.
    let cooldown = handle.cooldown::<&str>(&[]).expect("the route cools");
    assert_eq!(cooldown.reason, Reason::GrpcRetryInfo);
    assert!(
        cooldown.remaining > Duration::from_secs(55)
            && cooldown.remaining <= Duration::from_secs(60),
        "{cooldown:?}"
    );
    // The next call is refused here, without reaching the server.
    let cooled = health.check(check()).await.expect_err("cooling down");
    let source = std::error::Error::source(&cooled).expect("the layer's error");
    assert!(source.downcast_ref::<CoolingDown>().is_some(), "{cooled:?}");
    assert_eq!(reached(&count), 2);
}

#[tokio::test]
async fn a_pushback_saying_do_not_retry_cools_nothing() {
    let count = Reached::default();
    // Every call refused, with gRPC's "do not retry".
    let refuse = tower::layer::layer_fn(|_routes| {
        tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
            let mut status = Status::resource_exhausted("never");
            status
                .metadata_mut()
                .insert(PUSHBACK, "-1".parse().expect("ascii"));
            Ok::<_, std::convert::Infallible>(status.into_http::<tonic::body::Body>())
        })
    });
    let server_layer = ServiceBuilder::new()
        .map_request(counting(&count))
        .layer(refuse)
        .into_inner();
    let addr = serve!(server_layer);
    let (mut health, handle) = backoff_client(&addr).await;
    for _ in 0..3 {
        let refused = health.check(check()).await.expect_err("refused");
        assert_eq!(refused.code(), Code::ResourceExhausted);
    }
    assert!(handle.cooldowns().is_empty());
    assert_eq!(reached(&count), 3);
}

/// A gRPC answer: `code` with `pushback`, trailers-only.
fn grpc_answer(code: Code, pushback: &str) -> http::Response<String> {
    let mut status = Status::new(code, "pushed back");
    status
        .metadata_mut()
        .insert(PUSHBACK, pushback.parse().expect("ascii"));
    status.into_http()
}

/// `RetryPolicy` against a server answering the first call with `first`
/// and later ones `OK`: when each call was sent, from the start.
async fn retried(first: http::Response<String>) -> Vec<Duration> {
    use std::sync::{Arc, Mutex};
    use tower::ServiceExt;
    use tower::retry::RetryLayer;
    use tower_throttle::backoff::RetryPolicy;

    let start = tokio::time::Instant::now();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let first = Arc::new(Mutex::new(Some(first)));
    let log = sent.clone();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::new()))
        .service_fn(move |_req: http::Request<String>| {
            log.lock().unwrap().push(start.elapsed());
            let answer = first
                .lock()
                .unwrap()
                .take()
                .unwrap_or_else(|| Status::ok("").into_http());
            async move { Ok::<_, std::convert::Infallible>(answer) }
        });
    service
        .oneshot(http::Request::new(String::new()))
        .await
        .expect("an answer");
    sent.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn the_retry_policy_waits_out_a_grpc_pushback_and_obeys_do_not_retry() {
    let zero = Duration::ZERO;
    let pushed = retried(grpc_answer(Code::ResourceExhausted, "1500")).await;
    assert_eq!(pushed, [zero, Duration::from_millis(1500)]);
    let unavailable = retried(grpc_answer(Code::Unavailable, "250")).await;
    assert_eq!(unavailable, [zero, Duration::from_millis(250)]);
    assert_eq!(
        retried(grpc_answer(Code::ResourceExhausted, "-1")).await,
        [zero]
    );
    // Not a pushback: an answer with another code is not retried.
    assert_eq!(retried(grpc_answer(Code::NotFound, "10")).await, [zero]);
}
