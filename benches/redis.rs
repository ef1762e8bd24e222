//! What an admission through `RateLimitLayer` on Redis costs, next to a
//! plain `PING` on the same connection: latency (criterion's median, and
//! p50/p99 from a histogram) one request at a time, and throughput with 64
//! requests in flight on one multiplexed connection, next to
//! `redis-benchmark -t ping` at the same concurrency. The bench starts a
//! `redis-server` of its own (persistence off) and stops it.
//!
//! ```text
//! cargo bench --features redis --bench redis                    # criterion
//! TT_REDIS_REPORT=1 cargo bench --features redis --bench redis  # p50/p99 and throughput
//! ```
//!
//! Numbers in `benches/RESULTS.md`; the goals: admission p50 ≤ 1.3× the
//! PING's, throughput ≥ 50% of redis-benchmark's.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::time::{Duration, Instant};

use criterion::Criterion;
use hdrhistogram::Histogram;
use http::{Request, Response};
use tower::{Layer, ServiceExt};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimit, RateLimitLayer};
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

/// `redis-benchmark -t ping` at `clients` connections: requests per second
/// of PING_MBULK, if the tool is there.
fn redis_benchmark(port: u16, clients: usize, n: usize) -> Option<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", "ping", "-q"])
        .args(["-c", &clients.to_string(), "-n", &n.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "PING_MBULK: 123456.79 requests per second, p50=0.223 msec", after
    // progress lines ended by carriage returns.
    text.split(['\r', '\n'])
        .filter(|l| l.starts_with("PING_MBULK") && l.contains("requests per second"))
        .find_map(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn report(url: &str, port: u16, runtime: &tokio::runtime::Runtime) {
    let (store, svc) = setup(url);
    runtime.block_on(async {
        // Warm: the connection made, the script loaded.
        for _ in 0..1_000 {
            admit(&svc).await;
            store.ping().await;
        }
        let n = 20_000;
        let [(ping_p50, ping_p99), (adm_p50, adm_p99)] =
            percentiles(n, || async { assert!(store.ping().await) }, || admit(&svc)).await;
        println!("latency, one at a time ({n} each):");
        println!("  PING       p50 {ping_p50:7.1} µs  p99 {ping_p99:7.1} µs");
        println!("  admission  p50 {adm_p50:7.1} µs  p99 {adm_p99:7.1} µs");
        println!("  admission / PING at p50: {:.2}×", adm_p50 / ping_p50);

        let (in_flight, n) = (64, 200_000);
        let ping_store = store.clone();
        let ping_rate = throughput(n, in_flight, move || {
            let store = ping_store.clone();
            async move { assert!(store.ping().await) }
        })
        .await;
        let adm_svc = svc.clone();
        let adm_rate = throughput(n, in_flight, move || {
            let svc = adm_svc.clone();
            async move { admit(&svc).await }
        })
        .await;
        println!("throughput, {in_flight} in flight on one connection ({n} each):");
        println!("  PING       {ping_rate:9.0} /s");
        println!("  admission  {adm_rate:9.0} /s");
        match redis_benchmark(port, in_flight, n) {
            Some(rate) => {
                println!("  redis-benchmark -t ping -c {in_flight}: {rate:9.0} /s");
                println!(
                    "  admission / redis-benchmark: {:.0}%",
                    100.0 * adm_rate / rate
                );
            }
            None => println!("  (redis-benchmark not found)"),
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
        report(&server.url(), server.port, &runtime);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c, &server.url(), &runtime);
    c.final_summary();
}
