//! What `/stats` shows of a learning route: what its provider said, the
//! quotas its configuration gives it and those it is held to now.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tower_throttle::backoff::{Announced, Announcement};
use tower_throttle::rate_limit::Quota;

/// What a route's provider said of one unit, and when.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitInfo {
    /// Units per window.
    pub limit: Option<u64>,
    /// Units left when it was said.
    pub remaining: Option<u64>,
    /// Seconds until the limit was whole again, as said.
    pub reset_seconds: Option<f64>,
    /// The window, seconds.
    pub window_seconds: Option<f64>,
    /// When it was said, Unix seconds.
    pub learned_unix: f64,
}

impl UnitInfo {
    fn new(said: &Announced, at: SystemTime) -> Self {
        Self {
            limit: said.limit,
            remaining: said.remaining,
            reset_seconds: said.reset.map(|d| d.as_secs_f64()),
            window_seconds: said.window.map(|d| d.as_secs_f64()),
            learned_unix: at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }
}

/// A route's learned limits, as `/stats` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LearnedInfo {
    /// The rule the route is limited by.
    pub rule: String,
    /// Requests.
    pub requests: Option<UnitInfo>,
    /// Tokens (input and output).
    pub tokens: Option<UnitInfo>,
    /// Input tokens.
    pub input_tokens: Option<UnitInfo>,
    /// Output tokens.
    pub output_tokens: Option<UnitInfo>,
    /// Whether a learned request or token limit holds the route now (false
    /// before any, and after a release).
    pub in_force: bool,
    /// The quotas the configuration gives the route.
    pub configured: Vec<QuotaInfo>,
    /// The quotas the route is held to now: the configured ones, tightened
    /// by what is in force.
    pub quotas: Vec<QuotaInfo>,
}

/// One quota, as `/stats` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QuotaInfo {
    /// Units per period.
    pub limit: u32,
    /// The period, seconds.
    pub period_seconds: f64,
    /// The most admitted at once (a token bucket's burst).
    pub burst: u32,
    /// `token_bucket`, `sliding_window`, `fixed_window`, `turn_budget` or
    /// `sliding_window_counter` ([`Algorithm::as_str`](tower_throttle::rate_limit::Algorithm::as_str)).
    pub algorithm: &'static str,
    /// `requests` or `cost` (tokens, on the gateway).
    pub unit: &'static str,
}

impl From<&Quota> for QuotaInfo {
    fn from(q: &Quota) -> Self {
        Self {
            limit: q.limit(),
            period_seconds: q.period().as_secs_f64(),
            burst: q.burst(),
            algorithm: q.algorithm().as_str(),
            unit: q.unit().as_str(),
        }
    }
}

impl LearnedInfo {
    /// The units said, with their names as `/metrics` labels them.
    pub fn units(&self) -> [(&'static str, Option<&UnitInfo>); 4] {
        [
            ("requests", self.requests.as_ref()),
            ("tokens", self.tokens.as_ref()),
            ("input_tokens", self.input_tokens.as_ref()),
            ("output_tokens", self.output_tokens.as_ref()),
        ]
    }
}

pub(super) fn record(info: &mut LearnedInfo, said: &Announcement, at: SystemTime) {
    let units = [
        (&mut info.requests, &said.requests),
        (&mut info.tokens, &said.tokens),
        (&mut info.input_tokens, &said.input_tokens),
        (&mut info.output_tokens, &said.output_tokens),
    ];
    for (slot, said) in units {
        if !said.is_empty() {
            *slot = Some(UnitInfo::new(said, at));
        }
    }
}
