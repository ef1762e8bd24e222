//! The small value parsers the checks share: addresses,
//! bounded numbers, lists and environment variables, each error naming its
//! field.

use std::net::SocketAddr;
use tower_throttle::error::ConfigError;

use super::Env;

pub(super) fn address(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            field,
            format!("`{text}` is not an address; write e.g. \"127.0.0.1:8080\""),
        )
    })
}

pub(super) fn bounded(field: &str, value: i64, min: i64, max: i64) -> Result<usize, ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            field,
            format!("{value} is outside {min}..={max}"),
        ));
    }
    usize::try_from(value).map_err(|_| ConfigError::new(field, format!("{value} is too large")))
}

/// Each entry of an optional list, checked; an error names the entry.
pub(super) fn list<T>(
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

/// An environment variable's value; the error names the variable, never a
/// value.
pub(super) fn read_env(field: &str, var: &str, env: Env<'_>) -> Result<String, ConfigError> {
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
