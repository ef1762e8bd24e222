//! A request's turn in its key's fair queue, carried in its extensions
//! until it passes the [`PassTurnLayer`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::concurrency::Permit;

/// A request's turn: while it lives (in the request's extensions), the
/// next request of its key waits in the fair queue. Passed on by
/// [`PassTurn`], or when the request is dropped.
///
/// One per request: a request passing two fair queues holds the inner
/// one's turn only (the outer one's passes when the inner one's is given).
#[derive(Clone)]
pub struct Turn(Arc<Held>);

struct Held {
    permit: Mutex<Option<Permit>>,
    since: Instant,
}

impl Turn {
    pub(crate) fn new(permit: Permit) -> Self {
        Self(Arc::new(Held {
            permit: Mutex::new(Some(permit)),
            since: Instant::now(),
        }))
    }

    /// Pass the turn on to the next request waiting on the key (once; the
    /// clones of this turn then hold nothing). How long it was held is
    /// the key's pace (see [`FairQueueLayer::with_max_wait`](super::FairQueueLayer::with_max_wait)).
    pub fn pass(&self) {
        self.0.pass();
    }
}

impl Held {
    fn pass(&self) {
        if let Some(permit) = self.permit.lock().take() {
            permit.held_for(self.since.elapsed());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.pass();
    }
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn")
            .field("held", &self.0.permit.lock().is_some())
            .finish()
    }
}

/// Marks where a request's [`Turn`] ends: placed inside the layer that
/// makes requests wait, under a [`FairQueueLayer`](super::FairQueueLayer).
#[derive(Clone, Copy, Debug, Default)]
pub struct PassTurnLayer;

impl PassTurnLayer {
    /// The marker layer.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for PassTurnLayer {
    type Service = PassTurn<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PassTurn { inner }
    }
}

/// Passes on the turn of each request it is called with; made by
/// [`PassTurnLayer`].
#[derive(Clone, Debug)]
pub struct PassTurn<S> {
    inner: S,
}

impl<S> PassTurn<S> {
    inner_service_accessors!(inner: S);
}

impl<S, B> Service<http::Request<B>> for PassTurn<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if let Some(turn) = req.extensions_mut().remove::<Turn>() {
            turn.pass();
        }
        self.inner.call(req)
    }
}
