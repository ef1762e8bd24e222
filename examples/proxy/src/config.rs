//! The proxy's configuration file: its sections, their defaults, and the
//! checks that turn it into [`Settings`], each failure naming its field.
//!
//! The file is the crate's [`StackConfig`] sections (`[rate_limit]`,
//! `[concurrency]`, `[backoff]`, `[identity]`) plus the proxy's own:
//! `[gateway]`, `[[providers]]` and `[simulator]`. See `proxy.toml` beside
//! this file for every field, commented; it is also the default (see
//! [`DEFAULT_PATH`]).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderName, HeaderValue, Uri};
use serde::Deserialize;
use tower_throttle::config::{
    BackoffConfig, ConcurrencyConfig, Stack, StackConfig, StoreConfig, parse_duration,
};
use tower_throttle::error::ConfigError;
use tower_throttle::identity::IdentityConfig;
use tower_throttle::rate_limit::{Limits, QuotaConfig, RateLimitConfig, Unit};
use tower_throttle::redact::Escaped;

use crate::edge::{AllowedHost, AllowedOrigin};
use crate::preset::{self, Aliases, Kind, LimitHeaders, UsageFormat, check_version};
use crate::serve;
use crate::tls::{self, TlsSettings};

/// The file run without `--config`, relative to the working directory: the
/// commented example, when the proxy is started from the repository's root.
pub const DEFAULT_PATH: &str = "examples/proxy/proxy.toml";

/// The configuration used without `--config` when [`DEFAULT_PATH`] is not
/// there: a copy of the commented example, built into the program.
pub const DEFAULT_CONFIG: &str = include_str!("../proxy.toml");

/// The gateway's address unless `--listen` or `[gateway] listen` says.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Paths the gateway serves itself; no provider may be named after them.
pub const RESERVED: [&str; 3] = ["stats", "events", "metrics"];

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
    /// `[rate_limit]`, as in the crate's `StackConfig`.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// `[concurrency]`.
    #[serde(default)]
    pub concurrency: Option<ConcurrencyConfig>,
    /// `[backoff]`.
    #[serde(default)]
    pub backoff: Option<BackoffConfig>,
    /// `[identity]`.
    #[serde(default)]
    pub identity: Option<IdentityConfig>,
    /// `[store]`: the rate limits and cooldowns in Redis, shared by every
    /// gateway on the same server (the `redis` feature).
    #[serde(default)]
    pub store: Option<StoreConfig>,
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
    pub upstream_timeout: Option<String>,
    /// On Ctrl-C, how long in-flight requests may take; default `"10s"`.
    pub shutdown_grace: Option<String>,
    /// Routes counted apart in the stats; default 1000.
    pub max_routes: Option<i64>,
    /// A route not configured, counted apart because its upstream answered
    /// it, gives its place to a new one after this long without an answer;
    /// default `"10m"`.
    pub route_idle: Option<String>,
    /// Heartbeat comment on `/events` when nothing changes; default `"15s"`.
    pub events_heartbeat: Option<String>,
    /// `Host` names answered besides the listen address's; default none.
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins allowed besides the gateway's own; default none.
    pub allowed_origins: Option<Vec<String>>,
    /// Connections open at once, more wait in the listen backlog; default
    /// from the process's file-descriptor limit.
    pub max_connections: Option<i64>,
    /// From a connection opening, or its previous response, to a complete
    /// request head; default `"10s"`.
    pub header_read_timeout: Option<String>,
    /// Request line and headers, in bytes (431 beyond); default 64 KiB.
    pub max_header_bytes: Option<i64>,
    /// From a complete request head to a complete body (408 beyond);
    /// default `"30s"`.
    pub body_read_timeout: Option<String>,
    /// How long a response may make no progress (a client that stopped
    /// reading) before its connection is closed and what it held (a
    /// concurrency permit) released; default `"30s"`.
    pub body_write_timeout: Option<String>,
    /// Clients on `/events` at once (503 beyond); default 64.
    pub max_event_clients: Option<i64>,
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
    pub latency: Option<String>,
    /// Chunks of a streamed answer; default 8.
    pub stream_chunks: Option<i64>,
    /// Time between streamed chunks; default `"40ms"`.
    pub stream_interval: Option<String>,
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
    pub period: String,
}

