//! `FairQueueLayer`: one request per key past it at a time, the others
//! waiting their lane's turn.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::turn::Turn;
use crate::concurrency::fair_lane;
use crate::concurrency::permits::{Acquire, Permits};
use crate::error::{BoxError, QueueFull, QueueTimeout, RateLimited};
use crate::key::{KeyExtractor, key_label};
use crate::stats::KeyTracking;

struct Shared<X, L> {
    /// One permit per key: the turn.
    permits: Arc<Permits>,
    extractor: Arc<X>,
    lanes: Arc<L>,
    max_queue: usize,
    queue_timeout: Option<Duration>,
    max_wait: Option<Duration>,
    /// Named in its refusals (see [`RateLimited::limit`]).
    name: Option<Arc<str>>,
}

impl<X, L> Clone for Shared<X, L> {
    fn clone(&self) -> Self {
        Self {
            permits: self.permits.clone(),
            extractor: self.extractor.clone(),
            lanes: self.lanes.clone(),
            max_queue: self.max_queue,
            queue_timeout: self.queue_timeout,
            max_wait: self.max_wait,
            name: self.name.clone(),
        }
    }
}

/// Lets one request per key at a time past it, until it passes a
/// [`PassTurnLayer`](super::PassTurnLayer) below; the others wait in a
/// fair queue per key, where the lanes read by `L` take turns (see the
/// [module docs](super)).
///
/// A request without a key (the extractor `X` finds none) is not queued.
/// Requests whose lane cannot be read share one lane. Clones of the layer,
/// and every service made from them, share one queue per key.
pub struct FairQueueLayer<X, L> {
    shared: Shared<X, L>,
}

impl<X, L> FairQueueLayer<X, L> {
    /// A fair queue per key read by `extractor`, with lanes read by `lanes`;
    /// unbounded in length and time.
    pub fn new(extractor: X, lanes: L) -> Self {
        Self {
            shared: Shared {
                permits: Permits::new(1, KeyTracking::default()),
                extractor: Arc::new(extractor),
                lanes: Arc::new(lanes),
                max_queue: usize::MAX,
                queue_timeout: None,
                max_wait: None,
                name: None,
            },
        }
    }

    /// Let at most `max_queue` requests wait per key; a newcomer to a full
    /// queue pushes out the newest request of the longest lane (which
    /// fails with [`QueueFull`]), or, in the longest lane itself, is
    /// refused with it. Zero: never wait.
    pub fn with_max_queue(mut self, max_queue: usize) -> Self {
        self.shared.max_queue = max_queue;
        self
    }

    /// Refuse at once, with [`RateLimited`] (its `retry_after` the wait
    /// foreseen), a request whose wait for its turn could take longer than
    /// `max_wait`: the turns that can go before it (its place in its lane
    /// and, for each of its lane's turns up to it, one turn of every other
    /// lane waiting, by their weights; with weights of 1, its place times
    /// the lanes waiting), at the pace turns have been passing on its key. A request let in is not
    /// cut short later (but by [`with_queue_timeout`](Self::with_queue_timeout)):
    /// each lane that starts waiting after it may add one turn to its
    /// wait. The pace is how long turns are held, averaged over the last
    /// few that others waited for (a turn nobody waited for can only lower
    /// it, so a key that has calmed down soon waits again). Until a key
    /// has a pace, a request that waits `max_wait` gives up then, with
    /// [`QueueTimeout`].
    ///
    /// This is the fair queue's form of a waiting layer's `max_wait`: that
    /// layer's own counts from when a request enters it, after its turn
    /// came, and its line is then at most one request long.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.shared.max_wait = Some(max_wait);
        self
    }

    /// Name the limit this queue stands for in its [`RateLimited`]
    /// refusals (as the waiting layer's
    /// [`with_name`](crate::rate_limit::RateLimitLayer::with_name) does).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.shared.name = Some(Arc::from(name.into()));
        self
    }

    /// Give up on a request that has waited `timeout` for its turn, with
    /// [`QueueTimeout`].
    pub fn with_queue_timeout(mut self, timeout: Duration) -> Self {
        self.shared.queue_timeout = Some(timeout);
        self
    }
}

impl<X, L> Clone for FairQueueLayer<X, L> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<X, L> fmt::Debug for FairQueueLayer<X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairQueueLayer")
            .field("extractor", &std::any::type_name::<X>())
            .field("lanes", &std::any::type_name::<L>())
            .field("max_queue", &self.shared.max_queue)
            .field("queue_timeout", &self.shared.queue_timeout)
            .finish()
    }
}

impl<S, X, L> Layer<S> for FairQueueLayer<X, L> {
    type Service = FairQueue<S, X, L>;

    fn layer(&self, inner: S) -> Self::Service {
        FairQueue {
            inner,
            shared: Arc::new(self.shared.clone()),
        }
    }
}

/// The service of [`FairQueueLayer`].
pub struct FairQueue<S, X, L> {
    inner: S,
    shared: Arc<Shared<X, L>>,
}

impl<S, X, L> FairQueue<S, X, L> {
    inner_service_accessors!(inner: S);
}

impl<S: Clone, X, L> Clone for FairQueue<S, X, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, X, L> fmt::Debug for FairQueue<S, X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairQueue")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, X, L> Service<http::Request<B>> for FairQueue<S, X, L>
where
    S: Service<http::Request<B>> + Clone,
    S::Error: Into<BoxError>,
    X: KeyExtractor<http::Request<B>>,
    L: KeyExtractor<http::Request<B>>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let shared = &*self.shared;
        let seed = shared.permits.seed();
        let Ok(key) = seed.hash(&*shared.extractor, &req) else {
            return ResponseFuture::called(self.inner.call(req));
        };
        let lane = fair_lane(seed.hash_weighted(&*shared.lanes, &req));
        let key_text = || key_label(&*shared.extractor, &req).unwrap_or_default();
        let state = shared.permits.key_state(key);
        match state.acquire(shared.max_queue, lane, shared.max_wait, &key_text) {
            Acquire::Granted(permit) => {
                req.extensions_mut().insert(Turn::new(permit));
                ResponseFuture::called(self.inner.call(req))
            }
            Acquire::Queued(ticket) => {
                // Judged by the pace: the wait is not cut short later; not
                // yet known: `max_wait` bounds the wait itself.
                let bound = match shared.max_wait {
                    Some(max_wait) if !ticket.paced() => Some(max_wait),
                    _ => None,
                };
                let timeout = match (shared.queue_timeout, bound) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let deadline = timeout.and_then(|timeout| ticket.since().checked_add(timeout));
                let key = key_text();
                // The ready inner service goes with the waiting request.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(inner, req, ticket, deadline, key, shared.max_queue)
            }
            Acquire::TooLong(wait) => {
                let key = key_text();
                tracing::debug!(key = %crate::redact::Quoted(&key), ?wait, "fair queue: the wait could be too long");
                let mut refused = RateLimited::new(key, wait);
                if let Some(name) = &shared.name {
                    refused = refused.with_limit(&**name);
                }
                ResponseFuture::failed(Box::new(refused))
            }
            Acquire::Full => {
                let key = key_text();
                let error: BoxError = if shared.max_queue == 0 {
                    Box::new(QueueTimeout::new(key, Duration::ZERO))
                } else {
                    Box::new(QueueFull::new(key, shared.max_queue))
                };
                ResponseFuture::failed(error)
            }
        }
    }
}
