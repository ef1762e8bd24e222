//! RetryPolicy: retries 429/503 after the advised delay, within an attempt
//! limit and a budget, in paused time.

#![cfg(feature = "test-util")]

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tower::retry::Retry;
use tower::retry::budget::TpsBudget;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::backoff::{Backoff429Layer, ExponentialBackoff, RetryPolicy};
use tower_throttle::error::BoxError;
use tower_throttle::key::GlobalKey;

type Request = http::Request<String>;
type Response = http::Response<String>;

/// What the upstream does on one call.
#[derive(Clone, Debug)]
enum Outcome {
    Reply(u16, Vec<(&'static str, &'static str)>),
    Fail(io::ErrorKind),
}

fn reply(status: u16, headers: &[(&'static str, &'static str)]) -> Outcome {
    Outcome::Reply(status, headers.to_vec())
}

/// An upstream answering from `script`, then `then` forever; it records the
/// instant of every call.
#[derive(Clone)]
struct Upstream {
    script: Arc<Mutex<VecDeque<Outcome>>>,
    then: Outcome,
    calls: Arc<Mutex<Vec<Instant>>>,
    start: Instant,
}

impl Upstream {
    fn new(script: impl IntoIterator<Item = Outcome>, then: Outcome) -> Self {
        Self {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            then,
            calls: Arc::default(),
            start: Instant::now(),
        }
    }

    /// The instant of each call, in milliseconds after the upstream was made.
    fn call_ms(&self) -> Vec<u128> {
        self.calls
            .lock()
            .iter()
            .map(|at| (*at - self.start).as_millis())
            .collect()
    }
}

impl Service<Request> for Upstream {
    type Response = Response;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request) -> Self::Future {
        self.calls.lock().push(Instant::now());
        let outcome = self
            .script
            .lock()
            .pop_front()
            .unwrap_or_else(|| self.then.clone());
        std::future::ready(match outcome {
            Outcome::Reply(status, headers) => {
                let mut response = http::Response::builder().status(status);
                for (name, value) in headers {
                    response = response.header(name, value);
                }
                Ok(response.body(String::new()).expect("valid test response"))
            }
            Outcome::Fail(kind) => {
                Err(Box::new(io::Error::new(kind, "upstream failed")) as BoxError)
            }
        })
    }
}

fn request() -> Request {
    http::Request::new("{\"model\":\"m\"}".to_owned())
}

