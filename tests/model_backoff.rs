//! `Backoff429Layer` (reject mode) against a reference model
//! (tests/support/backoff_model.rs) over generated histories: requests on
//! three routes, answered in any order by 429s (with and without
//! `retry-after-ms`, `Retry-After` or a reset header, in and out of range,
//! or garbage), 503s, successes (some saying the route is exhausted) and
//! 500s; paused time moving by zero, a little, or to just before, at or just
//! after the end of a cooldown; the lengths changed live; the layer switched
//! off and on; idle routes evicted. After every step the layer must agree
//! with the model exactly: each request let through or refused with the
//! exact time left, the cooldowns listed (time left, reason, status), the
//! counters.
//!
//! Each request is a real response future polled by hand
//! (`tokio_test::task::spawn`) under a paused current-thread runtime; the
//! upstream answers it only when the history says, so answers can come
//! back in any order and after time has passed.
//!
//! `TT_PROPTEST_CASES` sets the number of histories per property.

#![cfg(feature = "test-util")]

#[path = "support/props.rs"]
mod props;
mod support;

#[path = "support/backoff_model.rs"]
mod model;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use model::{GARBAGE, Headers, Lengths, MS, Model, SEC, Sent, Val, Why};
use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio_test::task::{self, Spawn};
use tower::Service;
use tower_throttle::BoxError;
use tower_throttle::backoff::{
    Backoff429, Backoff429Layer, BackoffHandle, ExponentialBackoff, Reason,
};
use tower_throttle::error::CoolingDown;
use tower_throttle::key::{HeaderKey, key_label};

const ROUTES: usize = 3;

// ------------------------------------------------------------ the upstream

type Reply = http::Response<()>;
type Answer = Pin<Box<dyn Future<Output = Result<Reply, BoxError>> + Send>>;

/// Answers each request with the response the test sends through its gate.
#[derive(Clone, Default)]
struct Upstream {
    gates: Arc<Mutex<HashMap<usize, oneshot::Receiver<Reply>>>>,
}

impl Service<http::Request<()>> for Upstream {
    type Response = Reply;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<()>) -> Answer {
        let id = req
            .headers()
            .get("x-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(usize::MAX);
        let gate = self.gates.lock().remove(&id);
        Box::pin(async move {
            match gate {
                Some(gate) => gate.await.map_err(Into::into),
                None => Err("no gate".into()),
            }
        })
    }
}

// ------------------------------------------------------------- histories

#[derive(Clone, Debug)]
enum Op {
    /// A request on route `route`.
    Send {
        route: usize,
    },
    /// A request on `route`, answered at once (a round trip).
    Call {
        route: usize,
        status: u16,
        headers: Headers,
    },
    /// The upstream answers the `pick`th request in flight, newest first.
    Answer {
        pick: usize,
        status: u16,
        headers: Headers,
    },
    Advance(Advance),
    /// New lengths through the handle (milliseconds).
    SetLengths {
        initial: u64,
        max_backoff: u64,
        max_cooldown: u64,
    },
    Switch {
        on: bool,
    },
    Evict,
}

/// How far paused time moves.
#[derive(Clone, Copy, Debug)]
enum Advance {
    Zero,
    Ms(u64),
    /// To `delta_ns` from the end of `route`'s cooldown, or (`forget`)
    /// from when the route forgets its streak; nothing if that is past.
    ToEnd {
        route: usize,
        forget: bool,
        delta_ns: i64,
    },
}

fn val(max: u64) -> impl Strategy<Value = Val> {
    prop_oneof![
        6 => (0..=max).prop_map(Val::Whole),
        2 => (0..=max, 0..10u8).prop_map(|(n, t)| Val::Tenths(n, t)),
        1 => prop::sample::select(&GARBAGE[..]).prop_map(Val::Garbage),
    ]
}

fn headers() -> impl Strategy<Value = Headers> {
    (
        prop::option::weighted(0.2, val(12_000)),
        prop::option::weighted(0.2, val(12)),
        prop::option::weighted(0.2, (val(12_000), any::<bool>())),
    )
        .prop_map(|(retry_after_ms, retry_after, reset)| Headers {
            retry_after_ms,
            retry_after,
            reset,
        })
}

fn lengths() -> impl Strategy<Value = (u64, u64, u64)> {
    (0..=2_000u64, 0..=8_000u64, 1..=10_000u64)
}

/// One of the routes, the first most often: histories need several
/// requests on one route to build a streak.
fn route() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0usize), 1 => Just(1), 1 => Just(2)]
}

