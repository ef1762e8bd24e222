//! A rate limiter on Redis when Redis dies, stalls, comes back, or loses
//! its scripts: every request ends within the timeout (plus a little), as
//! the chosen fail mode says, and limiting resumes by itself.

#![cfg(feature = "redis")]

use testkit::capture;
use testkit::redis as redis_server;
mod support;

use std::time::Duration;

use redis_server::RedisServer;
use support::{Inner, quota, request};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited, StoreUnavailable};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Algorithm, RateLimitHandle, RateLimitLayer, Unit};
use tower_throttle::redis::{OnError, RedisStore};
use tower_throttle::respond::Rejection;

const MINUTE: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_millis(50);
/// What a request may take past the timeout: the task's turn to run.
const SLACK: Duration = Duration::from_millis(20);

fn store(server: &RedisServer, prefix: &str, on_error: OnError) -> RedisStore {
    RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(TIMEOUT)
        .with_on_error(on_error)
}

type Svc = tower_throttle::rate_limit::RateLimit<
    Inner,
    GlobalKey,
    tower_throttle::rate_limit::OneUnit,
    tower_throttle::rate_limit::CountAll,
    tower_throttle::rate_limit::NoAnnotation,
>;

fn limiter(store: RedisStore, limit: u32) -> (Svc, RateLimitHandle) {
    // Counting requests: a Redis store keeps such a window to 10,000.
    let quota = quota(Algorithm::SlidingWindow, limit, MINUTE).with_unit(Unit::Requests);
    let layer = RateLimitLayer::new(quota, GlobalKey)
        .with_store(store)
        .expect("a quota Redis keeps");
    let handle = layer.handle();
    (layer.layer(Inner::new()), handle)
}

/// Send one request, and how long it took.
async fn timed(svc: &Svc, seq: usize) -> (Result<http::Response<()>, BoxError>, Duration) {
    let start = Instant::now();
    let outcome = svc.clone().oneshot(request("k", seq)).await;
    (outcome, start.elapsed())
}

/// `n` requests from each of `tasks` tasks at once, each request timed.
async fn load(svc: &Svc, tasks: usize, n: usize) -> Vec<(Result<(), BoxError>, Duration)> {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..n {
                    let (outcome, took) = timed(&svc, t * n + i).await;
                    out.push((outcome.map(|_| ()), took));
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.expect("task ran"));
    }
    all
}

fn assert_quick(outcomes: &[(Result<(), BoxError>, Duration)]) {
    for (outcome, took) in outcomes {
        assert!(
            *took <= TIMEOUT + SLACK,
            "a request took {took:?} ({outcome:?})"
        );
    }
}