async fn send(
    policy: RetryPolicy<impl Clone + tower_throttle::backoff::RetryErrors<BoxError>>,
    upstream: &Upstream,
) -> Result<Response, BoxError> {
    Retry::new(policy, upstream.clone())
        .oneshot(request())
        .await
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_exactly_the_delay_the_response_advises() {
    let cases: [(&str, Outcome, u128); 4] = [
        ("retry-after", reply(429, &[("retry-after", "3")]), 3_000),
        (
            "retry-after-ms",
            reply(429, &[("retry-after-ms", "1500")]),
            1_500,
        ),
        (
            "reset header",
            reply(429, &[("x-ratelimit-reset-requests", "2s")]),
            2_000,
        ),
        (
            "503 retry-after",
            reply(503, &[("retry-after", "4")]),
            4_000,
        ),
    ];
    for (name, refusal, ms) in cases {
        let upstream = Upstream::new([refusal], reply(200, &[]));
        let response = send(RetryPolicy::new(), &upstream).await.expect(name);
        assert_eq!(response.status(), 200, "{name}");
        assert_eq!(upstream.call_ms(), [0, ms], "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_attempt_limit() {
    let upstream = Upstream::new([], reply(429, &[("retry-after", "1")]));
    let policy = RetryPolicy::new().with_max_attempts(4).expect("valid");
    // Without a limit the budget's reserve would allow retries forever.
    let response = tokio::time::timeout(Duration::from_secs(60), send(policy, &upstream))
        .await
        .expect("the retries stop")
        .expect("the last 429");
    assert_eq!(response.status(), 429);
    assert_eq!(upstream.call_ms(), [0, 1_000, 2_000, 3_000]);

    let upstream = Upstream::new([], reply(429, &[("retry-after", "1")]));
    let policy = RetryPolicy::new().with_max_attempts(1).expect("valid");
    send(policy, &upstream).await.expect("429");
    assert_eq!(upstream.call_ms(), [0], "one attempt means no retry");

    let err = RetryPolicy::new()
        .with_max_attempts(0)
        .expect_err("zero attempts");
    assert_eq!(err.field, "max_attempts");
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_is_spent() {
    // No deposits count (0%), and a reserve of 10 retries over the 10 s ttl.
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.0));
    let upstream = Upstream::new([], reply(429, &[("retry-after", "0")]));
    let policy = RetryPolicy::new()
        .with_max_attempts(100)
        .expect("valid")
        .with_budget(budget.clone());
    send(policy.clone(), &upstream).await.expect("429");
    assert_eq!(
        upstream.call_ms().len(),
        11,
        "the first attempt and ten retries"
    );
    send(policy.clone(), &upstream).await.expect("429");
    assert_eq!(upstream.call_ms().len(), 12, "no budget left: no retry");
}

#[tokio::test(start_paused = true)]
async fn a_delay_longer_than_max_delay_is_not_retried_but_returned() {
    let upstream = Upstream::new(
        [reply(429, &[("retry-after", "999999999")])],
        reply(200, &[]),
    );
    let response = send(RetryPolicy::new(), &upstream).await.expect("429");
    assert_eq!(response.status(), 429);
    assert_eq!(upstream.call_ms(), [0]);

    let upstream = Upstream::new([reply(429, &[("retry-after", "6")])], reply(200, &[]));
    let policy = RetryPolicy::new().with_max_delay(Duration::from_secs(5));
    assert_eq!(send(policy, &upstream).await.expect("429").status(), 429);
    let policy = RetryPolicy::new().with_max_delay(Duration::from_secs(6));
    assert_eq!(send(policy, &upstream).await.expect("200").status(), 200);
}

#[tokio::test(start_paused = true)]
async fn without_advice_retries_back_off_exponentially() {
    let upstream = Upstream::new([reply(503, &[]), reply(429, &[])], reply(200, &[]));
    let policy = RetryPolicy::new().with_backoff(ExponentialBackoff::new(
        Duration::from_secs(1),
        Duration::from_secs(10),
    ));
    assert_eq!(send(policy, &upstream).await.expect("200").status(), 200);
    assert_eq!(upstream.call_ms(), [0, 1_000, 3_000]);
}

#[tokio::test(start_paused = true)]
async fn only_429_and_by_option_503_are_retried() {
    for (status, on_503, calls) in [
        (500, true, 1),
        (404, true, 1),
        (503, false, 1),
        (503, true, 2),
    ] {
        let upstream = Upstream::new([reply(status, &[("retry-after", "1")])], reply(200, &[]));
        send(RetryPolicy::new().with_on_503(on_503), &upstream)
            .await
            .expect("response");
        assert_eq!(
            upstream.call_ms().len(),
            calls,
            "status {status}, on_503 {on_503}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn connect_errors_are_retried_only_when_asked() {
    let refused = Outcome::Fail(io::ErrorKind::ConnectionRefused);
    let upstream = Upstream::new([refused.clone()], reply(200, &[]));
    send(RetryPolicy::new(), &upstream)
        .await
        .expect_err("not retried by default");
    assert_eq!(upstream.call_ms(), [0]);

    let upstream = Upstream::new([refused], reply(200, &[]));
    let response = send(RetryPolicy::new().retry_connect_errors(), &upstream).await;
    assert_eq!(response.expect("retried").status(), 200);
    assert_eq!(upstream.call_ms(), [0, 1_000]);

    // A timeout may have reached the server: not a connect error.
    let upstream = Upstream::new([Outcome::Fail(io::ErrorKind::TimedOut)], reply(200, &[]));
    send(RetryPolicy::new().retry_connect_errors(), &upstream)
        .await
        .expect_err("not retried");
    assert_eq!(upstream.call_ms(), [0]);

    // Any error a closure picks.
    let upstream = Upstream::new([Outcome::Fail(io::ErrorKind::TimedOut)], reply(200, &[]));
    let policy = RetryPolicy::new().retry_errors(|_: &BoxError| true);
    assert_eq!(
        send(policy, &upstream).await.expect("retried").status(),
        200
    );
}

#[tokio::test(start_paused = true)]
async fn over_the_backoff_layer_the_retry_lands_after_the_cooldown() {
    let upstream = Upstream::new([reply(429, &[("retry-after", "2")])], reply(200, &[]));
    let layer = Backoff429Layer::new(GlobalKey);
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .retry(RetryPolicy::new())
        .layer(layer)
        .service(upstream.clone());
    let response = svc
        .oneshot(request())
        .await
        .expect("retried after the cooldown");
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.call_ms(), [0, 2_000]);
    assert_eq!(handle.stats().requests.aggregate.rejected, 0);
}
