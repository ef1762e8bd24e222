//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

// The tests that use these helpers drive limiters with paused tokio time,
// which limiters follow only with the `test-util` feature (see
// `tower_throttle::clock`): each such test file is `cfg`'d on it, so a
// plain `cargo test` leaves them out and `tests/features.rs` says so.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tower::Service;
use tower_throttle::rate_limit::{Algorithm, Quota};

/// Every algorithm, for tests written once and run against each.
pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
];

/// `limit` per `period` under `algorithm`.
pub fn quota(algorithm: Algorithm, limit: u32, period: Duration) -> Quota {
    Quota::new(limit, period)
        .expect("test quota is valid")
        .with_algorithm(algorithm)
}

/// A request with header `x-key: key` and `x-seq: seq`.
pub fn request(key: &str, seq: usize) -> http::Request<()> {
    http::Request::builder()
        .header("x-key", key)
        .header("x-seq", seq.to_string())
        .body(())
        .expect("valid test request")
}

/// What the inner service saw: how many calls, and each call's `x-seq` and
/// instant.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub calls: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<(usize, Instant)>>>,
}

impl Record {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn order(&self) -> Vec<usize> {
        self.seen.lock().iter().map(|&(seq, _)| seq).collect()
    }

    pub fn instants(&self) -> Vec<Instant> {
        self.seen.lock().iter().map(|&(_, at)| at).collect()
    }
}

/// An inner service that answers at once and records each call; it fails
/// every call when `fail` is set.
#[derive(Clone, Debug, Default)]
pub struct Inner {
    pub record: Record,
    pub fail: bool,
}

impl Inner {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn failing() -> Self {
        Self {
            fail: true,
            ..Self::default()
        }
    }
}

/// The error the failing inner service returns.
#[derive(Debug)]
pub struct InnerFailed;

impl std::fmt::Display for InnerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("inner service failed")
    }
}

impl std::error::Error for InnerFailed {}

impl Service<http::Request<()>> for Inner {
    type Response = http::Response<()>;
    type Error = InnerFailed;
    type Future = Ready<Result<http::Response<()>, InnerFailed>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<()>) -> Self::Future {
        self.record.calls.fetch_add(1, Ordering::SeqCst);
        let seq = req
            .headers()
            .get("x-seq")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(usize::MAX);
        self.record.seen.lock().push((seq, Instant::now()));
        if self.fail {
            ready(Err(InnerFailed))
        } else {
            ready(Ok(http::Response::new(())))
        }
    }
}

/// A never-failing placeholder error type for closures.
pub type NoError = Infallible;

/// A small deterministic generator, so "random" tests replay exactly.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// Checks that admissions at `instants` obey `limit` per `period` exactly as
/// `algorithm` defines it (a token bucket's burst being its limit);
/// `boundary` is any fixed-window boundary instant. Returns the first
/// violation found.
pub fn check_conformance(
    algorithm: Algorithm,
    limit: u32,
    period: Duration,
    boundary: Instant,
    instants: &[Instant],
) -> Result<(), String> {
    conforms(&quota(algorithm, limit, period), boundary, instants)
}

