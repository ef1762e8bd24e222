//! The checks that turn a [`ProxyFile`] into [`Settings`]: the whole
//! file's (the layers' sections, rules naming providers,
//! `insecure_skip_verify`), and the `[gateway]` and `[simulator]`
//! sections'. `[[providers]]` are checked in `providers`.

use std::time::Duration;

use tower_throttle::config::{StackConfig, StoreConfig};
use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::{Limits, QuotaConfig, RateLimitConfig, Unit};
use tower_throttle::redact::{Escaped, Quoted};

use super::clients::{MIN_KEY_LEN, check_clients};
use super::providers::check_providers;
use super::routes::check_routes;
use super::settings::sim_serve_limits;
use super::values::{address, bounded, list, read_env};
use super::{
    Env, GatewaySection, GatewaySettings, Provider, ProxyFile, Settings, SimModel, SimSettings,
    SimulatorSection, TlsFiles, Upstream,
};
use crate::access_log;
use crate::admin::AdminKey;
use crate::edge::{AllowedHost, AllowedOrigin};

impl Settings {
    /// Parse and check `text`; the first problem is an error naming its
    /// field (`providers[1].base_url`, `rate_limit.rules[0].quotas[0].limit`).
    pub fn from_toml(text: &str, env: Env<'_>) -> Result<Self, ConfigError> {
        let (stack, mut file): (StackConfig, ProxyFile) = StackConfig::from_toml_with(text)?;
        file.stack = stack;
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
        let stack = stack_config(&file, file.stack.store.clone())?.validate()?;
        check_rule_providers(&file, &providers)?;
        let routes = check_routes(&file.routes, &providers)?;
        let clients = check_clients(&file.clients, env)?;
        let mut gateway = gateway;
        gateway.admin_key = match &file.gateway.admin_key_env {
            Some(var) => {
                let key = read_env("gateway.admin_key_env", var, env)?;
                let field = "gateway.admin_key_env";
                if key.len() < MIN_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(ConfigError::new(
                        field,
                        format!("the key must be at least {MIN_KEY_LEN} visible ASCII characters"),
                    ));
                }
                if clients
                    .iter()
                    .any(|c| c.keys.iter().any(|k| k == key.as_bytes()))
                {
                    return Err(ConfigError::new(
                        field,
                        "the operator key is a client's key too; a client's key must open no \
                         operator endpoint",
                    ));
                }
                Some(AdminKey(key.into_bytes()))
            }
            None => None,
        };
        if gateway.require_client_key && clients.is_empty() {
            return Err(ConfigError::new(
                "gateway.require_client_key",
                "no [[clients]] to give keys to: every request would be refused",
            ));
        }
        Ok(Self {
            file,
            gateway,
            simulator,
            providers,
            routes,
            clients,
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

    /// The same settings with the layers' state in Redis at `url`
    /// (`--redis`): the file's `[store]` with that URL, or one with
    /// defaults. Only the start reads it: a reload keeps the layers, and
    /// so their store.
    pub fn with_redis(mut self, url: &str) -> Result<Self, ConfigError> {
        let store = StoreConfig {
            redis_url: url.to_owned(),
            ..self.file.stack.store.clone().unwrap_or_default()
        };
        self.stack = stack_config(&self.file, Some(store))?
            .validate()
            .map_err(|e| e.within("--redis"))?;
        Ok(self)
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

/// The crate's sections of `file`, with `store`.
fn stack_config(file: &ProxyFile, store: Option<StoreConfig>) -> Result<StackConfig, ConfigError> {
    let rate_limit = file
        .stack
        .rate_limit
        .as_ref()
        .map(|r| token_units(r).map_err(|e| e.within("rate_limit")))
        .transpose()?;
    Ok(StackConfig {
        rate_limit,
        store,
        ..file.stack.clone()
    })
}

/// The gateway's quota units in the crate's words: a quota counts
/// `"requests"` (the default) or `"tokens"`, which the crate calls cost (the
/// gateway's cost of a request is its token estimate, see `usage`).
pub(crate) fn token_units(config: &RateLimitConfig) -> Result<RateLimitConfig, ConfigError> {
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

/// A rate-limit rule naming a provider (without wildcards) that does not
/// exist would never match: a typo worth an error.
fn check_rule_providers(file: &ProxyFile, providers: &[Provider]) -> Result<(), ConfigError> {
    let Some(rate) = &file.stack.rate_limit else {
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

impl GatewaySection {
    /// `tls_cert` and `tls_key`: both or neither, and the pair loads.
    fn tls(&self) -> Result<Option<TlsFiles>, ConfigError> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => (cert, key),
            (Some(_), None) => {
                return Err(ConfigError::new(
                    "tls_key",
                    "tls_cert needs tls_key, the certificate's private key (PEM)",
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "tls_cert",
                    "tls_key needs tls_cert, the certificate chain (PEM)",
                ));
            }
        };
        let files = TlsFiles {
            cert: cert.into(),
            key: key.into(),
        };
        // Checked now, so that a bad pair is refused at start and on
        // reload, not at the first handshake.
        serving::tls::CertFiles::load(&files.cert, &files.key)
            .map_err(|e| ConfigError::new("tls_cert", Escaped(&e).to_string()))?;
        Ok(Some(files))
    }

    /// `access_log` and its companions; these alone without it are a
    /// mistake (a log the operator thinks is written).
    fn access_log(&self) -> Result<Option<access_log::Settings>, ConfigError> {
        let Some(to) = &self.access_log else {
            let orphan = [
                ("access_log_format", self.access_log_format.is_some()),
                ("access_log_max_bytes", self.access_log_max_bytes.is_some()),
                ("access_log_sample", self.access_log_sample.is_some()),
            ];
            return match orphan.into_iter().find(|(_, set)| *set) {
                Some((field, _)) => Err(ConfigError::new(
                    field,
                    "has no effect without access_log (\"stderr\" or a file)",
                )),
                None => Ok(None),
            };
        };
        let max_bytes = match self.access_log_max_bytes {
            Some(n) => bounded("access_log_max_bytes", n, 4096, 1 << 40)? as u64,
            None => access_log::DEFAULT_MAX_BYTES,
        };
        let to = match to.as_str() {
            "stderr" => access_log::Destination::Stderr,
            "" => return Err(ConfigError::new("access_log", "\"stderr\" or a file path")),
            path => access_log::Destination::File {
                path: path.into(),
                max_bytes,
            },
        };
        let format = match self.access_log_format.as_deref() {
            None | Some("json") => access_log::Format::Json,
            Some("logfmt") => access_log::Format::Logfmt,
            Some(other) => {
                return Err(ConfigError::new(
                    "access_log_format",
                    format!("{} is neither \"json\" nor \"logfmt\"", Quoted(other)),
                ));
            }
        };
        let sample = self.access_log_sample.unwrap_or(1.0);
        if !(sample > 0.0 && sample <= 1.0) {
            return Err(ConfigError::new(
                "access_log_sample",
                "a share of requests, above 0 and at most 1 (leave access_log out for none)",
            ));
        }
        Ok(Some(access_log::Settings { to, format, sample }))
    }

    fn check(&self) -> Result<GatewaySettings, ConfigError> {
        let d = GatewaySettings::default();
        let upstream_timeout = self.upstream_timeout.unwrap_or(d.upstream_timeout);
        if upstream_timeout.is_zero() {
            return Err(ConfigError::new(
                "upstream_timeout",
                "0 would fail every request; leave it out for 5 minutes",
            ));
        }
        let events_heartbeat = self.events_heartbeat.unwrap_or(d.events_heartbeat);
        if events_heartbeat < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "events_heartbeat",
                "must be at least 10ms; the default is 15s",
            ));
        }
        let header_read_timeout = self.header_read_timeout.unwrap_or(d.header_read_timeout);
        if header_read_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "header_read_timeout",
                "must be at least 10ms; the default is 10s",
            ));
        }
        let body_write_timeout = self.body_write_timeout.unwrap_or(d.body_write_timeout);
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
            shutdown_grace: self.shutdown_grace.unwrap_or(d.shutdown_grace),
            max_routes: match self.max_routes {
                Some(n) => bounded("max_routes", n, 1, 100_000)?,
                None => d.max_routes,
            },
            route_idle: self.route_idle.unwrap_or(d.route_idle),
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
            body_read_timeout: self.body_read_timeout.unwrap_or(d.body_read_timeout),
            body_write_timeout,
            max_event_clients: match self.max_event_clients {
                Some(n) => bounded("max_event_clients", n, 0, 100_000)?,
                None => d.max_event_clients,
            },
            tls: self.tls()?,
            access_log: self.access_log()?,
            require_client_key: self.require_client_key.unwrap_or(false),
            // Read with the clients, in `Settings::check`.
            admin_key: None,
            admin_from_loopback: self.admin_from_loopback.unwrap_or(true),
        })
    }
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
                let period = m.period;
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
            latency: self.latency.unwrap_or(d.latency),
            stream_chunks: match self.stream_chunks {
                Some(n) => u32::try_from(bounded("stream_chunks", n, 1, 1000)?).unwrap_or(1000),
                None => d.stream_chunks,
            },
            stream_interval: self.stream_interval.unwrap_or(d.stream_interval),
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
