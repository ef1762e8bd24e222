//! The rate limiter's conformance suite: written once, run against every
//! algorithm.

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{ALGORITHMS, Inner, quota, request};
use tokio::time;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::FastClock;
use tower_throttle::error::{BoxError, CostTooHigh, MissingKey, RateLimited};
use tower_throttle::key::JsonFieldKey;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Algorithm, Quota, RateLimitLayer};

const MINUTE: Duration = Duration::from_secs(60);
const NS: Duration = Duration::from_nanos(1);

fn header_key() -> HeaderKey {
    HeaderKey::new("x-key").expect("valid header name")
}

async fn send<S>(svc: &mut S, key: &str, seq: usize) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request(key, seq)).await
}

fn retry_after(err: &BoxError) -> Duration {
    err.downcast_ref::<RateLimited>()
        .unwrap_or_else(|| panic!("expected RateLimited, got {err}"))
        .retry_after
}

#[tokio::test(start_paused = true)]
async fn hundred_callers_limit_seven_exactly_seven_reach_inner() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let svc = RateLimitLayer::new(quota(algorithm, 7, MINUTE), GlobalKey).layer(inner.clone());
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move { svc.oneshot(request("k", i)).await })
            })
            .collect();
        let mut admitted = 0;
        let mut limited = 0;
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