/// Checks that admissions at `instants` obey `quota` exactly as its
/// algorithm defines it; `boundary` is any fixed-window boundary instant.
/// Returns the first violation found.
pub fn conforms(quota: &Quota, boundary: Instant, instants: &[Instant]) -> Result<(), String> {
    let (algorithm, limit, period) = (quota.algorithm(), quota.limit(), quota.period());
    let mut sorted = instants.to_vec();
    sorted.sort();
    let limit = limit as usize;
    // A sliding window counter holds an aligned window to the limit, as a
    // fixed window, and a rolling one to twice it; and at each admission,
    // the window before weighed by the share of it still covered.
    let rolling_limit = if algorithm == Algorithm::SlidingWindowCounter {
        2 * limit
    } else {
        limit
    };
    if algorithm == Algorithm::SlidingWindowCounter {
        weighed_conforms(quota, boundary, &sorted)?;
    }
    match algorithm {
        Algorithm::SlidingWindow | Algorithm::SlidingWindowCounter => {
            for i in 0..sorted.len() {
                let n = sorted[i..]
                    .iter()
                    .take_while(|&&t| t - sorted[i] < period)
                    .count();
                if n > rolling_limit {
                    let base = sorted[0];
                    let around: Vec<_> = sorted[i..(i + n).min(sorted.len())]
                        .iter()
                        .map(|&t| (t - base).as_micros())
                        .collect();
                    return Err(format!(
                        "{n} admissions in a rolling window from #{i}: {around:?} µs"
                    ));
                }
            }
        }
        _ => {}
    }
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
            let index = |t: Instant| -> i128 {
                let ns = if t >= boundary {
                    (t - boundary).as_nanos() as i128
                } else {
                    -((boundary - t).as_nanos() as i128)
                };
                ns.div_euclid(period.as_nanos() as i128)
            };
            let mut counts = std::collections::HashMap::new();
            for &t in &sorted {
                *counts.entry(index(t)).or_insert(0usize) += 1;
            }
            if let Some((w, n)) = counts.into_iter().find(|&(_, n)| n > limit) {
                let rel: Vec<_> = sorted
                    .iter()
                    .filter(|&&t| index(t) == w)
                    .map(|&t| (t - sorted[0]).as_micros())
                    .collect();
                return Err(format!(
                    "{n} admissions in fixed window {w}: {rel:?} µs after the first, boundary at {:?}",
                    boundary.checked_duration_since(sorted[0])
                ));
            }
        }
        Algorithm::SlidingWindow => {}
        _ => {
            // Token bucket of capacity `burst` refilling one unit per
            // period / limit: any run of admissions from i to j fits in the
            // burst plus what refilled in between.
            let emission = period.as_nanos().div_ceil(limit as u128);
            let burst = u128::from(quota.burst());
            for i in 0..sorted.len() {
                for j in i..sorted.len() {
                    let refilled = (sorted[j] - sorted[i]).as_nanos() / emission;
                    let n = (j - i + 1) as u128;
                    if n > burst + refilled {
                        return Err(format!("{n} admissions between #{i} and #{j}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A sliding window counter's own promise, at each admission `t` (sorted):
/// `previous × (end − t) + current × period ≤ limit × period`, with
/// `previous` what the aligned window before admitted and `current` what
/// this one admitted up to `t`.
fn weighed_conforms(quota: &Quota, boundary: Instant, sorted: &[Instant]) -> Result<(), String> {
    let period = quota.period().as_nanos() as i128;
    let offset = |t: Instant| -> i128 {
        if t >= boundary {
            (t - boundary).as_nanos() as i128
        } else {
            -((boundary - t).as_nanos() as i128)
        }
    };
    for (i, &t) in sorted.iter().enumerate() {
        let w = offset(t).div_euclid(period);
        let count = |index: i128| {
            sorted[..=i]
                .iter()
                .filter(|&&a| offset(a).div_euclid(period) == index)
                .count() as i128
        };
        let end = (w + 1) * period;
        let weighed = count(w - 1) * (end - offset(t)) + count(w) * period;
        if weighed > i128::from(quota.limit()) * period {
            return Err(format!(
                "admission #{i} over the weighted count: {} before, {} in its window",
                count(w - 1),
                count(w)
            ));
        }
    }
    Ok(())
}

/// The window boundary a key filled at once from nothing says it is
/// refused until (`refused_until`, now plus its `retry_after`): that
/// instant itself, but for a sliding window counter, which admits again
/// `ceil(period / limit)` into the next window (its previous window then
/// weighing one unit less than the limit).
pub fn boundary_of(
    algorithm: Algorithm,
    limit: u32,
    period: Duration,
    refused_until: Instant,
) -> Instant {
    if algorithm == Algorithm::SlidingWindowCounter {
        let into = period.as_nanos().div_ceil(u128::from(limit));
        refused_until - Duration::from_nanos(into as u64)
    } else {
        refused_until
    }
}
