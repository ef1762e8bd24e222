//! Checking a [`Rule`] and turning it into what a request needs: a matcher
//! and a list of header writes, every name and value already parsed.

use std::fmt;

use http::header::{HeaderName, HeaderValue, USER_AGENT};
use wildmatch::WildMatch;

use super::rule::{IdHeader, Rule};
use super::{
    DEFAULT_CLIENT_ID_HEADER, DEFAULT_PROJECT_ID_HEADER, DEFAULT_REQUEST_ID_HEADER,
    DEFAULT_SESSION_ID_HEADER,
};
use crate::error::ConfigError;

/// Where a rule's host condition puts it in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum HostMatch {
    /// No host condition.
    Any,
    /// This host exactly (lowercase, no trailing dot).
    Exact(Box<str>),
    /// Any host ending in `.` + this suffix (lowercase).
    Suffix(Box<str>),
}

/// A path condition.
#[derive(Clone)]
pub(super) enum PathMatch {
    Prefix(Box<str>),
    Glob(WildMatch),
}

impl PathMatch {
    #[inline]
    pub(super) fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Prefix(prefix) => path
                .as_bytes()
                .get(..prefix.len())
                .is_some_and(|start| super::matching::same_bytes(start, prefix.as_bytes())),
            PathMatch::Glob(glob) => glob.matches(path),
        }
    }
}

impl fmt::Debug for PathMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathMatch::Prefix(prefix) => write!(f, "prefix {prefix:?}"),
            PathMatch::Glob(glob) => write!(f, "glob {:?}", glob.to_string()),
        }
    }
}

/// The value a header write puts in.
#[derive(Clone)]
pub(super) enum Value {
    /// The same value on every request.
    Fixed(HeaderValue),
    /// A fresh request id.
    RequestId,
    /// The layer's client id.
    ClientId,
    /// The layer's project id.
    ProjectId,
    /// The layer's session id.
    SessionId,
}

/// One header a matching rule sets.
#[derive(Clone)]
pub(super) struct Write {
    pub(super) name: HeaderName,
    pub(super) value: Value,
    /// Add beside the value already set by this rule, rather than replace.
    pub(super) append: bool,
    /// The value is secret: stored with `set_sensitive(true)`, never shown.
    pub(super) sensitive: bool,
}

impl fmt::Debug for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.append { "append" } else { "set" };
        match &self.value {
            _ if self.sensitive => write!(f, "{op} {} = <redacted>", self.name),
            Value::Fixed(v) => write!(f, "{op} {} = {v:?}", self.name),
            Value::RequestId => write!(f, "{op} {} = <request id>", self.name),
            Value::ClientId => write!(f, "{op} {} = <client id>", self.name),
            Value::ProjectId => write!(f, "{op} {} = <project id>", self.name),
            Value::SessionId => write!(f, "{op} {} = <session id>", self.name),
        }
    }
}

/// A checked rule.
#[derive(Clone)]
pub(super) struct Compiled {
    pub(super) label: Box<str>,
    pub(super) host: HostMatch,
    pub(super) path: Option<PathMatch>,
    pub(super) url_contains: Option<Box<str>>,
    pub(super) writes: Box<[Write]>,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Rule");
        d.field("rule", &format_args!("{}", self.label));
        match &self.host {
            HostMatch::Any => {}
            HostMatch::Exact(host) => {
                d.field("host", host);
            }
            HostMatch::Suffix(suffix) => {
                d.field("host", &format_args!("\"*.{suffix}\""));
            }
        }
        if let Some(path) = &self.path {
            d.field("path", path);
        }
        if let Some(needle) = &self.url_contains {
            d.field("url_contains", needle);
        }
        d.field("writes", &self.writes).finish()
    }
}

/// How logs and `Debug` name a rule: `rules[2]`, or `rules[2] ("openai")`.
fn label(index: usize, rule: &Rule) -> String {
    match &rule.name {
        Some(name) => format!("rules[{index}] ({name:?})"),
        None => format!("rules[{index}]"),
    }
}

