//! The proxy's configuration file: its sections, their defaults, and the
//! checks that turn it into [`Settings`], each failure naming its field.
//!
//! The file is the crate's [`StackConfig`] sections (`[rate_limit]`,
//! `[concurrency]`, `[backoff]`, `[identity]`) plus the proxy's own:
//! `[gateway]`, `[[providers]]` and `[simulator]`. See `proxy.toml` beside
//! this file for every field, commented; it is also the default (see
//! [`DEFAULT_PATH`]).
//!
//! [`StackConfig`]: tower_throttle::config::StackConfig

mod check;
mod clients;
mod providers;
mod routes;
mod settings;
mod values;

pub use check::{counts_tokens, is_loopback_host};
pub use clients::{
    Client, ClientModelSection, ClientSection, KeySource, MAX_KEY_LEN, MIN_KEY_LEN, client_limits,
    client_model_limits,
};
pub use routes::{MAX_DEPLOYMENTS, ModelRoute, Order, RouteSection};
pub use settings::{
    Credential, GatewaySettings, Provider, SIM_MAX_CONNECTIONS, Settings, SimModel, SimSettings,
    TlsFiles, Upstream,
};

use std::collections::BTreeMap;

use std::time::Duration;

use serde::Deserialize;
use tower_throttle::config::{StackConfig, optional_duration_text};

use crate::preset::{Kind, LimitHeaders};

/// The file run without `--config`, relative to the working directory: the
/// commented example, when the proxy is started from the repository's root.
pub const DEFAULT_PATH: &str = "examples/proxy/proxy.toml";

/// The configuration used without `--config` when [`DEFAULT_PATH`] is not
/// there: a copy of the commented example, built into the program.
pub const DEFAULT_CONFIG: &str = include_str!("../../proxy.toml");

/// The gateway's address unless `--listen` or `[gateway] listen` says.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Paths the gateway serves itself; no provider may be named after them.
pub const RESERVED: [&str; 5] = ["stats", "events", "metrics", "healthz", "readyz"];

/// The longest model name a request may carry (it becomes a stats label).
pub const MAX_MODEL_LEN: usize = 200;

/// The largest request body unless `max_body_bytes` says: the gateway's
/// limit, and the built-in simulator's (which takes the gateway's).
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// The whole file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// The master switch, at the top of the file: `false` lets every
    /// request through every layer untouched. Default on.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// `[gateway]`.
    #[serde(default)]
    pub gateway: GatewaySection,
    /// `[simulator]`: start the built-in upstream.
    #[serde(default)]
    pub simulator: Option<SimulatorSection>,
    /// `[[providers]]`.
    #[serde(default)]
    pub providers: Vec<ProviderSection>,
    /// `[[routes]]`: models served by several deployments.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
    /// `[[clients]]`: the gateway's callers and their keys.
    #[serde(default)]
    pub clients: Vec<ClientSection>,
    /// The crate's sections (`[rate_limit]`, `[concurrency]`, `[backoff]`,
    /// `[identity]`, `[store]`), read by [`StackConfig::from_toml_with`]
    /// beside the ones above.
    #[serde(skip)]
    pub stack: StackConfig,
}

/// `[gateway]`: the server itself.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// Address to listen on; `--listen` wins. Default `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Largest request body accepted; default 4 MiB.
    pub max_body_bytes: Option<i64>,
    /// Longest wait for an upstream's response headers; default `"5m"`.
    #[serde(default, with = "optional_duration_text")]
    pub upstream_timeout: Option<Duration>,
    /// On Ctrl-C, how long in-flight requests may take; default `"10s"`.
    #[serde(default, with = "optional_duration_text")]
    pub shutdown_grace: Option<Duration>,
    /// Routes counted apart in the stats; default 1000.
    pub max_routes: Option<i64>,
    /// A route not configured, counted apart because its upstream answered
    /// it, gives its place to a new one after this long without an answer;
    /// default `"10m"`.
    #[serde(default, with = "optional_duration_text")]
    pub route_idle: Option<Duration>,
    /// Heartbeat comment on `/events` when nothing changes; default `"15s"`.
    #[serde(default, with = "optional_duration_text")]
    pub events_heartbeat: Option<Duration>,
    /// `Host` names answered besides the listen address's; default none.
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins allowed besides the gateway's own; default none.
    pub allowed_origins: Option<Vec<String>>,
    /// Connections open at once, more wait in the listen backlog; default
    /// from the process's file-descriptor limit.
    pub max_connections: Option<i64>,
    /// From a connection opening, or its previous response, to a complete
    /// request head; default `"10s"`.
    #[serde(default, with = "optional_duration_text")]
    pub header_read_timeout: Option<Duration>,
    /// Request line and headers, in bytes (431 beyond); default 64 KiB.
    pub max_header_bytes: Option<i64>,
    /// From a complete request head to a complete body (408 beyond);
    /// default `"30s"`.
    #[serde(default, with = "optional_duration_text")]
    pub body_read_timeout: Option<Duration>,
    /// How long a response may make no progress (a client that stopped
    /// reading) before its connection is closed and what it held (a
    /// concurrency permit) released; default `"30s"`.
    #[serde(default, with = "optional_duration_text")]
    pub body_write_timeout: Option<Duration>,
    /// Clients on `/events` at once (503 beyond); default 64.
    pub max_event_clients: Option<i64>,
    /// Serve HTTPS with this certificate chain (PEM), read again when it
    /// changes; with `tls_key`.
    pub tls_cert: Option<String>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<String>,
    /// Refuse (401) a forwarded request without a `[[clients]]` key;
    /// default false (such a request is the anonymous client's).
    pub require_client_key: Option<bool>,
    /// With `[[clients]]`: the environment variable holding the operator
    /// key, which opens `/stats`, `/events`, `/metrics` and the page.
    pub admin_key_env: Option<String>,
    /// With `[[clients]]`: the operator endpoints answer requests from
    /// this machine without the key; default true.
    pub admin_from_loopback: Option<bool>,
    /// One line per request to `"stderr"` or to this file; default none.
    pub access_log: Option<String>,
    /// `"json"` (default) or `"logfmt"`.
    pub access_log_format: Option<String>,
    /// A log file past this size is renamed to `<file>.1`; default 100 MiB.
    pub access_log_max_bytes: Option<i64>,
    /// The share of forwarded requests logged, in (0, 1] (refusals and
    /// errors are always); default 1.
    pub access_log_sample: Option<f64>,
}

