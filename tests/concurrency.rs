//! ConcurrencyLayer: per-key FIFO permits, queue limit and timeout, and the
//! permit held for the life of a streamed body.

#![cfg(feature = "test-util")]

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use support::Lcg;
use testkit::windows::most_in_any_window;
use tokio::time::{self, Instant, Sleep};
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_throttle::BoxError;
use tower_throttle::concurrency::{ConcurrencyBody, ConcurrencyLayer};
use tower_throttle::error::{QueueFull, QueueTimeout};
use tower_throttle::key::{GlobalKey, HeaderKey, KeyExtractor, key_text};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

const SECOND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------- helpers

/// Requests inside the inner service now, and the most there ever were. A
/// request is inside from its call until its response body ends or is
/// dropped (or its response future is dropped first).
#[derive(Clone, Debug, Default)]
struct Flight {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Flight {
    fn enter(&self) -> FlightGuard {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        FlightGuard(self.now.clone())
    }

    fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct FlightGuard(Arc<AtomicUsize>);

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A streamed body: `frames` data frames, `gap` apart; it leaves the flight
/// when it ends or is dropped.
#[derive(Debug)]
struct Stream {
    frames: usize,
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    guard: Option<FlightGuard>,
}

impl Body for Stream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.frames == 0 {
            self.guard.take();
            return Poll::Ready(None);
        }
        if !self.gap.is_zero() {
            let gap = self.gap;
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(time::sleep(gap)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"data: x\n\n")))))
    }
}

