//! One configuration file for a whole client or server stack: rate limits
//! with rules, concurrency, upstream backoff and identity rules.
//!
//! ```
//! use tower_throttle::config::StackConfig;
//! use tower_throttle::key::{GlobalKey, HeaderKey};
//!
//! let stack = StackConfig::from_toml(r#"
//!     [rate_limit]
//!     mode = "wait"
//!     max_wait = "5s"
//!     quotas = [{ limit = 60, period = "1m" }]
//!
//!     [concurrency]
//!     max_in_flight = 4
//!     max_queue = 100
//!     queue_timeout = "30s"
//!
//!     [backoff]
//!     initial_backoff = "1s"
//!     max_cooldown = "2m"
//!
//!     [[identity.rules]]
//!     host = "api.example.com"
//!     user_agent = "my-app/1.0"
//! "#)?.validate()?;
//! let rate_limit = stack.rate_limit_layer(HeaderKey::new("x-model")?);
//! let concurrency = stack.concurrency_layer(GlobalKey)?;
//! let backoff = stack.backoff_layer(GlobalKey)?;
//! let identity = stack.identity_layer()?;
//! assert!(rate_limit.is_some() && concurrency.is_some() && backoff.is_some() && identity.is_some());
//! # Ok::<(), tower_throttle::error::ConfigError>(())
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::backoff::{
    Backoff429Layer, BackoffHandle, DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_COOLDOWN, ExponentialBackoff,
};
use crate::concurrency::ConcurrencyLayer;
use crate::error::ConfigError;
use crate::identity::{IdentityConfig, IdentityHeaderLayer};
use crate::rate_limit::{Limits, RateLimitConfig, RateLimitLayer};

/// A whole stack's configuration, as written in a file. Every section is
/// optional; unknown fields are errors.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackConfig {
    /// See [`RateLimitConfig`].
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// See [`ConcurrencyConfig`].
    #[serde(default)]
    pub concurrency: Option<ConcurrencyConfig>,
    /// See [`BackoffConfig`].
    #[serde(default)]
    pub backoff: Option<BackoffConfig>,
    /// See [`IdentityConfig`].
    #[serde(default)]
    pub identity: Option<IdentityConfig>,
    /// See [`StoreConfig`].
    #[serde(default)]
    pub store: Option<StoreConfig>,
}

/// The `[store]` section: keep the rate limits and the cooldowns in Redis,
/// shared by every replica that names the same server (feature `redis`;
/// see the `redis` module). A build without the feature refuses the
/// section.
///
/// ```toml
/// [store]
/// redis_url = "redis://127.0.0.1:6379"
/// # cluster = true             # redis_url is one node of a Redis Cluster
/// prefix = "gateway:"          # default "tt:"
/// timeout = "50ms"             # every call; default 50ms
/// on_error = "open"            # or "closed"; default "open"
/// local_fallback = true        # open: in-process limits per replica; default true
/// hash_key_env = "GATEWAY_HASH_KEY"  # or hash_key = "..." (a secret)
/// ```
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://[user:password@]host:port[/db]`. Never shown: it may hold a
    /// password.
    pub redis_url: String,
    /// `redis_url` is a node of a Redis Cluster; default false.
    #[serde(default)]
    pub cluster: Option<bool>,
    /// Put before every key name; default `tt:`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The timeout of every Redis call, e.g. `"50ms"` (the default).
    #[serde(default)]
    pub timeout: Option<String>,
    /// `"open"` (default: let requests through) or `"closed"` (refuse them,
    /// 503) while Redis is unreachable.
    #[serde(default)]
    pub on_error: Option<String>,
    /// Failing open, hold requests to in-process limits with the same quotas
    /// (default true) or admit them all (false).
    #[serde(default)]
    pub local_fallback: Option<bool>,
    /// The secret keying the hash that names keys in Redis (see
    /// `RedisStore::with_hash_key`). Never shown.
    #[serde(default)]
    pub hash_key: Option<String>,
    /// The environment variable holding that secret, instead of
    /// `hash_key` (which keeps it out of the file).
    #[serde(default)]
    pub hash_key_env: Option<String>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("redis_url", &"(hidden)")
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("local_fallback", &self.local_fallback)
            .field("hash_key", &self.hash_key.as_ref().map(|_| "(hidden)"))
            .field("hash_key_env", &self.hash_key_env)
            .finish()
    }
}

