//! The rate limiter's conformance scenarios again, with its state in Redis
//! and two limiter instances standing for two replicas. Each test starts a
//! `redis-server` of its own (see `support/redis.rs`).
//!
//! Exact `retry_after` needs a clock that stands still between two
//! requests: those tests give the scripts a clock of their own
//! (`with_test_clock`), which they move by hand, in place of Redis's
//! `TIME`. The others run on Redis's clock.

#![cfg(all(feature = "test-util", feature = "redis"))]

use testkit::redis as redis_server;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use support::{ALGORITHMS, Inner, quota, request};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, CostTooHigh, RateLimited};
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Algorithm, Quota, RateLimitLayer, Unit};
use tower_throttle::redis::{OnError, RedisStore};

const MINUTE: Duration = Duration::from_secs(60);
const US: Duration = Duration::from_micros(1);
const HASH_KEY: &str = "a test's hash key";

/// A store on `server` under `prefix`, failing closed (so that a slow
/// answer shows as an error, never as a silent local decision), on the
/// scripts' `clock` when given.
fn store(server: &RedisServer, prefix: &str, clock: Option<&Clock>) -> RedisStore {
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed)
        .with_hash_key(HASH_KEY)
        .expect("valid hash key");
    match clock {
        Some(clock) => store.with_test_clock(clock.0.clone()),
        None => store,
    }
}

/// The scripts' clock, moved by hand: microseconds since the epoch,
/// starting on a whole minute (a fixed window's boundary).
#[derive(Clone)]
struct Clock(Arc<AtomicU64>);

impl Clock {
    fn new() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as u64;
        let minute = 60_000_000;
        Self(Arc::new(AtomicU64::new((now / minute + 1) * minute)))
    }

    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

fn header_key() -> HeaderKey {
    HeaderKey::new("x-key").expect("valid header name")
}

async fn send<S>(svc: &mut S, key: &str, seq: usize) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request(key, seq)).await
}

fn refusal(err: &BoxError) -> &RateLimited {
    err.downcast_ref::<RateLimited>()
        .unwrap_or_else(|| panic!("expected RateLimited, got {err}"))
}

fn retry_after(err: &BoxError) -> Duration {
    refusal(err).retry_after
}

#[tokio::test]
async fn hundred_callers_over_two_replicas_admit_exactly_seven() {
    let Some(server) = RedisServer::start("hundred_callers_over_two_replicas") else {
        return;
    };
    for algorithm in ALGORITHMS {
        // Fixed windows on a clock that stands still: on Redis's, a window
        // could turn over during the test.
        let clock = (algorithm == Algorithm::FixedWindow).then(Clock::new);
        let prefix = format!("hundred:{algorithm:?}:");
        let inner = Inner::new();
        let replicas: Vec<_> = (0..2)
            .map(|_| {
                RateLimitLayer::new(quota(algorithm, 7, MINUTE), GlobalKey)
                    .with_store(store(&server, &prefix, clock.as_ref()))
                    .expect("a quota Redis keeps")
                    .layer(inner.clone())
            })
            .collect();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let svc = replicas[i % 2].clone();
                tokio::spawn(async move { svc.oneshot(request("k", i)).await })
            })
            .collect();
        let (mut admitted, mut limited) = (0, 0);
        for task in tasks {
            match task.await.expect("task ran") {
                Ok(_) => admitted += 1,
                Err(err) if err.is::<RateLimited>() => limited += 1,
                Err(err) => panic!("{algorithm:?}: unexpected error {err}"),
            }
        }
        assert_eq!((admitted, limited), (7, 93), "{algorithm:?}");
        assert_eq!(inner.record.calls(), 7, "{algorithm:?}");
    }
}

/// Fill the key first, then: the refusal's `retry_after` (on replica `b`)
/// is the exact instant the key admits again: one microsecond before,
/// still refused; at it, admitted.
async fn assert_retry_after_exact<S>(a: &mut S, b: &mut S, clock: &Clock, expected: Duration)
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    let err = send(b, "k", 0).await.expect_err("key is full");
    assert_eq!(retry_after(&err), expected);
    clock.advance(expected - US);
    let err = send(a, "k", 0).await.expect_err("one µs early");
    assert_eq!(retry_after(&err), US);
    clock.advance(US);
    send(a, "k", 0).await.expect("admitted on the instant");
}

