//! A limiter in Redis decides as the same limiter in process, over
//! generated histories, to the microsecond of `retry_after`:
//!
//! - a sliding window, with bursts that expire together (more than a call
//!   removes at once, so expired bookings outlive the call that counted
//!   them out), costs of one (which Redis counts by itself) and of several
//!   (which are read);
//! - a token bucket and a window counting requests, each through both
//!   admission scripts: the short one for a lone quota, and the whole one;
//! - a sliding window counter through both scripts, its windows lined up
//!   alike on both sides (the in-process clock told the wall-clock time
//!   the Redis clock starts at).

#![cfg(feature = "redis")]

use testkit::redis as redis_server;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use redis_server::RedisServer;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::error::RateLimited;
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{CountAll, Quota, RateLimitLayer, Unit};
use tower_throttle::redis::{OnError, RedisStore};
use tower_throttle::respond::RateLimitHeaders;

type Svc = tower::util::BoxService<http::Request<()>, http::Response<()>, BoxError>;

const WINDOW: Duration = Duration::from_secs(10);

/// One step of a history.
#[derive(Clone, Debug)]
enum Step {
    /// `n` requests of `cost` each, at the same instant.
    Burst { n: u32, cost: u32 },
    /// The clock moves on, in whole milliseconds.
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1..160u32, prop_oneof![6 => Just(1u32), 1 => 2..5u32, 1 => 60..150u32])
            .prop_map(|(n, cost)| Step::Burst { n, cost }),
        2 => prop_oneof![0..2_000u64, 9_000..12_000u64, Just(10_000u64)].prop_map(Step::Wait),
    ]
}

fn cost_of(req: &http::Request<()>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

type CostFn = fn(&http::Request<()>) -> u32;

/// With the IETF fields on every response: what remains is decided (and
/// written) by the scripts too.
fn layer(quota: Quota) -> RateLimitLayer<GlobalKey, CostFn, CountAll, RateLimitHeaders> {
    RateLimitLayer::new(quota, GlobalKey)
        .with_cost(cost_of as CostFn)
        .with_response_headers(RateLimitHeaders::ietf())
}

fn service<L>(layer: L) -> Svc
where
    L: Layer<tower::util::ServiceFn<fn(http::Request<()>) -> Ready>>,
    L::Service: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>
        + Send
        + 'static,
    <L::Service as Service<http::Request<()>>>::Future: Send + 'static,
{
    tower::util::BoxService::new(layer.layer(tower::service_fn(answer as fn(_) -> Ready)))
}

type Ready = std::future::Ready<Result<http::Response<()>, Infallible>>;

fn answer(_req: http::Request<()>) -> Ready {
    std::future::ready(Ok(http::Response::new(())))
}

/// Admitted with its `RateLimit` field (what remains), or refused with
/// its `retry_after` rounded up to the microsecond: Redis keeps time in
/// microseconds, and an instant a sliding window counter works out in
/// nanoseconds in process is the same rounded up.
async fn outcome(svc: &mut Svc, cost: u32) -> Result<Option<http::HeaderValue>, Duration> {
    let req = http::Request::builder()
        .header("x-cost", cost.to_string())
        .body(())
        .expect("valid request");
    match svc.ready().await.expect("ready").call(req).await {
        Ok(response) => Ok(response.headers().get("ratelimit").cloned()),
        Err(e) => {
            let wait = e
                .downcast_ref::<RateLimited>()
                .unwrap_or_else(|| panic!("not a refusal: {e}"))
                .retry_after;
            Err(Duration::from_micros(wait.as_nanos().div_ceil(1_000) as u64))
        }
    }
}

/// A store on `server` under `prefix`, on the test clock `micros`.
fn store(server: &RedisServer, prefix: &str, micros: &Arc<AtomicU64>) -> RedisStore {
    RedisStore::new(&server.url())
        .expect("valid URL")
        .with_prefix(prefix)
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(5))
        .with_on_error(OnError::Closed)
        .with_test_clock(micros.clone())
}

/// Run `history` on `quota` in process and in Redis (under `prefix`, on
/// `server`) side by side, and with `both_scripts` through the whole
/// admission script too; every outcome must agree.
async fn agree_on(
    server: &RedisServer,
    prefix: &str,
    quota: Quota,
    history: &[Step],
    both_scripts: bool,
) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let micros = Arc::new(AtomicU64::new(now / 1_000 * 1_000));
    // Both sides see the same wall clock, so aligned windows agree.
    let manual =
        ManualClock::new().with_unix_time(Duration::from_micros(micros.load(Ordering::SeqCst)));
    let mut local = service(layer(quota).with_clock(manual.clone()));
    let mut remotes = vec![service(
        layer(quota)
            .with_store(store(server, prefix, &micros))
            .expect("a quota Redis keeps"),
    )];
    if both_scripts {
        let whole = store(server, &format!("whole-{prefix}"), &micros).with_whole_admit_script();
        remotes.push(service(
            layer(quota).with_store(whole).expect("a quota Redis keeps"),
        ));
    }
    for (i, step) in history.iter().enumerate() {
        match *step {
            Step::Burst { n, cost } => {
                for j in 0..n {
                    let here = outcome(&mut local, cost).await;
                    for (r, remote) in remotes.iter_mut().enumerate() {
                        let there = outcome(remote, cost).await;
                        assert_eq!(
                            here, there,
                            "script {r}, step {i} ({step:?}), request {j}: {history:?}"
                        );
                    }
                }
            }
            Step::Wait(ms) => {
                manual.advance(Duration::from_millis(ms));
                micros.fetch_add(ms * 1_000, Ordering::SeqCst);
            }
        }
    }
}