/// A checked configuration: what the gateway and the simulator run on.
#[derive(Clone)]
pub struct Settings {
    /// The file as written, to tell what a reload changed.
    pub file: ProxyFile,
    /// `[gateway]`, checked.
    pub gateway: GatewaySettings,
    /// `[simulator]`, checked.
    pub simulator: Option<SimSettings>,
    /// `[[providers]]`, checked, credentials read.
    pub providers: Vec<Provider>,
    /// The layers' sections, checked.
    pub stack: Stack,
    /// `--allow-insecure`: `insecure_skip_verify` may apply to a provider
    /// that is not on a loopback address. Never from the file, so that an
    /// edit alone cannot turn verification off for a remote provider; kept
    /// across reloads.
    pub allow_insecure: bool,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("gateway", &self.gateway)
            .field("simulator", &self.simulator)
            .field("providers", &self.providers)
            .finish_non_exhaustive()
    }
}

/// `[gateway]`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewaySettings {
    /// From the file; `--listen` wins.
    pub listen: Option<SocketAddr>,
    /// Largest request body.
    pub max_body: usize,
    /// Longest wait for upstream response headers.
    pub upstream_timeout: Duration,
    /// How long in-flight requests may take after Ctrl-C.
    pub shutdown_grace: Duration,
    /// Routes counted apart.
    pub max_routes: usize,
    /// How long an answered route keeps its place without an answer.
    pub route_idle: Duration,
    /// `/events` heartbeat.
    pub events_heartbeat: Duration,
    /// `Host`s answered besides the listen address's names.
    pub allowed_hosts: Vec<AllowedHost>,
    /// `Origin`s allowed besides the gateway's own.
    pub allowed_origins: Vec<AllowedOrigin>,
    /// Connections open at once; `None`: from the fd limit at start.
    pub max_connections: Option<usize>,
    /// Longest wait for a complete request head (and idle keep-alive).
    pub header_read_timeout: Duration,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Longest wait for a complete request body once its head is in.
    pub body_read_timeout: Duration,
    /// Longest a response may make no progress before its connection is
    /// closed.
    pub body_write_timeout: Duration,
    /// Clients on `/events` at once.
    pub max_event_clients: usize,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: None,
            max_body: DEFAULT_MAX_BODY,
            upstream_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            max_routes: 1000,
            route_idle: Duration::from_secs(600),
            events_heartbeat: Duration::from_secs(15),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_connections: None,
            header_read_timeout: serve::HEADER_READ_TIMEOUT,
            max_header_bytes: serve::MAX_HEADER_BYTES,
            body_read_timeout: Duration::from_secs(30),
            body_write_timeout: serve::BODY_WRITE_TIMEOUT,
            max_event_clients: 64,
        }
    }
}

/// One upstream, checked.
#[derive(Clone, Debug)]
pub struct Provider {
    /// Its name: path prefix and first route part.
    pub name: Arc<str>,
    /// Where it is.
    pub upstream: Upstream,
    /// What is sent to authenticate; never printed.
    pub credential: Option<Credential>,
    /// Serves unprefixed paths.
    pub default: bool,
    /// Learns its routes' limits from its responses.
    pub learn_limits: bool,
    /// The API it speaks.
    pub kind: Kind,
    /// `anthropic-version` sent when the client sends none.
    pub anthropic_version: Option<HeaderValue>,
    /// The rate-limit headers its answers carry.
    pub limit_headers: LimitHeaders,
    /// Where its answers state their token usage (from `kind`).
    pub usage_format: UsageFormat,
    /// Model names the upstream resolves to others.
    pub aliases: Arc<Aliases>,
    /// `rewrite_model`: the body upstream names the model an alias
    /// resolved to.
    pub rewrite_model: bool,
    /// `api-version` added to a query without one (Azure OpenAI).
    pub api_version: Option<String>,
}

/// Where a provider is.
#[derive(Clone, Debug, PartialEq)]
pub enum Upstream {
    /// The built-in simulator, wherever it listens.
    Simulator,
    /// A plain-HTTP upstream.
    Http {
        /// `host:port`.
        authority: Authority,
        /// A path every request path is appended to, without a trailing `/`.
        base_path: String,
    },
    /// An HTTPS upstream.
    Https {
        /// `host[:port]`.
        authority: Authority,
        /// A path every request path is appended to, without a trailing `/`.
        base_path: String,
        /// Whom it trusts.
        tls: TlsSettings,
    },
}

