//! `ConcurrencyLayer`: the cap, queue and timeout, shared by its services.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::handle::ConcurrencyHandle;
use super::permits::Permits;
use super::service::{Concurrency, NoLanes, Shared};
use crate::error::ConfigError;
use crate::home::Home;
use crate::stats::KeyTracking;

/// Caps the requests in flight per key; further requests wait their turn in
/// strict arrival order.
///
/// Each request's key is read by the extractor `X`. At most `max_in_flight`
/// requests per key are between admission and the end of their response;
/// the next one waits, in a FIFO queue per key, and gets the permit the
/// moment one is given back (no polling). A request is in flight until its
/// response future fails, or, for `http::Response<B>`, until the response
/// body has been read to its end or dropped (see [`HoldPermit`]). Every
/// service this layer makes, and every clone of them, share one set of
/// permits.
///
/// Waiting is unbounded by default; [`with_max_queue`](Self::with_max_queue)
/// refuses a request at once with [`QueueFull`](crate::error::QueueFull)
/// when its key already has that many waiting, and
/// [`with_queue_timeout`](Self::with_queue_timeout) gives up on a wait with
/// [`QueueTimeout`](crate::error::QueueTimeout).
///
/// A [handle](Self::handle) taken at any point of the builder controls the
/// permits the built services use. [`with_key_stats`](Self::with_key_stats)
/// makes a fresh set of permits; on a layer that was already cloned or used
/// to make a service it makes a layer of its own (the clones and services
/// keep theirs, and so do the handles taken before).
///
/// [`HoldPermit`]: super::HoldPermit
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_throttle::concurrency::ConcurrencyLayer;
/// use tower_throttle::key::HeaderKey;
///
/// let layer = ConcurrencyLayer::new(4, HeaderKey::new("x-api-key")?)?
///     .with_max_queue(100)
///     .with_queue_timeout(Duration::from_secs(30))
///     .with_fallback_key("anonymous");
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     });
/// # let _ = svc;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
pub struct ConcurrencyLayer<X, L = NoLanes> {
    shared: Shared<X, L>,
}

impl<X> ConcurrencyLayer<X> {
    /// At most `max_in_flight` requests in flight per key read by
    /// `extractor`; the others wait, without limit of number or time.
    ///
    /// Zero is an error: no request could ever go through.
    pub fn new(max_in_flight: usize, extractor: X) -> Result<Self, ConfigError> {
        if max_in_flight == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                "must be at least 1; with 0 no request could ever go through",
            ));
        }
        let permits = Permits::new(max_in_flight, KeyTracking::default());
        Ok(Self {
            shared: Shared {
                home: Home::new(&permits),
                permits,
                extractor: Arc::new(extractor),
                lanes: Arc::new(NoLanes),
                max_queue: usize::MAX,
                queue_timeout: None,
                release_at_headers: false,
                fallback: None,
            },
        })
    }
}

impl<X, L> ConcurrencyLayer<X, L> {
    /// Share each key's permits fairly between *lanes* (callers, say) read
    /// from each request by `lanes`, instead of strict arrival order.
    ///
    /// While a key's requests wait, the lanes with waiters take turns: each
    /// permit given back goes to the oldest waiter of the lane whose turn
    /// it is, and that lane moves to the back of the round. A lane's own
    /// requests keep their arrival order, and a lane that starts waiting
    /// gets a permit within one round (one permit for each lane waiting
    /// ahead of it), however many requests another lane has queued.
    /// Requests whose lane cannot be read share one lane.
    ///
    /// A lane extractor may weigh a lane ([`KeyBuilder::set_weight`]): a
    /// lane of weight `w` (its newest waiter's) takes up to `w` permits in
    /// a row when its turn comes, so while lanes wait it gets `w` shares to
    /// a weight-1 lane's one; a lane that starts waiting then waits at most
    /// one turn of each lane ahead of it.
    ///
    /// [`KeyBuilder::set_weight`]: crate::key::KeyBuilder::set_weight
    ///
    /// With [`with_max_queue`](Self::with_max_queue), a request that finds
    /// its key's line full pushes out the newest waiter of the longest lane
    /// when that lane would still be longer than its own (the one pushed
    /// out fails with [`QueueFull`](crate::error::QueueFull)); in the
    /// longest lane, it is refused itself. A flood fills its own lane, not
    /// the others' room.
    ///
    /// What changes: a waiter's turn is no longer fixed when it arrives
    /// (lanes arriving later are served between its lane's turns), so
    /// [`with_queue_timeout`](Self::with_queue_timeout) can end a wait
    /// that strict order would have served.
    ///
    /// ```
    /// use tower_throttle::concurrency::ConcurrencyLayer;
    /// use tower_throttle::key::{GlobalKey, HeaderKey};
    ///
    /// // Two upstream calls at a time, shared in turn between the callers
    /// // named by `x-client`.
    /// let layer = ConcurrencyLayer::new(2, GlobalKey)?
    ///     .with_max_queue(500)
    ///     .with_fair_share(HeaderKey::new("x-client")?);
    /// # let _ = layer;
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn with_fair_share<L2>(self, lanes: L2) -> ConcurrencyLayer<X, L2> {
        let Shared {
            permits,
            home,
            extractor,
            lanes: _,
            max_queue,
            queue_timeout,
            release_at_headers,
            fallback,
        } = self.shared;
        ConcurrencyLayer {
            shared: Shared {
                permits,
                home,
                extractor,
                lanes: Arc::new(lanes),
                max_queue,
                queue_timeout,
                release_at_headers,
                fallback,
            },
        }
    }

