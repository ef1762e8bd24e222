//! The limiter's state: bounded memory, time that runs backwards, absurd
//! values, and bad configuration.

#![cfg(feature = "test-util")]

mod support;

use std::convert::Infallible;
use std::time::Duration;

use support::{ALGORITHMS, quota};
use tokio::time;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::error::{
    ConfigError, CoolingDown, CostTooHigh, MissingKey, QueueFull, QueueTimeout, RateLimited,
};
use tower_throttle::rate_limit::{Algorithm, Quota, RateLimitLayer};

/// A service over plain numbers, keyed by the number itself.
fn numbers() -> impl Service<u64, Response = (), Error = Infallible> + Clone {
    tower::service_fn(|_n: u64| std::future::ready(Ok(())))
}

fn by_number(n: &u64) -> Option<u64> {
    Some(*n)
}

#[tokio::test(start_paused = true)]
async fn a_million_idle_keys_are_evicted_and_their_memory_given_back() {
    for algorithm in ALGORITHMS {
        let layer = RateLimitLayer::new(quota(algorithm, 1, Duration::from_secs(1)), by_number);
        let mut svc = layer.layer(numbers());
        for n in 0..1_000_000u64 {
            svc.ready().await.unwrap().call(n).await.unwrap();
        }
        // Nothing is idle yet: every key has used its one unit.
        assert_eq!(layer.key_count(), 1_000_000, "{algorithm:?}");
        time::advance(Duration::from_secs(2)).await;
        // Requests on one busy key sweep the idle ones as they go, one shard
        // at a time; no background task, no call to evict_idle.
        for _ in 0..100 {
            let _ = svc.ready().await.unwrap().call(u64::MAX).await;
        }
        assert!(
            layer.key_count() <= 1,
            "{algorithm:?}: {} keys left",
            layer.key_count()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn evict_idle_drops_only_idle_keys() {
    for algorithm in ALGORITHMS {
        let layer = RateLimitLayer::new(quota(algorithm, 1, Duration::from_secs(60)), by_number);
        let mut svc = layer.layer(numbers());
        for n in 0..1_000u64 {
            svc.ready().await.unwrap().call(n).await.unwrap();
        }
        assert_eq!(
            layer.evict_idle(),
            0,
            "{algorithm:?}: a busy key was evicted"
        );
        assert_eq!(layer.key_count(), 1_000);
        // Still limited: eviction lost nothing.
        assert!(svc.ready().await.unwrap().call(5).await.is_err());
        // A sliding window counter's window weighs until a window after it
        // ended.
        let idle = if algorithm == Algorithm::SlidingWindowCounter {
            121
        } else {
            61
        };
        time::advance(Duration::from_secs(idle)).await;
        assert_eq!(layer.evict_idle(), 1_000, "{algorithm:?}");
        assert_eq!(layer.key_count(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_clock_that_runs_backwards_never_parks_a_key_shut() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new();
        let layer = RateLimitLayer::new(quota(algorithm, 1, Duration::from_secs(3_600)), by_number)
            .with_clock(clock.clone());
        let mut svc = layer.layer(numbers());
        clock.advance(Duration::from_secs(10 * 3_600));
        svc.ready().await.unwrap().call(1).await.unwrap();
        // A clock stepped back a little (or two threads' readings taken in
        // one order and applied in the other) keeps the limit: no reset.
        clock.rewind(Duration::from_millis(1));
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        assert!(
            err.is::<RateLimited>(),
            "{algorithm:?}: a 1 ms step back reset the key"
        );
        clock.advance(Duration::from_millis(1));
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        let windows = if algorithm == Algorithm::SlidingWindowCounter {
            2
        } else {
            1
        };
        assert!(
            err.downcast_ref::<RateLimited>().unwrap().retry_after
                <= Duration::from_secs(3_600 * windows)
        );
        // The clock jumps nine hours back: the key's state now lies further
        // ahead than any clock running forwards could have left it.
        clock.rewind(Duration::from_secs(9 * 3_600));
        svc.ready()
            .await
            .unwrap()
            .call(1)
            .await
            .unwrap_or_else(|e| panic!("{algorithm:?}: key parked shut: {e}"));
        // A small step back keeps the limit: at most its length is lost.
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        assert!(err.is::<RateLimited>());
        // Rewinding past the limiter's origin reads as the origin.
        clock.rewind(Duration::from_secs(1_000 * 3_600));
        svc.ready().await.unwrap().call(2).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn absurd_waits_and_costs_neither_panic_nor_overflow() {
    for algorithm in ALGORITHMS {
        let q = quota(algorithm, u32::MAX, tower_throttle::rate_limit::MAX_PERIOD);
        let mut svc = RateLimitLayer::new(q, by_number)
            .with_max_wait(Duration::MAX)
            .with_cost(|n: &u64| u32::try_from(*n).unwrap_or(u32::MAX))
            .layer(numbers());
        svc.ready()
            .await
            .unwrap()
            .call(u64::from(u32::MAX))
            .await
            .unwrap();
        // The key is spent for 400 days; with an unbounded wait the next
        // request is booked, not refused, and nothing overflows.
        svc.ready().await.unwrap();
        let fut = svc.call(u64::from(u32::MAX));
        assert!(time::timeout(Duration::from_secs(1), fut).await.is_err());

        let q = quota(algorithm, 1, Duration::from_nanos(1));
        let mut svc = RateLimitLayer::new(q, by_number).layer(numbers());
        // A sliding window counter's window weighs for one more.
        let step = if algorithm == Algorithm::SlidingWindowCounter {
            2
        } else {
            1
        };
        for _ in 0..3 {
            svc.ready().await.unwrap().call(0).await.unwrap();
            time::advance(Duration::from_nanos(step)).await;
        }
        svc.ready().await.unwrap().call(7).await.unwrap();
        // And a cost above the burst is refused, not waited for forever.
        let mut svc = RateLimitLayer::new(quota(algorithm, 5, Duration::from_secs(1)), by_number)
            .with_max_wait(Duration::MAX)
            .with_cost(|_: &u64| 6)
            .layer(numbers());
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        assert!(err.is::<CostTooHigh>(), "{algorithm:?}: {err}");
    }
}

#[test]
fn nonsensical_quotas_are_refused_when_built() {
    let cases: Vec<(Result<Quota, ConfigError>, &str)> = vec![
        (Quota::per_minute(0), "limit"),
        (Quota::per_second(0), "limit"),
        (Quota::new(1, Duration::ZERO), "period"),
        (Quota::new(1, Duration::MAX), "period"),
        (Quota::new(1, Duration::from_secs(401 * 86_400)), "period"),
        (Quota::per_minute(60).unwrap().with_burst(0), "burst"),
        (Quota::per_day(1).unwrap().with_burst(u32::MAX), "burst"),
        (
            Quota::per_minute(60)
                .unwrap()
                .sliding_window()
                .with_burst(5),
            "burst",
        ),
        (
            Quota::per_minute(60).unwrap().fixed_window().with_burst(5),
            "burst",
        ),
    ];
    for (result, field) in cases {
        let err = result.expect_err(field);
        assert_eq!(err.field, field, "{err}");
        assert!(
            err.to_string().starts_with(&format!("invalid `{field}`")),
            "{err}"
        );
    }
    // The constructors mean what they say.
    let q = Quota::per_minute(60).unwrap();
    assert_eq!(
        (q.limit(), q.period(), q.burst()),
        (60, Duration::from_secs(60), 60)
    );
    let q = Quota::per_second(5).unwrap().with_burst(1).unwrap();
    assert_eq!((q.limit(), q.burst()), (5, 1));
    assert!(Quota::per_day(u32::MAX).is_ok());
}

/// Error values are only built by the layers; their text is pinned through a
/// real refusal.
#[tokio::test(start_paused = true)]
async fn rate_limited_display_names_the_key_and_the_wait() {
    let mut svc = RateLimitLayer::new(
        Quota::per_minute(48).unwrap().with_burst(1).unwrap(),
        by_number,
    )
    .layer(numbers());
    svc.ready().await.unwrap().call(3).await.unwrap();
    let err = svc.ready().await.unwrap().call(3).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "rate limited on key `3`; retry after 1.250 s"
    );
    let missing = MissingKey::new("header `x-api-key`");
    assert_eq!(
        missing.to_string(),
        "request has no limit key (header `x-api-key` missing) and no fallback key is set"
    );
    let full = QueueFull::new("k".into(), 8);
    assert_eq!(full.to_string(), "queue for key `k` is full (8 waiting)");
    let timeout = QueueTimeout::new("k".into(), Duration::from_millis(2_500));
    assert_eq!(
        timeout.to_string(),
        "gave up waiting for key `k` after 2.500 s"
    );
    let cooling = CoolingDown::new("openai/gpt-4o".into(), Duration::from_millis(1_250));
    assert_eq!(
        cooling.to_string(),
        "key `openai/gpt-4o` is cooling down after an upstream refusal; retry after 1.250 s"
    );
}

/// Requests racing on many threads read the clock in one order and take the
/// key's lock in another; a state booked by a later reading must not look
/// like a clock that ran backwards to an earlier one (which would reset the
/// key and admit a free burst).
#[test]
fn racing_threads_never_admit_more_than_the_limit() {
    for algorithm in ALGORITHMS {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let admitted = runtime.block_on(async {
            let svc = RateLimitLayer::new(
                quota(algorithm, 50, Duration::from_secs(3_600)),
                |_: &u64| Some(0u64),
            )
            .layer(tower::service_fn(|_n: u64| {
                std::future::ready(Ok::<_, Infallible>(()))
            }));
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let svc = svc.clone();
                    tokio::spawn(async move {
                        let mut admitted = 0;
                        for n in 0..2_000u64 {
                            if svc.clone().oneshot(n).await.is_ok() {
                                admitted += 1;
                            }
                        }
                        admitted
                    })
                })
                .collect();
            let mut total = 0;
            for task in tasks {
                total += task.await.unwrap();
            }
            total
        });
        // A fixed window may turn over once during the run (at a wall-clock
        // hour): then two windows' worth.
        let most = if algorithm == tower_throttle::rate_limit::Algorithm::FixedWindow {
            100
        } else {
            50
        };
        assert!(admitted <= most, "{algorithm:?}: {admitted} admitted");
        assert!(admitted >= 50, "{algorithm:?}: {admitted} admitted");
    }
}
