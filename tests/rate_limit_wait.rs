//! Wait mode: strict FIFO per key, each waiter sleeping until its own instant.

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{ALGORITHMS, Inner, Lcg, quota, request};
use testkit::windows::most_in_any_window;
use tokio::time::{self, Instant};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{
    Algorithm, CountAll, NoAnnotation, OneUnit, Quota, RateLimit, RateLimitLayer,
};
use tower_throttle::respond::RateLimitHeaders;

const SECOND: Duration = Duration::from_secs(1);

/// The most a limit of `limit` per second may admit in a rolling second: a
/// bucket may spend its burst on top of its rate, fixed windows may fill the
/// end of one window and the start of the next, a sliding window never
/// exceeds its limit.
fn rolling_allowance(algorithm: Algorithm, limit: usize) -> usize {
    match algorithm {
        Algorithm::SlidingWindow => limit,
        _ => 2 * limit,
    }
}

/// Send requests `0..n` through `svc` and wait for each.
async fn fill<S>(svc: &mut S, n: usize)
where
    S: Service<http::Request<()>>,
    S::Error: std::fmt::Debug,
{
    for seq in 0..n {
        svc.ready()
            .await
            .unwrap()
            .call(request("k", seq))
            .await
            .unwrap();
    }
}

/// Advance paused time a millisecond at a time until `waiter`'s task is
/// woken (its instant came), for two seconds at most.
async fn until_woken<T>(waiter: &task::Spawn<T>) {
    for _ in 0..2_000 {
        if waiter.is_woken() {
            return;
        }
        time::advance(Duration::from_millis(1)).await;
    }
    assert!(waiter.is_woken(), "its instant never came");
}

/// `inner` behind a fixed window of `limit` per second on `GlobalKey`, in
/// wait mode.
fn fixed_window<S>(limit: u32, inner: S) -> RateLimit<S, GlobalKey, OneUnit, CountAll, NoAnnotation>
where
    S: Service<http::Request<()>>,
{
    RateLimitLayer::new(quota(Algorithm::FixedWindow, limit, SECOND), GlobalKey)
        .with_max_wait(Duration::from_secs(10))
        .layer(inner)
}

