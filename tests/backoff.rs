//! Backoff429Layer: cooldowns per route after upstream 429s, in paused time.

#![cfg(feature = "test-util")]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{Instant, advance, sleep};
use tokio_test::{assert_pending, assert_ready, task};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::backoff::{
    Backoff429, Backoff429Layer, DEFAULT_MAX_BACKOFF, ExponentialBackoff, Reason,
};
use tower_throttle::error::{BoxError, CoolingDown, MissingKey};
use tower_throttle::key::HeaderKey;

type Request = http::Request<String>;
type Response = http::Response<String>;

/// One scripted answer.
#[derive(Clone, Debug)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    delay: Option<Duration>,
}

fn reply(status: u16, headers: &[(&'static str, &str)]) -> Reply {
    Reply {
        status,
        headers: headers.iter().map(|&(n, v)| (n, v.to_owned())).collect(),
        delay: None,
    }
}

impl Reply {
    /// Answer only after `delay`.
    fn after(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// An upstream that answers each key from its script (200 when the script
/// is empty), optionally after a delay, and records every call.
#[derive(Clone, Default)]
struct Upstream {
    script: Arc<Mutex<HashMap<String, VecDeque<Reply>>>>,
    calls: Arc<Mutex<Vec<(String, usize, Instant)>>>,
    delay: Option<Duration>,
}

impl Upstream {
    fn new() -> Self {
        Self::default()
    }

    fn delayed(delay: Duration) -> Self {
        Self {
            delay: Some(delay),
            ..Self::default()
        }
    }

    fn script(&self, key: &str, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.script
            .lock()
            .entry(key.to_owned())
            .or_default()
            .extend(replies);
        self
    }

    /// `(key, seq, instant)` of every call so far.
    fn calls(&self) -> Vec<(String, usize, Instant)> {
        self.calls.lock().clone()
    }

    fn seqs(&self, key: &str) -> Vec<usize> {
        self.calls()
            .into_iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, seq, _)| seq)
            .collect()
    }
}

impl Service<Request> for Upstream {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let key = header("x-key");
        let seq = header("x-seq").parse().unwrap_or(usize::MAX);
        self.calls.lock().push((key.clone(), seq, Instant::now()));
        let reply = self
            .script
            .lock()
            .get_mut(&key)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| reply(200, &[]));
        let mut response = http::Response::builder().status(reply.status);
        for (name, value) in &reply.headers {
            response = response.header(*name, value);
        }
        let response = response
            .body(format!("reply to {key}#{seq}"))
            .expect("valid test response");
        let delay = reply.delay.or(self.delay);
        Box::pin(async move {
            if let Some(delay) = delay {
                sleep(delay).await;
            }
            Ok(response)
        })
    }
}

fn request(key: &str, seq: usize) -> Request {
    http::Request::builder()
        .header("x-key", key)
        .header("x-seq", seq.to_string())
        .body(String::new())
        .expect("valid test request")
}

fn layer() -> Backoff429Layer<HeaderKey> {
    // The test keys are plain names, not secrets: shown as they are.
    Backoff429Layer::new(
        HeaderKey::new("x-key")
            .expect("valid header name")
            .show_raw(),
    )
}

type Svc = Backoff429<Upstream, HeaderKey>;

fn service(layer: Backoff429Layer<HeaderKey>, upstream: &Upstream) -> Svc {
    ServiceBuilder::new().layer(layer).service(upstream.clone())
}

async fn send(svc: &mut Svc, key: &str, seq: usize) -> Result<Response, BoxError> {
    svc.ready().await?.call(request(key, seq)).await
}

/// The refusal a request got, or a panic saying what it got instead.
fn cooling(outcome: Result<Response, BoxError>) -> CoolingDown {
    match outcome {
        Ok(response) => panic!("expected a refusal, got {}", response.status()),
        Err(error) => match error.downcast::<CoolingDown>() {
            Ok(refusal) => *refusal,
            Err(other) => panic!("expected CoolingDown, got {other}"),
        },
    }
}

