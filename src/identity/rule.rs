//! A rule as written by the user: which requests it matches and what it sets.
//! Nothing here is validated; [`compile`](super::compile) does that when the
//! layer is built.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::redact::is_secret_name;

/// One identity rule: which outbound requests it matches, and the headers it
/// sets on them.
///
/// A rule matches on the request's host (exact, or `*.suffix` for any
/// subdomain), its path (a prefix or a glob) and a plain substring of the
/// whole URL; every condition given must hold, and a rule with none matches
/// every request. The first matching rule of a layer applies, and only it.
///
/// A matching rule sets, in this order, so that later ones override earlier
/// ones: the `User-Agent`; the dynamic ids (a fresh ULID request id per
/// request, and client, project and session ids stable for the layer's
/// lifetime); then its static headers. Headers the rule does not name are
/// left alone. A rule that sets nothing shields the requests it matches from
/// the rules after it.
///
/// Nothing is checked here: an invalid host, path, header name or value is
/// reported by [`IdentityHeaderLayer::new`](super::IdentityHeaderLayer::new),
/// naming the rule and the header.
///
/// ```
/// use tower_throttle::identity::Rule;
///
/// let rule = Rule::named("openrouter")
///     .host("openrouter.ai")
///     .path_prefix("/api/v1/")
///     .user_agent("my-agent/1.4")
///     .request_id()
///     .session_id()
///     .header("x-title", "My agent")
///     .header("authorization", "Bearer sk-or-0000");
/// assert!(!format!("{rule:?}").contains("sk-or-0000"));
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) path_prefix: Option<String>,
    #[serde(default)]
    pub(super) path_glob: Option<String>,
    #[serde(default)]
    pub(super) url_contains: Option<String>,
    #[serde(default)]
    pub(super) user_agent: Option<String>,
    #[serde(default)]
    pub(super) request_id: IdHeader,
    #[serde(default)]
    pub(super) client_id: IdHeader,
    #[serde(default)]
    pub(super) project_id: IdHeader,
    #[serde(default)]
    pub(super) session_id: IdHeader,
    #[serde(default, deserialize_with = "header_pairs")]
    pub(super) headers: Vec<(String, String)>,
    #[serde(default)]
    pub(super) sensitive: Vec<String>,
}

