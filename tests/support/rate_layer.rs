//! The layer side of the model-based properties (`model_rate_limit*.rs`):
//! the layer under test, its requests, and its answers in the model's terms.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::time::Instant;
use tower::util::BoxService;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::error::{CostTooHigh, RateLimited};
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{Quota, RateLimitHandle, RateLimitLayer};

use super::rate_model::{Alg, MS, Spec, Verdict, Windows};

pub const KEYS: [&str; 3] = ["a", "b", "c"];

/// Periods dividing the probe's (see [`layer`]), so one probe places every
/// fixed window.
pub const PERIODS_MS: [u64; 2] = [1_000, 2_000];
const PROBE_MS: u64 = 2_000;

/// A difference or a breach fails the case, with its history.
pub fn agree(outcome: Result<(), String>) -> Result<(), TestCaseError> {
    outcome.map_err(TestCaseError::fail)
}

/// One quota of `alg`.
pub fn spec(alg: Alg) -> impl Strategy<Value = Spec> {
    (
        1..=5u32,
        prop::sample::select(PERIODS_MS.to_vec()),
        1..=6u32,
    )
        .prop_map(move |(limit, period_ms, burst)| Spec::new(alg, limit, period_ms, burst, false))
}

/// One quota of any algorithm, sometimes counting requests.
pub fn any_spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![
            Just(Alg::Bucket),
            Just(Alg::Sliding),
            Just(Alg::Fixed),
            Just(Alg::Turn),
            Just(Alg::Counter)
        ],
        1..=5u32,
        prop::sample::select(PERIODS_MS.to_vec()),
        1..=6u32,
        prop::bool::weighted(0.2),
    )
        .prop_map(|(alg, limit, period_ms, burst, per_request)| {
            Spec::new(alg, limit, period_ms, burst, per_request)
        })
}

pub type Svc = tower::util::BoxService<http::Request<()>, http::Response<()>, BoxError>;

/// Which requests reached the inner service, and when.
pub type Seen = Arc<Mutex<Vec<(usize, Instant)>>>;

fn header(req: &http::Request<()>, name: &str) -> Option<usize> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

fn cost_of(req: &http::Request<()>) -> u32 {
    header(req, "x-cost").map_or(1, |c| c as u32)
}

/// Request `id` on key `KEYS[key]` costing `cost`.
pub fn request(key: u8, cost: u32, id: usize) -> http::Request<()> {
    http::Request::builder()
        .header("x-key", KEYS[usize::from(key)])
        .header("x-cost", cost.to_string())
        .header("x-id", id.to_string())
        .body(())
        .unwrap()
}

/// What the layer said about one request decided at once, in the model's
/// terms (a refusal names its quota by its index in `specs`).
pub fn verdict(outcome: Result<http::Response<()>, BoxError>, now: u64, specs: &[Spec]) -> Verdict {
    match outcome {
        Ok(_) => Verdict::Admitted { at: now },
        Err(e) => {
            if let Some(refused) = e.downcast_ref::<RateLimited>() {
                let quota = refused.quota.expect("a refusal names its quota");
                let slowest = specs
                    .iter()
                    .position(|s| s.quota() == quota)
                    .unwrap_or(usize::MAX);
                Verdict::Refused {
                    wait: u64::try_from(refused.retry_after.as_nanos()).unwrap(),
                    slowest,
                }
            } else if let Some(costly) = e.downcast_ref::<CostTooHigh>() {
                Verdict::TooCostly {
                    capacity: costly.capacity,
                }
            } else {
                panic!("unexpected error: {e}")
            }
        }
    }
}

/// The model's verdict as the layer can tell it: a refusal names its
/// quota, so the first of equal quotas.
pub fn as_told(mut verdict: Verdict, specs: &[Spec]) -> Verdict {
    if let Verdict::Refused { slowest, .. } = &mut verdict {
        let quota = specs[*slowest].quota();
        *slowest = specs.iter().position(|s| s.quota() == quota).unwrap();
    }
    verdict
}