/// An API key from the environment, ready to send. `Debug` shows the
/// variable's name only.
#[derive(Clone)]
pub struct Credential {
    /// The header it goes in.
    pub header: HeaderName,
    /// The header's value, marked sensitive.
    pub value: HeaderValue,
    /// The environment variable it came from.
    pub env: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("header", &self.header)
            .field("env", &self.env)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// `[simulator]`, checked.
#[derive(Clone, PartialEq)]
pub struct SimSettings {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Time before each answer.
    pub latency: Duration,
    /// Chunks of a streamed answer.
    pub stream_chunks: u32,
    /// Time between chunks.
    pub stream_interval: Duration,
    /// The `Bearer` key it demands, if any.
    pub api_key: Option<String>,
    /// Models and their limits.
    pub models: Vec<SimModel>,
    /// Largest request body: the gateway's `max_body_bytes` when it starts.
    pub max_body: usize,
    /// How it serves connections: capped and timed as the gateway's are
    /// (its `header_read_timeout` and `max_header_bytes`), with a cap of
    /// its own ([`SIM_MAX_CONNECTIONS`] at most), so that its port cannot
    /// spend the file descriptors the gateway needs.
    pub serve: serve::ServeLimits,
}

/// The most connections the simulator holds open at once: it shares the
/// process's file descriptors with the gateway, whose own cap is sized from
/// the whole open-file limit.
pub const SIM_MAX_CONNECTIONS: usize = 256;

impl fmt::Debug for SimSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSettings")
            .field("listen", &self.listen)
            .field("latency", &self.latency)
            .field("stream_chunks", &self.stream_chunks)
            .field("stream_interval", &self.stream_interval)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("max_body", &self.max_body)
            .finish()
    }
}

/// One simulated model.
#[derive(Clone, Debug, PartialEq)]
pub struct SimModel {
    /// Its name.
    pub name: String,
    /// Requests per period; 0: unlimited.
    pub limit: u32,
    /// The sliding window.
    pub period: Duration,
}

impl SimSettings {
    /// A simulator on an ephemeral loopback port with the default models.
    pub fn local() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: Duration::from_millis(20),
            stream_chunks: 8,
            stream_interval: Duration::from_millis(40),
            api_key: None,
            models: vec![
                SimModel {
                    name: "sim-small".into(),
                    limit: 20,
                    period: Duration::from_secs(1),
                },
                SimModel {
                    name: "sim-large".into(),
                    limit: 4,
                    period: Duration::from_secs(1),
                },
            ],
            max_body: DEFAULT_MAX_BODY,
            serve: sim_serve_limits(&GatewaySettings::default()),
        }
    }
}

