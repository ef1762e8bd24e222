//! `[[clients]]`: the gateway's callers, each with its own keys (read from
//! the environment or a file, never written in the config), checked.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;
use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::{KeyPattern, Limits, Quota, QuotaConfig, RateLimitConfig, Rule};
use tower_throttle::redact::Quoted;

use super::Env;
use super::values::read_env;

/// The shortest key accepted: a shorter one can be guessed.
pub const MIN_KEY_LEN: usize = 16;
/// The longest key accepted.
pub const MAX_KEY_LEN: usize = 512;
/// The largest client weight: a heavier client would hold a busy route
/// for that many turns while others wait.
pub const MAX_WEIGHT: u32 = 100;

/// `[[clients]]` as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientSection {
    /// Shown in `/stats` and the access log; never the key.
    pub name: String,
    /// Where its keys are: several for rotation.
    pub keys: Vec<KeySource>,
    /// Its own quotas, over every route together, judged with the routes'
    /// (`[{ limit = 100, period = "1m" }]`); none: only the routes' limits.
    #[serde(default)]
    pub quotas: Vec<QuotaConfig>,
    /// Its quotas on the models a pattern matches (`[[clients.models]]`).
    #[serde(default)]
    pub models: Vec<ClientModelSection>,
    /// Its share of a saturated route: turns in a row, against another
    /// client's one per weight (1 to 100; default 1).
    pub weight: Option<u32>,
}

/// `[[clients.models]]`: a client's quotas on each model `pattern`
/// matches (`*` any run of characters, `?` any one).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientModelSection {
    /// The models, as `gpt-4*`.
    pub pattern: String,
    /// Its quotas there, written as a `[rate_limit]` section's.
    pub quotas: Vec<QuotaConfig>,
}

/// Where one key is read from.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeySource {
    /// An environment variable holding the key.
    pub env: Option<String>,
    /// A file holding the key (a trailing newline is dropped).
    pub file: Option<String>,
}

/// A client, checked: its name, keys and quotas.
#[derive(Clone, PartialEq)]
pub struct Client {
    pub name: Arc<str>,
    pub keys: Vec<Vec<u8>>,
    pub quotas: Vec<Quota>,
    /// Quotas on the models a pattern matches, in the order written.
    pub models: Vec<(String, Vec<Quota>)>,
    /// Turns in a row on a route it waits on with others (1 to 100).
    pub weight: u32,
}

/// The per-model client limiter's limits: one rule per client and model
/// pattern, on the key (client name, model), so each model it matches has
/// its quotas; of several patterns that match a model, the most specific
/// counts it (as for `[[rate_limit.rules]]`: an exact name first, then
/// the pattern with more literal characters).
pub fn client_model_limits(clients: &[Client]) -> Result<Limits, ConfigError> {
    let mut limits = Limits::default();
    for client in clients {
        for (pattern, quotas) in &client.models {
            let name = format!("{}:{pattern}", client.name);
            let mut rule = Rule::new(
                &*name,
                KeyPattern::parts([&*client.name, pattern.as_str()])?,
            );
            for quota in quotas {
                rule = rule.with_quota(*quota);
            }
            limits.rules.push(rule);
        }
    }
    Ok(limits)
}

/// The client limiter's limits: one rule per client with quotas, named
/// after the client, on the key that is its name; reject mode (a client
/// over its quota is told at once).
pub fn client_limits(clients: &[Client]) -> Result<Limits, ConfigError> {
    let mut limits = Limits::default();
    for client in clients.iter().filter(|c| !c.quotas.is_empty()) {
        let mut rule = Rule::new(&*client.name, KeyPattern::literal([&*client.name])?);
        for quota in &client.quotas {
            rule = rule.with_quota(*quota);
        }
        limits.rules.push(rule);
    }
    Ok(limits)
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.name)
            .field("keys", &format_args!("<{} redacted>", self.keys.len()))
            .field("weight", &self.weight)
            .finish()
    }
}