#[tokio::test(start_paused = true)]
async fn thousand_waiters_on_one_key_are_admitted_in_arrival_order() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let mut svc = RateLimitLayer::new(quota(algorithm, 10, SECOND), GlobalKey)
            .with_max_wait(Duration::from_secs(200))
            .layer(inner.clone());
        let mut waiting = Vec::new();
        for seq in 0..1_000 {
            svc.ready().await.unwrap();
            waiting.push(tokio::spawn(svc.call(request("k", seq))));
        }
        for task in waiting {
            task.await.unwrap().expect("admitted within max_wait");
        }
        let order = inner.record.order();
        assert_eq!(order, (0..1_000).collect::<Vec<_>>(), "{algorithm:?}");
        // And never faster than the limit.
        let most = most_in_any_window(&inner.record.instants(), SECOND);
        let allowed = rolling_allowance(algorithm, 10);
        assert!(most <= allowed, "{algorithm:?}: {most} in one second");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_sleeps_until_its_exact_instant() {
    let inner = Inner::new();
    let mut svc = RateLimitLayer::new(quota(Algorithm::TokenBucket, 1, SECOND), GlobalKey)
        .with_max_wait(Duration::from_secs(5))
        .layer(inner.clone());
    svc.ready()
        .await
        .unwrap()
        .call(request("k", 0))
        .await
        .unwrap();
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 1)));
    assert_pending!(second.poll());
    time::advance(Duration::from_millis(999)).await;
    assert_pending!(second.poll());
    assert_eq!(inner.record.calls(), 1);
    time::advance(Duration::from_millis(1)).await;
    assert_ready_ok!(second.poll());
    assert_eq!(inner.record.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_wait_is_refused_at_arrival() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let layer = RateLimitLayer::new(
            quota(algorithm, 1, Duration::from_secs(60)),
            HeaderKey::new("x-key").unwrap(),
        );
        // A reject-mode service on the same limiter finds the next fixed-window
        // boundary (windows turn over at wall-clock minutes), so the test can
        // start on one and the next is a whole window away.
        let mut probe = layer.clone().layer(inner.clone());
        let mut svc = layer
            .with_max_wait(Duration::from_secs(10))
            .layer(inner.clone());
        probe
            .ready()
            .await
            .unwrap()
            .call(request("probe", 0))
            .await
            .unwrap();
        let err = probe
            .ready()
            .await
            .unwrap()
            .call(request("probe", 0))
            .await
            .unwrap_err();
        time::advance(err.downcast_ref::<RateLimited>().unwrap().retry_after).await;

        svc.ready()
            .await
            .unwrap()
            .call(request("k", 1))
            .await
            .unwrap();
        let before = Instant::now();
        svc.ready().await.unwrap();
        let mut refused = task::spawn(svc.call(request("k", 2)));
        // Ready on the first poll: no request waits only to be refused.
        let err = assert_ready!(refused.poll()).expect_err("needs more than max_wait");
        assert_eq!(Instant::now(), before);
        let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
        // A sliding window counter's previous window (holding `k`'s
        // admission) weighs until a whole window after it ended.
        let windows = if algorithm == Algorithm::SlidingWindowCounter {
            2
        } else {
            1
        };
        assert_eq!(
            limited.retry_after,
            Duration::from_secs(60 * windows),
            "{algorithm:?}"
        );
        assert_eq!(inner.record.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_waiters_never_let_the_rest_through_faster_than_the_limit() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let limit = 5;
        let layer = RateLimitLayer::new(
            quota(algorithm, limit, SECOND),
            HeaderKey::new("x-key").unwrap(),
        );
        // A reject-mode twin on the same limiter finds a window boundary.
        let mut probe = layer.clone().layer(Inner::new());
        let mut boundary = None;
        for _ in 0..=limit {
            if let Err(err) = probe.ready().await.unwrap().call(request("probe", 0)).await {
                let wait = err.downcast_ref::<RateLimited>().unwrap().retry_after;
                boundary = Some(support::boundary_of(
                    algorithm,
                    limit,
                    SECOND,
                    Instant::now() + wait,
                ));
                break;
            }
        }
        let boundary = boundary.expect("the probe key fills up");
        let mut svc = layer
            .with_max_wait(Duration::from_secs(100))
            .layer(inner.clone());
        let mut rng = Lcg(42);
        let mut tasks = Vec::new();
        let mut kept = Vec::new();
        // Arrivals keep coming while earlier waiters give up, so a slot
        // wrongly given back would be taken by a newcomer.
        for seq in 0..300 {
            // `sleep`, not `advance`: paused time then auto-advances timer by
            // timer, so each waiter runs at its own instant.
            time::sleep(Duration::from_millis(rng.next() % 150)).await;
            svc.ready().await.unwrap();
            let fut = svc.call(request("k", seq));
            if rng.next() % 2 == 0 {
                kept.push(seq);
                tasks.push(tokio::spawn(fut));
            } else {
                let patience = Duration::from_millis(rng.next() % 20_000);
                tokio::spawn(async move {
                    let _ = time::timeout(patience, fut).await;
                });
            }
        }
        for task in tasks {
            task.await.unwrap().expect("kept waiters are all admitted");
        }
        time::sleep(Duration::from_secs(200)).await;
        let order = inner.record.order();
        let admitted_kept: Vec<_> = order.iter().copied().filter(|s| kept.contains(s)).collect();
        assert_eq!(
            admitted_kept, kept,
            "{algorithm:?}: kept waiters out of order"
        );
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(
            sorted, order,
            "{algorithm:?}: admitted out of arrival order"
        );
        let instants = inner.record.instants();
        support::check_conformance(algorithm, limit, SECOND, boundary, &instants)
            .unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_last_waiter_gives_its_slot_back() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let mut svc = RateLimitLayer::new(quota(algorithm, 1, SECOND), GlobalKey)
            .with_max_wait(Duration::from_secs(10))
            .layer(inner.clone());
        svc.ready()
            .await
            .unwrap()
            .call(request("k", 0))
            .await
            .unwrap();
        svc.ready().await.unwrap();
        let mut second = task::spawn(svc.call(request("k", 1)));
        assert_pending!(second.poll());
        drop(second);
        // The freed slot goes to the next arrival: it is admitted as soon as
        // the first slot's time is up, not a whole slot later (for a
        // sliding window counter, the first slot's window weighs until a
        // window after it ended).
        svc.ready().await.unwrap();
        let start = Instant::now();
        svc.call(request("k", 2)).await.unwrap();
        let most = if algorithm == Algorithm::SlidingWindowCounter {
            2 * SECOND
        } else {
            SECOND
        };
        assert!(Instant::now() - start <= most, "{algorithm:?}");
        assert_eq!(inner.record.order(), vec![0, 2]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_that_opened_the_next_turn_leaves_the_running_turn_spent() {
    // One per turn, turns going stale after a second: the second request
    // waits for the next turn, which it opens. Dropped before it starts,
    // it gives its unit of that turn back, not one of the running turn,
    // which is still spent.
    let inner = Inner::new();
    let quota = Quota::per_turn(1)
        .unwrap()
        .with_stale_after(SECOND)
        .unwrap();
    let mut svc = RateLimitLayer::new(quota, GlobalKey)
        .with_max_wait(Duration::from_secs(10))
        .layer(inner.clone());
    svc.ready()
        .await
        .unwrap()
        .call(request("k", 0))
        .await
        .unwrap();
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 1)));
    assert_pending!(second.poll());
    drop(second);
    svc.ready().await.unwrap();
    let start = Instant::now();
    svc.call(request("k", 2)).await.unwrap();
    assert_eq!(Instant::now() - start, SECOND, "went in the spent turn");
    assert_eq!(inner.record.order(), vec![0, 2]);
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_is_polled_ready_again_after_the_wait() {
    let (mock, mut handle) = tower_test::mock::pair::<http::Request<()>, http::Response<()>>();
    let mut svc = RateLimitLayer::new(quota(Algorithm::TokenBucket, 1, SECOND), GlobalKey)
        .with_max_wait(Duration::from_secs(5))
        .layer(mock);
    handle.allow(1);
    svc.ready().await.unwrap();
    let first = tokio::spawn(svc.call(request("k", 0)));
    let (_, reply) = handle.next_request().await.unwrap();
    reply.send_response(http::Response::new(()));
    first.await.unwrap().unwrap();

    handle.allow(1);
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 1)));
    assert_pending!(second.poll());
    time::advance(SECOND).await;
    // Its turn has come, but the inner service has no capacity: it waits.
    assert_pending!(second.poll());
    handle.allow(1);
    assert_pending!(second.poll());
    let (req, reply) = handle.next_request().await.unwrap();
    assert_eq!(req.headers()["x-seq"], "1");
    reply.send_response(http::Response::new(()));
    assert_ready_ok!(second.poll());
}

