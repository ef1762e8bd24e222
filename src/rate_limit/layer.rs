//! `RateLimitLayer`: quotas, rules, mode and store, built once and shared by its services (a handle retunes them).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::accounting::{CountAll, NoAnnotation, OneUnit};
use super::config::Limits;
use super::handle::RateLimitHandle;
use super::limiter::Limiter;
use super::quota::Quota;
use super::rule::{Rule, check_names};
use super::service::{RateLimit, Shared};
use crate::clock::{Clock, ClockSource, saturating_nanos};
use crate::error::ConfigError;
use crate::home::Home;
use crate::stats::KeyTracking;

/// What the limiter is built from; kept so that a builder method can build
/// it again.
#[derive(Clone)]
struct Setup {
    default: Vec<Quota>,
    rules: Vec<Rule>,
    clock: ClockSource,
    key_stats: KeyTracking,
    /// Where the state lives when not in the process.
    store: Option<crate::redis::RedisStore>,
}

/// Applies a keyed rate limit to every request of the wrapped service.
///
/// Each request's key is read by the extractor `X`; each key is held to the
/// default quotas, or to those of the most specific [`Rule`] matching it. A
/// request must fit every quota that applies. Every service this layer
/// makes, and every clone of them, share one limiter: the limit holds across
/// clones and tasks.
///
/// By default a request over the limit is refused at once with
/// [`RateLimited`](crate::error::RateLimited) (reject mode). With
/// [`with_max_wait`](Self::with_max_wait) it waits its turn instead, in
/// arrival order per key, when its turn comes within the wait allowed.
///
/// A [handle](Self::handle) taken at any point of the builder controls the
/// limiter the built services use. Builder methods that change quotas,
/// rules, the clock or per-key counting build the limiter afresh; on a layer
/// that was already cloned or used to make a service, they make a layer of
/// its own (the clones and services keep theirs, and so do the handles
/// taken before).
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_throttle::key::HeaderKey;
/// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::new(Quota::per_minute(60)?, HeaderKey::new("x-api-key")?)
///     .with_quota(Quota::per_day(1_000)?)
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
pub struct RateLimitLayer<X, F = OneUnit, A = CountAll, H = NoAnnotation> {
    shared: Shared<X, F, A, H>,
    setup: Setup,
}

impl<X> RateLimitLayer<X> {
    /// Limit each key read by `extractor` to `quota`, refusing requests over
    /// it.
    pub fn new(quota: Quota, extractor: X) -> Self {
        Self::with_quotas(vec![quota], extractor)
    }

    /// Limit each key read by `extractor` to every quota in `quotas` (none:
    /// unlimited unless a rule says otherwise).
    pub fn with_quotas(quotas: Vec<Quota>, extractor: X) -> Self {
        let setup = Setup {
            default: quotas,
            rules: Vec::new(),
            clock: ClockSource::default(),
            key_stats: KeyTracking::default(),
            store: None,
        };
        let limiter = Arc::new(Limiter::new(
            setup.default.clone(),
            Vec::new(),
            setup.clock.clone(),
            setup.key_stats.clone(),
        ));
        Self {
            shared: Shared {
                home: Home::new(&limiter),
                limiter,
                extractor: Arc::new(extractor),
                cost: OneUnit,
                counts: CountAll,
                annotate: NoAnnotation,
                max_wait: 0,
                fallback: None,
                refusals: None,
            },
            setup,
        }
    }
}

impl<X> RateLimitLayer<X> {
    /// A layer as `limits` (from a [`RateLimitConfig`](super::RateLimitConfig))
    /// say: default quotas, rules, mode and wait, dry run and switch.
    pub fn from_limits(limits: &Limits, extractor: X) -> Self {
        let mut layer = Self::with_quotas(limits.default.clone(), extractor);
        layer.setup.rules = limits.rules.clone();
        let layer = layer.rebuild().with_max_wait(limits.max_wait);
        layer.shared.limiter.set_dry_run(limits.dry_run);
        layer.shared.limiter.set_enabled(limits.enabled);
        layer
    }
}

