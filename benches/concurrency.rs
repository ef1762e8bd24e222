//! Cost of an uncontended acquire + release through `ConcurrencyLayer`, side by
//! side with `tower::limit::ConcurrencyLimit`, a bare `tokio::sync::Semaphore`
//! and the least any keyed layer does (`floor_header`, `floor/concurrency.rs`).
//!
//! Every service is driven synchronously: `poll_ready`, `call` and one poll of
//! the response future with a no-op waker, no runtime; then the response is
//! dropped, which gives the permit back (ours holds it in the response body,
//! tower's until the response future completes). Every layered contender gets
//! the same request (a clone of one prebuilt request, whose cost the
//! `bare_inner` anchor measures) and the same ready inner service.
//!
//! ```text
//! cargo bench --bench concurrency -- --warm-up-time 1 --measurement-time 2
//! ```

mod floor;
mod support;

use support::drive;

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{HeaderName, HeaderValue, Request, Response};
use tokio::sync::Semaphore;
use tower::{Layer, Service};
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::key::{GlobalKey, HeaderKey};

const API_KEY: &str = "sk-live-0123456789abcdef01234567";
const HEADER: HeaderName = HeaderName::from_static("x-api-key");

/// The inner service every contender wraps: a ready, empty response.
fn http_inner() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = Infallible,
    Future = Ready<Result<Response<()>, Infallible>>,
> + Clone {
    tower::service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(()))))
}

fn request_for(key: &str) -> Request<()> {
    Request::builder()
        .uri("/v1/chat/completions")
        .header(HEADER, HeaderValue::from_str(key).unwrap())
        .body(())
        .unwrap()
}

use support::Run;

/// Every contender, by name: one acquire + release each call.
fn contenders() -> Vec<(&'static str, Run)> {
    let req = request_for(API_KEY);
    let mut all: Vec<(&'static str, Run)> = Vec::new();

    let (mut svc, r) = (http_inner(), req.clone());
    all.push((
        "bare_inner",
        Box::new(move || drive(&mut svc, r.clone()).is_ok()),
    ));

    let sem = Semaphore::new(1);
    all.push((
        "tokio_semaphore_try_acquire",
        Box::new(move || sem.try_acquire().is_ok()),
    ));

    let sem = Arc::new(Semaphore::new(1));
    all.push((
        "tokio_semaphore_acquire_owned",
        Box::new(move || {
            let mut cx = Context::from_waker(Waker::noop());
            let acquire = sem.clone().acquire_owned();
            let mut acquire = std::pin::pin!(acquire);
            matches!(acquire.as_mut().poll(&mut cx), Poll::Ready(Ok(_)))
        }),
    ));

    let mut svc = tower::limit::ConcurrencyLimitLayer::new(1).layer(http_inner());
    let r = req.clone();
    all.push((
        "tower_concurrency_limit",
        Box::new(move || drive(&mut svc, r.clone()).is_ok()),
    ));

    let mut svc = ConcurrencyLayer::new(1, GlobalKey)
        .unwrap()
        .layer(http_inner());
    let r = req.clone();
    all.push((
        "ours_global",
        Box::new(move || drive(&mut svc, r.clone()).is_ok()),
    ));

    let mut svc = ConcurrencyLayer::new(1, HeaderKey::from_name(HEADER))
        .unwrap()
        .layer(http_inner());
    let r = req.clone();
    all.push((
        "ours_header",
        Box::new(move || drive(&mut svc, r.clone()).is_ok()),
    ));

    // The least any keyed concurrency layer does (see `floor/concurrency.rs`).
    let mut svc = floor::concurrency::KeyedFloor::new(http_inner(), HEADER, 1);
    let r = req.clone();
    all.push((
        "floor_header",
        Box::new(move || drive(&mut svc, r.clone()).is_ok()),
    ));

    // 10,000 keys in turn, each with a long request in flight (its permit
    // held by the closure), so every lookup finds a live key among 10,000.
    let keys = many_keys();
    let mut svc = ConcurrencyLayer::new(2, HeaderKey::from_name(HEADER))
        .unwrap()
        .layer(http_inner());
    let held: Vec<_> = keys
        .iter()
        .map(|r| drive(&mut svc, r.clone()).expect("ours admits"))
        .collect();
    let mut next = cycle(keys);
    all.push((
        "ours_header_10k_live_keys",
        Box::new(move || {
            let _ = &held;
            drive(&mut svc, next()).is_ok()
        }),
    ));

    // The same 10,000 keys with nothing else in flight: a key's state goes
    // idle after each request, and is removed once its shard is full enough.
    let mut svc = ConcurrencyLayer::new(1, HeaderKey::from_name(HEADER))
        .unwrap()
        .layer(http_inner());
    let mut next = cycle(many_keys());
    all.push((
        "ours_header_10k_idle_keys",
        Box::new(move || drive(&mut svc, next()).is_ok()),
    ));

    // The anchor for those two: the clone of one of many requests.
    let mut svc = http_inner();
    let mut next = cycle(many_keys());
    all.push((
        "bare_inner_10k_requests",
        Box::new(move || drive(&mut svc, next()).is_ok()),
    ));
    all
}

fn many_keys() -> Vec<Request<()>> {
    (0..10_000)
        .map(|i| request_for(&format!("sk-live-{i:010}")))
        .collect()
}

/// Clones of `requests`, in turn, forever.
fn cycle(requests: Vec<Request<()>>) -> impl FnMut() -> Request<()> {
    let mut i = 0;
    move || {
        let req = requests[i].clone();
        i = (i + 1) % requests.len();
        req
    }
}

fn main() {
    support::run_contenders("TT_CONCURRENCY", "uncontended", contenders);
}
