//! Quotas counting requests beside quotas counting cost, and settled costs,
//! on a rate limiter whose state is in Redis. Each test starts a
//! `redis-server` of its own (see `support/redis.rs`).

#![cfg(feature = "redis")]

use testkit::redis as redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Algorithm, Estimated, Quota, RateLimitLayer, Settlement, Unit};
use tower_throttle::redis::{OnError, RedisStore};

type Svc = tower::util::BoxService<http::Request<()>, http::Response<()>, BoxError>;

fn cost_of(req: &http::Request<()>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// A replica on `server` with `quotas`, on a clock that stands still (so
/// nothing refills while a test runs).
fn replica(server: &RedisServer, quotas: Vec<Quota>) -> Svc {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    replica_at(server, quotas, Arc::new(AtomicU64::new(now)))
}

async fn send(svc: &mut Svc, cost: u32) -> Result<Settlement, BoxError> {
    send_key(svc, "k", cost).await
}

async fn send_key(svc: &mut Svc, key: &str, cost: u32) -> Result<Settlement, BoxError> {
    let settlement = Settlement::new();
    let mut req = http::Request::builder()
        .header("x-key", key)
        .header("x-cost", cost.to_string())
        .body(())
        .expect("valid request");
    req.extensions_mut().insert(settlement.clone());
    svc.ready().await?.call(req).await?;
    Ok(settlement)
}

#[tokio::test]
async fn a_request_quota_counts_one_per_request_beside_a_cost_quota_in_redis() {
    let Some(server) = RedisServer::start("a_request_quota_counts_one_in_redis") else {
        return;
    };
    let mut svc = replica(
        &server,
        vec![
            Quota::per_minute(3)
                .expect("valid")
                .with_unit(Unit::Requests),
            Quota::per_minute(1_000).expect("valid"),
        ],
    );
    send(&mut svc, 600).await.expect("600 of 1,000, 1 of 3");
    let refused = send(&mut svc, 600).await.unwrap_err();
    assert!(refused.is::<RateLimited>(), "{refused}");
    // Nothing was taken by the refusal: two requests left, whatever they cost.
    send(&mut svc, 100).await.expect("700, 2 of 3");
    send(&mut svc, 1).await.expect("701, 3 of 3");
    let refused = send(&mut svc, 1).await.unwrap_err();
    let refused = refused.downcast_ref::<RateLimited>().expect("refused");
    assert_eq!(refused.quota.expect("a quota").unit(), Unit::Requests);
}

#[tokio::test]
async fn an_overestimate_settled_in_redis_gives_the_excess_back() {
    let Some(server) = RedisServer::start("an_overestimate_settled_in_redis") else {
        return;
    };
    let quotas = vec![
        Quota::per_minute(2)
            .expect("valid")
            .with_unit(Unit::Requests),
        Quota::per_minute(1_000).expect("valid").fixed_window(),
    ];
    let mut svc = replica(&server, quotas);
    let settlement = send(&mut svc, 600).await.expect("600 of 1,000");
    assert!(settlement.settle(100));
    // The excess goes back in a task of its own: wait until a request that
    // fits only once it has is admitted (a hang guard bounds the wait).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match send(&mut svc, 500).await {
            Ok(_) => break,
            Err(e) if e.is::<RateLimited>() => {
                assert!(tokio::time::Instant::now() < deadline, "never given back");
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // 600 of 1,000 tokens, and both requests: the request quota took no
    // part in the settlement.
    let refused = send(&mut svc, 1).await.unwrap_err();
    let refused = refused.downcast_ref::<RateLimited>().expect("refused");
    assert_eq!(refused.quota.expect("a quota").unit(), Unit::Requests);
}

/// A replica on `server` with `quotas`, on the test clock `clock` (µs).
fn replica_at(server: &RedisServer, quotas: Vec<Quota>, clock: Arc<AtomicU64>) -> Svc {
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix("settle:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed)
        .with_test_clock(clock);
    let layer = RateLimitLayer::with_quotas(quotas, HeaderKey::new("x-key").expect("valid"))
        .with_cost(Estimated(cost_of))
        .with_store(store)
        .expect("quotas Redis keeps");
    let inner = tower::service_fn(|_req: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(()))
    });
    tower::util::BoxService::new(layer.layer(inner))
}

#[tokio::test]
async fn a_token_bucket_settled_in_redis_gives_back_what_the_whole_charge_still_owes() {
    let Some(server) = RedisServer::start("a_token_bucket_settled_in_redis") else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let clock = Arc::new(AtomicU64::new(now));
    let quotas = || vec![Quota::per_minute(1_000).expect("valid")];
    let mut svc = replica_at(&server, quotas(), clock.clone());
    let settlement = send(&mut svc, 600).await.expect("600 of 1,000");
    // 30 s on, 500 have come back by themselves: 100 of the 600 are still
    // owed. The request used 100, so nothing is: the bucket is full again,
    // as an in-process bucket settles it.
    clock.fetch_add(30_000_000, std::sync::atomic::Ordering::SeqCst);
    assert!(settlement.settle(100));
    // The excess goes back in a task of its own. Each try on a replica of
    // its own, so that no refusal cached before it landed answers for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut fresh = replica_at(&server, quotas(), clock.clone());
        match send(&mut fresh, 1_000).await {
            Ok(_) => break,
            Err(e) if e.is::<RateLimited>() => {
                assert!(tokio::time::Instant::now() < deadline, "never given back");
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_settled_excess_in_redis_goes_back_to_a_sliding_window_and_the_other_quotas() {
    let Some(server) = RedisServer::start("a_settled_excess_beside_a_sliding_window") else {
        return;
    };
    let quotas = || {
        vec![
            Quota::per_minute(150).expect("valid").sliding_window(),
            Quota::per_minute(100).expect("valid"),
        ]
    };
    let mut svc = replica(&server, quotas());
    let settlement = send(&mut svc, 60).await.expect("60 of 100");
    // The sliding window's booking is written again at 10 (one member in
    // Redis, kept at its instant); the bucket, standing still, takes back
    // the 50 it did not use.
    assert!(settlement.settle(10));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut fresh = replica(&server, quotas());
        match send(&mut fresh, 90).await {
            Ok(_) => break,
            Err(e) if e.is::<RateLimited>() => {
                assert!(tokio::time::Instant::now() < deadline, "never given back");
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // The window holds 10 + 90, as its bookings and its sum say.
    let mut redis = server.connection();
    let windows: Vec<String> = redis::cmd("KEYS")
        .arg("settle:*w")
        .query(&mut redis)
        .expect("KEYS");
    assert_eq!(windows.len(), 1, "{windows:?}");
    let sum: f64 = redis::cmd("ZSCORE")
        .arg(&windows[0])
        .arg("#s")
        .query(&mut redis)
        .expect("ZSCORE");
    assert_eq!(-1.0 - sum, 100.0, "the sliding window kept the estimate");
    let bookings: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(&windows[0])
        .arg(0)
        .arg("+inf")
        .query(&mut redis)
        .expect("ZRANGEBYSCORE");
    let costs: u64 = bookings
        .iter()
        .map(|m| m.rsplit(':').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(costs, 100, "{bookings:?}");
    // And it never went below what was used: 20 more, which the window
    // has room for, is refused by the bucket, not let through.
    let mut fresh = replica(&server, quotas());
    let refused = send(&mut fresh, 20).await.unwrap_err();
    let refused = refused.downcast_ref::<RateLimited>().expect("refused");
    assert_eq!(
        refused.quota.expect("a quota").algorithm(),
        Algorithm::TokenBucket
    );
}

/// An underestimate settled in Redis is charged the difference, without
/// refusal, for every algorithm: the next request that fits only on the
/// estimate is refused once the charge is in (a fresh replica asks Redis,
/// not a cache).
#[tokio::test]
async fn an_underestimate_settled_in_redis_is_charged_the_difference() {
    let Some(server) = RedisServer::start("an_underestimate_settled_in_redis") else {
        return;
    };
    for (n, quota) in [
        Quota::per_minute(100).expect("valid"),
        Quota::per_minute(100).expect("valid").sliding_window(),
        Quota::per_minute(100).expect("valid").fixed_window(),
        Quota::per_turn(100).expect("valid"),
        Quota::per_minute(100)
            .expect("valid")
            .sliding_window_counter(),
    ]
    .into_iter()
    .enumerate()
    {
        let algorithm = quota.algorithm();
        let clock = Arc::new(AtomicU64::new(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_micros() as u64,
        ));
        // Each algorithm on a key of its own.
        let mut svc = replica_at(&server, vec![quota], clock.clone());
        let key = format!("short-{n}");
        let settlement = send_key(&mut svc, &key, 10).await.expect("10 of 100");
        let before = scripts_run(&server);
        assert!(settlement.settle(70), "{algorithm:?}");
        // The charge runs in a task of its own: once Redis ran it,
        // 70 are used and 30 left, so 40 no longer fits.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while scripts_run(&server) == before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{algorithm:?}: never charged"
            );
            tokio::task::yield_now().await;
        }
        // No state was left without a TTL (a sliding window's one booking
        // is written again before the old one goes).
        let mut redis = server.connection();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("settle:*")
            .query(&mut redis)
            .expect("KEYS");
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query(&mut redis)
                .expect("PTTL");
            assert!(ttl > 0, "{algorithm:?}: {key} has no TTL ({ttl})");
        }
        let mut fresh = replica_at(&server, vec![quota], clock.clone());
        let refused = send_key(&mut fresh, &key, 40).await.unwrap_err();
        assert!(refused.is::<RateLimited>(), "{algorithm:?}: {refused}");
        send_key(&mut fresh, &key, 30)
            .await
            .unwrap_or_else(|e| panic!("{algorithm:?}: 30 still fit: {e}"));
    }
}

/// How many scripts Redis has run to the end (`EVALSHA` calls, less those
/// that failed: a `NOSCRIPT` before the script is loaded counts as one).
fn scripts_run(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO");
    let Some(line) = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
    else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    field("calls=") - field("failed_calls=")
}
