//! The `[concurrency]` section of a configuration file.

use serde::Deserialize;

use super::ConcurrencyLayer;
use std::time::Duration;

use crate::config::{count, min_count, min_duration, optional_duration_text};
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
    #[serde(default, with = "optional_duration_text")]
    pub queue_timeout: Option<Duration>,
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
        Ok(())
    }

    pub(crate) fn layer<X>(&self, extractor: X) -> Result<ConcurrencyLayer<X>, ConfigError> {
        let layer = ConcurrencyLayer::new(count("max_in_flight", self.max_in_flight)?, extractor)?;
        self.configure(layer)
    }

    /// `layer` with this section's waiting line and release point (its
    /// `max_in_flight` is the layer's own): for a program that keeps one
    /// layer across reloads, resizes it through its handle, and configures
    /// a clone of it for each configuration. `max_queue` and
    /// `release_at_headers` left out take their defaults; a `queue_timeout`
    /// left out leaves the layer's as it was, so configure a clone of a
    /// layer built without one (as the example gateway does).
    pub fn configure<X, L>(
        &self,
        mut layer: ConcurrencyLayer<X, L>,
    ) -> Result<ConcurrencyLayer<X, L>, ConfigError> {
        self.check()?;
        layer = layer.with_max_queue(match self.max_queue {
            Some(q) => count("max_queue", q)?,
            None => usize::MAX,
        });
        if let Some(t) = self.queue_timeout {
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
            queue_timeout: min_duration(self.queue_timeout, later.queue_timeout),
            release_at_headers: Some(
                self.release_at_headers.unwrap_or(false)
                    && later.release_at_headers.unwrap_or(false),
            ),
            shared: self.shared.or(later.shared),
        }
    }
}
