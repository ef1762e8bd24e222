//! Several rate limits, each on its own key, judged as one:
//! [`JointRateLimitLayer`]. See its docs for the rules and an example.

mod future;
mod layer;
mod part;
mod service;

pub use future::JointResponseFuture;
pub use layer::JointRateLimitLayer;
pub use service::JointRateLimit;