/// A number from a request header, or 0.
fn header_num(req: &http::Request<()>, name: &str) -> u64 {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The inner service: answers after `x-delay-ms`, with a body of
/// `x-frames` frames `x-gap-ms` apart; records the `x-seq` and instant of
/// each call and the requests in flight inside it.
#[derive(Clone, Debug, Default)]
struct Upstream {
    flight: Flight,
    seen: Arc<Mutex<Vec<(u64, Instant)>>>,
    fail: bool,
}

impl Upstream {
    fn order(&self) -> Vec<u64> {
        self.seen.lock().iter().map(|&(seq, _)| seq).collect()
    }

    fn instants(&self) -> Vec<Instant> {
        self.seen.lock().iter().map(|&(_, at)| at).collect()
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Stream>, BoxError>> + Send>>;

impl Service<http::Request<()>> for Upstream {
    type Response = http::Response<Stream>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<()>) -> Answer {
        let guard = self.flight.enter();
        self.seen
            .lock()
            .push((header_num(&req, "x-seq"), Instant::now()));
        let delay = Duration::from_millis(header_num(&req, "x-delay-ms"));
        let frames = header_num(&req, "x-frames") as usize;
        let gap = Duration::from_millis(header_num(&req, "x-gap-ms"));
        let fail = self.fail;
        Box::pin(async move {
            if !delay.is_zero() {
                time::sleep(delay).await;
            }
            if fail {
                return Err("upstream failed".into());
            }
            Ok(http::Response::new(Stream {
                frames,
                gap,
                sleep: None,
                guard: Some(guard),
            }))
        })
    }
}

/// A request on `key`, numbered `seq`, with extra numeric headers.
fn request(key: &str, seq: u64, extra: &[(&str, u64)]) -> http::Request<()> {
    let mut builder = http::Request::builder()
        .header("x-key", key)
        .header("x-seq", seq.to_string());
    for (name, value) in extra {
        builder = builder.header(*name, value.to_string());
    }
    builder.body(()).expect("valid test request")
}

fn by_key() -> HeaderKey {
    // The test keys are plain names, not secrets: shown as they are.
    HeaderKey::new("x-key")
        .expect("valid header name")
        .show_raw()
}

/// A key extractor the tests on one key run with.
trait OneKey: KeyExtractor<http::Request<()>> + Clone {
    /// Key states an idle layer keeps in its store: the single key of
    /// `GlobalKey` is not kept there.
    const STORED: usize;
}

impl OneKey for GlobalKey {
    const STORED: usize = 0;
}

impl OneKey for HeaderKey {
    const STORED: usize = 1;
}

/// The text errors give for the key of `request("a", ..)` under `key`.
fn text_of<X: OneKey>(key: &X) -> String {
    key_text(key, &request("a", 0, &[])).expect("the test request has a key")
}

/// A test on one key, run twice: keyed by `GlobalKey` (the layer's
/// single-key path: no key read, hashed or looked up) and by a header (a
/// lookup per request). `$body` is an `async fn` taking the extractor.
macro_rules! on_one_key {
    ($(#[$attr:meta])* $name:ident => $body:ident) => {
        mod $name {
            use super::*;

            $(#[$attr])*
            async fn global_key() {
                $body(GlobalKey).await
            }

            $(#[$attr])*
            async fn header_key() {
                $body(by_key()).await
            }
        }
    };
}

/// Read a body to its end.
async fn drain<B: Body + Unpin>(mut body: B) -> Result<usize, B::Error> {
    let mut frames = 0;
    while let Some(frame) = body.frame().await {
        frame?;
        frames += 1;
    }
    Ok(frames)
}

// ---------------------------------------------------------------- the list

#[tokio::test(start_paused = true)]
async fn third_request_waits_for_the_first_body_to_be_dropped_not_its_headers() {
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(2, by_key()).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    // Long streams: headers at once, then a frame a minute.
    let streamed = [("x-frames", 10), ("x-gap-ms", 60_000)];

    svc.ready().await.unwrap();
    let mut first = task::spawn(svc.call(request("a", 0, &streamed)));
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("a", 1, &streamed)));
    let first = assert_ready_ok!(first.poll());
    let _second = assert_ready_ok!(second.poll());
    svc.ready().await.unwrap();
    let mut third = task::spawn(svc.call(request("a", 2, &streamed)));
    assert_pending!(third.poll());
    assert_eq!(handle.stats().aggregate.in_flight, Some(2));
    assert_eq!(handle.stats().aggregate.queued_now, 1);

    // The headers of both are here, and time passes: still no permit.
    let (parts, mut body) = first.into_parts();
    assert_eq!(parts.status, 200);
    assert!(body.holds_permit());
    time::advance(Duration::from_secs(30)).await;
    assert_pending!(third.poll());
    // Another key is not held up by this one.
    svc.ready().await.unwrap();
    let mut other = task::spawn(svc.call(request("b", 3, &[])));
    assert_ready_ok!(other.poll());

    // Reading part of the body does not release it either.
    let frame = body.frame();
    let frame = tokio::time::timeout(Duration::from_secs(61), frame).await;
    assert!(matches!(frame, Ok(Some(Ok(_)))));
    assert!(!third.is_woken());
    assert_pending!(third.poll());

    // Dropping the body gives the permit to the third request at once.
    drop(body);
    assert!(third.is_woken(), "the release wakes the waiter; no polling");
    let third = assert_ready_ok!(third.poll());
    assert_eq!(upstream.order(), vec![0, 1, 3, 2]);
    let stats = handle.stats().aggregate;
    assert_eq!(stats.in_flight, Some(2));
    assert_eq!(stats.queued_now, 0);
    assert_eq!(stats.waited, 1);
    assert!((stats.total_wait_ms - 90_000.0).abs() < 1.0, "{stats:?}");
    drop(third);
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    thousand_queued_requests_are_granted_in_arrival_order => thousand_queued
);

async fn thousand_queued<X: OneKey>(key: X) {
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, key).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for seq in 0..1_001u64 {
        // The first holds the permit for a second; the others answer at once.
        let delay = if seq == 0 { 1_000 } else { 0 };
        svc.ready().await.unwrap();
        let call = svc.call(request("k", seq, &[("x-delay-ms", delay), ("x-frames", 1)]));
        tasks.push(tokio::spawn(async move {
            let response = call.await?;
            drain(response.into_body()).await
        }));
    }
    tokio::task::yield_now().await;
    assert_eq!(handle.stats().aggregate.queued_now, 1_000);
    // A leaked permit would strand the rest: fail, do not hang.
    let all = time::timeout(Duration::from_secs(3_600), futures::future::join_all(tasks));
    for done in all.await.expect("every queued request was granted") {
        assert_eq!(done.unwrap().unwrap(), 1);
    }
    assert_eq!(upstream.order(), (0..1_001).collect::<Vec<_>>());
    assert_eq!(upstream.flight.max(), 1);
    // Each grant came the instant its predecessor finished: no timer, no
    // polling interval, so all 1,000 waiters ran at the first one's end.
    assert!(
        upstream.instants()[1..]
            .iter()
            .all(|&at| at == start + SECOND)
    );
    let stats = handle.stats().aggregate;
    assert_eq!(
        (stats.admitted, stats.waited, stats.queued_now),
        (1_001, 1_000, 0)
    );
    assert_eq!(stats.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_full_queue_refuses_at_once_with_queue_full_and_the_gauge_returns_to_zero => full_queue
);

async fn full_queue<X: OneKey>(key: X) {
    let text = text_of(&key);
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, key).unwrap().with_max_queue(2);
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    svc.ready().await.unwrap();
    let held = svc.call(request("a", 0, &[])).await.unwrap();
    let mut waiting = Vec::new();
    for seq in 1..=2 {
        svc.ready().await.unwrap();
        let mut waiter = task::spawn(svc.call(request("a", seq, &[])));
        assert_pending!(waiter.poll());
        waiting.push(waiter);
    }
    assert_eq!(handle.stats().aggregate.queued_now, 2);

    svc.ready().await.unwrap();
    let mut refused = task::spawn(svc.call(request("a", 3, &[])));
    let err = assert_ready!(refused.poll()).unwrap_err();
    let full = err.downcast_ref::<QueueFull>().expect("QueueFull");
    assert_eq!((full.key.as_str(), full.max_queue), (text.as_str(), 2));
    assert_eq!(upstream.order(), vec![0], "refused before the inner call");

    // A waiter that gives up makes room for one more.
    drop(waiting.pop());
    svc.ready().await.unwrap();
    let mut room = task::spawn(svc.call(request("a", 4, &[])));
    assert_pending!(room.poll());

    drop(held);
    let first = assert_ready_ok!(waiting[0].poll());
    drop(first);
    let last = assert_ready_ok!(room.poll());
    drop(last);
    assert_eq!(upstream.order(), vec![0, 1, 4]);
    let stats = handle.stats().aggregate;
    assert_eq!((stats.queued_now, stats.rejected), (0, 1));
    assert_eq!(stats.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_queue_timeout_gives_up_with_queue_timeout_and_the_gauge_returns_to_zero => queue_timeout
);

async fn queue_timeout<X: OneKey>(key: X) {
    let text = text_of(&key);
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, key)
        .unwrap()
        .with_queue_timeout(Duration::from_secs(5));
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    svc.ready().await.unwrap();
    let held = svc.call(request("a", 0, &[])).await.unwrap();
    svc.ready().await.unwrap();
    let mut early = task::spawn(svc.call(request("a", 1, &[])));
    assert_pending!(early.poll());
    time::advance(Duration::from_secs(2)).await;
    svc.ready().await.unwrap();
    let mut late = task::spawn(svc.call(request("a", 2, &[])));
    assert_pending!(late.poll());
    assert_eq!(handle.stats().aggregate.queued_now, 2);

    time::advance(Duration::from_millis(2_999)).await;
    assert_pending!(early.poll());
    time::advance(Duration::from_millis(1)).await;
    assert!(early.is_woken());
    let err = assert_ready!(early.poll()).unwrap_err();
    let timeout = err.downcast_ref::<QueueTimeout>().expect("QueueTimeout");
    assert_eq!(
        (timeout.key.as_str(), timeout.waited),
        (text.as_str(), Duration::from_secs(5))
    );
    assert_eq!(handle.stats().aggregate.queued_now, 1);

    // The permit comes back in time for the later one.
    time::advance(Duration::from_secs(1)).await;
    drop(held);
    let granted = assert_ready_ok!(late.poll());
    drop(granted);
    assert_eq!(
        upstream.order(),
        vec![0, 2],
        "the timed-out request never reached it"
    );
    let stats = handle.stats().aggregate;
    assert_eq!((stats.queued_now, stats.rejected, stats.waited), (0, 1, 1));
    assert_eq!(stats.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    cancelling_half_the_callers_at_random_points_never_exceeds_n_and_leaks_nothing =>
        cancelling_half
);

async fn cancelling_half<X: OneKey>(key: X) {
    const N: usize = 3;
    const CALLERS: u64 = 400;
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(N, key).unwrap();
    let handle = layer.handle();
    let svc = layer.layer(upstream.clone());
    let mut rng = Lcg(0x5eed);
    // How far each cancelled caller got: queued, headers, part of the body.
    let reached: Arc<[AtomicUsize; 3]> = Arc::default();
    let mut tasks = Vec::new();
    for seq in 0..CALLERS {
        let arrival = Duration::from_millis(rng.next() % 40_000);
        let extra = [
            ("x-delay-ms", rng.next() % 300),
            ("x-frames", rng.next() % 4),
            ("x-gap-ms", rng.next() % 200),
        ];
        let cancel_after = (seq % 2 == 0).then(|| Duration::from_millis(rng.next() % 2_000));
        let mut svc = svc.clone();
        let reached = reached.clone();
        tasks.push(tokio::spawn(async move {
            time::sleep(arrival).await;
            let mut stage = 0;
            let caller = async {
                svc.ready().await?;
                let response = svc.call(request("k", seq, &extra)).await?;
                stage = 1;
                let mut body = response.into_body();
                while let Some(frame) = body.frame().await {
                    frame?;
                    stage = 2;
                }
                Ok::<_, BoxError>(())
            };
            let outcome = match cancel_after {
                Some(after) => time::timeout(after, caller).await.ok(),
                None => Some(caller.await),
            };
            if outcome.is_none() {
                reached[stage].fetch_add(1, Ordering::SeqCst);
            }
            (cancel_after.is_some(), outcome)
        }));
    }
    let mut completed = 0;
    // A leaked permit would strand the rest: fail, do not hang.
    let all = time::timeout(Duration::from_secs(3_600), futures::future::join_all(tasks));
    for done in all.await.expect("every caller finished") {
        match done.unwrap() {
            (false, Some(Ok(()))) => completed += 1,
            (false, other) => panic!("an uncancelled caller failed: {other:?}"),
            (true, Some(done)) => done.expect("a caller that finished in time succeeded"),
            (true, None) => {}
        }
    }
    assert_eq!(completed, CALLERS / 2);
    let reached: Vec<usize> = reached.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert!(
        reached.iter().all(|&n| n > 0),
        "cancelled at every stage: {reached:?}"
    );
    assert_eq!(
        upstream.flight.max(),
        N,
        "never more than N inside, and N reached"
    );
    assert_eq!(upstream.flight.now(), 0);
    let stats = handle.stats().aggregate;
    assert_eq!((stats.in_flight, stats.queued_now), (Some(0), 0));
    // Admitted means sent: a waiter dropped after its permit came is not.
    assert_eq!(stats.admitted as usize, upstream.order().len());
    // Nothing holds the key's state any more: no permit, no place in line.
    assert_eq!(handle.evict_idle(), X::STORED);
    assert_eq!(handle.key_count(), 0);

    // Every permit is back: N at once, and the next one waits.
    let mut svc = svc;
    let mut held = Vec::new();
    for seq in 0..N as u64 {
        svc.ready().await.unwrap();
        let mut call = task::spawn(svc.call(request("k", 10_000 + seq, &[])));
        held.push(assert_ready_ok!(call.poll()));
    }
    svc.ready().await.unwrap();
    let mut granted_then_dropped = task::spawn(svc.call(request("k", 20_000, &[])));
    assert_pending!(granted_then_dropped.poll());
    svc.ready().await.unwrap();
    let mut next = task::spawn(svc.call(request("k", 20_001, &[])));
    assert_pending!(next.poll());
    // A permit goes to the first waiter, which is dropped before it wakes:
    // the permit passes on to the next.
    held.pop();
    assert!(granted_then_dropped.is_woken());
    drop(granted_then_dropped);
    assert!(next.is_woken());
    held.push(assert_ready_ok!(next.poll()));
    drop(held);
    assert_eq!(handle.stats().aggregate.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    cancelling_callers_on_many_threads_never_exceeds_n_and_leaks_nothing => cancelling_on_threads
);

async fn cancelling_on_threads<X: OneKey>(key: X) {
    // One permit: a permit lost in a race would strand the queue for good.
    const N: usize = 1;
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(N, key).unwrap();
    let handle = layer.handle();
    let svc = layer.layer(upstream.clone());
    let mut tasks = Vec::new();
    for seq in 0..2_000u64 {
        let mut svc = svc.clone();
        let mut rng = Lcg(seq);
        tasks.push(tokio::spawn(async move {
            let cancel = seq % 2 == 0;
            let after = Duration::from_micros(rng.next() % 200);
            let caller = async {
                for _ in 0..rng.next() % 3 {
                    tokio::task::yield_now().await;
                }
                svc.ready().await?;
                let response = svc.call(request("k", seq, &[])).await?;
                // Hold the permit for a few turns of the scheduler.
                for _ in 0..rng.next() % 4 {
                    tokio::task::yield_now().await;
                }
                drop(response);
                Ok::<_, BoxError>(())
            };
            if cancel {
                let _ = time::timeout(after, caller).await;
                Ok(())
            } else {
                caller.await
            }
        }));
    }
    let all = time::timeout(Duration::from_secs(20), futures::future::join_all(tasks));
    for done in all.await.expect("every caller finished") {
        done.unwrap().expect("an uncancelled caller succeeded");
    }
    assert!(
        upstream.flight.max() <= N,
        "{} in flight",
        upstream.flight.max()
    );
    let stats = handle.stats().aggregate;
    assert_eq!((stats.in_flight, stats.queued_now), (Some(0), 0));
    assert!(stats.waited > 0, "the callers did contend: {stats:?}");
    assert_eq!(
        stats.admitted as usize,
        upstream.order().len(),
        "admitted counts only requests sent"
    );
    drop(svc);
    handle.evict_idle();
    assert_eq!(handle.key_count(), 0, "a permit or a place in line leaked");
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    stats_count_admitted_in_flight_and_waited_and_wake_a_subscriber => stats_and_subscription
);

async fn stats_and_subscription<X: OneKey>(key: X) {
    let layer = ConcurrencyLayer::new(1, key).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(Upstream::default());
    let mut sub = handle.subscribe();
    let mut next = task::spawn(async move { sub.changed().await });
    assert_pending!(next.poll(), "nothing has happened yet");

    svc.ready().await.unwrap();
    let held = svc.call(request("a", 0, &[])).await.unwrap();
    assert!(
        next.is_woken(),
        "a request going in flight wakes the subscriber"
    );
    let seen = next.await.aggregate;
    assert_eq!((seen.admitted, seen.in_flight), (1, Some(1)));

    svc.ready().await.unwrap();
    let mut waiter = task::spawn(svc.call(request("a", 1, &[])));
    assert_pending!(waiter.poll());
    time::advance(SECOND).await;
    drop(held);
    let second = assert_ready_ok!(waiter.poll());
    let stats = handle.stats().aggregate;
    assert_eq!(
        (
            stats.admitted,
            stats.waited,
            stats.queued_now,
            stats.in_flight
        ),
        (2, 1, 0, Some(1))
    );
    assert!((stats.total_wait_ms - 1_000.0).abs() < 1.0, "{stats:?}");
    drop(second);
    assert_eq!(handle.stats().aggregate.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_waiter_dropped_after_its_permit_came_is_neither_admitted_nor_in_flight => dropped_after_grant
);

async fn dropped_after_grant<X: OneKey>(key: X) {
    // Counted in the permit word (the single key) and in the stats.
    for key_stats in [0, 10] {
        let upstream = Upstream::default();
        let layer = ConcurrencyLayer::new(1, key.clone())
            .unwrap()
            .with_key_stats(key_stats);
        let handle = layer.handle();
        let mut svc = layer.layer(upstream.clone());
        svc.ready().await.unwrap();
        let held = svc.call(request("a", 0, &[])).await.unwrap();
        svc.ready().await.unwrap();
        let mut waiter = task::spawn(svc.call(request("a", 1, &[])));
        assert_pending!(waiter.poll());
        // The permit passes to the waiter, which is dropped before it runs.
        drop(held);
        drop(waiter);
        let stats = handle.stats().aggregate;
        assert_eq!(
            (
                stats.admitted,
                stats.waited,
                stats.queued_now,
                stats.in_flight
            ),
            (1, 0, 0, Some(0)),
            "key stats {key_stats}: {stats:?}"
        );
        assert_eq!(upstream.order(), vec![0]);
        // The permit is back: the next request goes at once, and counts
        // in flight while it is held (the handed-over permit is no longer
        // taken off the count).
        svc.ready().await.unwrap();
        let next = svc.call(request("a", 2, &[])).await.unwrap();
        let stats = handle.stats().aggregate;
        assert_eq!((stats.admitted, stats.in_flight), (2, Some(1)), "{stats:?}");
        drop(next);
        let stats = handle.stats().aggregate;
        assert_eq!((stats.admitted, stats.in_flight), (2, Some(0)));
    }
}

/// `Upstream` behind a gate: not ready while the gate is shut.
#[derive(Clone, Debug, Default)]
struct Gated {
    upstream: Upstream,
    shut: Arc<std::sync::atomic::AtomicBool>,
}

impl Service<http::Request<()>> for Gated {
    type Response = http::Response<Stream>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.shut.load(Ordering::SeqCst) {
            // Polled again by hand in the test.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<()>) -> Answer {
        self.upstream.call(req)
    }
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_waiter_holding_its_permit_until_the_service_is_ready_is_not_yet_in_flight => granted_not_ready
);

async fn granted_not_ready<X: OneKey>(key: X) {
    // The same answer whether the permit word counts (the single key) or
    // the stats do.
    for key_stats in [0, 10] {
        let gated = Gated::default();
        let layer = ConcurrencyLayer::new(1, key.clone())
            .unwrap()
            .with_key_stats(key_stats);
        let handle = layer.handle();
        let mut svc = layer.layer(gated.clone());
        svc.ready().await.unwrap();
        let held = svc.call(request("a", 0, &[])).await.unwrap();
        svc.ready().await.unwrap();
        let mut waiter = task::spawn(svc.call(request("a", 1, &[])));
        assert_pending!(waiter.poll());
        gated.shut.store(true, Ordering::SeqCst);
        drop(held);
        // Granted its permit, but the service is not ready: still waiting.
        assert_pending!(waiter.poll());
        let stats = handle.stats().aggregate;
        assert_eq!(
            (stats.admitted, stats.queued_now, stats.in_flight),
            (1, 1, Some(0)),
            "key stats {key_stats}: granted, not sent"
        );
        gated.shut.store(false, Ordering::SeqCst);
        let sent = assert_ready_ok!(waiter.poll());
        let stats = handle.stats().aggregate;
        assert_eq!(
            (stats.admitted, stats.waited, stats.in_flight),
            (2, 1, Some(1)),
            "key stats {key_stats}: sent"
        );
        drop(sent);
        assert_eq!(handle.stats().aggregate.in_flight, Some(0));
        assert_eq!(gated.upstream.order(), vec![0, 1]);
    }
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_subscription_outliving_the_layer_still_counts_its_requests => subscription_outliving_the_layer
);

async fn subscription_outliving_the_layer<X: OneKey>(key: X) {
    let layer = ConcurrencyLayer::new(1, key).unwrap();
    let sub = layer.handle().subscribe();
    let mut svc = layer.layer(Upstream::default());
    svc.ready().await.unwrap();
    let held = svc.call(request("a", 0, &[])).await.unwrap();
    drop((layer, svc));
    let seen = sub.snapshot().aggregate;
    assert_eq!((seen.admitted, seen.in_flight), (1, Some(1)));
    drop(held);
    let seen = sub.snapshot().aggregate;
    assert_eq!((seen.admitted, seen.in_flight), (1, Some(0)));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    with_key_stats_the_key_is_counted_apart => key_counted_apart
);

async fn key_counted_apart<X: OneKey>(key: X) {
    let text = text_of(&key);
    let layer = ConcurrencyLayer::new(2, key).unwrap().with_key_stats(10);
    let handle = layer.handle();
    let mut svc = layer.layer(Upstream::default());
    svc.ready().await.unwrap();
    let held = svc.call(request("a", 0, &[])).await.unwrap();
    svc.ready().await.unwrap();
    drop(svc.call(request("a", 1, &[])).await.unwrap());
    let stats = handle.stats();
    assert_eq!(stats.keys.len(), 1);
    for counted in [&stats.keys[0], &stats.aggregate] {
        assert_eq!((counted.admitted, counted.in_flight), (2, Some(1)));
    }
    assert_eq!(stats.keys[0].key, text);
    drop(held);
    assert_eq!(handle.stats().keys[0].in_flight, Some(0));
}

// ---------------------------------------------------------------- with RateLimitLayer

/// Five requests at once on one route: the first holds the upstream for five
/// seconds. Returns the instants the upstream saw them.
async fn five_requests_through<S>(svc: S, upstream: &Upstream) -> Vec<Instant>
where
    S: Service<
            http::Request<()>,
            Response = http::Response<ConcurrencyBody<Stream>>,
            Error = BoxError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut tasks = Vec::new();
    for seq in 0..5u64 {
        let delay = if seq == 0 { 5_000 } else { 0 };
        let mut svc = svc.clone();
        svc.ready().await.unwrap();
        let call = svc.call(request("k", seq, &[("x-delay-ms", delay)]));
        tasks.push(tokio::spawn(async move {
            let response = call.await?;
            drain(response.into_body()).await
        }));
    }
    let all = time::timeout(Duration::from_secs(3_600), futures::future::join_all(tasks));
    for done in all.await.expect("every request went through") {
        done.unwrap().expect("every request goes through");
    }
    assert_eq!(upstream.order(), vec![0, 1, 2, 3, 4]);
    upstream.instants()
}

#[tokio::test(start_paused = true)]
async fn concurrency_outside_rate_limit_keeps_the_upstream_within_its_rate() {
    let rate_limit = || {
        RateLimitLayer::new(Quota::per_second(1).unwrap(), GlobalKey)
            .with_max_wait(Duration::from_secs(60))
    };
    let concurrency = || ConcurrencyLayer::new(1, GlobalKey).unwrap();

    // Rate limit outside: it admits one request a second, and they pile up
    // behind the slow first one, to reach the upstream all at once.
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new()
        .layer(rate_limit())
        .layer(concurrency())
        .service(upstream.clone());
    let instants = five_requests_through(svc, &upstream).await;
    assert_eq!(
        most_in_any_window(&instants, SECOND),
        4,
        "the upstream sees a burst above its 1 per second"
    );

    // Concurrency outside: the rate limiter sits next to the upstream, so
    // its admissions are the upstream's arrivals.
    let upstream = Upstream::default();
    let svc = ServiceBuilder::new()
        .layer(concurrency())
        .layer(rate_limit())
        .service(upstream.clone());
    let instants = five_requests_through(svc, &upstream).await;
    assert_eq!(most_in_any_window(&instants, SECOND), 1);
    assert_eq!(upstream.flight.max(), 1);
}

// ---------------------------------------------------------------- the rest of the issue

#[test]
fn zero_in_flight_is_a_config_error() {
    let err = ConcurrencyLayer::new(0, GlobalKey).unwrap_err();
    assert_eq!(err.field, "max_in_flight");
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    release_at_headers_frees_the_permit_when_the_response_arrives => release_at_headers
);

async fn release_at_headers<X: OneKey>(key: X) {
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, key)
        .unwrap()
        .with_release_at_headers(true);
    let mut svc = layer.layer(upstream.clone());
    svc.ready().await.unwrap();
    let first = svc
        .call(request("k", 0, &[("x-frames", 5), ("x-gap-ms", 60_000)]))
        .await
        .unwrap();
    assert!(!first.body().holds_permit());
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 1, &[])));
    assert_ready_ok!(second.poll());
    drop(first);
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_failed_response_gives_its_permit_back => failed_response
);

