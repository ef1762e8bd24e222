//! The backoff response future: reads a shared route, waits out or refuses a cooldown, and reads the answer (a 429, a 503, an exhausted success).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tower_service::Service;

use super::cooldown::{Check, Cooldowns, QueueSlot, Watch};
use crate::error::BoxError;
use crate::key::KeyHash;
use crate::parts::ResponseParts;

// What a route shared through Redis adds to the future; nothing in a build
// without the store.
#[cfg_attr(not(feature = "redis"), path = "future/no_store.rs")]
mod shared;
pub(crate) use shared::SharedRoute;
use shared::{Read, read_done, report};

/// A request whose route's shared cooldown is being read: the inner service
/// that was ready for it, the request, and what it is admitted with.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Reading<S, R> {
    pub(crate) read: Pin<Box<dyn Future<Output = Read> + Send>>,
    /// When the read was sent.
    pub(crate) started: tokio::time::Instant,
    pub(crate) inner: Option<S>,
    pub(crate) req: Option<R>,
    pub(crate) key: KeyHash,
    pub(crate) text: Arc<str>,
    pub(crate) max_wait: Duration,
    pub(crate) engine: Arc<Cooldowns>,
    pub(crate) route: Option<SharedRoute>,
}

/// A request waiting for its route's cooldown to end: the inner service that
/// was ready for it, the request, and its place in the queue.
struct Waiter<S, R> {
    inner: S,
    req: Option<R>,
    slot: QueueSlot,
    /// The shared route, for the response.
    route: Option<SharedRoute>,
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
    pub struct ResponseFuture<Fut, S, R>
    where
        Fut: Future,
    {
        #[pin]
        state: State<Fut, S, R>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Fut, S, R>
    where
        Fut: Future,
    {
        Reading {
            reading: Box<Reading<S, R>>,
        },
        Waiting {
            waiter: Box<Waiter<S, R>>,
        },
        Called {
            #[pin]
            future: Fut,
            watch: Option<Watch>,
            route: Option<SharedRoute>,
        },
        // The response, held until the shared route has heard what it said.
        Reporting {
            report: Pin<Box<dyn Future<Output = ()> + Send>>,
            outcome: Option<Fut::Output>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<Fut: Future, S, R> ResponseFuture<Fut, S, R> {
    pub(crate) fn called(future: Fut, watch: Watch) -> Self {
        Self {
            state: State::Called {
                future,
                watch: Some(watch),
                route: None,
            },
        }
    }

    /// Called without being watched: the layer is switched off.
    pub(crate) fn passed(future: Fut) -> Self {
        Self {
            state: State::Called {
                future,
                watch: None,
                route: None,
            },
        }
    }

    /// Reading the route's shared cooldown first.
    #[cfg(feature = "redis")]
    pub(crate) fn reading(reading: Box<Reading<S, R>>) -> Self {
        Self {
            state: State::Reading { reading },
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
                    route: None,
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
                StateProj::Called {
                    future,
                    watch,
                    route,
                } => {
                    let outcome = ready!(future.poll(cx));
                    let (Ok(response), Some(watch)) = (&outcome, watch.take()) else {
                        return Poll::Ready(outcome.map_err(Into::into));
                    };
                    let said = watch.observe(response.status(), response.headers());
                    match report(said, &watch, route.take()) {
                        Some(report) => self.as_mut().project().state.set(State::Reporting {
                            report,
                            outcome: Some(outcome),
                        }),
                        None => return Poll::Ready(outcome.map_err(Into::into)),
                    }
                }
                StateProj::Reporting { report, outcome } => {
                    ready!(report.as_mut().poll(cx));
                    let Some(outcome) = outcome.take() else {
                        return Poll::Ready(Err(polled_after_completion()));
                    };
                    return Poll::Ready(outcome.map_err(Into::into));
                }
                StateProj::Reading { reading } => {
                    let read = ready!(reading.read.as_mut().poll(cx));
                    let next = read_done(reading, read);
                    self.as_mut().project().state.set(next);
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
                    let route = waiter.route.take();
                    self.as_mut().project().state.set(State::Called {
                        future,
                        watch: Some(watch),
                        route,
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

impl<Fut: Future, S, R> fmt::Debug for ResponseFuture<Fut, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reading { .. } => "reading",
            State::Waiting { .. } => "waiting",
            State::Called { .. } | State::Reporting { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
