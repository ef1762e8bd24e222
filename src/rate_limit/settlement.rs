//! Settling an admitted request's cost once its real cost is known: an LLM
//! request is admitted on an estimate of its tokens, and its answer says
//! how many it used.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::limiter::{Limiter, Ticket};

/// The cost of one request, to settle once its real cost is known.
///
/// Put one in a request's extensions and send the request through a
/// [`RateLimitLayer`](super::RateLimitLayer) whose cost is
/// [`Estimated`](super::Estimated). When the request is admitted and sent to
/// the inner service, the settlement is armed with what the request was
/// charged; [`settle`](Self::settle) it with the real cost once that is
/// known (after the response, or at the end of a streamed body): the
/// difference is given back or charged, in every quota that counts
/// [cost](super::Unit::Cost). Dropped unsettled, the estimate stands.
///
/// - **Less than charged:** the excess is given back as a refund is (see
///   [`Counts`](super::Counts)): never more than was taken, never what came
///   back by itself meanwhile (a token bucket refills on its own), never
///   across a reset or a retune, and a token bucket with requests waiting
///   keeps it spent. Settling never lets more through than the quota.
/// - **More than charged:** the difference is charged, without refusal (the
///   request has happened): a token bucket is charged after its latest
///   booking, at most one burst (so one bad estimate cannot silence a key
///   longer than a full refill), also when it is empty already, a window's or turn's use grows in the window or turn the
///   request was counted in (a window that has ended is past caring), and
///   later requests wait it out. Nothing booked before moves.
/// - Settled once: later calls do nothing. A request refused, dropped
///   while waiting, given back because its outcome did not count, or
///   admitted without booking anything (no quota, a dry run, the limiter
///   switched off) leaves it unarmed, and settling it does nothing. One
///   settled before its outcome was known (by the inner service) keeps its
///   settled cost even if the outcome does not count: its excess is back
///   already, and giving back the whole too would give the excess twice.
/// - A [`JointRateLimitLayer`](super::JointRateLimitLayer) arms none: its
///   limits' estimates stand.
/// - One settlement settles every rate-limit layer on the path that
///   charged an estimate (a caller's quota and a route's, say), each by
///   the difference from what it charged.
/// - With a [shared store](super::RateLimitLayer::with_store), the excess
///   of an estimate is given back to Redis as a refund is, in a task of its
///   own, to every algorithm (a sliding window's booking is written again
///   at its real cost, at its instant); a charge above the estimate is made
///   the same way, without refusal, as in process. If that call fails, the
///   estimate stands.
///
/// ```
/// use std::time::Duration;
/// use tower::{Service, ServiceExt};
/// use tower_throttle::key::GlobalKey;
/// use tower_throttle::rate_limit::{Estimated, Quota, RateLimitLayer, Settlement};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_throttle::error::BoxError> {
/// // 1,000 tokens a minute, a request charged 300 until its answer says.
/// let estimate = |_req: &http::Request<()>| 300;
/// let layer = RateLimitLayer::new(Quota::per_minute(1_000)?, GlobalKey)
///     .with_cost(Estimated(estimate));
/// let mut svc = tower::ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(()))
///     });
///
/// let mut sent = 0;
/// loop {
///     let settlement = Settlement::new();
///     let mut req = http::Request::new(());
///     req.extensions_mut().insert(settlement.clone());
///     if svc.ready().await?.call(req).await.is_err() {
///         break;
///     }
///     sent += 1;
///     assert_eq!(settlement.charged(), Some(300));
///     // The answer used 100 tokens: 200 come back.
///     assert!(settlement.settle(100));
/// }
/// // Each is admitted on its estimate: the 8th fits (700 + 300), the 9th
/// // does not (800 + 300). Eight, not the three the estimates allow.
/// assert_eq!(sent, 8);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Settlement {
    state: Arc<Mutex<State>>,
}

enum State {
    /// Armed by each layer that admitted the request and sent it on,
    /// outermost first; none yet, or none booked anything.
    Open(Vec<Armed>),
    /// Settled, or given back whole by every layer.
    Done,
}

impl Default for State {
    fn default() -> Self {
        Self::Open(Vec::new())
    }
}

/// What one layer charged.
struct Armed {
    limiter: Arc<Limiter>,
    ticket: Box<Ticket>,
    charged: u32,
}

impl Settlement {
    /// An unarmed settlement, to put in a request's extensions.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the request was charged at admission (by the outermost layer
    /// that armed it), while it can be settled: `None` before it is sent,
    /// after it is settled, and when it cannot be (see the type's docs).
    pub fn charged(&self) -> Option<u32> {
        match &*self.state.lock() {
            State::Open(armed) => armed.first().map(|a| a.charged),
            State::Done => None,
        }
    }

    /// The request's real cost was `actual`: give back or charge the
    /// difference from what it was charged, in every layer that armed it.
    /// True when it was settled now; false when there was nothing to
    /// settle (see the type's docs).
    pub fn settle(&self, actual: u32) -> bool {
        let mut state = self.state.lock();
        // Not sent yet, it may still be: left unarmed.
        if matches!(&*state, State::Open(armed) if armed.is_empty()) {
            return false;
        }
        let State::Open(armed) = std::mem::replace(&mut *state, State::Done) else {
            return false;
        };
        drop(state);
        for armed in armed {
            if actual != armed.charged {
                armed.limiter.settle(&armed.ticket, actual);
            }
        }
        true
    }

    /// Armed by `limiter`'s layer: the request charged `charged` on
    /// `ticket` was sent. False when that layer armed it before (a
    /// settlement reused for a second request stays with the first), or
    /// it was settled.
    pub(crate) fn arm(&self, limiter: Arc<Limiter>, ticket: Box<Ticket>, charged: u32) -> bool {
        let mut state = self.state.lock();
        let State::Open(armed) = &mut *state else {
            return false;
        };
        if armed.iter().any(|a| Arc::ptr_eq(&a.limiter, &limiter)) {
            return false;
        }
        armed.push(Armed {
            limiter,
            ticket,
            charged,
        });
        true
    }

    /// `limiter`'s layer gives the request's capacity back whole: nothing
    /// of it to settle. False when it was settled already (before the
    /// outcome was known): then the excess is back, and giving back the
    /// whole as well would give it twice.
    pub(crate) fn disarm(&self, limiter: &Arc<Limiter>) -> bool {
        let mut state = self.state.lock();
        let State::Open(armed) = &mut *state else {
            return false;
        };
        let Some(i) = armed.iter().position(|a| Arc::ptr_eq(&a.limiter, limiter)) else {
            return false;
        };
        armed.remove(i);
        if armed.is_empty() {
            // Given back whole by every layer: never armed again.
            *state = State::Done;
        }
        true
    }
}

/// Shows whether it is armed, never the key.
impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, charged) = match &*self.state.lock() {
            State::Open(armed) if armed.is_empty() => ("unarmed", None),
            State::Open(armed) => ("armed", armed.first().map(|a| a.charged)),
            State::Done => ("done", None),
        };
        f.debug_struct("Settlement")
            .field("state", &state)
            .field("charged", &charged)
            .finish()
    }
}

/// A settlement to arm when its request is sent.
pub(crate) struct Pending {
    pub(crate) settlement: Settlement,
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) ticket: Box<Ticket>,
    pub(crate) charged: u32,
}

impl Pending {
    /// False when the settlement was armed before, for another request.
    pub(crate) fn arm(self) -> bool {
        self.settlement.arm(self.limiter, self.ticket, self.charged)
    }
}