#[tokio::test(start_paused = true)]
async fn keys_wait_independently() {
    let inner = Inner::new();
    let mut svc = RateLimitLayer::new(
        quota(Algorithm::SlidingWindow, 1, SECOND),
        HeaderKey::new("x-key").unwrap(),
    )
    .with_max_wait(Duration::from_secs(10))
    .layer(inner.clone());
    svc.ready()
        .await
        .unwrap()
        .call(request("a", 0))
        .await
        .unwrap();
    svc.ready().await.unwrap();
    let mut a = task::spawn(svc.call(request("a", 1)));
    assert_pending!(a.poll());
    // Key b does not queue behind key a.
    svc.ready()
        .await
        .unwrap()
        .call(request("b", 2))
        .await
        .unwrap();
    assert_eq!(inner.record.order(), vec![0, 2]);
    time::advance(SECOND).await;
    assert_ready_ok!(a.poll());
}

#[tokio::test(start_paused = true)]
async fn waiters_due_at_one_instant_reach_the_service_in_arrival_order() {
    // A fixed window opens for several waiters at one instant, and tokio does
    // not promise in which order timers due together wake their tasks: the
    // later waiter is polled first here, and must still wait for the
    // earlier. With one quota, and with two (decided together).
    let extra = Quota::per_second(1_000).expect("valid quota");
    for quotas in [vec![], vec![extra]] {
        let inner = Inner::new();
        let mut layer = RateLimitLayer::new(
            quota(Algorithm::FixedWindow, 3, SECOND),
            HeaderKey::new("x-key").unwrap(),
        )
        .with_max_wait(Duration::from_secs(10));
        for extra in &quotas {
            layer = layer.with_quota(*extra);
        }
        let mut svc = layer.layer(inner.clone());
        fill(&mut svc, 3).await;
        let mut waiters = Vec::new();
        for seq in 3..6 {
            svc.ready().await.unwrap();
            let mut waiter = task::spawn(svc.call(request("k", seq)));
            assert_pending!(waiter.poll());
            waiters.push(waiter);
        }
        let [mut first, mut second, third] = <[_; 3]>::try_from(waiters).ok().unwrap();
        // To the next window's first instant, where all three are due.
        until_woken(&first).await;
        assert!(second.is_woken() && third.is_woken());
        assert_pending!(
            second.poll(),
            "{} quotas: went before the first",
            quotas.len() + 1
        );
        assert_eq!(inner.record.calls(), 3);
        // The third gives up from behind: nobody is woken, nobody held up.
        drop(third);
        assert!(!second.is_woken());
        assert_ready_ok!(first.poll());
        assert!(second.is_woken(), "the first going wakes the next");
        assert_ready_ok!(second.poll());
        assert_eq!(inner.record.order(), vec![0, 1, 2, 3, 4]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_does_not_pass_a_waiter_whose_instant_has_come() {
    let inner = Inner::new();
    let mut svc = fixed_window(2, inner.clone());
    fill(&mut svc, 2).await;
    svc.ready().await.unwrap();
    let mut waiter = task::spawn(svc.call(request("k", 2)));
    assert_pending!(waiter.poll());
    // The next window opens with room for two: the waiter's instant has
    // come, but its task has not run yet when a newcomer arrives.
    until_woken(&waiter).await;
    svc.ready().await.unwrap();
    let mut newcomer = task::spawn(svc.call(request("k", 3)));
    assert_pending!(newcomer.poll(), "the newcomer passed the waiter");
    assert_ready_ok!(waiter.poll());
    assert!(newcomer.is_woken(), "the waiter going wakes the newcomer");
    assert_ready_ok!(newcomer.poll());
    assert_eq!(inner.record.order(), vec![0, 1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_never_polled_holds_up_the_next_for_a_moment_only() {
    // Response futures awaited out of order: the earlier waiter is never
    // polled while the later one is awaited. The later one gives way for a
    // moment (so the runtime can run a task it woke), not for ever.
    let inner = Inner::new();
    let mut svc = fixed_window(2, inner.clone());
    fill(&mut svc, 2).await;
    let started = Instant::now();
    svc.ready().await.unwrap();
    let first = svc.call(request("k", 2));
    svc.ready().await.unwrap();
    let second = svc.call(request("k", 3));
    time::timeout(Duration::from_secs(5), second)
        .await
        .expect("held up for ever by a waiter never polled")
        .unwrap();
    // Both were due at the next window (within a second), and the grace is
    // a small fraction of that.
    assert!(Instant::now() - started < SECOND + Duration::from_millis(100));
    first.await.unwrap();
    assert_eq!(inner.record.order(), vec![0, 1, 3, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_reset_key_admits_at_once_though_old_waiters_are_still_in_line() {
    let inner = Inner::new();
    let layer = RateLimitLayer::new(
        quota(Algorithm::TokenBucket, 1, Duration::from_secs(10)),
        HeaderKey::new("x-key").unwrap(),
    )
    .with_max_wait(Duration::from_secs(60));
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    fill(&mut svc, 1).await;
    svc.ready().await.unwrap();
    let mut waiter = task::spawn(svc.call(request("k", 1)));
    assert_pending!(waiter.poll());
    handle.reset(&["k"]);
    svc.ready().await.unwrap();
    let mut newcomer = task::spawn(svc.call(request("k", 2)));
    assert_ready_ok!(newcomer.poll(), "waited behind a waiter not yet due");
    assert_pending!(waiter.poll());
}

/// An inner service whose readiness fails while `fail` is set.
#[derive(Clone)]
struct ReadyFails {
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    inner: Inner,
}

impl Service<http::Request<()>> for ReadyFails {
    type Response = http::Response<()>;
    type Error = support::InnerFailed;
    type Future = <Inner as Service<http::Request<()>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Ready(Err(support::InnerFailed));
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<()>) -> Self::Future {
        self.inner.call(req)
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_service_fails_leaves_the_line_at_once() {
    let inner = Inner::new();
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = ReadyFails {
        fail: fail.clone(),
        inner: inner.clone(),
    };
    let mut svc = fixed_window(2, service);
    fill(&mut svc, 2).await;
    svc.ready().await.unwrap();
    let mut first = task::spawn(svc.call(request("k", 2)));
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 3)));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    until_woken(&first).await;
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = assert_ready!(first.poll()).expect_err("the inner service failed");
    assert!(err.is::<support::InnerFailed>(), "{err}");
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    // The failed one, still held, is out of the line: the next goes at once.
    assert_ready_ok!(second.poll());
    // Polled again, the failed one does not send its request.
    let again = assert_ready!(first.poll()).expect_err("polled after completion");
    assert!(
        again.to_string().contains("polled after completion"),
        "{again}"
    );
    assert_eq!(inner.record.order(), vec![0, 1, 3]);
}

#[tokio::test(start_paused = true)]
async fn behind_a_waiter_never_polled_the_others_still_go_in_order() {
    let inner = Inner::new();
    let mut svc = fixed_window(3, inner.clone());
    fill(&mut svc, 3).await;
    let mut waiters = Vec::new();
    for seq in 3..6 {
        svc.ready().await.unwrap();
        waiters.push(task::spawn(svc.call(request("k", seq))));
    }
    let [stuck, mut first, mut second] = <[_; 3]>::try_from(waiters).ok().unwrap();
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    until_woken(&first).await;
    // All three are due; `stuck` is never polled. Both others give way to
    // it for its grace, then wake together: the later one must still let
    // the earlier go first.
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    time::advance(Duration::from_millis(25)).await;
    assert_pending!(second.poll(), "went before the earlier waiter");
    assert_ready_ok!(first.poll());
    assert_ready_ok!(second.poll());
    assert_eq!(inner.record.order(), vec![0, 1, 2, 4, 5]);
    drop(stuck);
}

/// A token bucket of 1 per second alone, and with a looser second quota.
fn one_quota_and_two() -> [Vec<Quota>; 2] {
    let per_second = quota(Algorithm::TokenBucket, 1, SECOND);
    let per_minute = quota(Algorithm::TokenBucket, 10, Duration::from_secs(60));
    [vec![per_second], vec![per_second, per_minute]]
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_annotated_and_refunded_as_one_that_went_at_once() {
    // Response headers: a waiter's response says what remains when it goes,
    // as an immediate one's does (with one quota, and with several).
    for quotas in one_quota_and_two() {
        let mut svc = RateLimitLayer::with_quotas(quotas, GlobalKey)
            .with_max_wait(Duration::from_secs(5))
            .with_response_headers(RateLimitHeaders::ietf())
            .layer(Inner::new());
        fill(&mut svc, 1).await;
        svc.ready().await.unwrap();
        let mut waiter = task::spawn(svc.call(request("k", 1)));
        assert_pending!(waiter.poll());
        time::advance(SECOND).await;
        let response = assert_ready_ok!(waiter.poll());
        let remaining = response.headers().get("ratelimit").expect("annotated");
        assert_eq!(remaining, r#""(default)";r=0;t=1"#);
    }

    // A classifier: a waiter whose outcome does not count gives its slot
    // back once it has gone, so the next request goes at once.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // The first call succeeds, every later one fails.
    let inner = tower::service_fn(move |_req: http::Request<()>| {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(match n {
            0 => Ok(http::Response::new(())),
            _ => Err(support::InnerFailed),
        })
    });
    let mut svc = RateLimitLayer::new(quota(Algorithm::TokenBucket, 1, SECOND), GlobalKey)
        .with_max_wait(Duration::from_secs(5))
        .count_only(|outcome: &Result<http::Response<()>, support::InnerFailed>| outcome.is_ok())
        .layer(inner);
    fill(&mut svc, 1).await;
    svc.ready().await.unwrap();
    let mut waiter = task::spawn(svc.call(request("k", 1)));
    assert_pending!(waiter.poll());
    time::advance(SECOND).await;
    let err = assert_ready!(waiter.poll()).expect_err("the inner service failed");
    assert!(err.is::<support::InnerFailed>(), "{err}");
    svc.ready().await.unwrap();
    let mut next = task::spawn(svc.call(request("k", 2)));
    let outcome = assert_ready!(next.poll(), "waited: the failed waiter kept its slot");
    assert!(
        outcome.is_err(),
        "the inner service fails from its second call"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn in_a_dry_run_a_request_that_would_wait_goes_at_once_and_says_so() {
    for quotas in one_quota_and_two() {
        let inner = Inner::new();
        let mut svc = RateLimitLayer::with_quotas(quotas, GlobalKey)
            .with_max_wait(Duration::from_secs(5))
            .with_dry_run(true)
            .with_response_headers(RateLimitHeaders::ietf())
            .layer(inner.clone());
        fill(&mut svc, 1).await;
        svc.ready().await.unwrap();
        let mut would_wait = task::spawn(svc.call(request("k", 1)));
        let response = assert_ready_ok!(would_wait.poll(), "waited in a dry run");
        assert_eq!(inner.record.calls(), 2);
        // It went now, so its headers speak from now: the key is whole again
        // in two seconds (its own booking was a second out).
        let remaining = response.headers().get("ratelimit").expect("annotated");
        assert_eq!(remaining, r#""(default)";r=0;t=2"#);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_wait_does_not_queue_behind_due_waiters() {
    // One limiter, two layers: one waits, one refuses. At a fixed window's
    // start a waiter is due (its task has not run yet) and the window has
    // room for more: the request that cannot wait goes at once, past the
    // waiter, rather than queue behind it.
    let refusing = RateLimitLayer::new(Quota::per_second(3).unwrap().fixed_window(), GlobalKey);
    let waiting = refusing.clone().with_max_wait(2 * SECOND);
    let inner = Inner::new();
    let mut refuse = refusing.layer(inner.clone());
    let mut wait = waiting.layer(inner.clone());
    fill(&mut refuse, 3).await;
    wait.ready().await.unwrap();
    let mut waiter = task::spawn(wait.call(request("k", 3)));
    assert_pending!(waiter.poll());
    until_woken(&waiter).await;
    refuse.ready().await.unwrap();
    let mut now = task::spawn(refuse.call(request("k", 4)));
    assert_ready_ok!(now.poll(), "queued behind a due waiter");
    assert_ready_ok!(waiter.poll());
}
