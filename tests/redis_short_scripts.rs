//! The short admission scripts (one token bucket, one window counting
//! requests, one sliding window counter) decide as the whole one where the
//! generated histories of `redis_model.rs` do not reach: a waiter booked
//! ahead when the quota loosens, and a state the short script leaves to
//! the whole one.

#![cfg(feature = "redis")]

use testkit::redis as redis_server;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use support::{Inner, request};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer, Unit};
use tower_throttle::redis::{OnError, RedisStore};

const MINUTE: Duration = Duration::from_secs(60);

/// A store on `server` under `prefix`, failing closed, on a clock that
/// stands still; through the whole admission script only when `whole`.
fn store(server: &RedisServer, prefix: &str, clock: &Arc<AtomicU64>, whole: bool) -> RedisStore {
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed)
        .with_test_clock(clock.clone());
    if whole {
        store.with_whole_admit_script()
    } else {
        store
    }
}

/// The SHA1 Redis knows a script by: the short form for a lone window
/// counting requests, and the whole admission script.
fn short_script_hash() -> String {
    redis::Script::new(include_str!("../src/rate_limit/redis/admit_window.lua"))
        .get_hash()
        .to_owned()
}

fn whole_script_hash() -> String {
    redis::Script::new(include_str!("../src/rate_limit/redis/admit.lua"))
        .get_hash()
        .to_owned()
}

async fn send<S>(svc: &mut S, seq: usize) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request("k", seq)).await
}

fn retry_after(outcome: Result<http::Response<()>, BoxError>) -> Duration {
    let err = outcome.expect_err("refused");
    err.downcast_ref::<RateLimited>()
        .unwrap_or_else(|| panic!("expected RateLimited, got {err}"))
        .retry_after
}

/// One a minute; a waiter books the next minute; then the quota is ten a
/// minute on another replica: its request still goes no earlier than the
/// waiter. The wait it is told, through the script `whole` chooses.
async fn loosened_behind_a_waiter(
    server: &RedisServer,
    one: Quota,
    ten: Quota,
    whole: bool,
) -> Duration {
    let clock = Arc::new(AtomicU64::new(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as u64,
    ));
    let prefix = format!("loosened:{:?}:{whole}:", one.algorithm());
    let layer = |quota: Quota, wait: Duration| {
        RateLimitLayer::new(quota, GlobalKey)
            .with_store(store(server, &prefix, &clock, whole))
            .expect("a quota Redis keeps")
            .with_max_wait(wait)
            .layer(Inner::new())
    };
    send(&mut layer(one, Duration::ZERO), 0)
        .await
        .expect("the first");
    let mut waiting = layer(one, 5 * MINUTE);
    let mut waiter = tokio_test::task::spawn(async move { send(&mut waiting, 1).await });
    // Polled until Redis has its booking: the next after it is two minutes on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio_test::assert_pending!(waiter.poll());
        if retry_after(send(&mut layer(one, Duration::ZERO), 2).await) == 2 * MINUTE {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never booked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let told = retry_after(send(&mut layer(ten, Duration::ZERO), 3).await);
    drop(waiter);
    told
}

#[tokio::test]
async fn a_loosened_quota_lets_no_request_go_before_a_waiter_booked_ahead() {
    let Some(server) = RedisServer::start("loosened_behind_a_waiter") else {
        return;
    };
    let window = |n| {
        Quota::per_minute(n)
            .expect("valid")
            .sliding_window()
            .with_unit(Unit::Requests)
    };
    let bucket = |n| Quota::per_minute(n).expect("valid");
    // The window: its one booking and the waiter's leave room for nine
    // more, but none before the waiter's minute. The bucket: the waiter's
    // instant stays, and the new burst of ten counts from it.
    for (one, ten, expected) in [
        (window(1), window(10), MINUTE),
        (bucket(1), bucket(10), MINUTE + Duration::from_secs(6)),
    ] {
        let short = loosened_behind_a_waiter(&server, one, ten, false).await;
        let whole = loosened_behind_a_waiter(&server, one, ten, true).await;
        assert_eq!((short, whole), (expected, expected), "{one:?}");
    }
}

#[tokio::test]
async fn a_window_counting_requests_without_its_figures_is_counted_again() {
    let Some(server) = RedisServer::start("short_window_figures_gone") else {
        return;
    };
    let clock = Arc::new(AtomicU64::new(1_800_000_000_000_000));
    let quota = Quota::per_minute(3)
        .expect("valid")
        .sliding_window()
        .with_unit(Unit::Requests);
    let mut svc = RateLimitLayer::new(quota, GlobalKey)
        .with_store(store(&server, "figures:", &clock, false))
        .expect("a quota Redis keeps")
        .layer(Inner::new());
    for i in 0..3 {
        send(&mut svc, i).await.expect("within the quota");
    }
    // So far the short script alone ran.
    let mut redis = server.connection();
    let loaded = |redis: &mut redis::Connection| -> Vec<bool> {
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&[short_script_hash(), whole_script_hash()])
            .query(redis)
            .expect("SCRIPT EXISTS")
    };
    assert_eq!(loaded(&mut redis), [true, false]);
    // Take the figures away, as no script of ours does: the short script
    // leaves such a set to the whole one, which counts it again.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("figures:*")
        .query(&mut redis)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let removed: i64 = redis::cmd("ZREMRANGEBYSCORE")
        .arg(&keys[0])
        .arg("-inf")
        .arg("(0")
        .query(&mut redis)
        .expect("ZREMRANGEBYSCORE");
    assert_eq!(removed, 5);
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    assert_eq!(
        retry_after(send(&mut svc, 3).await),
        MINUTE - Duration::from_secs(1),
        "still three in the window"
    );
    // The short script answered {2}; the whole one ran (loaded only now).
    assert_eq!(loaded(&mut redis), [true, true]);
    let figures: i64 = redis::cmd("ZCOUNT")
        .arg(&keys[0])
        .arg("-inf")
        .arg("(0")
        .query(&mut redis)
        .expect("ZCOUNT");
    assert_eq!(figures, 5, "the figures are written back");
}

