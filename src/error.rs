//! Typed errors shared by every layer.
//!
//! The layers return [`BoxError`]; each failure is its own small type, found
//! again by downcasting:
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::error::{BoxError, RateLimited};
//!
//! fn retry_hint(err: &BoxError) -> Option<Duration> {
//!     err.downcast_ref::<RateLimited>().map(|e| e.retry_after)
//! }
//! # let _ = retry_hint;
//! ```
//!
//! The key an error names is the key as it may be shown: a secret part (the
//! value of an `x-api-key` or `Authorization` header, a client address) is
//! given as its [fingerprint](crate::redact::Fingerprint), so a `Display`
//! of any of these errors can go to a log or a client as it is.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::rate_limit::Quota;

/// The error type of every service in this crate: tower's boxed error.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// Seconds with millisecond precision: "1.250 s".
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} s", self.0.as_secs_f64())
    }
}

/// The request's key is over its limit; nothing was sent to the inner service
/// and nothing was consumed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimited {
    /// The key as it may be shown: parts joined by `/`, a secret part (an
    /// API key, a token, a client address) as its
    /// [fingerprint](crate::redact::Fingerprint), the others with control
    /// characters [escaped](crate::redact::Escaped). Never the raw text of
    /// a secret, so the error can be logged and sent to the client.
    pub key: String,
    /// How long until this key would admit this request: the exact instant,
    /// not the window length.
    pub retry_after: Duration,
    /// The quota that refused (of several, the one with the longest wait).
    pub quota: Option<Quota>,
    /// The rule whose quotas apply (`(default)` for the default quotas).
    pub policy: Option<String>,
}

impl RateLimited {
    /// A refusal on `key`, retryable after `retry_after`.
    pub fn new(key: String, retry_after: Duration) -> Self {
        Self {
            key,
            retry_after,
            quota: None,
            policy: None,
        }
    }

    /// The same refusal, naming the quota and the rule that refused.
    pub fn with_quota(mut self, quota: Quota, policy: impl Into<String>) -> Self {
        self.quota = Some(quota);
        self.policy = Some(policy.into());
        self
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rate limited on key `{}`; retry after {}",
            self.key,
            Secs(self.retry_after)
        )
    }
}

impl Error for RateLimited {}

/// The request costs more than its key's capacity, so no wait would ever
/// admit it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CostTooHigh {
    /// The key as it may be shown (see [`RateLimited::key`]).
    pub key: String,
    /// What the request would cost.
    pub cost: u32,
    /// The most one admission can cost (the burst, or the window's limit).
    pub capacity: u32,
}

impl CostTooHigh {
    pub(crate) fn new(key: String, cost: u32, capacity: u32) -> Self {
        Self {
            key,
            cost,
            capacity,
        }
    }
}

impl fmt::Display for CostTooHigh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request on key `{}` costs {} but at most {} can ever be admitted at once",
            self.key, self.cost, self.capacity
        )
    }
}

impl Error for CostTooHigh {}

/// No key could be extracted from the request and no fallback key is set.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MissingKey {
    /// What was looked for, e.g. "header `x-api-key`".
    pub wanted: String,
}

impl MissingKey {
    /// A missing key, saying what was looked for.
    pub fn new(wanted: impl Into<String>) -> Self {
        Self {
            wanted: wanted.into(),
        }
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request has no limit key ({} missing) and no fallback key is set",
            self.wanted
        )
    }
}

impl Error for MissingKey {}

/// The key's wait queue is full; the request was refused at once.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueFull {
    /// The key as it may be shown (see [`RateLimited::key`]).
    pub key: String,
    /// The queue limit that was reached.
    pub max_queue: usize,
}

impl QueueFull {
    /// A full queue on `key`.
    pub fn new(key: String, max_queue: usize) -> Self {
        Self { key, max_queue }
    }
}

impl fmt::Display for QueueFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "queue for key `{}` is full ({} waiting)",
            self.key, self.max_queue
        )
    }
}

impl Error for QueueFull {}

/// The request waited in the key's queue for as long as allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueTimeout {
    /// The key as it may be shown (see [`RateLimited::key`]).
    pub key: String,
    /// How long it waited.
    pub waited: Duration,
}

impl QueueTimeout {
    /// A queue timeout on `key` after `waited`.
    pub fn new(key: String, waited: Duration) -> Self {
        Self { key, waited }
    }
}

impl fmt::Display for QueueTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up waiting for key `{}` after {}",
            self.key,
            Secs(self.waited)
        )
    }
}

impl Error for QueueTimeout {}

/// The upstream told us to back off on this key and the cooldown has not
/// passed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoolingDown {
    /// The key as it may be shown (see [`RateLimited::key`]).
    pub key: String,
    /// How long until the cooldown ends.
    pub retry_after: Duration,
}

impl CoolingDown {
    /// A cooldown on `key` with `retry_after` left.
    pub fn new(key: String, retry_after: Duration) -> Self {
        Self { key, retry_after }
    }
}

impl fmt::Display for CoolingDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key `{}` is cooling down after an upstream refusal; retry after {}",
            self.key,
            Secs(self.retry_after)
        )
    }
}

impl Error for CoolingDown {}

/// A limit or option was given a value it cannot hold. Returned when a layer
/// or quota is built, never at request time.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The field or argument at fault, e.g. `quota.limit`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl ConfigError {
    /// An error on `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl ConfigError {
    /// The same error, with `prefix` put before its field path:
    /// `burst` within `rules[2]` is `rules[2].burst`.
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_owned()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl Error for ConfigError {}