const SEC: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn the_429_response_is_returned_to_the_caller_unchanged() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [reply(
            429,
            &[
                ("retry-after", "1"),
                ("x-request-id", "req-7"),
                ("content-type", "text/plain"),
            ],
        )],
    );
    let mut svc = service(layer(), &upstream);
    let response = send(&mut svc, "a", 0).await.expect("the 429 is a response");
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.headers()["x-request-id"], "req-7");
    assert_eq!(response.headers()["content-type"], "text/plain");
    assert_eq!(response.headers().len(), 3);
    assert_eq!(response.body(), "reply to a#0");
}

#[tokio::test(start_paused = true)]
async fn requests_to_a_cooling_route_are_refused_before_the_inner_call_until_it_ends() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "3")])]);
    let mut svc = service(layer(), &upstream);
    send(&mut svc, "a", 0).await.expect("429 response");

    let refusal = cooling(send(&mut svc, "a", 1).await);
    assert_eq!(refusal.key, "a");
    assert_eq!(refusal.retry_after, 3 * SEC);
    sleep(Duration::from_millis(2_999)).await;
    assert_eq!(
        cooling(send(&mut svc, "a", 2).await).retry_after,
        Duration::from_millis(1)
    );
    assert_eq!(
        upstream.seqs("a"),
        [0],
        "refused requests never reach the upstream"
    );

    sleep(Duration::from_millis(1)).await;
    let response = send(&mut svc, "a", 3).await.expect("cooldown over");
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.seqs("a"), [0, 3]);
}

#[tokio::test(start_paused = true)]
async fn consecutive_429s_double_the_cooldown_up_to_max_backoff() {
    let upstream = Upstream::new();
    upstream.script("a", (0..6).map(|_| reply(429, &[])));
    let layer = layer().with_initial_backoff(SEC).with_max_backoff(4 * SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    let expected = [1, 2, 4, 4, 4, 4];
    for (i, &secs) in expected.iter().enumerate() {
        let response = send(&mut svc, "a", i).await.expect("429 response");
        assert_eq!(response.status(), 429);
        let entry = handle.cooldown(&["a"]).expect("cooling");
        assert_eq!(entry.remaining, secs * SEC, "after 429 #{}", i + 1);
        assert_eq!(
            entry.reason,
            Reason::Exponential {
                streak: i as u32 + 1
            }
        );
        assert_eq!(entry.status, 429);
        assert_eq!(
            cooling(send(&mut svc, "a", 100).await).retry_after,
            secs * SEC
        );
        sleep(secs * SEC).await;
    }
    assert_eq!(handle.stats().cooldowns_started, 6);
}

#[tokio::test(start_paused = true)]
async fn a_success_between_429s_resets_the_streak() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [
            reply(429, &[]),
            reply(429, &[]),
            reply(200, &[]),
            reply(429, &[]),
            reply(429, &[]),
        ],
    );
    let layer = layer().with_initial_backoff(SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    let mut cooldowns = Vec::new();
    for seq in 0..5 {
        let status = send(&mut svc, "a", seq).await.expect("response").status();
        let entry = handle.cooldown(&["a"]);
        cooldowns.push(entry.as_ref().map(|e| e.remaining.as_secs()));
        if status == 429 {
            sleep(entry.expect("cooling after a 429").remaining).await;
        }
    }
    assert_eq!(cooldowns, [Some(1), Some(2), None, Some(1), Some(2)]);
}

