//! `BufferBodyLayer` and `BufferBody`: read a request's body whole before the inner service.

use std::fmt;
use std::task::{Context, Poll};

use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::body::BufferedBody;
use super::future::ResponseFuture;
use super::read::ReadBody;
use crate::error::{BodyTooLarge, BoxError};

/// Reads each request's body into memory, up to `max_bytes`, before the
/// inner service sees it, so that layers keyed by the body
/// ([`JsonFieldKey`](crate::key::JsonFieldKey)) can read it on a server,
/// where bodies arrive as a stream (axum's `Body`, hyper's `Incoming`).
///
/// The inner service gets an `http::Request<`[`BufferedBody`]`>`. A body
/// longer than `max_bytes` is refused with
/// [`BodyTooLarge`](crate::error::BodyTooLarge) (413 through
/// [`ThrottleResponseLayer`](crate::respond::ThrottleResponseLayer)): at
/// once when its `Content-Length` says so, else as soon as what has arrived
/// passes the limit, so a chunked body that keeps growing is cut off rather
/// than read to its end. A body that fails to arrive (the client went away)
/// is refused with [`BodyUnreadable`](crate::error::BodyUnreadable) (400).
///
/// ```
/// use axum::{Router, routing::post};
/// use tower::ServiceBuilder;
/// use tower_throttle::buffer::BufferBodyLayer;
/// use tower_throttle::key::JsonFieldKey;
/// use tower_throttle::rate_limit::{Quota, RateLimitLayer};
/// use tower_throttle::respond::ThrottleResponseLayer;
///
/// // 60 requests a minute per model named in the JSON body.
/// let app: Router = Router::new()
///     .route("/v1/chat/completions", post(|| async { "{}" }))
///     .layer(
///         ServiceBuilder::new()
///             .layer(ThrottleResponseLayer::new())
///             .layer(BufferBodyLayer::new(64 * 1024))
///             .layer(RateLimitLayer::new(Quota::per_minute(60)?, JsonFieldKey::new("model"))),
///     );
/// # let _ = app;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BufferBodyLayer {
    max_bytes: usize,
}

impl BufferBodyLayer {
    /// Read bodies of at most `max_bytes` bytes; longer ones are refused.
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes }
    }
}

impl<S> Layer<S> for BufferBodyLayer {
    type Service = BufferBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody {
            inner,
            max_bytes: self.max_bytes,
        }
    }
}

/// Reads request bodies into memory, then calls the inner service; made by
/// [`BufferBodyLayer`].
#[derive(Clone)]
pub struct BufferBody<S> {
    inner: S,
    max_bytes: usize,
}

impl<S> BufferBody<S> {
    inner_service_accessors!(inner: S);
}

impl<S: fmt::Debug> fmt::Debug for BufferBody<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBody")
            .field("inner", &self.inner)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl<S, B> Service<http::Request<B>> for BufferBody<S>
where
    S: Service<http::Request<BufferedBody>> + Clone,
    S::Error: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<B, S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let too_large = |n: u64| usize::try_from(n).map_or(true, |n| n > self.max_bytes);
        if declared.is_some_and(too_large) || too_large(body.size_hint().lower()) {
            // Said too long up front: not a byte is read.
            tracing::debug!(
                max_bytes = self.max_bytes,
                "buffer: body declared too large"
            );
            return ResponseFuture::failed(Box::new(BodyTooLarge::new(self.max_bytes)));
        }
        // The ready inner service goes with the request, which it gets once
        // the body is in; this service keeps a fresh clone, to be polled
        // ready again.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let read = ReadBody::new(body, self.max_bytes);
        ResponseFuture::reading(read, parts, inner, self.max_bytes)
    }
}
