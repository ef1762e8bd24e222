//! What an admission through `RateLimitLayer` on Redis costs.
//!
//! - Redis's own time per admission (`INFO commandstats`, `usec_per_call`)
//!   next to the floor: the least any GCRA on Redis must do, a script of
//!   our own that reads the clock, reads the state, decides and writes it
//!   back with its TTL (`TIME`, `GET`, `SET PX`), the shape of
//!   go-redis/redis_rate's `allow_n`. Ours for one token bucket, for a
//!   sliding window of 1,000 (bookings kept, one leaving and one coming per
//!   admission) and for a sliding window counter of 1,000 (three numbers),
//!   in rounds alternated on the same server.
//! - Latency one request at a time next to a `PING` (criterion's median,
//!   and p50/p99 from a histogram).
//! - Throughput with 64 requests in flight on one multiplexed connection,
//!   next to `redis-benchmark` running the very same script call (its
//!   arguments read back from `SLOWLOG`) on 64 connections.
//!
//! The bench starts a `redis-server` of its own (persistence off) and
//! stops it.
//!
//! ```text
//! cargo bench --features redis --bench redis                    # criterion
//! TT_REDIS_REPORT=1 cargo bench --features redis --bench redis  # the report
//! ```
//!
//! Numbers in `benches/RESULTS.md`; the goals: Redis time ≤ 1.0× the
//! floor's for one token bucket and ≤ 1.5× for a sliding window of 1,000;
//! throughput ≥ 85% of redis-benchmark's on our script.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::Criterion;
use hdrhistogram::Histogram;
use http::{Request, Response};
use tower::{Layer, ServiceExt};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Algorithm, Quota, RateLimit, RateLimitLayer, Unit};
use tower_throttle::redis::RedisStore;

type Inner = tower::util::ServiceFn<fn(Request<()>) -> Ready<Result<Response<()>, Infallible>>>;
type Svc = RateLimit<
    Inner,
    GlobalKey,
    tower_throttle::rate_limit::OneUnit,
    tower_throttle::rate_limit::CountAll,
    tower_throttle::rate_limit::NoAnnotation,
>;

fn inner() -> Inner {
    fn answer(_req: Request<()>) -> Ready<Result<Response<()>, Infallible>> {
        ready(Ok(Response::new(())))
    }
    tower::service_fn(answer as fn(_) -> _)
}

