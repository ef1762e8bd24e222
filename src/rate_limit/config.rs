//! Configuration from files: serde types, validation that names the field
//! at fault, and the tighten-only merge of configuration layers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::quota::{Algorithm, Quota, Unit};
use super::rule::{KeyPattern, Rule, check_names};
use crate::config::{Mode, duration_text, optional_duration_text};
use crate::error::ConfigError;

/// A rate limiter's configuration as written in a file.
///
/// ```
/// use tower_throttle::rate_limit::RateLimitConfig;
///
/// let config = RateLimitConfig::from_toml(r#"
///     mode = "wait"
///     max_wait = "5s"
///
///     [[quotas]]
///     limit = 60
///     period = "1m"
///
///     [[rules]]
///     name = "claude"
///     provider = "opencode"
///     model = "claude-*"
///     quotas = [
///         { limit = 500, period = "1m", algorithm = "sliding_window" },
///         { limit = 10000, period = "1d" },
///     ]
/// "#)?;
/// let limits = config.validate()?;
/// assert_eq!(limits.rules[0].quotas().len(), 2);
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// The master switch; off, every request passes untouched. Default on.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Admit everything but count what would have been refused. Default off.
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// `"reject"` (default) or `"wait"`.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// In wait mode, the longest a request may wait, e.g. `"5s"`.
    #[serde(default, with = "optional_duration_text")]
    pub max_wait: Option<Duration>,
    /// The quotas every key gets unless a rule matches it. None: unlimited.
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// Per-key rules; the most specific match wins.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

/// One quota as written in a file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaConfig {
    /// Units per period; 0 means unlimited (the quota is left out).
    pub limit: i64,
    /// The period, e.g. `"1m"`, `"60s"`, `"1d"`, `"500ms"`.
    #[serde(with = "duration_text")]
    pub period: Duration,
    /// `"token_bucket"` (default), `"sliding_window"`, `"fixed_window"`,
    /// `"turn_budget"` or `"sliding_window_counter"` (approximate; see
    /// [`Algorithm::SlidingWindowCounter`]).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// The token bucket's capacity; default the limit.
    #[serde(default)]
    pub burst: Option<i64>,
    /// What it counts: `"cost"` (default; one per request unless the layer
    /// has a cost function) or `"requests"` (one per request whatever its
    /// cost). See [`Unit`].
    #[serde(default)]
    pub unit: Option<String>,
}

/// One rule as written in a file: a name, which keys, and their quotas.
///
/// Keys are matched by `provider` and `model` (the two parts of a route
/// key; a missing one matches anything), by `parts` (one pattern per key
/// part), or by `key` (one pattern on the key's text): one of the three.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Identifies the rule across retunes and config layers; default its
    /// pattern.
    #[serde(default)]
    pub name: Option<String>,
    /// Pattern on the first key part.
    #[serde(default)]
    pub provider: Option<String>,
    /// Pattern on the second key part.
    #[serde(default)]
    pub model: Option<String>,
    /// One pattern per key part.
    #[serde(default)]
    pub parts: Option<Vec<String>>,
    /// One pattern on the key's whole text.
    #[serde(default)]
    pub key: Option<String>,
    /// The rule's quotas; none means its keys are unlimited.
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// Decide but do not enforce for this rule's keys.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// A validated configuration: what a layer or a handle applies.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// The master switch.
    pub enabled: bool,
    /// Decide without enforcing.
    pub dry_run: bool,
    /// Zero in reject mode; the longest wait in wait mode.
    pub max_wait: Duration,
    /// The quotas of keys no rule matches.
    pub default: Vec<Quota>,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            enabled: true,
            dry_run: false,
            max_wait: Duration::ZERO,
            default: Vec::new(),
            rules: Vec::new(),
        }
    }
}

