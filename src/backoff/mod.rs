//! Upstream cooldown: [`Backoff429Layer`].
//!
//! When the upstream answers 429 Too Many Requests (and, by option, 503 with
//! `Retry-After`), the request's route (its key, read by a [key
//! extractor](crate::key)) enters a cooldown: its next requests are refused
//! at once with [`CoolingDown`](crate::error::CoolingDown), or wait for the
//! end in arrival order, so the provider is not hammered while it is already
//! refusing. Other routes are untouched, and the 429 response itself goes
//! back to the caller unchanged.
//!
//! The cooldown lasts as long as the response says
//! ([`cooldown_from_headers`]: `retry-after-ms`, `Retry-After`, the OpenAI,
//! Anthropic and `X-RateLimit-Reset` reset headers, the IETF `RateLimit`
//! field, and a gRPC server's `RetryInfo` or `grpc-retry-pushback-ms` on a
//! `RESOURCE_EXHAUSTED` or `UNAVAILABLE` refusal, read as a 429 or a 503),
//! or else follows an [`ExponentialBackoff`] over the route's consecutive
//! 429s. Nothing a server sends cools a route longer than the
//! layer's `max_cooldown`.
//!
//! To keep below a provider's limits rather than meet them,
//! [`announced_limits`] reads what each response says of them (the OpenAI,
//! Anthropic and IETF limit headers).
//!
//! For callers who want the refused request sent again, [`RetryPolicy`] is a
//! [`tower::retry::Policy`] that reads the same headers.
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceExt};
//! use tower_throttle::backoff::Backoff429Layer;
//! use tower_throttle::error::CoolingDown;
//! use tower_throttle::key::HeaderKey;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // An upstream that refuses everything and asks for two seconds' peace.
//! let upstream = tower::service_fn(|_req: http::Request<()>| async {
//!     let refusal = http::Response::builder()
//!         .status(429)
//!         .header("retry-after", "2")
//!         .body(())
//!         .unwrap();
//!     Ok::<_, std::convert::Infallible>(refusal)
//! });
//! let layer = Backoff429Layer::new(HeaderKey::new("x-model")?);
//! let handle = layer.handle();
//! let mut svc = tower::ServiceBuilder::new().layer(layer).service(upstream);
//!
//! let request = || http::Request::builder().header("x-model", "gpt-4o").body(()).unwrap();
//! // The 429 itself comes back to the caller...
//! let response = svc.ready().await?.call(request()).await?;
//! assert_eq!(response.status(), 429);
//! // ...and the route is left alone until the upstream is ready again.
//! let refused = svc.ready().await?.call(request()).await.unwrap_err();
//! let refused = refused.downcast_ref::<CoolingDown>().unwrap();
//! assert_eq!(refused.key, "gpt-4o");
//! assert!(refused.retry_after <= Duration::from_secs(2));
//! assert_eq!(handle.cooldowns()[0].key, "gpt-4o");
//! # Ok(())
//! # }
//! ```

mod announced;
mod config;
mod cooldown;
mod exponential;
mod future;
mod grpc;
mod handle;
mod headers;
mod layer;
#[cfg(feature = "redis")]
mod redis;
mod retry;
mod service;
mod stats;

pub use announced::{
    Announced, Announcement, HeaderFamily, PROVIDER_WINDOW, announced_limits, announced_limits_in,
};
pub use config::BackoffConfig;
pub use exponential::ExponentialBackoff;
pub use future::ResponseFuture;
pub use handle::BackoffHandle;
pub use headers::{Reason, cooldown_from_headers};
pub use layer::{
    Backoff429Layer, DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF, DEFAULT_MAX_COOLDOWN,
};
pub use retry::{
    CloneRequest, ConnectErrors, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DELAY, NoErrors, RetryErrors,
    RetryPolicy,
};
pub use service::Backoff429;
pub use stats::{BackoffSnapshot, BackoffSubscription, CooldownEntry};
