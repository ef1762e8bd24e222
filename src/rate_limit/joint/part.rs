//! One limit of a joint layer, with its types erased.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{BoxError, RateLimited};
use crate::key::{KeyExtractor, KeyHash, KeyTexts};
use crate::rate_limit::Quota;
use crate::rate_limit::accounting::Cost;
use crate::rate_limit::limiter::Limiter;
use crate::rate_limit::service::Shared;

/// What a joint layer needs of one of its limits for a request `R`: the
/// limiter, the request's key and cost under it, and its refusal.
/// Implemented by a [`RateLimitLayer`](crate::rate_limit::RateLimitLayer)'s
/// shared part, whatever its extractor and cost types.
pub(crate) trait Part<R>: Send + Sync {
    fn limiter(&self) -> &Arc<Limiter>;

    /// The request's key (the fallback key when it has none), or why it
    /// has no usable key.
    fn key(&self, req: &R) -> Result<KeyHash, BoxError>;

    /// The texts of the request's key parts.
    fn texts(&self, req: &R) -> KeyTexts;

    fn cost(&self, req: &R) -> u32;

    /// No refusal by this limit says to retry sooner than this.
    fn retry_floor(&self) -> Duration;

    /// Its refusal of a request on the key shown as `key`.
    fn refusal(&self, key: String, wait: Duration, quota: Quota, policy: &str) -> RateLimited;

    /// The name its refusals give (see `with_name`).
    fn name(&self) -> Option<&str>;

    /// How the limit is set up, for `Debug`.
    fn describe(&self) -> String;
}

impl<R, X, F, A, H> Part<R> for Shared<X, F, A, H>
where
    X: KeyExtractor<R>,
    F: Cost<R>,
    A: Send + Sync + 'static,
    H: Send + Sync + 'static,
{
    fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    fn key(&self, req: &R) -> Result<KeyHash, BoxError> {
        Shared::key(self, req)
    }

    fn texts(&self, req: &R) -> KeyTexts {
        self.key_texts(req)
    }

    fn cost(&self, req: &R) -> u32 {
        self.cost.cost(req)
    }

    fn retry_floor(&self) -> Duration {
        Shared::retry_floor(self)
    }

    fn refusal(&self, key: String, wait: Duration, quota: Quota, policy: &str) -> RateLimited {
        Shared::refusal(self, key, wait, quota, policy)
    }

    fn name(&self) -> Option<&str> {
        self.refusals.as_ref().and_then(|r| r.name.as_deref())
    }

    fn describe(&self) -> String {
        format!("{self:?}")
    }
}