fn op() -> impl Strategy<Value = Op> {
    let status = prop_oneof![8 => Just(429u16), 4 => Just(200), 2 => Just(503), 1 => Just(500)];
    // Boundaries are where the bugs are: to the nanosecond of a
    // cooldown's end, or of a streak being forgotten, most often.
    let advance = prop_oneof![
        1 => Just(Advance::Zero),
        2 => (1..=3_000u64).prop_map(Advance::Ms),
        3 => (
            route(),
            any::<bool>(),
            prop_oneof![3 => Just(0i64), 1 => Just(-1), 1 => Just(1), 1 => -1_000_000..=1_000_000i64]
        )
            .prop_map(|(route, forget, delta_ns)| Advance::ToEnd {
                route,
                forget,
                delta_ns
            }),
    ];
    prop_oneof![
        6 => (route(), status.clone(), headers())
            .prop_map(|(route, status, headers)| Op::Call { route, status, headers }),
        4 => route().prop_map(|route| Op::Send { route }),
        4 => (0..4usize, status, headers())
            .prop_map(|(pick, status, headers)| Op::Answer { pick, status, headers }),
        5 => advance.prop_map(Op::Advance),
        1 => lengths().prop_map(|(initial, max_backoff, max_cooldown)| Op::SetLengths {
            initial,
            max_backoff,
            max_cooldown,
        }),
        1 => any::<bool>().prop_map(|on| Op::Switch { on }),
        1 => Just(Op::Evict),
    ]
}

/// The layer's lengths (ms), 503 handling and proactive cooldowns, then the
/// steps.
type History = ((u64, u64, u64), bool, bool, Vec<Op>);

fn history() -> impl Strategy<Value = History> {
    (
        lengths(),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(op(), 1..40),
    )
}

// ------------------------------------------------------------- the runner

type Svc = Backoff429<Upstream, HeaderKey>;
type Fut = <Svc as Service<http::Request<()>>>::Future;

struct Run {
    model: Model,
    svc: Svc,
    handle: BackoffHandle,
    upstream: Upstream,
    /// Requests in flight, oldest first: model view, future, gate.
    flying: Vec<(Sent, Spawn<Fut>, oneshot::Sender<Reply>)>,
    next_id: usize,
    names: Vec<String>,
}

fn key() -> HeaderKey {
    HeaderKey::new("x-route").expect("valid header name")
}