/// A counter retuned to another window on another replica: its state is
/// the whole script's to convert (the short one answers `{2}`), and what
/// the old windows counted stays counted.
#[tokio::test]
async fn a_counter_kept_under_another_window_is_converted_by_the_whole_script() {
    let Some(server) = RedisServer::start("short_counter_retuned") else {
        return;
    };
    // On a boundary of two minutes.
    let clock = Arc::new(AtomicU64::new(
        1_800_000_000_000_000 / 120_000_000 * 120_000_000,
    ));
    let per_minute = |limit| {
        Quota::per_minute(limit)
            .expect("valid")
            .sliding_window_counter()
    };
    let replica = |quota| {
        RateLimitLayer::new(quota, GlobalKey)
            .with_store(store(&server, "counter:", &clock, false))
            .expect("a quota Redis keeps")
            .layer(Inner::new())
    };
    let mut svc = replica(per_minute(3));
    for i in 0..3 {
        send(&mut svc, i).await.expect("within the quota");
    }
    let counter_hash =
        redis::Script::new(include_str!("../src/rate_limit/redis/admit_counter.lua"))
            .get_hash()
            .to_owned();
    let mut redis = server.connection();
    let loaded = |redis: &mut redis::Connection| -> Vec<bool> {
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&[counter_hash.clone(), whole_script_hash()])
            .query(redis)
            .expect("SCRIPT EXISTS")
    };
    assert_eq!(loaded(&mut redis), [true, false]);
    // Six every two minutes, on a replica that starts with it: the three
    // counted stay in the new window, and the minute before them, which
    // the state forgot, is taken as full (three) in the window before:
    // 3 × 119/120 + 3 + 1 > 6, so the next fits 40 s into the window.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    let two_minutes = Quota::new(6, Duration::from_secs(120))
        .expect("valid")
        .sliding_window_counter();
    let mut slower = replica(two_minutes);
    assert_eq!(
        retry_after(send(&mut slower, 3).await),
        Duration::from_secs(39)
    );
    assert_eq!(
        loaded(&mut redis),
        [true, true],
        "the whole script converted it"
    );
}

/// A counter's state no script of ours wrote (not whole numbers, a window
/// of zero, a field too many) is taken as none, by either script: the
/// admission neither fails nor trusts it, and the state is written anew.
#[tokio::test]
async fn a_counter_state_no_script_wrote_is_taken_as_none() {
    let Some(server) = RedisServer::start("short_counter_hostile") else {
        return;
    };
    let clock = Arc::new(AtomicU64::new(1_800_000_000_000_000));
    let quota = Quota::per_minute(2)
        .expect("valid")
        .sliding_window_counter();
    let mut redis = server.connection();
    for (n, hostile) in [
        "nan,0,0,0,60000000,2",
        "1e300,0,5,0,60000000,2",
        "1800000060000000,9,9,0,0,2",
        "1800000060000000,9,9,0,60000000,2,junk",
        "-5,9,9,0,60000000,2",
    ]
    .into_iter()
    .enumerate()
    {
        for whole in [false, true] {
            let prefix = format!("hostile{n}{whole}:");
            let mut svc = RateLimitLayer::new(quota, GlobalKey)
                .with_store(store(&server, &prefix, &clock, whole))
                .expect("a quota Redis keeps")
                .layer(Inner::new());
            send(&mut svc, 0).await.expect("a fresh key");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}*"))
                .query(&mut redis)
                .expect("KEYS");
            assert_eq!(keys.len(), 1, "{keys:?}");
            let () = redis::cmd("SET")
                .arg(&keys[0])
                .arg(hostile)
                .query(&mut redis)
                .expect("SET");
            for i in 1..3 {
                send(&mut svc, i)
                    .await
                    .unwrap_or_else(|e| panic!("{hostile} (whole: {whole}): {e}"));
            }
            assert!(send(&mut svc, 3).await.is_err(), "{hostile}: two a minute");
            let state: String = redis::cmd("GET")
                .arg(&keys[0])
                .query(&mut redis)
                .expect("GET");
            assert!(
                state.split(',').count() == 6
                    && state
                        .split(',')
                        .all(|f| f.bytes().all(|b| b.is_ascii_digit())),
                "{hostile}: written anew as {state}"
            );
        }
    }
}