/// Check `rule`, the `index`-th of its layer.
///
/// An error's field is the path of the value at fault, as in the
/// configuration (`rules[2].headers["x-title"]`); its message starts with the
/// rule's name when it has one.
pub(super) fn compile(index: usize, rule: &Rule) -> Result<Compiled, ConfigError> {
    let err = |key: &str, message: String| {
        let message = match &rule.name {
            Some(name) => format!("rule {name:?}: {message}"),
            None => message,
        };
        ConfigError::new(format!("rules[{index}].{key}"), message)
    };

    let host = match rule.host.as_deref() {
        None => HostMatch::Any,
        Some(host) => host_match(host).map_err(|m| err("host", m))?,
    };

    let path = match (&rule.path_prefix, &rule.path_glob) {
        (Some(_), Some(_)) => {
            return Err(err(
                "path_glob",
                "give a path prefix or a path glob, not both".into(),
            ));
        }
        (Some(prefix), None) => {
            if !prefix.starts_with('/') {
                return Err(err(
                    "path_prefix",
                    format!("{prefix:?} must start with `/`, as every request path does"),
                ));
            }
            Some(PathMatch::Prefix(prefix.as_str().into()))
        }
        (None, Some(glob)) => {
            if !(glob.starts_with('/') || glob.starts_with('*')) {
                return Err(err(
                    "path_glob",
                    format!("{glob:?} must start with `/` or `*`, as every request path does"),
                ));
            }
            Some(PathMatch::Glob(WildMatch::new(glob)))
        }
        (None, None) => None,
    };

    let url_contains = match rule.url_contains.as_deref() {
        Some("") => {
            return Err(err(
                "url_contains",
                "is empty; leave it out to match any URL".into(),
            ));
        }
        Some(needle) => Some(needle.into()),
        None => None,
    };

    let mut writes: Vec<Write> = Vec::new();

    if let Some(ua) = &rule.user_agent {
        let sensitive = rule.is_sensitive(USER_AGENT.as_str());
        let value = header_value(ua, sensitive).map_err(|m| err("user_agent", m))?;
        set(&mut writes, USER_AGENT, Value::Fixed(value), sensitive);
    }

    let ids = [
        (
            "request_id",
            &rule.request_id,
            DEFAULT_REQUEST_ID_HEADER,
            Value::RequestId,
        ),
        (
            "client_id",
            &rule.client_id,
            DEFAULT_CLIENT_ID_HEADER,
            Value::ClientId,
        ),
        (
            "project_id",
            &rule.project_id,
            DEFAULT_PROJECT_ID_HEADER,
            Value::ProjectId,
        ),
        (
            "session_id",
            &rule.session_id,
            DEFAULT_SESSION_ID_HEADER,
            Value::SessionId,
        ),
    ];
    for (key, id, default, value) in ids {
        let name = match id {
            IdHeader::Off => continue,
            IdHeader::Default => default,
            IdHeader::Named(name) => header_name(name).map_err(|m| err(key, m))?,
        };
        let sensitive = rule.is_sensitive(name.as_str());
        set(&mut writes, name, value, sensitive);
    }

    // Static headers last: each replaces whatever the request, the user
    // agent or an id put in its header; a name repeated in the rule adds a
    // further value.
    let mut statics: Vec<HeaderName> = Vec::new();
    for (name, value) in &rule.headers {
        let key = format!("headers[{name:?}]");
        let parsed = header_name(name).map_err(|m| err(&key, m))?;
        let sensitive = rule.is_sensitive(name);
        let value = Value::Fixed(header_value(value, sensitive).map_err(|m| err(&key, m))?);
        if statics.contains(&parsed) {
            writes.push(Write {
                name: parsed,
                value,
                append: true,
                sensitive,
            });
        } else {
            statics.push(parsed.clone());
            set(&mut writes, parsed, value, sensitive);
        }
    }

    // A name marked sensitive that the rule never sets is most likely a
    // misspelling, which would leave the real header unprotected.
    for (i, name) in rule.sensitive.iter().enumerate() {
        let key = format!("sensitive[{i}]");
        let parsed = header_name(name).map_err(|m| err(&key, m))?;
        if !writes.iter().any(|w| w.name == parsed) {
            return Err(err(
                &key,
                format!("{name:?} is marked sensitive but the rule sets no such header"),
            ));
        }
    }

    Ok(Compiled {
        label: label(index, rule).into(),
        host,
        path,
        url_contains,
        writes: writes.into(),
    })
}

/// Set `name` to `value`, replacing an earlier write of the same name.
fn set(writes: &mut Vec<Write>, name: HeaderName, value: Value, sensitive: bool) {
    writes.retain(|w| w.name != name);
    writes.push(Write {
        name,
        value,
        append: false,
        sensitive,
    });
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        format!(
            "{name:?} is not a valid header name \
             (letters, digits and !#$%&'*+-.^_`|~ only; no spaces, no colon)"
        )
    })
}

/// Parse `value`, marking it sensitive if asked. The error never repeats the
/// value, which may be a secret.
fn header_value(value: &str, sensitive: bool) -> Result<HeaderValue, String> {
    let mut value = HeaderValue::from_str(value).map_err(|_| {
        "the value is not a valid header value (no line breaks or other control \
         characters); it is not repeated here, as it may be a secret"
            .to_owned()
    })?;
    value.set_sensitive(sensitive);
    Ok(value)
}

/// Parse a host condition.
fn host_match(host: &str) -> Result<HostMatch, String> {
    if host == "*" {
        return Ok(HostMatch::Any);
    }
    let (wildcard, bare) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    let bare = bare.strip_suffix('.').unwrap_or(bare);
    if bare.is_empty() {
        return Err(format!("{host:?} names no host"));
    }
    if !bare.starts_with('[') && bare.split('.').any(str::is_empty) {
        return Err(format!(
            "{host:?} has an empty label (`..`, or a leading dot)"
        ));
    }
    if bare.contains('*') {
        return Err(format!(
            "{host:?}: only a leading `*.` wildcard is supported (`*.example.com`)"
        ));
    }
    let ipv6 = bare.starts_with('[') && bare.ends_with(']');
    let bad = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '/' | '?' | '#' | '@' | '\\')
            || (c == ':' && !ipv6)
    };
    if bare.chars().any(bad) {
        return Err(format!(
            "{host:?} is not a host name (give the host alone: no scheme, port, path or spaces)"
        ));
    }
    let bare = bare.to_ascii_lowercase().into_boxed_str();
    Ok(if wildcard {
        HostMatch::Suffix(bare)
    } else {
        HostMatch::Exact(bare)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(
            host_match("API.Example.com.").unwrap(),
            HostMatch::Exact("api.example.com".into())
        );
        assert_eq!(
            host_match("*.example.com").unwrap(),
            HostMatch::Suffix("example.com".into())
        );
        assert_eq!(host_match("*").unwrap(), HostMatch::Any);
        assert_eq!(
            host_match("[::1]").unwrap(),
            HostMatch::Exact("[::1]".into())
        );
        for bad in [
            "",
            "*.",
            ".",
            "a.*.com",
            "**.com",
            "*..com",
            ".example.com",
            "a..b",
            "example.com:443",
            "https://example.com",
            "exa mple.com",
            "example.com/v1",
        ] {
            assert!(host_match(bad).is_err(), "{bad:?}");
        }
    }
}
