//! FairQueueLayer around a waiting rate limiter: callers' requests take
//! turns at the limiter's pace, each caller's in its own order.

// Instants compared exactly: the limiter's clock as `test-util` makes it.
#![cfg(feature = "test-util")]

#[path = "support/lanes.rs"]
mod lanes;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_throttle::error::{QueueFull, QueueTimeout, RateLimited};
use tower_throttle::fair::{FairQueueLayer, PassTurnLayer, Turn};
use tower_throttle::key::{GlobalKey, HeaderKey};

use lanes::{request, spawn};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

const SECOND: Duration = Duration::from_secs(1);

/// Each call: `client/n`, and when (since the test began).
type Calls = Arc<Mutex<Vec<(String, Duration)>>>;

/// One a second, waited for up to `max_wait`, in a fair queue by
/// `x-client` of at most `max_queue`; the inner service records its calls
/// and whether a turn reached it (it must not: the marker passed it).
fn stack(
    calls: &Calls,
    max_wait: Duration,
    max_queue: usize,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Future<Output = Result<http::Response<()>, BoxError>> + Send,
> + Clone
+ Send
+ 'static {
    stack_with(
        calls,
        max_wait,
        FairQueueLayer::new(GlobalKey, HeaderKey::new("x-client").expect("valid"))
            .with_max_queue(max_queue),
    )
}

fn stack_with(
    calls: &Calls,
    max_wait: Duration,
    fair: FairQueueLayer<GlobalKey, HeaderKey>,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Future<Output = Result<http::Response<()>, BoxError>> + Send,
> + Clone
+ Send
+ 'static {
    let calls = calls.clone();
    let start = Instant::now();
    ServiceBuilder::new()
        .layer(fair)
        .layer(
            RateLimitLayer::new(Quota::per_second(1).expect("valid"), GlobalKey)
                .with_max_wait(max_wait),
        )
        .layer(PassTurnLayer::new())
        .service(tower::service_fn(move |req: http::Request<()>| {
            assert!(req.extensions().get::<Turn>().is_none(), "the turn passed");
            let header = |name| {
                req.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            calls.lock().push((
                format!("{}/{}", header("x-client"), header("x-n")),
                start.elapsed(),
            ));
            std::future::ready(Ok::<_, Infallible>(http::Response::new(())))
        }))
}

/// A caller with 50 waiting, another's one: the second goes right after
/// the first's request holding the turn, not after all 50; the limiter's
/// pace is one a second throughout, and the first's go in order.
#[tokio::test(start_paused = true)]
async fn a_callers_request_waits_one_turn_behind_another_callers_50() {
    let calls = Calls::default();
    let svc = stack(&calls, Duration::from_secs(3_600), usize::MAX);
    let mut tasks = Vec::new();
    for n in 0..50 {
        tasks.push(spawn(&svc, request("flood", n)).await);
    }
    tasks.push(spawn(&svc, request("single", 0)).await);
    for task in tasks {
        task.await.expect("no panic").expect("served");
    }
    let calls = calls.lock();
    let names: Vec<&str> = calls.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[..4], ["flood/0", "flood/1", "single/0", "flood/2"]);
    let flood: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("flood/"))
        .collect();
    let in_order: Vec<String> = (0..50).map(|n| format!("flood/{n}")).collect();
    assert_eq!(flood, in_order);
    // One a second, from the first: the limiter's pace, unchanged.
    for (i, (name, at)) in calls.iter().enumerate() {
        assert_eq!(*at, SECOND * i as u32, "{name}");
    }
}

/// A request the limiter refuses passes its turn on: the next one is
/// judged at once.
#[tokio::test(start_paused = true)]
async fn a_refused_request_passes_its_turn() {
    let calls = Calls::default();
    let mut svc = stack(&calls, Duration::ZERO, usize::MAX);
    svc.ready()
        .await
        .expect("ready")
        .call(request("a", 0))
        .await
        .expect("the first goes");
    for n in 1..4 {
        let refused = svc
            .ready()
            .await
            .expect("ready")
            .call(request("b", n))
            .await
            .expect_err("over the limit");
        assert!(refused.is::<RateLimited>(), "{refused}");
    }
    assert_eq!(calls.lock().len(), 1);
}

