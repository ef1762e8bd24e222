//! Outbound identity: [`IdentityHeaderLayer`].
//!
//! Selected outbound requests get a chosen identity, by [`Rule`]s matched on
//! the request URL: the host (exact, or `*.suffix`), the path (a prefix or a
//! glob), or a plain substring of the whole URL. The first matching rule
//! applies. It may replace the `User-Agent`; add a fresh 26-character
//! [ULID](https://github.com/ulid/spec) request id per request and client,
//! project and session ids that stay the same for the layer's lifetime; and
//! add static headers, applied last so that they override the rest. Headers
//! the rule does not name are left alone, and a request no rule matches is
//! not touched at all.
//!
//! Every rule, header name and value is checked when the layer is built; an
//! invalid one is a [`ConfigError`](crate::error::ConfigError) naming the
//! rule and the header, never a panic. Secret values (`Authorization`, names
//! containing `key`, `token`, `secret`, `cookie`, `password` or
//! `credential`, as [`is_secret_name`](crate::redact::is_secret_name) decides
//! for the key extractors too, and any the user marks) are stored with
//! [`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive) and
//! shown as `<redacted>` in `Debug`.
//!
//! Rules can come from code or from TOML ([`IdentityConfig`]). The layer
//! works on `http::Request<B>` and, with the `reqwest` feature, on
//! `reqwest::Request`.
//!
//! ```
//! use tower::{Layer, ServiceExt};
//! use tower_throttle::identity::IdentityHeaderLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let layer = IdentityHeaderLayer::from_toml(r#"
//!     [[rules]]
//!     name = "gateway"
//!     host = "*.gateway.example"
//!     path_glob = "/v1/*/completions"
//!     user_agent = "my-agent/1.4"
//!     request_id = true
//!     session_id = true
//!     [rules.headers]
//!     "x-api-key" = "sk-live-0000"
//! "#)?;
//! assert!(!format!("{layer:?}").contains("sk-live-0000"));
//!
//! let svc = layer.layer(tower::service_fn(|req: http::Request<()>| async move {
//!     Ok::<_, std::convert::Infallible>(req) // echo the request back
//! }));
//! let req = http::Request::post("https://eu.gateway.example/v1/chat/completions")
//!     .header("user-agent", "reqwest")
//!     .header("accept", "text/event-stream")
//!     .body(())?;
//! let sent = svc.oneshot(req).await?;
//! let headers = sent.headers();
//! assert_eq!(headers["user-agent"], "my-agent/1.4");
//! assert_eq!(headers["accept"], "text/event-stream");
//! assert_eq!(headers["x-request-id"].len(), 26);
//! assert_eq!(headers["x-session-id"], layer.stable_ids().session.to_string());
//! assert!(headers["x-api-key"].is_sensitive());
//! # Ok(())
//! # }
//! ```

mod compile;
mod config;
mod ids;
mod layer;
mod matching;
mod rule;
mod service;

use http::HeaderName;

pub use config::{IdentityConfig, PinnedIds};
pub use ids::StableIds;
pub use layer::IdentityHeaderLayer;
pub use rule::Rule;
pub use service::IdentityHeader;
pub use ulid::Ulid;

/// The header a rule's request id goes in unless it names another:
/// `x-request-id`.
pub const DEFAULT_REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
/// The header a rule's client id goes in unless it names another:
/// `x-client-id`.
pub const DEFAULT_CLIENT_ID_HEADER: HeaderName = HeaderName::from_static("x-client-id");
/// The header a rule's project id goes in unless it names another:
/// `x-project-id`.
pub const DEFAULT_PROJECT_ID_HEADER: HeaderName = HeaderName::from_static("x-project-id");
/// The header a rule's session id goes in unless it names another:
/// `x-session-id`.
pub const DEFAULT_SESSION_ID_HEADER: HeaderName = HeaderName::from_static("x-session-id");