#[tokio::test(start_paused = true)]
async fn a_route_quiet_long_enough_forgets_its_streak() {
    let upstream = Upstream::new();
    upstream.script("a", (0..3).map(|_| reply(429, &[])));
    let layer = layer().with_initial_backoff(SEC).with_max_backoff(8 * SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    sleep(SEC).await;
    send(&mut svc, "a", 1).await.expect("429");
    assert_eq!(handle.cooldown(&["a"]).map(|e| e.remaining), Some(2 * SEC));
    // Quiet for max_backoff after the cooldown ended: a new streak.
    sleep(2 * SEC + 8 * SEC).await;
    send(&mut svc, "a", 2).await.expect("429");
    assert_eq!(handle.cooldown(&["a"]).map(|e| e.remaining), Some(SEC));
}

#[tokio::test(start_paused = true)]
async fn jitter_stays_within_its_ratio_over_ten_thousand_cooldowns() {
    const DRAWS: usize = 10_000;
    let upstream = Upstream::new();
    for i in 0..DRAWS {
        upstream.script(&format!("k{i}"), [reply(429, &[])]);
    }
    let layer = layer()
        .with_initial_backoff(4 * SEC)
        .with_jitter(0.25)
        .expect("valid ratio");
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    let (lo, hi) = (3 * SEC, 5 * SEC);
    let mut seen = Vec::with_capacity(DRAWS);
    for i in 0..DRAWS {
        let key = format!("k{i}");
        send(&mut svc, &key, i).await.expect("429");
        let d = handle.cooldown(&[&key]).expect("cooling").remaining;
        assert!(
            d >= lo && d <= hi,
            "draw {i}: {d:?} outside [{lo:?}, {hi:?}]"
        );
        seen.push(d);
    }
    seen.sort();
    // Spread over the whole range, on both sides of the base.
    assert!(
        seen[0] < Duration::from_millis(3_050),
        "lowest {:?}",
        seen[0]
    );
    assert!(
        seen[DRAWS - 1] > Duration::from_millis(4_950),
        "highest {:?}",
        seen[DRAWS - 1]
    );
    let below = seen.iter().filter(|&&d| d < 4 * SEC).count();
    assert!(
        (4_500..5_500).contains(&below),
        "{below} of {DRAWS} below the base"
    );
}

#[test]
fn exponential_jitter_draws_stay_within_the_ratio_at_every_streak() {
    let backoff = ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(3))
        .with_jitter(0.5)
        .expect("valid ratio");
    for streak in 1..=8u32 {
        let base = backoff.base(streak);
        let (lo, hi) = (base.mul_f64(0.5), base.mul_f64(1.5));
        let draws: Vec<Duration> = (0..10_000).map(|_| backoff.delay(streak)).collect();
        assert!(
            draws.iter().all(|d| *d >= lo && *d <= hi),
            "streak {streak}"
        );
        assert!(
            draws.iter().any(|d| *d < base.mul_f64(0.6)),
            "streak {streak}: no low draws"
        );
        assert!(
            draws.iter().any(|d| *d > base.mul_f64(1.4)),
            "streak {streak}: no high draws"
        );
    }
    assert_eq!(backoff.base(1), Duration::from_millis(100));
    assert_eq!(backoff.base(6), Duration::from_millis(3_000), "capped");
}