/// A full fair queue pushes out the flood's newest for another caller.
#[tokio::test(start_paused = true)]
async fn a_full_queue_makes_room_for_another_caller() {
    let calls = Calls::default();
    let svc = stack(&calls, Duration::from_secs(3_600), 2);
    let mut flood = Vec::new();
    // The first goes, the second holds the turn, two wait.
    for n in 0..4 {
        flood.push(spawn(&svc, request("flood", n)).await);
    }
    let single = spawn(&svc, request("single", 0)).await;
    single.await.expect("no panic").expect("served");
    let mut outcomes = Vec::new();
    for task in flood {
        outcomes.push(task.await.expect("no panic"));
    }
    let pushed_out = outcomes.pop().expect("four").expect_err("pushed out");
    assert!(pushed_out.is::<QueueFull>(), "{pushed_out}");
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let names: Vec<String> = calls.lock().iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(names, ["flood/0", "flood/1", "single/0", "flood/2"]);
}

/// A waiter dropped from the fair queue leaves it: the next goes in its
/// place, at the limiter's pace.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue() {
    let calls = Calls::default();
    let svc = stack(&calls, Duration::from_secs(3_600), usize::MAX);
    let first = spawn(&svc, request("a", 0)).await;
    let second = spawn(&svc, request("a", 1)).await;
    let dropped = spawn(&svc, request("a", 2)).await;
    let last = spawn(&svc, request("a", 3)).await;
    dropped.abort();
    for task in [first, second, last] {
        task.await.expect("no panic").expect("served");
    }
    let calls = calls.lock();
    assert_eq!(
        *calls,
        [
            ("a/0".to_owned(), Duration::ZERO),
            ("a/1".to_owned(), SECOND),
            ("a/3".to_owned(), SECOND * 2)
        ]
    );
}

/// With a `max_wait`, a request whose wait could be longer (its place in
/// its lane times the lanes waiting, at the pace turns pass) is refused
/// at once; another caller's, whose turn comes sooner, waits.
#[tokio::test(start_paused = true)]
async fn a_wait_that_could_pass_max_wait_is_refused_at_once() {
    let calls = Calls::default();
    let fair = FairQueueLayer::new(GlobalKey, HeaderKey::new("x-client").expect("valid"))
        .with_max_wait(Duration::from_millis(2_500));
    let svc = stack_with(&calls, Duration::from_secs(3_600), fair);
    // One a second: the first goes, the next three wait their turns, and
    // the pace is learned.
    let mut first = Vec::new();
    for n in 0..4 {
        first.push(spawn(&svc, request("a", n)).await);
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // a/3 holds the turn (it goes at 3 s); a/4 would wait one turn, a/5
    // two, a/6 three: more than 2.5 s. (Lanes that start waiting later
    // may add a turn each: b/0 below.)
    let a4 = spawn(&svc, request("a", 4)).await;
    let a5 = spawn(&svc, request("a", 5)).await;
    let started = Instant::now();
    let refused = svc
        .clone()
        .oneshot(request("a", 6))
        .await
        .expect_err("too long");
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once");
    let refused = refused.downcast::<RateLimited>().expect("a refusal");
    assert_eq!(refused.retry_after, SECOND * 3);
    // Another caller's: two lanes, its first place: two turns at most.
    let b0 = spawn(&svc, request("b", 0)).await;
    for task in first.into_iter().chain([a4, a5, b0]) {
        task.await.expect("no panic").expect("served");
    }
    let names: Vec<String> = calls.lock().iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(names, ["a/0", "a/1", "a/2", "a/3", "b/0", "a/4", "a/5"]);
}

/// Until a key's pace is known, `max_wait` bounds the wait itself.
#[tokio::test(start_paused = true)]
async fn before_the_pace_is_known_max_wait_bounds_the_wait() {
    let calls = Calls::default();
    let fair = FairQueueLayer::new(GlobalKey, HeaderKey::new("x-client").expect("valid"))
        .with_max_wait(Duration::from_millis(2_500));
    let svc = stack_with(&calls, Duration::from_secs(3_600), fair);
    let mut tasks = Vec::new();
    for n in 0..6 {
        tasks.push(spawn(&svc, request("a", n)).await);
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("no panic"));
    }
    // a/0 at once, a/1..a/3 took their turns within 2.5 s; a/4 and a/5
    // gave up at 2.5 s.
    for outcome in &outcomes[..4] {
        assert!(outcome.is_ok(), "{outcomes:?}");
    }
    for outcome in &outcomes[4..] {
        let error = outcome.as_ref().expect_err("gave up");
        assert!(error.is::<QueueTimeout>(), "{error}");
    }
}

