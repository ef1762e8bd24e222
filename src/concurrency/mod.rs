//! Keyed concurrency limits: [`ConcurrencyLayer`].
//!
//! Each request is mapped to a key by a [key extractor](crate::key); at most
//! N requests per key are in flight at once. The next request waits in a
//! strict FIFO queue per key and gets its permit the moment a predecessor
//! gives one back: no polling, no timer. The queue can be bounded
//! ([`QueueFull`](crate::error::QueueFull)) and the wait limited in time
//! ([`QueueTimeout`](crate::error::QueueTimeout)). With
//! [`ConcurrencyLayer::with_fair_share`], a key's waiters take turns by
//! lane (a caller, say) instead, each lane in its own arrival order.
//!
//! A request is in flight until its response has been read, not merely until
//! its headers arrived: for `http::Response<B>` (and `reqwest::Response`
//! with the `reqwest` feature) the permit moves into the response body
//! ([`ConcurrencyBody`]) and is given back when the body ends, fails or is
//! dropped. An LLM answer streamed for minutes holds its permit for those
//! minutes. [`ConcurrencyLayer::with_release_at_headers`] gives tower's behaviour
//! instead. Other response types choose through [`HoldPermit`].
//!
//! Nothing leaks: a request dropped while waiting leaves the queue at once
//! and never takes a permit; a response future or body dropped gives its
//! permit back. A key with nothing in flight and nobody waiting is idle and
//! is dropped as it goes idle (a few thousand idle keys may stay in all), so
//! a flood of distinct keys gives its memory back.
//!
//! While nobody waits on a key, a request takes and gives back its permit
//! with one atomic operation each, and a service that serves the same key
//! again skips the key lookup. With [`GlobalKey`](crate::key::GlobalKey) no
//! key is read, hashed or looked up at all.
//!
//! ```
//! use tower::{Service, ServiceExt};
//! use tower_throttle::concurrency::ConcurrencyLayer;
//! use tower_throttle::error::QueueFull;
//! use tower_throttle::key::HeaderKey;
//! use tower_throttle::redact::fingerprint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let layer = ConcurrencyLayer::new(1, HeaderKey::new("x-api-key")?)?.with_max_queue(0);
//! let mut svc = tower::ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("streamed answer")))
//!     });
//!
//! let request = || http::Request::builder().header("x-api-key", "alice").body(()).unwrap();
//! // The first answer's body is not read yet: alice's one permit is in use.
//! let answer = svc.ready().await?.call(request()).await?;
//! let refused = svc.ready().await?.call(request()).await.unwrap_err();
//! // An API key is a secret: the error names its fingerprint.
//! let key = &refused.downcast_ref::<QueueFull>().unwrap().key;
//! assert_eq!(*key, fingerprint("alice").to_string());
//!
//! // Done with the body: the permit is back.
//! drop(answer);
//! svc.ready().await?.call(request()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # With a rate limit
//!
//! In a client stack, put the concurrency limit *outside* the rate limit, so
//! that the rate limiter sits next to the upstream:
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_throttle::concurrency::ConcurrencyLayer;
//! use tower_throttle::key::HeaderKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//!
//! let route = HeaderKey::new("x-model")?;
//! let client = ServiceBuilder::new()
//!     .layer(ConcurrencyLayer::new(8, route.clone())?)
//!     .layer(RateLimitLayer::new(Quota::per_minute(60)?, route).with_max_wait(Duration::from_secs(30)))
//!     .service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     });
//! # let _ = client;
//! # Ok::<(), tower_throttle::error::ConfigError>(())
//! ```
//!
//! The rate limiter's admissions are then the instants requests reach the
//! upstream. The other way round, requests the rate limiter admitted one by
//! one pile up in the concurrency queue while a slow response holds the
//! permits, and reach the upstream all at once when it ends: a burst above
//! the rate the provider enforces (the test
//! `concurrency_outside_rate_limit_keeps_the_upstream_within_its_rate` shows
//! both orders). A request that gives up in the concurrency queue would also
//! have spent a rate slot without being sent. The price of this order is that
//! a request waiting for its rate slot holds a concurrency permit meanwhile.
//!
//! # Several replicas
//!
//! Rate limits and cooldowns can live in Redis (the `redis` module, feature
//! `redis`); concurrency permits stay in each replica, by design. Shared, a
//! permit would have to be a lease in Redis that expires unless renewed, so
//! that a crashed replica's permits come back. But a replica that stalls or
//! loses Redis for longer than the lease keeps running requests whose
//! permits have expired and been handed out again: the cap is broken at
//! the moment the upstream is most likely in trouble. A waiter on another
//! replica could only learn of a release by polling or by a notification
//! channel that loses messages on reconnect, never the immediate FIFO grant
//! of this layer; and every request would cost two round trips plus a
//! renewal per lease period while a stream runs. So a `[concurrency]`
//! section asking for `shared = true` is refused when the configuration is
//! checked. With N replicas, give each `max_in_flight / N`.

mod body;
mod config;
mod future;
mod handle;
mod hold;
mod layer;
pub(crate) mod permits;
#[cfg(loom)]
pub(crate) use permits::{Acquire, Granted, KeyState, Lane, Permits, QueueTicket};
mod service;

pub use body::ConcurrencyBody;
pub use config::ConcurrencyConfig;
pub use future::ResponseFuture;
pub use handle::ConcurrencyHandle;
pub use hold::HoldPermit;
pub use layer::ConcurrencyLayer;
pub use permits::Permit;
pub(crate) use service::fair_lane;
pub use service::{Concurrency, NoLanes};
