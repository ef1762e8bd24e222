//! The `[backoff]` section of a configuration file.

use std::time::Duration;

use serde::Deserialize;

use super::{
    Backoff429Layer, BackoffHandle, DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_COOLDOWN, ExponentialBackoff,
};
use crate::config::{Mode, max_duration, optional_duration_text};
use crate::error::ConfigError;

/// The `[backoff]` section.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    /// `"reject"` (default) or `"wait"`.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// In wait mode, the longest a request may wait out a cooldown.
    #[serde(default, with = "optional_duration_text")]
    pub max_wait: Option<Duration>,
    /// The first cooldown when the upstream gives no time; default 1s.
    #[serde(default, with = "optional_duration_text")]
    pub initial_backoff: Option<Duration>,
    /// The longest cooldown of the doubling rule; `"0s"`: no doubling, every
    /// cooldown the rule starts lasts `initial_backoff`.
    #[serde(default, with = "optional_duration_text")]
    pub max_backoff: Option<Duration>,
    /// The longest cooldown anything may start, headers included.
    #[serde(default, with = "optional_duration_text")]
    pub max_cooldown: Option<Duration>,
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

impl BackoffConfig {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.mode == Some(Mode::Wait) && self.max_wait.is_none_or(|d| d.is_zero()) {
            return Err(ConfigError::new(
                "max_wait",
                "wait mode needs a max_wait above zero, e.g. \"10s\"",
            ));
        }
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

    /// Renamed [`BackoffHandle::apply`]: configuration is applied through
    /// the handle, as [`RateLimitHandle::apply`](crate::rate_limit::RateLimitHandle::apply) does.
    #[deprecated(since = "0.1.0", note = "use `BackoffHandle::apply(&config)`")]
    #[doc(hidden)]
    pub fn apply_to(&self, handle: &BackoffHandle) -> Result<(), ConfigError> {
        handle.apply(self)
    }

    /// What a running layer takes from this section, checked: the backoff
    /// rule, the longest cooldown, `on_503` and `proactive`, each left out
    /// taking its default.
    pub(crate) fn live(&self) -> Result<Live, ConfigError> {
        self.check()?;
        let initial = self.initial_backoff.unwrap_or(DEFAULT_INITIAL_BACKOFF);
        let max = self.max_backoff.unwrap_or(DEFAULT_MAX_BACKOFF);
        let max_cooldown = self.max_cooldown.unwrap_or(DEFAULT_MAX_COOLDOWN);
        let backoff =
            ExponentialBackoff::new(initial, max).with_jitter(self.jitter.unwrap_or(0.0))?;
        Ok(Live {
            backoff,
            max_cooldown,
            on_503: self.on_503.unwrap_or(false),
            proactive: self.proactive.unwrap_or(false),
        })
    }

    pub(crate) fn layer<X>(&self, extractor: X) -> Result<Backoff429Layer<X>, ConfigError> {
        let mut layer = Backoff429Layer::new(extractor).with_max_wait(self.wait());
        if let Some(d) = self.initial_backoff {
            layer = layer.with_initial_backoff(d);
        }
        if let Some(d) = self.max_backoff {
            layer = layer.with_max_backoff(d);
        }
        if let Some(d) = self.max_cooldown {
            layer = layer.with_max_cooldown(d);
        }
        if let Some(j) = self.jitter {
            layer = layer.with_jitter(j).map_err(|e| e.within("jitter"))?;
        }
        Ok(layer
            .with_on_503(self.on_503.unwrap_or(false))
            .with_proactive(self.proactive.unwrap_or(false)))
    }

    /// The longest a request may wait out a cooldown: `max_wait` in wait
    /// mode, zero (refuse at once) otherwise.
    pub fn wait(&self) -> Duration {
        match self.mode {
            Some(Mode::Wait) => self.max_wait.unwrap_or(Duration::ZERO),
            _ => Duration::ZERO,
        }
    }

    /// Merged with a later configuration layer that may lengthen cooldowns
    /// but not shorten them; the mode, `max_wait` and jitter stay this
    /// layer's, and either layer may turn `on_503` and `proactive` on.
    pub(crate) fn tightened(&self, later: &Self) -> Self {
        BackoffConfig {
            mode: self.mode,
            max_wait: self.max_wait,
            initial_backoff: max_duration(self.initial_backoff, later.initial_backoff),
            max_backoff: max_duration(self.max_backoff, later.max_backoff),
            max_cooldown: max_duration(self.max_cooldown, later.max_cooldown),
            jitter: self.jitter,
            on_503: Some(self.on_503.unwrap_or(false) || later.on_503.unwrap_or(false)),
            proactive: Some(self.proactive.unwrap_or(false) || later.proactive.unwrap_or(false)),
        }
    }
}

/// The settings of a `[backoff]` section a running layer takes through its
/// handle.
pub(crate) struct Live {
    pub(crate) backoff: ExponentialBackoff,
    pub(crate) max_cooldown: Duration,
    pub(crate) on_503: bool,
    pub(crate) proactive: bool,
}
