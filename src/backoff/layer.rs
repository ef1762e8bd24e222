//! `Backoff429Layer`: cooldown lengths, mode and store, and its defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::cooldown::{Config, Cooldowns};
use super::exponential::ExponentialBackoff;
use super::handle::BackoffHandle;
use super::service::{Backoff429, Shared};
use crate::error::ConfigError;
use crate::home::Home;
use crate::stats::KeyTracking;

/// The first exponential cooldown, by default: 1 s.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// The cap on the exponential cooldown, by default: 60 s.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The longest cooldown anything can start, by default: 5 minutes.
pub const DEFAULT_MAX_COOLDOWN: Duration = Duration::from_secs(300);

/// Puts a route (key) into a cooldown when the upstream answers 429 Too Many
/// Requests, so it is not hammered while it is already refusing.
///
/// The cooldown's length comes from the response when it says (see
/// [`cooldown_from_headers`](super::cooldown_from_headers)), else from an
/// [exponential rule](ExponentialBackoff) over the route's streak of
/// consecutive 429s; a success ends the streak. Nothing a server sends
/// cools a route longer than [`with_max_cooldown`](Self::with_max_cooldown).
/// The 429 response itself is returned to the caller unchanged.
///
/// While a route cools, its requests are refused at once with
/// [`CoolingDown`](crate::error::CoolingDown) (the default), or, with
/// [`with_max_wait`](Self::with_max_wait), wait for the end in arrival
/// order. Other routes are untouched. Every service this layer makes, and
/// every clone of them, share one table of cooldowns.
///
/// A [handle](Self::handle) taken at any point of the builder controls the
/// table the built services use; through it the lengths, jitter and 503
/// handling can also change while the layer runs. Builder methods other
/// than `with_max_wait` and `with_fallback_key` build the table afresh; on
/// a layer that was already cloned or used to make a service, they make a
/// layer of its own (the clones and services keep theirs, and so do the
/// handles taken before).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backoff::Backoff429Layer;
/// use tower_throttle::key::{HostKey, JsonFieldKey};
///
/// let layer = Backoff429Layer::new((HostKey, JsonFieldKey::new("model")))
///     .with_initial_backoff(Duration::from_millis(500))
///     .with_max_backoff(Duration::from_secs(30))
///     .with_max_cooldown(Duration::from_secs(120))
///     .with_jitter(0.2)?
///     .with_max_wait(Duration::from_secs(10))
///     .with_on_503(true)
///     .with_proactive(true);
/// # let _ = layer;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
pub struct Backoff429Layer<X> {
    shared: Shared<X>,
}

impl<X> Backoff429Layer<X> {
    /// Cool down each route read by `extractor` after a 429, refusing its
    /// requests until the cooldown ends.
    pub fn new(extractor: X) -> Self {
        let config = Config {
            backoff: ExponentialBackoff::new(DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF),
            max_cooldown: DEFAULT_MAX_COOLDOWN,
            on_503: false,
            proactive: false,
            key_stats: KeyTracking::default(),
            store: None,
        };
        let engine = Arc::new(Cooldowns::new(config));
        Self {
            shared: Shared {
                home: Home::new(&engine),
                engine,
                extractor: Arc::new(extractor),
                max_wait: Duration::ZERO,
                fallback: None,
            },
        }
    }

    /// Build the table again with a changed configuration.
    fn rebuild(mut self, change: impl FnOnce(&mut Config)) -> Self {
        let old = &self.shared.engine;
        let mut config = old.config();
        change(&mut config);
        let engine = Cooldowns::new(config);
        engine.set_enabled(old.is_enabled());
        if let Some((_, key)) = self.shared.fallback.take() {
            self.shared.fallback = Some((engine.seed().hash_parts(&[&*key]), key));
        }
        let engine = Arc::new(engine);
        self.shared.home.replace(&engine);
        self.shared.engine = engine;
        self
    }

