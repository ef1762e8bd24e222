//! The joint layer's response future: awaits the inner service, then gives back each part's booking the outcome does not count.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use smallvec::SmallVec;

use crate::error::BoxError;
use crate::rate_limit::accounting::Counts;
use crate::rate_limit::limiter::{Limiter, Ticket};

/// What an admitted request took in each limit, to give back if its
/// outcome does not count.
pub(crate) struct Refunds<A> {
    pub(crate) tickets: SmallVec<[(Arc<Limiter>, Box<Ticket>); 2]>,
    pub(crate) counts: A,
}

impl<A> Refunds<A> {
    fn settle<Res, E>(self, outcome: &Result<Res, E>)
    where
        A: Counts<Res, E>,
    {
        if !self.counts.counts(outcome) {
            for (limiter, ticket) in &self.tickets {
                limiter.give_back(ticket, false);
            }
        }
    }
}

pin_project! {
    /// The response future of [`JointRateLimit`](super::JointRateLimit).
    pub struct JointResponseFuture<Fut, A> {
        #[pin]
        state: State<Fut, A>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, A> {
        Called {
            #[pin]
            future: Fut,
            refunds: Option<Refunds<A>>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut, A> JointResponseFuture<Fut, A> {
    pub(crate) fn called(future: Fut, refunds: Option<Refunds<A>>) -> Self {
        Self {
            state: State::Called { future, refunds },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<Fut, Res, E, A> Future for JointResponseFuture<Fut, A>
where
    Fut: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    A: Counts<Res, E>,
{
    type Output = Result<Res, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, refunds } => {
                let outcome = ready!(future.poll(cx));
                if let Some(refunds) = refunds.take() {
                    refunds.settle(&outcome);
                }
                Poll::Ready(outcome.map_err(Into::into))
            }
            StateProj::Failed { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "joint rate limit future polled after completion".into()))),
        }
    }
}

impl<Fut, A> fmt::Debug for JointResponseFuture<Fut, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("JointResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
