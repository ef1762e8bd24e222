//! `IdentityHeaderLayer`: the compiled rules, and how to build the layer.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;
use ulid::Ulid;

use super::compile::compile;
use super::config::IdentityConfig;
use super::ids::{RequestIds, StableIds, StableValues};
use super::matching::RuleSet;
use super::rule::Rule;
use super::service::{IdentityHeader, Shared};
use crate::error::ConfigError;
use crate::parts::RequestParts;

/// Gives selected outbound requests a chosen identity: a `User-Agent`,
/// request, client, project and session ids, and static headers, by
/// [`Rule`]s matched on the request URL.
///
/// The first rule that matches a request applies; a request no rule matches
/// passes untouched. Rules with a host are indexed by it, so a thousand of
/// them cost about what one does; rules without a host are tried one by one
/// on every request, so keep those few. Every service this layer makes, and every clone,
/// share the same rules, the same stable ids and one request id generator
/// (so request ids are strictly increasing across all of them).
///
/// ```
/// use tower::{Layer, Service, ServiceExt};
/// use tower_throttle::identity::{IdentityHeaderLayer, Rule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let layer = IdentityHeaderLayer::new([
///     Rule::named("internal").host("*.corp.example").user_agent("billing/2.1"),
///     Rule::named("llm")
///         .host("api.example.com")
///         .path_prefix("/v1/")
///         .user_agent("my-agent/1.4")
///         .request_id()
///         .header("x-api-key", "sk-0000"),
/// ])?;
/// let svc = layer.layer(tower::service_fn(|req: http::Request<()>| async move {
///     Ok::<_, std::convert::Infallible>(req) // echo the request back
/// }));
///
/// let req = http::Request::get("https://api.example.com/v1/chat").body(())?;
/// let sent = svc.clone().oneshot(req).await?;
/// assert_eq!(sent.headers()["user-agent"], "my-agent/1.4");
/// assert_eq!(sent.headers()["x-request-id"].len(), 26);
/// assert!(sent.headers()["x-api-key"].is_sensitive());
///
/// let other = http::Request::get("https://elsewhere.example/").body(())?;
/// let sent = svc.oneshot(other).await?;
/// assert!(sent.headers().is_empty());
/// # Ok(())
/// # }
/// ```
pub struct IdentityHeaderLayer {
    shared: Arc<Shared>,
}

impl IdentityHeaderLayer {
    /// A layer applying `rules`, in order: the first that matches a request
    /// applies. Every host, path, header name and value is checked here; the
    /// first invalid one is an error naming its rule (by index, and by name
    /// if it has one) and the header.
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Result<Self, ConfigError> {
        let mut compiled = Vec::new();
        for (index, rule) in rules.into_iter().enumerate() {
            if u32::try_from(index).is_err() {
                return Err(ConfigError::new(
                    "rules",
                    format!("more than {} rules", u32::MAX),
                ));
            }
            compiled.push(compile(index, &rule)?);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                rules: RuleSet::new(compiled),
                stable: StableValues::new(StableIds::random()),
                request_ids: RequestIds::new(),
            }),
        })
    }

    /// A layer from configuration (see [`IdentityConfig`]).
    pub fn from_config(config: IdentityConfig) -> Result<Self, ConfigError> {
        config.build()
    }

    /// A layer from TOML text (see [`IdentityConfig`] for the format).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        IdentityConfig::from_toml(text)?.build()
    }

    /// Send `id` as the client id instead of a random one.
    ///
    /// Call this and its siblings before the layer is used: on a layer that
    /// was already cloned or layered, it changes this copy only (with a
    /// request id generator of its own), not the services already made.
    pub fn with_client_id(self, id: Ulid) -> Self {
        self.with_stable(|ids| ids.client = id)
    }

    /// Send `id` as the project id instead of a random one.
    pub fn with_project_id(self, id: Ulid) -> Self {
        self.with_stable(|ids| ids.project = id)
    }

    /// Send `id` as the session id instead of a random one.
    pub fn with_session_id(self, id: Ulid) -> Self {
        self.with_stable(|ids| ids.session = id)
    }

    fn with_stable(mut self, change: impl FnOnce(&mut StableIds)) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        let mut ids = shared.stable.ids;
        change(&mut ids);
        shared.stable = StableValues::new(ids);
        self
    }

    /// The ids this layer sends that stay the same for its lifetime.
    pub fn stable_ids(&self) -> StableIds {
        self.shared.stable.ids
    }

    /// How many rules the layer has.
    pub fn rule_count(&self) -> usize {
        self.shared.rules.len()
    }

    /// The index of the rule that would apply to `req`, if any.
    pub fn matching_rule<R: RequestParts>(&self, req: &R) -> Option<usize> {
        self.shared.rules.find(req)
    }
}

impl<S> Layer<S> for IdentityHeaderLayer {
    type Service = IdentityHeader<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdentityHeader::new(inner, self.shared.clone())
    }
}

impl Clone for IdentityHeaderLayer {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl fmt::Debug for IdentityHeaderLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdentityHeaderLayer")
            .field(&self.shared)
            .finish()
    }
}