impl StoreConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if cfg!(not(feature = "redis")) {
            return Err(ConfigError::new(
                "",
                "this build has no Redis store: enable tower-throttle's `redis` feature",
            ));
        }
        if self.redis_url.trim().is_empty() {
            return Err(ConfigError::new("redis_url", "must not be empty"));
        }
        if duration("timeout", &self.timeout)?.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new("timeout", "must be longer than zero"));
        }
        match self.on_error.as_deref() {
            None | Some("open") | Some("closed") => {}
            Some(other) => {
                return Err(ConfigError::new(
                    "on_error",
                    format!(
                        "`{}` is not a choice; use \"open\" or \"closed\"",
                        crate::redact::Escaped(other)
                    ),
                ));
            }
        }
        if self.hash_key.is_some() && self.hash_key_env.is_some() {
            return Err(ConfigError::new(
                "hash_key_env",
                "give the secret once: hash_key or hash_key_env",
            ));
        }
        self.secret().map(|_| ())
    }

    /// The hash key, from the file or the environment.
    fn secret(&self) -> Result<Option<String>, ConfigError> {
        if let Some(name) = &self.hash_key_env {
            return match std::env::var(name) {
                Ok(secret) if !secret.is_empty() => Ok(Some(secret)),
                _ => Err(ConfigError::new(
                    "hash_key_env",
                    format!(
                        "the environment variable `{}` is not set",
                        crate::redact::Escaped(name)
                    ),
                )),
            };
        }
        match &self.hash_key {
            Some(key) if key.is_empty() => Err(ConfigError::new("hash_key", "must not be empty")),
            key => Ok(key.clone()),
        }
    }

    /// The store this section describes. Nothing is connected yet.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn build(&self) -> Result<crate::redis::RedisStore, ConfigError> {
        use crate::redis::{OnError, RedisStore};

        self.check()?;
        let url = self.redis_url.trim();
        let mut store = if self.cluster == Some(true) {
            RedisStore::cluster(&[url])?
        } else {
            RedisStore::new(url)?
        };
        if let Some(prefix) = &self.prefix {
            store = store.with_prefix(prefix.clone())?;
        }
        if let Some(timeout) = duration("timeout", &self.timeout)? {
            store = store.with_timeout(timeout);
        }
        if self.on_error.as_deref() == Some("closed") {
            store = store.on_error(OnError::Closed);
        }
        store = store.with_local_fallback(self.local_fallback.unwrap_or(true));
        if let Some(secret) = self.secret()? {
            store = store.with_hash_key(secret)?;
        }
        Ok(store)
    }
}

/// The `[concurrency]` section.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyConfig {
    /// Requests in flight per key, at least 1.
    pub max_in_flight: i64,
    /// Waiters per key beyond which a request is refused at once; default
    /// unbounded.
    #[serde(default)]
    pub max_queue: Option<i64>,
    /// How long a request may wait for a permit, e.g. `"30s"`; default no
    /// limit.
    #[serde(default)]
    pub queue_timeout: Option<String>,
    /// Release the permit when the response headers arrive, not when its
    /// body ends (tower's behaviour); default false.
    #[serde(default)]
    pub release_at_headers: Option<bool>,
    /// Share the permits with other replicas through the `[store]`: refused
    /// (an error naming this field). Permits stay per replica; see
    /// [`concurrency`](crate::concurrency#several-replicas) for why, and
    /// divide `max_in_flight` by the number of replicas instead.
    #[serde(default)]
    pub shared: Option<bool>,
}

/// The `[backoff]` section.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    /// `"reject"` (default) or `"wait"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// In wait mode, the longest a request may wait out a cooldown.
    #[serde(default)]
    pub max_wait: Option<String>,
    /// The first cooldown when the upstream gives no time; default 1s.
    #[serde(default)]
    pub initial_backoff: Option<String>,
    /// The longest cooldown of the doubling rule; `"0s"`: no doubling, every
    /// cooldown the rule starts lasts `initial_backoff`.
    #[serde(default)]
    pub max_backoff: Option<String>,
    /// The longest cooldown anything may start, headers included.
    #[serde(default)]
    pub max_cooldown: Option<String>,
    /// Symmetric jitter ratio, within 0..=1; default 0.
    #[serde(default)]
    pub jitter: Option<f64>,
    /// Also cool down on 503 with `Retry-After`; default false.
    #[serde(default)]
    pub on_503: Option<bool>,
    /// Start a cooldown on a success that says the route is exhausted;
    /// default false.
    #[serde(default)]
    pub proactive: Option<bool>,
}