/// Reads environment variables; the real environment in `main`, a table in
/// tests.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Settings {
    /// Parse and check `text`; the first problem is an error naming its
    /// field (`providers[1].base_url`, `rate_limit.rules[0].quotas[0].limit`).
    pub fn from_toml(text: &str, env: Env<'_>) -> Result<Self, ConfigError> {
        let file: ProxyFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        Self::check(file, env)
    }

    /// Check a parsed file.
    pub fn check(file: ProxyFile, env: Env<'_>) -> Result<Self, ConfigError> {
        let gateway = file.gateway.check().map_err(|e| e.within("gateway"))?;
        let simulator = file
            .simulator
            .as_ref()
            .map(|s| s.check(env).map_err(|e| e.within("simulator")))
            .transpose()?
            // One limit: a body the gateway takes, its simulator takes too.
            .map(|s| SimSettings {
                max_body: gateway.max_body,
                serve: sim_serve_limits(&gateway),
                ..s
            });
        let providers = check_providers(&file.providers, simulator.is_some(), env)?;
        let stack = stack_config(&file, file.store.clone())?.validate()?;
        check_rule_providers(&file, &providers)?;
        Ok(Self {
            file,
            gateway,
            simulator,
            providers,
            stack,
            allow_insecure: false,
        })
    }

    /// Refuse `insecure_skip_verify` on a provider whose host is not a
    /// loopback address unless the process was started with
    /// `--allow-insecure`: skipping verification is for a test upstream on
    /// this machine, and a file edit alone must not do it for a remote one.
    pub fn check_insecure(&self) -> Result<(), ConfigError> {
        if self.allow_insecure {
            return Ok(());
        }
        for (i, p) in self.providers.iter().enumerate() {
            if let Upstream::Https { authority, tls, .. } = &p.upstream {
                if tls.insecure_skip_verify && !is_loopback_host(authority.host()) {
                    return Err(ConfigError::new(
                        format!("providers[{i}].insecure_skip_verify"),
                        format!(
                            "refused for `{}`, which is not a loopback address: anyone on the \
                             path could read and change its traffic, API key included; use \
                             ca_file for a private CA, or start with --allow-insecure",
                            authority.host()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The fields that differ between `self` and `new` and only take
    /// effect on a restart: the listening socket and its connection limits,
    /// the size of the stats tables, and the simulator. Every other field
    /// is live (see `live` and `gateway::build`).
    pub fn restart_only_changes(&self, new: &Settings) -> Vec<&'static str> {
        let (a, b) = (&self.file, &new.file);
        let mut changed = Vec::new();
        if a.gateway.listen != b.gateway.listen {
            changed.push("gateway.listen");
        }
        if self.gateway.max_routes != new.gateway.max_routes {
            changed.push("gateway.max_routes");
        }
        if self.gateway.route_idle != new.gateway.route_idle {
            changed.push("gateway.route_idle");
        }
        if self.gateway.max_connections != new.gateway.max_connections {
            changed.push("gateway.max_connections");
        }
        if self.gateway.header_read_timeout != new.gateway.header_read_timeout {
            changed.push("gateway.header_read_timeout");
        }
        if self.gateway.max_header_bytes != new.gateway.max_header_bytes {
            changed.push("gateway.max_header_bytes");
        }
        if self.gateway.body_write_timeout != new.gateway.body_write_timeout {
            changed.push("gateway.body_write_timeout");
        }
        if a.simulator != b.simulator {
            changed.push("simulator");
        }
        if a.store != b.store {
            changed.push("store");
        }
        changed
    }

    /// The same settings with the layers' state in Redis at `url`
    /// (`--redis`): the file's `[store]` with that URL, or one with
    /// defaults. Only the start reads it: a reload keeps the layers, and
    /// so their store.
    pub fn with_redis(mut self, url: &str) -> Result<Self, ConfigError> {
        let store = StoreConfig {
            redis_url: url.to_owned(),
            ..self.file.store.clone().unwrap_or_default()
        };
        self.stack = stack_config(&self.file, Some(store))?
            .validate()
            .map_err(|e| e.within("--redis"))?;
        Ok(self)
    }

    /// The provider serving unprefixed paths, if any.
    pub fn default_provider(&self) -> Option<&Provider> {
        self.providers.iter().find(|p| p.default)
    }
}

/// Whether `host` (an authority's host: a name, an IPv4 address or a
/// bracketed IPv6 one) is this machine's loopback: `localhost` or a
/// loopback address. Any other name may resolve anywhere.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The simulator's connection limits, timed as the gateway's.
fn sim_serve_limits(gateway: &GatewaySettings) -> serve::ServeLimits {
    serve::ServeLimits {
        max_connections: serve::default_max_connections().min(SIM_MAX_CONNECTIONS),
        header_read_timeout: gateway.header_read_timeout,
        max_header_bytes: gateway.max_header_bytes,
        body_write_timeout: gateway.body_write_timeout,
    }
}

/// The crate's sections of `file`, with `store`.
fn stack_config(file: &ProxyFile, store: Option<StoreConfig>) -> Result<StackConfig, ConfigError> {
    let rate_limit = file
        .rate_limit
        .as_ref()
        .map(|r| token_units(r).map_err(|e| e.within("rate_limit")))
        .transpose()?;
    Ok(StackConfig {
        rate_limit,
        concurrency: file.concurrency.clone(),
        backoff: file.backoff.clone(),
        identity: file.identity.clone(),
        store,
    })
}

/// The gateway's quota units in the crate's words: a quota counts
/// `"requests"` (the default) or `"tokens"`, which the crate calls cost (the
/// gateway's cost of a request is its token estimate, see `usage`).
fn token_units(config: &RateLimitConfig) -> Result<RateLimitConfig, ConfigError> {
    let mut config = config.clone();
    let translate = |quotas: &mut [QuotaConfig]| -> Result<(), ConfigError> {
        for (i, quota) in quotas.iter_mut().enumerate() {
            let unit = match quota.unit.as_deref() {
                None | Some("requests") => Unit::Requests,
                Some("tokens") => Unit::Cost,
                Some(other) => {
                    return Err(ConfigError::new(
                        format!("quotas[{i}].unit"),
                        format!(
                            "`{}` is not a unit; use \"requests\" (the default) or \"tokens\"",
                            Escaped(other)
                        ),
                    ));
                }
            };
            quota.unit = Some(unit.as_str().to_owned());
        }
        Ok(())
    };
    translate(&mut config.quotas)?;
    for (i, rule) in config.rules.iter_mut().enumerate() {
        translate(&mut rule.quotas).map_err(|e| e.within(&format!("rules[{i}]")))?;
    }
    Ok(config)
}

/// Whether any quota of `limits` counts tokens.
pub fn counts_tokens(limits: Option<&Limits>) -> bool {
    limits.is_some_and(|l| {
        l.default
            .iter()
            .chain(l.rules.iter().flat_map(|r| r.quotas()))
            .any(|q| q.unit() == Unit::Cost)
    })
}

/// A TOML error as a [`ConfigError`] naming the field it is at (worked out
/// from its position: the table header above it and the key on its line)
/// and the line. toml's own rendering, which quotes the line, is left out.
fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end().to_owned();
    let Some(span) = e.span() else {
        return ConfigError::new("toml", message);
    };
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line_no = before.matches('\n').count() + 1;
    let mut table = String::new();
    let mut arrays: Vec<(String, usize)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line_no - 1).map(|l| l.trim()).unwrap_or("");
    // An error on a table's own header (`[nonsense]`: an unknown table) is
    // about that table, not the one before it.
    let upto = if here.starts_with('[') {
        line_no
    } else {
        line_no - 1
    };
    for line in lines.iter().take(upto) {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|t| t.split("]]").next()) {
            let name = name.trim().to_owned();
            let n = match arrays.iter_mut().find(|(a, _)| *a == name) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    arrays.push((name.clone(), 0));
                    0
                }
            };
            table = format!("{name}[{n}]");
        } else if let Some(name) = t.strip_prefix('[').and_then(|t| t.split(']').next()) {
            table = name.trim().to_owned();
        }
    }
    let key = match here.split_once('=') {
        Some((key, _)) if !here.starts_with('[') => key.trim().trim_matches('"').to_owned(),
        _ => String::new(),
    };
    let field = match (table.is_empty(), key.is_empty()) {
        (true, true) => "toml".to_owned(),
        (true, false) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    };
    ConfigError::new(field, format!("{message} (line {line_no})"))
}

