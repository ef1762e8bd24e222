//! `JointRateLimit`: asks every part for a request, books it in all or none.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use smallvec::SmallVec;
use tower_service::Service;

use super::future::{JointResponseFuture, Refunds};
use super::part::Part;
use crate::error::{BoxError, CostTooHigh};
use crate::key::KeyHash;
use crate::rate_limit::accounting::Counts;
use crate::rate_limit::limiter::{Entrant, JointDecision, acquire_joint};
use crate::rate_limit::policy::Policy;

/// Applies several rate limits as one; made by
/// [`JointRateLimitLayer`](super::JointRateLimitLayer).
pub struct JointRateLimit<S, R, A> {
    inner: S,
    parts: Arc<[Arc<dyn Part<R>>]>,
    counts: A,
    /// Each part's policy as this service last saw it (see
    /// [`RateLimit`](crate::rate_limit::RateLimit)).
    policies: SmallVec<[Arc<Policy>; 2]>,
}

impl<S, R, A> JointRateLimit<S, R, A> {
    pub(crate) fn new(inner: S, parts: Arc<[Arc<dyn Part<R>>]>, counts: A) -> Self {
        let policies = parts.iter().map(|p| p.limiter().policy()).collect();
        Self {
            inner,
            parts,
            counts,
            policies,
        }
    }

    inner_service_accessors!(inner: S);
}

impl<S: Clone, R, A: Clone> Clone for JointRateLimit<S, R, A> {
    fn clone(&self) -> Self {
        let mut policies = self.policies.clone();
        for (part, policy) in self.parts.iter().zip(&mut policies) {
            part.limiter().refresh(policy);
        }
        Self {
            inner: self.inner.clone(),
            parts: self.parts.clone(),
            counts: self.counts.clone(),
            policies,
        }
    }
}

impl<S: fmt::Debug, R, A> fmt::Debug for JointRateLimit<S, R, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.parts.iter().map(|p| p.describe()).collect();
        f.debug_struct("JointRateLimit")
            .field("inner", &self.inner)
            .field("parts", &parts)
            .field("counts", &std::any::type_name::<A>())
            .finish()
    }
}

/// A part taking part in one request: its index, the request's key there
/// and what the request costs there.
type Taking = (usize, KeyHash, u32);

impl<S, R, A> Service<R> for JointRateLimit<S, R, A>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
    A: Counts<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = JointResponseFuture<S::Future, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let mut taking: SmallVec<[Taking; 2]> = SmallVec::new();
        for (i, part) in self.parts.iter().enumerate() {
            // A limit switched off takes no part: not even its key is read.
            if !part.limiter().is_enabled() {
                continue;
            }
            match part.key(&req) {
                Ok(key) => taking.push((i, key, part.cost(&req))),
                Err(e) => return JointResponseFuture::failed(e),
            }
            part.limiter().refresh(&mut self.policies[i]);
        }
        let want_tickets = !self.counts.always();
        let decision = {
            let parts = &self.parts;
            let req = &req;
            let render = |i: usize| move || parts[i].texts(req);
            let renders: SmallVec<[_; 2]> = taking.iter().map(|&(i, _, _)| render(i)).collect();
            let entrants: SmallVec<[Entrant<'_>; 2]> = taking
                .iter()
                .zip(&renders)
                .map(|(&(i, key, cost), parts)| Entrant {
                    limiter: self.parts[i].limiter(),
                    policy: &self.policies[i],
                    key,
                    cost,
                    parts,
                })
                .collect();
            acquire_joint(&entrants, want_tickets)
        };
        match decision {
            JointDecision::Admitted(tickets) => {
                let tickets: SmallVec<[_; 2]> = taking
                    .iter()
                    .zip(tickets)
                    .filter_map(|(&(i, _, _), ticket)| {
                        ticket.map(|t| (self.parts[i].limiter().clone(), t))
                    })
                    .collect();
                let refunds = (!tickets.is_empty()).then(|| Refunds {
                    tickets,
                    counts: self.counts.clone(),
                });
                JointResponseFuture::called(self.inner.call(req), refunds)
            }
            JointDecision::Refused {
                first,
                denied,
                waits,
            } => {
                // The time until every limit that refused would admit,
                // each wait raised to its limit's floor.
                let wait = taking
                    .iter()
                    .zip(&waits)
                    .filter_map(|(&(i, _, _), wait)| {
                        wait.map(|w| w.max(self.parts[i].retry_floor()))
                    })
                    .max()
                    .unwrap_or(Duration::ZERO);
                let part = &self.parts[taking[first].0];
                let refused =
                    part.refusal(part.texts(&req).label(), wait, denied.quota, &denied.policy);
                JointResponseFuture::failed(Box::new(refused))
            }
            JointDecision::TooCostly { index, capacity } => {
                let (i, _, cost) = taking[index];
                let key = self.parts[i].texts(&req).label();
                tracing::debug!(cost, capacity, "rate limit (joint): cost above capacity");
                let mut too_high = CostTooHigh::new(key, cost, capacity);
                if let Some(name) = self.parts[i].name() {
                    too_high = too_high.with_limit(name);
                }
                JointResponseFuture::failed(Box::new(too_high))
            }
        }
    }
}
