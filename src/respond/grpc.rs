//! `GrpcStatusLayer`: a refusal turned into the gRPC status a gRPC client
//! expects (feature `tonic`).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower_layer::Layer;
use tower_service::Service;

use super::layer::poll_ready_keeping_error;
use super::rejection::{Refused, Rejection};
use crate::error::BoxError;
use crate::redact::Escaped;

/// The metadata of gRPC's retry design that tells a client when to retry:
/// milliseconds, or a negative value for "do not retry".
pub const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// The gRPC status for `rejection`, as [`GrpcStatusLayer`] answers it: its
/// code, a message that shows keys as the layers do (secret parts as
/// fingerprints), a `google.rpc.RetryInfo` detail with the exact delay
/// when one is known, and the [`PUSHBACK`] metadata.
///
/// | refusal | code | why |
/// |---|---|---|
/// | rate limited | `RESOURCE_EXHAUSTED` | a quota of the caller's ran out ("perhaps a per-user quota"); retry after the delay |
/// | cost too high, body too large | `RESOURCE_EXHAUSTED` | more than a quota or a message limit can ever hold; pushback −1: do not retry |
/// | queue full, queue timeout | `UNAVAILABLE` | the server is busy now, not the caller over its quota; a transient state gRPC clients retry with backoff |
/// | cooling down | `UNAVAILABLE` | what this service calls asked for a pause; retry after it |
/// | store unavailable | `UNAVAILABLE` | the shared store did not answer; transient |
/// | missing or ambiguous key, unreadable body | `INVALID_ARGUMENT` | the call itself is wrong; retrying it changes nothing |
pub fn status_of(rejection: &Rejection<'_>) -> Status {
    let (code, retry, never) = match rejection {
        Rejection::RateLimited(e) => (Code::ResourceExhausted, Some(e.retry_after), false),
        Rejection::CostTooHigh(_) | Rejection::BodyTooLarge(_) => {
            (Code::ResourceExhausted, None, true)
        }
        Rejection::QueueFull(_) | Rejection::QueueTimeout(_) | Rejection::StoreUnavailable(_) => {
            (Code::Unavailable, None, false)
        }
        Rejection::CoolingDown(e) => (Code::Unavailable, Some(e.retry_after), false),
        Rejection::MissingKey(_) | Rejection::AmbiguousKey(_) | Rejection::BodyUnreadable(_) => {
            (Code::InvalidArgument, None, false)
        }
    };
    let message = rejection.message();
    let mut status = match retry {
        Some(delay) => {
            Status::with_error_details(code, message, ErrorDetails::with_retry_info(Some(delay)))
        }
        None => Status::new(code, message),
    };
    let pushback = match (retry, never) {
        (Some(delay), _) => Some(pushback_ms(delay)),
        (None, true) => Some(-1),
        (None, false) => None,
    };
    if let Some(ms) = pushback {
        status
            .metadata_mut()
            .insert(PUSHBACK, MetadataValue::from(ms));
    }
    status
}

/// Milliseconds, rounded up (a client retrying early is refused again).
fn pushback_ms(delay: Duration) -> i64 {
    let ms = delay.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Turns this crate's refusals into gRPC statuses, making the wrapped
/// service infallible: for a tonic `Server`, in place of
/// [`ThrottleResponseLayer`](super::ThrottleResponseLayer)'s HTTP answers.
/// Each refusal is a trailers-only gRPC response with the status of
/// [`status_of`], on unary and streaming methods alike (a call is judged
/// when it starts). A `tonic::Status` the inner layers fail with passes as
/// it is; any other error is `INTERNAL` with a message that holds nothing
/// of it (it is logged, escaped).
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_throttle::key::HeaderKey;
/// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
/// use tower_throttle::respond::GrpcStatusLayer;
///
/// // Around every service of a tonic `Server`:
/// // `Server::builder().layer(throttle).add_service(...)`.
/// let throttle = ServiceBuilder::new()
///     .layer(GrpcStatusLayer::new())
///     .layer(RateLimitLayer::new(Quota::per_second(10)?, HeaderKey::new("x-api-key")?));
/// # let _ = throttle;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcStatusLayer;

impl GrpcStatusLayer {
    /// The layer.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for GrpcStatusLayer {
    type Service = GrpcStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcStatus {
            inner,
            not_ready: None,
        }
    }
}

