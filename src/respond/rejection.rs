//! `Rejection`: what refused a request, found in its error chain.

use std::time::Duration;

use http::StatusCode;

use crate::error::{
    AmbiguousKey, BodyTooLarge, BodyUnreadable, BoxError, CoolingDown, CostTooHigh, MissingKey,
    QueueFull, QueueTimeout, RateLimited, StoreUnavailable,
};

/// One of this crate's refusals, found in a [`BoxError`]: what a response
/// (or a client) needs to know about it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Rejection<'a> {
    /// A rate limit refused the request.
    RateLimited(&'a RateLimited),
    /// The request costs more than its key can ever admit.
    CostTooHigh(&'a CostTooHigh),
    /// The request has no key and no fallback was set.
    MissingKey(&'a MissingKey),
    /// The request's key can be read more than one way (a JSON body giving
    /// the key field twice).
    AmbiguousKey(&'a AmbiguousKey),
    /// A concurrency queue was full.
    QueueFull(&'a QueueFull),
    /// A request waited in a concurrency queue as long as allowed.
    QueueTimeout(&'a QueueTimeout),
    /// An upstream cooldown is on.
    CoolingDown(&'a CoolingDown),
    /// The request body is longer than a
    /// [`BufferBodyLayer`](crate::buffer::BufferBodyLayer) reads.
    BodyTooLarge(&'a BodyTooLarge),
    /// The request body could not be read whole.
    BodyUnreadable(&'a BodyUnreadable),
    /// The shared store (Redis) did not answer and the layer fails closed.
    StoreUnavailable(&'a StoreUnavailable),
}

impl<'a> Rejection<'a> {
    /// The refusal in `error`, if it is one of this crate's.
    pub fn of(error: &'a BoxError) -> Option<Self> {
        let e = &**error;
        if let Some(x) = e.downcast_ref() {
            return Some(Self::RateLimited(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::QueueFull(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::QueueTimeout(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::CoolingDown(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::CostTooHigh(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::AmbiguousKey(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::BodyTooLarge(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::BodyUnreadable(x));
        }
        if let Some(x) = e.downcast_ref() {
            return Some(Self::StoreUnavailable(x));
        }
        e.downcast_ref().map(Self::MissingKey)
    }

    /// The status a server answers with: 429 for a rate limit, 503 for a
    /// full queue, a queue timeout, a cooldown or a store that is away, 413 for a request that can
    /// never fit or a body over the limit, 400 for one without a key, with an
    /// ambiguous one, or with a body that could not be read.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::QueueFull(_)
            | Self::QueueTimeout(_)
            | Self::CoolingDown(_)
            | Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::CostTooHigh(_) | Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MissingKey(_) | Self::AmbiguousKey(_) | Self::BodyUnreadable(_) => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    /// How long the client should wait before trying again, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited(e) => Some(e.retry_after),
            Self::CoolingDown(e) => Some(e.retry_after),
            _ => None,
        }
    }

    /// The name of the limit that refused, when its layer has one
    /// ([`with_name`](crate::rate_limit::RateLimitLayer::with_name)): a rate
    /// limit's refusal, or a cost no admission of it could ever fit.
    pub fn limit(&self) -> Option<&str> {
        match self {
            Self::RateLimited(e) => e.limit.as_deref(),
            Self::CostTooHigh(e) => e.limit.as_deref(),
            _ => None,
        }
    }

    /// A short machine-readable code: `rate_limited`, `queue_full`, …
    pub fn code(&self) -> &'static str {
        match self {
            Self::RateLimited(_) => "rate_limited",
            Self::CostTooHigh(_) => "cost_too_high",
            Self::MissingKey(_) => "missing_key",
            Self::AmbiguousKey(_) => "ambiguous_key",
            Self::QueueFull(_) => "queue_full",
            Self::QueueTimeout(_) => "queue_timeout",
            Self::CoolingDown(_) => "cooling_down",
            Self::BodyTooLarge(_) => "body_too_large",
            Self::BodyUnreadable(_) => "bad_body",
            Self::StoreUnavailable(_) => "store_unavailable",
        }
    }

    /// The error's message.
    pub fn message(&self) -> String {
        match self {
            Self::RateLimited(e) => e.to_string(),
            Self::CostTooHigh(e) => e.to_string(),
            Self::MissingKey(e) => e.to_string(),
            Self::AmbiguousKey(e) => e.to_string(),
            Self::QueueFull(e) => e.to_string(),
            Self::QueueTimeout(e) => e.to_string(),
            Self::CoolingDown(e) => e.to_string(),
            Self::BodyTooLarge(e) => e.to_string(),
            Self::BodyUnreadable(e) => e.to_string(),
            Self::StoreUnavailable(e) => e.to_string(),
        }
    }
}

/// Whole seconds, rounded up: what `Retry-After` and the reset fields say.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// What a refusal response answers, in its extensions: set by
/// [`ThrottleResponseLayer`](super::ThrottleResponseLayer) on every
/// response it makes from a refusal, so that a layer outside it (an access
/// log, a metric) can tell the layers' refusals from the inner service's
/// answers without reading the body. Holds no key text.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refused {
    /// The refusal's code, as in the body: `rate_limited`, `queue_full`, …
    pub code: &'static str,
    /// The policy (rule name) that refused, for a rate limit.
    pub policy: Option<String>,
    /// The name of the limit that refused, when its layer has one
    /// ([`with_name`](crate::rate_limit::RateLimitLayer::with_name)).
    pub limit: Option<String>,
}

impl Refused {
    /// A refusal with `code` and no policy.
    pub fn new(code: &'static str) -> Self {
        Self {
            code,
            policy: None,
            limit: None,
        }
    }

    /// The same refusal, by the limit named `limit`.
    pub fn with_limit(mut self, limit: impl Into<String>) -> Self {
        self.limit = Some(limit.into());
        self
    }

    /// The same refusal, by `policy`.
    pub fn with_policy(mut self, policy: impl Into<String>) -> Self {
        self.policy = Some(policy.into());
        self
    }

    /// The refusal a response to `rejection` carries: its code, the policy
    /// of a rate limit's refusal, and the limit that refused. Made alike by
    /// the HTTP and the gRPC adapter.
    pub(crate) fn of(rejection: &Rejection<'_>) -> Self {
        let mut refused = Self::new(rejection.code());
        if let Rejection::RateLimited(limited) = rejection {
            if let Some(policy) = &limited.policy {
                refused = refused.with_policy(policy.to_string());
            }
        }
        if let Some(limit) = rejection.limit() {
            refused = refused.with_limit(limit);
        }
        refused
    }
}
