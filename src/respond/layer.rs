//! `MakeResponse` and `ThrottleResponseLayer`: a refusal turned into an HTTP answer (429, 503, 413 or 400).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::headers::RateLimitHeaders;
use super::rejection::{Refused, Rejection, ceil_secs};
use crate::error::BoxError;
use crate::rate_limit::DEFAULT_POLICY;
use crate::redact::Escaped;

/// Builds the response for a rejection. Implemented for closures
/// `Fn(&Rejection<'_>) -> http::Response<B>`; `Retry-After` and the
/// rate-limit headers are added afterwards unless the closure set them.
pub trait MakeResponse<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn make(&self, rejection: &Rejection<'_>) -> http::Response<B>;
}

/// The default body: JSON with the error's code, message and retry-after in
/// seconds, and for a rate limit whose layer has a
/// [name](crate::rate_limit::RateLimitLayer::with_name), that name
/// (`"limit"`).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonBody;

impl<B: From<String>> MakeResponse<B> for JsonBody {
    fn make(&self, rejection: &Rejection<'_>) -> http::Response<B> {
        let mut body = serde_json::json!({
            "error": {
                "code": rejection.code(),
                "message": rejection.message(),
                "retry_after": rejection.retry_after().map(|d| d.as_secs_f64()),
            }
        });
        // Which of several limits refused, when its layer is named.
        if let Some(limit) = rejection.limit() {
            body["error"]["limit"] = serde_json::Value::from(limit);
        }
        let mut response = http::Response::new(B::from(body.to_string()));
        *response.status_mut() = rejection.status();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

impl<B, F> MakeResponse<B> for F
where
    F: Fn(&Rejection<'_>) -> http::Response<B> + Clone + Send + Sync + 'static,
{
    fn make(&self, rejection: &Rejection<'_>) -> http::Response<B> {
        self(rejection)
    }
}

/// Turns this crate's refusals into HTTP responses, making the wrapped
/// service infallible (what an axum `Router` needs). See the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct ThrottleResponseLayer<M = JsonBody> {
    headers: RateLimitHeaders,
    make: M,
}

impl ThrottleResponseLayer {
    /// JSON bodies and the IETF rate-limit headers.
    pub fn new() -> Self {
        Self {
            headers: RateLimitHeaders::ietf(),
            make: JsonBody,
        }
    }
}

impl Default for ThrottleResponseLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> ThrottleResponseLayer<M> {
    /// Which rate-limit headers refusals carry.
    pub fn with_headers(mut self, headers: RateLimitHeaders) -> Self {
        self.headers = headers;
        self
    }

    /// Build refusals' responses with `make` (a closure over the
    /// [`Rejection`]).
    pub fn with_response<M2>(self, make: M2) -> ThrottleResponseLayer<M2> {
        ThrottleResponseLayer {
            headers: self.headers,
            make,
        }
    }
}

impl<S, M: Clone> Layer<S> for ThrottleResponseLayer<M> {
    type Service = ThrottleResponse<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        ThrottleResponse {
            inner,
            headers: self.headers,
            make: self.make.clone(),
            not_ready: None,
        }
    }
}

/// The service made by [`ThrottleResponseLayer`].
pub struct ThrottleResponse<S, M> {
    inner: S,
    headers: RateLimitHeaders,
    make: M,
    /// The inner service failed to become ready: the next call is answered
    /// with this error, without calling it.
    not_ready: Option<BoxError>,
}

impl<S: Clone, M: Clone> Clone for ThrottleResponse<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            headers: self.headers,
            make: self.make.clone(),
            not_ready: None,
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for ThrottleResponse<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleResponse")
            .field("inner", &self.inner)
            .field("headers", &self.headers)
            .field("make", &std::any::type_name::<M>())
            .finish()
    }
}

impl<S, M> ThrottleResponse<S, M> {
    inner_service_accessors!(inner: S);
}

impl<S, R, B, M> Service<R> for ThrottleResponse<S, M>
where
    S: Service<R, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: From<String>,
    M: MakeResponse<B>,
{
    type Response = http::Response<B>;
    type Error = Infallible;
    type Future = ThrottleResponseFuture<S::Future, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        poll_ready_keeping_error(&mut self.inner, &mut self.not_ready, cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let inner = match self.not_ready.take() {
            Some(error) => Inner::Failed { error: Some(error) },
            None => Inner::Called {
                future: self.inner.call(req),
            },
        };
        ThrottleResponseFuture {
            inner,
            headers: self.headers,
            make: self.make.clone(),
        }
    }
}

/// `inner`'s readiness, made infallible for an adapter that answers every
/// error: a readiness error is kept in `not_ready` for the next call to
/// answer, and the adapter is ready (until then, without asking `inner`).
pub(super) fn poll_ready_keeping_error<S, R>(
    inner: &mut S,
    not_ready: &mut Option<BoxError>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), Infallible>>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    if not_ready.is_some() {
        return Poll::Ready(Ok(()));
    }
    if let Err(error) = ready!(inner.poll_ready(cx)) {
        *not_ready = Some(error.into());
    }
    Poll::Ready(Ok(()))
}

pin_project! {
    /// The response future of [`ThrottleResponse`].
    pub struct ThrottleResponseFuture<F, M> {
        #[pin]
        inner: Inner<F>,
        headers: RateLimitHeaders,
        make: M,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<F> {
        Called { #[pin] future: F },
        Failed { error: Option<BoxError> },
    }
}

impl<F, M> fmt::Debug for ThrottleResponseFuture<F, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleResponseFuture")
            .finish_non_exhaustive()
    }
}

impl<F, E, B, M> Future for ThrottleResponseFuture<F, M>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    E: Into<BoxError>,
    B: From<String>,
    M: MakeResponse<B>,
{
    type Output = Result<http::Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let error: BoxError = match this.inner.project() {
            InnerProj::Called { future } => match ready!(future.poll(cx)) {
                Ok(response) => return Poll::Ready(Ok(response)),
                Err(error) => error.into(),
            },
            InnerProj::Failed { error } => error
                .take()
                .unwrap_or_else(|| "response future polled after completion".into()),
        };
        let Some(rejection) = Rejection::of(&error) else {
            // Not a refusal: do not leak its text to the client, and log it
            // escaped (an inner error may quote what a client sent).
            tracing::error!(error = %Escaped(&error.to_string()), "service failed");
            let mut response = http::Response::new(B::from(
                r#"{"error":{"code":"internal","message":"internal error"}}"#.to_owned(),
            ));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return Poll::Ready(Ok(response));
        };
        let mut response = this.make.make(&rejection);
        response.extensions_mut().insert(Refused::of(&rejection));
        let headers = response.headers_mut();
        if let Some(wait) = rejection.retry_after() {
            if !headers.contains_key(RETRY_AFTER) {
                headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(wait)));
            }
        }
        if let Rejection::RateLimited(limited) = rejection {
            if !headers.contains_key("ratelimit") && !headers.contains_key("x-ratelimit-limit") {
                this.headers.write(
                    headers,
                    limited.policy.as_deref().unwrap_or(DEFAULT_POLICY),
                    limited.quota.as_ref(),
                    0,
                    limited.retry_after,
                );
            }
        }
        Poll::Ready(Ok(response))
    }
}