/// Check `sections`, reading each key; an error names the entry, never
/// the key.
pub fn check_clients(sections: &[ClientSection], env: Env<'_>) -> Result<Vec<Client>, ConfigError> {
    let mut names = HashSet::new();
    let mut keys: HashSet<Vec<u8>> = HashSet::new();
    let mut clients = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        let within = |e: ConfigError| e.within(&format!("clients[{i}]"));
        let name = section.name.as_str();
        let plain = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if name.is_empty() || name.len() > 64 || !plain || name == "anonymous" {
            return Err(within(ConfigError::new(
                "name",
                "1 to 64 letters, digits, `-`, `_` or `.`, and not `anonymous`",
            )));
        }
        if !names.insert(name) {
            return Err(within(ConfigError::new(
                "name",
                format!("{} is used twice", Quoted(name)),
            )));
        }
        if section.keys.is_empty() {
            return Err(within(ConfigError::new(
                "keys",
                "at least one key: { env = \"VAR\" } or { file = \"PATH\" }",
            )));
        }
        let mut read = Vec::new();
        for (k, source) in section.keys.iter().enumerate() {
            let key = read_key(source, env).map_err(|e| within(e.within(&format!("keys[{k}]"))))?;
            if !keys.insert(key.clone()) {
                return Err(within(ConfigError::new(
                    format!("keys[{k}]"),
                    "this key is another key's too; each client's keys are its own",
                )));
            }
            read.push(key);
        }
        let quotas = client_quotas(&section.quotas).map_err(within)?;
        let mut models = Vec::new();
        for (m, model) in section.models.iter().enumerate() {
            let within = |e: ConfigError| within(e.within(&format!("models[{m}]")));
            if model.quotas.is_empty() {
                return Err(within(ConfigError::new("quotas", "at least one quota")));
            }
            KeyPattern::parts([name, model.pattern.as_str()])
                .map_err(|e| within(ConfigError::new("pattern", e.message)))?;
            if models.iter().any(|(p, _)| *p == model.pattern) {
                return Err(within(ConfigError::new(
                    "pattern",
                    format!("{} is this client's twice", Quoted(&model.pattern)),
                )));
            }
            let quotas = client_quotas(&model.quotas).map_err(within)?;
            models.push((model.pattern.clone(), quotas));
        }
        let weight = section.weight.unwrap_or(1);
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(within(ConfigError::new(
                "weight",
                format!(
                    "1 to {MAX_WEIGHT}: turns in a row on a busy route, to another client's one"
                ),
            )));
        }
        clients.push(Client {
            name: Arc::from(name),
            keys: read,
            quotas,
            models,
            weight,
        });
    }
    Ok(clients)
}

/// Quotas checked as a [rate_limit] section's, so that they read the same
/// (requests, or `unit = "tokens"`) and an error names `quotas[j]`.
fn client_quotas(quotas: &[QuotaConfig]) -> Result<Vec<Quota>, ConfigError> {
    Ok(super::check::token_units(&RateLimitConfig {
        quotas: quotas.to_vec(),
        ..RateLimitConfig::default()
    })?
    .validate()?
    .default)
}

fn read_key(source: &KeySource, env: Env<'_>) -> Result<Vec<u8>, ConfigError> {
    let key = match (&source.env, &source.file) {
        (Some(var), None) => read_env("env", var, env)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new(
                    "file",
                    format!("cannot read {}: {}", Quoted(path), e.kind()),
                )
            })?;
            text.trim_end_matches(['\n', '\r']).to_owned()
        }
        _ => {
            return Err(ConfigError::new(
                "env",
                "one of env = \"VAR\" or file = \"PATH\", not both",
            ));
        }
    };
    // Said without the key: a config error is printed and logged.
    let field = if source.env.is_some() { "env" } else { "file" };
    if key.len() < MIN_KEY_LEN || key.len() > MAX_KEY_LEN {
        return Err(ConfigError::new(
            field,
            format!("the key must be {MIN_KEY_LEN} to {MAX_KEY_LEN} bytes long"),
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            field,
            "the key must be visible ASCII (it travels in a header), without spaces",
        ));
    }
    Ok(key.into_bytes())
}
