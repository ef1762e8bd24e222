//! The fair queue's response future: waiting for the turn, then calling
//! the inner service with the turn in the request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::turn::Turn;
use crate::concurrency::Permit;
use crate::concurrency::permits::{QueueTicket, Turn as Place};
use crate::error::{BoxError, QueueFull, QueueTimeout};
use crate::redact::Quoted;

/// A request waiting for its turn.
struct Waiter<S, B> {
    inner: S,
    req: Option<http::Request<B>>,
    /// Until the turn came (or the wait ended).
    ticket: Option<QueueTicket>,
    /// The turn, once it came, until the request is sent with it.
    permit: Option<Permit>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// The key's text, for errors.
    key: String,
    max_queue: usize,
}

impl<S, B> Waiter<S, B>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
{
    fn poll_call(&mut self, cx: &mut Context<'_>) -> Poll<Result<S::Future, BoxError>> {
        if let Some(ticket) = &self.ticket {
            match ticket.poll_granted(cx) {
                Poll::Ready(Place::PushedOut) => {
                    if let Some(ticket) = self.ticket.take() {
                        ticket.pushed_out();
                    }
                    let key = std::mem::take(&mut self.key);
                    tracing::debug!(key = %Quoted(&key), "fair queue: pushed out of a full queue");
                    return Poll::Ready(Err(Box::new(QueueFull::new(key, self.max_queue))));
                }
                Poll::Ready(Place::Granted) => {
                    if let Some(ticket) = self.ticket.take() {
                        self.permit = Some(ticket.into_granted().enter());
                    }
                }
                Poll::Pending => {
                    let Some(deadline) = self.deadline.as_mut() else {
                        return Poll::Pending;
                    };
                    ready!(deadline.as_mut().poll(cx));
                    if let Some(ticket) = self.ticket.take() {
                        match ticket.give_up() {
                            // The turn came at the last moment: take it.
                            Err(granted) => self.permit = Some(granted.enter()),
                            Ok(waited) => {
                                let key = std::mem::take(&mut self.key);
                                tracing::debug!(key = %Quoted(&key), ?waited, "fair queue: timeout");
                                return Poll::Ready(Err(Box::new(QueueTimeout::new(key, waited))));
                            }
                        }
                    }
                }
            }
        }
        if let Err(error) = ready!(self.inner.poll_ready(cx)) {
            return Poll::Ready(Err(error.into()));
        }
        let (Some(mut req), Some(permit)) = (self.req.take(), self.permit.take()) else {
            return Poll::Ready(Err(polled_after_completion()));
        };
        req.extensions_mut().insert(Turn::new(permit));
        Poll::Ready(Ok(self.inner.call(req)))
    }
}

pin_project! {
    /// The response future of [`FairQueue`](super::FairQueue).
    ///
    /// Dropped while waiting, the request leaves its key's queue at once.
    pub struct ResponseFuture<Fut, S, B> {
        #[pin]
        state: State<Fut, S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, S, B> {
        Waiting { waiter: Box<Waiter<S, B>> },
        Called { #[pin] future: Fut },
        Failed { error: Option<BoxError> },
    }
}

impl<Fut, S, B> ResponseFuture<Fut, S, B> {
    pub(crate) fn called(future: Fut) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    pub(crate) fn waiting(
        inner: S,
        req: http::Request<B>,
        ticket: QueueTicket,
        deadline: Option<Instant>,
        key: String,
        max_queue: usize,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiter: Box::new(Waiter {
                    inner,
                    req: Some(req),
                    ticket: Some(ticket),
                    permit: None,
                    deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
                    key,
                    max_queue,
                }),
            },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<Fut, S, B> Future for ResponseFuture<Fut, S, B>
where
    S: Service<http::Request<B>, Future = Fut>,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.state.project() {
                StateProj::Called { future } => return future.poll(cx).map_err(Into::into),
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
                StateProj::Waiting { waiter } => match ready!(waiter.poll_call(cx)) {
                    Ok(future) => State::Called { future },
                    Err(error) => State::Failed { error: Some(error) },
                },
            };
            self.as_mut().project().state.set(next);
        }
    }
}

fn polled_after_completion() -> BoxError {
    "fair queue future polled after completion".into()
}

impl<Fut, S, B> fmt::Debug for ResponseFuture<Fut, S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
