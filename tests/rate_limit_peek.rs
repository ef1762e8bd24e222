//! What a handle can tell and reset without touching what the limits
//! decide: `peek_wait` (how long a request arriving now would wait) and
//! `reset_stats` (counters back to zero), on every layer with stats.

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{ALGORITHMS, Inner, quota, request};
use tokio::time::advance;
use tower::{Layer, ServiceExt};
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::RateLimited;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{
    Algorithm, KeyPattern, Quota, RateLimitHandle, RateLimitLayer, Rule,
};

fn key() -> HeaderKey {
    HeaderKey::new("x-key").expect("valid")
}

/// What one request got: admitted, or refused with its `retry_after`.
async fn outcome<S>(svc: &S, key: &str, seq: usize) -> Result<(), Duration>
where
    S: tower::Service<
            http::Request<()>,
            Response = http::Response<()>,
            Error = tower_throttle::BoxError,
        > + Clone,
{
    match svc.clone().oneshot(request(key, seq)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(e
            .downcast_ref::<RateLimited>()
            .expect("a rate-limit refusal")
            .retry_after),
    }
}

/// Two limiters alike, one asked `peek_wait` before every request: both
/// decide every request alike, and the wait told is the wait the request
/// then needs (its `retry_after` when refused, zero when admitted). Fixed
/// windows (and a sliding window counter's) line up with the wall clock,
/// read when each limiter is made, so two of them never have quite the
/// same boundaries: for them only the second half holds.
#[tokio::test(start_paused = true)]
async fn peek_wait_tells_the_wait_and_changes_nothing_a_following_request_gets() {
    for algorithm in ALGORITHMS {
        let layer = |q: Quota| {
            RateLimitLayer::new(q, key())
                .with_rule(
                    Rule::new("slow", KeyPattern::parts(["slow"]).expect("valid"))
                        .with_quota(Quota::per_second(1).expect("valid")),
                )
                .expect("valid")
        };
        let q = quota(algorithm, 3, Duration::from_secs(1));
        let (peeked, plain) = (layer(q), layer(q));
        let handle = peeked.handle();
        let plain_handle = plain.handle();
        let (peeked, plain) = (peeked.layer(Inner::new()), plain.layer(Inner::new()));
        let mut told_a_wait = false;
        for step in 0..40 {
            let key = ["a", "b", "slow"][step % 3];
            if step == 20 {
                // Move `b` under the rule and `slow` out of it: a key
                // arriving in a rule starts it spent.
                let rules = vec![
                    Rule::new("slow", KeyPattern::parts(["b"]).expect("valid"))
                        .with_quota(Quota::per_second(1).expect("valid")),
                ];
                for h in [&handle, &plain_handle] {
                    h.retune(vec![q], rules.clone()).expect("valid");
                }
            }
            let keys = handle.key_count();
            let told = handle.peek_wait(&[key]);
            assert_eq!(
                handle.peek_wait(&[key]),
                told,
                "asking twice changes nothing"
            );
            assert_eq!(handle.peek_wait(&["never-seen"]), Duration::ZERO);
            assert_eq!(handle.key_count(), keys, "{algorithm:?}: no state made");
            let got = outcome(&peeked, key, step).await;
            let other = outcome(&plain, key, step).await;
            if !matches!(
                algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
            ) {
                assert_eq!(got, other, "{algorithm:?} step {step}");
            }
            match got {
                Ok(()) => assert_eq!(told, Duration::ZERO, "{algorithm:?} step {step}"),
                Err(retry_after) => {
                    assert_eq!(told, retry_after, "{algorithm:?} step {step}");
                    told_a_wait = true;
                }
            }
            if step % 4 == 3 {
                advance(Duration::from_millis(150)).await;
            }
        }
        assert!(told_a_wait, "{algorithm:?}: the test never saw a wait");
    }
}

