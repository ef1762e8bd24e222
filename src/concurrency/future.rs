//! The concurrency response future: waiting for a permit in FIFO order, then calling the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::hold::HoldPermit;
use super::permits::{Granted, Permit, QueueTicket, Turn};
use crate::error::{BoxError, QueueFull, QueueTimeout};
use crate::redact::Quoted;

/// Where a waiting request stands.
enum Place {
    /// In the key's queue.
    Queued(QueueTicket),
    /// Granted its permit, waiting for the inner service to be ready.
    Holding(Granted),
    /// Between the two (never seen by a poll).
    Moving,
}

/// A request waiting for its permit: the inner service that was ready for
/// it, the request, and its place.
struct Waiter<S, R> {
    inner: S,
    req: Option<R>,
    place: Place,
    /// When the wait is given up; `None` waits as long as it takes.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The key's text, for the timeout error.
    key: String,
    /// The line's length, for the error of a waiter pushed out of it.
    max_queue: usize,
}

impl<S, R> Waiter<S, R> {
    /// Wait for the permit, then for the inner service, and call it.
    /// Kept apart from the response future's hot path.
    #[inline(never)]
    fn poll_call(&mut self, cx: &mut Context<'_>) -> Poll<Result<(S::Future, Permit), BoxError>>
    where
        S: Service<R>,
        S::Error: Into<BoxError>,
    {
        if let Place::Queued(ticket) = &self.place {
            let turn = ticket.poll_granted(cx);
            if turn == Poll::Ready(Turn::PushedOut) {
                if let Place::Queued(ticket) = std::mem::replace(&mut self.place, Place::Moving) {
                    ticket.pushed_out();
                }
                let key = std::mem::take(&mut self.key);
                tracing::debug!(key = %Quoted(&key), "concurrency: pushed out of a full line");
                return Poll::Ready(Err(Box::new(QueueFull::new(key, self.max_queue))));
            }
            let granted = turn.is_ready();
            if !granted {
                let Some(deadline) = self.deadline.as_mut() else {
                    return Poll::Pending;
                };
                ready!(deadline.as_mut().poll(cx));
            }
            if let Place::Queued(ticket) = std::mem::replace(&mut self.place, Place::Moving) {
                let permit = if granted {
                    ticket.into_granted()
                } else {
                    match ticket.give_up() {
                        // Granted at the last moment: take it.
                        Err(permit) => permit,
                        Ok(waited) => {
                            let key = std::mem::take(&mut self.key);
                            tracing::debug!(
                                key = %Quoted(&key),
                                ?waited,
                                "concurrency: queue timeout"
                            );
                            return Poll::Ready(Err(Box::new(QueueTimeout::new(key, waited))));
                        }
                    }
                };
                self.place = Place::Holding(permit);
            }
        }
        if let Err(error) = ready!(self.inner.poll_ready(cx)) {
            return Poll::Ready(Err(error.into()));
        }
        let (Some(req), Place::Holding(permit)) = (
            self.req.take(),
            std::mem::replace(&mut self.place, Place::Moving),
        ) else {
            return Poll::Ready(Err(polled_after_completion()));
        };
        let future = self.inner.call(req);
        Poll::Ready(Ok((future, permit.enter())))
    }
}

pin_project! {
    /// The response future of [`Concurrency`](super::Concurrency).
    ///
    /// Dropped while waiting, the request leaves its key's queue at once and
    /// never takes a permit; dropped after it took one, the permit is given
    /// back.
    pub struct ResponseFuture<Fut, S, R> {
        #[pin]
        state: State<Fut, S, R>,
        release_at_headers: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, S, R> {
        Waiting {
            waiter: Box<Waiter<S, R>>,
        },
        Called {
            #[pin]
            future: Fut,
            permit: Option<Permit>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut, S, R> ResponseFuture<Fut, S, R> {
    pub(crate) fn called(future: Fut, permit: Permit, release_at_headers: bool) -> Self {
        Self {
            state: State::Called {
                future,
                permit: Some(permit),
            },
            release_at_headers,
        }
    }

    /// Called without a permit: the layer is switched off and the request
    /// has no usable key.
    pub(crate) fn passed(future: Fut) -> Self {
        Self {
            state: State::Called {
                future,
                permit: None,
            },
            release_at_headers: false,
        }
    }

    pub(crate) fn waiting(
        inner: S,
        req: R,
        ticket: QueueTicket,
        deadline: Option<Instant>,
        key: String,
        max_queue: usize,
        release_at_headers: bool,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiter: Box::new(Waiter {
                    inner,
                    req: Some(req),
                    place: Place::Queued(ticket),
                    deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
                    key,
                    max_queue,
                }),
            },
            release_at_headers,
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            release_at_headers: false,
        }
    }
}

impl<Fut, S, R> Future for ResponseFuture<Fut, S, R>
where
    S: Service<R, Future = Fut>,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
{
    type Output = Result<<S::Response as HoldPermit>::Held, BoxError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The common case inline: the inner service was called at once.
        let this = self.as_mut().project();
        match this.state.project() {
            StateProj::Called { future, permit } => {
                poll_called(future, permit, *this.release_at_headers, cx)
            }
            _ => self.poll_rest(cx),
        }
    }
}

impl<Fut, S, R> ResponseFuture<Fut, S, R>
where
    S: Service<R, Future = Fut>,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
{
    /// `poll` for a request that waited for its permit, or failed.
    #[inline(never)]
    fn poll_rest(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<<S::Response as HoldPermit>::Held, BoxError>> {
        loop {
            let this = self.as_mut().project();
            match this.state.project() {
                StateProj::Called { future, permit } => {
                    return poll_called(future, permit, *this.release_at_headers, cx);
                }
                StateProj::Waiting { waiter } => {
                    let next = match ready!(waiter.poll_call(cx)) {
                        Ok((future, permit)) => State::Called {
                            future,
                            permit: Some(permit),
                        },
                        Err(error) => State::Failed { error: Some(error) },
                    };
                    self.as_mut().project().state.set(next);
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
            }
        }
    }
}

/// Poll the inner service's response future; a response takes the permit
/// with it (see [`HoldPermit`]), a failure gives it back.
#[inline(always)]
fn poll_called<Fut, T, E>(
    future: Pin<&mut Fut>,
    permit: &mut Option<Permit>,
    release_at_headers: bool,
    cx: &mut Context<'_>,
) -> Poll<Result<T::Held, BoxError>>
where
    Fut: Future<Output = Result<T, E>>,
    T: HoldPermit,
    E: Into<BoxError>,
{
    let outcome = ready!(future.poll(cx));
    let permit = permit.take();
    Poll::Ready(match outcome {
        Ok(response) if !release_at_headers => Ok(response.hold(permit)),
        Ok(response) => {
            drop(permit);
            Ok(response.hold(None))
        }
        // An error ends the request: its permit goes back now, not when the
        // future is dropped.
        Err(error) => {
            drop(permit);
            Err(error.into())
        }
    })
}

fn polled_after_completion() -> BoxError {
    "concurrency future polled after completion".into()
}

impl<Fut, S, R> fmt::Debug for ResponseFuture<Fut, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { waiter } => match waiter.place {
                Place::Queued(_) => "queued",
                Place::Holding(_) | Place::Moving => "granted",
            },
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("release_at_headers", &self.release_at_headers)
            .finish()
    }
}
