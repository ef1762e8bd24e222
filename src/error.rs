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
    /// The rule whose quotas apply
    /// ([`DEFAULT_POLICY`](crate::rate_limit::DEFAULT_POLICY), `(default)`, for
    /// the default quotas).
    pub policy: Option<String>,
    /// The name of the limit that refused, when its layer has one
    /// ([`with_name`](crate::rate_limit::RateLimitLayer::with_name)): which
    /// of several limits (stacked, or judged together by a
    /// [`JointRateLimitLayer`](crate::rate_limit::JointRateLimitLayer))
    /// said no.
    pub limit: Option<String>,
}

impl RateLimited {
    /// A refusal on `key`, retryable after `retry_after`.
    pub fn new(key: String, retry_after: Duration) -> Self {
        Self {
            key,
            retry_after,
            quota: None,
            policy: None,
            limit: None,
        }
    }

    /// The same refusal, naming the quota and the rule that refused.
    pub fn with_quota(mut self, quota: Quota, policy: impl Into<String>) -> Self {
        self.quota = Some(quota);
        self.policy = Some(policy.into());
        self
    }

    /// The same refusal, naming the limit that refused.
    pub fn with_limit(mut self, limit: impl Into<String>) -> Self {
        self.limit = Some(limit.into());
        self
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited on key `{}`", self.key)?;
        if let Some(limit) = &self.limit {
            // A name the program chose, but shown escaped like a key.
            write!(f, " by limit `{}`", crate::redact::Escaped(limit))?;
        }
        write!(f, "; retry after {}", Secs(self.retry_after))
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
    /// The name of the limit that refused, when its layer has one
    /// ([`with_name`](crate::rate_limit::RateLimitLayer::with_name)).
    pub limit: Option<String>,
}

impl CostTooHigh {
    pub(crate) fn new(key: String, cost: u32, capacity: u32) -> Self {
        Self {
            key,
            cost,
            capacity,
            limit: None,
        }
    }

    /// The same refusal, naming the limit that refused.
    pub fn with_limit(mut self, limit: impl Into<String>) -> Self {
        self.limit = Some(limit.into());
        self
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
    /// What to change so the key can be found, when the cause is more
    /// likely the build or the server's setup than the request (e.g. a
    /// feature to enable).
    pub hint: Option<String>,
}

impl MissingKey {
    /// A missing key, saying what was looked for.
    pub fn new(wanted: impl Into<String>) -> Self {
        Self {
            wanted: wanted.into(),
            hint: None,
        }
    }

    /// Say what to change so the key can be found.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request has no limit key ({} missing) and no fallback key is set",
            self.wanted
        )?;
        match &self.hint {
            Some(hint) => write!(f, "; {hint}"),
            None => Ok(()),
        }
    }
}

impl Error for MissingKey {}

/// The request names its key in a way that can be read more than one way,
/// such as a JSON body giving the key field twice. It is refused, never
/// given a fallback key: the limiter could count one key while the inner
/// service (or the upstream behind it) acts on another.
///
/// `Display` names the field and the reason, never the values.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AmbiguousKey {
    /// What was looked for, e.g. "JSON body field `model`".
    pub wanted: String,
    /// Why it can be read more than one way.
    pub reason: Ambiguity,
}

impl AmbiguousKey {
    /// An ambiguous key, saying what was looked for and why.
    pub fn new(wanted: impl Into<String>, reason: Ambiguity) -> Self {
        Self {
            wanted: wanted.into(),
            reason,
        }
    }
}

impl fmt::Display for AmbiguousKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request's limit key is ambiguous ({}: {}); refused",
            self.wanted, self.reason
        )
    }
}

impl Error for AmbiguousKey {}

/// Why an [`AmbiguousKey`] can be read more than one way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ambiguity {
    /// The field is given more than once: parsers differ on which one
    /// counts (serde_json's `Value`, Go, Python and JavaScript take the
    /// last).
    Repeated,
    /// A field whose name differs from the wanted one only in case, which
    /// Go's `encoding/json` reads as the same field.
    CaseVariant,
    /// The body begins as the expected format but does not continue as it,
    /// so a lenient reader could still find a key in it.
    Malformed,
    /// The body is JSON in UTF-16 or UTF-32, which some parsers (Python's
    /// `json.loads` on bytes) decode.
    NotUtf8,
}

impl fmt::Display for Ambiguity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Repeated => "given more than once",
            Self::CaseVariant => "also given with a name differing only in case",
            Self::Malformed => "in a body that is not well-formed",
            Self::NotUtf8 => "in a body that is not UTF-8",
        })
    }
}