fn request(route: usize, id: usize) -> http::Request<()> {
    http::Request::builder()
        .header("x-route", format!("r{route}"))
        .header("x-id", id)
        .body(())
        .expect("valid request")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn backoff((initial, max_backoff, _): (u64, u64, u64)) -> ExponentialBackoff {
    ExponentialBackoff::new(ms(initial), ms(max_backoff))
}

fn model_lengths((initial, max_backoff, max_cooldown): (u64, u64, u64)) -> Lengths {
    Lengths {
        initial: initial * MS,
        max_backoff: max_backoff * MS,
        max_cooldown: max_cooldown * MS,
    }
}

fn reason(why: Why) -> Reason {
    match why {
        Why::RetryAfterMs => Reason::RetryAfterMs,
        Why::RetryAfter => Reason::RetryAfter,
        Why::ResetDuration => Reason::ResetDuration,
        Why::Exponential { streak } => Reason::Exponential { streak },
    }
}

/// The response `status` with `headers`, as the upstream sends it.
fn reply(status: u16, headers: &Headers) -> Reply {
    let mut builder = http::Response::builder().status(status);
    if let Some(v) = headers.retry_after_ms {
        builder = builder.header("retry-after-ms", v.decimal());
    }
    if let Some(v) = headers.retry_after {
        builder = builder.header("retry-after", v.decimal());
    }
    if let Some((v, exhausted)) = headers.reset {
        builder = builder
            .header("x-ratelimit-reset-requests", v.go_millis())
            .header(
                "x-ratelimit-remaining-requests",
                if exhausted { "0" } else { "3" },
            );
    }
    builder.body(()).expect("valid response")
}

impl Run {
    fn new(lengths: (u64, u64, u64), on_503: bool, proactive: bool) -> Self {
        let layer = Backoff429Layer::new(key())
            .with_initial_backoff(ms(lengths.0))
            .with_max_backoff(ms(lengths.1))
            .with_max_cooldown(ms(lengths.2))
            .with_on_503(on_503)
            .with_proactive(proactive)
            .with_key_stats(8);
        let handle = layer.handle();
        let upstream = Upstream::default();
        let svc = tower::Layer::layer(&layer, upstream.clone());
        let names = (0..ROUTES)
            .map(|route| key_label(&key(), &request(route, 0)).unwrap_or_default())
            .collect();
        Self {
            model: Model::new(model_lengths(lengths), on_503, proactive, ROUTES),
            svc,
            handle,
            upstream,
            flying: Vec::new(),
            next_id: 0,
            names,
        }
    }

    async fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Send { route } => {
                let id = self.next_id;
                self.next_id += 1;
                let (tx, rx) = oneshot::channel();
                self.upstream.gates.lock().insert(id, rx);
                let mut cx = Context::from_waker(futures::task::noop_waker_ref());
                assert!(self.svc.poll_ready(&mut cx).is_ready());
                let mut fut = task::spawn(self.svc.call(request(route, id)));
                let polled = fut.poll();
                match (self.model.send(route), polled) {
                    (Ok(sent), Poll::Pending) => self.flying.push((sent, fut, tx)),
                    (Err(left), Poll::Ready(Err(e))) => {
                        let Some(refused) = e.downcast_ref::<CoolingDown>() else {
                            return Err(format!("refused with {e}"));
                        };
                        let want = Duration::from_nanos(left);
                        if refused.retry_after != want || refused.key != self.names[route] {
                            return Err(format!("refused with {refused:?}, model {want:?}"));
                        }
                    }
                    (want, got) => {
                        let got = got.map(|r| r.map(|_| "a response"));
                        return Err(format!("sent: layer {got:?}, model {want:?}"));
                    }
                }
            }
            Op::Call {
                route,
                status,
                ref headers,
            } => {
                let flying = self.flying.len();
                Box::pin(self.step(&Op::Send { route })).await?;
                if self.flying.len() > flying {
                    let answer = Op::Answer {
                        pick: 0,
                        status,
                        headers: *headers,
                    };
                    Box::pin(self.step(&answer)).await?;
                }
            }
            Op::Answer {
                pick,
                status,
                ref headers,
            } => {
                if self.flying.is_empty() {
                    return Ok(());
                }
                let newest = self.flying.len() - 1;
                let (sent, mut fut, gate) = self.flying.remove(newest - pick % self.flying.len());
                self.model.answer(&sent, status, headers);
                let _ = gate.send(reply(status, headers));
                match fut.poll() {
                    Poll::Ready(Ok(response)) if response.status() == status => {}
                    other => {
                        let other = other.map(|r| r.map(|r| r.status()));
                        return Err(format!("answer passed back as {other:?}"));
                    }
                }
            }
            Op::Advance(advance) => {
                let nanos = match advance {
                    Advance::Zero => 0,
                    Advance::Ms(n) => n * MS,
                    Advance::ToEnd {
                        route,
                        forget,
                        delta_ns,
                    } => {
                        let r = &self.model.routes[route];
                        let at = if forget { r.forget_at } else { r.until };
                        let end = at.saturating_add_signed(delta_ns);
                        end.saturating_sub(self.model.now)
                    }
                };
                self.model.advance(nanos);
                tokio::time::advance(Duration::from_nanos(nanos)).await;
            }
            Op::SetLengths {
                initial,
                max_backoff,
                max_cooldown,
            } => {
                let lengths = (initial, max_backoff, max_cooldown);
                self.model.lengths = model_lengths(lengths);
                self.handle.set_backoff(backoff(lengths));
                self.handle.set_max_cooldown(ms(max_cooldown));
            }
            Op::Switch { on } => {
                self.model.enabled = on;
                self.handle.set_enabled(on);
            }
            Op::Evict => {
                // Idle routes hold nothing the next decision needs.
                self.handle.evict_idle();
            }
        }
        Ok(())
    }

    /// The cooldowns listed and the counters agree with the model.
    fn check(&self) -> Result<(), String> {
        let stats = self.handle.stats();
        let got: Vec<_> = stats
            .cooldowns
            .iter()
            .map(|c| (c.key.clone(), c.remaining, c.reason, c.status))
            .collect();
        let mut want: Vec<_> = self
            .model
            .cooling()
            .into_iter()
            .map(|(route, left, why, status)| {
                (
                    self.names[route].clone(),
                    Duration::from_nanos(left),
                    reason(why),
                    status,
                )
            })
            .collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        if got != want {
            return Err(format!("cooldowns: layer {got:?}, model {want:?}"));
        }
        let a = &stats.requests.aggregate;
        let got = (a.admitted, a.rejected, stats.cooldowns_started);
        let want = (self.model.admitted, self.model.rejected, self.model.started);
        if got != want {
            return Err(format!(
                "(admitted, rejected, cooldowns started): layer {got:?}, model {want:?}"
            ));
        }
        Ok(())
    }
}

