//! Settling in wait mode with a Redis store, over generated histories:
//! requests arriving while others wait (booked ahead in Redis), each
//! admitted on its estimate and settled to a real cost at most that; the
//! real cost that reaches the inner service never exceeds the quota, in
//! any window, for the token bucket and the sliding window.
//!
//! Redis keeps time by its own clock, and a waiter sleeps on the tokio
//! clock until the instant Redis booked it: paused tokio time cannot run
//! beside it (it would fire the call's timeout while Redis answers), so
//! this runs in real time, on a quota of 10 a second, and allows the
//! calls' jitter (`SLACK`) where instants are compared.

#![cfg(feature = "redis")]

#[path = "support/props.rs"]
mod props;

use testkit::redis as redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proptest::prelude::*;
use redis_server::RedisServer;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Estimated, Quota, RateLimitLayer, Settlement};
use tower_throttle::redis::{OnError, RedisStore};

/// The quota: 10 a second.
const LIMIT: u64 = 10;
const PERIOD: Duration = Duration::from_secs(1);
/// How far apart two calls may land from the instants Redis booked them
/// at (a sleep's wake-up, a task's turn on a loaded machine).
const SLACK: Duration = Duration::from_millis(60);

type CostFn = fn(&http::Request<()>) -> u32;

fn cost_of(req: &http::Request<()>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// One generated request: sent `after_ms` after the one before (without
/// waiting for it), estimated at `estimate`, really costing `actual`
/// (never more), settled `settle_ms` after its answer.
#[derive(Clone, Debug)]
struct Step {
    after_ms: u64,
    estimate: u32,
    actual: u32,
    settle_ms: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0..250u64],
            1..=6u32,
            0..=10u32,
            prop_oneof![Just(0u64), 0..600u64],
        )
            .prop_map(|(after_ms, estimate, fraction, settle_ms)| Step {
                after_ms,
                estimate,
                actual: estimate * fraction / 10,
                settle_ms,
            }),
        1..20,
    )
}

/// Each call the inner service saw: when, and the real cost it settled.
type Calls = Arc<Mutex<Vec<(Instant, u32)>>>;

/// Runs `history` on a fresh key of `quota` in Redis, waiting up to 5 s;
/// returns the calls, oldest first.
async fn run(
    server: &RedisServer,
    prefix: &str,
    quota: Quota,
    history: &[Step],
) -> Vec<(Instant, u32)> {
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5))
        .with_on_error(OnError::Closed);
    let layer = RateLimitLayer::new(quota, GlobalKey)
        .with_cost(Estimated(cost_of as CostFn))
        .with_max_wait(Duration::from_secs(5))
        .with_store(store)
        .expect("a quota Redis keeps");
    let calls = Calls::default();
    let seen = calls.clone();
    let svc = layer.layer(tower::service_fn(move |req: http::Request<()>| {
        let actual: u32 = req
            .headers()
            .get("x-actual")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        seen.lock().push((Instant::now(), actual));
        std::future::ready(Ok::<_, Infallible>(http::Response::new(())))
    }));
    let mut tasks = Vec::new();
    for step in history {
        tokio::time::sleep(Duration::from_millis(step.after_ms)).await;
        let mut req = http::Request::builder()
            .header("x-cost", step.estimate.to_string())
            .header("x-actual", step.actual.to_string())
            .body(())
            .expect("valid request");
        let settlement = Settlement::new();
        req.extensions_mut().insert(settlement.clone());
        let svc = svc.clone();
        let (actual, settle_after) = (step.actual, Duration::from_millis(step.settle_ms));
        tasks.push(tokio::spawn(async move {
            match svc.oneshot(req).await {
                // Settled to the real cost once known, as a provider's
                // usage is read at the end of its answer.
                Ok(_) => {
                    tokio::time::sleep(settle_after).await;
                    settlement.settle(actual);
                }
                Err(e) => assert!(e.is::<RateLimited>(), "not a refusal: {e}"),
            }
        }));
    }
    for task in tasks {
        task.await.expect("no panic");
    }
    let mut calls = std::mem::take(&mut *calls.lock());
    calls.sort_by_key(|&(at, _)| at);
    calls
}

/// The first stretch of calls holding more real cost than `quota` allows
/// (a sliding window: `LIMIT` in any `PERIOD`; a token bucket: `LIMIT`
/// plus one per tenth of a second since the stretch began), each span
/// widened by `SLACK`.
fn overrun(calls: &[(Instant, u32)], sliding: bool) -> Option<String> {
    let step = PERIOD / LIMIT as u32;
    for (i, &(first, _)) in calls.iter().enumerate() {
        let mut used = 0u64;
        for &(at, cost) in &calls[i..] {
            used += u64::from(cost);
            let span = at - first;
            let allowed = if sliding {
                if span + SLACK >= PERIOD {
                    break;
                }
                LIMIT
            } else {
                LIMIT + ((span + SLACK).as_nanos() / step.as_nanos()) as u64
            };
            if used > allowed {
                return Some(format!("{used} real cost in {span:?} (allowed {allowed})"));
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(props::config(4))]

    #[test]
    fn settled_waiters_in_redis_never_let_more_real_cost_through_than_the_quota(history in steps()) {
        let Some(server) = RedisServer::start("settled_waiters_in_redis_never_let_more") else {
            return Ok(());
        };
        let (bucket, window) = redis_server::runtime().block_on(async {
            let bucket = Quota::new(LIMIT as u32, PERIOD).expect("valid");
            let window = Quota::new(LIMIT as u32, PERIOD).expect("valid").sliding_window();
            (
                run(&server, "bucket:", bucket, &history).await,
                run(&server, "window:", window, &history).await,
            )
        });
        prop_assert_eq!(overrun(&bucket, false), None, "token bucket: {:?}", bucket);
        prop_assert_eq!(overrun(&window, true), None, "sliding window: {:?}", window);
    }
}
