//! `ConcurrencyLayer` against a reference model (tests/support/concurrency_model.rs)
//! over generated histories: requests on two or three keys, answers, bodies
//! read or dropped, waiters dropped, paused time, live resizing, switching
//! off and on, evicting idle keys. After every step the layer must agree with
//! the model exactly: where every request is, the counts in flight and
//! queued, the counters, the keys held.
//!
//! How the order of grants is observed: every request is a real response
//! future, driven by hand with `tokio_test::task::spawn` under a paused
//! current-thread runtime. The layer hands a freed permit to a waiter when
//! the permit is given back (not when the waiter is polled), so after each
//! step the test polls every pending future, newest first, until nothing
//! moves; the set that went on to the upstream must be exactly the waiters
//! the model grants, which are always the oldest ones. A newer waiter served
//! before an older one shows up as a request in the wrong stage.
//!
//! `TT_PROPTEST_CASES` sets the number of histories per property.

#![cfg(feature = "test-util")]

#[path = "support/props.rs"]
mod props;
mod support;

#[path = "support/concurrency_model.rs"]
mod model;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use model::{Config, FRAMES, Model, Seen};
use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio_test::task::{self, Spawn};
use tower::Service;
use tower_throttle::BoxError;
use tower_throttle::concurrency::{
    Concurrency, ConcurrencyBody, ConcurrencyHandle, ConcurrencyLayer,
};
use tower_throttle::error::{QueueFull, QueueTimeout};
use tower_throttle::key::{GlobalKey, HeaderKey, KeyExtractor, key_label};
use tower_throttle::stats::KeyStats;

// ------------------------------------------------------------ the upstream