    /// Wait mode: a request to a cooling route waits for the cooldown's end,
    /// in arrival order per route, if that comes within `max_wait`;
    /// otherwise it is refused at once. Zero means reject mode (the
    /// default).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.shared.max_wait = max_wait;
        self
    }

    /// The first exponential cooldown (default 1 s). Zero turns the
    /// exponential rule off: only headers then start cooldowns.
    /// [`BackoffHandle::set_backoff`] changes it live.
    pub fn with_initial_backoff(self, initial: Duration) -> Self {
        self.rebuild(|c| c.backoff.set_initial(initial))
    }

    /// The cap on the exponential cooldown (default 60 s). A route quiet
    /// for this long after its cooldown ended also forgets its streak.
    /// Zero: no doubling, every exponential cooldown lasts
    /// [`initial_backoff`](Self::with_initial_backoff) (see
    /// [`ExponentialBackoff`]).
    pub fn with_max_backoff(self, max: Duration) -> Self {
        self.rebuild(|c| c.backoff.set_max(max))
    }

    /// The longest cooldown anything can start, header or rule (default 5
    /// minutes).
    pub fn with_max_cooldown(self, max: Duration) -> Self {
        self.rebuild(|c| c.max_cooldown = max)
    }

    /// Move each exponential cooldown by up to `ratio` of itself, either
    /// way, at random. `ratio` must be within `0..=1`. Lengths a header gave
    /// are kept as given.
    pub fn with_jitter(self, ratio: f64) -> Result<Self, ConfigError> {
        let backoff = self.shared.engine.config().backoff.with_jitter(ratio)?;
        Ok(self.rebuild(|c| c.backoff = backoff))
    }

    /// Also cool a route down on 503 Service Unavailable, when it carries
    /// `Retry-After` (or `retry-after-ms`); off by default. A 503 neither
    /// extends nor ends the 429 streak.
    pub fn with_on_503(self, enabled: bool) -> Self {
        self.rebuild(|c| c.on_503 = enabled)
    }

    /// Renamed [`with_on_503`](Self::with_on_503): every setting of a layer
    /// is a `with_*`.
    #[deprecated(since = "0.1.0", note = "renamed `with_on_503`")]
    #[doc(hidden)]
    pub fn on_503(self, enabled: bool) -> Self {
        self.with_on_503(enabled)
    }

    /// Start the cooldown before the 429 happens: a successful response that
    /// says the route is exhausted (a `remaining` header of `0` with its
    /// reset time) cools the route until the reset. Off by default.
    pub fn with_proactive(self, enabled: bool) -> Self {
        self.rebuild(|c| c.proactive = enabled)
    }

    /// Renamed [`with_proactive`](Self::with_proactive): every setting of a
    /// layer is a `with_*`.
    #[deprecated(since = "0.1.0", note = "renamed `with_proactive`")]
    #[doc(hidden)]
    pub fn proactive(self, enabled: bool) -> Self {
        self.with_proactive(enabled)
    }

    /// Count up to `max_keys` keys apart in the [stats](BackoffHandle::stats)
    /// (the aggregate is always counted). Keys beyond that are added up as
    /// [`OTHER_KEYS`](crate::stats::OTHER_KEYS).
    pub fn with_key_stats(self, max_keys: usize) -> Self {
        self.rebuild(|c| c.key_stats = KeyTracking::up_to(max_keys))
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
        let tracking = KeyTracking::filtered(max_keys, filter);
        self.rebuild(|c| c.key_stats = tracking)
    }

    /// Put requests without a key under this one shared key, instead of
    /// refusing them with [`MissingKey`](crate::error::MissingKey). A request
    /// whose key is ambiguous is still refused, with
    /// [`AmbiguousKey`](crate::error::AmbiguousKey).
    pub fn with_fallback_key(mut self, key: impl Into<String>) -> Self {
        let key: Arc<str> = Arc::from(key.into());
        self.shared.fallback = Some((self.shared.engine.seed().hash_parts(&[&*key]), key));
        self
    }

    /// Share every route's cooldown and 429 streak with the other replicas
    /// that use the same store (see [`redis`](crate::redis)): a 429 (or a
    /// 503, with [`with_on_503`](Self::with_on_503)) one replica sees cools the route
    /// for all, the longer of the cooldown in force and the new one winning.
    ///
    /// Each request reads its route's state in Redis first (one round
    /// trip), and a response that starts a cooldown or ends a streak is
    /// passed back to the caller once Redis has it: every replica sees it
    /// before its next request to that route. The read and that report
    /// share one [timeout](crate::redis::RedisStore::with_timeout): past
    /// it the response goes on, and the report follows when Redis answers
    /// (a request spends at most one timeout on Redis). When Redis cannot
    /// be reached, the store's [`OnError`](crate::redis::OnError) decides:
    /// open goes on with this replica's own cooldowns, closed refuses with
    /// [`StoreUnavailable`](crate::error::StoreUnavailable).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn with_store(self, store: crate::redis::RedisStore) -> Self {
        self.rebuild(|config| config.store = Some(store))
    }

    /// A handle for the stats, cooldowns and live settings of this layer:
    /// the table the services built from this layer use, also when builder
    /// methods are called after the handle was taken.
    pub fn handle(&self) -> BackoffHandle {
        BackoffHandle::new(self.shared.home.cell())
    }
}

impl<S, X> Layer<S> for Backoff429Layer<X> {
    type Service = Backoff429<S, X>;

    fn layer(&self, inner: S) -> Self::Service {
        Backoff429::new(inner, Arc::new(self.shared.clone()))
    }
}

impl<X> Clone for Backoff429Layer<X> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<X> fmt::Debug for Backoff429Layer<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Backoff429Layer")
            .field(&self.shared)
            .finish()
    }
}