/// Why no key could be read from a request: the error of
/// [`KeyExtractor::extract`](crate::key::KeyExtractor::extract).
///
/// A missing key may be replaced by a layer's fallback key; an ambiguous one
/// never is. Layers return the inner error ([`MissingKey`] or
/// [`AmbiguousKey`]) boxed, so it is found by downcasting as before.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The request has no key.
    Missing(MissingKey),
    /// The request's key can be read more than one way.
    Ambiguous(AmbiguousKey),
}

impl KeyError {
    /// What was looked for.
    pub fn wanted(&self) -> &str {
        match self {
            Self::Missing(e) => &e.wanted,
            Self::Ambiguous(e) => &e.wanted,
        }
    }

    /// The inner error, boxed: what the layers fail with.
    pub fn into_box(self) -> BoxError {
        match self {
            Self::Missing(e) => Box::new(e),
            Self::Ambiguous(e) => Box::new(e),
        }
    }
}

impl From<MissingKey> for KeyError {
    fn from(e: MissingKey) -> Self {
        Self::Missing(e)
    }
}

impl From<AmbiguousKey> for KeyError {
    fn from(e: AmbiguousKey) -> Self {
        Self::Ambiguous(e)
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(e) => e.fmt(f),
            Self::Ambiguous(e) => e.fmt(f),
        }
    }
}

impl Error for KeyError {}

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

/// The shared store a layer keeps its state in (Redis) did not answer in
/// time, and the layer fails closed: the request was refused, not sent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreUnavailable {
    /// The key as it may be shown (see [`RateLimited::key`]).
    pub key: String,
}

impl StoreUnavailable {
    /// A refusal of `key` for want of the store.
    pub fn new(key: String) -> Self {
        Self { key }
    }
}

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the shared limit store is unavailable; refused key `{}` (fail closed)",
            self.key
        )
    }
}

impl Error for StoreUnavailable {}

/// A call to the shared store (Redis) that is not an admission failed: it
/// was not answered in time, Redis answered with an error, or it was
/// refused before it was sent (see
/// [`RedisStore::put_note`](crate::redis::RedisStore::put_note)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreCallFailed {
    /// The call: `put_note`, `notes` or `check`.
    pub call: &'static str,
    /// Why, as a sentence.
    pub reason: String,
}

impl StoreCallFailed {
    /// `call` failed for `reason`.
    pub fn new(call: &'static str, reason: impl Into<String>) -> Self {
        Self {
            call,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for StoreCallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the shared store's {} failed: {}",
            self.call, self.reason
        )
    }
}

impl Error for StoreCallFailed {}

/// The request body is longer than a
/// [`BufferBodyLayer`](crate::buffer::BufferBodyLayer) reads; nothing was
/// sent to the inner service.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BodyTooLarge {
    /// The most bytes a body may have.
    pub limit: usize,
}

impl BodyTooLarge {
    /// A body over `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the request body is larger than {} bytes", self.limit)
    }
}

impl Error for BodyTooLarge {}

/// The request body could not be read whole (the client went away, or its
/// framing was broken); nothing was sent to the inner service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BodyUnreadable {}

impl BodyUnreadable {
    /// A body that could not be read.
    pub fn new() -> Self {
        Self {}
    }
}

impl fmt::Display for BodyUnreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body could not be read")
    }
}

impl Error for BodyUnreadable {}

/// A limit or option was given a value it cannot hold. Returned when a layer
/// or quota is built, never at request time.
///
/// Both parts can quote the configuration (a rule's name in the field path,
/// a bad value in the message), so `Display` shows them
/// [escaped](crate::redact::Escaped): an error that reaches a log or a
/// terminal cannot start a line or send an escape sequence.
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
        write!(
            f,
            "invalid `{}`: {}",
            crate::redact::Escaped(&self.field),
            crate::redact::Escaped(&self.message)
        )
    }
}

impl Error for ConfigError {}

/// What a layer does while Redis cannot be reached (or does not answer
/// within the timeout). Defined here, beside the errors it answers, so
/// that a configuration names it in builds without the `redis` feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnError {
    /// Fail open: let requests through. By default each replica then holds
    /// them to an in-process limiter with the same quotas, so a limit still
    /// holds per replica (see `RedisStore::with_local_fallback`).
    #[default]
    Open,
    /// Fail closed: refuse requests with
    /// [`StoreUnavailable`], a 503 through
    /// [`ThrottleResponseLayer`](crate::respond::ThrottleResponseLayer).
    Closed,
}

impl OnError {
    /// The name configuration files use: `open` or `closed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
        }
    }
}
