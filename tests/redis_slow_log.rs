//! A sliding window in Redis costs Redis a bounded time per call, at the
//! largest limit the store accepts: Redis runs one script at a time, so one
//! slow call stalls every key of every replica. Each call is timed by
//! Redis itself (`SLOWLOG`, which logs every command here).

#![cfg(feature = "redis")]

use testkit::redis as redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_server::RedisServer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Estimated, Quota, RateLimitLayer, Settlement, Unit};
use tower_throttle::redis::{OnError, RedisStore};

type Svc = tower::util::BoxService<http::Request<()>, http::Response<()>, BoxError>;

/// Redis time allowed per call, in microseconds.
const MOST_MICROS: u64 = 1_000;
const MINUTE: u64 = 60_000_000;

fn cost_of(req: &http::Request<()>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// The largest sliding window a store accepts, per minute: counting
/// cost (`weighted`) or requests.
fn largest(weighted: bool) -> Quota {
    if weighted {
        Quota::per_minute(RedisStore::MOST_SLIDING_COST)
            .expect("valid")
            .sliding_window()
    } else {
        Quota::per_minute(RedisStore::MOST_SLIDING_REQUESTS)
            .expect("valid")
            .sliding_window()
            .with_unit(Unit::Requests)
    }
}

/// A replica on `server` with the largest window, on the test clock
/// `clock` (µs), waiting up to `max_wait`.
fn replica(
    server: &RedisServer,
    clock: &Arc<AtomicU64>,
    weighted: bool,
    max_wait: Duration,
) -> Svc {
    tower::util::BoxService::new(layer(server, clock, weighted, max_wait).layer(inner()))
}

/// The layer of [`replica`]: each service it makes shares its connection.
fn layer(
    server: &RedisServer,
    clock: &Arc<AtomicU64>,
    weighted: bool,
    max_wait: Duration,
) -> RateLimitLayer<HeaderKey, Estimated<CostFn>> {
    let store = RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix("slow:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5))
        .with_on_error(OnError::Closed)
        .with_test_clock(clock.clone());
    RateLimitLayer::new(largest(weighted), HeaderKey::new("x-key").expect("valid"))
        .with_cost(Estimated(cost_of as CostFn))
        .with_max_wait(max_wait)
        .with_store(store)
        .expect("the largest sliding window Redis keeps")
}

type CostFn = fn(&http::Request<()>) -> u32;
type Ready = std::future::Ready<Result<http::Response<()>, Infallible>>;
type Inner = tower::util::ServiceFn<fn(http::Request<()>) -> Ready>;

fn inner() -> Inner {
    fn answer(_req: http::Request<()>) -> Ready {
        std::future::ready(Ok(http::Response::new(())))
    }
    tower::service_fn(answer as fn(_) -> _)
}

fn request(key: &str, cost: u32) -> http::Request<()> {
    let mut req = http::Request::builder()
        .header("x-key", key)
        .header("x-cost", cost.to_string())
        .body(())
        .expect("valid request");
    req.extensions_mut().insert(Settlement::new());
    req
}

async fn send(svc: &mut Svc, key: &str, cost: u32) -> Result<http::Response<()>, BoxError> {
    svc.ready().await?.call(request(key, cost)).await
}

/// The longest call of one of the store's scripts Redis logged since
/// the last look, in µs; the log is emptied.
fn longest_script(conn: &mut redis::Connection) -> u64 {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(conn)
        .expect("SLOWLOG GET");
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(conn)
        .expect("SLOWLOG RESET");
    let mut longest = 0;
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(micros)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        // The store calls its scripts by hash; `Busy`'s own is left out.
        let is_script = matches!(args.first(), Some(redis::Value::BulkString(name))
            if name.eq_ignore_ascii_case(b"EVALSHA"));
        if is_script {
            longest = longest.max(u64::try_from(*micros).unwrap_or(u64::MAX));
        }
    }
    longest
}

/// Keeps Redis's script engine busy while it lives, as a fleet's
/// traffic would: on a shared machine the first script after a pause
/// often takes a millisecond or more (measured: 0.5–2 ms for `return 1`,
/// then 1–3 µs), a cost of the machine, not of the script measured.
struct Busy {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(server: &RedisServer) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut conn = server.connection();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let _ = redis::cmd("EVAL")
                    .arg("return 0")
                    .arg(0)
                    .query::<i64>(&mut conn);
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Read the oldest bookings of every window, those a call finds expired
/// and removes. This machine is a VM whose memory, left untouched for
/// seconds, costs tens of µs a page to touch again (measured: the first
/// call on a key 400–1,100 µs, the same call again 60–400 µs), a cost of
/// the machine, not of the script's work. Removing a whole window still
/// reads far past these.
fn touch_oldest(conn: &mut redis::Connection) {
    redis::cmd("EVAL")
        .arg(
            "for _, k in ipairs(redis.call('KEYS', 'slow:*')) do \
             if redis.call('TYPE', k).ok == 'zset' then redis.call('ZRANGE', k, 0, 63) end end",
        )
        .arg(0)
        .query::<()>(conn)
        .expect("EVAL");
}

/// Whether Redis logs every command (on) or none (off): filling a window
/// logs nothing, so that emptying the log frees little.
fn logging(conn: &mut redis::Connection, on: bool) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(if on { 0 } else { -1 })
        .query::<()>(conn)
        .expect("CONFIG SET");
    longest_script(conn);
}

/// A server of the test's own that logs every command's time, a
/// connection to read the log, and the scripts' clock (µs, on a minute).
fn logging_server(test: &str) -> Option<(RedisServer, redis::Connection, Arc<AtomicU64>)> {
    let server = RedisServer::start_with(
        test,
        &[
            "--slowlog-log-slower-than",
            "0",
            "--slowlog-max-len",
            "100000",
        ],
    )?;
    let conn = server.connection();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let clock = Arc::new(AtomicU64::new((now / MINUTE + 1) * MINUTE));
    Some((server, conn, clock))
}

/// Fill each key's window with its whole limit in bookings a
/// millisecond apart, the keys side by side: of one request each, or of
/// cost with the first of two (so that every booking has to be read).
/// Returns the limit.
async fn fill(
    server: &RedisServer,
    clock: &Arc<AtomicU64>,
    keys: &[String],
    weighted: bool,
) -> u32 {
    let limit = if weighted {
        RedisStore::MOST_SLIDING_COST
    } else {
        RedisStore::MOST_SLIDING_REQUESTS
    };
    let mut svcs: Vec<Svc> = (0..keys.len())
        .map(|_| replica(server, clock, weighted, Duration::ZERO))
        .collect();
    let mut left = limit;
    let mut cost = 1;
    if weighted {
        cost = 2;
        left -= 1;
    }
    for _ in 0..left {
        let sends = svcs
            .iter_mut()
            .zip(keys)
            .map(|(svc, key)| send(svc, key, cost));
        for sent in futures::future::join_all(sends).await {
            sent.expect("within the limit");
        }
        clock.fetch_add(1_000, Ordering::SeqCst);
        cost = 1;
    }
    limit
}

/// How many times each heavy case is measured: the fastest is the
/// script's own time (a shared machine only ever adds to it). A refusal
/// and a dropped waiter leave the window as they found it, so they are
/// measured on one key; a window expiring, once on each of [`EXPIRING`]
/// keys of its own.
const TRIES: usize = 9;
const EXPIRING: usize = 8;

/// Each heavy case, for bookings of one unit and of several, at the
/// largest window: the fastest of [`TRIES`].
#[tokio::test]
async fn no_admission_costs_redis_more_than_a_millisecond_at_the_largest_sliding_window() {
    let Some((server, mut conn, clock)) =
        logging_server("no_admission_costs_redis_more_than_a_millisecond")
    else {
        return;
    };
    let _busy = Busy::start(&server);
    let mut cases: Vec<(String, u64)> = Vec::new();
    for weighted in [false, true] {
        let shape = if weighted { "weighted" } else { "ones" };
        let key = format!("whole-{shape}");
        let expiring: Vec<String> = (0..EXPIRING).map(|n| format!("{key}-{n}")).collect();
        logging(&mut conn, false);
        let keys: Vec<String> = std::iter::once(&key).chain(&expiring).cloned().collect();
        let limit = fill(&server, &clock, &keys, weighted).await;
        logging(&mut conn, true);
        let mut svc = replica(&server, &clock, weighted, Duration::ZERO);

        // Refused, a whole window's bookings have to leave first: the walk
        // from the oldest reads them all.
        let mut fastest = u64::MAX;
        for _ in 0..TRIES {
            // A replica of its own each time: one that was refused
            // remembers it, and asks Redis again only when it may pass.
            let mut svc = replica(&server, &clock, weighted, Duration::ZERO);
            let refused = send(&mut svc, &key, limit).await.unwrap_err();
            assert!(refused.is::<RateLimited>(), "{refused}");
            fastest = fastest.min(longest_script(&mut conn));
        }
        cases.push((
            format!("{shape}: refused, the whole window to leave"),
            fastest,
        ));

        // A waiter behind the whole window (its reply says what is left
        // when it goes), dropped while it waits (its booking given back).
        let mut waiting = replica(&server, &clock, weighted, Duration::from_secs(120));
        let mut fastest = u64::MAX;
        for _ in 0..TRIES {
            let call =
                tokio::time::timeout(Duration::from_millis(50), send(&mut waiting, &key, limit))
                    .await;
            assert!(call.is_err(), "waits a window: {call:?}");
            // The give-back runs in a task of its own.
            tokio::time::sleep(Duration::from_millis(50)).await;
            fastest = fastest.min(longest_script(&mut conn));
        }
        cases.push((
            format!("{shape}: a waiter behind the whole window"),
            fastest,
        ));

        // A window on: every booking has expired, and the first call
        // after finds them all.
        clock.fetch_add(MINUTE, Ordering::SeqCst);
        let mut fastest = u64::MAX;
        for key in &expiring {
            touch_oldest(&mut conn);
            send(&mut svc, key, 1).await.expect("an empty window");
            fastest = fastest.min(longest_script(&mut conn));
        }
        cases.push((
            format!("{shape}: the whole window expired at once"),
            fastest,
        ));
    }
    eprintln!("fastest of {TRIES}, µs: {cases:?}");
    for (name, micros) in cases {
        assert!(
            micros <= MOST_MICROS,
            "{name}: {micros} µs of Redis time, more than {MOST_MICROS} µs"
        );
    }
}

/// Waiters booked far ahead fill a window counting cost many times over
/// (its limit bounds the live bookings, not those ahead): a refusal and a
/// new waiter still read no more than the limit's worth.
#[tokio::test]
async fn waiters_booked_far_ahead_cost_redis_no_more_than_the_limit() {
    let Some((server, mut conn, clock)) =
        logging_server("waiters_booked_far_ahead_cost_redis_no_more")
    else {
        return;
    };
    let _busy = Busy::start(&server);
    let day = Duration::from_secs(24 * 3_600);
    // 1,000 waiters of 2 units, on replicas of their own: 75 a minute,
    // booked up to 14 minutes ahead, each asleep until its instant (real
    // time), aborted at the end.
    let mut waiters = Vec::new();
    for _ in 0..1_000 {
        let mut svc = replica(&server, &clock, true, day);
        waiters.push(tokio::spawn(async move {
            let _ = send(&mut svc, "ahead", 2).await;
        }));
    }
    // Every waiter booked: the set holds them all.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let booked: u64 = redis::cmd("EVAL")
            .arg("local n = 0 for _, k in ipairs(redis.call('KEYS', 'slow:*')) do if redis.call('TYPE', k).ok == 'zset' then n = n + redis.call('ZCOUNT', k, 0, '+inf') end end return n")
            .arg(0)
            .query(&mut conn)
            .expect("EVAL");
        if booked >= 1_000 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{booked} booked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    longest_script(&mut conn);
    let mut refusal = u64::MAX;
    for _ in 0..TRIES {
        let mut refused = replica(&server, &clock, true, Duration::ZERO);
        let err = send(&mut refused, "ahead", 2).await.unwrap_err();
        assert!(err.is::<RateLimited>(), "{err}");
        refusal = refusal.min(longest_script(&mut conn));
    }
    let mut one_more = replica(&server, &clock, true, day);
    let mut waiter = u64::MAX;
    for _ in 0..TRIES {
        let call =
            tokio::time::timeout(Duration::from_millis(50), send(&mut one_more, "ahead", 2)).await;
        assert!(call.is_err(), "waits: {call:?}");
        waiter = waiter.min(longest_script(&mut conn));
    }
    for w in waiters {
        w.abort();
    }
    eprintln!("µs: refusal {refusal}, a waiter behind 1,000 {waiter}");
    assert!(refusal <= MOST_MICROS, "a refusal took {refusal} µs");
    assert!(waiter <= MOST_MICROS, "a waiter took {waiter} µs");
}