#[test]
fn a_jitter_ratio_outside_zero_to_one_is_a_config_error() {
    for bad in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
        let err = layer().with_jitter(bad).expect_err("invalid ratio");
        assert_eq!(err.field, "jitter");
    }
    assert!(layer().with_jitter(0.0).is_ok());
    assert!(layer().with_jitter(1.0).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_on_one_key_does_not_delay_another() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "10")])]);
    let mut svc = service(layer().with_max_wait(30 * SEC), &upstream);
    let start = Instant::now();
    send(&mut svc, "a", 0).await.expect("429");
    for seq in 1..=5 {
        let response = send(&mut svc, "b", seq).await.expect("b is not cooling");
        assert_eq!(response.status(), 200);
    }
    let calls = upstream.calls();
    assert_eq!(upstream.seqs("b"), [1, 2, 3, 4, 5]);
    assert!(
        calls.iter().all(|&(_, _, at)| at == start),
        "key b waited: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn waiters_are_released_in_arrival_order_when_the_cooldown_ends() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let mut svc = service(layer().with_max_wait(10 * SEC), &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let cooled_at = Instant::now();
    let mut waiters = Vec::new();
    for seq in 1..=50 {
        // Interleave another key: it must go straight through.
        let fut = svc.ready().await.expect("ready").call(request("a", seq));
        waiters.push(tokio::spawn(fut));
        send(&mut svc, "b", seq).await.expect("b passes");
    }
    sleep(Duration::from_millis(4_999)).await;
    assert_eq!(
        upstream.seqs("a"),
        [0],
        "released before the cooldown ended"
    );
    for waiter in waiters {
        let response = waiter.await.expect("task").expect("released");
        assert_eq!(response.status(), 200);
    }
    assert_eq!(upstream.seqs("a"), (0..=50).collect::<Vec<_>>());
    for (key, seq, at) in upstream.calls() {
        if key == "a" && seq > 0 {
            assert_eq!(
                at - cooled_at,
                5 * SEC,
                "waiter {seq} went at the wrong instant"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_passes_its_turn_to_the_next() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let mut svc = service(layer().with_max_wait(10 * SEC), &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let mut waiters: Vec<_> = (1..=4)
        .map(|seq| task::spawn(svc.call(request("a", seq))))
        .collect();
    for waiter in &mut waiters {
        assert_pending!(waiter.poll());
    }
    // Drop the head and one in the middle.
    let mut rest = waiters.split_off(1);
    drop(waiters);
    drop(rest.remove(1)); // seq 3
    advance(5 * SEC).await;
    // Only the new head was timed; it wakes the next when it goes.
    assert!(rest[0].is_woken());
    assert!(
        !rest[1].is_woken(),
        "waiter 4 must not poll before its turn"
    );
    assert_ready!(rest[0].poll()).expect("seq 2 released");
    assert!(rest[1].is_woken(), "releasing seq 2 wakes seq 4");
    assert_ready!(rest[1].poll()).expect("seq 4 released");
    assert_eq!(upstream.seqs("a"), [0, 2, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_from_the_middle_of_the_queue_leaves_nothing_behind() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let layer = layer().with_max_wait(10 * SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let mut waiters: Vec<_> = (1..=4)
        .map(|seq| task::spawn(svc.call(request("a", seq))))
        .collect();
    for waiter in &mut waiters {
        assert_pending!(waiter.poll());
    }
    drop(waiters.remove(2)); // seq 3, neither head nor tail
    assert!(
        waiters.iter().all(|w| !w.is_woken()),
        "leaving from the middle wakes nobody"
    );
    advance(5 * SEC).await;
    assert!(waiters[0].is_woken(), "the head's timer ends its wait");
    assert!(
        !waiters[1].is_woken(),
        "seq 2 must not poll before its turn"
    );
    for waiter in &mut waiters {
        assert!(waiter.is_woken(), "the one before wakes the next");
        assert_ready!(waiter.poll()).expect("released");
    }
    assert_eq!(upstream.seqs("a"), [0, 1, 2, 4]);
    // Every place left the queue: once the streak is forgotten the route
    // is idle, and goes.
    sleep(DEFAULT_MAX_BACKOFF).await;
    assert_eq!(handle.evict_idle(), 1, "a place was left in the queue");
    assert_eq!(handle.key_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_new_429_while_the_queue_drains_holds_the_rest_of_it() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [
            reply(429, &[("retry-after", "2")]),
            reply(429, &[("retry-after", "3")]),
        ],
    );
    let mut svc = service(layer().with_max_wait(10 * SEC), &upstream);
    let start = Instant::now();
    send(&mut svc, "a", 0).await.expect("429");
    let waiters: Vec<_> = (1..=3)
        .map(|seq| tokio::spawn(svc.call(request("a", seq))))
        .collect();
    let mut statuses = Vec::new();
    for waiter in waiters {
        statuses.push(
            waiter
                .await
                .expect("task")
                .expect("released")
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [429, 200, 200]);
    let at: Vec<_> = upstream
        .calls()
        .into_iter()
        .map(|(_, seq, at)| (seq, (at - start).as_secs()))
        .collect();
    assert_eq!(at, [(0, 0), (1, 2), (2, 5), (3, 5)]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_cooldown_grows_past_its_max_wait_is_refused_at_once() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [
            reply(429, &[("retry-after", "2")]),
            reply(429, &[("retry-after", "5")]),
        ],
    );
    let mut svc = service(layer().with_max_wait(3 * SEC), &upstream);
    let start = Instant::now();
    send(&mut svc, "a", 0).await.expect("429");
    let first = tokio::spawn(svc.call(request("a", 1)));
    let second = tokio::spawn(svc.call(request("a", 2)));
    assert_eq!(first.await.expect("task").expect("released").status(), 429);
    let refusal = cooling(second.await.expect("task"));
    assert_eq!(refusal.retry_after, 5 * SEC);
    assert_eq!(
        Instant::now() - start,
        2 * SEC,
        "refused when the cooldown grew, not later"
    );
    assert_eq!(upstream.seqs("a"), [0, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_longer_than_max_wait_is_refused_on_arrival() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let mut svc = service(layer().with_max_wait(2 * SEC), &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let mut fut = task::spawn(svc.call(request("a", 1)));
    let refusal = cooling(assert_ready!(fut.poll()));
    assert_eq!(refusal.retry_after, 5 * SEC);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_exactly_as_long_as_max_wait_is_waited_out() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let mut svc = service(layer().with_max_wait(5 * SEC), &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let start = Instant::now();
    let response = send(&mut svc, "a", 1).await.expect("waited, not refused");
    assert_eq!(response.status(), 200);
    assert_eq!(start.elapsed(), 5 * SEC);
}

#[tokio::test(start_paused = true)]
async fn reset_stats_zeroes_the_counters_and_keeps_the_cooldowns() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let layer = layer();
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    cooling(send(&mut svc, "a", 1).await);
    let before = handle.stats();
    assert_eq!(
        (
            before.requests.aggregate.admitted,
            before.requests.aggregate.rejected,
            before.cooldowns_started
        ),
        (1, 1, 1)
    );
    handle.reset_stats();
    let after = handle.stats();
    assert_eq!(
        (
            after.requests.aggregate.admitted,
            after.requests.aggregate.rejected,
            after.cooldowns_started
        ),
        (0, 0, 0)
    );
    assert_eq!(after.cooldowns.len(), 1, "the cooldown itself stays");
    assert_eq!(cooling(send(&mut svc, "a", 2).await).retry_after, 5 * SEC);
}

#[tokio::test(start_paused = true)]
async fn a_cooldown_longer_than_max_wait_is_refused_on_arrival_even_behind_waiters() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [
            reply(429, &[("retry-after", "20")]).after(2 * SEC),
            reply(429, &[("retry-after", "5")]),
        ],
    );
    let mut svc = service(layer().with_max_wait(6 * SEC), &upstream);
    // In flight for 2 s, sent before any cooldown.
    let slow = tokio::spawn(svc.ready().await.expect("ready").call(request("a", 0)));
    send(&mut svc, "a", 1).await.expect("429: cools for 5 s");
    let mut ahead = task::spawn(svc.ready().await.expect("ready").call(request("a", 2)));
    assert_pending!(ahead.poll());
    // Its 429 comes late, but its header still counts: cooling until 22 s.
    assert_eq!(slow.await.expect("task").expect("429").status(), 429);
    let mut late = task::spawn(svc.ready().await.expect("ready").call(request("a", 3)));
    let refusal = cooling(assert_ready!(late.poll()));
    assert_eq!(
        refusal.retry_after,
        20 * SEC,
        "refused on arrival, not queued behind"
    );
    // The waiter ahead learns of it when its own sleep ends, and is refused then.
    advance(3 * SEC).await;
    assert!(ahead.is_woken());
    assert_eq!(cooling(assert_ready!(ahead.poll())).retry_after, 17 * SEC);
    assert_eq!(upstream.seqs("a"), [0, 1]);
}

/// Sets its flag when woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The upstream, and at each call whether `flag` was set.
#[derive(Clone)]
struct Probed {
    inner: Upstream,
    flag: Arc<Flag>,
    seen: Arc<Mutex<Vec<bool>>>,
}

impl Service<Request> for Probed {
    type Response = Response;
    type Error = Infallible;
    type Future = <Upstream as Service<Request>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        self.seen.lock().push(self.flag.0.load(Ordering::SeqCst));
        self.inner.call(req)
    }
}

#[tokio::test(start_paused = true)]
async fn the_next_waiter_is_woken_only_once_the_head_has_reached_the_inner_service() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "5")])]);
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let probed = Probed {
        inner: upstream.clone(),
        flag: flag.clone(),
        seen: Arc::default(),
    };
    let mut svc = ServiceBuilder::new()
        .layer(layer().with_max_wait(10 * SEC))
        .service(probed.clone());
    svc.ready()
        .await
        .expect("ready")
        .call(request("a", 0))
        .await
        .expect("429");
    let mut head = task::spawn(svc.ready().await.expect("ready").call(request("a", 1)));
    let mut next = Box::pin(svc.ready().await.expect("ready").call(request("a", 2)));
    assert_pending!(head.poll());
    let waker = Waker::from(flag.clone());
    assert!(
        next.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    advance(5 * SEC).await;
    assert_ready!(head.poll()).expect("released");
    assert!(
        flag.0.load(Ordering::SeqCst),
        "the head's release wakes the next waiter"
    );
    // Woken any earlier, the next waiter could reach the inner service
    // first on a multi-threaded runtime.
    assert_eq!(*probed.seen.lock(), [false, false]);
}

#[tokio::test(start_paused = true)]
async fn a_hostile_retry_after_cools_the_route_for_max_cooldown_not_longer() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after", "999999999")])]);
    let layer = layer().with_max_cooldown(30 * SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let entry = handle.cooldown(&["a"]).expect("cooling");
    assert_eq!(entry.remaining, 30 * SEC);
    assert_eq!(entry.reason, Reason::RetryAfter);
    assert_eq!(cooling(send(&mut svc, "a", 1).await).retry_after, 30 * SEC);
    sleep(30 * SEC).await;
    assert_eq!(
        send(&mut svc, "a", 2).await.expect("open again").status(),
        200
    );
}

#[tokio::test(start_paused = true)]
async fn the_exponential_rule_is_capped_by_max_cooldown_too() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[])]);
    let layer = layer()
        .with_initial_backoff(120 * SEC)
        .with_max_backoff(600 * SEC)
        .with_max_cooldown(10 * SEC)
        .with_jitter(1.0)
        .expect("valid ratio");
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    let entry = handle.cooldown(&["a"]).expect("cooling");
    assert!(entry.remaining <= 10 * SEC, "{:?}", entry.remaining);
}

