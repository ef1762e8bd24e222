//! A retune to another period on a Redis store, which converts each key's
//! state at the key's next request: the properties of
//! `rate_limit_retune_period.rs` (after the retune, each admission keeps
//! the new quota, counting what the old state still held), in reject mode,
//! on the scripts' clock moved by hand, with "still held" as of that next
//! request (in process, as of the retune: Redis cannot convert every key
//! at once, so a window that ended in between is not counted).
//! One `redis-server` for every case.
//!
//! `TT_PROPTEST_CASES` sets the cases per algorithm (default below).

#![cfg(feature = "redis")]

#[path = "support/props.rs"]
mod props;
#[path = "support/rate_layer.rs"]
mod rate_layer;
#[path = "support/rate_model.rs"]
mod rate_model;
#[path = "support/retune_period.rs"]
mod retune_period;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::test_runner::{TestCaseError, TestRunner};
use rate_layer::request;
use rate_model::{Alg, Spec, Windows};
use retune_period::{Admitted, Op, holds, ops, retune};
use testkit::redis::{self as redis_server, RedisServer};
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::error::CostTooHigh;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::RateLimitLayer;
use tower_throttle::redis::{OnError, RedisStore};

fn cost_of(req: &http::Request<()>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// `before`, the retune, `after`, on `server` under `prefix`; `Err` says
/// what broke, with the history.
async fn run(
    server: &RedisServer,
    prefix: &str,
    (old, new): (Spec, Spec),
    before: &[Op],
    after: &[Op],
    whole: bool,
) -> Result<(), String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let micros = Arc::new(AtomicU64::new(now / 1_000 * 1_000));
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5))
        .with_on_error(OnError::Closed)
        .with_test_clock(micros.clone());
    let store = if whole {
        store.with_whole_admit_script()
    } else {
        store
    };
    let layer = RateLimitLayer::new(old.quota(), HeaderKey::new("x-key").expect("valid"))
        .with_cost(cost_of as fn(&http::Request<()>) -> u32)
        .with_store(store)
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, BoxError>(http::Response::new(()))
    }));
    // Windows on Redis's clock are aligned to whole periods since the
    // epoch: nanoseconds since the epoch, anchored at 0.
    let windows = Windows { anchor: 0 };
    let at = || micros.load(Ordering::SeqCst) * 1_000;
    let mut all: Vec<Admitted> = Vec::new();
    let mut trace = Vec::new();
    // Per key, its first request after the retune: when its state is
    // converted.
    let mut converted = [None::<u64>; 3];
    for (after_retune, ops) in [(false, before), (true, after)] {
        if after_retune {
            handle
                .retune(vec![new.quota()], Vec::new())
                .expect("a valid retune");
            trace.push(format!("retune to {new:?} at {} ns", at()));
        }
        for (id, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance { ms } => {
                    micros.fetch_add(ms * 1_000, Ordering::SeqCst);
                }
                Op::Request { key, cost } => {
                    let outcome = svc
                        .ready()
                        .await
                        .expect("ready")
                        .call(request(key, cost, id))
                        .await;
                    let t = at();
                    // A cost above the new quota's capacity is refused
                    // before Redis is asked.
                    let asked = outcome
                        .as_ref()
                        .map_or_else(|e| !e.is::<CostTooHigh>(), |_| true);
                    if after_retune && asked {
                        converted[usize::from(key)].get_or_insert(t);
                    }
                    trace.push(format!(
                        "{t} ns: key {key} cost {cost}: {}",
                        outcome.is_ok()
                    ));
                    if outcome.is_ok() {
                        let admitted = Admitted {
                            key,
                            at: t,
                            cost,
                            after: after_retune,
                        };
                        all.push(admitted);
                        if let Some(retuned) = converted[usize::from(key)] {
                            holds((&old, &new), windows, retuned, &all, admitted, 0)
                                .map_err(|e| format!("{e}\nfrom {old:?}\n{}", trace.join("\n")))?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn a_retune_to_another_period_in_redis_keeps_what_was_spent() {
    let Some(server) = RedisServer::start("a_retune_to_another_period_in_redis") else {
        return;
    };
    let runtime = redis_server::runtime();
    let case = AtomicU64::new(0);
    for alg in [Alg::Fixed, Alg::Sliding, Alg::Counter, Alg::Bucket] {
        let mut runner = TestRunner::new(props::config(48));
        let strategy = (retune(alg), ops(), ops());
        let result = runner.run(&strategy, |(specs, before, after)| {
            // Through the short script for a lone quota (where there is
            // one) and the whole one.
            for whole in [false, true] {
                let prefix = format!("period:{}:", case.fetch_add(1, Ordering::Relaxed));
                runtime
                    .block_on(run(&server, &prefix, specs, &before, &after, whole))
                    .map_err(|e| TestCaseError::fail(format!("whole script: {whole}: {e}")))?;
            }
            Ok(())
        });
        if let Err(e) = result {
            panic!("{alg:?}: {e}");
        }
    }
}
