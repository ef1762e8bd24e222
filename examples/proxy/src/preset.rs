//! Provider presets and model aliases: what `kind = "openai" | "anthropic" |
//! "azure_openai" | "openai_compatible"` on a `[[providers]]` entry sets,
//! and the entry's `aliases` table, checked.
//!
//! A preset is defaults only: `api_key_header`, `anthropic_version` and
//! `limit_headers` written in the entry win over it.
//!
//! | kind | key sent as | also sent | rate-limit headers | streamed usage |
//! |---|---|---|---|---|
//! | `openai`, `openai_compatible` (default) | `Authorization: Bearer KEY` | | `x-ratelimit-*` | final chunk's `usage` (`stream_options.include_usage`) |
//! | `anthropic` | `x-api-key: KEY` | `anthropic-version: 2023-06-01` unless the client sends one | `anthropic-ratelimit-*` | `message_delta`'s `usage` |
//! | `azure_openai` | `api-key: KEY` | `api-version=2024-10-21` in the query unless the client gives one | `x-ratelimit-*` | as `openai` |
//!
//! Every kind finds the model in the JSON body's `"model"` ([`MODEL_FIELD`]),
//! on every path (the gateway reads it for any `POST`, `PUT` or `PATCH`),
//! except on Azure's deployment paths (`/openai/deployments/NAME/...`),
//! where the deployment is the model ([`deployment`]); [`Kind::endpoint`]
//! says which of a kind's paths answer with token usage.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use tower_throttle::error::ConfigError;
use tower_throttle::redact::Escaped;

use crate::config::MAX_MODEL_LEN;
use crate::edge;

/// Which family of rate-limit response headers a provider sends; the
/// gateway learns a route's limits from them.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum LimitHeaders {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (OpenAI, and
    /// most OpenAI-compatible services).
    #[serde(rename = "openai")]
    OpenAi,
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// The IETF `RateLimit` and `RateLimit-Policy` fields.
    #[serde(rename = "ietf")]
    Ietf,
}

impl LimitHeaders {
    /// The library's name for the family.
    pub fn family(self) -> tower_throttle::backoff::HeaderFamily {
        use tower_throttle::backoff::HeaderFamily;
        match self {
            Self::OpenAi => HeaderFamily::OpenAi,
            Self::Anthropic => HeaderFamily::Anthropic,
            Self::Ietf => HeaderFamily::Ietf,
        }
    }
}

/// Where an answer states the tokens it used, streamed or not.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum UsageFormat {
    /// A JSON `usage` object (`total_tokens`, or `prompt_tokens` +
    /// `completion_tokens`); streamed, on the last data chunk before `[DONE]`
    /// when the request asked for `stream_options.include_usage`.
    #[serde(rename = "openai")]
    OpenAi,
    /// A JSON `usage` object (`input_tokens` + `output_tokens`); streamed,
    /// `message_start`'s input tokens and the `message_delta` event's
    /// output tokens.
    #[serde(rename = "anthropic")]
    Anthropic,
}

/// `kind`: the API a provider speaks.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum Kind {
    /// api.openai.com.
    #[serde(rename = "openai")]
    OpenAi,
    /// api.anthropic.com.
    #[serde(rename = "anthropic")]
    Anthropic,
    /// Azure OpenAI (`https://RESOURCE.openai.azure.com/openai/...`): the key
    /// in `api-key`, an `api-version` query, the deployment in the path.
    #[serde(rename = "azure_openai")]
    AzureOpenAi,
    /// A server speaking OpenAI's API (vLLM, llama.cpp, Ollama, OpenRouter):
    /// what a provider without `kind` is.
    #[default]
    #[serde(rename = "openai_compatible")]
    OpenAiCompatible,
}

/// The JSON body field every kind names its model in.
pub const MODEL_FIELD: &str = "model";

/// The `anthropic-version` an `anthropic` provider sends unless
/// `anthropic_version` says otherwise (or the client sends its own).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The `api-version` an `azure_openai` provider adds to a request whose
/// query has none, unless `api_version` says otherwise: the latest GA
/// version of Azure OpenAI's data-plane API when this was written.
pub const AZURE_API_VERSION: &str = "2024-10-21";

/// One path of a kind's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The path, as appended to an API root such as `https://api.openai.com`.
    pub path: &'static str,
    /// Whether its answers state the tokens used (a count of tokens, such
    /// as `count_tokens`, uses none).
    pub usage: bool,
}

const OPENAI_ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/v1/chat/completions",
        usage: true,
    },
    Endpoint {
        path: "/v1/completions",
        usage: true,
    },
    Endpoint {
        path: "/v1/embeddings",
        usage: true,
    },
    // Its stream states usage in the `response.completed` event.
    Endpoint {
        path: "/v1/responses",
        usage: true,
    },
];

