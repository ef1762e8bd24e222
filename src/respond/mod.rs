//! Rejections as HTTP responses, for servers.
//!
//! An axum `Router` needs infallible services. [`ThrottleResponseLayer`]
//! sits outside the throttling layers and turns their typed errors into
//! responses, so no `HandleErrorLayer` is needed: a rate limit answers
//! `429 Too Many Requests`, a full queue or a queue timeout
//! `503 Service Unavailable`, each with `Retry-After` (whole seconds, rounded
//! up) and the rate-limit headers ([`RateLimitHeaders`]), and a JSON body:
//!
//! ```json
//! {"error":{"code":"rate_limited","message":"rate limited on key `#5be0c3a1`; retry after 1.250 s","retry_after":1.25}}
//! ```
//!
//! The message names the key as the layers show it: a secret part (here the
//! `x-api-key` value) as its [fingerprint](crate::redact::Fingerprint), so
//! the body never echoes a caller's credential or address.
//!
//! ```
//! use axum::{Router, routing::get};
//! use tower::ServiceBuilder;
//! use tower_throttle::key::HeaderKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//! use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};
//!
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(
//!     ServiceBuilder::new()
//!         .layer(ThrottleResponseLayer::new())
//!         .layer(
//!             RateLimitLayer::new(Quota::per_minute(60)?, HeaderKey::new("x-api-key")?)
//!                 .with_fallback_key("anonymous")
//!                 // Optional: the same headers on admitted responses.
//!                 .with_response_headers(RateLimitHeaders::ietf()),
//!         ),
//! );
//! # let _ = app;
//! # Ok::<(), tower_throttle::error::ConfigError>(())
//! ```
//!
//! Those who prefer their own handling keep the typed errors: leave this
//! layer out and use axum's `HandleErrorLayer`, downcasting the
//! [`BoxError`](crate::error::BoxError) to
//! [`RateLimited`](crate::error::RateLimited) and the others.

#[cfg(feature = "tonic")]
mod grpc;
mod headers;
mod layer;
mod rejection;

#[cfg(feature = "tonic")]
pub use grpc::{GrpcStatus, GrpcStatusFuture, GrpcStatusLayer, PUSHBACK, status_of};

pub use headers::RateLimitHeaders;
pub(crate) use headers::policy_field;
pub use layer::{
    JsonBody, MakeResponse, ThrottleResponse, ThrottleResponseFuture, ThrottleResponseLayer,
};
pub use rejection::{Refused, Rejection};