/// Until a request is decided by Redis again (a hang guard of 10 s).
async fn until_redis_answers(svc: &Svc, handle: &RateLimitHandle) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let errors = handle.stats().store.expect("store stats").errors;
        let (outcome, _) = timed(svc, 0).await;
        let after = handle.stats().store.expect("store stats").errors;
        if outcome.is_ok() && after == errors {
            return;
        }
        assert!(Instant::now() < deadline, "Redis never answered again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The captured log lines about the store at `addr` (a URL or
/// `host:port`): the tests of this file run at once and share the log.
fn store_lines(addr: &str) -> String {
    let addr = addr.trim_start_matches("redis://");
    capture::log_text()
        .lines()
        .filter(|line| line.contains(&format!("store={addr}")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn killed_redis_fails_closed_at_once_and_limiting_resumes_after_a_restart() {
    let Some(mut server) = RedisServer::start("killed_redis_fails_closed") else {
        return;
    };
    capture::capture_logs();
    let (svc, handle) = limiter(store(&server, "closed:", OnError::Closed), 1_000);
    // A load in flight when the server dies.
    let before = load(&svc, 4, 5).await;
    assert!(before.iter().all(|(o, _)| o.is_ok()), "{before:?}");
    let during = {
        let svc = svc.clone();
        let load = tokio::spawn(async move { load(&svc, 4, 25).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
        server.kill();
        load.await.expect("load ran")
    };
    assert_quick(&during);
    for (outcome, _) in &during {
        if let Err(e) = outcome {
            assert!(e.is::<StoreUnavailable>(), "{e}");
            let rejection = Rejection::of(e).expect("one of ours");
            assert_eq!(rejection.status(), http::StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(rejection.code(), "store_unavailable");
        }
    }
    let after = load(&svc, 4, 5).await;
    assert_quick(&after);
    assert!(
        after
            .iter()
            .all(|(o, _)| o.as_ref().is_err_and(|e| e.is::<StoreUnavailable>())),
        "{after:?}"
    );
    let stats = handle.stats();
    let store = stats.store.expect("store stats");
    assert!(store.errors >= 20, "{store:?}");
    assert_eq!(store.fallbacks, 0);

    // Back, empty: limiting resumes with no restart of the service.
    server.restart();
    until_redis_answers(&svc, &handle).await;
    // One line for the outage and one for the end of it, not one per
    // request (this store's lines: the tests share the log).
    let logs = store_lines(&server.url());
    let down = logs.matches("Redis unreachable; failing closed").count();
    let up = logs.matches("Redis reachable again").count();
    assert_eq!((down, up), (1, 1), "{logs}");
}

#[tokio::test]
async fn stalled_redis_times_out_and_fails_open_to_the_in_process_limit() {
    let Some(server) = RedisServer::start("stalled_redis_fails_open") else {
        return;
    };
    let (svc, handle) = limiter(store(&server, "open:", OnError::Open), 3);
    let (outcome, _) = timed(&svc, 0).await;
    outcome.expect("admitted through Redis");
    // Redis stops answering (every client paused) for a second.
    let mut conn = server.connection();
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "1000", "ALL"][..])
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    let stalled = load(&svc, 1, 5).await;
    assert_quick(&stalled);
    // Each replica holds the quota in process: three more, then refused.
    let admitted = stalled.iter().filter(|(o, _)| o.is_ok()).count();
    assert_eq!(admitted, 3, "{stalled:?}");
    for (outcome, _) in &stalled {
        if let Err(e) = outcome {
            assert!(e.is::<RateLimited>(), "{e}");
        }
    }
    let store = handle.stats().store.expect("store stats");
    assert_eq!((store.errors, store.fallbacks), (5, 5), "{store:?}");
}

#[tokio::test]
async fn failing_open_without_the_local_fallback_admits_everything() {
    let Some(mut server) = RedisServer::start("failing_open_without_fallback") else {
        return;
    };
    let store = store(&server, "admit:", OnError::Open).with_local_fallback(false);
    let (svc, handle) = limiter(store, 1);
    server.kill();
    let outcomes = load(&svc, 1, 5).await;
    assert_quick(&outcomes);
    assert!(outcomes.iter().all(|(o, _)| o.is_ok()), "{outcomes:?}");
    assert_eq!(handle.stats().store.expect("store stats").fallbacks, 5);
}

#[tokio::test]
async fn a_script_flush_reloads_the_scripts_with_no_failed_request() {
    let Some(server) = RedisServer::start("a_script_flush_reloads") else {
        return;
    };
    let (svc, handle) = limiter(store(&server, "flush:", OnError::Closed), 1_000);
    let first = load(&svc, 2, 3).await;
    assert!(first.iter().all(|(o, _)| o.is_ok()), "{first:?}");
    let mut conn = server.connection();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("SCRIPT FLUSH");
    let second = load(&svc, 2, 3).await;
    assert!(second.iter().all(|(o, _)| o.is_ok()), "{second:?}");
    assert_eq!(handle.stats().store.expect("store stats").errors, 0);
    assert_eq!(handle.stats().aggregate.admitted, 12);
    // All twelve booked in Redis, before and after the flush.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("flush:*")
        .query(&mut conn)
        .expect("KEYS");
    let bookings = keys.iter().find(|k| k.ends_with('w')).expect("the window");
    // Its bookings, past its figures (at negative scores).
    let booked: u64 = redis::cmd("ZCOUNT")
        .arg(bookings)
        .arg(0)
        .arg("+inf")
        .query(&mut conn)
        .expect("ZCOUNT");
    assert_eq!(booked, 12);
}

/// A TCP relay to Redis that can turn into a black hole: its sockets stay
/// open but nothing crosses, as after a failover or a partition. Counts
/// the bytes the client sends it.
struct BlackHole {
    addr: std::net::SocketAddr,
    forwarding: std::sync::Arc<std::sync::atomic::AtomicBool>,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl BlackHole {
    async fn start(to: String) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarding = std::sync::Arc::new(AtomicBool::new(true));
        let received = std::sync::Arc::new(AtomicU64::new(0));
        let (on, count) = (forwarding.clone(), received.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&to).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (on_up, on_down, count) = (on.clone(), on.clone(), count.clone());
                // Bytes read while not forwarding are dropped: lost.
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = cr.read(&mut buf).await {
                        count.fetch_add(n as u64, Ordering::SeqCst);
                        if on_up.load(Ordering::SeqCst) && sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = sr.read(&mut buf).await {
                        if on_down.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            forwarding,
            received,
        }
    }

    fn forward(&self, on: bool) {
        self.forwarding
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Redis behind a black hole: after a few calls in a row get no answer,
/// requests are decided by the fail mode without asking (nothing reaches
/// the relay, nobody waits for the timeout), and once the relay forwards
/// again the store is healthy within two seconds, on a new connection (the
/// old one lost requests, so its replies would never line up again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_redis_is_not_asked_and_is_used_again_once_it_answers() {
    let Some(server) = RedisServer::start("black_holed_redis") else {
        return;
    };
    capture::capture_logs();
    let relay = BlackHole::start(server.url().trim_start_matches("redis://").to_owned()).await;
    let store = RedisStore::new(&format!("redis://{}", relay.addr))
        .expect("valid URL")
        .with_prefix("hole:")
        .expect("a prefix without braces")
        .with_timeout(TIMEOUT)
        .with_on_error(OnError::Closed);
    let (svc, handle) = limiter(store, 1_000);
    // (The first call connects and loads the script: under load, that can
    // take longer than the timeout.)
    until_redis_answers(&svc, &handle).await;
    relay.forward(false);
    // The calls that find out: each waits for the timeout.
    for seq in 1..=3 {
        let (outcome, _) = timed(&svc, seq).await;
        assert!(outcome.is_err_and(|e| e.is::<StoreUnavailable>()));
    }
    // Then nobody asks: decided at once by the fail mode.
    let sent = relay.received();
    // (A handful: all well within the breaker's first quarter second.)
    let open = load(&svc, 1, 5).await;
    for (outcome, _) in &open {
        assert!(
            outcome.as_ref().is_err_and(|e| e.is::<StoreUnavailable>()),
            "{outcome:?}"
        );
    }
    assert_eq!(
        relay.received(),
        sent,
        "a call went to Redis while the breaker was open"
    );
    // Forwarding again: used again within two seconds.
    relay.forward(true);
    let back = Instant::now();
    until_redis_answers(&svc, &handle).await;
    assert!(
        back.elapsed() < Duration::from_secs(2),
        "{:?}",
        back.elapsed()
    );
    // One line for the outage, one for its end.
    let logs = store_lines(&relay.addr.to_string());
    let down = logs.matches("Redis not answering; failing closed").count();
    let up = logs.matches("Redis reachable again").count();
    assert_eq!((down, up), (1, 1), "{logs}");
}
