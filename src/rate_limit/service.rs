//! `RateLimit`: keys a request, asks its limiter, and refuses, waits or calls the inner service.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::accounting::{Annotate, Cost, Counts};
use super::future::{After, Booking, Refund, ResponseFuture};
use super::handle::RateLimitHandle;
use super::limiter::{Decision, Limiter, RateLimitInfo, Ticket, Want};
use super::policy::Policy;
use super::quota::Quota;
use super::settlement::{Pending, Settlement};
use crate::clock::Nanos;
use crate::error::{BoxError, CostTooHigh, KeyError, RateLimited};
use crate::home::Home;
use crate::key::{KeyExtractor, KeyHash, KeyTexts, key_texts};
use crate::redact::Quoted;

/// Everything a rate-limit service reads per request, shared by its clones.
pub(crate) struct Shared<X, F, A, H> {
    pub(crate) limiter: Arc<Limiter>,
    /// Where handles find `limiter` (see [`Home`]).
    pub(crate) home: Home<Limiter>,
    pub(crate) extractor: Arc<X>,
    pub(crate) cost: F,
    pub(crate) counts: A,
    pub(crate) annotate: H,
    /// In nanoseconds, converted once.
    pub(crate) max_wait: Nanos,
    pub(crate) fallback: Option<(KeyHash, Arc<str>)>,
    /// What its refusals say besides the wait, when set: one pointer, out
    /// of the way of what every request reads.
    pub(crate) refusals: Option<Arc<Refusals>>,
}

/// What a layer's refusals say besides the wait.
#[derive(Clone, Debug, Default)]
pub(crate) struct Refusals {
    /// Named in its refusals (see [`RateLimited::limit`]).
    pub(crate) name: Option<Arc<str>>,
    /// No refusal says to retry sooner than this.
    pub(crate) retry_floor: Duration,
}

impl<X, F: Clone, A: Clone, H: Clone> Clone for Shared<X, F, A, H> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            home: self.home.clone(),
            extractor: self.extractor.clone(),
            cost: self.cost.clone(),
            counts: self.counts.clone(),
            annotate: self.annotate.clone(),
            max_wait: self.max_wait,
            fallback: self.fallback.clone(),
            refusals: self.refusals.clone(),
        }
    }
}

impl<X, F, A, H> fmt::Debug for Shared<X, F, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("limiter", &self.limiter)
            .field("extractor", &std::any::type_name::<X>())
            .field("cost", &std::any::type_name::<F>())
            .field("counts", &std::any::type_name::<A>())
            .field("annotate", &std::any::type_name::<H>())
            .field("max_wait", &Duration::from_nanos(self.max_wait))
            .field("fallback", &self.fallback.as_ref().map(|(_, key)| key))
            .field("refusals", &self.refusals)
            .finish()
    }
}

impl<X, F, A, H> Shared<X, F, A, H> {
    /// The key of `req`: extracted, or the fallback key when it has none.
    #[inline]
    pub(crate) fn key<R>(&self, req: &R) -> Result<KeyHash, BoxError>
    where
        X: KeyExtractor<R>,
    {
        match self.limiter.seed().hash(&*self.extractor, req) {
            Ok(key) => Ok(key),
            // Only a missing key takes the fallback; an ambiguous one is
            // refused.
            Err(e) => match (&e, &self.fallback) {
                (KeyError::Missing(_), Some((key, _))) => Ok(*key),
                _ => Err(no_key(e)),
            },
        }
    }

    /// The refusal of a request on the key `texts` shows, waiting `wait`
    /// (raised to the retry floor) under `quota` of rule `policy`.
    pub(crate) fn refusal(
        &self,
        key: String,
        wait: Duration,
        quota: Quota,
        policy: &str,
    ) -> RateLimited {
        refusal(self.refusals.as_deref(), key, wait, quota, policy)
    }

    /// No refusal says to retry sooner than this.
    pub(crate) fn retry_floor(&self) -> Duration {
        self.refusals
            .as_ref()
            .map_or(Duration::ZERO, |r| r.retry_floor)
    }