/// An answer's body: [`FRAMES`] data frames. One that `knows_end` says it
/// ended with the last frame; the other only by yielding nothing after it.
#[derive(Debug)]
struct Frames {
    left: u8,
    knows_end: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
    }

    fn is_end_stream(&self) -> bool {
        self.knows_end && self.left == 0
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Frames>, BoxError>> + Send>>;

/// Answers each request when the test says, through the request's gate
/// (`true`: a body, `false`: a failure); notes which requests it was sent.
#[derive(Clone, Default)]
struct Upstream {
    gates: Arc<Mutex<HashMap<usize, oneshot::Receiver<bool>>>>,
    called: Arc<Mutex<Vec<usize>>>,
}

fn header(req: &http::Request<()>, name: &str) -> usize {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

impl Service<http::Request<()>> for Upstream {
    type Response = http::Response<Frames>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<()>) -> Answer {
        let id = header(&req, "x-id");
        let knows_end = header(&req, "x-end") == 1;
        self.called.lock().push(id);
        let gate = self.gates.lock().remove(&id);
        Box::pin(async move {
            let ok = match gate {
                Some(gate) => gate.await == Ok(true),
                None => false,
            };
            if ok {
                Ok(http::Response::new(Frames {
                    left: FRAMES,
                    knows_end,
                }))
            } else {
                Err("upstream failed".into())
            }
        })
    }
}

// ------------------------------------------------------------- histories

#[derive(Clone, Debug)]
enum Op {
    /// A request on key `key`; `slow`: the upstream answers only when told.
    Start {
        key: usize,
        slow: bool,
        fails: bool,
        knows_end: bool,
    },
    /// The upstream answers the `pick`th request still calling.
    Respond {
        pick: usize,
        ok: bool,
    },
    /// Read one frame of the `pick`th body.
    Read {
        pick: usize,
    },
    /// The caller drops the `pick`th live request (waiting, calling, or
    /// its body).
    Drop {
        pick: usize,
    },
    Advance(Advance),
    Resize {
        max: usize,
    },
    Switch {
        on: bool,
    },
    Evict,
}

/// How far paused time moves; relative to the queue timeout for the
/// boundaries.
#[derive(Clone, Copy, Debug)]
enum Advance {
    Zero,
    Ms(u64),
    JustBeforeTimeout,
    Timeout,
    JustAfterTimeout,
}

impl Advance {
    fn ms(self, config: &Config) -> u64 {
        let timeout = config.timeout_ms.unwrap_or(10);
        match self {
            Self::Zero => 0,
            Self::Ms(ms) => ms,
            Self::JustBeforeTimeout => timeout.saturating_sub(1),
            Self::Timeout => timeout,
            Self::JustAfterTimeout => timeout + 1,
        }
    }
}

fn config() -> impl Strategy<Value = Config> {
    (
        1..=3usize,
        prop_oneof![Just(None), (0..=3usize).prop_map(Some)],
        prop_oneof![
            2 => Just(None),
            1 => Just(Some(0)),
            4 => (1..=20u64).prop_map(Some),
        ],
    )
        .prop_map(|(max, max_queue, timeout_ms)| Config {
            max,
            max_queue,
            timeout_ms,
        })
}

fn op(keys: usize) -> impl Strategy<Value = Op> {
    let advance = prop_oneof![
        Just(Advance::Zero),
        (1..=25u64).prop_map(Advance::Ms),
        Just(Advance::JustBeforeTimeout),
        Just(Advance::Timeout),
        Just(Advance::JustAfterTimeout),
    ];
    prop_oneof![
        8 => (0..keys, prop::bool::weighted(0.3), prop::bool::weighted(0.1), any::<bool>())
            .prop_map(|(key, slow, fails, knows_end)| Op::Start { key, slow, fails, knows_end }),
        2 => (0..4usize, prop::bool::weighted(0.8)).prop_map(|(pick, ok)| Op::Respond { pick, ok }),
        3 => (0..4usize).prop_map(|pick| Op::Read { pick }),
        4 => (0..6usize).prop_map(|pick| Op::Drop { pick }),
        4 => advance.prop_map(Op::Advance),
        1 => (1..=4usize).prop_map(|max| Op::Resize { max }),
        1 => any::<bool>().prop_map(|on| Op::Switch { on }),
        1 => Just(Op::Evict),
    ]
}

fn history(keys: usize) -> impl Strategy<Value = (Config, Vec<Op>)> {
    (config(), prop::collection::vec(op(keys), 1..40))
}

// ------------------------------------------------------------- the runner

type Svc<X> = Concurrency<Upstream, X>;
type Fut<X> = <Svc<X> as Service<http::Request<()>>>::Future;
type Held = http::Response<ConcurrencyBody<Frames>>;

/// What the test holds of each request.
enum Live<X: KeyExtractor<http::Request<()>>> {
    Pending(Spawn<Fut<X>>),
    Body(ConcurrencyBody<Frames>),
    Done(Seen),
}

struct Run<X: KeyExtractor<http::Request<()>>> {
    model: Model,
    svc: Svc<X>,
    handle: ConcurrencyHandle,
    upstream: Upstream,
    gates: HashMap<usize, oneshot::Sender<bool>>,
    live: Vec<Live<X>>,
    /// The layer is keyed by `GlobalKey` (one key, no store).
    global: bool,
}

impl<X: KeyExtractor<http::Request<()>> + 'static> Run<X> {
    fn new(layer: ConcurrencyLayer<X>, config: Config, keys: usize, global: bool) -> Self {
        let mut layer = layer;
        if let Some(max) = config.max_queue {
            layer = layer.with_max_queue(max);
        }
        if let Some(ms) = config.timeout_ms {
            layer = layer.with_queue_timeout(Duration::from_millis(ms));
        }
        let handle = layer.handle();
        let upstream = Upstream::default();
        let svc = tower::Layer::layer(&layer, upstream.clone());
        Self {
            model: Model::new(config, keys),
            svc,
            handle,
            upstream,
            gates: HashMap::new(),
            live: Vec::new(),
            global,
        }
    }

    /// The `pick`th of the requests the model has in a stage `want` takes.
    fn pick(&self, pick: usize, want: impl Fn(Seen) -> bool) -> Option<usize> {
        let ids = self.model.ids(want);
        (!ids.is_empty()).then(|| ids[pick % ids.len()])
    }

    async fn step(&mut self, op: &Op) {
        match *op {
            Op::Start {
                key,
                slow,
                fails,
                knows_end,
            } => {
                let id = self.model.start(key, slow, fails, knows_end);
                let (tx, rx) = oneshot::channel();
                self.upstream.gates.lock().insert(id, rx);
                if slow {
                    self.gates.insert(id, tx);
                } else {
                    let _ = tx.send(!fails);
                }
                let req = request(key, id, knows_end);
                let mut cx = Context::from_waker(futures::task::noop_waker_ref());
                assert!(self.svc.poll_ready(&mut cx).is_ready());
                self.live
                    .push(Live::Pending(task::spawn(self.svc.call(req))));
            }
            Op::Respond { pick, ok } => {
                if let Some(id) = self.pick(pick, |s| s == Seen::Calling) {
                    self.model.respond(id, ok);
                    if let Some(gate) = self.gates.remove(&id) {
                        let _ = gate.send(ok);
                    }
                }
            }
            Op::Read { pick } => {
                if let Some(id) = self.pick(pick, |s| matches!(s, Seen::Body { .. })) {
                    self.model.read_frame(id);
                    if let Live::Body(body) = &mut self.live[id] {
                        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
                        let _ = Pin::new(body).poll_frame(&mut cx);
                    }
                }
            }
            Op::Drop { pick } => {
                let live = |s| matches!(s, Seen::Waiting | Seen::Calling | Seen::Body { .. });
                if let Some(id) = self.pick(pick, live) {
                    self.model.drop_req(id);
                    self.live[id] = Live::Done(Seen::Dropped);
                }
            }
            Op::Advance(advance) => {
                let ms = advance.ms(&self.model.config);
                self.model.advance(ms);
                tokio::time::advance(Duration::from_millis(ms)).await;
            }
            Op::Resize { max } => {
                let enabled = self.model.enabled;
                self.model.retune(max, enabled);
                self.handle
                    .set_max_in_flight(max)
                    .expect("max is at least 1");
            }
            Op::Switch { on } => {
                let max = self.model.max;
                self.model.retune(max, on);
                self.handle.set_enabled(on);
            }
            Op::Evict => {
                let want = self.model.evict();
                let got = self.handle.evict_idle();
                let want = if self.global { 0 } else { want };
                assert_eq!(got, want, "keys evicted");
            }
        }
        self.settle();
    }

    /// Poll every pending request, newest first, until none moves.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            for id in (0..self.live.len()).rev() {
                let Live::Pending(fut) = &mut self.live[id] else {
                    continue;
                };
                let Poll::Ready(outcome) = fut.poll() else {
                    continue;
                };
                moved = true;
                self.live[id] = match outcome {
                    Ok(response) => Live::Body(Held::into_body(response)),
                    Err(e) => Live::Done(refusal(&e)),
                };
            }
            if !moved {
                return;
            }
        }
    }

    /// Where request `id` is, as the layer shows it.
    fn seen(&self, id: usize) -> Seen {
        match &self.live[id] {
            Live::Pending(_) if self.upstream.called.lock().contains(&id) => Seen::Calling,
            Live::Pending(_) => Seen::Waiting,
            Live::Body(body) => Seen::Body {
                holds: body.holds_permit(),
            },
            Live::Done(seen) => *seen,
        }
    }

    /// The layer and the model agree, and the limits hold.
    fn check(&self) -> Result<(), String> {
        let model = &self.model;
        for id in 0..self.live.len() {
            let (got, want) = (self.seen(id), model.reqs[id].seen);
            if got != want {
                return Err(format!("request {id}: layer {got:?}, model {want:?}"));
            }
        }
        // In flight per key, counted from what holds a permit, never above
        // the limit (or above what was in flight when it was lowered).
        for key in 0..model.keys.len() {
            let mut holding = 0;
            for id in 0..self.live.len() {
                let held = matches!(self.seen(id), Seen::Calling | Seen::Body { holds: true });
                if held && model.reqs[id].key == key {
                    holding += 1;
                }
            }
            if holding != model.keys[key].in_flight || holding > model.bound(key) {
                return Err(format!(
                    "key {key}: {holding} hold permits; model {} in flight, bound {}",
                    model.keys[key].in_flight,
                    model.bound(key)
                ));
            }
        }
        let stats = self.handle.stats();
        let a = &stats.aggregate;
        let in_flight: usize = model.keys.iter().map(|k| k.in_flight).sum();
        let queued: usize = model.keys.iter().map(|k| k.waiters.len()).sum();
        let got = (a.in_flight, a.queued_now, a.admitted, a.rejected, a.waited);
        let want = (
            Some(in_flight as u64),
            queued as u64,
            model.admitted,
            model.rejected,
            model.waited,
        );
        if got != want || a.total_wait_ms != model.total_wait_ms as f64 {
            return Err(format!(
                "stats (in_flight, queued, admitted, rejected, waited): layer {got:?} \
                 {} ms, model {want:?} {} ms",
                a.total_wait_ms, model.total_wait_ms
            ));
        }
        if !self.global {
            for (key, k) in model.keys.iter().enumerate() {
                // The key as the stats show it (a secret-looking header is
                // shown as a fingerprint).
                let name =
                    key_label(&route(), &request(key, 0, false)).map_err(|e| e.to_string())?;
                let per_key = stats.keys.iter().find(|s| s.key == name);
                let got = per_key.map_or((Some(0), 0), |s: &KeyStats| (s.in_flight, s.queued_now));
                let want = (Some(k.in_flight as u64), k.waiters.len() as u64);
                if got != want {
                    return Err(format!(
                        "{name} (in_flight, queued): layer {got:?}, model {want:?}"
                    ));
                }
            }
        }
        let keys = if self.global {
            usize::from(!model.is_idle(0))
        } else {
            model.stored.len()
        };
        if self.handle.key_count() != keys {
            return Err(format!(
                "key_count: layer {}, model {keys}",
                self.handle.key_count()
            ));
        }
        Ok(())
    }
}

