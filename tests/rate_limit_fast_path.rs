//! The global key's fast path (one token bucket, reject mode, nothing to
//! hand back: one compare-and-swap, no lock) is invisible but for its speed:
//! a retune, a switch to several quotas, a reset, a switch off and a refund
//! all take effect on a service using it, a look at the key sees what it
//! booked, and its counts are kept.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

type Inner = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;

fn inner() -> Inner {
    fn ok(_req: Request<()>) -> Ready<Result<Response<()>, Infallible>> {
        ready(Ok(Response::new(())))
    }
    tower::service_fn(ok as fn(_) -> _)
}

fn per_second(n: u32, burst: u32) -> Quota {
    Quota::per_second(n)
        .expect("valid")
        .with_burst(burst)
        .expect("valid")
}

/// Whether one request is admitted.
async fn admitted<S>(svc: &mut S) -> bool
where
    S: Service<Request<()>, Response = Response<()>>,
{
    let svc = svc.ready().await.ok().expect("ready");
    svc.call(Request::new(())).await.is_ok()
}

/// How many of `n` requests in a row are admitted.
async fn admitted_of<S>(svc: &mut S, n: usize) -> usize
where
    S: Service<Request<()>, Response = Response<()>>,
{
    let mut count = 0;
    for _ in 0..n {
        count += usize::from(admitted(svc).await);
    }
    count
}

#[tokio::test]
async fn a_retune_takes_effect_on_the_fast_path_without_minting_a_burst() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new(per_second(10, 4), GlobalKey).with_clock(clock.clone());
    let mut svc = layer.layer(inner());
    // Two of four spent on the fast path.
    assert_eq!(admitted_of(&mut svc, 2).await, 2);
    // A bigger burst at the same rate: what was available may not grow
    // (two), and the two spent stay spent.
    layer
        .handle()
        .retune(vec![per_second(10, 8)], Vec::new())
        .expect("valid");
    assert_eq!(admitted_of(&mut svc, 10).await, 2);
    // A smaller one: nothing left, nothing minted.
    layer
        .handle()
        .retune(vec![per_second(10, 1)], Vec::new())
        .expect("valid");
    assert_eq!(admitted_of(&mut svc, 3).await, 0);
    clock.advance(Duration::from_millis(100));
    assert_eq!(admitted_of(&mut svc, 3).await, 1);
    let stats = layer.handle().stats().aggregate;
    assert_eq!((stats.admitted, stats.rejected), (5, 13));
}

#[tokio::test]
async fn a_switch_to_several_quotas_takes_effect_on_the_fast_path() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new(per_second(100, 100), GlobalKey).with_clock(clock.clone());
    let mut svc = layer.layer(inner());
    assert_eq!(admitted_of(&mut svc, 3).await, 3);
    // A second, tighter quota: it admits two more, the first keeps its
    // three spent.
    layer
        .handle()
        .retune(vec![per_second(100, 100), per_second(1, 2)], Vec::new())
        .expect("valid");
    assert_eq!(admitted_of(&mut svc, 5).await, 2);
    // Back to one quota, burst 7: the second quota is gone, and the first
    // (five spent of a hundred) has its whole new burst.
    layer
        .handle()
        .retune(vec![per_second(100, 7)], Vec::new())
        .expect("valid");
    assert_eq!(admitted_of(&mut svc, 10).await, 7);
}

#[tokio::test]
async fn a_reset_and_a_switch_off_take_effect_on_the_fast_path() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::new(per_second(1, 2), GlobalKey).with_clock(clock.clone());
    let mut svc = layer.layer(inner());
    assert_eq!(admitted_of(&mut svc, 3).await, 2);
    // What a look at the key sees is what the fast path booked.
    let none: [&str; 0] = [];
    assert_eq!(layer.handle().peek_wait(&none), Duration::from_secs(1));
    layer.handle().reset_all();
    assert_eq!(admitted_of(&mut svc, 3).await, 2);
    layer.handle().set_enabled(false);
    assert_eq!(admitted_of(&mut svc, 3).await, 3);
    layer.handle().set_enabled(true);
    assert_eq!(admitted_of(&mut svc, 1).await, 0);
    // What the handle sees of the key is what the fast path left.
    assert_eq!(layer.key_count(), 1);
}

#[tokio::test]
async fn a_refund_takes_effect_beside_the_fast_path() {
    let clock = ManualClock::new();
    let base = RateLimitLayer::new(per_second(1, 2), GlobalKey).with_clock(clock.clone());
    // One service on the fast path; beside it on the same limiter, one that
    // gives back what a failed request took (it needs a ticket, so it takes
    // the locked path).
    let mut fast = base.clone().layer(inner());
    let failing = tower::service_fn(|_req: Request<()>| {
        let mut res = Response::new(());
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        ready(Ok::<_, Infallible>(res))
    });
    let mut refunding = base
        .count_only(|res: &Result<Response<()>, Infallible>| {
            res.as_ref().is_ok_and(|r| r.status() == StatusCode::OK)
        })
        .layer(failing);
    // The refunding service's request is admitted (locked path) and the
    // fast path admits one more, the bucket's last, before that request's
    // answer gives its unit back.
    let pending = refunding
        .ready()
        .await
        .expect("ready")
        .call(Request::new(()));
    assert!(admitted(&mut fast).await);
    assert!(!admitted(&mut fast).await);
    assert!(pending.await.is_ok());
    // The unit came back to the state the fast path uses: one more fits,
    // then none.
    assert!(admitted(&mut fast).await);
    assert!(!admitted(&mut fast).await);
}

#[tokio::test]
async fn a_layer_that_writes_what_remains_gets_it_for_the_global_key() {
    // Response headers need what remains, which the fast path does not
    // compute: such a layer's admissions take the locked path.
    let layer = RateLimitLayer::new(per_second(10, 4), GlobalKey)
        .with_clock(ManualClock::new())
        .with_response_headers(tower_throttle::respond::RateLimitHeaders::ietf());
    let mut svc = layer.layer(inner());
    for left in (0..4).rev() {
        let response = svc
            .ready()
            .await
            .expect("ready")
            .call(Request::new(()))
            .await;
        let response = response.expect("admitted");
        let remaining = response.headers().get("ratelimit").expect("annotated");
        assert!(
            remaining.to_str().unwrap().contains(&format!(";r={left};")),
            "{remaining:?}"
        );
    }
    assert!(!admitted(&mut svc).await);
}