    /// What refusals say, to change it.
    pub(crate) fn refusals_mut(&mut self) -> &mut Refusals {
        Arc::make_mut(self.refusals.get_or_insert_with(Default::default))
    }

    /// The texts of `req`'s key parts, for rule lookup, errors and logs.
    pub(crate) fn key_texts<R>(&self, req: &R) -> KeyTexts
    where
        X: KeyExtractor<R>,
    {
        match (key_texts(&*self.extractor, req), &self.fallback) {
            (Ok(texts), _) => texts,
            (Err(_), Some((_, key))) => KeyTexts::plain(&**key),
            (Err(e), None) => KeyTexts::plain(e.wanted()),
        }
    }
}

/// Applies a keyed rate limit to a service; made by
/// [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, X, F, A, H> {
    inner: S,
    shared: Arc<Shared<X, F, A, H>>,
    /// The limiter's policy as this service last saw it, checked against
    /// the limiter's generation on every call (see [`Limiter::refresh`]). A
    /// service that is never called keeps the policy it last saw, and the
    /// quota tables of that policy, until it is called or dropped.
    policy: Arc<Policy>,
}

impl<S, X, F, A, H> RateLimit<S, X, F, A, H> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<X, F, A, H>>) -> Self {
        let policy = shared.limiter.policy();
        Self {
            inner,
            shared,
            policy,
        }
    }

    inner_service_accessors!(inner: S);

    /// A handle on the limiter this service shares with its clones.
    pub fn handle(&self) -> RateLimitHandle {
        RateLimitHandle::new(self.shared.home.cell())
    }
}

impl<S: Clone, X, F, A, H> Clone for RateLimit<S, X, F, A, H> {
    fn clone(&self) -> Self {
        // A clone starts from the policy in force, not from whatever this
        // service last saw: a server's template service is cloned per
        // connection or request and may never be called itself.
        let mut policy = self.policy.clone();
        self.shared.limiter.refresh(&mut policy);
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            policy,
        }
    }
}

impl<S: fmt::Debug, X, F, A, H> fmt::Debug for RateLimit<S, X, F, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, R, X, F, A, H> Service<R> for RateLimit<S, X, F, A, H>
where
    S: Service<R> + Clone,
    S::Error: Into<BoxError>,
    X: KeyExtractor<R>,
    F: Cost<R>,
    A: Counts<S::Response, S::Error>,
    H: Annotate<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, R, A, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let shared = &*self.shared;
        if !shared.limiter.is_enabled() {
            // Switched off: not even the key is looked at.
            return ResponseFuture::go(self.inner.call(req));
        }
        #[cfg(feature = "redis")]
        if let Some(remote) = shared.limiter.remote() {
            let remote = remote.clone();
            return self.call_remote(req, remote);
        }
        let key = match shared.limiter.seed().hash(&*shared.extractor, &req) {
            Ok(key) => key,
            // Only a missing key takes the fallback; an ambiguous one is
            // refused.
            Err(e) => match (&e, &shared.fallback) {
                (KeyError::Missing(_), Some((key, _))) => *key,
                _ => return ResponseFuture::failed(no_key(e)),
            },
        };
        let cost = shared.cost.cost(&req);
        let settlement = shared.cost.settlement(&req);
        let want = Want {
            ticket: !shared.counts.always() || settlement.is_some(),
            info: shared.annotate.wanted(),
        };
        shared.limiter.refresh(&mut self.policy);
        // Never dropped whole: `Go` holds nothing and every other decision
        // moves into `decided` (the enum's drop glue was a call on every
        // request). An arm added here must take the decision out with
        // `ManuallyDrop::into_inner`, or what it holds leaks.
        let decision = ManuallyDrop::new(shared.limiter.acquire(
            &self.policy,
            key,
            cost,
            shared.max_wait,
            &|| shared.key_texts(&req),
            want,
        ));
        match *decision {
            // The common case inline; the rest out of line, so that this
            // stays small.
            Decision::Go => ResponseFuture::go(self.inner.call(req)),
            _ => self.decided(
                ManuallyDrop::into_inner(decision),
                key,
                cost,
                settlement,
                req,
            ),
        }
    }
}