const ANTHROPIC_ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/v1/messages",
        usage: true,
    },
    Endpoint {
        path: "/v1/messages/count_tokens",
        usage: false,
    },
];

// Azure's paths end like OpenAI's after `/openai/deployments/NAME` (or
// `/openai/v1`), so they are matched by their end alone.
const AZURE_ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/chat/completions",
        usage: true,
    },
    Endpoint {
        path: "/completions",
        usage: true,
    },
    Endpoint {
        path: "/embeddings",
        usage: true,
    },
    Endpoint {
        path: "/responses",
        usage: true,
    },
];

impl Kind {
    /// The header the key goes in unless `api_key_header` says.
    pub fn key_header(self) -> HeaderName {
        match self {
            Self::OpenAi | Self::OpenAiCompatible => http::header::AUTHORIZATION,
            Self::Anthropic => HeaderName::from_static("x-api-key"),
            Self::AzureOpenAi => HeaderName::from_static("api-key"),
        }
    }

    /// The `api-version` query added unless `api_version` says.
    pub fn api_version(self) -> Option<&'static str> {
        (self == Self::AzureOpenAi).then_some(AZURE_API_VERSION)
    }

    /// The `anthropic-version` sent unless `anthropic_version` says.
    pub fn anthropic_version(self) -> Option<&'static str> {
        (self == Self::Anthropic).then_some(ANTHROPIC_VERSION)
    }

    /// The rate-limit headers read unless `limit_headers` says.
    pub fn limit_headers(self) -> LimitHeaders {
        match self {
            Self::OpenAi | Self::OpenAiCompatible | Self::AzureOpenAi => LimitHeaders::OpenAi,
            Self::Anthropic => LimitHeaders::Anthropic,
        }
    }

    /// Where its answers state their usage.
    pub fn usage_format(self) -> UsageFormat {
        match self {
            Self::OpenAi | Self::OpenAiCompatible | Self::AzureOpenAi => UsageFormat::OpenAi,
            Self::Anthropic => UsageFormat::Anthropic,
        }
    }

    /// Its API's paths that take a model in the body.
    pub fn endpoints(self) -> &'static [Endpoint] {
        match self {
            Self::OpenAi | Self::OpenAiCompatible => OPENAI_ENDPOINTS,
            Self::Anthropic => ANTHROPIC_ENDPOINTS,
            Self::AzureOpenAi => AZURE_ENDPOINTS,
        }
    }

    /// The endpoint an upstream path (base path included, query left out)
    /// is, if any: the path ends with it (each endpoint starts with `/`, so
    /// at a segment boundary), so a base URL with a prefix
    /// (`https://openrouter.ai/api`) is matched too.
    pub fn endpoint(self, upstream_path: &str) -> Option<Endpoint> {
        let path = upstream_path.trim_end_matches('/');
        self.endpoints()
            .iter()
            .copied()
            .find(|e| path.ends_with(e.path))
    }

    /// Whether a stream from this upstream path reports its usage only when
    /// the request asks (`stream_options.include_usage`), and the gateway
    /// may ask on a client's behalf: OpenAI's chat and text completions, on
    /// OpenAI and servers of its shape. Not Azure, whose API versions before
    /// 2024-09 refuse `stream_options` (a client there asks itself).
    pub fn streams_usage_on_request(self, upstream_path: &str) -> bool {
        let path = upstream_path.trim_end_matches('/');
        matches!(self, Self::OpenAi | Self::OpenAiCompatible)
            && (path.ends_with("/chat/completions") || path.ends_with("/completions"))
    }
}

/// The deployment an Azure OpenAI path names
/// (`.../openai/deployments/NAME/chat/completions`): Azure serves the model
/// deployed under that name whatever the body says, so it is the route's
/// model. `None` for any other path (`/openai/v1/...` names the model in
/// the body).
pub fn deployment(upstream_path: &str) -> Option<&str> {
    let (_, after) = upstream_path.split_once("/openai/deployments/")?;
    let name = after.split('/').next()?;
    (!name.is_empty()).then_some(name)
}

/// `api_version`, checked: what a query value can carry unescaped.
pub fn check_api_version(text: &str) -> Result<String, ConfigError> {
    let text = text.trim();
    if text.is_empty()
        || text.len() > 64
        || !text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(ConfigError::new(
            "api_version",
            "write a version such as \"2024-10-21\" (letters, digits, '-', '.', '_')",
        ));
    }
    Ok(text.to_owned())
}

