//! A [`tower::retry::Policy`] that honours the same headers as the layer.

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use tokio::time::Sleep;
use tower::retry::Policy;
use tower::retry::budget::{Budget, TpsBudget};

use super::exponential::ExponentialBackoff;
use super::headers::cooldown_from_headers;
use crate::error::{BoxError, ConfigError};
use crate::parts::ResponseParts;

/// How many times a request is sent at most, by default: the first attempt
/// and two retries.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The longest delay a retry waits, by default: 60 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);

/// A request that can be sent again: one whose body is in memory.
///
/// Implemented for `http::Request<B>` with a cloneable body and, with the
/// `reqwest` feature, `reqwest::Request` (unless its body is a stream).
pub trait CloneRequest: Sized {
    /// A copy to send again, or `None` when the request cannot be copied.
    fn clone_request(&self) -> Option<Self>;
}

impl<B: Clone> CloneRequest for http::Request<B> {
    fn clone_request(&self) -> Option<Self> {
        Some(self.clone())
    }
}

#[cfg(feature = "reqwest")]
impl CloneRequest for reqwest::Request {
    fn clone_request(&self) -> Option<Self> {
        self.try_clone()
    }
}

/// Which errors of the inner service are worth a retry.
///
/// Implemented by [`NoErrors`], [`ConnectErrors`] and closures
/// `Fn(&E) -> bool`.
pub trait RetryErrors<E> {
    /// True when `error` should be retried.
    fn should_retry(&self, error: &E) -> bool;
}

impl<E, F: Fn(&E) -> bool> RetryErrors<E> for F {
    fn should_retry(&self, error: &E) -> bool {
        self(error)
    }
}

/// Retry no errors, only 429 and 503 responses (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoErrors;

impl<E> RetryErrors<E> for NoErrors {
    fn should_retry(&self, _error: &E) -> bool {
        false
    }
}

/// Retry errors that show the request never reached the server: connection
/// refused, host or network unreachable, address not available — an
/// `io::Error` of such a kind anywhere in the error's source chain, or a
/// `reqwest::Error` that says it failed to connect (feature `reqwest`).
///
/// A connection reset or a timeout is not one: the server may have acted on
/// the request.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnectErrors;

impl RetryErrors<BoxError> for ConnectErrors {
    fn should_retry(&self, error: &BoxError) -> bool {
        is_connect_error(&**error)
    }
}

impl RetryErrors<io::Error> for ConnectErrors {
    fn should_retry(&self, error: &io::Error) -> bool {
        is_connect_error(error)
    }
}

#[cfg(feature = "reqwest")]
impl RetryErrors<reqwest::Error> for ConnectErrors {
    fn should_retry(&self, error: &reqwest::Error) -> bool {
        is_connect_error(error)
    }
}

fn is_connect_error(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        #[cfg(feature = "reqwest")]
        if error
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_connect)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Retries 429 and 503 responses after the delay they advise, for
/// [`tower::retry::Retry`].
///
/// - The delay comes from the response headers as the layer reads them
///   ([`cooldown_from_headers`](super::cooldown_from_headers)); without
///   one, from an [`ExponentialBackoff`] over the attempts so far.
/// - A response that advises a delay longer than
///   [`with_max_delay`](Self::with_max_delay) is not retried: it is returned
///   as it is, so a caller is never parked for an hour by a header.
/// - At most [`with_max_attempts`](Self::with_max_attempts) sends per request,
///   the first included.
/// - Every retry is withdrawn from a [budget](tower::retry::budget) that each
///   first attempt deposits into, so retries stay a fraction of the traffic
///   even when the upstream refuses everything. Clones share the budget.
/// - Errors of the inner service are not retried unless asked for
///   ([`retry_connect_errors`](Self::retry_connect_errors),
///   [`retry_errors`](Self::retry_errors)).
///
/// Only requests that can be cloned ([`CloneRequest`]) are retried.
///
/// ```
/// use std::time::Duration;
/// use tower::retry::RetryLayer;
/// use tower_throttle::backoff::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .with_max_attempts(4)?
///     .with_max_delay(Duration::from_secs(20))
///     .retry_connect_errors();
/// let layer = RetryLayer::new(policy);
/// # let _ = layer;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
pub struct RetryPolicy<C = NoErrors> {
    max_attempts: u32,
    /// Sends made so far; each request's policy is a fresh clone.
    attempts: u32,
    backoff: ExponentialBackoff,
    max_delay: Duration,
    on_503: bool,
    errors: C,
    budget: Arc<dyn Budget + Send + Sync>,
}

