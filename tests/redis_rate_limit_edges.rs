//! Edges of a rate limiter on Redis: state a refusal leaves behind, builder
//! methods after `with_store`, and replies no script of ours gives. Each
//! test starts a `redis-server` of its own (see `support/redis.rs`).

#![cfg(feature = "redis")]

use testkit::capture;
use testkit::redis as redis_server;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use support::{Inner, request};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Algorithm, KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::redis::{OnError, RedisStore};

const MINUTE: Duration = Duration::from_secs(60);

/// The scripts' clock, moved by hand: microseconds since the epoch, on a
/// whole minute.
fn clock() -> Arc<AtomicU64> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let minute = 60_000_000;
    Arc::new(AtomicU64::new((now / minute + 1) * minute))
}

/// A store on `server` under `prefix`, failing closed, on `clock`.
fn store(server: &RedisServer, prefix: &str, clock: &Arc<AtomicU64>) -> RedisStore {
    RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed)
        .with_test_clock(clock.clone())
}

fn header_key() -> HeaderKey {
    HeaderKey::new("x-key").expect("valid header name")
}

async fn send<S>(svc: &mut S, key: &str, seq: usize) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request(key, seq)).await
}

fn is_refused(outcome: &Result<http::Response<()>, BoxError>) -> bool {
    outcome.as_ref().is_err_and(|e| e.is::<RateLimited>())
}

#[tokio::test]
async fn a_key_moved_to_a_sliding_window_rule_stays_spent_after_its_first_refusal() {
    let Some(server) = RedisServer::start("a_key_moved_to_a_sliding_window_rule") else {
        return;
    };
    let clock = clock();
    let default = || Quota::per_minute(2).expect("valid");
    let vip = Rule::new("vip", KeyPattern::parts(["vip-*"]).expect("valid"))
        .with_quota(Quota::per_minute(3).expect("valid").sliding_window());
    // One replica from before the rule; two that have it (each remembers
    // its own refusals, so each is asked once).
    let replica = |rules: Vec<Rule>| {
        let mut layer = RateLimitLayer::new(default(), header_key());
        for rule in rules {
            layer = layer.with_rule(rule).expect("one rule");
        }
        layer
            .with_store(store(&server, "moved:", &clock))
            .expect("quotas Redis keeps")
            .layer(Inner::new())
    };
    let (mut old, mut b, mut c) = (
        replica(vec![]),
        replica(vec![vip.clone()]),
        replica(vec![vip]),
    );
    send(&mut old, "vip-1", 0)
        .await
        .expect("spent under the default");
    // Under its new rule the key starts spent: a whole window's worth, on
    // every replica.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    let outcome = send(&mut b, "vip-1", 1).await;
    assert!(is_refused(&outcome), "{outcome:?}");
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    let outcome = send(&mut c, "vip-1", 2).await;
    assert!(is_refused(&outcome), "{outcome:?}");
    // What the refusal left in Redis goes away by itself.
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("moved:*")
        .query(&mut conn)
        .expect("KEYS");
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    // A window after the move, the key has its three, and no more.
    clock.fetch_add(MINUTE.as_micros() as u64, Ordering::SeqCst);
    for seq in 3..6 {
        send(&mut b, "vip-1", seq).await.expect("a new window");
    }
    let outcome = send(&mut c, "vip-1", 6).await;
    assert!(is_refused(&outcome), "{outcome:?}");
}

#[test]
fn a_rule_added_after_with_store_is_checked_against_redis() {
    let store = RedisStore::new("redis://127.0.0.1:1").expect("valid URL");
    let fine = Rule::new("fast", KeyPattern::parts(["fast-*"]).expect("valid"))
        .with_quota(Quota::per_second(20_000).expect("valid"));
    let err = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store)
        .expect("a quota Redis keeps")
        .with_rule(fine)
        .expect_err("finer than Redis keeps time");
    assert!(err.to_string().contains("rules[0].quotas[0]"), "{err}");
}

/// Every request fails but those numbered below 100, and request 0 only
/// once `release` is notified; each call is counted.
fn slow_inner(
    release: Arc<tokio::sync::Notify>,
    calls: Arc<AtomicU64>,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = support::InnerFailed,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |req: http::Request<()>| {
        let (release, calls) = (release.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let seq: usize = req
                .headers()
                .get("x-seq")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(usize::MAX);
            if seq == 0 {
                release.notified().await;
                return Err(support::InnerFailed);
            }
            Ok(http::Response::new(()))
        }
    })
}