#[tokio::test]
async fn retry_after_is_exact_across_replicas_for_each_algorithm() {
    let Some(server) = RedisServer::start("retry_after_is_exact") else {
        return;
    };
    let replicas = |q: Quota, prefix: &str, clock: &Clock| {
        let make = || {
            RateLimitLayer::new(q, GlobalKey)
                .with_store(store(&server, prefix, Some(clock)))
                .expect("a quota Redis keeps")
                .layer(Inner::new())
        };
        (make(), make())
    };

    // Token bucket, 6 per minute: one unit every 10 s. After the burst and
    // 3.5 s, the next unit is 6.5 s away.
    let clock = Clock::new();
    let (mut a, mut b) = replicas(quota(Algorithm::TokenBucket, 6, MINUTE), "tb:", &clock);
    for i in 0..6 {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        send(svc, "k", i).await.expect("burst");
    }
    clock.advance(Duration::from_millis(3_500));
    assert_retry_after_exact(&mut a, &mut b, &clock, Duration::from_millis(6_500)).await;

    // Sliding window, 3 per minute, admissions at 0, 10 s and 20 s: at 25 s
    // the oldest leaves the window 35 s later.
    let clock = Clock::new();
    let (mut a, mut b) = replicas(quota(Algorithm::SlidingWindow, 3, MINUTE), "sw:", &clock);
    for (i, pause) in [10, 10, 5].into_iter().enumerate() {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        send(svc, "k", i).await.expect("admitted");
        clock.advance(Duration::from_secs(pause));
    }
    assert_retry_after_exact(&mut a, &mut b, &clock, Duration::from_secs(35)).await;

    // Fixed window, 3 per minute from a boundary, 20 s in: 40 s to the next.
    let clock = Clock::new();
    let (mut a, mut b) = replicas(quota(Algorithm::FixedWindow, 3, MINUTE), "fw:", &clock);
    clock.advance(Duration::from_secs(20));
    for i in 0..3 {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        send(svc, "k", i).await.expect("admitted");
    }
    assert_retry_after_exact(&mut a, &mut b, &clock, Duration::from_secs(40)).await;
    // After the boundary the whole window is there again, and no more.
    send(&mut b, "k", 1).await.expect("new window");
    send(&mut a, "k", 2).await.expect("new window");
    let err = send(&mut b, "k", 3).await.expect_err("full again");
    assert_eq!(retry_after(&err), MINUTE);

    // Budget per turn, 2 per turn going stale after a minute.
    let clock = Clock::new();
    let turns = Quota::per_turn(2)
        .and_then(|q| q.with_stale_after(MINUTE))
        .expect("valid quota");
    let (mut a, mut b) = replicas(turns, "turn:", &clock);
    send(&mut a, "k", 0).await.expect("first of the turn");
    clock.advance(Duration::from_secs(15));
    send(&mut b, "k", 1).await.expect("second of the turn");
    assert_retry_after_exact(&mut a, &mut b, &clock, Duration::from_secs(45)).await;
}

#[tokio::test]
async fn token_bucket_on_redis_refills_at_rate_and_recovers_its_burst() {
    let Some(server) = RedisServer::start("token_bucket_on_redis") else {
        return;
    };
    let clock = Clock::new();
    // 10 per second with a burst of 4: one unit every 100 ms.
    let q = Quota::per_second(10)
        .and_then(|q| q.with_burst(4))
        .expect("valid quota");
    let make = || {
        RateLimitLayer::new(q, GlobalKey)
            .with_store(store(&server, "gcra:", Some(&clock)))
            .expect("a quota Redis keeps")
            .layer(Inner::new())
    };
    let (mut a, mut b) = (make(), make());
    for i in 0..4 {
        let svc = if i % 2 == 0 { &mut a } else { &mut b };
        send(svc, "k", i).await.expect("burst");
    }
    let err = send(&mut a, "k", 4).await.expect_err("burst spent");
    assert_eq!(retry_after(&err), Duration::from_millis(100));
    for i in 0..5 {
        clock.advance(Duration::from_millis(100));
        send(&mut b, "k", i).await.expect("refilled unit");
        assert!(
            send(&mut a, "k", i).await.is_err(),
            "more than one unit per 100 ms"
        );
    }
    // Idle far longer than a refill: the burst is back, and never more.
    clock.advance(Duration::from_secs(3_600));
    for i in 0..4 {
        send(&mut a, "k", i).await.expect("full burst after idle");
    }
    assert!(send(&mut b, "k", 9).await.is_err(), "burst exceeded");
}

