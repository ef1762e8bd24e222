//! The `[backoff]` section of a configuration file.

use std::time::Duration;

use serde::Deserialize;

use super::{
    Backoff429Layer, BackoffHandle, DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_COOLDOWN, ExponentialBackoff,
};
use crate::config::{duration, max_duration};
use crate::error::ConfigError;

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

impl BackoffConfig {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
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
        let initial =
            duration("initial_backoff", &self.initial_backoff)?.unwrap_or(DEFAULT_INITIAL_BACKOFF);
        let max = duration("max_backoff", &self.max_backoff)?.unwrap_or(DEFAULT_MAX_BACKOFF);
        let max_cooldown =
            duration("max_cooldown", &self.max_cooldown)?.unwrap_or(DEFAULT_MAX_COOLDOWN);
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
            .with_on_503(self.on_503.unwrap_or(false))
            .with_proactive(self.proactive.unwrap_or(false)))
    }

    /// Merged with a later configuration layer that may lengthen cooldowns
    /// but not shorten them; the mode, `max_wait` and jitter stay this
    /// layer's, and either layer may turn `on_503` and `proactive` on.
    pub(crate) fn tightened(&self, later: &Self) -> Self {
        BackoffConfig {
            mode: self.mode.clone(),
            max_wait: self.max_wait.clone(),
            initial_backoff: max_duration(&self.initial_backoff, &later.initial_backoff),
            max_backoff: max_duration(&self.max_backoff, &later.max_backoff),
            max_cooldown: max_duration(&self.max_cooldown, &later.max_cooldown),
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
