//! A request's route `(provider, model)`: what every layer counts it under,
//! and how the rate limiter keeps a route's quota on its answer.

use std::fmt;
use std::sync::Arc;

use tower_throttle::error::{KeyError, MissingKey};
use tower_throttle::key::{KeyBuilder, KeyExtractor};
use tower_throttle::rate_limit::{Annotate, RateLimitInfo};
use tower_throttle::redact::Escaped;

/// The model part of a route whose body names none (`GET /v1/models`).
pub const NO_MODEL: &str = "(none)";

/// A request's route, put in its extensions by the handler: the key every
/// layer counts it under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The provider's name.
    pub provider: Arc<str>,
    /// The model the body's `"model"` resolves to through the provider's
    /// aliases, or [`NO_MODEL`].
    pub model: Arc<str>,
}

/// `provider/model`, each escaped as the layers show key parts (a model name
/// is the client's text): the name the layers' stats give the route, and
/// safe in a log line.
impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Escaped(&self.provider), Escaped(&self.model))
    }
}

/// Keys a request by its [`Route`]: two parts, so rules can match
/// `provider` and `model` patterns.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<http::Request<B>> for RouteKey {
    fn extract(&self, req: &http::Request<B>, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let route = req
            .extensions()
            .get::<Route>()
            .ok_or_else(|| MissingKey::new("route"))?;
        key.push_str(&route.provider);
        key.push_str(&route.model);
        Ok(())
    }
}

/// What remains of a route's quota, kept on the response by the rate limiter
/// and written as the IETF `RateLimit` headers in `build::finish`, outside
/// the backoff layer: written by the rate limiter itself, they would be read
/// by the backoff layer as the upstream's own (a cooldown as long as the
/// gateway's quota takes to refill, instead of the upstream's `Retry-After`
/// or `initial_backoff`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoteQuota;

impl<B> Annotate<http::Response<B>> for NoteQuota {
    fn annotate(&self, response: &mut http::Response<B>, info: &RateLimitInfo) {
        response.extensions_mut().insert(info.clone());
    }
}