/// Request `id` on key `key`.
fn request(key: usize, id: usize, knows_end: bool) -> http::Request<()> {
    http::Request::builder()
        .header("x-route", format!("k{key}"))
        .header("x-id", id)
        .header("x-end", usize::from(knows_end))
        .body(())
        .expect("valid request")
}

fn route() -> HeaderKey {
    HeaderKey::new("x-route").expect("valid header name")
}

/// What a refused request's error says.
fn refusal(e: &BoxError) -> Seen {
    if e.downcast_ref::<QueueFull>().is_some() {
        Seen::Full
    } else if let Some(timeout) = e.downcast_ref::<QueueTimeout>() {
        // Whole milliseconds only: anything else can match no model time.
        let whole = timeout.waited.subsec_nanos() % 1_000_000 == 0;
        let ms = u64::try_from(timeout.waited.as_millis()).unwrap_or(u64::MAX);
        Seen::TimedOut {
            waited_ms: if whole { ms } else { u64::MAX },
        }
    } else {
        Seen::Failed
    }
}

/// Runs `ops` against a layer and the model; the first disagreement.
fn run<X>(layer: ConcurrencyLayer<X>, config: Config, keys: usize, ops: &[Op]) -> Result<(), String>
where
    X: KeyExtractor<http::Request<()>> + Send + Sync + 'static,
{
    let global = std::any::TypeId::of::<X>() == std::any::TypeId::of::<GlobalKey>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut run = Run::new(layer, config, keys, global);
        for (i, op) in ops.iter().enumerate() {
            run.step(op).await;
            run.check()
                .map_err(|e| format!("after step {i} ({op:?}): {e}\nhistory: {ops:#?}"))?;
        }
        // Everything dropped: every permit and place comes back.
        let live = |s| matches!(s, Seen::Waiting | Seen::Calling | Seen::Body { .. });
        while !run.model.ids(live).is_empty() {
            run.step(&Op::Drop { pick: 0 }).await;
        }
        run.check()
            .map_err(|e| format!("after dropping all: {e}"))?;
        let stats = run.handle.stats().aggregate;
        if (stats.in_flight, stats.queued_now) != (Some(0), 0) {
            return Err(format!("left behind: {stats:?}"));
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(props::config(512))]

    /// Three keys read from a header: every step agrees with the model.
    #[test]
    fn keyed_permits_match_the_model((config, ops) in history(3)) {
        let layer = ConcurrencyLayer::new(config.max, route())
            .expect("max is at least 1")
            .with_key_stats(8);
        let outcome = run(layer, config, 3, &ops);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }

    /// `GlobalKey`: one key, its own lock-free path that counts admissions
    /// in its permit word.
    #[test]
    fn global_permits_match_the_model((config, ops) in history(1)) {
        let layer = ConcurrencyLayer::new(config.max, GlobalKey).expect("max is at least 1");
        let outcome = run(layer, config, 1, &ops);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