/// A store on `url`, and a limiter on it that admits everything the bench
/// sends (a token bucket far above the rate), so every request is one
/// script call that books.
fn setup(url: &str) -> (RedisStore, Svc) {
    let store = RedisStore::new(url)
        .expect("valid URL")
        .with_prefix("bench:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5));
    let quota = Quota::per_second(10_000)
        .and_then(|q| q.with_burst(10_000_000))
        .expect("valid quota");
    let svc = RateLimitLayer::new(quota, GlobalKey)
        .with_store(store.clone())
        .expect("a quota Redis keeps")
        .layer(inner());
    (store, svc)
}

async fn admit(svc: &Svc) {
    let res = svc.clone().oneshot(Request::new(())).await;
    assert!(res.is_ok(), "an admission failed: {:?}", res.err());
}

fn criterion_benches(c: &mut Criterion, url: &str, runtime: &tokio::runtime::Runtime) {
    let (store, svc) = setup(url);
    let mut g = c.benchmark_group("redis_latency");
    // Each batch runs in one `block_on`, so the runtime's entry is not
    // counted per call.
    g.bench_function("ping", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    assert!(store.ping().await);
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("admission", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    admit(&svc).await;
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

/// p50 and p99 of `n` sequential calls of `a` and of `b`, alternated so
/// that both see the same noise of a shared machine, in microseconds.
async fn percentiles<A, AF, B, BF>(n: usize, a: A, b: B) -> [(f64, f64); 2]
where
    A: Fn() -> AF,
    AF: std::future::Future<Output = ()>,
    B: Fn() -> BF,
    BF: std::future::Future<Output = ()>,
{
    let mut h = [
        Histogram::<u64>::new(3).expect("a histogram"),
        Histogram::<u64>::new(3).expect("a histogram"),
    ];
    for _ in 0..n {
        let start = Instant::now();
        a().await;
        let _ = h[0].record(start.elapsed().as_nanos() as u64);
        let start = Instant::now();
        b().await;
        let _ = h[1].record(start.elapsed().as_nanos() as u64);
    }
    h.map(|h| {
        (
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
        )
    })
}

/// Calls per second with `in_flight` at once, `n` in all.
async fn throughput<F, Fut>(n: usize, in_flight: usize, call: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let per_task = n / in_flight;
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let call = call.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    call().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task ran");
    }
    (per_task * in_flight) as f64 / start.elapsed().as_secs_f64()
}

/// `redis-benchmark` at `clients` connections running `command` (`-t
/// ping` when empty): requests per second, if the tool is there.
fn redis_benchmark(port: u16, clients: usize, n: usize, command: &[String]) -> Option<f64> {
    let mut run = std::process::Command::new("redis-benchmark");
    run.args(["-p", &port.to_string(), "-q"]).args([
        "-c",
        &clients.to_string(),
        "-n",
        &n.to_string(),
    ]);
    if command.is_empty() {
        run.args(["-t", "ping"]);
    } else {
        run.args(command);
    }
    let out = run.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "PING_MBULK: 123456.79 requests per second, p50=0.223 msec", or
    // "EVALSHA ...: 123456.79 requests per second, ...", after progress
    // lines ended by carriage returns.
    let wanted = if command.is_empty() {
        "PING_MBULK"
    } else {
        "EVALSHA"
    };
    text.split(['\r', '\n'])
        .filter(|l| l.starts_with(wanted) && l.contains("requests per second"))
        .find_map(|l| {
            let (_, rate) = l.rsplit_once(": ")?;
            rate.split_whitespace().next()?.parse().ok()
        })
}

/// The least any GCRA on Redis must do per admission: the floor ours is
/// measured against. Arguments: emission interval and tolerance, in µs.
const FLOOR: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local emission = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new = tat + emission
if new - tolerance > now then return {0, new - tolerance - now} end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1000)
return {1, 0}
"#;

/// Redis's own time per script call since the last reset, in µs.
fn usec_per_call(conn: &mut redis::Connection) -> f64 {
    testkit::redis::RedisServer::command_stat(conn, "evalsha", "usec_per_call")
}

fn reset_stats(conn: &mut redis::Connection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(conn)
        .expect("CONFIG RESETSTAT");
}

/// A limiter on `url` with one `quota` of 1,000 per second, counting
/// requests, on a clock that moves a millisecond per admission: a sliding
/// window always holds 1,000 bookings, one leaves and one comes per
/// admission; a sliding window counter turns its windows over as traffic
/// does.
fn sliding(url: &str, prefix: &str, algorithm: Algorithm) -> (Arc<AtomicU64>, Svc) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let clock = Arc::new(AtomicU64::new(now));
    let store = RedisStore::new(url)
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5))
        .with_test_clock(clock.clone());
    let quota = Quota::per_second(1_000)
        .expect("valid quota")
        .with_algorithm(algorithm)
        .with_unit(Unit::Requests);
    let svc = RateLimitLayer::new(quota, GlobalKey)
        .with_store(store)
        .expect("a quota Redis keeps")
        .layer(inner());
    (clock, svc)
}

/// Redis time per call of the floor, of our token bucket, of our sliding
/// window and of our sliding window counter, in alternated rounds of `n`
/// calls each.
async fn redis_time(url: &str, conn: &mut redis::Connection, svc: &Svc, rounds: usize, n: usize) {
    let client = redis::Client::open(url).expect("valid URL");
    let mut floor_conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let floor = redis::Script::new(FLOOR);
    // 6 µs a unit, a minute's burst: it always admits.
    let mut invocation = floor.key("bench-floor");
    invocation.arg(6).arg(60_000_000);
    let (clock, window) = sliding(url, "bench-sliding:", Algorithm::SlidingWindow);
    let slide = || {
        clock.fetch_add(1_000, Ordering::SeqCst);
        admit(&window)
    };
    let (counter_clock, counter) = sliding(url, "bench-counter:", Algorithm::SlidingWindowCounter);
    // A counter held at its very rate refuses now and then (the previous
    // window still weighs a little): 10% under it.
    let count = || {
        counter_clock.fetch_add(1_100, Ordering::SeqCst);
        admit(&counter)
    };
    // Warm: the scripts loaded, the window full.
    for _ in 0..1_000 {
        let _: redis::Value = invocation
            .invoke_async(&mut floor_conn)
            .await
            .expect("the floor script");
        slide().await;
        count().await;
    }
    println!("Redis time per admission (INFO commandstats, µs per call; {n} calls a round):");
    println!(
        "  round   floor   token bucket   ratio   sliding 1,000   ratio   counter 1,000   ratio"
    );
    let mut ratios = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        reset_stats(conn);
        for _ in 0..n {
            let _: redis::Value = invocation
                .invoke_async(&mut floor_conn)
                .await
                .expect("the floor script");
        }
        let floor_us = usec_per_call(conn);
        reset_stats(conn);
        for _ in 0..n {
            admit(svc).await;
        }
        let bucket_us = usec_per_call(conn);
        reset_stats(conn);
        for _ in 0..n {
            slide().await;
        }
        let sliding_us = usec_per_call(conn);
        reset_stats(conn);
        for _ in 0..n {
            count().await;
        }
        let counter_us = usec_per_call(conn);
        let (b, w, a) = (
            bucket_us / floor_us,
            sliding_us / floor_us,
            counter_us / floor_us,
        );
        println!(
            "  {round:5} {floor_us:7.2} {bucket_us:14.2} {b:6.2}× {sliding_us:15.2} {w:6.2}× \
             {counter_us:15.2} {a:6.2}×"
        );
        ratios.0.push(b);
        ratios.1.push(w);
        ratios.2.push(a);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "  median ratio: token bucket {:.2}×, sliding window of 1,000 {:.2}×, \
         sliding window counter of 1,000 {:.2}×",
        median(&mut ratios.0),
        median(&mut ratios.1),
        median(&mut ratios.2)
    );
}

