//! Cost of a ready admission through `RateLimitLayer`, side by side with
//! governor (keyed `check_key`), tower_governor's layer and tower's own
//! `RateLimit`, plus memory per idle key. The hot-key group also runs a
//! yardstick, `floor_*` (see `benches/floor`): the least a keyed limiting
//! layer can do, so what ours costs over it is what its features cost.
//!
//! Every service is driven synchronously: `poll_ready` and one poll of the
//! response future with a no-op waker, no runtime per iteration. Every layered
//! contender gets the same request (a clone of one prebuilt request, whose cost
//! the `bare_inner` anchor measures) and the same ready inner service.
//!
//! The memory report runs first, each limiter in a child process of its own so
//! that one limiter's freed memory cannot hide the next one's growth. Set
//! `TT_SKIP_MEMORY=1` to skip it; it is skipped in criterion's test mode
//! (no `--bench` argument, as under `cargo test`; or `--test`, `--list`).
//!
//! ```text
//! cargo bench --bench rate_limit -- --warm-up-time 1 --measurement-time 3
//! ```

mod floor;
mod support;

use floor::{Floor, FloorKey};
use support::drive;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use axum::body::Body;
use criterion::Criterion;
use governor::clock::FakeRelativeClock;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use http::{HeaderName, HeaderValue, Request, Response};
use tower::{Layer, Service};
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_throttle::clock::{FastClock, ManualClock};
use tower_throttle::error::KeyError;
use tower_throttle::key::{GlobalKey, HeaderKey, KeyBuilder, KeyExtractor};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

const API_KEY: &str = "sk-live-0123456789abcdef01234567";
const HEADER: HeaderName = HeaderName::from_static("x-api-key");
const PROBE_ENV: &str = "TT_MEMORY_PROBE";
/// Key counts for the memory report: the issue's million, and one where
/// equal-share hash tables sit at a good point of their doubling.
const MEMORY_KEYS: [u64; 2] = [1_000_000, 700_000];
const KEYS_ENV: &str = "TT_MEMORY_KEYS";

// ---------------------------------------------------------------- helpers

type HttpResponse = Response<Body>;

/// The inner service every HTTP contender wraps: a ready, empty response.
/// (tower_governor needs `Response<B>: From<GovernorError>`, hence axum's
/// body; `Body::empty()` boxes a zero-sized body, so it does not allocate.)
fn http_inner() -> impl Service<
    Request<()>,
    Response = HttpResponse,
    Error = Infallible,
    Future = Ready<Result<HttpResponse, Infallible>>,
> + Clone {
    tower::service_fn(|_req: Request<()>| ready(Ok::<_, Infallible>(Response::new(Body::empty()))))
}

/// The inner service of the contenders whose request is a bare `u64` key.
fn u64_inner()
-> impl Service<u64, Response = (), Error = Infallible, Future = Ready<Result<(), Infallible>>> + Clone
{
    tower::service_fn(|_key: u64| ready(Ok::<_, Infallible>(())))
}

fn hot_request() -> Request<()> {
    Request::builder()
        .uri("/v1/chat")
        .header(HEADER, API_KEY)
        .body(())
        .unwrap()
}

/// [`hot_request`] with the headers a client usually sends before the key
/// (`TT_HEADERS=n` in loop mode: n headers in all, the key last), so that
/// a header key's lookup is measured where it has others to pass over.
fn request_with_headers(n: usize) -> Request<()> {
    const USUAL: [(&str, &str); 9] = [
        ("host", "api.example.com"),
        ("user-agent", "openai-python/1.54.0"),
        ("accept", "application/json"),
        ("content-type", "application/json"),
        ("content-length", "182"),
        ("authorization", "Bearer sk-proj-0123456789"),
        ("x-request-id", "01JD8X3M2QK7Z5W4V6N9P0R1S2"),
        ("accept-encoding", "gzip, deflate"),
        ("x-stainless-lang", "python"),
    ];
    let mut req = Request::builder().uri("/v1/chat");
    for (name, value) in USUAL.iter().take(n.saturating_sub(1)) {
        req = req.header(*name, *value);
    }
    req.header(HEADER, API_KEY).body(()).unwrap()
}