/// Runs a history against a layer and the model; the first disagreement.
fn run((lengths, on_503, proactive, ops): &History) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut run = Run::new(*lengths, *on_503, *proactive);
        for (i, op) in ops.iter().enumerate() {
            run.step(op)
                .await
                .and_then(|()| run.check())
                .map_err(|e| format!("after step {i} ({op:?}): {e}\nhistory: {ops:#?}"))?;
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(props::config(1024))]

    /// Streaks, doubling, the cap, resets on success and clamped header
    /// cooldowns: every step agrees with the model.
    #[test]
    fn cooldowns_match_the_model(history in history()) {
        let outcome = run(&history);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// A 429 to a request sent before a cooldown that has since ended, once the
/// route has gone quiet, counts alike whether or not the idle route was
/// swept meanwhile: a new streak. (It used to start a cooldown only if the
/// route had been swept, which happens at moments of the store's choosing.)
#[tokio::test(start_paused = true)]
async fn a_late_429_on_a_quiet_route_counts_alike_swept_or_not() {
    for sweep in [false, true] {
        // Fixed 1 s exponential cooldowns; 503s with Retry-After cool too.
        let mut run = Run::new((1_000, 0, 10_000), true, false);
        let answer = |pick, status, retry_after: Option<u64>| Op::Answer {
            pick,
            status,
            headers: Headers {
                retry_after: retry_after.map(Val::Whole),
                ..Headers::default()
            },
        };
        let mut ops = vec![
            Op::Send { route: 0 },
            Op::Send { route: 0 },
            // The second request's 503 (answers go newest first) cools the
            // route for 1 s...
            answer(0, 503, Some(1)),
            // ...which ends; with no streak the route is idle at once.
            Op::Advance(Advance::Ms(1_000)),
        ];
        if sweep {
            ops.push(Op::Evict);
        }
        // The first request, sent before that cooldown, is refused late.
        ops.push(answer(0, 429, None));
        for op in &ops {
            run.step(op).await.expect("step");
        }
        let cooling = run.handle.cooldowns();
        assert_eq!(cooling.len(), 1, "swept: {sweep}");
        assert_eq!(
            cooling[0].reason,
            Reason::Exponential { streak: 1 },
            "swept: {sweep}"
        );
        assert_eq!(
            cooling[0].remaining,
            Duration::from_secs(1),
            "swept: {sweep}"
        );
    }
}

/// The initial backoff doubles on each consecutive 429, also after a 429
/// whose `Retry-After: 0` started no cooldown. (Such a 429 used to be
/// forgotten at once: the next one started the streak again at 1.)
#[tokio::test(start_paused = true)]
async fn a_429_advising_no_wait_still_counts_in_the_streak() {
    let mut run = Run::new((1_000, 60_000, 300_000), false, false);
    let refusal = |retry_after: Option<u64>| Op::Answer {
        pick: 0,
        status: 429,
        headers: Headers {
            retry_after: retry_after.map(Val::Whole),
            ..Headers::default()
        },
    };
    for op in [
        Op::Send { route: 0 },
        refusal(Some(0)),
        Op::Send { route: 0 },
        refusal(None),
    ] {
        run.step(&op).await.expect("step");
    }
    let cooling = run.handle.cooldowns();
    assert_eq!(cooling.len(), 1);
    assert_eq!(cooling[0].reason, Reason::Exponential { streak: 2 });
    assert_eq!(cooling[0].remaining, Duration::from_secs(2));
}

#[test]
fn the_model_reads_headers_as_documented() {
    // A few fixed points, so that the model itself is pinned to the docs.
    let h = Headers {
        retry_after_ms: Some(Val::Garbage("nan")),
        retry_after: Some(Val::Tenths(2, 5)),
        reset: Some((Val::Whole(9_000), true)),
    };
    assert_eq!(h.advice(429), Some((2_500_000_000, Why::RetryAfter)));
    assert_eq!(h.advice(503), Some((2 * SEC + 500 * MS, Why::RetryAfter)));
    assert_eq!(h.advice(200), Some((9 * SEC, Why::ResetDuration)));
    let l = Lengths {
        initial: SEC,
        max_backoff: 5 * SEC,
        max_cooldown: 300 * SEC,
    };
    assert_eq!(
        (l.exponential(1), l.exponential(3), l.exponential(4)),
        (SEC, 4 * SEC, 5 * SEC)
    );
}