/// `[[providers]]`: one upstream.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// The path prefix it is reached by (`/openai/v1/...`) and the first part
    /// of its routes.
    pub name: String,
    /// `http://host:port[/base/path]`, `https://...`, or `"simulator"` for
    /// the built-in one.
    pub base_url: String,
    /// PEM file of CA certificates trusted for this (https) provider in
    /// addition to the public web roots: a private CA, a test's.
    pub ca_file: Option<String>,
    /// Accept any certificate from this (https) provider. Tests only;
    /// logged as a warning at start and on every reload.
    pub insecure_skip_verify: Option<bool>,
    /// Environment variable holding the API key; none: the client's own
    /// `Authorization` passes through.
    pub api_key_env: Option<String>,
    /// Header the key is sent in; default `authorization` (as `Bearer KEY`).
    pub api_key_header: Option<String>,
    /// Serve unprefixed paths (`/v1/...`); default only when it is the only
    /// provider.
    pub default: Option<bool>,
    /// Tighten this provider's routes to the limits its responses announce
    /// (see `learn`); default off.
    pub learn_limits: Option<bool>,
    /// The API it speaks, which sets the defaults above and below (see
    /// `preset`); default `openai_compatible`.
    pub kind: Option<Kind>,
    /// `anthropic-version` sent when the client sends none; default
    /// `2023-06-01` for `kind = "anthropic"`, none otherwise.
    pub anthropic_version: Option<String>,
    /// `api-version` added to a query that has none; default `2024-10-21`
    /// for `kind = "azure_openai"`, none otherwise.
    pub api_version: Option<String>,
    /// The rate-limit headers its answers carry; default from `kind`.
    pub limit_headers: Option<LimitHeaders>,
    /// Model names the upstream resolves to others (`"gpt-4o" =
    /// "gpt-4o-2024-08-06"`, or `"*" = "NAME"` for every model): a route is
    /// counted under the model it resolves to.
    pub aliases: Option<BTreeMap<String, String>>,
    /// Send the model an alias resolves to in the body's `"model"` instead
    /// of the name the client wrote; default off (the body goes as sent).
    pub rewrite_model: Option<bool>,
}

/// `[simulator]`: an OpenAI-compatible upstream in this process.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SimulatorSection {
    /// Default `127.0.0.1:0` (an ephemeral loopback port).
    pub listen: Option<String>,
    /// Time before each answer; default `"20ms"`.
    #[serde(default, with = "optional_duration_text")]
    pub latency: Option<Duration>,
    /// Chunks of a streamed answer; default 8.
    pub stream_chunks: Option<i64>,
    /// Time between streamed chunks; default `"40ms"`.
    #[serde(default, with = "optional_duration_text")]
    pub stream_interval: Option<Duration>,
    /// Environment variable with the key it demands as `Bearer`; default none.
    pub api_key_env: Option<String>,
    /// Its models and their limits; default `sim-small` 20/s, `sim-large` 4/s.
    #[serde(default)]
    pub models: Vec<SimModelSection>,
}

/// One simulated model and the limit it enforces.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SimModelSection {
    /// The model name.
    pub name: String,
    /// Requests per period (a sliding window); 0 means unlimited.
    pub limit: i64,
    /// The window, e.g. `"1s"`.
    #[serde(with = "tower_throttle::config::duration_text")]
    pub period: Duration,
}

/// Reads environment variables; the real environment in `main`, a table in
/// tests.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