/// So large a key never runs out: 1 ns per unit, a burst of `u32::MAX`.
fn ours_hot_quota() -> Quota {
    Quota::per_second(u32::MAX).unwrap()
}

fn gov_hot_quota() -> GQuota {
    GQuota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::MAX)
}

/// For many keys (each inserted once before its benchmark): a key stays live (not idle) for as long as the benchmark
/// runs, so both stores hold every key, yet never runs out (1 per second,
/// burst 30 million).
fn ours_live_quota() -> Quota {
    Quota::per_second(1)
        .unwrap()
        .with_burst(30_000_000)
        .unwrap()
}

fn gov_live_quota() -> GQuota {
    GQuota::per_second(NonZeroU32::new(1).unwrap())
        .allow_burst(NonZeroU32::new(30_000_000).unwrap())
}

/// Keys the way an id column looks: distinct, ten decimal digits.
fn distinct_keys(n: u64, base: u64) -> Vec<u64> {
    (0..n).map(|i| base + i * 7).collect()
}

/// Our key from a `u64` request, as raw bytes (no decimal formatting), to
/// show what the closure extractor's `Display` formatting costs.
#[derive(Clone, Copy, Debug)]
struct U64Bytes;

impl KeyExtractor<u64> for U64Bytes {
    #[inline]
    fn extract(&self, req: &u64, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        key.push_bytes(&req.to_le_bytes());
        Ok(())
    }
}

/// tower_governor key: the `x-api-key` header value (a refcounted clone; no
/// allocation, no header-name parsing).
#[derive(Clone, Copy, Debug)]
struct HeaderValueKey;