mod generated {
    //! Over generated arrivals: each caller's requests reach the inner
    //! service in their order, the limiter's quota holds in every window,
    //! and while a request waits each other caller is served at most once
    //! per turn of its own.

    use super::*;
    use proptest::prelude::*;

    /// An arrival: `after_ms` after the one before, from caller `lane`.
    fn arrivals() -> impl Strategy<Value = Vec<(u64, u8)>> {
        prop::collection::vec((prop_oneof![Just(0u64), 0..1_500u64], 0..4u8), 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn callers_keep_their_order_and_the_quota_holds(arrivals in arrivals()) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("a runtime");
            let calls = runtime.block_on(async {
                let calls = Calls::default();
                let svc = stack(&calls, Duration::from_secs(3_600), usize::MAX);
                let mut tasks = Vec::new();
                for (n, &(after_ms, lane)) in arrivals.iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    tasks.push(spawn(&svc, request(&format!("c{lane}"), n)).await);
                }
                for task in tasks {
                    task.await.expect("no panic").expect("served");
                }
                std::mem::take(&mut *calls.lock())
            });
            prop_assert_eq!(calls.len(), arrivals.len());
            // One a second with a burst of one: calls at least a second apart.
            for pair in calls.windows(2) {
                prop_assert!(pair[1].1 - pair[0].1 >= SECOND, "{:?}", calls);
            }
            // Each caller's in their order.
            let order: Vec<(String, usize)> = calls
                .iter()
                .map(|(name, _)| {
                    let (client, n) = name.split_once('/').expect("client/n");
                    (client.to_owned(), n.parse().expect("a number"))
                })
                .collect();
            for lane in 0..4u8 {
                let mine: Vec<usize> = order
                    .iter()
                    .filter(|(c, _)| *c == format!("c{lane}"))
                    .map(|(_, n)| *n)
                    .collect();
                prop_assert!(mine.windows(2).all(|w| w[0] < w[1]), "c{}: {:?}", lane, mine);
            }
            // Between a request's arrival and its call, each other caller
            // is served at most once per turn of its own caller ahead of
            // it (its own requests served from its arrival on), plus one:
            // a round each, however many that caller had waiting.
            let mut arrived = Vec::new();
            let mut at = Duration::ZERO;
            for &(after_ms, _) in &arrivals {
                at += Duration::from_millis(after_ms);
                arrived.push(at);
            }
            for (i, (client, n)) in order.iter().enumerate() {
                let own_ahead = order[..i]
                    .iter()
                    .zip(&calls)
                    .filter(|((c, _), (_, served))| c == client && *served >= arrived[*n])
                    .count();
                for other in (0..4u8).map(|o| format!("c{o}")).filter(|o| o != client) {
                    let passed = order[..i]
                        .iter()
                        .zip(&calls)
                        // Called at its arrival's instant: before it came.
                        .filter(|((c, _), (_, served))| *c == other && *served > arrived[*n])
                        .count();
                    prop_assert!(
                        passed <= own_ahead + 1,
                        "{}/{} passed {} times by {} ({} of its own ahead): {:?}",
                        client, n, passed, other, own_ahead, order
                    );
                }
            }
        }
    }
}