async fn agree(server: &RedisServer, prefix: &str, quota: Quota, history: &[Step]) {
    agree_on(server, prefix, quota, history, false).await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("TT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_sliding_window_in_redis_decides_as_in_process(
        history in prop::collection::vec(step(), 1..14),
    ) {
        let Some(server) = RedisServer::start("a_sliding_window_in_redis_decides_as_in_process") else {
            return Ok(());
        };
        redis_server::runtime().block_on(async {
            let window = |limit| Quota::new(limit, WINDOW).expect("valid").sliding_window();
            // Counting requests: every booking is one, counted by Redis.
            // Through the short script for a lone window and the whole one.
            let requests = window(300).with_unit(Unit::Requests);
            agree_on(&server, "requests:", requests, &history, true).await;
            // Counting cost: bookings of several units, read one by one
            // (and of one, while every cost is one).
            agree(&server, "cost:", window(RedisStore::MOST_SLIDING_COST), &history).await;
        });
    }

    #[test]
    fn a_sliding_window_counter_in_redis_decides_as_in_process(
        history in prop::collection::vec(step(), 1..14),
    ) {
        let Some(server) = RedisServer::start("a_sliding_window_counter_in_redis_decides_as_in_process") else {
            return Ok(());
        };
        redis_server::runtime().block_on(async {
            let counter = |limit| Quota::new(limit, WINDOW).expect("valid").sliding_window_counter();
            // Through the short script for a lone counter and the whole one.
            agree_on(&server, "counter:", counter(300), &history, true).await;
            let requests = counter(200).with_unit(Unit::Requests);
            agree_on(&server, "counter-requests:", requests, &history, true).await;
        });
    }

    #[test]
    fn a_token_bucket_in_redis_decides_as_in_process_through_either_script(
        history in prop::collection::vec(step(), 1..14),
    ) {
        let Some(server) = RedisServer::start("a_token_bucket_in_redis_decides_as_in_process") else {
            return Ok(());
        };
        redis_server::runtime().block_on(async {
            // A unit every 100 ms (whole microseconds: in Redis a finer
            // interval is rounded up to one).
            let bucket = Quota::new(160, Duration::from_secs(16)).expect("valid");
            agree_on(&server, "bucket:", bucket, &history, true).await;
            let requests = Quota::new(320, Duration::from_secs(16))
                .expect("valid")
                .with_unit(Unit::Requests);
            agree_on(&server, "bucket-requests:", requests, &history, true).await;
        });
    }
}

/// A counter whose limit times its window passes 2^53 (in microseconds):
/// both scripts' long division agrees with in process, to the
/// microsecond.
#[tokio::test]
async fn a_counter_past_two_to_the_53_decides_as_in_process() {
    let Some(server) = RedisServer::start("a_counter_past_two_to_the_53") else {
        return;
    };
    let days = |n: u64| Duration::from_secs(n * 86_400);
    let counter = Quota::new(4_000_000_000, days(300))
        .expect("valid")
        .sliding_window_counter();
    let day_ms = 86_400_000;
    let history = [
        Step::Burst {
            n: 1,
            cost: 3_999_999_999,
        },
        Step::Wait(299 * day_ms),
        Step::Burst { n: 2, cost: 1 },
        Step::Wait(2 * day_ms),
        // The previous window weighs about 299/300 of its 4e9: refused,
        // and the instant it fits is past 2^53 to work out.
        Step::Burst {
            n: 2,
            cost: 900_000_000,
        },
        Step::Wait(150 * day_ms + 12_345),
        Step::Burst {
            n: 3,
            cost: 1_500_000_000,
        },
    ];
    agree_on(&server, "huge:", counter, &history, true).await;
}

/// Most of a window of ones expires at once, and a call leaves most of
/// the expired bookings for later calls to remove: a costly request right
/// after is judged on the live ones only, as in process.
#[tokio::test]
async fn expired_bookings_a_call_left_in_place_are_not_counted() {
    let Some(server) = RedisServer::start("expired_bookings_a_call_left_in_place") else {
        return;
    };
    let most = RedisStore::MOST_SLIDING_COST;
    let history = [
        Step::Burst { n: 100, cost: 1 },
        Step::Wait(5_000),
        Step::Burst {
            n: most - 100,
            cost: 1,
        },
        Step::Wait(5_000),
        // 100 expired, 64 of them removed: 50 live and 36 left in place.
        Step::Burst {
            n: 1,
            cost: most - 30,
        },
        Step::Burst { n: 2, cost: 20 },
        Step::Wait(5_000),
        Step::Burst { n: 2, cost: 20 },
    ];
    let window = Quota::new(most, WINDOW).expect("valid").sliding_window();
    agree(&server, "left:", window, &history).await;
}