impl tower_governor::key_extractor::KeyExtractor for HeaderValueKey {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<HeaderValue, GovernorError> {
        req.headers()
            .get(&HEADER)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

// ---------------------------------------------------------------- 1 + 2: hot key

fn ours_global() -> impl Service<Request<()>, Response = HttpResponse> + Clone {
    RateLimitLayer::new(ours_hot_quota(), GlobalKey).layer(http_inner())
}

/// The natural peer of `with_response_headers`: tower-http writing two
/// response headers (the two a rate limit writes), with values fixed
/// beforehand (`formatted: false`: the least writing two headers can cost)
/// or formatted per response as a user would write what remains by hand
/// (`true`).
fn tower_http_two_headers(
    formatted: bool,
) -> impl Service<Request<()>, Response = HttpResponse> + Clone {
    use tower_http::set_header::SetResponseHeaderLayer;
    let policy = HeaderName::from_static("ratelimit-policy");
    let limit = HeaderName::from_static("ratelimit");
    let fixed = |v: &'static str| move |_: &HttpResponse| Some(HeaderValue::from_static(v));
    let counted = move |_: &HttpResponse| {
        let remaining = black_box(999_999_u32);
        HeaderValue::from_str(&format!("\"default\";r={remaining};t=1")).ok()
    };
    let service = tower::ServiceBuilder::new().layer(SetResponseHeaderLayer::overriding(
        policy,
        fixed("\"default\";q=1000000;w=1"),
    ));
    if formatted {
        tower::util::Either::Left(
            service
                .layer(SetResponseHeaderLayer::overriding(limit, counted))
                .service(http_inner()),
        )
    } else {
        tower::util::Either::Right(
            service
                .layer(SetResponseHeaderLayer::overriding(
                    limit,
                    fixed("\"default\";r=999999;t=1"),
                ))
                .service(http_inner()),
        )
    }
}

fn tower_governor_header() -> impl Service<Request<()>, Response = HttpResponse> + Clone {
    let config = GovernorConfigBuilder::default()
        .key_extractor(HeaderValueKey)
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .finish()
        .unwrap();
    tower_governor::GovernorLayer::new(config).layer(http_inner())
}

fn floor(key: FloorKey) -> impl Service<Request<()>, Response = HttpResponse> + Clone {
    Floor::new(http_inner(), key, 1, u64::from(u32::MAX))
}

/// `n` requests through one contender, out of line so that valgrind can
/// count its instructions alone (see [`loop_mode`]); how many were
/// admitted (a `200`: tower_governor refuses with an `Ok` `429`).
#[inline(never)]
fn request_loop<S>(svc: &mut S, req: &Request<()>, n: u64) -> u64
where
    S: Service<Request<()>, Response = HttpResponse>,
{
    let admitted = |_: &u64| {
        let outcome = drive(svc, req.clone());
        matches!(outcome, Ok(response) if response.status() == http::StatusCode::OK)
    };
    (0..n).filter(admitted).count() as u64
}

/// As [`request_loop`], for governor's `check_key` called directly.
#[inline(never)]
fn check_key_loop(limiter: &DefaultKeyedRateLimiter<String>, key: &String, n: u64) -> u64 {
    (0..n)
        .filter(|_| black_box(limiter.check_key(black_box(key)).is_ok()))
        .count() as u64
}

/// As [`request_loop`], for governor's direct (unkeyed) `check`: the
/// natural peer of `ours_global`.
#[inline(never)]
fn check_loop(limiter: &DefaultDirectRateLimiter, n: u64) -> u64 {
    (0..n)
        .filter(|_| black_box(limiter.check().is_ok()))
        .count() as u64
}

/// `request_loop` on a contender already built, timed: (admitted, ns each).
fn timed<S>(mut svc: S, req: &Request<()>, n: u64) -> (u64, f64)
where
    S: Service<Request<()>, Response = HttpResponse>,
{
    let start = Instant::now();
    let admitted = request_loop(&mut svc, req, n);
    (admitted, per_request(start, n))
}

fn per_request(start: Instant, n: u64) -> f64 {
    start.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// `TT_LOOP=<contender>` (and `TT_LOOP_N`, default 100,000): run only that
/// hot-key contender's requests, in `request_loop`, and print the time per
/// request. Many such runs, interleaved, give steadier medians on a noisy
/// machine than criterion's few seconds per contender; under valgrind they
/// give an instruction count that does not depend on the noise at all:
///
/// ```text
/// TT_LOOP=ours_header valgrind --tool=callgrind --collect-atstart=no \
///     --toggle-collect='rate_limit::request_loop*' target/release/deps/rate_limit-<hash>
/// ```
///
/// (`rate_limit::check_key_loop*` for `governor_check_key_string`,
/// `rate_limit::check_loop*` for `governor_direct`: a bare call, so its
/// count is its added cost as it stands.) Divide
/// the collected count by the number of requests. Every contender is built
/// before the loop, so neither count nor time includes building it (nor
/// calibrating governor's clock).
fn loop_mode(which: &str) {
    let n = std::env::var("TT_LOOP_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let req = match std::env::var("TT_HEADERS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        Some(n) => request_with_headers(n),
        None => hot_request(),
    };
    let (admitted, per_request) = match which {
        "bare_inner" => timed(http_inner(), &req, n),
        "ours_global" => timed(ours_global(), &req, n),
        "ours_header" => {
            let layer = RateLimitLayer::new(ours_hot_quota(), HeaderKey::from_name(HEADER));
            timed(layer.layer(http_inner()), &req, n)
        }
        "tower_governor_header" => timed(tower_governor_header(), &req, n),
        "tower_http_two_headers_fixed" => timed(tower_http_two_headers(false), &req, n),
        "tower_http_two_headers_formatted" => timed(tower_http_two_headers(true), &req, n),
        "ours_header_response_headers" => {
            // What `with_response_headers` adds: the key's remaining
            // capacity, and the IETF `RateLimit-Policy` and `RateLimit`
            // fields written on every response.
            let layer = RateLimitLayer::new(ours_hot_quota(), HeaderKey::from_name(HEADER))
                .with_response_headers(tower_throttle::respond::RateLimitHeaders::ietf());
            timed(layer.layer(http_inner()), &req, n)
        }
        "tower_limit_rate" => {
            // tower's RateLimit makes a tokio `Sleep` when built: it needs a
            // runtime context (entered once, before the loop).
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let _guard = rt.enter();
            let layer = tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(1));
            timed(layer.layer(http_inner()), &req, n)
        }
        "governor_direct" => {
            let limiter = RateLimiter::direct(gov_hot_quota());
            let start = Instant::now();
            let admitted = check_loop(&limiter, n);
            (admitted, per_request(start, n))
        }
        "floor_global" => timed(floor(FloorKey::Global), &req, n),
        "floor_header" => timed(floor(FloorKey::Header(HEADER)), &req, n),
        "governor_check_key_string" => {
            let limiter = RateLimiter::keyed(gov_hot_quota());
            let key = API_KEY.to_string();
            let start = Instant::now();
            let admitted = check_key_loop(&limiter, &key, n);
            (admitted, per_request(start, n))
        }
        other => panic!("TT_LOOP: no hot-key contender named {other:?}"),
    };
    assert_eq!(admitted, n, "every request is admitted");
    println!("{which}: {n} requests, {per_request:.1} ns each");
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    let req = hot_request();

    {
        let mut svc = http_inner();
        g.bench_function("bare_inner", |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
    }
    {
        let mut svc = ours_global();
        assert!(drive(&mut svc, req.clone()).is_ok(), "ours admits");
        g.bench_function("ours_global", |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
    }
    {
        let layer = RateLimitLayer::new(ours_hot_quota(), HeaderKey::from_name(HEADER));
        let mut svc = layer.layer(http_inner());
        drive(&mut svc, req.clone()).expect("ours admits");
        g.bench_function("ours_header", |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
        // As a server drives it: a clone of a template service per request.
        g.bench_function("ours_header_clone_per_request", |b| {
            b.iter(|| black_box(drive(&mut svc.clone(), req.clone()).is_ok()))
        });
        assert_eq!(layer.key_count(), 1);
    }
    {
        let mut svc = tower_governor_header();
        let first = drive(&mut svc, req.clone())
            .ok()
            .expect("tower_governor admits");
        assert_eq!(
            first.status(),
            http::StatusCode::OK,
            "tower_governor admits"
        );
        g.bench_function("tower_governor_header", |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
        g.bench_function("tower_governor_header_clone_per_request", |b| {
            b.iter(|| black_box(drive(&mut svc.clone(), req.clone()).is_ok()))
        });
        let last = drive(&mut svc, req.clone())
            .ok()
            .expect("tower_governor admits");
        assert_eq!(
            last.status(),
            http::StatusCode::OK,
            "tower_governor still admits"
        );
    }
    for (name, formatted) in [
        ("tower_http_two_headers_fixed", false),
        ("tower_http_two_headers_formatted", true),
    ] {
        let mut svc = tower_http_two_headers(formatted);
        let res = drive(&mut svc, req.clone())
            .ok()
            .expect("tower-http answers");
        assert_eq!(res.headers().len(), 2, "two headers written");
        g.bench_function(name, |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
    }
    {
        // tower's RateLimit makes a tokio `Sleep` when built: it needs a
        // runtime context (entered once, not per iteration).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let mut svc =
            tower::limit::RateLimitLayer::new(u64::MAX, Duration::from_secs(1)).layer(http_inner());
        g.bench_function("tower_limit_rate", |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
    }
    // The yardstick: the least a keyed limiting layer can do (see
    // `benches/floor`). What ours costs over it is what its features cost.
    for (name, key) in [
        ("floor_global", FloorKey::Global),
        ("floor_header", FloorKey::Header(HEADER)),
    ] {
        let mut svc = floor(key);
        assert!(drive(&mut svc, req.clone()).is_ok(), "the floor admits");
        g.bench_function(name, |b| {
            b.iter(|| black_box(drive(&mut svc, req.clone()).is_ok()))
        });
    }
    {
        let limiter = RateLimiter::keyed(gov_hot_quota());
        let key = API_KEY.to_string();
        g.bench_function("governor_check_key_string", |b| {
            b.iter(|| black_box(limiter.check_key(black_box(&key)).is_ok()))
        });
        assert!(limiter.check_key(&key).is_ok());
    }
    {
        let limiter = RateLimiter::direct(gov_hot_quota());
        g.bench_function("governor_direct_check", |b| {
            b.iter(|| black_box(limiter.check().is_ok()))
        });
    }
    g.finish();
}

/// What reading the time costs. Without the `test-util` feature ours reads
/// `FastClock` (quanta's TSC counter, scaled from the limiter's origin), as
/// governor does; with it, tokio's `Instant::now`.
fn clocks(c: &mut Criterion) {
    use governor::clock::Clock as _;
    use tower_throttle::clock::Clock as _;
    let mut g = c.benchmark_group("clock");
    let fast = FastClock::new();
    g.bench_function("ours_fast_clock_now", |b| b.iter(|| black_box(fast.now())));
    g.bench_function("tokio_instant_now", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()))
    });
    g.bench_function("std_instant_now", |b| b.iter(|| black_box(Instant::now())));
    let quanta = governor::clock::DefaultClock::default();
    g.bench_function("governor_default_clock_now", |b| {
        b.iter(|| black_box(quanta.now()))
    });
    g.finish();
}

// ---------------------------------------------------------------- 3: many keys

/// `quick`: criterion's test mode (`cargo test --benches`, `--test`), where
/// each benchmark runs once: fewer keys, so that a debug build stays fast.
fn many_keys(c: &mut Criterion, quick: bool) {
    let sizes: [u64; 2] = if quick {
        [100, 1_000]
    } else {
        [10_000, 1_000_000]
    };
    for n in sizes {
        let mut g = c.benchmark_group(format!("keys_{n}"));
        let keys = distinct_keys(n, 1_000_000_000);

        {
            let layer = RateLimitLayer::new(ours_live_quota(), |k: &u64| Some(*k));
            let mut svc = layer.layer(u64_inner());
            for &k in &keys {
                drive(&mut svc, k).expect("ours admits");
            }
            let mut i = 0;
            g.bench_function("ours_u64_closure", |b| {
                b.iter(|| {
                    let k = keys[i];
                    i += 1;
                    if i == keys.len() {
                        i = 0;
                    }
                    black_box(drive(&mut svc, k).is_ok())
                })
            });
            assert_eq!(layer.key_count() as u64, n, "every key live");
            drive(&mut svc, keys[0]).expect("ours still admits");
        }
        {
            let layer = RateLimitLayer::new(ours_live_quota(), U64Bytes);
            let mut svc = layer.layer(u64_inner());
            for &k in &keys {
                drive(&mut svc, k).expect("ours admits");
            }
            let mut i = 0;
            g.bench_function("ours_u64_bytes", |b| {
                b.iter(|| {
                    let k = keys[i];
                    i += 1;
                    if i == keys.len() {
                        i = 0;
                    }
                    black_box(drive(&mut svc, k).is_ok())
                })
            });
            assert_eq!(layer.key_count() as u64, n, "every key live");
        }
        {
            let limiter = RateLimiter::keyed(gov_live_quota());
            for k in &keys {
                limiter.check_key(k).expect("governor admits");
            }
            let mut i = 0;
            g.bench_function("governor_check_key_u64", |b| {
                b.iter(|| {
                    let k = &keys[i];
                    i += 1;
                    if i == keys.len() {
                        i = 0;
                    }
                    black_box(limiter.check_key(k).is_ok())
                })
            });
            assert_eq!(limiter.len() as u64, n);
            assert!(limiter.check_key(&keys[0]).is_ok());
        }
        if n == sizes[0] {
            // The same through an `http::Request` carrying the key as an
            // extension: cloning the request (and its extension map) is the
            // same for both, and `bare_http_ext` measures it.
            let reqs: Vec<Request<()>> = keys
                .iter()
                .map(|&k| {
                    let mut r = Request::new(());
                    r.extensions_mut().insert(k);
                    r
                })
                .collect();
            {
                let mut svc = http_inner();
                let mut i = 0;
                g.bench_function("bare_http_ext", |b| {
                    b.iter(|| {
                        let r = reqs[i].clone();
                        i += 1;
                        if i == reqs.len() {
                            i = 0;
                        }
                        black_box(drive(&mut svc, r).is_ok())
                    })
                });
            }
            {
                let layer = RateLimitLayer::new(ours_live_quota(), |r: &Request<()>| {
                    r.extensions().get::<u64>().copied()
                });
                let mut svc = layer.layer(http_inner());
                for r in &reqs {
                    drive(&mut svc, r.clone()).expect("ours admits");
                }
                let mut i = 0;
                g.bench_function("ours_http_ext", |b| {
                    b.iter(|| {
                        let r = reqs[i].clone();
                        i += 1;
                        if i == reqs.len() {
                            i = 0;
                        }
                        black_box(drive(&mut svc, r).is_ok())
                    })
                });
                assert_eq!(layer.key_count() as u64, n, "every key live");
            }
        }
        g.finish();
    }
}

// ---------------------------------------------------------------- 4: two threads

/// Runs `threads` workers, each doing `iters` admissions after a common
/// start; returns the slowest worker's time divided by `threads`, so that the
/// reported time per iteration is wall time per admission across all threads.
fn run_threads<W>(threads: usize, iters: u64, make_worker: impl Fn(usize) -> W + Sync) -> Duration
where
    W: FnMut(),
{
    let barrier = Barrier::new(threads);
    let slowest = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let make_worker = &make_worker;
                s.spawn(move || {
                    let mut work = make_worker(t);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        work();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    });
    slowest / threads as u32
}

/// What the threads admit on.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Every thread on the same key.
    OneKey,
    /// Each thread on one hot key of its own (the two keys may share a shard:
    /// 1 in 64 for ours, 1 in 8 for governor's 2-core DashMap; the seed is
    /// random per run).
    OwnKey,
    /// Each thread cycling over 1,024 keys of its own, disjoint between
    /// threads, so both threads touch every shard.
    DistinctKeys,
}

fn thread_keys(shape: Shape, thread: usize) -> Vec<u64> {
    let base = 1_000_000_000 + thread as u64 * 10_000_000;
    match shape {
        Shape::OneKey => vec![4242],
        Shape::OwnKey => vec![base],
        Shape::DistinctKeys => distinct_keys(1024, base),
    }
}

fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    for (name, shape) in [
        ("one_key", Shape::OneKey),
        ("own_key", Shape::OwnKey),
        ("distinct_keys", Shape::DistinctKeys),
    ] {
        for threads in [1usize, 2] {
            let layer = RateLimitLayer::new(ours_hot_quota(), |k: &u64| Some(*k));
            let svc = layer.layer(u64_inner());
            g.bench_function(format!("ours_{name}_{threads}t"), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, |t| {
                        let mut svc = svc.clone();
                        let keys = thread_keys(shape, t);
                        let mut i = 0;
                        move || {
                            let k = keys[i];
                            i += 1;
                            if i == keys.len() {
                                i = 0;
                            }
                            black_box(drive(&mut svc, k).is_ok());
                        }
                    })
                })
            });