/// A validated stack configuration: builds the layers.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Stack {
    /// The rate limits.
    pub rate_limit: Option<Limits>,
    /// The concurrency section, checked.
    pub concurrency: Option<ConcurrencyConfig>,
    /// The backoff section, checked.
    pub backoff: Option<BackoffConfig>,
    /// The identity rules.
    pub identity: Option<IdentityConfig>,
    /// The store section, checked.
    pub store: Option<StoreConfig>,
    /// The store built from it, shared by the layers this stack builds.
    #[cfg(feature = "redis")]
    redis: Option<crate::redis::RedisStore>,
}

impl StackConfig {
    /// Parse TOML.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| {
                    let line = text[..span.start.min(text.len())].lines().count().max(1);
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            ConfigError::new("toml", format!("{}{at}", e.message()))
        })
    }

    /// Check every section; the first error names its field path
    /// (`rate_limit.rules[2].quotas[0].burst`).
    pub fn validate(&self) -> Result<Stack, ConfigError> {
        let rate_limit = match &self.rate_limit {
            Some(c) => Some(c.validate().map_err(|e| e.within("rate_limit"))?),
            None => None,
        };
        if let Some(c) = &self.concurrency {
            c.check().map_err(|e| e.within("concurrency"))?;
        }
        if let Some(c) = &self.backoff {
            c.check().map_err(|e| e.within("backoff"))?;
        }
        if let Some(c) = &self.identity {
            // Built once here so a bad rule is reported now, not at use.
            c.clone().build().map_err(|e| e.within("identity"))?;
        }
        if let Some(c) = &self.store {
            c.check().map_err(|e| e.within("store"))?;
        }
        #[cfg(feature = "redis")]
        let redis = match &self.store {
            Some(c) => {
                if let Some(limits) = &rate_limit {
                    crate::rate_limit::check_quotas(&limits.default, &limits.rules)
                        .map_err(|e| e.within("rate_limit"))?;
                }
                Some(c.build().map_err(|e| e.within("store"))?)
            }
            None => None,
        };
        Ok(Stack {
            rate_limit,
            concurrency: self.concurrency.clone(),
            backoff: self.backoff.clone(),
            identity: self.identity.clone(),
            store: self.store.clone(),
            #[cfg(feature = "redis")]
            redis,
        })
    }
}

fn duration(field: &str, text: &Option<String>) -> Result<Option<Duration>, ConfigError> {
    text.as_deref()
        .map(|t| {
            humantime::parse_duration(t.trim()).map_err(|e| {
                ConfigError::new(
                    field,
                    format!("`{t}` is not a duration ({e}); write e.g. \"30s\" or \"500ms\""),
                )
            })
        })
        .transpose()
}

fn count(field: &str, value: i64) -> Result<usize, ConfigError> {
    usize::try_from(value).map_err(|_| ConfigError::new(field, format!("{value} is negative")))
}

impl ConcurrencyConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.shared == Some(true) {
            return Err(ConfigError::new(
                "shared",
                "concurrency permits are not shared through a store: a leased permit can \
                 expire while its request still runs, which breaks the cap; keep them per \
                 replica and divide max_in_flight by the number of replicas",
            ));
        }
        if count("max_in_flight", self.max_in_flight)? == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                "0 would admit nothing; it must be at least 1",
            ));
        }
        if let Some(q) = self.max_queue {
            count("max_queue", q)?;
        }
        duration("queue_timeout", &self.queue_timeout)?;
        Ok(())
    }

    fn layer<X>(&self, extractor: X) -> Result<ConcurrencyLayer<X>, ConfigError> {
        let mut layer =
            ConcurrencyLayer::new(count("max_in_flight", self.max_in_flight)?, extractor)?;
        if let Some(q) = self.max_queue {
            layer = layer.with_max_queue(count("max_queue", q)?);
        }
        if let Some(t) = duration("queue_timeout", &self.queue_timeout)? {
            layer = layer.with_queue_timeout(t);
        }
        if self.release_at_headers == Some(true) {
            layer = layer.release_at_headers();
        }
        Ok(layer)
    }
}