fn duration(
    field: &str,
    text: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    text.as_deref()
        .map_or(Ok(default), |t| parse_duration(field, t))
}

fn address(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("`{text}` is not an address; write e.g. \"127.0.0.1:8080\""),
        )
    })
}

fn bounded(field: &str, value: i64, min: i64, max: i64) -> Result<usize, ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            field,
            format!("{value} is outside {min}..={max}"),
        ));
    }
    usize::try_from(value).map_err(|_| ConfigError::new(field, format!("{value} is too large")))
}

impl GatewaySection {
    fn check(&self) -> Result<GatewaySettings, ConfigError> {
        let d = GatewaySettings::default();
        let upstream_timeout = duration(
            "upstream_timeout",
            &self.upstream_timeout,
            d.upstream_timeout,
        )?;
        if upstream_timeout.is_zero() {
            return Err(ConfigError::new(
                "upstream_timeout",
                "0 would fail every request; leave it out for 5 minutes",
            ));
        }
        let events_heartbeat = duration(
            "events_heartbeat",
            &self.events_heartbeat,
            d.events_heartbeat,
        )?;
        if events_heartbeat < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "events_heartbeat",
                "must be at least 10ms; the default is 15s",
            ));
        }
        let header_read_timeout = duration(
            "header_read_timeout",
            &self.header_read_timeout,
            d.header_read_timeout,
        )?;
        if header_read_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "header_read_timeout",
                "must be at least 10ms; the default is 10s",
            ));
        }
        let body_write_timeout = duration(
            "body_write_timeout",
            &self.body_write_timeout,
            d.body_write_timeout,
        )?;
        if body_write_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "body_write_timeout",
                "must be at least 10ms; the default is 30s",
            ));
        }
        Ok(GatewaySettings {
            listen: self
                .listen
                .as_deref()
                .map(|l| address("listen", l))
                .transpose()?,
            max_body: match self.max_body_bytes {
                Some(n) => bounded("max_body_bytes", n, 1, 1 << 30)?,
                None => d.max_body,
            },
            upstream_timeout,
            shutdown_grace: duration("shutdown_grace", &self.shutdown_grace, d.shutdown_grace)?,
            max_routes: match self.max_routes {
                Some(n) => bounded("max_routes", n, 1, 100_000)?,
                None => d.max_routes,
            },
            route_idle: duration("route_idle", &self.route_idle, d.route_idle)?,
            events_heartbeat,
            allowed_hosts: list("allowed_hosts", &self.allowed_hosts, AllowedHost::parse)?,
            allowed_origins: list(
                "allowed_origins",
                &self.allowed_origins,
                AllowedOrigin::parse,
            )?,
            max_connections: self
                .max_connections
                .map(|n| bounded("max_connections", n, 1, 1_000_000))
                .transpose()?,
            header_read_timeout,
            max_header_bytes: match self.max_header_bytes {
                Some(n) => bounded("max_header_bytes", n, 1024, 1 << 20)?,
                None => d.max_header_bytes,
            },
            body_read_timeout: duration(
                "body_read_timeout",
                &self.body_read_timeout,
                d.body_read_timeout,
            )?,
            body_write_timeout,
            max_event_clients: match self.max_event_clients {
                Some(n) => bounded("max_event_clients", n, 0, 100_000)?,
                None => d.max_event_clients,
            },
        })
    }
}