#[tokio::test(start_paused = true)]
async fn refusals_of_requests_already_in_flight_count_once_in_the_streak() {
    let upstream = Upstream::delayed(Duration::from_millis(100));
    upstream.script("a", (0..3).map(|_| reply(429, &[])));
    let layer = layer().with_initial_backoff(SEC);
    let handle = layer.handle();
    let svc = service(layer, &upstream);
    let in_flight: Vec<_> = (0..3)
        .map(|seq| tokio::spawn(svc.clone().oneshot(request("a", seq))))
        .collect();
    for request in in_flight {
        assert_eq!(request.await.expect("task").expect("429").status(), 429);
    }
    let entry = handle.cooldown(&["a"]).expect("cooling");
    assert_eq!(entry.reason, Reason::Exponential { streak: 1 });
    assert_eq!(entry.remaining, SEC);
    assert_eq!(handle.stats().cooldowns_started, 1);
}

#[tokio::test(start_paused = true)]
async fn a_success_saying_the_route_is_exhausted_starts_the_cooldown_when_proactive() {
    for proactive in [false, true] {
        let upstream = Upstream::new();
        let exhausted = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "3s"),
        ];
        // A 429 first, so that the success also has a streak to end.
        upstream.script("a", [reply(429, &[]), reply(200, &exhausted)]);
        let layer = layer().with_proactive(proactive);
        let handle = layer.handle();
        let mut svc = service(layer, &upstream);
        send(&mut svc, "a", 0).await.expect("429");
        sleep(SEC).await;
        assert_eq!(send(&mut svc, "a", 1).await.expect("200").status(), 200);
        let next = send(&mut svc, "a", 2).await;
        if proactive {
            assert_eq!(cooling(next).retry_after, 3 * SEC);
            let entry = handle.cooldown(&["a"]).expect("cooling");
            assert_eq!((entry.reason, entry.status), (Reason::ResetDuration, 200));
        } else {
            assert_eq!(next.expect("not proactive").status(), 200);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn proactive_reading_can_be_switched_on_and_off_live() {
    let upstream = Upstream::new();
    let exhausted = [
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "3s"),
    ];
    upstream.script("a", [reply(200, &exhausted), reply(200, &exhausted)]);
    let layer = layer();
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    handle.set_proactive(true);
    assert_eq!(send(&mut svc, "a", 0).await.expect("200").status(), 200);
    assert_eq!(cooling(send(&mut svc, "a", 1).await).retry_after, 3 * SEC);
    sleep(3 * SEC).await;
    handle.set_proactive(false);
    assert_eq!(send(&mut svc, "a", 2).await.expect("200").status(), 200);
    let next = send(&mut svc, "a", 3).await;
    assert_eq!(next.expect("no longer proactive").status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_handle_shows_its_settings_and_counters_but_no_key() {
    let upstream = Upstream::new();
    upstream.script("secret-route", [reply(429, &[])]);
    let layer = Backoff429Layer::new(HeaderKey::new("x-key").expect("valid header name"));
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "secret-route", 0).await.expect("429");
    let shown = format!("{handle:?}");
    for part in [
        "BackoffHandle",
        "Cooldowns",
        "max_cooldown",
        "enabled: true",
        "started: 1",
    ] {
        assert!(shown.contains(part), "{part:?} missing from {shown}");
    }
    assert!(!shown.contains("secret-route"), "the key leaked: {shown}");
}

#[tokio::test(start_paused = true)]
async fn a_503_with_retry_after_cools_the_route_only_when_enabled() {
    for on_503 in [false, true] {
        let upstream = Upstream::new();
        upstream.script("a", [reply(503, &[("retry-after", "4")])]);
        upstream.script("b", [reply(503, &[])]);
        let mut svc = service(layer().with_on_503(on_503), &upstream);
        send(&mut svc, "a", 0).await.expect("503");
        send(&mut svc, "b", 0).await.expect("503");
        let next = send(&mut svc, "a", 1).await;
        if on_503 {
            assert_eq!(cooling(next).retry_after, 4 * SEC);
        } else {
            assert_eq!(next.expect("503 ignored").status(), 200);
        }
        let b = send(&mut svc, "b", 1).await;
        assert_eq!(
            b.expect("a 503 without retry-after never cools").status(),
            200
        );
    }
}

#[tokio::test(start_paused = true)]
async fn stats_count_requests_and_list_each_cooldown_with_its_reason() {
    let upstream = Upstream::new();
    upstream.script("a", [reply(429, &[("retry-after-ms", "2500")])]);
    upstream.script("b", [reply(429, &[])]);
    let layer = layer().with_max_wait(3 * SEC).with_key_stats(10);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    send(&mut svc, "a", 0).await.expect("429");
    send(&mut svc, "b", 0).await.expect("429");
    let waiter = tokio::spawn(svc.call(request("a", 1)));
    tokio::task::yield_now().await;

    let stats = handle.stats();
    assert_eq!(stats.cooldowns_started, 2);
    let listed: Vec<_> = stats
        .cooldowns
        .iter()
        .map(|e| (e.key.as_str(), e.remaining, e.reason))
        .collect();
    assert_eq!(
        listed,
        [
            ("a", Duration::from_millis(2_500), Reason::RetryAfterMs),
            ("b", SEC, Reason::Exponential { streak: 1 }),
        ]
    );
    assert_eq!(stats.requests.aggregate.queued_now, 1);
    assert!(waiter.await.expect("task").is_ok());
    let stats = handle.stats();
    assert_eq!(stats.requests.aggregate.admitted, 3);
    assert_eq!(stats.requests.aggregate.waited, 1);
    assert_eq!(stats.requests.aggregate.total_wait_ms, 2_500.0);
    assert_eq!(stats.cooldowns.len(), 0, "both cooldowns are over");
    let json = serde_json::to_value(handle.stats()).expect("serializes");
    assert_eq!(json["cooldowns_started"], 2);
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_is_woken_when_a_cooldown_starts() {
    let upstream = Upstream::delayed(Duration::from_millis(100));
    upstream.script("a", [reply(429, &[("retry-after", "7")])]);
    let layer = layer();
    let mut subscription = layer.handle().subscribe();
    let svc = service(layer, &upstream);
    let call = tokio::spawn(svc.oneshot(request("a", 0)));
    // The admission moves the counters first.
    let first = subscription.changed().await;
    assert_eq!(first.requests.aggregate.admitted, 1);
    assert!(first.cooldowns.is_empty());
    // Then the 429 arrives and starts the cooldown: a change of its own.
    let second = tokio::time::timeout(SEC, subscription.changed())
        .await
        .expect("woken by the cooldown");
    assert_eq!(second.cooldowns.len(), 1);
    assert_eq!(second.cooldowns[0].reason, Reason::RetryAfter);
    call.await.expect("task").expect("429");
}

#[tokio::test(start_paused = true)]
async fn idle_routes_are_evicted_once_cooldown_and_streak_are_over() {
    let upstream = Upstream::new();
    for i in 0..1_000 {
        upstream.script(&format!("k{i}"), [reply(429, &[])]);
    }
    let layer = layer().with_initial_backoff(SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    for i in 0..1_000 {
        send(&mut svc, &format!("k{i}"), i).await.expect("429");
    }
    assert_eq!(handle.key_count(), 1_000);
    assert_eq!(handle.cooldowns().len(), 1_000);
    sleep(SEC).await;
    assert_eq!(handle.evict_idle(), 0, "streaks are still remembered");
    sleep(DEFAULT_MAX_BACKOFF).await;
    assert_eq!(handle.evict_idle(), 1_000);
    assert_eq!(handle.key_count(), 0);
    assert!(handle.cooldowns().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_key_is_refused_unless_a_fallback_key_is_set() {
    let upstream = Upstream::new();
    let keyless = || http::Request::new(String::new());
    let mut svc = service(layer(), &upstream);
    let err = svc
        .ready()
        .await
        .expect("ready")
        .call(keyless())
        .await
        .expect_err("no key");
    assert!(err.downcast_ref::<MissingKey>().is_some(), "{err}");

    upstream.script("", [reply(429, &[("retry-after", "2")])]);
    let layer = layer().with_fallback_key("anonymous");
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    svc.ready()
        .await
        .expect("ready")
        .call(keyless())
        .await
        .expect("429");
    let err = svc
        .ready()
        .await
        .expect("ready")
        .call(keyless())
        .await
        .expect_err("cooling");
    assert_eq!(
        err.downcast_ref::<CoolingDown>().map(|e| e.key.as_str()),
        Some("anonymous")
    );
    assert!(handle.cooldown(&["anonymous"]).is_some());
}

/// A success to a request sent before the streak began says nothing about
/// the streak, even when the 429 that began it advised no wait (and so
/// started no cooldown). (Found by mutation testing: the streak could be
/// taken as open for every request.)
#[tokio::test(start_paused = true)]
async fn a_success_to_a_request_sent_before_the_streak_leaves_the_streak() {
    let upstream = Upstream::new();
    upstream.script(
        "a",
        [
            reply(200, &[]).after(5 * SEC),
            reply(429, &[("retry-after", "0")]),
            reply(429, &[]),
        ],
    );
    let layer = layer().with_initial_backoff(SEC);
    let handle = layer.handle();
    let mut svc = service(layer, &upstream);
    // Sent with no streak; answered 200 only after the 429 below.
    let mut early = task::spawn(svc.clone().oneshot(request("a", 0)));
    assert_pending!(early.poll());
    assert_eq!(send(&mut svc, "a", 1).await.expect("429").status(), 429);
    assert!(
        handle.cooldown(&["a"]).is_none(),
        "a wait of zero cools nothing"
    );
    sleep(5 * SEC).await;
    assert_eq!(assert_ready!(early.poll()).expect("200").status(), 200);
    // The streak goes on: this 429 is its second.
    assert_eq!(send(&mut svc, "a", 2).await.expect("429").status(), 429);
    let entry = handle.cooldown(&["a"]).expect("cooling");
    assert_eq!(entry.reason, Reason::Exponential { streak: 2 });
}