impl BackoffConfig {
    fn check(&self) -> Result<(), ConfigError> {
        match self.mode.as_deref() {
            None | Some("reject") => {}
            Some("wait") if duration("max_wait", &self.max_wait)?.is_none_or(|d| d.is_zero()) => {
                return Err(ConfigError::new(
                    "max_wait",
                    "wait mode needs a max_wait above zero, e.g. \"10s\"",
                ));
            }
            Some("wait") => {}
            Some(other) => {
                return Err(ConfigError::new(
                    "mode",
                    format!("`{other}` is not a mode; use \"reject\" or \"wait\""),
                ));
            }
        }
        duration("initial_backoff", &self.initial_backoff)?;
        duration("max_backoff", &self.max_backoff)?;
        duration("max_cooldown", &self.max_cooldown)?;
        if let Some(j) = self.jitter {
            if !(0.0..=1.0).contains(&j) {
                return Err(ConfigError::new(
                    "jitter",
                    format!("{j} is not within 0..=1"),
                ));
            }
        }
        Ok(())
    }

    /// Apply the cooldown lengths, jitter, `on_503` and `proactive` to a
    /// running layer through its handle, a field left out taking its
    /// default; the mode and `max_wait` belong to the services built and
    /// are left as they are. Everything is checked before anything changes.
    ///
    /// ```
    /// use tower_throttle::backoff::Backoff429Layer;
    /// use tower_throttle::config::BackoffConfig;
    /// use tower_throttle::key::GlobalKey;
    ///
    /// let handle = Backoff429Layer::new(GlobalKey).handle();
    /// let mut config = BackoffConfig::default();
    /// config.initial_backoff = Some("2s".into());
    /// config.max_backoff = Some("0s".into()); // a fixed 2 s
    /// config.apply_to(&handle)?;
    /// assert_eq!(handle.backoff().base(3).as_secs(), 2);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn apply_to(&self, handle: &BackoffHandle) -> Result<(), ConfigError> {
        self.check()?;
        let initial =
            duration("initial_backoff", &self.initial_backoff)?.unwrap_or(DEFAULT_INITIAL_BACKOFF);
        let max = duration("max_backoff", &self.max_backoff)?.unwrap_or(DEFAULT_MAX_BACKOFF);
        let max_cooldown =
            duration("max_cooldown", &self.max_cooldown)?.unwrap_or(DEFAULT_MAX_COOLDOWN);
        let backoff =
            ExponentialBackoff::new(initial, max).with_jitter(self.jitter.unwrap_or(0.0))?;
        handle.set_backoff(backoff);
        handle.set_max_cooldown(max_cooldown);
        handle.set_on_503(self.on_503.unwrap_or(false));
        handle.set_proactive(self.proactive.unwrap_or(false));
        Ok(())
    }

    fn layer<X>(&self, extractor: X) -> Result<Backoff429Layer<X>, ConfigError> {
        let mut layer = Backoff429Layer::new(extractor);
        if self.mode.as_deref() == Some("wait") {
            if let Some(d) = duration("max_wait", &self.max_wait)? {
                layer = layer.with_max_wait(d);
            }
        }
        if let Some(d) = duration("initial_backoff", &self.initial_backoff)? {
            layer = layer.with_initial_backoff(d);
        }
        if let Some(d) = duration("max_backoff", &self.max_backoff)? {
            layer = layer.with_max_backoff(d);
        }
        if let Some(d) = duration("max_cooldown", &self.max_cooldown)? {
            layer = layer.with_max_cooldown(d);
        }
        if let Some(j) = self.jitter {
            layer = layer.with_jitter(j).map_err(|e| e.within("jitter"))?;
        }
        Ok(layer
            .on_503(self.on_503.unwrap_or(false))
            .proactive(self.proactive.unwrap_or(false)))
    }
}

impl Stack {
    /// The rate-limit layer, keyed by `extractor`, if configured; on the
    /// `[store]`, when there is one.
    pub fn rate_limit_layer<X>(&self, extractor: X) -> Option<RateLimitLayer<X>> {
        let layer = RateLimitLayer::from_limits(self.rate_limit.as_ref()?, extractor);
        #[cfg(feature = "redis")]
        let layer = match &self.redis {
            // Its quotas were checked against the store by `validate`.
            Some(store) => layer.stored(store.clone()),
            None => layer,
        };
        Some(layer)
    }