impl<X, F, A, H> RateLimitLayer<X, F, A, H> {
    /// Take the quotas and rules in force into the setup: a handle taken
    /// earlier may have retuned them, and a rebuild must not undo that.
    fn sync_setup(&mut self) {
        let (default, rules) = self.shared.limiter.config();
        self.setup.default = default;
        self.setup.rules = rules;
    }

    /// Build the limiter again from the setup, whose rule names are
    /// already checked (callers [sync](Self::sync_setup) it first).
    fn rebuild(mut self) -> Self {
        let setup = &self.setup;
        let limiter = Limiter::new(
            setup.default.clone(),
            setup.rules.clone(),
            setup.clock.clone(),
            setup.key_stats.clone(),
        );
        let limiter = match &setup.store {
            Some(store) => limiter.with_remote(store),
            None => limiter,
        };
        if let Some((_, key)) = self.shared.fallback.take() {
            self.shared.fallback = Some((limiter.seed().hash_parts(&[&*key]), key));
        }
        // The switches carry over; only the state starts afresh.
        limiter.set_enabled(self.shared.limiter.is_enabled());
        limiter.set_dry_run(self.shared.limiter.is_dry_run());
        let limiter = Arc::new(limiter);
        self.shared.home.replace(&limiter);
        self.shared.limiter = limiter;
        self
    }