impl RateLimitConfig {
    /// Parse TOML. Unknown fields are errors (see
    /// [`config::from_toml`](crate::config::from_toml) for how errors read).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        crate::config::from_toml(text)
    }

    /// Check every field and build the [`Limits`]; the first error names
    /// its field (`rules[2].quotas[0].burst`) and value.
    pub fn validate(&self) -> Result<Limits, ConfigError> {
        let max_wait = match self.mode.unwrap_or_default() {
            Mode::Reject => Duration::ZERO,
            Mode::Wait => match self.max_wait {
                Some(wait) if !wait.is_zero() => wait,
                _ => {
                    return Err(ConfigError::new(
                        "max_wait",
                        "wait mode needs a max_wait above zero, e.g. \"5s\"",
                    ));
                }
            },
        };
        let default = quotas(&self.quotas).map_err(|e| e.within("quotas"))?;
        let rules = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                rule.validate()
                    .map_err(|e| e.within(&format!("rules[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_names(&rules)?;
        Ok(Limits {
            enabled: self.enabled.unwrap_or(true),
            dry_run: self.dry_run.unwrap_or(false),
            max_wait,
            default,
            rules,
        })
    }
}

impl RuleConfig {
    fn validate(&self) -> Result<Rule, ConfigError> {
        let route = self.provider.is_some() || self.model.is_some();
        let (pattern, text) = match (route, &self.parts, &self.key) {
            (true, None, None) => {
                let provider = self.provider.as_deref().unwrap_or("*");
                let model = self.model.as_deref().unwrap_or("*");
                let pattern = KeyPattern::parts([provider, model]).map_err(|e| {
                    let field = if e.field == "parts[0]" {
                        "provider"
                    } else {
                        "model"
                    };
                    ConfigError::new(field, e.message)
                })?;
                (pattern, format!("{provider}/{model}"))
            }
            (false, Some(parts), None) => (
                KeyPattern::parts(parts.iter().map(String::as_str))?,
                parts.join("/"),
            ),
            (false, None, Some(key)) => (KeyPattern::text(key)?, key.clone()),
            (false, None, None) => {
                return Err(ConfigError::new(
                    "key",
                    "a rule needs `provider`/`model`, `parts` or `key` to say which keys it is for",
                ));
            }
            _ => {
                return Err(ConfigError::new(
                    "key",
                    "use only one of `provider`/`model`, `parts` and `key`",
                ));
            }
        };
        let name = match &self.name {
            Some(name) if name.trim().is_empty() => {
                return Err(ConfigError::new("name", "a rule name cannot be blank"));
            }
            Some(name) => name.clone(),
            None => text,
        };
        let mut rule = Rule::new(name, pattern).with_dry_run(self.dry_run.unwrap_or(false));
        for quota in quotas(&self.quotas).map_err(|e| e.within("quotas"))? {
            rule = rule.with_quota(quota);
        }
        Ok(rule)
    }
}

/// Validate a list of quotas, leaving out those with limit 0 (unlimited).
fn quotas(list: &[QuotaConfig]) -> Result<Vec<Quota>, ConfigError> {
    let mut out = Vec::new();
    for (i, quota) in list.iter().enumerate() {
        if let Some(quota) = quota.validate().map_err(|e| e.within(&format!("[{i}]")))? {
            out.push(quota);
        }
    }
    Ok(out)
}

impl QuotaConfig {
    /// The quota, or `None` for limit 0 (unlimited).
    fn validate(&self) -> Result<Option<Quota>, ConfigError> {
        let limit = count("limit", self.limit)?;
        let period = self.period;
        let algorithm = self.algorithm.unwrap_or(Algorithm::TokenBucket);
        let unit = match self.unit.as_deref() {
            None => Unit::Cost,
            Some(name) => [Unit::Cost, Unit::Requests]
                .into_iter()
                .find(|u| u.as_str() == name)
                .ok_or_else(|| {
                    ConfigError::new(
                        "unit",
                        // Escaped where shown (`ConfigError`'s `Display`).
                        format!("`{name}` is not a unit; use \"cost\" or \"requests\""),
                    )
                })?,
        };
        if limit == 0 {
            if self.burst.is_some_and(|b| b != 0) {
                return Err(ConfigError::new(
                    "burst",
                    "a burst needs a limit; limit 0 means unlimited",
                ));
            }
            return Ok(None);
        }
        let mut quota = Quota::new(limit, period)?
            .with_algorithm(algorithm)
            .with_unit(unit);
        if let Some(burst) = self.burst {
            let burst = count("burst", burst)?;
            if burst == 0 {
                return Err(ConfigError::new(
                    "burst",
                    format!(
                        "0 with a limit of {limit} would admit nothing; leave it out for a burst of {limit}"
                    ),
                ));
            }
            quota = quota.with_burst(burst)?;
        }
        Ok(Some(quota))
    }
}

/// A non-negative count that fits a `u32`.
fn count(field: &str, value: i64) -> Result<u32, ConfigError> {
    if value < 0 {
        return Err(ConfigError::new(field, format!("{value} is negative")));
    }
    u32::try_from(value)
        .map_err(|_| ConfigError::new(field, format!("{value} is larger than {}", u32::MAX)))
}

/// A setting a later configuration layer tried to relax, and which was kept
/// as the earlier layer had it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ignored {
    /// Where: `enabled`, `rules[claude].quotas[1m sliding_window].limit`, …
    pub field: String,
    /// What the later layer asked for, and what stands.
    pub reason: String,
}

impl Limits {
    /// Merge a later configuration layer (a project's config over a user's,
    /// a provider's limits over both) that may only tighten.
    ///
    /// The later layer may add quotas and rules and lower limits, bursts and
    /// waits. It may not raise a limit, remove one (what it leaves out
    /// stands), turn a positive cap into unlimited, switch limiting off or
    /// to dry run, or change an existing rule's pattern. Each such attempt is
    /// ignored and reported in the returned list, so a caller can log it;
    /// the merge itself never fails. A rule the later layer adds also keeps
    /// every quota the earlier layer could have applied to its keys (the
    /// default's and those of earlier rules whose patterns may overlap), so
    /// a new, more specific rule cannot relax them either.
    pub fn tighten_with(&self, later: &Limits) -> (Limits, Vec<Ignored>) {
        let mut ignored = Vec::new();
        let mut merged = self.clone();
        if self.enabled && !later.enabled {
            ignored.push(Ignored::new("enabled", "cannot switch limiting off"));
        }
        merged.enabled = self.enabled || later.enabled;
        if !self.dry_run && later.dry_run {
            ignored.push(Ignored::new("dry_run", "cannot switch enforcement off"));
        }
        merged.dry_run = self.dry_run && later.dry_run;
        if later.max_wait > self.max_wait {
            ignored.push(Ignored::new(
                "max_wait",
                format!(
                    "cannot lengthen {:?} to {:?}",
                    self.max_wait, later.max_wait
                ),
            ));
        }
        merged.max_wait = self.max_wait.min(later.max_wait);
        merged.default = tighten_quotas(&self.default, &later.default, "quotas", &mut ignored);
        for rule in &later.rules {
            let field = format!("rules[{}]", rule.name);
            match merged.rules.iter_mut().find(|r| r.name == rule.name) {
                Some(earlier) => {
                    if earlier.pattern != rule.pattern {
                        ignored.push(Ignored::new(
                            format!("{field}.pattern"),
                            format!("cannot change {:?} to {:?}", earlier.pattern, rule.pattern),
                        ));
                    }
                    if !earlier.dry_run && rule.dry_run {
                        ignored.push(Ignored::new(
                            format!("{field}.dry_run"),
                            "cannot switch enforcement off",
                        ));
                    }
                    earlier.dry_run = earlier.dry_run && rule.dry_run;
                    earlier.quotas = tighten_quotas(
                        &earlier.quotas,
                        &rule.quotas,
                        &format!("{field}.quotas"),
                        &mut ignored,
                    );
                }
                None => {
                    // The keys of a new rule were under the default, or
                    // under an earlier rule its pattern may overlap: it
                    // keeps all of those quotas, lowered by its own.
                    let mut inherited = self.default.clone();
                    for earlier in self
                        .rules
                        .iter()
                        .filter(|r| r.pattern.may_overlap(&rule.pattern))
                    {
                        inherited =
                            tighten_quotas(&inherited, &earlier.quotas, "", &mut Vec::new());
                    }
                    let mut added = rule.clone();
                    added.quotas = tighten_quotas(
                        &inherited,
                        &rule.quotas,
                        &format!("{field}.quotas"),
                        &mut ignored,
                    );
                    if rule.dry_run && !self.dry_run {
                        ignored.push(Ignored::new(
                            format!("{field}.dry_run"),
                            "cannot switch enforcement off",
                        ));
                    }
                    added.dry_run = rule.dry_run && self.dry_run;
                    merged.rules.push(added);
                }
            }
        }
        (merged, ignored)
    }
}

impl Ignored {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Merge two quota lists, tighten-only: a quota of the same algorithm and
/// period is lowered to the smaller limit and burst; others are added.
fn tighten_quotas(
    earlier: &[Quota],
    later: &[Quota],
    field: &str,
    ignored: &mut Vec<Ignored>,
) -> Vec<Quota> {
    let mut merged = earlier.to_vec();
    for quota in later {
        let same = |q: &&mut Quota| {
            q.algorithm() == quota.algorithm()
                && q.period() == quota.period()
                && q.unit() == quota.unit()
        };
        match merged.iter_mut().find(same) {
            Some(kept) => {
                let name = format!(
                    "{field}[{} {}]",
                    humantime::format_duration(quota.period()),
                    quota.algorithm().as_str()
                );
                if quota.limit() > kept.limit() {
                    ignored.push(Ignored::new(
                        format!("{name}.limit"),
                        format!("cannot raise {} to {}", kept.limit(), quota.limit()),
                    ));
                }
                if quota.burst() > kept.burst() {
                    ignored.push(Ignored::new(
                        format!("{name}.burst"),
                        format!("cannot raise {} to {}", kept.burst(), quota.burst()),
                    ));
                }
                *kept = kept.tightened(quota);
            }
            None => merged.push(*quota),
        }
    }
    merged
}
