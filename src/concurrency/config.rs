//! The `[concurrency]` section of a configuration file.

use serde::Deserialize;

use super::ConcurrencyLayer;
use crate::config::{count, duration, min_count, min_duration};
use crate::error::ConfigError;

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

impl ConcurrencyConfig {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
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

    pub(crate) fn layer<X>(&self, extractor: X) -> Result<ConcurrencyLayer<X>, ConfigError> {
        let mut layer =
            ConcurrencyLayer::new(count("max_in_flight", self.max_in_flight)?, extractor)?;
        if let Some(q) = self.max_queue {
            layer = layer.with_max_queue(count("max_queue", q)?);
        }
        if let Some(t) = duration("queue_timeout", &self.queue_timeout)? {
            layer = layer.with_queue_timeout(t);
        }
        Ok(layer.with_release_at_headers(self.release_at_headers == Some(true)))
    }

    /// Merged with a later configuration layer that may only tighten: the
    /// smaller caps and timeout; headers release only if both say so.
    pub(crate) fn tightened(&self, later: &Self) -> Self {
        ConcurrencyConfig {
            max_in_flight: self.max_in_flight.min(later.max_in_flight),
            max_queue: min_count(self.max_queue, later.max_queue),
            queue_timeout: min_duration(&self.queue_timeout, &later.queue_timeout),
            release_at_headers: Some(
                self.release_at_headers.unwrap_or(false)
                    && later.release_at_headers.unwrap_or(false),
            ),
            shared: self.shared.or(later.shared),
        }
    }
}