/// The layer for `specs`, waiting up to `max_wait` (zero: reject mode), its
/// handle, its limiter's origin, and where its fixed windows start: they
/// are aligned to the wall clock, which the test cannot set. A probe quota
/// of one per `PROBE_MS` tells how far its next boundary is; then the real
/// quotas take over and every key starts afresh.
pub async fn layer(
    specs: &[Spec],
    max_wait: Duration,
    seen: &Seen,
    global: bool,
) -> (Svc, RateLimitHandle, Instant, Windows) {
    let quotas: Vec<Quota> = specs.iter().map(Spec::quota).collect();
    let probe = Quota::new(1, Duration::from_millis(PROBE_MS))
        .unwrap()
        .fixed_window();
    let origin = Instant::now();
    let seen = seen.clone();
    let inner = tower::service_fn(move |req: http::Request<()>| {
        // Noted when called: the instant the request is let through.
        if let Some(id) = header(&req, "x-id") {
            seen.lock().push((id, Instant::now()));
        }
        async { Ok::<_, BoxError>(http::Response::new(())) }
    });
    // One key for every request (which a lone token bucket admits by one
    // compare-and-swap), or one per `x-key`.
    let (mut svc, handle): (Svc, _) = if global {
        let layer = RateLimitLayer::new(probe, GlobalKey)
            .with_cost(cost_of)
            .with_max_wait(max_wait);
        (BoxService::new(layer.layer(inner)), layer.handle())
    } else {
        let layer = RateLimitLayer::new(probe, HeaderKey::new("x-key").unwrap())
            .with_cost(cost_of)
            .with_max_wait(max_wait);
        (BoxService::new(layer.layer(inner)), layer.handle())
    };
    let probe = http::Request::builder()
        .header("x-key", "probe")
        .body(())
        .unwrap();
    svc.ready().await.unwrap().call(probe).await.unwrap();
    let next = if global {
        handle.peek_wait::<&str>(&[])
    } else {
        handle.peek_wait(&["probe"])
    };
    handle.retune(quotas, Vec::new()).unwrap();
    handle.reset_all();
    let anchor = u64::try_from(next.as_nanos()).unwrap() % (PROBE_MS * MS);
    (svc, handle, origin, Windows { anchor })
}

/// A retune: what changes in the quotas.
#[derive(Clone, Debug)]
pub enum Change {
    /// Quota `quota`'s limit (and burst, for a token bucket), tighter or
    /// looser: its keys keep what they spent.
    Limit {
        quota: usize,
        limit: u32,
        burst: u32,
    },
    /// Another algorithm in quota `quota`'s place (same limit and period):
    /// it starts afresh.
    Algorithm { quota: usize, alg: Alg },
    /// One more quota, last.
    Add(Spec),
    /// The last quota gone (one stays).
    Remove,
}

pub fn change() -> BoxedStrategy<Change> {
    prop_oneof![
        4 => (0..3usize, 1..=6u32, 1..=6u32)
            .prop_map(|(quota, limit, burst)| Change::Limit { quota, limit, burst }),
        1 => (
            0..3usize,
            prop_oneof![
                Just(Alg::Bucket),
                Just(Alg::Sliding),
                Just(Alg::Fixed),
                Just(Alg::Turn),
                Just(Alg::Counter)
            ]
        )
            .prop_map(|(quota, alg)| Change::Algorithm { quota, alg }),
        1 => any_spec().prop_map(Change::Add),
        1 => Just(Change::Remove),
    ]
    .boxed()
}

/// `specs` after `change` (at most three quotas, at least one).
pub fn changed(specs: &[Spec], change: &Change) -> Vec<Spec> {
    let mut new = specs.to_vec();
    match *change {
        Change::Limit {
            quota,
            limit,
            burst,
        } => {
            let old = new[quota % new.len()];
            new[quota % specs.len()] =
                Spec::new(old.alg, limit, old.period_ms, burst, old.per_request);
        }
        Change::Algorithm { quota, alg } => {
            let old = new[quota % new.len()];
            new[quota % specs.len()] =
                Spec::new(alg, old.limit, old.period_ms, old.limit, old.per_request);
        }
        Change::Add(spec) => {
            if new.len() < 3 {
                new.push(spec);
            }
        }
        Change::Remove => {
            if new.len() > 1 {
                new.pop();
            }
        }
    }
    new
}

/// Each quota with the table it lives in: the old one where the retune
/// keeps it (same algorithm, unit and period in the same place), else a
/// new one, numbered from `next`.
pub fn tables(old: &[(Spec, usize)], new: &[Spec], next: &mut usize) -> Vec<(Spec, usize)> {
    new.iter()
        .enumerate()
        .map(|(i, spec)| match old.get(i) {
            Some(&(o, table))
                if o.alg == spec.alg
                    && o.per_request == spec.per_request
                    && o.period_ms == spec.period_ms =>
            {
                (*spec, table)
            }
            _ => {
                *next += 1;
                (*spec, *next)
            }
        })
        .collect()
}