            let limiter = RateLimiter::keyed(gov_hot_quota());
            g.bench_function(format!("governor_{name}_{threads}t"), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, |t| {
                        let limiter = &limiter;
                        let keys = thread_keys(shape, t);
                        let mut i = 0;
                        move || {
                            let k = &keys[i];
                            i += 1;
                            if i == keys.len() {
                                i = 0;
                            }
                            black_box(limiter.check_key(k).is_ok());
                        }
                    })
                })
            });
        }
    }
    g.finish();
}

// ---------------------------------------------------------------- 5: memory

/// Resident set size in bytes, from `/proc/self/statm` (4 KiB pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm resident field");
    pages * 4096
}

/// In a child process: insert `n` keys into one limiter, let them go idle,
/// evict them, and print the RSS at each step.
fn memory_probe(which: &str, n: u64) {
    let keys = distinct_keys(n, 1_000_000_000);
    let before;
    let inserted;
    let evicted;
    let live;
    let left;
    match which {
        "ours" => {
            let clock = ManualClock::new();
            let layer = RateLimitLayer::new(Quota::per_second(1).unwrap(), |k: &u64| Some(*k))
                .with_clock(clock.clone());
            let mut svc = layer.layer(u64_inner());
            before = rss_bytes();
            for &k in &keys {
                drive(&mut svc, k).expect("ours admits a fresh key");
            }
            inserted = rss_bytes();
            live = layer.key_count();
            clock.advance(Duration::from_secs(2));
            layer.evict_idle();
            left = layer.key_count();
            evicted = rss_bytes();
        }
        "governor" => {
            let clock = FakeRelativeClock::default();
            let limiter = RateLimiter::dashmap_with_clock(
                GQuota::per_second(NonZeroU32::new(1).unwrap()),
                clock.clone(),
            );
            before = rss_bytes();
            for k in &keys {
                limiter.check_key(k).expect("governor admits a fresh key");
            }
            inserted = rss_bytes();
            live = limiter.len();
            clock.advance(Duration::from_secs(2));
            limiter.retain_recent();
            limiter.shrink_to_fit();
            left = limiter.len();
            evicted = rss_bytes();
        }
        other => panic!("unknown probe {other}"),
    }
    println!("{which} {before} {inserted} {evicted} {live} {left}");
}

