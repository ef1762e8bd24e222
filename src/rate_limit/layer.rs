use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::accounting::{CountAll, OneUnit};
use super::limiter::Limiter;
use super::quota::Quota;
use super::service::{RateLimit, Shared};
use crate::clock::{Clock, ClockSource};

/// Applies a keyed rate limit to every request of the wrapped service.
///
/// Each request's key is read by the extractor `X`; each key gets the same
/// [`Quota`]. Every service this layer makes, and every clone of them, share
/// one limiter: the limit holds across clones and tasks.
///
/// By default a request over the limit is refused at once with
/// [`RateLimited`](crate::error::RateLimited) (reject mode). With
/// [`with_max_wait`](Self::with_max_wait) it waits its turn instead, in strict
/// arrival order per key, when its turn comes within the wait allowed.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_throttle::key::HeaderKey;
/// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::new(Quota::per_minute(60)?, HeaderKey::new("x-api-key")?)
///     .with_max_wait(Duration::from_secs(2))
///     .with_fallback_key("anonymous");
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     });
/// # let _ = svc;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
pub struct RateLimitLayer<X, F = OneUnit, A = CountAll> {
    shared: Shared<X, F, A>,
}

impl<X> RateLimitLayer<X> {
    /// Limit each key read by `extractor` to `quota`, refusing requests over
    /// it.
    pub fn new(quota: Quota, extractor: X) -> Self {
        Self {
            shared: Shared {
                limiter: Arc::new(Limiter::new(quota, ClockSource::Tokio)),
                extractor: Arc::new(extractor),
                cost: OneUnit,
                counts: CountAll,
                max_wait: Duration::ZERO,
                fallback: None,
            },
        }
    }
}

impl<X, F, A> RateLimitLayer<X, F, A> {
    /// Wait mode: a request over the limit waits for its turn, in arrival
    /// order per key, if that turn comes within `max_wait`; otherwise it is
    /// refused at once (the wait is known on arrival). Zero means reject mode.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.shared.max_wait = max_wait;
        self
    }

    /// Count requests without a key under this one shared key, instead of
    /// refusing them with [`MissingKey`](crate::error::MissingKey).
    pub fn with_fallback_key(mut self, key: impl Into<String>) -> Self {
        let key: Arc<str> = Arc::from(key.into());
        self.shared.fallback = Some((self.shared.limiter.seed().hash_text(&key), key));
        self
    }

    /// Read the time from `clock` instead of tokio's clock. This starts the
    /// limiter afresh: call it before the layer is used.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        let quota = *self.shared.limiter.quota();
        let limiter = Arc::new(Limiter::new(quota, ClockSource::Custom(Arc::new(clock))));
        if let Some((_, key)) = self.shared.fallback.take() {
            self.shared.fallback = Some((limiter.seed().hash_text(&key), key));
        }
        self.shared.limiter = limiter;
        self
    }

    /// Charge each request `cost(&request)` units instead of one.
    pub fn with_cost<F2>(self, cost: F2) -> RateLimitLayer<X, F2, A> {
        let s = self.shared;
        RateLimitLayer {
            shared: Shared {
                limiter: s.limiter,
                extractor: s.extractor,
                cost,
                counts: s.counts,
                max_wait: s.max_wait,
                fallback: s.fallback,
            },
        }
    }

    /// Count only the requests whose outcome `counts` accepts; the others get
    /// their capacity back (see [`Counts`](super::Counts)).
    pub fn count_only<A2>(self, counts: A2) -> RateLimitLayer<X, F, A2> {
        let s = self.shared;
        RateLimitLayer {
            shared: Shared {
                limiter: s.limiter,
                extractor: s.extractor,
                cost: s.cost,
                counts,
                max_wait: s.max_wait,
                fallback: s.fallback,
            },
        }
    }

    /// The quota every key gets.
    pub fn quota(&self) -> Quota {
        *self.shared.limiter.quota()
    }

    /// How many keys hold state now (idle keys not yet swept included).
    pub fn key_count(&self) -> usize {
        self.shared.limiter.len()
    }

    /// Drop the state of every idle key now, returning how many were
    /// dropped. Idle keys are also swept as requests arrive; this is for
    /// callers who want the memory back at a moment of their choosing.
    pub fn evict_idle(&self) -> usize {
        self.shared.limiter.evict_idle()
    }
}

impl<S, X, F: Clone, A: Clone> Layer<S> for RateLimitLayer<X, F, A> {
    type Service = RateLimit<S, X, F, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.shared.clone()))
    }
}

impl<X, F: Clone, A: Clone> Clone for RateLimitLayer<X, F, A> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<X, F, A> fmt::Debug for RateLimitLayer<X, F, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitLayer").field(&self.shared).finish()
    }
}