#[tokio::test]
async fn several_quotas_on_redis_admit_only_together_and_a_refusal_takes_nothing() {
    let Some(server) = RedisServer::start("several_quotas_on_redis") else {
        return;
    };
    let clock = Clock::new();
    let per_second = Quota::per_second(2).expect("valid");
    let per_minute = Quota::per_minute(3).expect("valid").sliding_window();
    let make = || {
        RateLimitLayer::with_quotas(vec![per_second, per_minute], GlobalKey)
            .with_store(store(&server, "multi:", Some(&clock)))
            .expect("quotas Redis keeps")
            .layer(Inner::new())
    };
    let (mut a, mut b) = (make(), make());
    send(&mut a, "k", 0).await.expect("1");
    send(&mut b, "k", 1).await.expect("2");
    // The per-second bucket refuses, and names itself; the per-minute
    // window is not charged for it, however often it happens.
    for _ in 0..5 {
        let err = send(&mut a, "k", 2).await.expect_err("per second");
        assert_eq!(refusal(&err).quota, Some(per_second));
        assert_eq!(refusal(&err).retry_after, Duration::from_millis(500));
    }
    clock.advance(Duration::from_secs(1));
    send(&mut b, "k", 3).await.expect("third of the minute");
    // Now the window refuses, with the time until its oldest leaves.
    let err = send(&mut a, "k", 4).await.expect_err("per minute");
    assert_eq!(refusal(&err).quota, Some(per_minute));
    assert_eq!(refusal(&err).retry_after, Duration::from_secs(59));
    // The refusal took nothing from the bucket: it has its burst of 2.
    clock.advance(Duration::from_secs(59));
    send(&mut a, "k", 5).await.expect("bucket full");
    send(&mut b, "k", 6).await.expect("bucket full");
}