    /// Let at most `max_queue` requests wait per key; one more is refused at
    /// once with [`QueueFull`](crate::error::QueueFull). Zero: never wait.
    pub fn with_max_queue(mut self, max_queue: usize) -> Self {
        self.shared.max_queue = max_queue;
        self
    }

    /// Give up on a request that has waited `timeout` for its permit, with
    /// [`QueueTimeout`](crate::error::QueueTimeout). Zero: a request that
    /// would have to wait fails at once with that error. A timeout too large
    /// for the clock to reach (centuries) waits without limit.
    pub fn with_queue_timeout(mut self, timeout: Duration) -> Self {
        self.shared.queue_timeout = Some(timeout);
        self
    }

    /// With `true`, give the permit back as soon as the response arrives
    /// (tower's `ConcurrencyLimit` behaviour), not when its body ends (the
    /// default, `false`). For streamed answers this lets through far more
    /// load than the limit says; it is for callers who read bodies
    /// elsewhere or do not care.
    pub fn with_release_at_headers(mut self, enabled: bool) -> Self {
        self.shared.release_at_headers = enabled;
        self
    }

    /// Renamed [`with_release_at_headers(true)`](Self::with_release_at_headers):
    /// every setting of a layer is a `with_*`.
    #[deprecated(since = "0.1.0", note = "renamed `with_release_at_headers(true)`")]
    #[doc(hidden)]
    pub fn release_at_headers(self) -> Self {
        self.with_release_at_headers(true)
    }

    /// Count requests without a key under this one shared key, instead of
    /// refusing them with [`MissingKey`](crate::error::MissingKey). A request
    /// whose key is ambiguous is still refused, with
    /// [`AmbiguousKey`](crate::error::AmbiguousKey).
    pub fn with_fallback_key(mut self, key: impl Into<String>) -> Self {
        let key: Arc<str> = Arc::from(key.into());
        self.shared.fallback = Some((self.shared.permits.seed().hash_parts(&[&*key]), key));
        self
    }

    /// Count up to `max_keys` keys apart in the
    /// [stats](ConcurrencyHandle::stats) (the aggregate is always counted).
    /// Keys beyond that are added up as
    /// [`OTHER_KEYS`](crate::stats::OTHER_KEYS).
    pub fn with_key_stats(self, max_keys: usize) -> Self {
        self.with_key_tracking(KeyTracking::up_to(max_keys))
    }

    /// Count up to `max_keys` keys apart in the stats, only those whose
    /// shown name `filter` accepts; the others are added up as
    /// [`OTHER_KEYS`](crate::stats::OTHER_KEYS). See
    /// [`RateLimitLayer::with_key_stats_where`](crate::rate_limit::RateLimitLayer::with_key_stats_where).
    pub fn with_key_stats_where(
        self,
        max_keys: usize,
        filter: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.with_key_tracking(KeyTracking::filtered(max_keys, filter))
    }

    fn with_key_tracking(mut self, tracking: KeyTracking) -> Self {
        let old = &self.shared.permits;
        let permits = Permits::new(old.max(), tracking);
        if !old.is_enabled() {
            permits.set_enabled(false);
        }
        if let Some((_, key)) = self.shared.fallback.take() {
            self.shared.fallback = Some((permits.seed().hash_parts(&[&*key]), key));
        }
        self.shared.home.replace(&permits);
        self.shared.permits = permits;
        self
    }

    /// A handle on this layer's permits and stats: the ones the services
    /// built from this layer use, also when
    /// [`with_key_stats`](Self::with_key_stats) is called after the handle
    /// was taken.
    pub fn handle(&self) -> ConcurrencyHandle {
        ConcurrencyHandle::new(self.shared.home.cell())
    }
}

impl<S, X, L> Layer<S> for ConcurrencyLayer<X, L> {
    type Service = Concurrency<S, X, L>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency::new(inner, Arc::new(self.shared.clone()))
    }
}

impl<X, L> Clone for ConcurrencyLayer<X, L> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<X, L: 'static> fmt::Debug for ConcurrencyLayer<X, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConcurrencyLayer")
            .field(&self.shared)
            .finish()
    }
}