/// The script call an admission makes, as Redis logged it: the arguments
/// `redis-benchmark` repeats.
fn logged_admission(conn: &mut redis::Connection) -> Vec<String> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(16)
        .query(conn)
        .expect("SLOWLOG GET");
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let Some(redis::Value::Array(args)) = fields.get(3) else {
            continue;
        };
        let args: Vec<String> = args
            .iter()
            .filter_map(|a| match a {
                redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect();
        if args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case("EVALSHA"))
        {
            return args;
        }
    }
    Vec::new()
}

fn report(server: &testkit::redis::RedisServer, runtime: &tokio::runtime::Runtime) {
    let (url, port) = (server.url(), server.port);
    let mut conn = server.connection();
    let (store, svc) = setup(&url);
    runtime.block_on(async {
        // Warm: the connection made, the script loaded.
        for _ in 0..1_000 {
            admit(&svc).await;
            store.ping().await;
        }
        redis_time(&url, &mut conn, &svc, 7, 20_000).await;

        let n = 20_000;
        let [(ping_p50, ping_p99), (adm_p50, adm_p99)] =
            percentiles(n, || async { assert!(store.ping().await) }, || admit(&svc)).await;
        println!("latency, one at a time ({n} each):");
        println!("  PING       p50 {ping_p50:7.1} µs  p99 {ping_p99:7.1} µs");
        println!("  admission  p50 {adm_p50:7.1} µs  p99 {adm_p99:7.1} µs");
        println!("  admission / PING at p50: {:.2}×", adm_p50 / ping_p50);

        // The admission's own call, as Redis received it.
        let log_every = |conn: &mut redis::Connection, on: bool| {
            let slower_than = if on { 0 } else { 10_000 };
            testkit::redis::RedisServer::config_set(conn, "slowlog-log-slower-than", slower_than);
        };
        log_every(&mut conn, true);
        admit(&svc).await;
        let command = logged_admission(&mut conn);
        log_every(&mut conn, false);

        let (in_flight, n) = (64, 200_000);
        let ping_store = store.clone();
        let ping_rate = throughput(n, in_flight, move || {
            let store = ping_store.clone();
            async move { assert!(store.ping().await) }
        })
        .await;
        println!("throughput, {in_flight} in flight on one connection ({n} each):");
        println!("  PING       {ping_rate:9.0} /s");
        if let Some(rate) = redis_benchmark(port, in_flight, n, &[]) {
            println!("  redis-benchmark -t ping -c {in_flight}: {rate:9.0} /s");
        }
        // Alternated, so that both see the same noise.
        for _ in 0..3 {
            let adm_svc = svc.clone();
            let adm_rate = throughput(n, in_flight, move || {
                let svc = adm_svc.clone();
                async move { admit(&svc).await }
            })
            .await;
            match redis_benchmark(port, in_flight, n, &command) {
                Some(rate) => println!(
                    "  admission {adm_rate:9.0} /s; redis-benchmark, the same call, -c \
                     {in_flight}: {rate:9.0} /s; {:.0}%",
                    100.0 * adm_rate / rate
                ),
                None => println!("  admission {adm_rate:9.0} /s (redis-benchmark not found)"),
            }
        }
    });
}

fn main() {
    let Some(server) = testkit::redis::RedisServer::start("benches/redis.rs") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    if std::env::var_os("TT_REDIS_REPORT").is_some() {
        report(&server, &runtime);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c, &server.url(), &runtime);
    c.final_summary();
}
