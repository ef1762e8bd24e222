//! The checked configuration, what the gateway and the simulator run on:
//! [`Settings`] and the parts it holds, their defaults, and what a reload
//! changed.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::Authority;
use http::{HeaderName, HeaderValue};
use tower_throttle::config::Stack;

use super::clients::Client;
use super::routes::ModelRoute;
use super::{DEFAULT_MAX_BODY, ProxyFile};
use crate::access_log;
use crate::admin::AdminKey;
use crate::edge::{AllowedHost, AllowedOrigin};
use crate::preset::{Aliases, Kind, LimitHeaders, UsageFormat};
use crate::serve;
use crate::tls::TlsSettings;

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
    /// `[[routes]]`, checked against the providers.
    pub routes: Vec<ModelRoute>,
    /// `[[clients]]`, their keys read.
    pub clients: Vec<Client>,
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
    /// HTTPS: the certificate chain's and the key's files.
    pub tls: Option<TlsFiles>,
    /// The access log, if one is written.
    pub access_log: Option<access_log::Settings>,
    /// A forwarded request without a client key is refused (401).
    pub require_client_key: bool,
    /// The operator key, with `[[clients]]`.
    pub admin_key: Option<AdminKey>,
    /// The operator endpoints answer this machine without the key.
    pub admin_from_loopback: bool,
}

/// `tls_cert` and `tls_key`, checked to load when the file was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM.
    pub cert: std::path::PathBuf,
    /// Its private key, PEM.
    pub key: std::path::PathBuf,
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
            tls: None,
            access_log: None,
            require_client_key: false,
            admin_key: None,
            admin_from_loopback: true,
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

impl Settings {
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
        if self.gateway.tls != new.gateway.tls {
            // The files' contents are read again while running; which
            // files, and whether at all, is fixed at start.
            changed.push("gateway.tls_cert");
        }
        if self.gateway.access_log != new.gateway.access_log {
            changed.push("gateway.access_log");
        }
        if a.simulator != b.simulator {
            changed.push("simulator");
        }
        if a.stack.store != b.stack.store {
            changed.push("store");
        }
        changed
    }

    /// The provider serving unprefixed paths, if any.
    pub fn default_provider(&self) -> Option<&Provider> {
        self.providers.iter().find(|p| p.default)
    }
}

/// The simulator's connection limits, timed as the gateway's.
pub(super) fn sim_serve_limits(gateway: &GatewaySettings) -> serve::ServeLimits {
    serve::ServeLimits {
        max_connections: serve::default_max_connections().min(SIM_MAX_CONNECTIONS),
        header_read_timeout: gateway.header_read_timeout,
        max_header_bytes: gateway.max_header_bytes,
        body_write_timeout: gateway.body_write_timeout,
    }
}