/// A provider's `aliases`, checked: the model a route is counted under
/// for the name a request gives. The body is forwarded as sent: an alias
/// says how the upstream resolves a name, it does not rename the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aliases {
    names: HashMap<Arc<str>, Arc<str>>,
    /// `"*"`: every other model, and a body naming none.
    every: Option<Arc<str>>,
}

/// The alias key that maps every model.
pub const EVERY_MODEL: &str = "*";

impl Aliases {
    /// Check a provider's `aliases` table; an error names the entry.
    pub fn check(table: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut aliases = Self::default();
        for (name, target) in table {
            let field = || format!("aliases[{:?}]", name);
            if name != EVERY_MODEL {
                if let Some(problem) = name_problem(name) {
                    return Err(ConfigError::new(field(), problem));
                }
                if name.contains(['*', '?']) {
                    return Err(ConfigError::new(
                        field(),
                        "aliases are exact names; only `\"*\"` alone stands for every model",
                    ));
                }
            }
            if let Some(problem) = name_problem(target) {
                return Err(ConfigError::new(field(), problem));
            }
            if target == EVERY_MODEL {
                return Err(ConfigError::new(
                    field(),
                    "`*` is not a model name; an alias names the model the upstream serves",
                ));
            }
            // One step only: a target is what the upstream serves, so a
            // target that is itself an alias is a mistake worth naming.
            if table.get(target).is_some_and(|next| next != target) {
                return Err(ConfigError::new(
                    field(),
                    format!(
                        "`{}` is itself an alias; map straight to the model it names",
                        Escaped(target)
                    ),
                ));
            }
            let target: Arc<str> = Arc::from(target.as_str());
            if name == EVERY_MODEL {
                aliases.every = Some(target);
            } else {
                aliases.names.insert(Arc::from(name.as_str()), target);
            }
        }
        Ok(aliases)
    }

    /// The model a request naming `model` (`None`: the body names none) is
    /// counted under, when an alias applies.
    pub fn resolve(&self, model: Option<&str>) -> Option<&Arc<str>> {
        model
            .and_then(|m| self.names.get(m))
            .or(self.every.as_ref())
    }

    /// Every model an alias leads to.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.names.values().chain(self.every.iter()).map(|t| &**t)
    }
}

/// Why `name` cannot be a model name in an alias: the same rule as a
/// request's model (`edge::model_problem`).
fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_MODEL_LEN {
        return Some(format!("a model name is 1 to {MAX_MODEL_LEN} bytes long"));
    }
    edge::model_problem(name).map(str::to_owned)
}

/// `anthropic_version`, checked: a header value of visible ASCII.
pub fn check_version(text: &str) -> Result<HeaderValue, ConfigError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "anthropic_version",
            "write a version such as \"2023-06-01\"",
        ));
    }
    HeaderValue::try_from(text).map_err(|_| {
        ConfigError::new(
            "anthropic_version",
            "write a version such as \"2023-06-01\"",
        )
    })
}

/// `body` (a JSON object) with its top-level `"model"` set to `model`, for
/// `rewrite_model`; every other member is copied as written (numbers keep
/// their spelling, members their order), which re-serializing a parsed
/// `Value` would not do. `None` when `body` is not a JSON object naming a
/// model: it then goes as sent.
pub fn rewrite_model(body: &[u8], model: &str) -> Option<bytes::Bytes> {
    // Members in order; a `Vec` rather than a map, so none is reordered.
    // A repeated `"model"` never gets here: the model key refuses it.
    let members: Members<'_> = serde_json::from_slice(body).ok()?;
    if !members.0.iter().any(|(name, _)| name == MODEL_FIELD) {
        return None;
    }
    let model = serde_json::to_string(model).ok()?;
    members.write(&[(MODEL_FIELD, &model)], None)
}

/// A JSON object's members as written, in order.
pub(crate) struct Members<'a>(
    pub(crate) Vec<(std::borrow::Cow<'a, str>, &'a serde_json::value::RawValue)>,
);

impl Members<'_> {
    /// The object again: every member as written, but those named in
    /// `replace` (name, JSON text), and `append` (name, JSON text) at the
    /// end. `None` only if a name cannot be written.
    pub(crate) fn write(
        &self,
        replace: &[(&str, &str)],
        append: Option<(&str, &str)>,
    ) -> Option<bytes::Bytes> {
        let mut out = Vec::with_capacity(256);
        out.push(b'{');
        let members = self.0.iter().map(|(name, value)| {
            let text = replace
                .iter()
                .find(|(n, _)| n == name)
                .map_or(value.get(), |(_, text)| text);
            (&**name, text)
        });
        for (i, (name, text)) in members.chain(append).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(serde_json::to_string(name).ok()?.as_bytes());
            out.push(b':');
            out.extend_from_slice(text.as_bytes());
        }
        out.push(b'}');
        Some(out.into())
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}