impl<S, X, F, A, H> RateLimit<S, X, F, A, H> {
    /// Everything but a plain admission: a ticket or a note to keep, a wait,
    /// a refusal.
    #[inline(never)]
    fn decided<R>(
        &mut self,
        decision: Decision,
        key: KeyHash,
        cost: u32,
        settlement: Option<Settlement>,
        req: R,
    ) -> ResponseFuture<S::Future, S, R, A, H>
    where
        S: Service<R> + Clone,
        X: KeyExtractor<R>,
        A: Counts<S::Response, S::Error>,
        H: Annotate<S::Response>,
    {
        let shared = &*self.shared;
        let context = DecisionContext {
            limiter: &shared.limiter,
            counts: &shared.counts,
            annotate: &shared.annotate,
            refusals: shared.refusals.as_deref(),
            key,
            cost,
            settlement,
        };
        decide(decision, context, &mut self.inner, req, &|req| {
            shared.key_texts(req)
        })
    }

    /// A request on a limiter that keeps its state in Redis: the key's
    /// texts (the Redis key is named after them), then the decision, one
    /// round trip away unless it is known here.
    #[cfg(feature = "redis")]
    #[inline(never)]
    fn call_remote<R>(
        &mut self,
        req: R,
        remote: Arc<super::limiter::Remote>,
    ) -> ResponseFuture<S::Future, S, R, A, H>
    where
        S: Service<R> + Clone,
        X: KeyExtractor<R>,
        F: Cost<R>,
        A: Counts<S::Response, S::Error>,
        H: Annotate<S::Response>,
    {
        use super::future::Asking;
        use super::limiter::Asked;

        let shared = &*self.shared;
        let texts = match crate::key::key_texts(&*shared.extractor, &req) {
            Ok(texts) => texts,
            Err(e) => match (&e, &shared.fallback) {
                (KeyError::Missing(_), Some((_, key))) => KeyTexts::plain(&**key),
                _ => return ResponseFuture::failed(no_key(e)),
            },
        };
        let key = shared.limiter.seed().hash_parts(texts.parts());
        let cost = shared.cost.cost(&req);
        let settlement = shared.cost.settlement(&req);
        let want = Want {
            // Always: a request dropped during the round trip gives back
            // what Redis booked for it (see `Asking`'s drop).
            ticket: true,
            info: shared.annotate.wanted(),
        };
        shared.limiter.refresh(&mut self.policy);
        let asked = shared.limiter.ask_remote(
            &remote,
            &self.policy,
            key,
            texts.clone(),
            cost,
            shared.max_wait,
            want,
        );
        match asked {
            Asked::Decided(decision) => self.decided(decision, key, cost, settlement, req),
            Asked::Asking(decision) => {
                // The ready inner service goes with the request; this
                // service keeps a fresh clone, to be polled ready again.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::asking(Box::new(Asking {
                    decision,
                    inner,
                    req: Some(req),
                    limiter: shared.limiter.clone(),
                    key,
                    cost,
                    counts: shared.counts.clone(),
                    annotate: shared.annotate.clone(),
                    refusals: shared.refusals.clone(),
                    texts,
                    settlement,
                }))
            }
        }
    }
}

/// What a decision is carried out with, besides the request and its service.
pub(super) struct DecisionContext<'a, A, H> {
    pub(super) limiter: &'a Arc<Limiter>,
    pub(super) counts: &'a A,
    pub(super) annotate: &'a H,
    /// What a refusal says besides the wait (a name, a floor).
    pub(super) refusals: Option<&'a Refusals>,
    pub(super) key: KeyHash,
    pub(super) cost: u32,
    /// The request's settlement, to arm when it is sent.
    pub(super) settlement: Option<Settlement>,
}