async fn failed_response<X: OneKey>(key: X) {
    let upstream = Upstream {
        fail: true,
        ..Upstream::default()
    };
    let layer = ConcurrencyLayer::new(1, key).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    svc.ready().await.unwrap();
    let mut first = task::spawn(svc.call(request("k", 0, &[("x-delay-ms", 100)])));
    assert_pending!(first.poll());
    svc.ready().await.unwrap();
    let mut second = task::spawn(svc.call(request("k", 1, &[])));
    assert_pending!(second.poll());
    time::advance(Duration::from_millis(100)).await;
    assert!(assert_ready!(first.poll()).is_err());
    assert!(second.is_woken());
    assert!(assert_ready!(second.poll()).is_err());
    assert_eq!(upstream.order(), vec![0, 1]);
    assert_eq!(handle.stats().aggregate.in_flight, Some(0));
}

on_one_key!(
    #[tokio::test(start_paused = true)]
    a_body_read_to_its_end_gives_the_permit_back => body_read_to_its_end
);

async fn body_read_to_its_end<X: OneKey>(key: X) {
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, key).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    svc.ready().await.unwrap();
    let response = svc
        .call(request("a", 0, &[("x-frames", 3), ("x-gap-ms", 10)]))
        .await
        .unwrap();
    let mut body = response.into_body();
    assert_eq!(handle.stats().aggregate.in_flight, Some(1));
    while let Some(frame) = body.frame().await {
        frame.unwrap();
    }
    // Read to its end; the body itself is still here.
    assert!(!body.holds_permit());
    assert_eq!(handle.stats().aggregate.in_flight, Some(0));
    svc.ready().await.unwrap();
    let mut next = task::spawn(svc.call(request("a", 1, &[])));
    assert_ready_ok!(next.poll());
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_dropped_so_a_flood_of_keys_leaves_little_behind() {
    let upstream = Upstream::default();
    let layer = ConcurrencyLayer::new(1, by_key()).unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(upstream.clone());
    for seq in 0..20_000u64 {
        svc.ready().await.unwrap();
        let response = svc.call(request(&format!("client-{seq}"), seq, &[])).await;
        drop(response.unwrap());
    }
    // A few idle keys per shard of the store may stay, and the service's
    // last key.
    let left = handle.key_count();
    assert!(left <= 5_000, "{left} of 20,000 keys still held");
    // Once the service is gone nothing holds any of them.
    drop(svc);
    assert!(handle.evict_idle() <= left);
    assert_eq!(handle.key_count(), 0);
}

