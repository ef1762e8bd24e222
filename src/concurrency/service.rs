//! `Concurrency`: takes a permit per key, or queues the request for one.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::ResponseFuture;
use super::handle::ConcurrencyHandle;
use super::hold::HoldPermit;
use super::permits::{Acquire, Lane, LastKey, Permits, QueueTicket};
use crate::error::{BoxError, KeyError, QueueFull, QueueTimeout};
use crate::home::Home;
use crate::key::{GlobalKey, KeyBuilder, KeyExtractor, KeyHash, key_label};
use crate::redact::{Escaped, Quoted};

/// Everything a concurrency service reads per request, shared by its clones.
pub(crate) struct Shared<X, L = NoLanes> {
    pub(crate) permits: Arc<Permits>,
    /// Where handles find `permits` (see [`Home`]).
    pub(crate) home: Home<Permits>,
    pub(crate) extractor: Arc<X>,
    /// Reads each waiter's lane (see [`ConcurrencyLayer::with_fair_share`](super::ConcurrencyLayer::with_fair_share)).
    pub(crate) lanes: Arc<L>,
    /// Most requests waiting per key; `usize::MAX` when unbounded.
    pub(crate) max_queue: usize,
    pub(crate) queue_timeout: Option<Duration>,
    pub(crate) release_at_headers: bool,
    pub(crate) fallback: Option<(KeyHash, Arc<str>)>,
}

impl<X, L> Clone for Shared<X, L> {
    fn clone(&self) -> Self {
        Self {
            permits: self.permits.clone(),
            home: self.home.clone(),
            extractor: self.extractor.clone(),
            lanes: self.lanes.clone(),
            max_queue: self.max_queue,
            queue_timeout: self.queue_timeout,
            release_at_headers: self.release_at_headers,
            fallback: self.fallback.clone(),
        }
    }
}

impl<X, L: 'static> fmt::Debug for Shared<X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max_queue = (self.max_queue != usize::MAX).then_some(self.max_queue);
        f.debug_struct("Concurrency")
            .field("max_in_flight", &self.permits.max())
            .field("max_queue", &max_queue)
            .field("queue_timeout", &self.queue_timeout)
            .field("release_at_headers", &self.release_at_headers)
            .field("extractor", &std::any::type_name::<X>())
            .field(
                "fair_share",
                &(!is_no_lanes::<L>()).then(std::any::type_name::<L>),
            )
            .field("fallback", &self.fallback.as_ref().map(|(_, key)| key))
            .finish()
    }
}

impl<X, L> Shared<X, L> {
    /// A zero timeout means no waiting at all: a request that would queue
    /// times out at once.
    fn no_wait(&self) -> bool {
        self.queue_timeout == Some(Duration::ZERO)
    }

    /// Most requests that may wait per key.
    #[inline]
    fn max_queue(&self) -> usize {
        if self.no_wait() { 0 } else { self.max_queue }
    }

    /// The error for `req`, refused because its key's queue is full (or no
    /// waiting is allowed).
    #[inline(never)]
    fn refusal<R>(&self, req: &R) -> BoxError
    where
        X: KeyExtractor<R>,
    {
        let key = self.key_text(req);
        if self.no_wait() {
            tracing::debug!(key = %Quoted(&key), "concurrency: no permit free and no wait allowed");
            Box::new(QueueTimeout::new(key, Duration::ZERO))
        } else {
            let max_queue = self.max_queue;
            tracing::debug!(key = %Quoted(&key), max_queue, "concurrency: queue full");
            Box::new(QueueFull::new(key, max_queue))
        }
    }

    /// `req`'s lane in its key's line: one lane for all without fair
    /// share, and for the requests whose lane cannot be read.
    #[inline]
    fn lane<R>(&self, req: &R) -> Lane
    where
        L: KeyExtractor<R>,
    {
        if is_no_lanes::<L>() {
            return Lane::ONE;
        }
        fair_lane(self.permits.seed().hash_weighted(&*self.lanes, req))
    }

    /// `req`'s key as it may be shown, for errors, logs and per-key
    /// counters (secret parts as fingerprints).
    fn key_text<R>(&self, req: &R) -> String
    where
        X: KeyExtractor<R>,
    {
        match (key_label(&*self.extractor, req), &self.fallback) {
            (Ok(label), _) => label,
            (Err(_), Some((_, key))) => Escaped(key).to_string(),
            (Err(e), None) => e.wanted().to_owned(),
        }
    }
}

/// Caps the requests in flight per key; made by
/// [`ConcurrencyLayer`](super::ConcurrencyLayer).
///
/// Each service remembers the state of the last key it served, so a run of
/// requests on one key skips the key lookup; that key's state stays in memory
/// while remembered. A clone starts remembering nothing. With
/// [`GlobalKey`] there is no lookup at all: the one key's state is at hand.
pub struct Concurrency<S, X, L = NoLanes> {
    inner: S,
    shared: Arc<Shared<X, L>>,
    last: LastKey,
}