impl Rule {
    /// A rule with no conditions (it matches every request) that sets
    /// nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A rule with a name, used in errors and logs instead of its index.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: Some(name.into()),
            ..Self::default()
        }
    }

    /// Match requests for this host only: `api.example.com` exactly (case
    /// does not matter, nor a port), or `*.example.com` for any subdomain of
    /// `example.com` at any depth (not `example.com` itself). `*` alone
    /// means any host.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Match requests whose path (without the query) starts with `prefix`,
    /// which must start with `/`. Compared byte for byte.
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.path_prefix = Some(prefix.into());
        self
    }

    /// Match requests whose whole path (without the query) matches the glob
    /// `pattern`: `*` is any run of characters (`/` included), `?` one
    /// character. It must start with `/` or `*`.
    pub fn path_glob(mut self, pattern: impl Into<String>) -> Self {
        self.path_glob = Some(pattern.into());
        self
    }

    /// Match requests whose whole URL, as text, contains `needle`
    /// (case-sensitive). A server-side request usually knows only its path
    /// and query, not its scheme and host.
    pub fn url_contains(mut self, needle: impl Into<String>) -> Self {
        self.url_contains = Some(needle.into());
        self
    }

    /// Replace the request's `User-Agent` with `user_agent`.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// Add a fresh ULID per request in
    /// [`DEFAULT_REQUEST_ID_HEADER`](super::DEFAULT_REQUEST_ID_HEADER).
    pub fn request_id(mut self) -> Self {
        self.request_id = IdHeader::Default;
        self
    }

    /// Add a fresh ULID per request in the header `name`.
    pub fn request_id_header(mut self, name: impl Into<String>) -> Self {
        self.request_id = IdHeader::Named(name.into());
        self
    }

    /// Add the layer's client id in
    /// [`DEFAULT_CLIENT_ID_HEADER`](super::DEFAULT_CLIENT_ID_HEADER).
    pub fn client_id(mut self) -> Self {
        self.client_id = IdHeader::Default;
        self
    }

    /// Add the layer's client id in the header `name`.
    pub fn client_id_header(mut self, name: impl Into<String>) -> Self {
        self.client_id = IdHeader::Named(name.into());
        self
    }

    /// Add the layer's project id in
    /// [`DEFAULT_PROJECT_ID_HEADER`](super::DEFAULT_PROJECT_ID_HEADER).
    pub fn project_id(mut self) -> Self {
        self.project_id = IdHeader::Default;
        self
    }

    /// Add the layer's project id in the header `name`.
    pub fn project_id_header(mut self, name: impl Into<String>) -> Self {
        self.project_id = IdHeader::Named(name.into());
        self
    }

    /// Add the layer's session id in
    /// [`DEFAULT_SESSION_ID_HEADER`](super::DEFAULT_SESSION_ID_HEADER).
    pub fn session_id(mut self) -> Self {
        self.session_id = IdHeader::Default;
        self
    }

    /// Add the layer's session id in the header `name`.
    pub fn session_id_header(mut self, name: impl Into<String>) -> Self {
        self.session_id = IdHeader::Named(name.into());
        self
    }

    /// Set the static header `name: value`, replacing any value the request
    /// or this rule's user agent and ids gave it. Naming the same header
    /// again in this rule adds a second value.
    ///
    /// The value is treated as secret (stored with
    /// [`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive) and
    /// never shown) when the name is `authorization` or contains `cookie`,
    /// `key`, `token`, `secret`, `password` or `credential`; use
    /// [`sensitive_header`](Self::sensitive_header) for any other secret.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Set the static header `name: value`, as [`header`](Self::header), and
    /// treat its value as secret whatever its name.
    pub fn sensitive_header(self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        let mut rule = self.header(name.clone(), value);
        rule.sensitive.push(name);
        rule
    }

    /// Treat the value this rule sets in header `name` as secret; the rule
    /// must set that header.
    pub fn sensitive(mut self, name: impl Into<String>) -> Self {
        self.sensitive.push(name.into());
        self
    }

    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether this rule treats the value of header `name` as secret.
    pub(super) fn is_sensitive(&self, name: &str) -> bool {
        is_secret_name(name) || self.sensitive.iter().any(|s| s.eq_ignore_ascii_case(name))
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Rule");
        let fields = [
            ("name", &self.name),
            ("host", &self.host),
            ("path_prefix", &self.path_prefix),
            ("path_glob", &self.path_glob),
            ("url_contains", &self.url_contains),
        ];
        for (label, value) in fields {
            if let Some(value) = value {
                d.field(label, value);
            }
        }
        if let Some(ua) = &self.user_agent {
            d.field("user_agent", &Shown(self.is_sensitive("user-agent"), ua));
        }
        let ids = [
            ("request_id", &self.request_id),
            ("client_id", &self.client_id),
            ("project_id", &self.project_id),
            ("session_id", &self.session_id),
        ];
        for (label, id) in ids {
            if !matches!(id, IdHeader::Off) {
                d.field(label, id);
            }
        }
        if !self.headers.is_empty() {
            d.field("headers", &Headers(self));
        }
        d.finish()
    }
}

/// A text value, or `<redacted>` when it is secret.
struct Shown<'a>(bool, &'a str);

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shown(true, _) => f.write_str("<redacted>"),
            Shown(false, value) => fmt::Debug::fmt(value, f),
        }
    }
}

struct Headers<'a>(&'a Rule);

impl fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.0
                    .headers
                    .iter()
                    .map(|(name, value)| (name, Shown(self.0.is_sensitive(name), value))),
            )
            .finish()
    }
}

/// Whether a rule adds one of the dynamic ids, and in which header.
///
/// In configuration: `false` (the default), `true` for the default header
/// name, or a header name.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) enum IdHeader {
    #[default]
    Off,
    Default,
    Named(String),
}

impl fmt::Debug for IdHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdHeader::Off => f.write_str("off"),
            IdHeader::Default => f.write_str("default header"),
            IdHeader::Named(name) => fmt::Debug::fmt(name, f),
        }
    }
}

impl<'de> Deserialize<'de> for IdHeader {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct IdVisitor;

        impl Visitor<'_> for IdVisitor {
            type Value = IdHeader;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`true`, `false`, or a header name")
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<IdHeader, E> {
                Ok(if on { IdHeader::Default } else { IdHeader::Off })
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<IdHeader, E> {
                Ok(IdHeader::Named(name.to_owned()))
            }
        }

        de.deserialize_any(IdVisitor)
    }
}

/// A table of header names to values, in the order the deserializer gives
/// them, kept as pairs so that a name may repeat (in another letter case).
fn header_pairs<'de, D: Deserializer<'de>>(de: D) -> Result<Vec<(String, String)>, D::Error> {
    struct PairsVisitor;

    impl<'de> Visitor<'de> for PairsVisitor {
        type Value = Vec<(String, String)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of header names to string values")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
            while let Some(name) = map.next_key::<String>()? {
                let value = map.next_value::<String>()?;
                pairs.push((name, value));
            }
            Ok(pairs)
        }
    }

    de.deserialize_map(PairsVisitor)
}