/// Each entry of an optional list, checked; an error names the entry.
fn list<T>(
    field: &str,
    entries: &Option<Vec<String>>,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, ConfigError> {
    entries
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| parse(e).map_err(|m| ConfigError::new(format!("{field}[{i}]"), m)))
        .collect()
}

impl SimulatorSection {
    fn check(&self, env: Env<'_>) -> Result<SimSettings, ConfigError> {
        let d = SimSettings::local();
        let models = if self.models.is_empty() {
            d.models
        } else {
            let mut models: Vec<SimModel> = Vec::new();
            for (i, m) in self.models.iter().enumerate() {
                let at = |field: &str| format!("models[{i}].{field}");
                if m.name.trim().is_empty() {
                    return Err(ConfigError::new(at("name"), "a model needs a name"));
                }
                if let Some(j) = models.iter().position(|o| o.name == m.name) {
                    return Err(ConfigError::new(
                        at("name"),
                        format!("`{}` is already the name of models[{j}]", m.name),
                    ));
                }
                let limit = bounded(&at("limit"), m.limit, 0, i64::from(u32::MAX))?;
                let period = duration(&at("period"), &Some(m.period.clone()), Duration::ZERO)?;
                if period.is_zero() {
                    return Err(ConfigError::new(
                        at("period"),
                        "a period must be above zero",
                    ));
                }
                models.push(SimModel {
                    name: m.name.clone(),
                    limit: u32::try_from(limit).unwrap_or(u32::MAX),
                    period,
                });
            }
            models
        };
        Ok(SimSettings {
            listen: match self.listen.as_deref() {
                Some(l) => address("listen", l)?,
                None => d.listen,
            },
            latency: duration("latency", &self.latency, d.latency)?,
            stream_chunks: match self.stream_chunks {
                Some(n) => u32::try_from(bounded("stream_chunks", n, 1, 1000)?).unwrap_or(1000),
                None => d.stream_chunks,
            },
            stream_interval: duration("stream_interval", &self.stream_interval, d.stream_interval)?,
            api_key: match &self.api_key_env {
                Some(var) => Some(read_env("api_key_env", var, env)?),
                None => None,
            },
            models,
            max_body: d.max_body,
            serve: d.serve,
        })
    }
}