impl<S, X, L> Concurrency<S, X, L> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<X, L>>) -> Self {
        Self {
            inner,
            shared,
            last: LastKey::default(),
        }
    }

    inner_service_accessors!(inner: S);

    /// A handle on the permits this service shares with its clones.
    pub fn handle(&self) -> ConcurrencyHandle {
        ConcurrencyHandle::new(self.shared.home.cell())
    }
}

impl<S: Clone, X, L> Clone for Concurrency<S, X, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            // A clone starts with no key of its own.
            last: LastKey::default(),
        }
    }
}

impl<S: fmt::Debug, X, L: 'static> fmt::Debug for Concurrency<S, X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Concurrency")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, R, X, L> Service<R> for Concurrency<S, X, L>
where
    S: Service<R> + Clone,
    S::Error: Into<BoxError>,
    S::Response: HoldPermit,
    X: KeyExtractor<R>,
    L: KeyExtractor<R>,
{
    type Response = <S::Response as HoldPermit>::Held;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, req: R) -> Self::Future {
        let shared = &*self.shared;
        let state = if is_global::<X>() {
            // One key: nothing to read, hash or look up.
            shared.permits.single()
        } else {
            let key = match shared.permits.seed().hash(&*shared.extractor, &req) {
                Ok(key) => key,
                // Only a missing key takes the fallback; an ambiguous one is
                // refused.
                Err(e) => match (&e, &shared.fallback) {
                    (KeyError::Missing(_), Some((key, _))) => *key,
                    // Switched off, nothing is refused: it goes without a
                    // permit (looked at only here, off the common path).
                    _ if !shared.permits.is_enabled() => {
                        return ResponseFuture::passed(self.inner.call(req));
                    }
                    _ => return ResponseFuture::failed(no_key(e)),
                },
            };
            self.last.state(key, &shared.permits)
        };
        let lane = shared.lane(&req);
        match state.acquire(shared.max_queue(), lane, None, &|| shared.key_text(&req)) {
            Acquire::Granted(permit) => {
                ResponseFuture::called(self.inner.call(req), permit, shared.release_at_headers)
            }
            Acquire::Queued(ticket) => self.wait(req, ticket),
            // No `max_wait` asked: never too long.
            Acquire::Full | Acquire::TooLong(_) => ResponseFuture::failed(shared.refusal(&req)),
        }
    }
}

impl<S, X, L> Concurrency<S, X, L> {
    /// The response future of a request that waits in its key's queue.
    #[inline(never)]
    fn wait<R>(&mut self, req: R, ticket: QueueTicket) -> ResponseFuture<S::Future, S, R>
    where
        S: Service<R> + Clone,
        X: KeyExtractor<R>,
    {
        let shared = &*self.shared;
        let key = shared.key_text(&req);
        tracing::debug!(key = %Quoted(&key), "concurrency: waiting for a permit");
        let deadline = shared
            .queue_timeout
            .and_then(|timeout| ticket.since().checked_add(timeout));
        // The ready inner service goes with the waiting request; this
        // service keeps a fresh clone, to be polled ready again.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(
            inner,
            req,
            ticket,
            deadline,
            key,
            shared.max_queue,
            shared.release_at_headers,
        )
    }
}

/// Whether `X` is [`GlobalKey`]: decided when `call` is compiled for `X`,
/// so the check costs nothing at run time.
#[inline(always)]
fn is_global<X: 'static>() -> bool {
    TypeId::of::<X>() == TypeId::of::<GlobalKey>()
}

/// A request's lane from its lane key and weight: never lane 0, which is
/// the one lane of [`NoLanes`] (the lines do not remember it as the last
/// served); a request whose lane cannot be read is in a lane of its own
/// kind, of weight 1.
#[inline]
pub(crate) fn fair_lane(lane: Result<(KeyHash, u32), KeyError>) -> Lane {
    lane.map_or(
        Lane {
            id: u64::MAX,
            weight: 1,
        },
        |(lane, weight)| Lane {
            id: lane.0.max(1),
            weight,
        },
    )
}

/// Whether `L` is [`NoLanes`], decided at compile time as [`is_global`].
#[inline(always)]
fn is_no_lanes<L: 'static>() -> bool {
    TypeId::of::<L>() == TypeId::of::<NoLanes>()
}

/// No fair share: a key's waiters form one line, in arrival order. The
/// default lanes of a [`ConcurrencyLayer`](super::ConcurrencyLayer); see
/// [`with_fair_share`](super::ConcurrencyLayer::with_fair_share).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLanes;

impl<R> KeyExtractor<R> for NoLanes {
    fn extract(&self, _req: &R, _key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        Ok(())
    }
}

fn no_key(e: KeyError) -> BoxError {
    tracing::debug!(error = %e, "concurrency: request has no usable key");
    e.into_box()
}
