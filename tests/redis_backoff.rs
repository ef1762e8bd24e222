//! Backoff429Layer with its cooldowns in Redis: two layers standing for
//! two replicas of a gateway share each route's cooldown and 429 streak.

#![cfg(feature = "redis")]

use testkit::redis as redis_server;
mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use tokio::sync::Notify;
use tower::{Service, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::error::{BoxError, CoolingDown, StoreUnavailable};
use tower_throttle::key::HeaderKey;
use tower_throttle::redis::{OnError, RedisStore};

/// A request to `route`, which the upstream answers with `status` (and a
/// `Retry-After` of `retry` seconds, when given).
fn request(route: &str, status: u16, retry: Option<u64>) -> http::Request<()> {
    let mut req = http::Request::builder()
        .header("x-route", route)
        .header("x-status", status.to_string());
    if let Some(retry) = retry {
        req = req.header("x-retry", retry.to_string());
    }
    req.body(()).expect("valid request")
}

/// Answers as each request asks.
async fn upstream(req: http::Request<()>) -> Result<http::Response<()>, Infallible> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let status = header("x-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let mut res = http::Response::builder().status(status);
    if let Some(retry) = header("x-retry") {
        res = res.header("retry-after", retry);
    }
    if let Some(reset) = header("x-exhausted") {
        // OpenAI's way of saying a success was the last one for a while.
        res = res
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", reset);
    }
    Ok(res.body(()).expect("valid response"))
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<()>, Infallible>> + Send>>;

/// [`upstream`], but a request marked `x-hold` is held (once `arrived` is
/// told) until `gate` lets it go, so that its answer comes after others'.
fn held_upstream(
    arrived: &Arc<Notify>,
    gate: &Arc<Notify>,
) -> impl Fn(http::Request<()>) -> Answer + Clone + use<> {
    let (arrived, gate) = (arrived.clone(), gate.clone());
    move |req| {
        let (arrived, gate) = (arrived.clone(), gate.clone());
        Box::pin(async move {
            if req.headers().contains_key("x-hold") {
                arrived.notify_one();
                gate.notified().await;
            }
            upstream(req).await
        })
    }
}

/// The scripts' clock, moved by hand (microseconds since the epoch).
fn clock() -> Arc<AtomicU64> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    Arc::new(AtomicU64::new(now))
}

fn store(server: &RedisServer, clock: &Arc<AtomicU64>, on_error: OnError) -> RedisStore {
    RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix("cool:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        .with_on_error(on_error)
        .with_test_clock(clock.clone())
}

fn layer(store: RedisStore) -> Backoff429Layer<HeaderKey> {
    Backoff429Layer::new(HeaderKey::new("x-route").expect("valid header name"))
        .with_initial_backoff(Duration::from_millis(50))
        .with_store(store)
}

/// One replica of a gateway: [`layer`] on `server`, failing closed, as
/// `configure` sets it, in front of [`upstream`].
fn replica<F>(
    server: &RedisServer,
    clock: &Arc<AtomicU64>,
    configure: F,
) -> impl Service<http::Request<()>, Response = http::Response<()>, Error = BoxError> + use<F>
where
    F: Fn(Backoff429Layer<HeaderKey>) -> Backoff429Layer<HeaderKey>,
{
    tower::ServiceBuilder::new()
        .layer(configure(layer(store(server, clock, OnError::Closed))))
        .service_fn(upstream)
}

async fn send<S>(svc: &mut S, req: http::Request<()>) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(req).await
}

/// The 429 streak Redis keeps for the one route cooled in a test, if any.
fn shared_streak(conn: &mut redis::Connection) -> Option<u32> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("cool:*").query(conn).expect("KEYS");
    let key = keys.first()?;
    redis::cmd("HGET")
        .arg(key)
        .arg("s")
        .query(conn)
        .expect("HGET")
}

fn cooling(err: BoxError) -> Duration {
    err.downcast_ref::<CoolingDown>()
        .unwrap_or_else(|| panic!("expected CoolingDown, got {err}"))
        .retry_after
}

