//! The rate limiter's response future: waiting in line, then calling the inner service and settling.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::accounting::{Annotate, Counts};
use super::limiter::{Decision, Limiter, RateLimitInfo, Ticket};
use super::service::{DecisionContext, Refusals, decide};
use super::settlement::{Pending, Settlement};
use crate::error::BoxError;
use crate::key::{KeyHash, KeyTexts};
use crate::stats::Event;

/// Capacity booked for a waiting request, and its place in the key's line.
/// Given up (or dropped) before the request reaches the inner service, it
/// leaves the line and gives back what can be given back.
pub(crate) struct Booking {
    limiter: Arc<Limiter>,
    ticket: Box<Ticket>,
    key: KeyHash,
    turn: Option<u64>,
    arrived: Instant,
    armed: bool,
}

impl Booking {
    pub(crate) fn new(limiter: Arc<Limiter>, ticket: Box<Ticket>, key: KeyHash, turn: u64) -> Self {
        Self {
            limiter,
            ticket,
            key,
            turn: Some(turn),
            arrived: Instant::now(),
            armed: true,
        }
    }

    /// When the waiters booked ahead have not gone yet, the instant to
    /// look again at (the task is woken sooner if they go); see
    /// [`Lines::check`](super::lines::Lines::check).
    fn wait_for_others(&self, cx: &Context<'_>) -> Option<Instant> {
        let turn = self.turn?;
        self.limiter.lines.check(self.key, turn, cx.waker())
    }

    /// The request's turn came and it goes to the inner service.
    fn used(&mut self) {
        self.armed = false;
        let waited = self.arrived.elapsed();
        let stats = &self.limiter.stats;
        stats.record(self.key, Event::Dequeued(Some(waited)), &String::new);
        stats.record(self.key, Event::Admitted, &String::new);
        self.leave_line();
    }

    /// The request will not go: give back its capacity and its place.
    fn give_up(&mut self) {
        if std::mem::replace(&mut self.armed, false) {
            self.limiter
                .stats
                .record(self.key, Event::Dequeued(None), &String::new);
            self.limiter.give_back(&self.ticket, true);
            self.leave_line();
        }
    }

    fn leave_line(&mut self) {
        if let Some(turn) = self.turn.take() {
            self.limiter.lines.leave(self.key, turn);
        }
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        self.give_up();
    }
}

/// What is needed to give capacity back when the outcome does not count.
pub(crate) struct Refund<A> {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) ticket: Box<Ticket>,
    pub(crate) counts: A,
}

/// What is done with a request's outcome besides passing it on: capacity
/// given back when it does not count (only with a classifier), and the
/// response annotated (only with response headers).
pub(crate) struct After<A, H> {
    pub(crate) refund: Option<Refund<A>>,
    pub(crate) note: Option<(H, RateLimitInfo)>,
    /// A settlement to arm when the request is sent.
    pub(crate) pending: Option<Box<Pending>>,
    /// The armed settlement, kept while a refund may give everything back.
    pub(crate) armed: Option<Settlement>,
}

impl<A, H> After<A, H> {
    /// Nothing to do.
    pub(crate) fn nothing() -> Self {
        Self {
            refund: None,
            note: None,
            pending: None,
            armed: None,
        }
    }

    fn is_nothing(&self) -> bool {
        self.refund.is_none() && self.note.is_none() && self.armed.is_none()
    }

    /// The request is sent: its settlement can be settled from now on.
    pub(crate) fn sent(&mut self) {
        if let Some(pending) = self.pending.take() {
            let settlement = self.refund.is_some().then(|| pending.settlement.clone());
            // Only this request's own: one armed for another is not its to
            // disarm.
            if pending.arm() {
                self.armed = settlement;
            }
        }
    }