#[tokio::test]
async fn a_slow_outcome_that_does_not_count_gives_back_no_unit_the_bucket_refilled() {
    let Some(server) = RedisServer::start("a_slow_outcome_gives_back") else {
        return;
    };
    let clock = clock();
    let (release, calls) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let layer = RateLimitLayer::new(Quota::per_minute(3).expect("valid"), header_key())
        .with_store(store(&server, "slow:", &clock))
        .expect("a quota Redis keeps")
        .count_only(|outcome: &Result<http::Response<()>, support::InnerFailed>| outcome.is_ok());
    let handle = layer.handle();
    let svc = layer.layer(slow_inner(release.clone(), calls.clone()));
    // Request 0 goes, and takes its time.
    let slow = tokio::spawn({
        let svc = svc.clone();
        async move { svc.oneshot(request("k", 0)).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never called");
        tokio::task::yield_now().await;
    }
    // A minute on the bucket is full again: three go, the fourth is refused
    // (and remembered as refused here).
    clock.fetch_add(MINUTE.as_micros() as u64, Ordering::SeqCst);
    for seq in 1..4 {
        svc.clone()
            .oneshot(request("k", seq))
            .await
            .expect("a full bucket");
    }
    let outcome = svc.clone().oneshot(request("k", 4)).await;
    assert!(is_refused(&outcome), "{outcome:?}");
    assert!(handle.peek_wait(&["k"]) > Duration::ZERO);
    // Request 0 fails, which does not count: its unit came back by itself
    // long ago, so nothing is given back. Redis has heard it once the
    // refusal remembered here is forgotten.
    release.notify_one();
    slow.await.expect("ran").expect_err("inner fails");
    while handle.peek_wait(&["k"]) > Duration::ZERO {
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let outcome = svc.clone().oneshot(request("k", 5)).await;
    assert!(is_refused(&outcome), "a fourth at once: {outcome:?}");
}

#[tokio::test]
async fn an_outcome_from_before_a_reset_gives_back_no_booking_made_after_it() {
    let Some(server) = RedisServer::start("an_outcome_from_before_a_reset") else {
        return;
    };
    let clock = clock();
    let one = || Quota::per_minute(1).expect("valid").sliding_window();
    let (release, calls) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(AtomicU64::new(0)),
    );
    let layer = RateLimitLayer::new(one(), header_key())
        .with_store(store(&server, "reset:", &clock))
        .expect("a quota Redis keeps")
        .count_only(|outcome: &Result<http::Response<()>, support::InnerFailed>| outcome.is_ok());
    let handle = layer.handle();
    let svc = layer.layer(slow_inner(release.clone(), calls.clone()));
    // Another replica, with no refusals remembered: a fresh one per probe.
    let probe = || async {
        RateLimitLayer::new(one(), header_key())
            .with_store(store(&server, "reset:", &clock))
            .expect("a quota Redis keeps")
            .layer(Inner::new())
            .oneshot(request("k", 9))
            .await
    };
    let slow = tokio::spawn({
        let svc = svc.clone();
        async move { svc.oneshot(request("k", 0)).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never called");
        tokio::task::yield_now().await;
    }
    // A second on, the key is reset, and the other replica books its one.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    handle.reset(&["k"]);
    while probe().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never reset");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let outcome = svc.clone().oneshot(request("k", 2)).await;
    assert!(is_refused(&outcome), "{outcome:?}");
    // Request 0 fails, which does not count; what it booked went with the
    // reset, and the booking made since stays.
    release.notify_one();
    slow.await.expect("ran").expect_err("inner fails");
    while handle.peek_wait(&["k"]) > Duration::ZERO {
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let outcome = probe().await;
    assert!(is_refused(&outcome), "two in a window: {outcome:?}");
}

#[tokio::test]
async fn a_refusal_heard_after_a_retune_is_not_remembered_under_the_new_quotas() {
    let Some(server) = RedisServer::start("a_refusal_heard_after_a_retune") else {
        return;
    };
    let clock = clock();
    let quotas = vec![
        Quota::per_hour(100).expect("valid"),
        Quota::per_minute(1).expect("valid"),
    ];
    let layer = RateLimitLayer::with_quotas(quotas, header_key())
        .with_store(store(&server, "retuned:", &clock))
        .expect("quotas Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "k", 0).await.expect("first");
    // Asked under two quotas; the answer (the second refuses) is heard
    // after a retune to one.
    let asked = svc.ready().await.expect("ready").call(request("k", 1));
    handle
        .retune(vec![Quota::per_hour(100).expect("valid")], vec![])
        .expect("valid retune");
    let outcome = asked.await;
    assert!(is_refused(&outcome), "{outcome:?}");
    // Under the new quota the key has room: it goes, no panic, no refusal
    // remembered from the old quotas.
    send(&mut svc, "k", 2)
        .await
        .expect("room under the new quota");
}

#[test]
fn default_quotas_redis_cannot_keep_are_not_set_silently() {
    capture::capture_logs();
    let store = RedisStore::new("redis://127.0.0.1:1").expect("valid URL");
    let layer = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store)
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    handle.set_default(vec![Quota::per_second(20_000).expect("valid")]);
    assert_eq!(
        handle.config().0,
        vec![Quota::per_minute(2).expect("valid")]
    );
    let logs = capture::log_text();
    assert!(
        logs.contains("default quotas not changed") && logs.contains("quotas[0]"),
        "{logs}"
    );
}

#[test]
fn a_prefix_is_escaped_where_it_is_logged() {
    capture::capture_logs();
    let store = RedisStore::new("redis://127.0.0.1:1")
        .expect("valid URL")
        .with_prefix("app:\u{1b}[2J\nforged line:")
        .expect("a prefix without braces");
    let _layer = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store)
        .expect("a quota Redis keeps");
    let logs = capture::log_text();
    assert!(logs.contains("app:"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs:?}");
    assert!(!logs.contains("\nforged line"), "{logs:?}");
}

#[test]
fn a_bad_redis_url_is_refused_with_its_text_escaped() {
    let err = RedisStore::new("redis://127.0.0.1:1/?protocol=%1B%5B2J%0Aforged")
        .expect_err("no such protocol");
    let text = err.to_string();
    assert!(text.contains("redis_url"), "{text}");
    assert!(!text.contains('\u{1b}') && !text.contains('\n'), "{text:?}");
}

/// A server that speaks RESP and answers every command with an error whose
/// text carries an escape sequence and a line break; its address.
async fn hostile_server() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = socket.read(&mut chunk).await {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    // One reply per whole command (`*N` then N bulk strings).
                    while let Some(used) = command_len(&buf) {
                        buf.drain(..used);
                        let reply = b"-ERR evil\x1b[2J\nforged line\r\n";
                        if socket.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The length of the whole RESP command at the start of `buf`, if it is all
/// there.
fn command_len(buf: &[u8]) -> Option<usize> {
    let line = |from: usize| -> Option<(usize, usize)> {
        let end = buf[from..].windows(2).position(|w| w == b"\r\n")? + from;
        let n = std::str::from_utf8(&buf[from + 1..end])
            .ok()?
            .parse()
            .ok()?;
        Some((n, end + 2))
    };
    let (count, mut at) = line(0)?;
    for _ in 0..count {
        let (len, start) = line(at)?;
        at = start + len + 2;
        if at > buf.len() {
            return None;
        }
    }
    Some(at)
}

#[tokio::test]
async fn an_error_a_hostile_redis_sends_is_escaped_in_the_log() {
    capture::capture_logs();
    let addr = hostile_server().await;
    let store = RedisStore::new(&format!("redis://{addr}"))
        .expect("valid URL")
        .with_prefix("hostile:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed);
    let mut svc = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store)
        .expect("a quota Redis keeps")
        .layer(Inner::new());
    let err = send(&mut svc, "k", 0).await.expect_err("no store");
    assert!(err.is::<tower_throttle::error::StoreUnavailable>(), "{err}");
    let logs = capture::log_text();
    // An error reply is an answer: logged as what it is, not an outage.
    let line = logs
        .lines()
        .find(|l| l.contains("Redis answered with an error"))
        .unwrap_or_else(|| panic!("no error logged: {logs}"));
    assert!(line.contains("evil"), "{line}");
    assert!(!logs.contains('\u{1b}'), "{logs:?}");
    assert!(!logs.contains("\nforged line"), "{logs:?}");
}

#[tokio::test]
async fn a_key_moved_to_a_new_rule_goes_again_at_its_retry_after() {
    let Some(server) = RedisServer::start("a_key_moved_goes_again") else {
        return;
    };
    let clock = clock();
    let layer = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_store(store(&server, "again:", &clock))
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "vip-1", 0)
        .await
        .expect("spent under the default");
    let vip = Rule::new("vip", KeyPattern::parts(["vip-*"]).expect("valid"))
        .with_quota(Quota::per_minute(3).expect("valid"));
    handle
        .retune(vec![Quota::per_minute(2).expect("valid")], vec![vip])
        .expect("valid retune");
    // Spent under its new rule: a unit, 20 s, away; then it goes, as in
    // process.
    let err = send(&mut svc, "vip-1", 1).await.expect_err("starts spent");
    let wait = err
        .downcast_ref::<RateLimited>()
        .expect("refused")
        .retry_after;
    assert_eq!(wait, Duration::from_secs(20));
    clock.fetch_add(wait.as_micros() as u64, Ordering::SeqCst);
    send(&mut svc, "vip-1", 2)
        .await
        .expect("at its retry_after");
}

#[tokio::test]
async fn a_key_refused_after_a_retune_goes_again_at_its_retry_after() {
    let Some(server) = RedisServer::start("a_key_refused_after_a_retune") else {
        return;
    };
    for quota in [
        Quota::per_hour(1).expect("valid"),
        Quota::per_hour(1).expect("valid").fixed_window(),
    ] {
        let clock = clock();
        let prefix = format!("retune:{:?}:", quota.algorithm());
        let layer = RateLimitLayer::new(quota, header_key())
            .with_store(store(&server, &prefix, &clock))
            .expect("a quota Redis keeps");
        let handle = layer.handle();
        let mut svc = layer.layer(Inner::new());
        send(&mut svc, "k", 0).await.expect("the hour's one");
        // Loosened to one a second (of the same algorithm): the unit spent
        // stays spent, a second at the new rate; then the key goes.
        handle.set_default(vec![
            Quota::per_second(1)
                .expect("valid")
                .with_algorithm(quota.algorithm()),
        ]);
        let err = send(&mut svc, "k", 1).await.expect_err("still spent");
        let wait = err
            .downcast_ref::<RateLimited>()
            .expect("refused")
            .retry_after;
        assert!(wait <= Duration::from_secs(1), "{quota:?}: {wait:?}");
        clock.fetch_add(wait.as_micros() as u64, Ordering::SeqCst);
        send(&mut svc, "k", 2)
            .await
            .unwrap_or_else(|e| panic!("{quota:?}: at its retry_after: {e}"));
    }
}

#[tokio::test]
async fn a_key_that_spent_its_quota_stays_refused_when_the_algorithm_changes() {
    let Some(server) = RedisServer::start("algorithm_change_keeps_spent") else {
        return;
    };
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TurnBudget,
        Algorithm::SlidingWindowCounter,
    ];
    for from in algorithms {
        for to in algorithms.into_iter().filter(|&a| a != from) {
            let clock = clock();
            let prefix = format!("algorithm:{from:?}:{to:?}:");
            let per_hour = |algorithm| Quota::per_hour(3).expect("valid").with_algorithm(algorithm);
            let layer = RateLimitLayer::new(per_hour(from), header_key())
                .with_store(store(&server, &prefix, &clock))
                .expect("a quota Redis keeps");
            let handle = layer.handle();
            let mut svc = layer.layer(Inner::new());
            for i in 0..3 {
                send(&mut svc, "k", i).await.expect("within the quota");
            }
            send(&mut svc, "part", 10).await.expect("one of three");
            handle.set_default(vec![per_hour(to)]);
            assert!(
                send(&mut svc, "k", 3).await.is_err(),
                "{from:?} -> {to:?}: a spent key got a fresh quota"
            );
            // Refused again: the carried units were kept, not made anew.
            assert!(send(&mut svc, "k", 4).await.is_err(), "{from:?} -> {to:?}");
            for i in 0..2 {
                send(&mut svc, "part", 11 + i)
                    .await
                    .unwrap_or_else(|e| panic!("{from:?} -> {to:?}: two left: {e}"));
            }
            assert!(
                send(&mut svc, "part", 13).await.is_err(),
                "{from:?} -> {to:?}"
            );
            // A reset forgets what the replaced quota held too.
            // (The reset's deletion runs in the background: polled.)
            handle.reset(&["k"]);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while let Err(e) = send(&mut svc, "k", 5).await {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{from:?} -> {to:?}: never reset: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_new_turn_on_one_replica_is_seen_by_another_within_a_second() {
    let Some(server) = RedisServer::start("new_turn_across_replicas") else {
        return;
    };
    let clock = clock();
    let replica = || {
        RateLimitLayer::new(Quota::per_turn(2).expect("valid"), header_key())
            .with_store(store(&server, "turns:", &clock))
            .expect("a quota Redis keeps")
    };
    let (a, b) = (replica(), replica());
    let mut on_a = a.clone().layer(Inner::new());
    send(&mut on_a, "agent", 0).await.expect("one of two");
    send(&mut on_a, "agent", 1).await.expect("two of two");
    // Refused, and remembered on replica A: the turn goes stale in 5 min.
    assert!(is_refused(&send(&mut on_a, "agent", 2).await));
    // The agent's new turn arrives at replica B.
    // (Its deletion runs in the background: Redis is watched for it.)
    b.handle().new_turn(&["agent"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut redis = server.connection();
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("turns:*")
            .query(&mut redis)
            .expect("KEYS");
        if keys.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Replica A still answers from its cache within the second.
    assert!(is_refused(&send(&mut on_a, "agent", 3).await));
    // A second later, replica A asks Redis again instead of its cache.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    send(&mut on_a, "agent", 4)
        .await
        .expect("the new turn, seen on the other replica");
}

#[tokio::test]
async fn a_sliding_windows_bookings_without_their_figures_are_counted_again() {
    let Some(server) = RedisServer::start("sum_evicted") else {
        return;
    };
    let clock = clock();
    let layer = RateLimitLayer::new(
        Quota::per_minute(3).expect("valid").sliding_window(),
        header_key(),
    )
    .with_store(store(&server, "evicted:", &clock))
    .expect("a quota Redis keeps");
    let mut svc = layer.layer(Inner::new());
    for i in 0..3 {
        send(&mut svc, "k", i).await.expect("within the quota");
    }
    // The window is one sorted set, its figures (sum, count...) members
    // before the bookings: take them away, as no script of ours does.
    let mut redis = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("evicted:*:rl:*w")
        .query(&mut redis)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let removed: i64 = redis::cmd("ZREM")
        .arg(&keys[0])
        .arg(&["#s", "#n", "#c", "#l", "#x"])
        .query(&mut redis)
        .expect("ZREM");
    assert_eq!(removed, 5);
    // Still three in the window: refused, not taken for an empty one.
    clock.fetch_add(1_000_000, Ordering::SeqCst);
    assert!(is_refused(&send(&mut svc, "k", 3).await));
    // The figures are back, and the set keeps a TTL.
    let sum: Option<f64> = redis::cmd("ZSCORE")
        .arg(&keys[0])
        .arg("#s")
        .query(&mut redis)
        .expect("ZSCORE");
    assert_eq!(sum, Some(-4.0), "-1 - the sum of three");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query(&mut redis)
        .expect("PTTL");
    assert!(ttl > 0, "the set has no TTL: {ttl}");
}

/// The ACL the `redis` module's docs give a least-privilege user is
/// enough: every algorithm admits, refuses and converts through it.
#[tokio::test]
async fn the_documented_acl_is_enough() {
    let Some(server) = RedisServer::start("documented_acl") else {
        return;
    };
    let mut redis = server.connection();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "limiter",
                "on",
                ">a-long-password",
                "resetkeys",
                "~acl:*",
                "resetchannels",
                "-@all",
                "+evalsha",
                "+script|load",
                "+get",
                "+set",
                "+del",
                "+unlink",
                "+exists",
                "+hmget",
                "+hset",
                "+pexpire",
                "+time",
                "+zadd",
                "+zcount",
                "+zrange",
                "+zrangebyscore",
                "+zrevrange",
                "+zrevrangebyscore",
                "+zrem",
                "+zremrangebyrank",
                "+zscore",
            ][..],
        )
        .query(&mut redis)
        .expect("ACL SETUSER");
    let url = server
        .url()
        .replace("redis://", "redis://limiter:a-long-password@");
    let store = RedisStore::new(&url)
        .expect("valid URL")
        .with_prefix("acl:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(OnError::Closed);
    let layer = RateLimitLayer::new(Quota::per_minute(2).expect("valid"), header_key())
        .with_quota(Quota::per_minute(2).expect("valid").sliding_window())
        .with_quota(Quota::per_minute(2).expect("valid").fixed_window())
        .with_store(store)
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "k", 0).await.expect("through Redis");
    send(&mut svc, "k", 1).await.expect("through Redis");
    assert!(is_refused(&send(&mut svc, "k", 2).await));
    // Past the first window's bookings: expired ones are trimmed.
    tokio::time::sleep(Duration::from_millis(1)).await;
    // A change of algorithm reads and deletes the old states.
    handle.set_default(vec![Quota::per_turn(2).expect("valid")]);
    assert!(is_refused(&send(&mut svc, "k", 3).await));
    send(&mut svc, "other", 4).await.expect("a turn");
}

/// The one rate-limit state under `prefix` (not a rule marker).
fn state_key(redis: &mut redis::Connection, prefix: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(redis)
        .expect("KEYS");
    keys.into_iter()
        .find(|k| !k.ends_with(":r"))
        .expect("the state")
}

/// Wait (up to 5 s) until a fixed-window state under `prefix` holds `used`
/// units: a spawned waiter's admission has run in Redis.
async fn fixed_state_holds(server: &RedisServer, prefix: &str, used: u64) {
    let mut redis = server.connection();
    for _ in 0..500 {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut redis)
            .expect("KEYS");
        for key in keys {
            let state: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query(&mut redis)
                .unwrap_or(None);
            let held = state
                .as_deref()
                .and_then(|s| s.split(',').nth(1))
                .and_then(|u| u.parse::<u64>().ok());
            if held == Some(used) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no state under {prefix} came to hold {used}");
}

#[tokio::test]
async fn a_long_fixed_window_retuned_shorter_keeps_its_waiter_ahead_of_newcomers() {
    let Some(server) = RedisServer::start("a_long_fixed_window_retuned_shorter") else {
        return;
    };
    // Half a minute before a whole week (the windows' boundaries are
    // multiples of the week since the epoch).
    let week = Duration::from_secs(7 * 86_400);
    let clock = clock();
    let week_us = week.as_micros() as u64;
    clock.store(
        (clock.load(Ordering::SeqCst) / week_us + 1) * week_us - 30_000_000,
        Ordering::SeqCst,
    );
    let layer = RateLimitLayer::new(
        Quota::new(2, week).expect("valid").fixed_window(),
        header_key(),
    )
    // The waiter's 30 s, not the newcomer's 31.
    .with_max_wait(Duration::from_secs(30))
    .with_store(store(&server, "long-fixed:", &clock))
    .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    for i in 0..2 {
        send(&mut svc, "k", i).await.expect("the week's two");
    }
    // The third waits for the next week, 30 s on (its task sleeps that
    // long on tokio's clock; the scripts' clock is the test's).
    let waiter = svc.ready().await.expect("ready").call(request("k", 2));
    let waiter = tokio::spawn(waiter);
    // Booked when the next week's window holds one.
    fixed_state_holds(&server, "long-fixed:", 1).await;
    assert!(!waiter.is_finished(), "the third waits for the next week");
    // One a second from now on: the waiter's unit still counts, and a
    // newcomer goes after it. Counted at the end of the next week, the
    // state lay further ahead than the script's horizon (a day), was taken
    // for a clock that ran backwards and started afresh: the newcomer went
    // at once, before the waiter, and the week's count was lost. The state
    // keeps its latest booking's instant: the unit counts in the waiter's
    // second, and the newcomer waits for the next.
    handle.set_default(vec![Quota::per_second(1).expect("valid").fixed_window()]);
    let err = send(&mut svc, "k", 3)
        .await
        .expect_err("not before the waiter");
    let wait = err
        .downcast_ref::<RateLimited>()
        .expect("refused")
        .retry_after;
    assert_eq!(wait, Duration::from_secs(31));
    waiter.abort();
}

#[tokio::test]
async fn a_waiter_behind_another_quota_keeps_its_window_when_the_fixed_window_shortens() {
    let Some(server) = RedisServer::start("a_waiter_behind_another_quota_keeps_its_window") else {
        return;
    };
    let clock = clock();
    let minute = clock.load(Ordering::SeqCst);
    let quotas = || {
        vec![
            Quota::per_minute(2).expect("valid").fixed_window(),
            Quota::new(1, Duration::from_secs(5)).expect("valid"),
        ]
    };
    let replica = |max_wait: Duration| {
        let layer = RateLimitLayer::new(quotas()[0], header_key())
            .with_quota(quotas()[1])
            .with_max_wait(max_wait)
            .with_store(store(&server, "behind:", &clock))
            .expect("quotas Redis keeps");
        let handle = layer.handle();
        (layer.layer(Inner::new()), handle)
    };
    let (mut waiting, waiting_handle) = replica(Duration::from_secs(10));
    send(&mut waiting, "k", 0)
        .await
        .expect("the first of the minute");
    // A second later the bucket books the next at 5 s, inside the minute
    // (whose window counts it too): it waits, on tokio's clock.
    clock.store(minute + 1_000_000, Ordering::SeqCst);
    let waiter = waiting.ready().await.expect("ready").call(request("k", 1));
    let waiter = tokio::spawn(waiter);
    // Booked when the minute's window holds two.
    fixed_state_holds(&server, "behind:", 2).await;
    assert!(!waiter.is_finished(), "the second waits for the bucket");
    // At 2 s, one a second, the bucket dropped (converted in Redis at the
    // key's next request, at 4 s). The two units count in the second the
    // waiter goes in, [5 s, 6 s): counted at now instead, in [4 s, 5 s), a
    // newcomer at 5 s went in the waiter's second.
    clock.store(minute + 2_000_000, Ordering::SeqCst);
    let per_second = || vec![Quota::per_second(1).expect("valid").fixed_window()];
    waiting_handle.set_default(per_second());
    let (mut rejecting, rejecting_handle) = replica(Duration::ZERO);
    rejecting_handle.set_default(per_second());
    clock.store(minute + 4_000_000, Ordering::SeqCst);
    let err = send(&mut rejecting, "k", 2)
        .await
        .expect_err("the minute's two count");
    let wait = err
        .downcast_ref::<RateLimited>()
        .expect("refused")
        .retry_after;
    assert_eq!(wait, Duration::from_secs(2), "after the waiter's second");
    // A replica that has refused nothing (no refusal of its own to
    // remember) asks Redis in the waiter's second.
    let (mut other, other_handle) = replica(Duration::ZERO);
    other_handle.set_default(per_second());
    clock.store(minute + 5_000_000, Ordering::SeqCst);
    assert!(
        is_refused(&send(&mut other, "k", 3).await),
        "a newcomer in the waiter's second"
    );
    waiter.abort();
}

#[tokio::test]
async fn a_fixed_window_state_no_script_wrote_converts_to_nothing_worse() {
    let Some(server) = RedisServer::start("fixed_window_hostile_latest") else {
        return;
    };
    let mut redis = server.connection();
    for (n, latest) in ["1e300", "", "99999999999999999999", "-5"]
        .into_iter()
        .enumerate()
    {
        let clock = clock();
        let now = clock.load(Ordering::SeqCst);
        let prefix = format!("hostile-fixed{n}:");
        let layer = RateLimitLayer::new(
            Quota::per_minute(2).expect("valid").fixed_window(),
            header_key(),
        )
        .with_store(store(&server, &prefix, &clock))
        .expect("a quota Redis keeps");
        let handle = layer.handle();
        let mut svc = layer.layer(Inner::new());
        send(&mut svc, "k", 0).await.expect("a fresh key");
        let state = &state_key(&mut redis, &prefix);
        // The minute's window, one used, its latest instant unreadable.
        let hostile = format!("{},1,60000000,2;{latest}", now + 60_000_000);
        let () = redis::cmd("SET")
            .arg(state)
            .arg(&hostile)
            .query(&mut redis)
            .expect("SET");
        handle.set_default(vec![Quota::per_second(1).expect("valid").fixed_window()]);
        // Converted as a state without the instant (at now: no waiter), or
        // not at all (the old window then counts under the new limit
        // until it ends): a refusal, not an error, and never a fresh key.
        let refused = send(&mut svc, "k", 1).await.expect_err(&hostile);
        let wait = refused
            .downcast_ref::<RateLimited>()
            .unwrap_or_else(|| panic!("{hostile}: {refused}"))
            .retry_after;
        assert!(wait <= MINUTE, "{hostile}: {wait:?}");
        // Past the old window, the key goes, and its state is written anew.
        clock.fetch_add(61_000_000, Ordering::SeqCst);
        send(&mut svc, "k", 2)
            .await
            .unwrap_or_else(|e| panic!("{hostile}: past the old window: {e}"));
        let written: String = redis::cmd("GET").arg(state).query(&mut redis).expect("GET");
        let fields: Vec<&str> = written.split([',', ';']).collect();
        assert!(
            fields.len() == 5 && fields.iter().all(|f| f.bytes().all(|b| b.is_ascii_digit())),
            "{hostile}: written anew as {written}"
        );
    }
}

#[tokio::test]
async fn a_fixed_window_latest_booking_past_the_horizon_is_held_to_it() {
    let Some(server) = RedisServer::start("fixed_window_latest_past_horizon") else {
        return;
    };
    let mut redis = server.connection();
    // Three days before a week's window ends, its latest booking said to
    // be at its last instant (no wait here reaches that far: a replica
    // waiting longer than a day, or no script's state).
    let week = Duration::from_secs(7 * 86_400);
    let week_us = week.as_micros() as u64;
    let clock = clock();
    let end = (clock.load(Ordering::SeqCst) / week_us + 1) * week_us;
    clock.store(end - 3 * 86_400_000_000, Ordering::SeqCst);
    let layer = RateLimitLayer::new(
        Quota::new(2, week).expect("valid").fixed_window(),
        header_key(),
    )
    .with_store(store(&server, "past-horizon:", &clock))
    .expect("a quota Redis keeps");
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "k", 0).await.expect("a fresh key");
    let state = &state_key(&mut redis, "past-horizon:");
    let () = redis::cmd("SET")
        .arg(state)
        .arg(format!("{end},2,{week_us},2;{}", end - 1))
        .query(&mut redis)
        .expect("SET");
    // One a second: the two units count at the horizon (a day on), not at
    // the window's end, which lies past it and would be taken for a clock
    // that ran backwards, the key started afresh and let through.
    handle.set_default(vec![Quota::per_second(1).expect("valid").fixed_window()]);
    let refused = send(&mut svc, "k", 1).await.expect_err("the week's two");
    let wait = refused
        .downcast_ref::<RateLimited>()
        .expect("refused")
        .retry_after;
    assert!(
        wait > Duration::from_secs(86_000) && wait <= Duration::from_secs(86_400 + 3),
        "{wait:?}"
    );
}

#[tokio::test]
async fn a_window_booked_ahead_by_an_earlier_version_keeps_its_waiters_unseen_instants() {
    let Some(server) = RedisServer::start("fixed_window_from_an_earlier_version") else {
        return;
    };
    let mut redis = server.connection();
    let clock = clock();
    let minute = clock.load(Ordering::SeqCst);
    let replica = |max_wait: Duration| {
        let layer = RateLimitLayer::new(
            Quota::per_minute(3).expect("valid").fixed_window(),
            header_key(),
        )
        .with_max_wait(max_wait)
        .with_store(store(&server, "earlier:", &clock))
        .expect("a quota Redis keeps");
        let handle = layer.handle();
        (layer.layer(Inner::new()), handle)
    };
    let (mut waiting, waiting_handle) = replica(Duration::from_secs(120));
    send(&mut waiting, "k", 0).await.expect("a fresh key");
    let state = &state_key(&mut redis, "earlier:");
    // As a script before the latest instant wrote it: the next minute's
    // window, one unit booked in it by a waiter somewhere (behind another
    // quota's wait, it could be near the window's end).
    let () = redis::cmd("SET")
        .arg(state)
        .arg(format!("{},1,60000000,3", minute + 120_000_000))
        .query(&mut redis)
        .expect("SET");
    // A waiter booked here at the window's start must not hide that one.
    let waiter = waiting.ready().await.expect("ready").call(request("k", 1));
    let waiter = tokio::spawn(waiter);
    fixed_state_holds(&server, "earlier:", 2).await;
    // One per 10 s: the two count in the last 10 s of that minute, where
    // the unseen one may go; counted where this one goes, a newcomer could
    // go before the other.
    let per_ten = || {
        vec![
            Quota::new(1, Duration::from_secs(10))
                .expect("valid")
                .fixed_window(),
        ]
    };
    waiting_handle.set_default(per_ten());
    let (mut rejecting, rejecting_handle) = replica(Duration::ZERO);
    rejecting_handle.set_default(per_ten());
    clock.store(minute + 1_000_000, Ordering::SeqCst);
    let refused = send(&mut rejecting, "k", 2).await.expect_err("after both");
    let wait = refused
        .downcast_ref::<RateLimited>()
        .expect("refused")
        .retry_after;
    assert_eq!(wait, Duration::from_secs(119));
    waiter.abort();
}
