//! [`IdentityConfig`]: identity rules from TOML, or from any serde format as
//! part of a larger configuration.

use std::fmt;

use serde::Deserialize;
use ulid::Ulid;

use super::layer::IdentityHeaderLayer;
use super::rule::Rule;
use crate::error::ConfigError;

/// The configuration of an [`IdentityHeaderLayer`]: its rules, in order, and
/// optionally pinned stable ids.
///
/// It deserializes with serde, so it can be one table of a larger
/// configuration; [`from_toml`](Self::from_toml) reads it on its own. Unknown
/// keys are errors (a misspelt key must not be ignored silently).
///
/// ```toml
/// [stable_ids]                 # optional; random ULIDs otherwise
/// client = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
///
/// [[rules]]
/// name = "openrouter"          # optional; used in errors and logs
/// host = "openrouter.ai"       # exact, or "*.example.com" for subdomains
/// path_prefix = "/api/v1/"     # or path_glob = "/api/*/chat/*"
/// url_contains = "/chat/"      # a plain substring of the whole URL
/// user_agent = "my-agent/1.4"
/// request_id = true            # true: default header name; or a header name
/// client_id = true
/// project_id = "x-project"
/// session_id = true
/// sensitive = ["x-team"]       # more headers whose values are secret
///
/// [rules.headers]              # static headers, applied last
/// "HTTP-Referer" = "https://example.com"
/// "x-team" = "research"
/// "authorization" = "Bearer sk-or-0000"   # secret by its name
/// ```
///
/// Every condition a rule gives must hold; a rule with none matches every
/// request. See [`Rule`] for what each key means.
///
/// ```
/// use tower_throttle::identity::IdentityConfig;
///
/// let config = IdentityConfig::from_toml(r#"
///     [[rules]]
///     name = "api"
///     host = "api.example.com"
///     user_agent = "my-agent/1.4"
///     request_id = "x-correlation-id"
/// "#)?;
/// let layer = config.build()?;
/// assert_eq!(layer.rule_count(), 1);
///
/// let broken = IdentityConfig::from_toml(r#"
///     [[rules]]
///     name = "api"
///     headers = { "x bad" = "1" }
/// "#)?.build().unwrap_err();
/// assert_eq!(broken.field, r#"rules[0].headers["x bad"]"#);
/// assert!(broken.message.starts_with(r#"rule "api": "x bad" is not a valid header name"#));
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct IdentityConfig {
    /// Stable ids to send instead of random ones.
    #[serde(default)]
    pub stable_ids: PinnedIds,
    /// The rules, in order: the first that matches a request applies.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// Stable ids to send instead of random ones, as ULID text; each is
/// optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PinnedIds {
    /// The client id.
    pub client: Option<String>,
    /// The project id.
    pub project: Option<String>,
    /// The session id.
    pub session: Option<String>,
}

impl IdentityConfig {
    /// A configuration with these rules and random stable ids.
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Self {
        Self {
            stable_ids: PinnedIds::default(),
            rules: rules.into_iter().collect(),
        }
    }

    /// Read a configuration from TOML text. A syntax error, an unknown key
    /// or a value of the wrong type is an error naming its field, line and
    /// column (see [`config::from_toml`](crate::config::from_toml)); the
    /// source line is never quoted, as it could hold a secret. Rules are
    /// checked by [`build`](Self::build).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        crate::config::from_toml(text)
    }

    /// Check every rule and build the layer.
    pub fn build(self) -> Result<IdentityHeaderLayer, ConfigError> {
        let mut layer = IdentityHeaderLayer::new(self.rules)?;
        type Pin = fn(IdentityHeaderLayer, Ulid) -> IdentityHeaderLayer;
        let pins: [(&str, Option<String>, Pin); 3] = [
            (
                "stable_ids.client",
                self.stable_ids.client,
                IdentityHeaderLayer::with_client_id,
            ),
            (
                "stable_ids.project",
                self.stable_ids.project,
                IdentityHeaderLayer::with_project_id,
            ),
            (
                "stable_ids.session",
                self.stable_ids.session,
                IdentityHeaderLayer::with_session_id,
            ),
        ];
        for (field, text, pin) in pins {
            let Some(text) = text else { continue };
            let id = Ulid::from_string(text.trim())
                .map_err(|e| ConfigError::new(field, format!("{text:?} is not a ULID: {e}")))?;
            layer = pin(layer, id);
        }
        Ok(layer)
    }
}

impl fmt::Debug for IdentityConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityConfig")
            .field("stable_ids", &self.stable_ids)
            .field("rules", &self.rules)
            .finish()
    }
}
