//! A retune that changes a quota's algorithm keeps what every key spent,
//! for every pair of algorithms (a reload must never hand out a fresh
//! quota).

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{Inner, request};
use tokio::time;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::BoxError;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Algorithm, Quota, RateLimitLayer};

const MINUTE: Duration = Duration::from_secs(60);

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::TurnBudget,
    Algorithm::SlidingWindowCounter,
];

fn quota(algorithm: Algorithm, per_minute: u32) -> Quota {
    Quota::per_minute(per_minute)
        .unwrap()
        .with_algorithm(algorithm)
}

fn key() -> HeaderKey {
    HeaderKey::new("x-key").unwrap().show_raw()
}

async fn send<S>(svc: &mut S, key: &str) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request(key, 0)).await
}

/// How many of `n` requests on `key` are admitted now.
async fn admitted<S>(svc: &mut S, key: &str, n: usize) -> usize
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(send(svc, key).await.is_ok());
    }
    ok
}

#[tokio::test(start_paused = true)]
async fn a_key_that_spent_its_quota_stays_refused_under_any_other_algorithm() {
    for from in ALGORITHMS {
        for to in ALGORITHMS.into_iter().filter(|&a| a != from) {
            // The same rate, and a tighter one.
            for per_minute in [3, 2] {
                let case = format!("{from:?} 3/min -> {to:?} {per_minute}/min");
                let layer = RateLimitLayer::new(quota(from, 3), key());
                let handle = layer.handle();
                let mut svc = layer.layer(Inner::new());
                assert_eq!(admitted(&mut svc, "spent", 3).await, 3, "{case}");
                assert_eq!(admitted(&mut svc, "part", 1).await, 1, "{case}");
                handle.set_default(vec![quota(to, per_minute)]);
                assert_eq!(
                    admitted(&mut svc, "spent", 3).await,
                    0,
                    "{case}: a spent key got a fresh quota"
                );
                assert_eq!(
                    admitted(&mut svc, "part", 3).await,
                    per_minute as usize - 1,
                    "{case}: a key that spent one"
                );
                assert_eq!(
                    admitted(&mut svc, "new", 3).await,
                    per_minute as usize,
                    "{case}: a key that spent nothing"
                );
                // Not refused for ever: within the new quota's period (a
                // sliding window counter's window weighs for one more).
                let windows = if to == Algorithm::SlidingWindowCounter {
                    2
                } else {
                    1
                };
                time::advance(MINUTE * windows).await;
                assert!(send(&mut svc, "spent").await.is_ok(), "{case}: later");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_global_key_keeps_what_it_spent_across_algorithms() {
    // One token bucket and no rules: the global key's admissions go through
    // its lock-free word, which the carry must read too.
    for to in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let layer = RateLimitLayer::new(quota(Algorithm::TokenBucket, 3), GlobalKey);
        let handle = layer.handle();
        let mut svc = layer.layer(Inner::new());
        assert_eq!(admitted(&mut svc, "", 3).await, 3);
        handle.set_default(vec![quota(to, 3)]);
        assert_eq!(admitted(&mut svc, "", 3).await, 0, "to {to:?}");
        // And back to a token bucket, the fast path again.
        handle.set_default(vec![quota(Algorithm::TokenBucket, 3)]);
        assert_eq!(admitted(&mut svc, "", 3).await, 0, "back from {to:?}");
    }
}