#[tokio::test]
async fn a_429_on_one_replica_cools_the_route_on_the_other() {
    let Some(server) = RedisServer::start("a_429_on_one_replica") else {
        return;
    };
    let clock = clock();
    let make = || replica(&server, &clock, |l| l);
    let (mut a, mut b) = (make(), make());
    let res = send(&mut a, request("openai", 429, Some(10)))
        .await
        .expect("passed on");
    assert_eq!(res.status(), 429);
    // Once a has its 429 back, b knows: the route cools on b too, for what
    // is left of the 10 s.
    let left = cooling(
        send(&mut b, request("openai", 200, None))
            .await
            .unwrap_err(),
    );
    assert!(
        left > Duration::from_secs(9) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    // Another route is not touched.
    send(&mut b, request("anthropic", 200, None))
        .await
        .expect("other route");
}

#[tokio::test]
async fn a_cooldown_read_from_redis_is_never_longer_than_the_replicas_own_cap() {
    let Some(server) = RedisServer::start("a_cooldown_read_from_redis_is_capped") else {
        return;
    };
    let clock = clock();
    let make = || {
        replica(&server, &clock, |l| {
            l.with_max_cooldown(Duration::from_secs(30))
        })
    };
    let (mut a, mut b) = (make(), make());
    send(&mut a, request("openai", 429, Some(10)))
        .await
        .expect("passed on");
    // Whoever can write to Redis says the route cools for 30 years.
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("cool:*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let years = clock.load(Ordering::SeqCst) + 30 * 365 * 86_400 * 1_000_000;
    let () = redis::cmd("HSET")
        .arg(&keys[0])
        .arg("u")
        .arg(years)
        .query(&mut conn)
        .unwrap();
    let left = cooling(
        send(&mut b, request("openai", 200, None))
            .await
            .unwrap_err(),
    );
    assert!(left <= Duration::from_secs(30), "{left:?}");
}

#[tokio::test]
async fn the_longer_cooldown_wins_whichever_replica_hears_last() {
    let Some(server) = RedisServer::start("the_longer_cooldown_wins") else {
        return;
    };
    let clock = clock();
    // The upstream says when a gated request has reached it, and holds its
    // answer until the gate opens.
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let make = || {
        let (entered, gate) = (entered.clone(), gate.clone());
        tower::ServiceBuilder::new()
            .layer(layer(store(&server, &clock, OnError::Closed)))
            .service_fn(move |req: http::Request<()>| {
                let (entered, gate) = (entered.clone(), gate.clone());
                async move {
                    if req.headers().contains_key("x-gate") {
                        entered.notify_one();
                        gate.notified().await;
                    }
                    upstream(req).await
                }
            })
    };
    let (a, mut b) = (make(), make());
    // a's request is on its way (its answer held back) when b hears a 429
    // asking for 10 s; a's answer, a 429 asking for 2 s, comes after.
    let mut slow = request("r", 429, Some(2));
    slow.headers_mut()
        .insert("x-gate", http::HeaderValue::from_static("1"));
    let in_flight = tokio::spawn(a.clone().oneshot(slow));
    entered.notified().await;
    send(&mut b, request("r", 429, Some(10)))
        .await
        .expect("passed on");
    gate.notify_one();
    let res = in_flight.await.expect("ran").expect("passed on");
    assert_eq!(res.status(), 429);
    // The 10 s stand, on a and on a third replica.
    for mut svc in [a, make()] {
        let left = cooling(send(&mut svc, request("r", 200, None)).await.unwrap_err());
        assert!(left > Duration::from_secs(9), "{left:?}");
    }
}

#[tokio::test]
async fn the_429_streak_is_shared_and_a_success_ends_it() {
    let Some(server) = RedisServer::start("the_429_streak_is_shared") else {
        return;
    };
    let clock = clock();
    let make = || replica(&server, &clock, |l| l.with_max_wait(Duration::from_secs(5)));
    let (mut a, mut b) = (make(), make());
    // a: a 429 with no advice, streak 1: 50 ms.
    send(&mut a, request("r", 429, None))
        .await
        .expect("passed on");
    // The cooldown passes on Redis's clock; b's request finds no cooldown
    // left there, goes, and gets the second 429 in a row: 100 ms.
    clock.fetch_add(60_000, Ordering::SeqCst);
    send(&mut b, request("r", 429, None))
        .await
        .expect("passed on");
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("cool:*")
        .query(&mut conn)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let streak: u32 = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("s")
        .query(&mut conn)
        .expect("HGET");
    assert_eq!(streak, 2, "the streak counts both replicas' 429s");
    // A success (through a, after the cooldown) ends the streak for all.
    clock.fetch_add(110_000, Ordering::SeqCst);
    send(&mut a, request("r", 200, None))
        .await
        .expect("success");
    let exists: bool = redis::cmd("EXISTS")
        .arg(&keys[0])
        .query(&mut conn)
        .expect("EXISTS");
    assert!(!exists, "an idle route leaves nothing behind");
}

#[tokio::test]
async fn a_shared_cooldown_fails_as_its_store_says_when_redis_is_away() {
    let Some(mut server) = RedisServer::start("a_shared_cooldown_fails") else {
        return;
    };
    let clock = clock();
    let closed = |server: &RedisServer| {
        tower::ServiceBuilder::new()
            .layer(layer(
                store(server, &clock, OnError::Closed).with_timeout(Duration::from_millis(50)),
            ))
            .service_fn(upstream)
    };
    let open = |server: &RedisServer| {
        tower::ServiceBuilder::new()
            .layer(layer(
                store(server, &clock, OnError::Open).with_timeout(Duration::from_millis(50)),
            ))
            .service_fn(upstream)
    };
    let (mut closed, open) = (closed(&server), open(&server));
    let layer_handle = open.clone();
    server.kill();
    let err = send(&mut closed, request("r", 200, None))
        .await
        .unwrap_err();
    assert!(err.is::<StoreUnavailable>(), "{err}");
    let res = layer_handle
        .oneshot(request("r", 200, None))
        .await
        .expect("open");
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn a_503_is_shared_only_with_a_wait_and_never_touches_the_streak() {
    let Some(server) = RedisServer::start("a_503_is_shared_only_with_a_wait") else {
        return;
    };
    let clock = clock();
    let make = || replica(&server, &clock, |l| l.with_on_503(true));
    let (mut a, mut b) = (make(), make());
    let mut conn = server.connection();
    // a: a 429 with no advice, streak 1 (50 ms, passed on Redis's clock).
    send(&mut a, request("r", 429, None))
        .await
        .expect("passed on");
    clock.fetch_add(60_000, Ordering::SeqCst);
    // b: a 503 without a wait says nothing, to Redis either.
    let res = send(&mut b, request("r", 503, None))
        .await
        .expect("passed on");
    assert_eq!(res.status(), 503);
    assert_eq!(
        shared_streak(&mut conn),
        Some(1),
        "a 503 ended or extended the streak"
    );
    // b: a 503 with a wait cools the route on a too, streak untouched.
    send(&mut b, request("r", 503, Some(10)))
        .await
        .expect("passed on");
    let left = cooling(send(&mut a, request("r", 200, None)).await.unwrap_err());
    assert!(
        left > Duration::from_secs(9) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    assert_eq!(
        shared_streak(&mut conn),
        Some(1),
        "a 503 ended or extended the streak"
    );
}

#[tokio::test]
async fn a_replica_that_learns_a_shared_cooldown_counts_it_as_started() {
    let Some(server) = RedisServer::start("a_replica_that_learns_a_shared_cooldown") else {
        return;
    };
    let clock = clock();
    let (layer_a, layer_b) = (
        layer(store(&server, &clock, OnError::Closed)),
        layer(store(&server, &clock, OnError::Closed)),
    );
    let (handle_a, handle_b) = (layer_a.handle(), layer_b.handle());
    let mut a = tower::ServiceBuilder::new()
        .layer(layer_a)
        .service_fn(upstream);
    let mut b = tower::ServiceBuilder::new()
        .layer(layer_b)
        .service_fn(upstream);
    send(&mut a, request("r", 429, Some(10)))
        .await
        .expect("passed on");
    assert_eq!(handle_a.cooldowns_started(), 1);
    assert_eq!(handle_b.cooldowns_started(), 0);
    cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert_eq!(handle_b.cooldowns_started(), 1, "b cools now: one start");
    cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert_eq!(handle_b.cooldowns_started(), 1, "the same cooldown again");
}

/// A replica already cooling that learns a longer shared cooldown keeps
/// one start: the cooldown grew, none began. (Found by mutation testing:
/// `merge_shared`'s "was cooling" test could be turned around unseen.)
#[tokio::test]
async fn a_replica_already_cooling_that_learns_a_longer_cooldown_counts_no_new_start() {
    let Some(server) = RedisServer::start("a_replica_already_cooling_learns_longer") else {
        return;
    };
    let clock = clock();
    let (layer_a, layer_b) = (
        layer(store(&server, &clock, OnError::Closed)),
        layer(store(&server, &clock, OnError::Closed)),
    );
    let handle_b = layer_b.handle();
    // `a`'s upstream holds a request marked `x-hold` until let go, so that
    // its 429 comes after another's.
    let (arrived, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let mut a = tower::ServiceBuilder::new()
        .layer(layer_a)
        .service_fn(held_upstream(&arrived, &gate));
    let mut b = tower::ServiceBuilder::new()
        .layer(layer_b)
        .service_fn(upstream);
    let mut slow = request("r", 429, Some(30));
    slow.headers_mut()
        .insert("x-hold", http::HeaderValue::from_static("1"));
    let second = tokio::spawn(a.ready().await.unwrap().call(slow));
    arrived.notified().await;
    send(&mut a, request("r", 429, Some(10)))
        .await
        .expect("passed on");
    let learned = cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert!(learned <= Duration::from_secs(10), "{learned:?}");
    assert_eq!(handle_b.cooldowns_started(), 1);
    gate.notify_one();
    second.await.unwrap().expect("passed on");
    let longer = cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert!(longer > Duration::from_secs(10), "{longer:?}");
    assert_eq!(
        handle_b.cooldowns_started(),
        1,
        "the cooldown grew, none began"
    );
}

/// A replica that learned a shared cooldown forgets the route once the
/// cooldown and the quiet time after it (the streak's) have passed: a
/// route gone quiet keeps nothing. (Found by mutation testing: the forget
/// time `merge_shared` sets could be made never.)
#[tokio::test]
async fn a_route_learned_from_redis_is_forgotten_after_its_quiet_time() {
    let Some(server) = RedisServer::start("a_route_learned_from_redis_is_forgotten") else {
        return;
    };
    let clock = clock();
    let layer_b = layer(store(&server, &clock, OnError::Closed));
    let handle_b = layer_b.handle();
    let mut a = replica(&server, &clock, |l| l);
    let mut b = tower::ServiceBuilder::new()
        .layer(layer_b)
        .service_fn(upstream);
    send(&mut a, request("r", 429, Some(10)))
        .await
        .expect("passed on");
    cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert_eq!(handle_b.key_count(), 1);
    // Redis is done with: b's own clock (tokio's) runs on by hand, past
    // the cooldown and any quiet time the layer allows.
    tokio::time::pause();
    // The 10 s cooldown is over, not the minute's quiet (the backoff's
    // cap) that forgets its streak: kept.
    tokio::time::advance(Duration::from_secs(40)).await;
    assert_eq!(handle_b.evict_idle(), 0, "the streak is still remembered");
    tokio::time::advance(Duration::from_secs(24 * 3_600)).await;
    assert_eq!(handle_b.evict_idle(), 1, "the route is idle");
    assert_eq!(handle_b.key_count(), 0);
}

/// A success that says the route is exhausted (proactive) still ends the
/// shared streak, as any success does, besides sharing its wait. (Found by
/// mutation testing: such a success could be told to Redis as a 503's
/// wait, which leaves the streak alone.)
#[tokio::test]
async fn a_proactive_success_with_a_wait_ends_the_shared_streak() {
    let Some(server) = RedisServer::start("a_proactive_success_ends_the_streak") else {
        return;
    };
    let clock = clock();
    let make = || replica(&server, &clock, |l| l.with_proactive(true));
    let (mut a, mut b) = (make(), make());
    send(&mut a, request("r", 429, None))
        .await
        .expect("passed on");
    let mut conn = server.connection();
    assert_eq!(shared_streak(&mut conn), Some(1));
    // Past the 50 ms cooldown on Redis's clock, b (cooling nothing of its
    // own) gets a success saying "none left for 3 s".
    clock.fetch_add(60_000, Ordering::SeqCst);
    let mut exhausted = request("r", 200, None);
    exhausted
        .headers_mut()
        .insert("x-exhausted", http::HeaderValue::from_static("3s"));
    send(&mut b, exhausted).await.expect("success");
    assert_eq!(shared_streak(&mut conn).unwrap_or(0), 0, "the streak ended");
}

/// A 429 without advice to a request sent before this replica learned a
/// shared cooldown is stale: it neither grows the streak here nor starts a
/// longer cooldown of its own. (Found by mutation testing: learning a
/// cooldown could leave the route's generation as it was.)
#[tokio::test]
async fn a_429_to_a_request_sent_before_a_learned_cooldown_starts_nothing() {
    let Some(server) = RedisServer::start("a_429_sent_before_a_learned_cooldown") else {
        return;
    };
    let clock = clock();
    // A second 429 in a row would cool b for 40 s, longer than the 10 s it
    // learns: started, it would show.
    let layer_b = layer(store(&server, &clock, OnError::Closed))
        .with_initial_backoff(Duration::from_secs(20));
    let handle_b = layer_b.handle();
    let (arrived, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let mut b = tower::ServiceBuilder::new()
        .layer(layer_b)
        .service_fn(held_upstream(&arrived, &gate));
    let mut a = replica(&server, &clock, |l| l);
    // b sends a request the upstream holds.
    let mut early = request("r", 429, None);
    early
        .headers_mut()
        .insert("x-hold", http::HeaderValue::from_static("1"));
    let early = tokio::spawn(b.ready().await.unwrap().call(early));
    arrived.notified().await;
    // a's 429 (10 s) is shared; b learns it.
    send(&mut a, request("r", 429, Some(10)))
        .await
        .expect("passed on");
    let learned = cooling(send(&mut b, request("r", 200, None)).await.unwrap_err());
    assert!(learned <= Duration::from_secs(10), "{learned:?}");
    assert_eq!(handle_b.cooldowns_started(), 1);
    // The early request's 429 comes back: stale, it starts nothing.
    gate.notify_one();
    early.await.unwrap().expect("passed on");
    assert_eq!(
        handle_b.cooldowns_started(),
        1,
        "a stale 429 started a cooldown"
    );
    let entry = handle_b.cooldown(&["r"]).expect("still cooling");
    assert!(entry.remaining <= Duration::from_secs(10), "{entry:?}");
}