    /// The Redis store of the `[store]` section, if there is one: for
    /// layers built by hand to share it.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis_store(&self) -> Option<&crate::redis::RedisStore> {
        self.redis.as_ref()
    }

    /// The concurrency layer, keyed by `extractor`, if configured.
    pub fn concurrency_layer<X>(
        &self,
        extractor: X,
    ) -> Result<Option<ConcurrencyLayer<X>>, ConfigError> {
        self.concurrency
            .as_ref()
            .map(|c| c.layer(extractor).map_err(|e| e.within("concurrency")))
            .transpose()
    }

    /// The backoff layer, keyed by `extractor`, if configured.
    pub fn backoff_layer<X>(
        &self,
        extractor: X,
    ) -> Result<Option<Backoff429Layer<X>>, ConfigError> {
        let layer = self
            .backoff
            .as_ref()
            .map(|c| c.layer(extractor).map_err(|e| e.within("backoff")))
            .transpose()?;
        #[cfg(feature = "redis")]
        let layer = match (layer, &self.redis) {
            (Some(layer), Some(store)) => Some(layer.with_store(store.clone())),
            (layer, _) => layer,
        };
        Ok(layer)
    }

    /// The identity layer, if configured.
    pub fn identity_layer(&self) -> Result<Option<IdentityHeaderLayer>, ConfigError> {
        self.identity
            .clone()
            .map(|c| c.build().map_err(|e| e.within("identity")))
            .transpose()
    }

    /// Merge a later configuration layer that may only tighten (see
    /// [`Limits::tighten_with`]): rate limits as there; concurrency and
    /// queue limits to the smaller; a later backoff section may lengthen
    /// cooldowns but not shorten them; identity rules of the later layer
    /// come first (the first match wins). Returns what was ignored.
    pub fn tighten_with(&self, later: &Stack) -> (Stack, Vec<crate::rate_limit::Ignored>) {
        let mut ignored = Vec::new();
        let rate_limit = match (&self.rate_limit, &later.rate_limit) {
            (Some(a), Some(b)) => {
                let (merged, mut i) = a.tighten_with(b);
                ignored.append(&mut i);
                Some(merged)
            }
            (Some(a), None) => Some(a.clone()),
            (None, Some(b)) => Some(b.clone()),
            (None, None) => None,
        };
        let concurrency = match (&self.concurrency, &later.concurrency) {
            (Some(a), Some(b)) => Some(ConcurrencyConfig {
                max_in_flight: a.max_in_flight.min(b.max_in_flight),
                max_queue: min_opt(a.max_queue, b.max_queue),
                queue_timeout: min_duration(&a.queue_timeout, &b.queue_timeout),
                release_at_headers: Some(
                    a.release_at_headers.unwrap_or(false) && b.release_at_headers.unwrap_or(false),
                ),
                shared: a.shared.or(b.shared),
            }),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let backoff = match (&self.backoff, &later.backoff) {
            (Some(a), Some(b)) => Some(BackoffConfig {
                mode: a.mode.clone(),
                max_wait: a.max_wait.clone(),
                initial_backoff: max_duration(&a.initial_backoff, &b.initial_backoff),
                max_backoff: max_duration(&a.max_backoff, &b.max_backoff),
                max_cooldown: max_duration(&a.max_cooldown, &b.max_cooldown),
                jitter: a.jitter,
                on_503: Some(a.on_503.unwrap_or(false) || b.on_503.unwrap_or(false)),
                proactive: Some(a.proactive.unwrap_or(false) || b.proactive.unwrap_or(false)),
            }),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let identity = match (&self.identity, &later.identity) {
            (Some(a), Some(b)) => {
                let mut rules = b.rules.clone();
                rules.extend(a.rules.iter().cloned());
                let mut merged = a.clone();
                merged.rules = rules;
                Some(merged)
            }
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        (
            Stack {
                rate_limit,
                concurrency,
                backoff,
                identity,
                // Where the state lives is not a limit: the earlier layer's
                // store stands.
                store: self.store.clone().or_else(|| later.store.clone()),
                #[cfg(feature = "redis")]
                redis: self.redis.clone().or_else(|| later.redis.clone()),
            },
            ignored,
        )
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn parse(text: &Option<String>) -> Option<Duration> {
    text.as_deref()
        .and_then(|t| humantime::parse_duration(t.trim()).ok())
}

fn min_duration(a: &Option<String>, b: &Option<String>) -> Option<String> {
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) if y < x => b.clone(),
        (Some(_), _) => a.clone(),
        (None, _) => b.clone(),
    }
}

fn max_duration(a: &Option<String>, b: &Option<String>) -> Option<String> {
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) if y > x => b.clone(),
        (Some(_), _) => a.clone(),
        (None, _) => b.clone(),
    }
}