    /// Keep the limiter's state in Redis, shared by every replica that
    /// uses the same store (see [`redis`](crate::redis)): each decision is
    /// one atomic script call on Redis's clock. The quotas, rules, switches
    /// and options of this layer apply as they do in process; when Redis
    /// cannot be reached the store's [`OnError`](crate::redis::OnError)
    /// decides.
    ///
    /// A quota finer than Redis keeps time (a token bucket above 10,000 per
    /// second per key), or a sliding window larger than Redis keeps
    /// exactly (see [`RedisStore::MOST_SLIDING_COST`](crate::redis::RedisStore::MOST_SLIDING_COST)),
    /// is an error naming it, here and in a later retune.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn with_store(self, store: crate::redis::RedisStore) -> Result<Self, ConfigError> {
        super::limiter::check_quotas(&self.setup.default, &self.setup.rules)?;
        Ok(self.stored(store))
    }

    /// [`with_store`](Self::with_store) for quotas already checked.
    #[cfg(feature = "redis")]
    pub(crate) fn stored(mut self, store: crate::redis::RedisStore) -> Self {
        if !store.names.is_keyed() {
            tracing::info!(
                prefix = %crate::redact::Escaped(store.prefix()),
                "rate limit on Redis without a hash key: key names can be tested against \
                 guesses of low-entropy keys (client addresses); set one"
            );
        }
        self.setup.store = Some(store);
        self.rebuild()
    }

    /// Also hold every key to `quota` (60 per minute *and* 1,000 per day).
    /// A request is admitted only when every quota admits it; a refusal by
    /// one consumes nothing from the others.
    pub fn with_quota(mut self, quota: Quota) -> Self {
        self.sync_setup();
        self.setup.default.push(quota);
        self.rebuild()
    }

    /// Give the keys `rule` matches its quotas instead of the default ones.
    /// A second rule with the same name is an error, and so is a quota
    /// Redis cannot keep after [`with_store`](Self::with_store).
    pub fn with_rule(mut self, rule: Rule) -> Result<Self, ConfigError> {
        self.sync_setup();
        self.setup.rules.push(rule);
        check_names(&self.setup.rules)?;
        if self.setup.store.is_some() {
            super::limiter::check_quotas(&self.setup.default, &self.setup.rules)?;
        }
        Ok(self.rebuild())
    }

    /// Count up to `max_keys` keys apart in the [stats](RateLimitHandle::stats)
    /// (the aggregate is always counted). Keys beyond that are added up as
    /// one entry, [`OTHER_KEYS`](crate::stats::OTHER_KEYS).
    pub fn with_key_stats(mut self, max_keys: usize) -> Self {
        self.sync_setup();
        self.setup.key_stats = KeyTracking::up_to(max_keys);
        self.rebuild()
    }

    /// Count up to `max_keys` keys apart in the stats, only those `filter`
    /// accepts; the others are added up as one entry,
    /// [`OTHER_KEYS`](crate::stats::OTHER_KEYS). `filter` gets the key's
    /// shown name (as [`key_label`](crate::key::key_label) makes it) when a
    /// key not yet counted apart is seen, and again until it accepts it, so
    /// it may start accepting a key later (once it proves real).
    ///
    /// Keys are chosen by whoever sends the requests: with a plain
    /// [`with_key_stats`](Self::with_key_stats), a flood of made-up keys
    /// fills the table first and real keys arriving later are never shown.
    /// A filter that accepts only keys known to be real keeps them visible.
    /// With the table full, a key the filter accepts takes the place of an
    /// idle one (nothing in flight or queued) it no longer accepts, whose
    /// counts go to `OTHER_KEYS`; requests in flight counted there before
    /// their key was accepted move to its entry.
    ///
    /// ```
    /// use tower_throttle::key::JsonFieldKey;
    /// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
    ///
    /// let known = ["gpt-4o", "gpt-4o-mini"];
    /// let layer = RateLimitLayer::new(Quota::per_minute(60)?, JsonFieldKey::new("model"))
    ///     .with_key_stats_where(100, move |model| known.contains(&model));
    /// # let _ = layer;
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn with_key_stats_where(
        mut self,
        max_keys: usize,
        filter: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.sync_setup();
        self.setup.key_stats = KeyTracking::filtered(max_keys, filter);
        self.rebuild()
    }

    /// Read the time from `clock` instead of the default clock
    /// ([`FastClock`](crate::clock::FastClock), or
    /// [`TokioClock`](crate::clock::TokioClock) with the `test-util`
    /// feature; see [`clock`](crate::clock)).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.sync_setup();
        self.setup.clock = ClockSource::of(clock);
        self.rebuild()
    }

    /// Wait mode: a request over the limit waits for its turn, in arrival
    /// order per key, if that turn comes within `max_wait`; otherwise it is
    /// refused at once (the wait is known on arrival). Zero means reject mode.
    ///
    /// Waiters reach the inner service in arrival order even when due at
    /// one instant, and a request that could go at once does not pass due
    /// waiters. A due waiter gives way for at most 20 ms to one ahead of it
    /// that is not being polled: poll the response futures you keep, or
    /// drop them.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.shared.max_wait = saturating_nanos(max_wait);
        self
    }

    /// Name this limit: its refusals say so in
    /// [`RateLimited::limit`](crate::error::RateLimited), so that a caller
    /// can tell which of several limits said no (stacked layers, or the
    /// parts of a [`JointRateLimitLayer`](super::JointRateLimitLayer)).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.shared.refusals_mut().name = Some(Arc::from(name.into()));
        self
    }

    /// Never tell a refused request to retry sooner than `floor`: its
    /// `retry_after` is the time until the key would admit it, raised to
    /// `floor`. For a limit whose real wait can be near zero or unknown,
    /// such as a [turn budget](super::Algorithm::TurnBudget), whose turn
    /// may end at any moment by the caller's
    /// [`new_turn`](super::RateLimitHandle::new_turn): a client that
    /// retries on the hint then does not hammer the key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Layer, Service, ServiceExt};
    /// use tower_throttle::error::RateLimited;
    /// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_throttle::error::BoxError> {
    /// let sender = |req: &http::Request<()>| req.headers().get("x-from").cloned();
    /// let layer = RateLimitLayer::new(Quota::per_turn(1)?, sender)
    ///     .with_name("fan_out")
    ///     .with_retry_floor(Duration::from_secs(10));
    /// let mut svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// }));
    /// let send = || http::Request::builder().header("x-from", "a").body(()).unwrap();
    /// svc.ready().await?.call(send()).await?;
    /// let refused = svc.ready().await?.call(send()).await.unwrap_err();
    /// let refused = refused.downcast_ref::<RateLimited>().unwrap();
    /// assert_eq!(refused.limit.as_deref(), Some("fan_out"));
    /// assert!(refused.retry_after >= Duration::from_secs(10));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_retry_floor(mut self, floor: Duration) -> Self {
        self.shared.refusals_mut().retry_floor = floor;
        self
    }

    /// Decide without enforcing: admit every request and count (in the
    /// stats and in `tracing`) each one that would have been refused, so a
    /// limit can be rolled out safely. The handle can switch it later.
    pub fn with_dry_run(self, dry_run: bool) -> Self {
        self.shared.limiter.set_dry_run(dry_run);
        self
    }

    /// Count requests without a key under this one shared key, instead of
    /// refusing them with [`MissingKey`](crate::error::MissingKey). A request
    /// whose key is ambiguous is still refused, with
    /// [`AmbiguousKey`](crate::error::AmbiguousKey).
    pub fn with_fallback_key(mut self, key: impl Into<String>) -> Self {
        let key: Arc<str> = Arc::from(key.into());
        self.shared.fallback = Some((self.shared.limiter.seed().hash_parts(&[&*key]), key));
        self
    }

    /// Charge each request `cost(&request)` units instead of one, in every
    /// quota counting [cost](super::Unit::Cost) (a quota counting
    /// [requests](super::Unit::Requests) still takes one). Wrapped in
    /// [`Estimated`](super::Estimated), the cost is an estimate that a
    /// [`Settlement`](super::Settlement) corrects once the real cost is known.
    pub fn with_cost<F2>(self, cost: F2) -> RateLimitLayer<X, F2, A, H> {
        self.with_parts(|_, counts, annotate| (cost, counts, annotate))
    }

    /// Count only the requests whose outcome `counts` accepts; the others get
    /// their capacity back (see [`Counts`](super::Counts)).
    pub fn count_only<A2>(self, counts: A2) -> RateLimitLayer<X, F, A2, H> {
        self.with_parts(|cost, _, annotate| (cost, counts, annotate))
    }

    /// Write what remains of the key's quota onto every admitted response
    /// with `annotate`, e.g. [`RateLimitHeaders`](crate::respond::RateLimitHeaders).
    /// Off by default: it costs a look at the key's state per request.
    pub fn with_response_headers<H2>(self, annotate: H2) -> RateLimitLayer<X, F, A, H2> {
        self.with_parts(|cost, counts, _| (cost, counts, annotate))
    }

    /// This layer with its cost, counts and annotation replaced by `parts`
    /// of the old ones: the one rebuild behind the builder methods that
    /// change a type parameter (the struct update syntax cannot).
    fn with_parts<F2, A2, H2>(
        self,
        parts: impl FnOnce(F, A, H) -> (F2, A2, H2),
    ) -> RateLimitLayer<X, F2, A2, H2> {
        let s = self.shared;
        let (cost, counts, annotate) = parts(s.cost, s.counts, s.annotate);
        RateLimitLayer {
            shared: Shared {
                limiter: s.limiter,
                home: s.home,
                extractor: s.extractor,
                cost,
                counts,
                annotate,
                max_wait: s.max_wait,
                fallback: s.fallback,
                refusals: s.refusals,
            },
            setup: self.setup,
        }
    }

    /// The shared part, for a layer made of several (see
    /// [`JointRateLimitLayer`](super::JointRateLimitLayer)).
    pub(crate) fn into_shared(self) -> Shared<X, F, A, H> {
        self.shared
    }

    /// A handle for live control and stats of this layer's limiter: the
    /// one the services built from this layer use, also when builder
    /// methods are called after the handle was taken.
    pub fn handle(&self) -> RateLimitHandle {
        RateLimitHandle::new(self.shared.home.cell())
    }

    /// How many (key, quota) states are held now; see
    /// [`RateLimitHandle::key_count`].
    pub fn key_count(&self) -> usize {
        self.shared.limiter.len()
    }

    /// Drop the state of every idle key now; see
    /// [`RateLimitHandle::evict_idle`].
    pub fn evict_idle(&self) -> usize {
        self.shared.limiter.evict_idle()
    }
}

impl<S, X, F: Clone, A: Clone, H: Clone> Layer<S> for RateLimitLayer<X, F, A, H> {
    type Service = RateLimit<S, X, F, A, H>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.shared.clone()))
    }
}

impl<X, F: Clone, A: Clone, H: Clone> Clone for RateLimitLayer<X, F, A, H> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            setup: self.setup.clone(),
        }
    }
}

impl<X, F, A, H> fmt::Debug for RateLimitLayer<X, F, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitLayer").field(&self.shared).finish()
    }
}