impl RetryPolicy {
    /// Retry 429 and 503 responses: three sends at most, delays from the
    /// headers or else 1 s doubling to 30 s, none longer than 60 s, and
    /// tower's default budget (20% of requests, plus 10 retries a second).
    pub fn new() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            attempts: 0,
            backoff: ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(30)),
            max_delay: DEFAULT_MAX_DELAY,
            on_503: true,
            errors: NoErrors,
            budget: Arc::new(TpsBudget::default()),
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> RetryPolicy<C> {
    /// Send each request at most `attempts` times, the first included. Zero
    /// is an error; one means never retry.
    pub fn with_max_attempts(mut self, attempts: u32) -> Result<Self, ConfigError> {
        if attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1 (the first attempt)",
            ));
        }
        self.max_attempts = attempts;
        Ok(self)
    }

    /// The delays when a response advises none.
    pub fn with_backoff(mut self, backoff: ExponentialBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Do not retry a response that advises a longer delay than `max`.
    pub fn with_max_delay(mut self, max: Duration) -> Self {
        self.max_delay = max;
        self
    }

    /// Retry 503 responses too (on by default).
    pub fn with_on_503(mut self, enabled: bool) -> Self {
        self.on_503 = enabled;
        self
    }

    /// Renamed [`with_on_503`](Self::with_on_503): every setting is a
    /// `with_*`.
    #[deprecated(since = "0.1.0", note = "renamed `with_on_503`")]
    #[doc(hidden)]
    pub fn on_503(self, enabled: bool) -> Self {
        self.with_on_503(enabled)
    }

    /// Withdraw retries from `budget`, shared with whoever else holds it.
    pub fn with_budget<B: Budget + Send + Sync + 'static>(mut self, budget: Arc<B>) -> Self {
        self.budget = budget;
        self
    }

    /// Also retry errors that show the request never reached the server.
    pub fn retry_connect_errors(self) -> RetryPolicy<ConnectErrors> {
        self.retry_errors(ConnectErrors)
    }

    /// Also retry the errors `errors` picks.
    pub fn retry_errors<C2>(self, errors: C2) -> RetryPolicy<C2> {
        RetryPolicy {
            max_attempts: self.max_attempts,
            attempts: self.attempts,
            backoff: self.backoff,
            max_delay: self.max_delay,
            on_503: self.on_503,
            errors,
            budget: self.budget,
        }
    }

    /// The delay before retrying `result`, or `None` if it is not retried
    /// whatever the limits.
    fn delay<Res: ResponseParts, E>(&self, result: &Result<Res, E>) -> Option<Duration>
    where
        C: RetryErrors<E>,
    {
        match result {
            Ok(response) => {
                // A gRPC refusal, read as the HTTP status it stands for.
                let status = super::grpc::as_http_status(response.status(), response.headers());
                if status != StatusCode::TOO_MANY_REQUESTS
                    && !(status == StatusCode::SERVICE_UNAVAILABLE && self.on_503)
                {
                    return None;
                }
                let advised = cooldown_from_headers(
                    response.status(),
                    response.headers(),
                    SystemTime::now(),
                    Duration::MAX,
                );
                Some(advised.map_or_else(|| self.backoff.delay(self.attempts), |(wait, _)| wait))
            }
            Err(error) => self
                .errors
                .should_retry(error)
                .then(|| self.backoff.delay(self.attempts)),
        }
    }
}

impl<Req, Res, E, C> Policy<Req, Res, E> for RetryPolicy<C>
where
    Req: CloneRequest,
    Res: ResponseParts,
    C: RetryErrors<E>,
{
    type Future = Sleep;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        self.attempts = self.attempts.saturating_add(1);
        if self.attempts == 1 {
            self.budget.deposit();
        }
        let delay = self.delay(result)?;
        if self.attempts >= self.max_attempts {
            tracing::debug!(attempts = self.attempts, "retry: attempt limit reached");
            return None;
        }
        if delay > self.max_delay {
            tracing::debug!(?delay, max = ?self.max_delay, "retry: advised delay too long");
            return None;
        }
        if !self.budget.withdraw() {
            tracing::debug!("retry: budget spent");
            return None;
        }
        tracing::debug!(?delay, attempt = self.attempts + 1, "retry: retrying");
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        req.clone_request()
    }
}

impl<C: Clone> Clone for RetryPolicy<C> {
    fn clone(&self) -> Self {
        Self {
            max_attempts: self.max_attempts,
            attempts: self.attempts,
            backoff: self.backoff,
            max_delay: self.max_delay,
            on_503: self.on_503,
            errors: self.errors.clone(),
            budget: self.budget.clone(),
        }
    }
}

impl<C> fmt::Debug for RetryPolicy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("attempts", &self.attempts)
            .field("backoff", &self.backoff)
            .field("max_delay", &self.max_delay)
            .field("on_503", &self.on_503)
            .field("errors", &std::any::type_name::<C>())
            .finish_non_exhaustive()
    }
}
