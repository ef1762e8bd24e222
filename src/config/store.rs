//! The `[store]` section: where the shared state lives.

use std::time::Duration;

use serde::Deserialize;

use super::optional_duration_text;
use crate::error::{ConfigError, OnError};

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
    #[serde(default, with = "optional_duration_text")]
    pub timeout: Option<Duration>,
    /// `"open"` (default: let requests through) or `"closed"` (refuse them,
    /// 503) while Redis is unreachable.
    #[serde(default)]
    pub on_error: Option<OnError>,
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
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if cfg!(not(feature = "redis")) {
            return Err(ConfigError::new(
                "",
                "this build has no Redis store: enable tower-throttle's `redis` feature",
            ));
        }
        if self.redis_url.trim().is_empty() {
            return Err(ConfigError::new("redis_url", "must not be empty"));
        }
        if self.timeout.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new("timeout", "must be longer than zero"));
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
        use crate::redis::RedisStore;

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
        if let Some(timeout) = self.timeout {
            store = store.with_timeout(timeout);
        }
        store = store.with_on_error(self.on_error.unwrap_or_default());
        store = store.with_local_fallback(self.local_fallback.unwrap_or(true));
        if let Some(secret) = self.secret()? {
            store = store.with_hash_key(secret)?;
        }
        Ok(store)
    }
}

#[cfg(all(test, not(feature = "redis")))]
mod tests {
    use crate::config::StackConfig;

    #[test]
    fn a_build_without_redis_refuses_a_store_section_by_name() {
        let err = StackConfig::from_toml("[store]\nredis_url = \"redis://127.0.0.1:6379\"")
            .and_then(|c| c.validate())
            .unwrap_err();
        assert_eq!(err.field, "store", "{err}");
        assert!(err.to_string().contains("`redis` feature"), "{err}");
    }
}