#[tokio::test]
async fn costs_above_one_are_charged_on_redis() {
    let Some(server) = RedisServer::start("costs_above_one") else {
        return;
    };
    let clock = Clock::new();
    let cost = |req: &http::Request<()>| -> u32 {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let mut svc = RateLimitLayer::new(quota(Algorithm::SlidingWindow, 10, MINUTE), GlobalKey)
        .with_store(store(&server, "cost:", Some(&clock)))
        .expect("a quota Redis keeps")
        .with_cost(cost)
        .layer(Inner::new());
    let costly = |n: u32| {
        http::Request::builder()
            .header("x-cost", n.to_string())
            .body(())
            .expect("valid request")
    };
    svc.ready()
        .await
        .unwrap()
        .call(costly(4))
        .await
        .expect("4 of 10");
    clock.advance(Duration::from_secs(1));
    svc.ready()
        .await
        .unwrap()
        .call(costly(4))
        .await
        .expect("8 of 10");
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(costly(4))
        .await
        .unwrap_err();
    // The first booking (4) must leave before 4 more fit.
    assert_eq!(retry_after(&err), Duration::from_secs(59));
    svc.ready()
        .await
        .unwrap()
        .call(costly(2))
        .await
        .expect("10 of 10");
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(costly(11))
        .await
        .unwrap_err();
    assert!(err.is::<CostTooHigh>(), "{err}");
}

#[tokio::test]
async fn redis_keys_carry_no_key_text_one_hash_tag_and_a_ttl() {
    let Some(server) = RedisServer::start("redis_keys_carry_no_key_text") else {
        return;
    };
    let quotas = vec![
        Quota::per_minute(5).expect("valid"),
        Quota::per_hour(50).expect("valid").sliding_window(),
        Quota::per_hour(50).expect("valid").fixed_window(),
    ];
    let mut svc = RateLimitLayer::with_quotas(quotas, header_key())
        .with_store(store(&server, "names:", None))
        .expect("quotas Redis keeps")
        .layer(Inner::new());
    send(&mut svc, "10.1.2.3", 0).await.expect("admitted");
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    // A bucket, a window (its bookings and figures in one set), a counter
    // (no rule marker: without rules no key can move between them).
    assert_eq!(keys.len(), 3, "{keys:?}");
    let tag = keys[0]
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag.to_owned())
        .expect("a hash tag");
    assert_eq!(tag.len(), 32, "128 bits in hex: {tag}");
    for key in &keys {
        assert!(key.starts_with("names:{"), "{key}");
        assert!(
            key.contains(&format!("{{{tag}}}")),
            "one slot for all: {key}"
        );
        assert!(!key.contains("10.1.2.3"), "key text in a name: {key}");
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    // The longest lives an hour and two seconds at most (a window's set
    // holds one to two seconds past its latest booking's expiry).
    let most: i64 = keys
        .iter()
        .map(|k| {
            redis::cmd("PTTL")
                .arg(k)
                .query::<i64>(&mut conn)
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    assert!(most <= 3_602_000, "{most}");
}

#[tokio::test]
async fn waiters_on_two_replicas_go_in_order_and_never_before_their_booked_instant() {
    let Some(server) = RedisServer::start("waiters_on_two_replicas") else {
        return;
    };
    let window = quota(Algorithm::SlidingWindow, 3, Duration::from_millis(200));
    // Counting cost (the whole script) and requests (its short form).
    waiters_go_in_order(&server, "wait:", window).await;
    waiters_go_in_order(&server, "wait-requests:", window.with_unit(Unit::Requests)).await;
}

async fn waiters_go_in_order(server: &RedisServer, prefix: &str, window: Quota) {
    // A sliding window of 3 per 200 ms on a clock that stands still: the
    // nine waiters are booked at 0, 0, 0, 200, 200, 200, 400, 400, 400 ms.
    let clock = Clock::new();
    let inner = Inner::new();
    let make = || {
        RateLimitLayer::new(window, GlobalKey)
            .with_store(store(server, prefix, Some(&clock)))
            .expect("a quota Redis keeps")
            .with_max_wait(Duration::from_secs(2))
            .layer(inner.clone())
    };
    let start = tokio::time::Instant::now();
    // Each replica's requests are sent in their order: `join_all` polls
    // them in order, and one connection keeps it.
    let run = |seqs: Vec<usize>| {
        let svc = make();
        async move {
            let calls = seqs
                .into_iter()
                .map(|seq| svc.clone().oneshot(request("k", seq)));
            futures::future::join_all(calls).await
        }
    };
    let (a, b) = tokio::join!(run(vec![0, 2, 4, 6, 8]), run(vec![1, 3, 5, 7, 9]));
    let outcomes: Vec<_> = a.into_iter().chain(b).collect();
    // Ten asked, nine fit in 2 s: 0, 200, 400 ms (three each); the tenth
    // would go at 600 ms. All within the wait allowed.
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let order = inner.record.order();
    for parity in [0, 1] {
        let mine: Vec<_> = order.iter().filter(|&&s| s % 2 == parity).collect();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "a replica's waiters out of order: {order:?}"
        );
    }
    let mut went: Vec<Duration> = inner.record.instants().iter().map(|&t| t - start).collect();
    went.sort();
    let booked = [0, 0, 0, 200, 200, 200, 400, 400, 400, 600].map(Duration::from_millis);
    for (i, (went, booked)) in went.iter().zip(booked).enumerate() {
        assert!(
            *went >= booked,
            "admission #{i} went at {went:?}, before its instant {booked:?}"
        );
    }
}

#[tokio::test]
async fn a_dry_run_on_redis_admits_all_and_counts_what_it_would_refuse() {
    let Some(server) = RedisServer::start("a_dry_run_on_redis") else {
        return;
    };
    let clock = Clock::new();
    let layer = RateLimitLayer::new(quota(Algorithm::SlidingWindow, 2, MINUTE), GlobalKey)
        .with_store(store(&server, "dry:", Some(&clock)))
        .expect("a quota Redis keeps")
        .with_dry_run(true);
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    for i in 0..5 {
        send(&mut svc, "k", i).await.expect("a dry run admits");
    }
    let stats = handle.stats().aggregate;
    assert_eq!((stats.admitted, stats.would_reject), (5, 3));
    // Switched to enforcing, the same key is refused: the two it admitted
    // for real are booked in Redis, the three it would have refused not.
    handle.set_dry_run(false);
    let err = send(&mut svc, "k", 5).await.expect_err("enforced");
    assert_eq!(retry_after(&err), MINUTE);
}

#[tokio::test]
async fn a_retune_on_one_replica_mints_no_capacity_on_either() {
    let Some(server) = RedisServer::start("a_retune_on_one_replica") else {
        return;
    };
    let clock = Clock::new();
    let make = || {
        RateLimitLayer::new(Quota::per_minute(10).expect("valid"), GlobalKey)
            .with_store(store(&server, "retune:", Some(&clock)))
            .expect("a quota Redis keeps")
    };
    let (a, b) = (make(), make());
    let handle_a = a.handle();
    let (mut a, mut b) = (a.layer(Inner::new()), b.layer(Inner::new()));
    for i in 0..10 {
        send(&mut a, "k", i).await.expect("burst");
    }
    // Twice the rate and the burst on replica a: the spent bucket stays
    // spent, one unit (3 s at the new rate) away.
    handle_a
        .retune(vec![Quota::per_minute(20).expect("valid")], Vec::new())
        .expect("valid retune");
    let err = send(&mut a, "k", 10).await.expect_err("still spent");
    assert_eq!(retry_after(&err), Duration::from_secs(3));
    // Replica b, still on the old quota, reads the state back under it:
    // spent too, one unit (6 s) away.
    let err = send(&mut b, "k", 11).await.expect_err("still spent");
    assert_eq!(retry_after(&err), Duration::from_secs(6));
    // A quota finer than Redis keeps time is refused, naming it.
    let err = handle_a
        .retune(vec![Quota::per_second(20_000).expect("valid")], Vec::new())
        .expect_err("too fine");
    assert_eq!(err.field, "quotas[0].quota");
}

/// Send through a fresh replica (its own cache of refused keys) until
/// `done` says yes; a hang guard of 5 s.
async fn until<F>(make: impl Fn() -> F, done: impl Fn(Result<(), Duration>) -> bool)
where
    F: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut svc = make();
        let outcome = send(&mut svc, "k", 0)
            .await
            .map(|_| ())
            .map_err(|e| retry_after(&e));
        if done(outcome) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened; last {outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn capacity_comes_back_on_redis_when_an_outcome_does_not_count_or_a_waiter_leaves() {
    let Some(server) = RedisServer::start("capacity_comes_back_on_redis") else {
        return;
    };
    for algorithm in ALGORITHMS {
        capacity_comes_back(&server, quota(algorithm, 1, MINUTE)).await;
    }
    // A window counting requests: the short script's bookings.
    let requests = quota(Algorithm::SlidingWindow, 1, MINUTE).with_unit(Unit::Requests);
    capacity_comes_back(&server, requests).await;
}

async fn capacity_comes_back(server: &RedisServer, one: Quota) {
    // A window starting on the clock's minute: a fixed window's next one is
    // a minute on, as the others' next slot.
    let clock = Clock::new();
    let algorithm = one.algorithm();
    let prefix = format!("back:{algorithm:?}:{:?}:", one.unit());
    let one = || one;
    let probe = || {
        RateLimitLayer::new(one(), GlobalKey)
            .with_store(store(server, &prefix, Some(&clock)))
            .expect("a quota Redis keeps")
            .layer(Inner::new())
    };
    // Only successes count; this one fails.
    let mut failing = RateLimitLayer::new(one(), GlobalKey)
        .with_store(store(server, &prefix, Some(&clock)))
        .expect("a quota Redis keeps")
        .count_only(|outcome: &Result<http::Response<()>, support::InnerFailed>| outcome.is_ok())
        .layer(Inner::failing());
    let err = send(&mut failing, "k", 0).await.expect_err("inner fails");
    assert!(err.is::<support::InnerFailed>(), "{err}");
    until(probe, |outcome| outcome.is_ok()).await;

    // The window is full now (the probe's admission). A waiter books the
    // next slot, a minute on, and leaves: its slot comes back. (A sliding
    // window counter of one: the probe's window weighs until two minutes
    // on, where the waiter books; behind it a newcomer waits four.)
    let (booked, back) = if algorithm == Algorithm::SlidingWindowCounter {
        (4 * MINUTE, 2 * MINUTE)
    } else {
        (2 * MINUTE, MINUTE)
    };
    let mut waiting = RateLimitLayer::new(one(), GlobalKey)
        .with_store(store(server, &prefix, Some(&clock)))
        .expect("a quota Redis keeps")
        .with_max_wait(Duration::from_secs(300))
        .layer(Inner::new());
    let mut waiter = tokio_test::task::spawn(async move { send(&mut waiting, "k", 1).await });
    // Polled until it has its booking and sleeps.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio_test::assert_pending!(waiter.poll());
        let mut svc = probe();
        if retry_after(&send(&mut svc, "k", 2).await.expect_err("full")) == booked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{algorithm:?}: never booked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(waiter);
    until(probe, |outcome| outcome == Err(back)).await;
}

#[tokio::test]
async fn a_waiter_that_opened_the_next_turn_and_left_leaves_the_running_turn_spent() {
    let Some(server) = RedisServer::start("a_waiter_that_opened_the_next_turn") else {
        return;
    };
    // One request a turn; a turn nobody ends lasts a minute.
    let clock = Clock::new();
    let turns = || {
        Quota::per_turn(1)
            .expect("valid")
            .with_stale_after(MINUTE)
            .expect("a turn budget")
    };
    let probe = || {
        RateLimitLayer::new(turns(), GlobalKey)
            .with_store(store(&server, "opened:", Some(&clock)))
            .expect("a quota Redis keeps")
            .layer(Inner::new())
    };
    send(&mut probe(), "k", 0).await.expect("first of the turn");
    // The second waits for the next turn, a minute on, which it opens.
    let mut waiting = RateLimitLayer::new(turns(), GlobalKey)
        .with_store(store(&server, "opened:", Some(&clock)))
        .expect("a quota Redis keeps")
        .with_max_wait(Duration::from_secs(300))
        .layer(Inner::new());
    let mut waiter = tokio_test::task::spawn(async move { send(&mut waiting, "k", 1).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio_test::assert_pending!(waiter.poll());
        // A fresh replica each time: one remembers its refusals.
        if retry_after(&send(&mut probe(), "k", 2).await.expect_err("full")) == 2 * MINUTE {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never booked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Dropped, it gives back its unit of the next turn, and none of the
    // running one: the key is refused until the next turn starts.
    drop(waiter);
    loop {
        let outcome = send(&mut probe(), "k", 3)
            .await
            .map(|_| ())
            .map_err(|e| retry_after(&e));
        if outcome != Err(2 * MINUTE) {
            assert_eq!(outcome, Err(MINUTE), "went in the spent turn");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_reset_through_a_handle_clears_the_key_in_redis_for_every_replica() {
    let Some(server) = RedisServer::start("a_reset_through_a_handle") else {
        return;
    };
    let clock = Clock::new();
    let make = || {
        RateLimitLayer::new(quota(Algorithm::FixedWindow, 1, MINUTE), header_key())
            .with_store(store(&server, "reset:", Some(&clock)))
            .expect("a quota Redis keeps")
    };
    let a = make();
    let handle = a.handle();
    let mut a = a.layer(Inner::new());
    send(&mut a, "alice", 0).await.expect("first");
    // Replica b sees alice's window full, and refuses until a's handle
    // resets her; her refusal is not remembered past the reset.
    let b = make().layer(Inner::new());
    send(&mut b.clone(), "alice", 1).await.expect_err("full");
    handle.reset(&["alice"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        // A fresh replica each time: b remembers its refusal until the
        // window ends.
        let mut c = make().layer(Inner::new());
        if send(&mut c, "alice", 2).await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reset");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_flood_on_a_refused_key_costs_no_round_trips_until_its_retry_after() {
    let Some(server) = RedisServer::start("a_flood_on_a_refused_key") else {
        return;
    };
    let clock = Clock::new();
    let layer = RateLimitLayer::new(quota(Algorithm::SlidingWindow, 1, MINUTE), GlobalKey)
        .with_store(store(&server, "flood:", Some(&clock)))
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "k", 0).await.expect("admitted");
    let mut conn = server.connection();
    let calls = |conn: &mut redis::Connection| -> u64 {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .expect("INFO");
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let before = calls(&mut conn);
    for i in 0..50 {
        let err = send(&mut svc, "k", i).await.expect_err("refused");
        // Each answer as exact as Redis's own.
        assert_eq!(retry_after(&err), MINUTE);
    }
    // One asked Redis; the 49 after it were answered here.
    assert_eq!(calls(&mut conn) - before, 1);
    let store = handle.stats().store.expect("store stats");
    assert_eq!(store.cached_refusals, 49);
    // A peek says what the cache says.
    assert_eq!(handle.peek_wait::<&str>(&[]), MINUTE);
    // At the instant, Redis is asked again, and admits.
    clock.advance(MINUTE);
    send(&mut svc, "k", 50).await.expect("admitted again");
}

#[tokio::test]
async fn a_key_a_new_rule_takes_over_on_redis_starts_it_spent() {
    let Some(server) = RedisServer::start("a_key_a_new_rule_takes_over") else {
        return;
    };
    let clock = Clock::new();
    let layer = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store(&server, "rules:", Some(&clock)))
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    // vip-1 spends the default's two, before any rule exists.
    send(&mut svc, "vip-1", 0).await.expect("first");
    send(&mut svc, "vip-1", 1).await.expect("second");
    let vip = tower_throttle::rate_limit::Rule::new(
        "vip",
        tower_throttle::rate_limit::KeyPattern::parts(["vip-*"]).expect("valid"),
    )
    .with_quota(Quota::per_minute(3).expect("valid"));
    handle
        .retune(vec![Quota::per_minute(2).expect("valid")], vec![vip])
        .expect("valid retune");
    // Its new rule's bucket starts spent, as in process: no free burst for
    // moving; one unit (20 s at 3 a minute) away.
    let err = send(&mut svc, "vip-1", 2).await.expect_err("no free burst");
    assert_eq!(retry_after(&err), Duration::from_secs(20));
    assert_eq!(refusal(&err).policy.as_deref(), Some("vip"));
    // A key that never spent anywhere gets the rule's whole burst.
    for i in 0..3 {
        send(&mut svc, "vip-2", i)
            .await
            .expect("fresh key, full burst");
    }
    send(&mut svc, "vip-2", 3).await.expect_err("burst spent");
    // The rule renamed: another rule to Redis, which vip-2 (spent under
    // the old one, as its marker says) starts spent too.
    let gold = tower_throttle::rate_limit::Rule::new(
        "gold",
        tower_throttle::rate_limit::KeyPattern::parts(["vip-*"]).expect("valid"),
    )
    .with_quota(Quota::per_minute(3).expect("valid"));
    handle
        .retune(vec![Quota::per_minute(2).expect("valid")], vec![gold])
        .expect("valid retune");
    let err = send(&mut svc, "vip-2", 4).await.expect_err("no free burst");
    assert_eq!(refusal(&err).policy.as_deref(), Some("gold"));
    assert_eq!(retry_after(&err), Duration::from_secs(20));
}