/// An environment variable's value; the error names the variable, never a
/// value.
fn read_env(field: &str, var: &str, env: Env<'_>) -> Result<String, ConfigError> {
    if var.trim().is_empty() {
        return Err(ConfigError::new(field, "name an environment variable"));
    }
    match env(var) {
        Some(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
        Some(_) => Err(ConfigError::new(
            field,
            format!("environment variable `{var}` is empty"),
        )),
        None => Err(ConfigError::new(
            field,
            format!("environment variable `{var}` is not set"),
        )),
    }
}

fn check_providers(
    sections: &[ProviderSection],
    simulator: bool,
    env: Env<'_>,
) -> Result<Vec<Provider>, ConfigError> {
    if sections.is_empty() {
        return Err(ConfigError::new(
            "providers",
            "at least one [[providers]] entry is needed, with a name and a base_url",
        ));
    }
    let mut providers: Vec<Provider> = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        let provider = section
            .check(simulator, env)
            .map_err(|e| e.within(&format!("providers[{i}]")))?;
        if let Some(j) = providers.iter().position(|p| p.name == provider.name) {
            return Err(ConfigError::new(
                format!("providers[{i}].name"),
                format!("`{}` is already the name of providers[{j}]", provider.name),
            ));
        }
        if provider.default {
            if let Some(j) = providers.iter().position(|p| p.default) {
                return Err(ConfigError::new(
                    format!("providers[{i}].default"),
                    format!("providers[{j}] is already the default"),
                ));
            }
        }
        providers.push(provider);
    }
    if providers.len() == 1 && sections[0].default.is_none() {
        providers[0].default = true;
    }
    Ok(providers)
}

impl ProviderSection {
    fn check(&self, simulator: bool, env: Env<'_>) -> Result<Provider, ConfigError> {
        let name = self.name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ConfigError::new(
                "name",
                format!(
                    "`{}` is not a name; use letters, digits, `-`, `_` and `.`",
                    self.name
                ),
            ));
        }
        if RESERVED.contains(&name) {
            return Err(ConfigError::new(
                "name",
                format!("`{name}` is a path the gateway serves itself; choose another name"),
            ));
        }
        let upstream = if self.base_url.trim() == "simulator" {
            if !simulator {
                return Err(ConfigError::new(
                    "base_url",
                    "\"simulator\" needs a [simulator] section to start one",
                ));
            }
            Upstream::Simulator
        } else {
            upstream(&self.base_url).map_err(|m| ConfigError::new("base_url", m))?
        };
        let kind = self.kind.unwrap_or_default();
        let upstream = self.with_tls(upstream)?;
        let credential = match (&self.api_key_env, &self.api_key_header) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "api_key_header",
                    "names where the key goes, but there is no api_key_env to read it from",
                ));
            }
            (Some(var), header) => {
                let key = read_env("api_key_env", var, env)?;
                let header = match header {
                    Some(h) => HeaderName::try_from(h.trim()).map_err(|_| {
                        ConfigError::new("api_key_header", format!("`{h}` is not a header name"))
                    })?,
                    None => kind.key_header(),
                };
                let text = if header == http::header::AUTHORIZATION {
                    format!("Bearer {key}")
                } else {
                    key
                };
                let mut value = HeaderValue::try_from(text).map_err(|_| {
                    ConfigError::new(
                        "api_key_env",
                        format!(
                            "environment variable `{var}` holds characters a header cannot carry"
                        ),
                    )
                })?;
                value.set_sensitive(true);
                Some(Credential {
                    header,
                    value,
                    env: var.clone(),
                })
            }
        };
        let anthropic_version = match &self.anthropic_version {
            Some(v) => Some(check_version(v)?),
            None => kind.anthropic_version().map(HeaderValue::from_static),
        };
        let aliases = match &self.aliases {
            Some(table) => Aliases::check(table)?,
            None => Aliases::default(),
        };
        let api_version = match &self.api_version {
            Some(text) => Some(preset::check_api_version(text)?),
            None => kind.api_version().map(str::to_owned),
        };
        let rewrite_model = self.rewrite_model.unwrap_or(false);
        if rewrite_model && self.aliases.as_ref().is_none_or(BTreeMap::is_empty) {
            return Err(ConfigError::new(
                "rewrite_model",
                "there is nothing to rewrite without `aliases`; add them or remove this",
            ));
        }
        Ok(Provider {
            name: Arc::from(name),
            upstream,
            credential,
            default: self.default.unwrap_or(false),
            learn_limits: self.learn_limits.unwrap_or(false),
            kind,
            anthropic_version,
            limit_headers: self.limit_headers.unwrap_or(kind.limit_headers()),
            usage_format: kind.usage_format(),
            aliases: Arc::new(aliases),
            rewrite_model,
            api_version,
        })
    }

    /// `upstream` with its TLS settings; `ca_file` and
    /// `insecure_skip_verify` only mean something for https.
    fn with_tls(&self, upstream: Upstream) -> Result<Upstream, ConfigError> {
        let insecure = self.insecure_skip_verify == Some(true);
        let Upstream::Https {
            authority,
            base_path,
            ..
        } = upstream
        else {
            if self.ca_file.is_some() {
                return Err(ConfigError::new(
                    "ca_file",
                    "only an https:// base_url has a certificate to check",
                ));
            }
            if insecure {
                return Err(ConfigError::new(
                    "insecure_skip_verify",
                    "only an https:// base_url has a certificate to check",
                ));
            }
            return Ok(upstream);
        };
        if insecure && self.ca_file.is_some() {
            return Err(ConfigError::new(
                "insecure_skip_verify",
                "a ca_file is not used when no certificate is checked; remove one of the two",
            ));
        }
        let extra_roots = match &self.ca_file {
            Some(path) => tls::read_ca_file(path).map_err(|m| ConfigError::new("ca_file", m))?,
            None => Arc::from(Vec::new()),
        };
        Ok(Upstream::Https {
            authority,
            base_path,
            tls: TlsSettings {
                ca_file: self.ca_file.clone(),
                extra_roots,
                insecure_skip_verify: insecure,
            },
        })
    }
}