fn memory_report() {
    let exe = std::env::current_exe().expect("current exe");
    println!("memory per idle key (RSS from /proc/self/statm, one child process each):");
    for n in MEMORY_KEYS {
        for which in ["ours", "governor"] {
            let out = std::process::Command::new(&exe)
                .env(PROBE_ENV, which)
                .env(KEYS_ENV, n.to_string())
                .output()
                .expect("run memory probe");
            assert!(out.status.success(), "memory probe {which} failed: {out:?}");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with(which))
                .expect("probe output");
            let f: Vec<i64> = line
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            let (before, inserted, evicted, live, left) = (f[0], f[1], f[2], f[3], f[4]);
            let per_key = |after: i64| (after - before) as f64 / n as f64;
            println!(
                "memory/{which}/{n}: rss before {:.1} MiB, after insert {:.1} MiB ({live} keys, {:.1} B/key), \
                 after evict {:.1} MiB ({left} keys, {:.1} B/key still held)",
                before as f64 / 1048576.0,
                inserted as f64 / 1048576.0,
                per_key(inserted),
                evicted as f64 / 1048576.0,
                per_key(evicted),
            );
        }
    }
}

// ---------------------------------------------------------------- main

fn main() {
    if let Ok(which) = std::env::var("TT_LOOP") {
        loop_mode(&which);
        return;
    }
    if let Ok(which) = std::env::var(PROBE_ENV) {
        let n = std::env::var(KEYS_ENV)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(MEMORY_KEYS[0]);
        memory_probe(&which, n);
        return;
    }
    // Without `--bench` (e.g. under `cargo test`), criterion runs each
    // benchmark once as a test.
    let args: Vec<String> = std::env::args().collect();
    let quick =
        !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test" || a == "--list");
    if !quick && std::env::var_os("TT_SKIP_MEMORY").is_none() {
        memory_report();
    }
    println!(
        "limiters read {} by default",
        if cfg!(feature = "test-util") {
            "tokio's clock (feature test-util is on)"
        } else {
            "FastClock (the TSC counter)"
        }
    );
    let mut c = Criterion::default().configure_from_args();
    hot_key(&mut c);
    clocks(&mut c);
    many_keys(&mut c, quick);
    threads(&mut c);
    c.final_summary();
}
