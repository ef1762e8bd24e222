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

#[cfg(feature = "redis")]
use super::cooldown::Admit;
use super::cooldown::{Check, Cooldowns, QueueSlot, Watch};
use crate::error::BoxError;
use crate::key::KeyHash;
use crate::parts::ResponseParts;

/// A route whose cooldown is shared: the store, the route's Redis key, and
/// how long the response may be held for its report (what is left of the
/// store's timeout after the read: a request spends at most one timeout on
/// Redis).
#[cfg(feature = "redis")]
pub(crate) type SharedRoute = Box<(crate::redis::RedisStore, String, Duration)>;
/// Without a store there is no shared route.
#[cfg(not(feature = "redis"))]
pub(crate) type SharedRoute = std::convert::Infallible;

/// What reading a shared route gives.
#[cfg(feature = "redis")]
type Read = Result<super::redis::SharedCooldown, crate::redis::StoreError>;
#[cfg(not(feature = "redis"))]
type Read = std::convert::Infallible;

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

/// What a response said, sent to its shared route; `None` when there is
/// nothing to send (no store, or nothing said).
#[cfg(feature = "redis")]
fn report(
    said: Option<super::Said>,
    watch: &Watch,
    route: Option<SharedRoute>,
) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
    let (said, route) = (said?, route?);
    let engine = watch.engine().clone();
    let (key, generation, text) = (watch.key(), watch.shared_generation, watch.text());
    let lengths = engine.lengths();
    let hold = route.2;
    let report = async move {
        let (store, name, _) = *route;
        let reported = super::redis::report(
            &store,
            &name,
            generation,
            said,
            &lengths.backoff,
            lengths.max_cooldown,
        )
        .await;
        match reported {
            Ok(shared) => engine.merge_shared(key, shared, &text),
            Err(_) => crate::stats::StoreCounters::add(&engine.store_counters.errors),
        }
    };
    // In a task of its own, so that a caller who drops the response future
    // meanwhile does not keep the other replicas from hearing of it. The
    // response waits for it only as long as the read left of the timeout:
    // with Redis stalled, a read and a report would take two.
    Some(match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(report);
            Box::pin(async move {
                let _ = tokio::time::timeout(hold, task).await;
            })
        }
        Err(_) => Box::pin(report),
    })
}

#[cfg(not(feature = "redis"))]
fn report<T>(
    _said: Option<T>,
    _watch: &Watch,
    _route: Option<SharedRoute>,
) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
    None
}

/// The state after the route's shared cooldown was read: as in process,
/// with what Redis said folded in first.
#[cfg(feature = "redis")]
fn read_done<Fut, S, R>(reading: &mut Reading<S, R>, read: Read) -> State<Fut, S, R>
where
    Fut: Future,
    S: Service<R, Future = Fut>,
{
    use crate::stats::StoreCounters;

    let engine = reading.engine.clone();
    match read {
        Ok(shared) => engine.merge_shared(reading.key, shared, &reading.text),
        Err(_) => {
            StoreCounters::add(&engine.store_counters.errors);
            let closed = engine
                .store
                .as_ref()
                .is_some_and(|s| s.error_mode() == crate::redis::OnError::Closed);
            if closed {
                let error = crate::error::StoreUnavailable::new(reading.text.to_string());
                return State::Failed {
                    error: Some(Box::new(error)),
                };
            }
            // Open: this replica's own cooldowns.
            StoreCounters::add(&engine.store_counters.fallbacks);
        }
    }
    let (Some(mut inner), Some(req)) = (reading.inner.take(), reading.req.take()) else {
        return State::Failed {
            error: Some(polled_after_completion()),
        };
    };
    let text = reading.text.clone();
    let spent = reading.started.elapsed();
    let route = reading.route.take().map(|mut route| {
        route.2 = route.0.timeout().saturating_sub(spent);
        route
    });
    match engine.admit(reading.key, reading.max_wait, &|| text.clone()) {
        Admit::Go(watch) => State::Called {
            future: inner.call(req),
            watch: Some(watch),
            route,
        },
        Admit::Wait(slot, head) => State::Waiting {
            waiter: Box::new(Waiter {
                inner,
                req: Some(req),
                slot,
                route,
                head,
                sleep: None,
            }),
        },
        Admit::Refused(error) => State::Failed {
            error: Some(Box::new(error)),
        },
    }
}

#[cfg(not(feature = "redis"))]
fn read_done<Fut, S, R>(_reading: &mut Reading<S, R>, read: Read) -> State<Fut, S, R>
where
    Fut: Future,
{
    match read {}
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