#[tokio::test(start_paused = true)]
async fn nth_plus_one_is_rejected_before_inner_call() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let mut svc =
            RateLimitLayer::new(quota(algorithm, 3, MINUTE), header_key()).layer(inner.clone());
        for i in 0..3 {
            send(&mut svc, "a", i).await.expect("within the limit");
        }
        assert_eq!(inner.record.calls(), 3);
        let err = send(&mut svc, "a", 3).await.expect_err("over the limit");
        assert!(err.is::<RateLimited>(), "{algorithm:?}: {err}");
        assert_eq!(inner.record.calls(), 3, "{algorithm:?}: inner was called");
        // Another key is untouched.
        send(&mut svc, "b", 4).await.expect("other key");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_inner_call_still_consumes_its_slot() {
    for algorithm in ALGORITHMS {
        let inner = Inner::failing();
        let mut svc =
            RateLimitLayer::new(quota(algorithm, 2, MINUTE), GlobalKey).layer(inner.clone());
        for i in 0..2 {
            let err = send(&mut svc, "k", i).await.expect_err("inner fails");
            assert!(err.is::<support::InnerFailed>());
        }
        let err = send(&mut svc, "k", 2).await.expect_err("limited");
        assert!(err.is::<RateLimited>(), "{algorithm:?}: {err}");
        assert_eq!(inner.record.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn with_a_classifier_a_refused_call_gives_its_slot_back() {
    for algorithm in ALGORITHMS {
        let inner = Inner::failing();
        let mut svc = RateLimitLayer::new(quota(algorithm, 2, MINUTE), GlobalKey)
            .count_only(
                |outcome: &Result<http::Response<()>, support::InnerFailed>| outcome.is_ok(),
            )
            .layer(inner.clone());
        for i in 0..10 {
            let err = send(&mut svc, "k", i).await.expect_err("inner fails");
            assert!(err.is::<support::InnerFailed>(), "{algorithm:?}: {err}");
        }
        assert_eq!(inner.record.calls(), 10, "{algorithm:?}");
    }
}

/// Fill `svc`'s key, then check that the refusal's `retry_after` is the exact
/// instant the key admits again: one nanosecond before, still refused; at it,
/// admitted.
async fn assert_retry_after_exact<S>(svc: &mut S, algorithm: Algorithm, expected: Option<Duration>)
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    let err = send(svc, "k", 0).await.expect_err("key is full");
    let wait = retry_after(&err);
    if let Some(expected) = expected {
        assert_eq!(wait, expected, "{algorithm:?}");
    }
    assert!(wait > Duration::ZERO, "{algorithm:?}");
    time::advance(wait - NS).await;
    let err = send(svc, "k", 0).await.expect_err("one ns early");
    assert_eq!(retry_after(&err), NS, "{algorithm:?}");
    time::advance(NS).await;
    send(svc, "k", 0).await.expect("admitted on the instant");
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_the_exact_instant_the_key_admits_again() {
    // Token bucket, 6 per minute: one unit every 10 s. After the burst and
    // 3.5 s, the next unit is 6.5 s away: not the window, not a period multiple.
    let mut svc = RateLimitLayer::new(quota(Algorithm::TokenBucket, 6, MINUTE), GlobalKey)
        .layer(Inner::new());
    for i in 0..6 {
        send(&mut svc, "k", i).await.expect("burst");
    }
    time::advance(Duration::from_millis(3_500)).await;
    assert_retry_after_exact(
        &mut svc,
        Algorithm::TokenBucket,
        Some(Duration::from_millis(6_500)),
    )
    .await;

    // Sliding window, 3 per minute, admissions at 0, 10 s and 20 s: at 25 s
    // the oldest leaves the window 35 s later.
    let mut svc = RateLimitLayer::new(quota(Algorithm::SlidingWindow, 3, MINUTE), GlobalKey)
        .layer(Inner::new());
    for (i, pause) in [10, 10, 5].into_iter().enumerate() {
        send(&mut svc, "k", i).await.expect("admitted");
        time::advance(Duration::from_secs(pause)).await;
    }
    assert_retry_after_exact(
        &mut svc,
        Algorithm::SlidingWindow,
        Some(Duration::from_secs(35)),
    )
    .await;

    // Fixed window: the refusal waits exactly for the next boundary.
    let mut svc = RateLimitLayer::new(quota(Algorithm::FixedWindow, 3, MINUTE), GlobalKey)
        .layer(Inner::new());
    for i in 0..3 {
        send(&mut svc, "k", i).await.expect("admitted");
    }
    assert_retry_after_exact(&mut svc, Algorithm::FixedWindow, None).await;
    // After the boundary the whole window is there again.
    for i in 0..2 {
        send(&mut svc, "k", i).await.expect("new window");
    }
}

/// Callers arrive every 10 ms for 10 simulated minutes against 60 per minute:
/// admitted ≤ ideal + burst and ≥ 0.999 × ideal.
#[tokio::test(start_paused = true)]
async fn long_run_admits_within_ideal_plus_burst() {
    for algorithm in ALGORITHMS {
        let q = quota(algorithm, 60, MINUTE);
        let mut svc = RateLimitLayer::new(q, GlobalKey).layer(Inner::new());
        let step = Duration::from_millis(10);
        let run = Duration::from_secs(600);
        let mut admitted = 0u64;
        let mut elapsed = Duration::ZERO;
        while elapsed < run {
            if send(&mut svc, "k", 0).await.is_ok() {
                admitted += 1;
            }
            time::advance(step).await;
            elapsed += step;
        }
        let ideal = 60.0 * run.as_secs_f64() / 60.0;
        let burst = f64::from(q.burst());
        let admitted = admitted as f64;
        assert!(
            admitted <= ideal + burst,
            "{algorithm:?}: {admitted} > {ideal} + {burst}"
        );
        // A sliding window counter under steady overload admits a unit
        // less than the limit in some windows: the previous window still
        // weighs a little when the next unit would fit.
        let least = if algorithm == Algorithm::SlidingWindowCounter {
            ideal * (1.0 - 1.0 / f64::from(q.limit()))
        } else {
            0.999 * ideal
        };
        assert!(
            admitted >= least,
            "{algorithm:?}: {admitted} < {least} of {ideal}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn sliding_window_admission_one_window_old_has_expired_one_ns_younger_has_not() {
    let mut svc = RateLimitLayer::new(quota(Algorithm::SlidingWindow, 1, MINUTE), GlobalKey)
        .layer(Inner::new());
    send(&mut svc, "k", 0).await.expect("first");
    time::advance(MINUTE - NS).await;
    let err = send(&mut svc, "k", 1)
        .await
        .expect_err("one ns younger than a window");
    assert_eq!(retry_after(&err), NS);
    time::advance(NS).await;
    send(&mut svc, "k", 2)
        .await
        .expect("exactly one window old has expired");
}

#[tokio::test(start_paused = true)]
async fn sliding_window_never_admits_more_than_limit_in_any_rolling_window() {
    let limit = 5;
    let inner = Inner::new();
    let mut svc = RateLimitLayer::new(quota(Algorithm::SlidingWindow, limit, MINUTE), GlobalKey)
        .layer(inner.clone());
    let mut rng = support::Lcg(7);
    for i in 0..2_000 {
        let _ = send(&mut svc, "k", i).await;
        time::advance(Duration::from_millis(rng.next() % 3_000)).await;
    }
    let at = inner.record.instants();
    assert!(at.len() > 100);
    for (i, &start) in at.iter().enumerate() {
        let in_window = at[i..].iter().take_while(|&&t| t - start < MINUTE).count();
        assert!(
            in_window <= limit as usize,
            "{in_window} admissions within one window"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn fixed_window_resets_at_the_boundary_and_not_before() {
    let inner = Inner::new();
    let mut svc = RateLimitLayer::new(quota(Algorithm::FixedWindow, 2, MINUTE), GlobalKey)
        .layer(inner.clone());
    send(&mut svc, "k", 0).await.expect("1");
    send(&mut svc, "k", 1).await.expect("2");
    let to_boundary = retry_after(&send(&mut svc, "k", 2).await.expect_err("full"));
    assert!(to_boundary <= MINUTE);
    time::advance(to_boundary - NS).await;
    assert!(
        send(&mut svc, "k", 3).await.is_err(),
        "reset before the boundary"
    );
    time::advance(NS).await;
    send(&mut svc, "k", 4).await.expect("new window, 1");
    send(&mut svc, "k", 5).await.expect("new window, 2");
    // The next boundary is a whole window later.
    let err = send(&mut svc, "k", 6).await.expect_err("full again");
    assert_eq!(retry_after(&err), MINUTE);
}

#[tokio::test(start_paused = true)]
async fn token_bucket_refills_at_rate_and_recovers_full_burst_after_idle() {
    // 10 per second with a burst of 4: one unit every 100 ms.
    let q = Quota::per_second(10).unwrap().with_burst(4).unwrap();
    let mut svc = RateLimitLayer::new(q, GlobalKey).layer(Inner::new());
    for i in 0..4 {
        send(&mut svc, "k", i).await.expect("burst");
    }
    let err = send(&mut svc, "k", 4).await.expect_err("burst spent");
    assert_eq!(retry_after(&err), Duration::from_millis(100));
    // Refill at rate: one unit per 100 ms, no more.
    for i in 0..5 {
        time::advance(Duration::from_millis(100)).await;
        send(&mut svc, "k", i).await.expect("refilled unit");
        assert!(
            send(&mut svc, "k", i).await.is_err(),
            "more than one unit per 100 ms"
        );
    }
    // Idle far longer than a refill: the burst is back, and never more.
    time::advance(Duration::from_secs(3_600)).await;
    for i in 0..4 {
        send(&mut svc, "k", i).await.expect("full burst after idle");
    }
    assert!(
        send(&mut svc, "k", 9).await.is_err(),
        "burst exceeded its capacity"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_key_is_refused_unless_a_fallback_is_set() {
    let inner = Inner::new();
    let mut svc = RateLimitLayer::new(
        quota(Algorithm::TokenBucket, 1, MINUTE),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .layer(inner.clone());
    let err = send(&mut svc, "k", 0).await.expect_err("no key");
    let missing = err.downcast_ref::<MissingKey>().expect("MissingKey");
    assert!(missing.to_string().contains("x-api-key"), "{missing}");
    assert_eq!(inner.record.calls(), 0);

    let mut svc = RateLimitLayer::new(
        quota(Algorithm::TokenBucket, 1, MINUTE),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .with_fallback_key("anonymous")
    .layer(inner.clone());
    send(&mut svc, "k", 0).await.expect("fallback key");
    let err = send(&mut svc, "k", 1).await.expect_err("shared fallback");
    assert_eq!(err.downcast_ref::<RateLimited>().unwrap().key, "anonymous");
}

#[tokio::test(start_paused = true)]
async fn cost_is_charged_and_a_cost_above_capacity_is_refused() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let mut svc = RateLimitLayer::new(quota(algorithm, 10, MINUTE), GlobalKey)
            .with_cost(|req: &http::Request<()>| {
                req.headers()
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
            .layer(inner.clone());
        let costly = |cost: u32| {
            http::Request::builder()
                .header("x-cost", cost.to_string())
                .body(())
                .unwrap()
        };
        for _ in 0..3 {
            svc.ready()
                .await
                .unwrap()
                .call(costly(3))
                .await
                .expect("3 × 3 ≤ 10");
        }
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(costly(3))
            .await
            .expect_err("12 > 10");
        assert!(err.is::<RateLimited>(), "{algorithm:?}: {err}");
        svc.ready()
            .await
            .unwrap()
            .call(costly(1))
            .await
            .expect("the 10th unit");
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(costly(11))
            .await
            .expect_err("never fits");
        let too_high = err.downcast_ref::<CostTooHigh>().expect("CostTooHigh");
        assert_eq!((too_high.cost, too_high.capacity), (11, 10));
        assert_eq!(inner.record.calls(), 4);
    }
}

#[tokio::test(start_paused = true)]
async fn json_body_field_keys_requests_by_model() {
    let inner = tower::service_fn(|_req: http::Request<bytes::Bytes>| async {
        Ok::<_, support::NoError>(http::Response::new(()))
    });
    let mut svc = RateLimitLayer::new(
        quota(Algorithm::TokenBucket, 1, MINUTE),
        JsonFieldKey::new("model"),
    )
    .layer(inner);
    let chat = |body: &'static str| {
        http::Request::builder()
            .body(bytes::Bytes::from_static(body.as_bytes()))
            .unwrap()
    };
    svc.ready()
        .await
        .unwrap()
        .call(chat(r#"{"messages":[{"model":"x"}],"model":"gpt-4o"}"#))
        .await
        .expect("gpt-4o");
    svc.ready()
        .await
        .unwrap()
        .call(chat(r#"{"model":"claude","stream":true}"#))
        .await
        .expect("claude");
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(chat(r#"{"model" : "gpt-4o"}"#))
        .await
        .expect_err("gpt-4o again");
    assert_eq!(err.downcast_ref::<RateLimited>().unwrap().key, "gpt-4o");
    for bad in [r#"{"model":null}"#, r#"{"other":1}"#, "not json", ""] {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(chat(bad))
            .await
            .expect_err(bad);
        assert!(err.is::<MissingKey>(), "{bad}: {err}");
    }
}

/// The counter clock production uses by default limits the same way; this
/// test runs in real time, so it only uses quotas that cannot refill while
/// it runs.
#[tokio::test]
async fn the_counter_clock_limits_every_algorithm() {
    for algorithm in ALGORITHMS {
        let inner = Inner::new();
        let hour = 60 * MINUTE;
        let mut svc = RateLimitLayer::new(quota(algorithm, 3, hour), header_key())
            .with_clock(FastClock::new())
            .layer(inner.clone());
        for seq in 0..3 {
            send(&mut svc, "a", seq).await.expect("within the limit");
        }
        let err = send(&mut svc, "a", 3).await.expect_err("over the limit");
        let wait = retry_after(&err);
        // The approximate window's previous window weighs until a whole
        // window after it ended.
        let most = if algorithm == Algorithm::SlidingWindowCounter {
            2 * hour
        } else {
            hour
        };
        assert!(
            wait > Duration::ZERO && wait <= most,
            "{algorithm:?}: {wait:?}"
        );
        send(&mut svc, "b", 4)
            .await
            .expect("another key has its own quota");
        assert_eq!(inner.record.calls(), 4, "{algorithm:?}");
    }
}
