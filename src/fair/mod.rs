//! A fair share of a waiting line: [`FairQueueLayer`] and [`PassTurnLayer`].
//!
//! A layer that makes requests wait (a [`RateLimitLayer`] in wait mode, a
//! backoff that waits) books each request's instant when it arrives, so its
//! line is in arrival order: one caller with 500 requests queued holds
//! every other caller's request behind its 500. Put a [`FairQueueLayer`]
//! around that layer and a [`PassTurnLayer`] inside it, and at most one
//! request per key (a route, say) is in the waiting layer at a time; the
//! others wait in the fair queue, where the *lanes* (callers, say) with
//! requests waiting take turns, each lane's requests in their arrival
//! order (the line of [`ConcurrencyLayer::with_fair_share`]). A request's
//! turn passes to the next when it passes the [`PassTurnLayer`] (the
//! waiting layer let it go), or when it is refused or dropped.
//!
//! A lane that starts waiting is served within one round, one request of
//! each lane ahead of it, however many another lane has queued. Since the
//! next request books only when the one before it goes, the waiting
//! layer's pace is unchanged: it admits the same requests at the same
//! rate, in a fair order. Lanes can be weighted (a lane extractor calls
//! [`KeyBuilder::set_weight`](crate::key::KeyBuilder::set_weight)): a lane
//! of weight 3 takes three turns in a row to a weight-1 lane's one.
//!
//! The fair queue can be bounded ([`FairQueueLayer::with_max_queue`]: a
//! newcomer to a full queue pushes out the longest lane's newest, or is
//! refused itself in the longest lane, with
//! [`QueueFull`](crate::error::QueueFull)) and its wait limited
//! ([`FairQueueLayer::with_queue_timeout`], with
//! [`QueueTimeout`](crate::error::QueueTimeout)). The waiting layer's own
//! `max_wait` counts from when a request enters it, after its turn came.
//!
//! [`RateLimitLayer`]: crate::rate_limit::RateLimitLayer
//! [`ConcurrencyLayer::with_fair_share`]: crate::concurrency::ConcurrencyLayer::with_fair_share
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_throttle::fair::{FairQueueLayer, PassTurnLayer};
//! use tower_throttle::key::{GlobalKey, HeaderKey};
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//!
//! // Ten requests a second, waited for in turns between the callers named
//! // by `x-client`.
//! let svc = ServiceBuilder::new()
//!     .layer(FairQueueLayer::new(GlobalKey, HeaderKey::new("x-client")?).with_max_queue(1_000))
//!     .layer(RateLimitLayer::new(Quota::per_second(10)?, GlobalKey).with_max_wait(Duration::from_secs(5)))
//!     .layer(PassTurnLayer::new())
//!     .service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     });
//! # let _ = svc;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod future;
mod layer;
mod turn;

pub use future::ResponseFuture;
pub use layer::{FairQueue, FairQueueLayer};
pub use turn::{PassTurn, PassTurnLayer, Turn};
