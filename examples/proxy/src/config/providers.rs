//! `[[providers]]`, checked: names, base URLs and their TLS, credentials
//! read from the environment, and the defaults of each provider's kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::uri::Scheme;
use http::{HeaderName, HeaderValue, Uri};
use tower_throttle::error::ConfigError;

use super::values::read_env;
use super::{Credential, Env, Provider, ProviderSection, RESERVED, Upstream};
use crate::preset::{self, Aliases, check_version};
use crate::tls::{self, TlsSettings};

pub(super) fn check_providers(
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