/// In wait mode the wait told counts the requests already waiting.
#[tokio::test(start_paused = true)]
async fn peek_wait_counts_the_waiters_ahead() {
    let layer = RateLimitLayer::new(Quota::per_second(1).expect("valid"), key())
        .with_max_wait(Duration::from_secs(10));
    let handle = layer.handle();
    let svc = layer.layer(Inner::new());
    svc.clone()
        .oneshot(request("k", 0))
        .await
        .expect("admitted");
    let waiters: Vec<_> = (1..4)
        .map(|seq| tokio::spawn(svc.clone().oneshot(request("k", seq))))
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(handle.stats().aggregate.queued_now, 3);
    assert_eq!(handle.peek_wait(&["k"]), Duration::from_secs(4));
    assert_eq!(handle.peek_wait(&["other"]), Duration::ZERO);
    // Off, or in a dry run, nobody waits.
    handle.set_dry_run(true);
    assert_eq!(handle.peek_wait(&["k"]), Duration::ZERO);
    handle.set_dry_run(false);
    handle.set_enabled(false);
    assert_eq!(handle.peek_wait(&["k"]), Duration::ZERO);
    handle.set_enabled(true);
    for waiter in waiters {
        waiter.await.expect("joined").expect("admitted in turn");
    }
}

fn counts(handle: &RateLimitHandle) -> (u64, u64, u64) {
    let a = handle.stats().aggregate;
    (a.admitted, a.rejected, a.waited)
}

#[tokio::test(start_paused = true)]
async fn stats_reset_zeroes_the_counters_and_keeps_the_limiter_state() {
    let layer = RateLimitLayer::new(Quota::per_second(1).expect("valid"), key())
        .with_max_wait(Duration::from_millis(1500))
        .with_key_stats(10);
    let handle = layer.handle();
    let svc = layer.layer(Inner::new());
    outcome(&svc, "k", 0).await.expect("admitted");
    outcome(&svc, "k", 1).await.expect("admitted after a wait");
    // One waits its turn (1 s away), the next would wait 2 s: refused.
    let waiter = tokio::spawn(svc.clone().oneshot(request("k", 2)));
    tokio::task::yield_now().await;
    assert_eq!(outcome(&svc, "k", 3).await, Err(Duration::from_secs(2)));
    assert_eq!(counts(&handle), (2, 1, 1));
    assert_eq!(handle.stats().aggregate.queued_now, 1);

    handle.reset_stats();
    let stats = handle.stats();
    assert_eq!(counts(&handle), (0, 0, 0));
    assert_eq!(stats.aggregate.total_wait_ms, 0.0);
    assert_eq!(stats.keys[0].admitted, 0);
    assert_eq!(
        stats.aggregate.queued_now, 1,
        "the gauge still counts the waiter"
    );
    assert_eq!(stats.keys[0].queued_now, 1);
    // The limiter is untouched: the key is as spent as before.
    assert_eq!(handle.peek_wait(&["k"]), Duration::from_secs(2));
    assert_eq!(outcome(&svc, "k", 4).await, Err(Duration::from_secs(2)));
    waiter.await.expect("joined").expect("admitted in turn");
    let stats = handle.stats();
    assert_eq!(counts(&handle), (1, 1, 1));
    assert_eq!(stats.aggregate.queued_now, 0);
    assert_eq!(stats.keys[0].admitted, 1);
}

#[test]
fn stats_reset_on_concurrency_keeps_the_requests_in_flight() {
    for key_stats in [0, 10] {
        let layer = ConcurrencyLayer::new(2, key())
            .expect("valid")
            .with_key_stats(key_stats);
        let handle = layer.handle();
        let svc = layer.layer(Inner::new());
        let mut first = tokio_test::task::spawn(svc.clone().oneshot(request("k", 0)));
        let held = tokio_test::assert_ready_ok!(first.poll());
        let mut second = tokio_test::task::spawn(svc.clone().oneshot(request("k", 1)));
        drop(tokio_test::assert_ready_ok!(second.poll()));
        handle.reset_stats();
        let a = handle.stats().aggregate;
        assert_eq!(
            (a.admitted, a.in_flight),
            (0, Some(1)),
            "per key: {key_stats}"
        );
        drop(held);
        let a = handle.stats().aggregate;
        assert_eq!(
            (a.admitted, a.in_flight),
            (0, Some(0)),
            "per key: {key_stats}"
        );
        let keys = handle.stats().keys;
        assert!(
            keys.iter()
                .all(|k| k.in_flight == Some(0) && k.admitted == 0)
        );
    }
}
