//! Keyed rate limiting: [`RateLimitLayer`].
//!
//! Each request is mapped to a key by a [key extractor](crate::key), and each
//! key is held to a [`Quota`] under one of three [`Algorithm`]s: a token
//! bucket (GCRA), an exact sliding window, or fixed windows. A request over
//! its key's limit is refused before the inner service is called, with the
//! exact time until the key would admit it
//! ([`RateLimited::retry_after`](crate::error::RateLimited)); or, in wait
//! mode, it waits for its turn in strict arrival order. Several limits, each
//! on its own key, are judged as one by a [`JointRateLimitLayer`].
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_throttle::error::RateLimited;
//! use tower_throttle::key::HeaderKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//! use tower_throttle::redact::fingerprint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let layer = RateLimitLayer::new(Quota::per_minute(2)?, HeaderKey::new("x-api-key")?);
//! let mut svc = tower::ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     });
//!
//! let request = || http::Request::builder().header("x-api-key", "alice").body(()).unwrap();
//! svc.ready().await?.call(request()).await?;
//! svc.ready().await?.call(request()).await?;
//! let refused = svc.ready().await?.call(request()).await.unwrap_err();
//! let refused = refused.downcast_ref::<RateLimited>().unwrap();
//! // An API key is a secret: the error (and its `Display`) shows only a
//! // fingerprint, `#` and 8 hex digits, the same for every request of alice's.
//! assert_eq!(refused.key, fingerprint("alice").to_string());
//! assert!(!refused.to_string().contains("alice"));
//! assert!(refused.retry_after.as_secs() <= 30);
//! # Ok(())
//! # }
//! ```

mod accounting;
mod algorithm;
mod config;
mod future;
mod handle;
mod joint;
mod layer;
mod limiter;
pub(crate) mod lines;
mod policy;
mod quota;
#[cfg(feature = "redis")]
pub(crate) mod redis;
mod rule;
mod service;
mod settlement;
mod table;

pub use accounting::{
    Annotate, Cost, CountAll, CountUnlessRefused, Counts, Estimated, NoAnnotation, OneUnit,
};
pub use config::{Ignored, Limits, QuotaConfig, RateLimitConfig, RuleConfig};
pub use future::ResponseFuture;
pub use handle::RateLimitHandle;
pub use joint::{JointRateLimit, JointRateLimitLayer, JointResponseFuture};
pub use layer::RateLimitLayer;
pub use limiter::RateLimitInfo;
#[cfg(feature = "redis")]
pub(crate) use limiter::check_quotas;
pub use policy::DEFAULT_POLICY;
pub use quota::{Algorithm, DEFAULT_STALE_TURN, MAX_PERIOD, Quota, Unit};
pub use rule::{KeyPattern, Rule};
pub use service::RateLimit;
pub use settlement::Settlement;
