//! One configuration file for a whole client or server stack: rate limits
//! with rules, concurrency, upstream backoff and identity rules.
//!
//! Each layer's section lives with its layer (`rate_limit::RateLimitConfig`,
//! `concurrency::ConcurrencyConfig`, `backoff::BackoffConfig`,
//! `identity::IdentityConfig`); this module composes them into
//! [`StackConfig`], holds the `[store]` section, and reads every value
//! through one parser ([`parse_duration`]).
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

mod read;
mod store;
mod value;

use serde::Deserialize;

use crate::backoff::Backoff429Layer;
pub use crate::backoff::BackoffConfig;
pub use crate::concurrency::ConcurrencyConfig;
use crate::concurrency::ConcurrencyLayer;
use crate::error::ConfigError;
use crate::identity::{IdentityConfig, IdentityHeaderLayer};
use crate::rate_limit::{Limits, RateLimitConfig, RateLimitLayer};
pub use read::from_toml;
pub use store::StoreConfig;
pub use value::{Mode, duration_text, optional_duration_text, parse_duration};
pub(crate) use value::{count, max_duration, min_count, min_duration};

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
    /// The top-level keys of the sections above.
    pub const SECTIONS: [&'static str; 5] =
        ["rate_limit", "concurrency", "backoff", "identity", "store"];

    /// Parse TOML (see [`from_toml`] for how errors read).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        from_toml(text)
    }

    /// Parse a program's own file that holds these sections beside its own
    /// (a gateway's `[gateway]` and `[[providers]]`): the sections named in
    /// [`SECTIONS`](Self::SECTIONS) are read as this configuration, every
    /// other top-level key as `T`. Each side keeps its unknown-field checks
    /// (give `T` `#[serde(deny_unknown_fields)]`), and an error names its
    /// field and line as [`from_toml`]'s do.
    ///
    /// ```
    /// use serde::Deserialize;
    /// use tower_throttle::config::StackConfig;
    ///
    /// #[derive(Deserialize)]
    /// #[serde(deny_unknown_fields)]
    /// struct Server { listen: String }
    ///
    /// let (stack, own) = StackConfig::from_toml_with::<Server>(
    ///     "listen = \"127.0.0.1:8080\"\n[concurrency]\nmax_in_flight = 4\n",
    /// )?;
    /// assert_eq!(own.listen, "127.0.0.1:8080");
    /// assert_eq!(stack.concurrency.unwrap().max_in_flight, 4);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn from_toml_with<T: serde::de::DeserializeOwned>(
        text: &str,
    ) -> Result<(Self, T), ConfigError> {
        let (stack, own) = read::split(read::parse(text)?, &Self::SECTIONS);
        let stack = read::read(text, stack)?;
        let own = read::read(text, own).map_err(|mut e| {
            // The program's own keys are listed as expected; the crate's
            // sections are as likely meant.
            if e.message.starts_with("unknown field") && !e.field.contains(['.', '[']) {
                let sections = Self::SECTIONS.map(|s| format!("`{s}`")).join(", ");
                let (said, at) = match e.message.find(" (line ") {
                    Some(i) => e.message.split_at(i),
                    None => (e.message.as_str(), ""),
                };
                e.message = format!("{said}, or a section {sections}{at}");
            }
            e
        })?;
        Ok((stack, own))
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
            (Some(a), Some(b)) => Some(a.tightened(b)),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        let backoff = match (&self.backoff, &later.backoff) {
            (Some(a), Some(b)) => Some(a.tightened(b)),
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