    /// Annotate the response, give the capacity back if the outcome does
    /// not count, and box the error.
    fn settle<Res, E>(&mut self, mut outcome: Result<Res, E>) -> Result<Res, BoxError>
    where
        E: Into<BoxError>,
        A: Counts<Res, E>,
        H: Annotate<Res>,
    {
        if let (Ok(response), Some((annotate, info))) = (&mut outcome, self.note.take()) {
            annotate.annotate(response, &info);
        }
        if let Some(refund) = self.refund.take() {
            if !refund.counts.counts(&outcome) {
                // Given back whole: nothing is left to settle. Settled
                // already, the settled cost stands: its excess is back.
                let settled = self
                    .armed
                    .take()
                    .is_some_and(|s| !s.disarm(&refund.limiter));
                if !settled {
                    refund.limiter.give_back(&refund.ticket, false);
                }
            }
        }
        outcome.map_err(Into::into)
    }
}

pin_project! {
    /// An inner future with something to do with its outcome.
    struct Settling<Fut, A, H> {
        #[pin]
        future: Fut,
        after: After<A, H>,
    }
}

pin_project! {
    /// A request waiting for its instant: the inner service that was ready
    /// for it, and the request itself.
    struct Waiting<S, R, A, H> {
        #[pin]
        sleep: Sleep,
        // Its own instant has come; from then on `sleep` only bounds the
        // wait for the waiters booked ahead.
        due: bool,
        inner: S,
        req: Option<R>,
        booking: Booking,
        after: After<A, H>,
    }
}

/// A request whose decision is on its way from a shared store (Redis):
/// the inner service that was ready for it, the request, and what the
/// decision is settled with.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Asking<S, R, A, H> {
    pub(crate) decision: Pin<Box<dyn Future<Output = Decision> + Send>>,
    pub(crate) inner: S,
    pub(crate) req: Option<R>,
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) key: KeyHash,
    pub(crate) cost: u32,
    pub(crate) counts: A,
    pub(crate) annotate: H,
    pub(crate) refusals: Option<Arc<Refusals>>,
    pub(crate) texts: KeyTexts,
    pub(crate) settlement: Option<Settlement>,
}