#[cfg(feature = "reqwest")]
#[tokio::test]
async fn a_reqwest_response_holds_its_permit_until_its_body_is_read() {
    use reqwest::ResponseBuilderExt;

    // What a reqwest::Client answers: a response with its URL and a body.
    let inner = tower::service_fn(|req: reqwest::Request| async move {
        let response = http::Response::builder()
            .status(200)
            .url(req.url().clone())
            .header("content-type", "text/event-stream")
            .body(reqwest::Body::from("data: done\n\n"))
            .unwrap();
        Ok::<_, reqwest::Error>(reqwest::Response::from(response))
    });
    let layer = ConcurrencyLayer::new(1, GlobalKey)
        .unwrap()
        .with_max_queue(0);
    let mut svc = layer.layer(inner);
    let url = "https://api.example.com/v1/chat";
    let request = || reqwest::Request::new(http::Method::POST, url.parse().unwrap());

    let mut response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.url().as_str(), url);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let refused = svc
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap_err();
    assert!(refused.downcast_ref::<QueueFull>().is_some());

    assert_eq!(response.chunk().await.unwrap().unwrap(), "data: done\n\n");
    assert!(response.chunk().await.unwrap().is_none());
    // Read to its end, the response still alive: the permit is back.
    let next = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(next.text().await.unwrap(), "data: done\n\n");
    drop(response);
}