/// An http:// or https:// base URL, or why it cannot be used (its TLS
/// settings are added by [`ProviderSection::with_tls`]).
fn upstream(text: &str) -> Result<Upstream, String> {
    let uri: Uri = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a URL; write e.g. \"http://127.0.0.1:11434\""))?;
    let https = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => false,
        Some(s) if *s == Scheme::HTTPS => true,
        _ => return Err(format!("`{text}` needs http:// or https:// in front")),
    };
    let Some(authority) = uri.authority().cloned() else {
        return Err(format!("`{text}` has no host"));
    };
    if authority.as_str().contains('@') {
        return Err("credentials do not belong in a URL; put the key in api_key_env".to_owned());
    }
    if uri.query().is_some() {
        return Err(format!("`{text}`: a base URL cannot have a query"));
    }
    let base_path = uri.path().trim_end_matches('/').to_owned();
    Ok(if https {
        Upstream::Https {
            authority,
            base_path,
            tls: TlsSettings {
                ca_file: None,
                extra_roots: Arc::from(Vec::new()),
                insecure_skip_verify: false,
            },
        }
    } else {
        Upstream::Http {
            authority,
            base_path,
        }
    })
}

/// A rate-limit rule naming a provider (without wildcards) that does not
/// exist would never match: a typo worth an error.
fn check_rule_providers(file: &ProxyFile, providers: &[Provider]) -> Result<(), ConfigError> {
    let Some(rate) = &file.rate_limit else {
        return Ok(());
    };
    for (i, rule) in rate.rules.iter().enumerate() {
        if rule
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(crate::learn::RULE_PREFIX))
        {
            return Err(ConfigError::new(
                format!("rate_limit.rules[{i}].name"),
                format!(
                    "names starting with `{}` are the gateway's learned limits; choose another",
                    crate::learn::RULE_PREFIX
                ),
            ));
        }
        let Some(p) = rule.provider.as_deref() else {
            continue;
        };
        if p.contains(['*', '?']) || providers.iter().any(|q| &*q.name == p) {
            continue;
        }
        let names: Vec<&str> = providers.iter().map(|q| &*q.name).collect();
        return Err(ConfigError::new(
            format!("rate_limit.rules[{i}].provider"),
            format!(
                "no provider is named `{p}` (providers: {})",
                names.join(", ")
            ),
        ));
    }
    Ok(())
}