/// The service of [`GrpcStatusLayer`].
pub struct GrpcStatus<S> {
    inner: S,
    /// An error the inner service was not ready with: the next call's
    /// answer (the service itself stays infallible).
    not_ready: Option<BoxError>,
}

impl<S: Clone> Clone for GrpcStatus<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            not_ready: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for GrpcStatus<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcStatus")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> GrpcStatus<S> {
    inner_service_accessors!(inner: S);
}

impl<S, R, B> Service<R> for GrpcStatus<S>
where
    S: Service<R, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: Default,
{
    type Response = http::Response<B>;
    type Error = Infallible;
    type Future = GrpcStatusFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        poll_ready_keeping_error(&mut self.inner, &mut self.not_ready, cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        match self.not_ready.take() {
            Some(error) => GrpcStatusFuture {
                future: None,
                error: Some(error),
            },
            None => GrpcStatusFuture {
                future: Some(self.inner.call(req)),
                error: None,
            },
        }
    }
}

pin_project! {
    /// The response future of [`GrpcStatus`].
    pub struct GrpcStatusFuture<F> {
        #[pin]
        future: Option<F>,
        error: Option<BoxError>,
    }
}

impl<F> fmt::Debug for GrpcStatusFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcStatusFuture").finish_non_exhaustive()
    }
}

impl<F, E, B> Future for GrpcStatusFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: Default,
{
    type Output = Result<http::Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let error: BoxError = match this.future.as_pin_mut() {
            Some(future) => match ready!(future.poll(cx)) {
                Ok(response) => return Poll::Ready(Ok(response)),
                Err(error) => error.into(),
            },
            None => this
                .error
                .take()
                .unwrap_or_else(|| "response future polled after completion".into()),
        };
        Poll::Ready(Ok(answer(&error)))
    }
}

/// The trailers-only response for `error`.
fn answer<B: Default>(error: &BoxError) -> http::Response<B> {
    let Some(rejection) = Rejection::of(error) else {
        if let Some(status) = error.downcast_ref::<Status>() {
            return status.clone().into_http();
        }
        // Not a refusal: its text may quote what a client sent.
        tracing::error!(error = %Escaped(&error.to_string()), "service failed");
        return Status::internal("internal error").into_http();
    };
    let mut response: http::Response<B> = status_of(&rejection).into_http();
    response.extensions_mut().insert(Refused::of(&rejection));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BodyTooLarge, CoolingDown, QueueFull, RateLimited};

    fn answered(error: impl Into<BoxError>) -> Status {
        let response: http::Response<()> = answer(&error.into());
        assert_eq!(
            response.headers()["content-type"],
            "application/grpc",
            "a gRPC answer"
        );
        Status::from_header_map(response.headers()).expect("a status in the headers")
    }

    fn pushback(status: &Status) -> Option<&str> {
        status
            .metadata()
            .get(PUSHBACK)
            .map(|v| v.to_str().expect("ascii"))
    }

    #[test]
    fn a_rate_limit_says_its_exact_delay() {
        let delay = Duration::new(1, 250_000_001);
        let status = answered(RateLimited::new("k".to_owned(), delay));
        assert_eq!(status.code(), Code::ResourceExhausted);
        let info = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(delay));
        // Rounded up: a client retrying at the pushback is not early.
        assert_eq!(pushback(&status), Some("1251"));
    }

    #[test]
    fn a_cooldown_is_unavailable_with_its_delay() {
        let status = answered(CoolingDown::new("route".to_owned(), Duration::from_secs(7)));
        assert_eq!(status.code(), Code::Unavailable);
        let info = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(Duration::from_secs(7)));
        assert_eq!(pushback(&status), Some("7000"));
    }

    #[test]
    fn what_can_never_fit_says_do_not_retry() {
        let status = answered(BodyTooLarge::new(10));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.get_details_retry_info().is_none());
        assert_eq!(pushback(&status), Some("-1"));
    }

    #[test]
    fn a_full_queue_is_unavailable_without_a_delay() {
        let status = answered(QueueFull::new("k".to_owned(), 3));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(pushback(&status), None);
    }

    #[test]
    fn other_errors_tell_nothing_and_statuses_pass() {
        let status = answered("upstream said: secret-token-123");
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"), "{status:?}");
        let status = answered(Status::not_found("no such thing"));
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "no such thing");
    }
}