/// The response future for `decision` on `req`, with `inner` ready for it;
/// `texts` names the request's key, for refusals and logs.
#[inline]
pub(super) fn decide<S, R, A, H>(
    decision: Decision,
    context: DecisionContext<'_, A, H>,
    inner: &mut S,
    req: R,
    texts: &dyn Fn(&R) -> KeyTexts,
) -> ResponseFuture<S::Future, S, R, A, H>
where
    S: Service<R> + Clone,
    A: Counts<S::Response, S::Error>,
    H: Annotate<S::Response>,
{
    let DecisionContext {
        limiter,
        counts,
        annotate,
        refusals,
        key,
        cost,
        settlement,
    } = context;
    let pending = |ticket: &Ticket| {
        settlement.map(|settlement| {
            Box::new(Pending {
                settlement,
                limiter: limiter.clone(),
                ticket: Box::new(ticket.clone()),
                charged: cost.max(1),
            })
        })
    };
    let refund = |ticket| {
        (!counts.always()).then(|| Refund {
            limiter: limiter.clone(),
            ticket,
            counts: counts.clone(),
        })
    };
    let note = |info: Option<Box<RateLimitInfo>>| info.map(|info| (annotate.clone(), *info));
    match decision {
        // Handled by `call`; here so that the match is whole.
        Decision::Go => ResponseFuture::go(inner.call(req)),
        Decision::Now { ticket, info } => {
            let mut after = After {
                pending: ticket.as_deref().and_then(pending),
                refund: ticket.and_then(refund),
                note: note(info),
                armed: None,
            };
            after.sent();
            ResponseFuture::called(inner.call(req), after)
        }
        Decision::Later {
            until,
            ticket,
            info,
            turn,
            due,
        } => {
            // Owned at once, so that any way out gives its capacity and
            // its place in the key's line back.
            let refund_ticket = (!counts.always()).then(|| ticket.clone());
            let pending = pending(&ticket);
            let booking = Booking::new(limiter.clone(), ticket, key, turn);
            if tracing::enabled!(tracing::Level::DEBUG) {
                let wait = until.saturating_duration_since(tokio::time::Instant::now());
                tracing::debug!(
                    key = %Quoted(&texts(&req).label()),
                    ?wait,
                    "rate limit: waiting for turn"
                );
            }
            let after = After {
                refund: refund_ticket.and_then(refund),
                note: note(info),
                pending,
                armed: None,
            };
            // The ready inner service goes with the waiting request; the
            // caller keeps a fresh clone, to be polled ready again.
            let clone = inner.clone();
            let inner = std::mem::replace(inner, clone);
            ResponseFuture::waiting(until, due, inner, req, booking, after)
        }
        Decision::Denied(denied) => {
            let refused = refusal(
                refusals,
                texts(&req).label(),
                denied.retry_after,
                denied.quota,
                &denied.policy,
            );
            ResponseFuture::failed(Box::new(refused))
        }
        Decision::TooCostly { capacity } => {
            let key = texts(&req).label();
            tracing::debug!(
                key = %Quoted(&key),
                cost,
                capacity,
                "rate limit: cost above capacity"
            );
            let mut too_high = CostTooHigh::new(key, cost, capacity);
            if let Some(name) = refusals.and_then(|r| r.name.as_deref()) {
                too_high = too_high.with_limit(name);
            }
            ResponseFuture::failed(Box::new(too_high))
        }
        #[cfg(feature = "redis")]
        Decision::Unavailable => {
            let key = texts(&req).label();
            tracing::debug!(key = %Quoted(&key), "rate limit: store unavailable, refused");
            ResponseFuture::failed(Box::new(crate::error::StoreUnavailable::new(key)))
        }
    }
}

/// A refusal of `key` for `wait` by `quota` of `policy`, as `refusals`
/// say it (a name, a floor on the wait).
fn refusal(
    refusals: Option<&Refusals>,
    key: String,
    wait: Duration,
    quota: Quota,
    policy: &str,
) -> RateLimited {
    let retry_after = wait.max(refusals.map_or(Duration::ZERO, |r| r.retry_floor));
    tracing::debug!(key = %Quoted(&key), ?retry_after, "rate limit: refused");
    let refused = RateLimited::new(key, retry_after).with_quota(quota, policy);
    match refusals.and_then(|r| r.name.as_ref()) {
        Some(name) => refused.with_limit(&**name),
        None => refused,
    }
}

fn no_key(e: KeyError) -> BoxError {
    tracing::debug!(error = %e, "rate limit: request has no usable key");
    e.into_box()
}
