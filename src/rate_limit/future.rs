use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::accounting::{Annotate, Counts};
use super::limiter::{Limiter, RateLimitInfo, Ticket};
use crate::error::BoxError;
use crate::key::KeyHash;
use crate::stats::Event;

/// Capacity booked for a waiting request. Dropped before the request reaches
/// the inner service, it leaves the queue and gives back what can be given
/// back.
pub(crate) struct Booking {
    limiter: Arc<Limiter>,
    ticket: Box<Ticket>,
    key: KeyHash,
    arrived: Instant,
    armed: bool,
}

impl Booking {
    pub(crate) fn new(limiter: Arc<Limiter>, ticket: Box<Ticket>, key: KeyHash) -> Self {
        Self {
            limiter,
            ticket,
            key,
            arrived: Instant::now(),
            armed: true,
        }
    }

    /// The request's turn came and it goes to the inner service.
    fn used(&mut self) {
        self.armed = false;
        let waited = self.arrived.elapsed();
        let stats = &self.limiter.stats;
        stats.record(self.key, Event::Dequeued(Some(waited)), &String::new);
        stats.record(self.key, Event::Admitted, &String::new);
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        if self.armed {
            self.limiter
                .stats
                .record(self.key, Event::Dequeued(None), &String::new);
            self.limiter.give_back(&self.ticket, true);
        }
    }
}

/// What is needed to give capacity back when the outcome does not count.
pub(crate) struct Refund<A> {
    pub(crate) limiter: Arc<Limiter>,
    pub(crate) ticket: Box<Ticket>,
    pub(crate) counts: A,
}

/// A request waiting for its instant: the inner service that was ready for
/// it, and the request itself.
struct Waiter<S, R> {
    inner: S,
    req: Option<R>,
    booking: Booking,
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit).
    pub struct ResponseFuture<Fut, S, R, A, H> {
        #[pin]
        state: State<Fut, S, R>,
        // Only with a classifier; small, since its ticket is boxed.
        refund: Option<Refund<A>>,
        note: Option<Box<(H, RateLimitInfo)>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, S, R> {
        Waiting {
            sleep: Pin<Box<Sleep>>,
            waiter: Box<Waiter<S, R>>,
        },
        Called {
            #[pin]
            future: Fut,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut, S, R, A, H> ResponseFuture<Fut, S, R, A, H> {
    pub(crate) fn called(
        future: Fut,
        refund: Option<Refund<A>>,
        note: Option<Box<(H, RateLimitInfo)>>,
    ) -> Self {
        Self {
            state: State::Called { future },
            refund,
            note,
        }
    }

    pub(crate) fn waiting(
        until: Instant,
        inner: S,
        req: R,
        booking: Booking,
        refund: Option<Refund<A>>,
        note: Option<Box<(H, RateLimitInfo)>>,
    ) -> Self {
        Self {
            state: State::Waiting {
                sleep: Box::pin(tokio::time::sleep_until(until)),
                waiter: Box::new(Waiter {
                    inner,
                    req: Some(req),
                    booking,
                }),
            },
            refund,
            note,
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            refund: None,
            note: None,
        }
    }
}

impl<Fut, S, R, A, H> Future for ResponseFuture<Fut, S, R, A, H>
where
    S: Service<R, Future = Fut>,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    A: Counts<S::Response, S::Error>,
    H: Annotate<S::Response>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            match this.state.project() {
                StateProj::Called { future } => {
                    let mut outcome = ready!(future.poll(cx));
                    if this.refund.is_none() && this.note.is_none() {
                        // The common case: nothing to give back or add.
                        return Poll::Ready(outcome.map_err(Into::into));
                    }
                    if let (Ok(response), Some(note)) = (&mut outcome, this.note.take()) {
                        let (annotate, info) = &*note;
                        annotate.annotate(response, info);
                    }
                    return Poll::Ready(settle(this.refund, outcome));
                }
                StateProj::Waiting { sleep, waiter } => {
                    ready!(sleep.as_mut().poll(cx));
                    if let Err(error) = ready!(waiter.inner.poll_ready(cx)) {
                        return Poll::Ready(settle(this.refund, Err(error)));
                    }
                    let Some(req) = waiter.req.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    waiter.booking.used();
                    let future = waiter.inner.call(req);
                    self.as_mut().project().state.set(State::Called { future });
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

/// Give the capacity back if the outcome does not count, and box the error.
#[inline]
fn settle<Res, E, A>(
    refund: &mut Option<Refund<A>>,
    outcome: Result<Res, E>,
) -> Result<Res, BoxError>
where
    E: Into<BoxError>,
    A: Counts<Res, E>,
{
    if let Some(refund) = refund.take() {
        if !refund.counts.counts(&outcome) {
            refund.limiter.give_back(&refund.ticket, false);
        }
    }
    outcome.map_err(Into::into)
}

impl<Fut, S, R, A, H> fmt::Debug for ResponseFuture<Fut, S, R, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