#[cfg(feature = "redis")]
impl<S, R, A, H> Drop for Asking<S, R, A, H> {
    /// Dropped before its decision was read (the caller gave up during the
    /// round trip): Redis may have booked the request all the same. A task
    /// of its own reads the decision and gives back what it booked, and
    /// its place in the key's line.
    fn drop(&mut self) {
        if self.req.is_none() {
            // Decided already.
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let decision = std::mem::replace(&mut self.decision, Box::pin(std::future::pending()));
        let (limiter, key) = (self.limiter.clone(), self.key);
        runtime.spawn(async move {
            match decision.await {
                Decision::Later { ticket, turn, .. } => {
                    // Dropped at once: out of the line, capacity given back.
                    drop(Booking::new(limiter, ticket, key, turn));
                }
                Decision::Now {
                    ticket: Some(ticket),
                    ..
                } => limiter.give_back(&ticket, true),
                _ => {}
            }
        });
    }
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<Fut, S, R, A, H> {
        #[pin]
        state: State<Fut, S, R, A, H>,
    }
}

pin_project! {
    // Every state but the common one is boxed: a request admitted at once,
    // with nothing to do with its outcome, has a future the size of the
    // inner one plus at most a tag (none when the inner future has a niche
    // for it), which keeps it cheap to move. The price is one allocation
    // per request for a classifier or response headers.
    #[project = StateProj]
    enum State<Fut, S, R, A, H> {
        Called {
            #[pin]
            future: Fut,
        },
        Settling {
            settling: Pin<Box<Settling<Fut, A, H>>>,
        },
        Waiting {
            waiting: Pin<Box<Waiting<S, R, A, H>>>,
        },
        Asking {
            asking: Box<Asking<S, R, A, H>>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut, S, R, A, H> State<Fut, S, R, A, H> {
    fn called(future: Fut, after: After<A, H>) -> Self {
        if after.is_nothing() {
            Self::Called { future }
        } else {
            Self::Settling {
                settling: Box::pin(Settling { future, after }),
            }
        }
    }
}

impl<Fut, S, R, A, H> ResponseFuture<Fut, S, R, A, H> {
    /// Admitted, with nothing to do with the outcome.
    #[inline]
    pub(crate) fn go(future: Fut) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    #[inline]
    pub(crate) fn called(future: Fut, after: After<A, H>) -> Self {
        Self {
            state: State::called(future, after),
        }
    }

    pub(crate) fn waiting(
        until: Instant,
        due: bool,
        inner: S,
        req: R,
        booking: Booking,
        after: After<A, H>,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiting: Box::pin(Waiting {
                    sleep: tokio::time::sleep_until(until),
                    // Due already (in line behind due waiters): no timer,
                    // which would round up to its next millisecond.
                    due,
                    inner,
                    req: Some(req),
                    booking,
                    after,
                }),
            },
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn asking(asking: Box<Asking<S, R, A, H>>) -> Self {
        Self {
            state: State::Asking { asking },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<Fut, S, R, A, H> Future for ResponseFuture<Fut, S, R, A, H>
where
    S: Service<R, Future = Fut> + Clone,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    A: Counts<S::Response, S::Error>,
    H: Annotate<S::Response>,
{
    type Output = Result<S::Response, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The common state is polled here; the others out of line, so that
        // this stays small enough to inline into the caller.
        if let StateProj::Called { future } = self.as_mut().project().state.project() {
            return future.poll(cx).map_err(Into::into);
        }
        self.poll_other(cx)
    }
}

impl<Fut, S, R, A, H> ResponseFuture<Fut, S, R, A, H>
where
    S: Service<R, Future = Fut> + Clone,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    A: Counts<S::Response, S::Error>,
    H: Annotate<S::Response>,
{
    /// Every state but a plain `Called` one, which is reached here too
    /// once a wait is over.
    #[inline(never)]
    fn poll_other(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, BoxError>> {
        loop {
            match self.as_mut().project().state.project() {
                StateProj::Called { future } => return future.poll(cx).map_err(Into::into),
                StateProj::Settling { settling } => {
                    let settling = settling.as_mut().project();
                    let outcome = ready!(settling.future.poll(cx));
                    return Poll::Ready(settling.after.settle(outcome));
                }
                StateProj::Waiting { waiting } => {
                    let mut waiting = waiting.as_mut().project();
                    if !*waiting.due {
                        ready!(waiting.sleep.as_mut().poll(cx));
                        *waiting.due = true;
                    }
                    if let Some(until) = waiting.booking.wait_for_others(cx) {
                        // Woken when the waiters ahead leave, or at `until`
                        // (always ahead of now), whichever is first.
                        waiting.sleep.as_mut().reset(until);
                        ready!(waiting.sleep.as_mut().poll(cx));
                        continue;
                    }
                    if let Err(error) = ready!(waiting.inner.poll_ready(cx)) {
                        // The request never went: nothing to refund, and
                        // ending the future drops its booking now (capacity
                        // and place in line given back), not to hold up the
                        // waiters behind it until the future is dropped.
                        waiting.after.refund = None;
                        let outcome = waiting.after.settle(Err(error));
                        self.as_mut()
                            .project()
                            .state
                            .set(State::Failed { error: None });
                        return Poll::Ready(outcome);
                    }
                    let Some(req) = waiting.req.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    waiting.after.sent();
                    let future = waiting.inner.call(req);
                    // Called before the line is left, so the next waiter
                    // cannot reach the inner service first.
                    waiting.booking.used();
                    let after = std::mem::replace(waiting.after, After::nothing());
                    self.as_mut()
                        .project()
                        .state
                        .set(State::called(future, after));
                }
                StateProj::Asking { asking } => {
                    let asking = &mut **asking;
                    let decision = ready!(asking.decision.as_mut().poll(cx));
                    let Some(req) = asking.req.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let texts = std::mem::take(&mut asking.texts);
                    let context = DecisionContext {
                        limiter: &asking.limiter,
                        counts: &asking.counts,
                        annotate: &asking.annotate,
                        refusals: asking.refusals.as_deref(),
                        key: asking.key,
                        cost: asking.cost,
                        settlement: asking.settlement.take(),
                    };
                    let next = decide(decision, context, &mut asking.inner, req, &|_| {
                        texts.clone()
                    });
                    self.as_mut().project().state.set(next.state);
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
            }
        }
    }
}

fn polled_after_completion() -> BoxError {
    "rate limit future polled after completion".into()
}

impl<Fut, S, R, A, H> fmt::Debug for ResponseFuture<Fut, S, R, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Asking { .. } => "asking",
            State::Called { .. } | State::Settling { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
