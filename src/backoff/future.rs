use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tower_service::Service;

use super::cooldown::{Check, QueueSlot, Watch};
use crate::error::BoxError;
use crate::parts::ResponseParts;

/// A request waiting for its route's cooldown to end: the inner service that
/// was ready for it, the request, and its place in the queue.
struct Waiter<S, R> {
    inner: S,
    req: Option<R>,
    slot: QueueSlot,
    /// Fires when this request becomes the head of the queue; `None` once it
    /// is.
    head: Option<oneshot::Receiver<()>>,
    /// The head's timer, reset when a new cooldown moves the end.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Waiter<S, R>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    /// Wait to be the head, then for the cooldown's end, then for the inner
    /// service. Ready with the watch for the response once the request may
    /// go.
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<Result<Watch, BoxError>> {
        if let Some(head) = self.head.as_mut() {
            // An error means the sender is gone, which only happens when
            // the queue no longer holds this request ahead of others.
            let _ = ready!(Pin::new(head).poll(cx));
            self.head = None;
        }
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
            }
            match self.slot.check() {
                Check::Cooling(until) => match self.sleep.as_mut() {
                    Some(sleep) => sleep.as_mut().reset(until),
                    None => self.sleep = Some(Box::pin(tokio::time::sleep_until(until))),
                },
                Check::TooLong(error) => {
                    self.slot.leave(true);
                    return Poll::Ready(Err(Box::new(error)));
                }
                Check::Clear(watch) => {
                    // Looked at again on every poll: a cooldown that starts
                    // while the inner service is not ready is still obeyed.
                    return match self.inner.poll_ready(cx) {
                        Poll::Ready(Ok(())) => Poll::Ready(Ok(watch)),
                        Poll::Ready(Err(error)) => {
                            self.slot.leave(false);
                            Poll::Ready(Err(error.into()))
                        }
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }
}

pin_project! {
    /// The response future of [`Backoff429`](super::Backoff429).
    pub struct ResponseFuture<Fut, S, R> {
        #[pin]
        state: State<Fut, S, R>,
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
            watch: Option<Watch>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut, S, R> ResponseFuture<Fut, S, R> {
    pub(crate) fn called(future: Fut, watch: Watch) -> Self {
        Self {
            state: State::Called {
                future,
                watch: Some(watch),
            },
        }
    }

    /// Called without being watched: the layer is switched off.
    pub(crate) fn passed(future: Fut) -> Self {
        Self {
            state: State::Called {
                future,
                watch: None,
            },
        }
    }

    pub(crate) fn waiting(
        inner: S,
        req: R,
        slot: QueueSlot,
        head: Option<oneshot::Receiver<()>>,
    ) -> Self {
        Self {
            state: State::Waiting {
                waiter: Box::new(Waiter {
                    inner,
                    req: Some(req),
                    slot,
                    head,
                    sleep: None,
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

impl<Fut, S, R> Future for ResponseFuture<Fut, S, R>
where
    S: Service<R, Future = Fut>,
    Fut: Future<Output = Result<S::Response, S::Error>>,
    S::Error: Into<BoxError>,
    S::Response: ResponseParts,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project().state.project() {
                StateProj::Called { future, watch } => {
                    let outcome = ready!(future.poll(cx));
                    if let (Ok(response), Some(watch)) = (&outcome, watch.take()) {
                        watch.observe(response.status(), response.headers());
                    }
                    return Poll::Ready(outcome.map_err(Into::into));
                }
                StateProj::Waiting { waiter } => {
                    let watch = match ready!(waiter.poll_turn(cx)) {
                        Ok(watch) => watch,
                        Err(error) => {
                            self.as_mut()
                                .project()
                                .state
                                .set(State::Failed { error: None });
                            return Poll::Ready(Err(error));
                        }
                    };
                    let Some(req) = waiter.req.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    let future = waiter.inner.call(req);
                    // Only now may the next waiter go: the inner service
                    // sees the requests in arrival order.
                    waiter.slot.release();
                    self.as_mut().project().state.set(State::Called {
                        future,
                        watch: Some(watch),
                    });
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)));
                }
            }
        }
    }
}

fn polled_after_completion() -> BoxError {
    "backoff future polled after completion".into()
}

impl<Fut, S, R> fmt::Debug for ResponseFuture<Fut, S, R> {
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
