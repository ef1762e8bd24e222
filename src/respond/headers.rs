use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::rejection::ceil_secs;
use crate::rate_limit::{Annotate, Quota, RateLimitInfo};

/// Which rate-limit headers a response carries.
///
/// - The IETF httpapi fields (`draft-ietf-httpapi-ratelimit-headers`), in
///   structured-field syntax: `RateLimit-Policy: "(default)";q=60;w=60`
///   (quota and window in seconds) and `RateLimit: "(default)";r=12;t=5`
///   (remaining, and seconds until the quota is whole again).
/// - The widespread `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
///   `X-RateLimit-Reset` (seconds from now).
///
/// Policy names are rule names, with anything outside printable ASCII
/// replaced by `_`; keys no rule matches are under
/// [`DEFAULT_POLICY`](crate::rate_limit::DEFAULT_POLICY), `"(default)"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitHeaders {
    ietf: bool,
    legacy: bool,
}

impl Default for RateLimitHeaders {
    fn default() -> Self {
        Self::ietf()
    }
}

impl RateLimitHeaders {
    /// The IETF fields only (the default).
    pub fn ietf() -> Self {
        Self {
            ietf: true,
            legacy: false,
        }
    }

    /// The `X-RateLimit-*` fields only.
    pub fn legacy() -> Self {
        Self {
            ietf: false,
            legacy: true,
        }
    }

    /// Both kinds.
    pub fn both() -> Self {
        Self {
            ietf: true,
            legacy: true,
        }
    }

    /// No rate-limit fields (`Retry-After` is still sent on refusals).
    pub fn none() -> Self {
        Self {
            ietf: false,
            legacy: false,
        }
    }

    /// Write the fields for `quota` under `policy`, with `remaining` units
    /// left and the quota whole again after `reset`.
    pub fn write(
        &self,
        headers: &mut HeaderMap,
        policy: &str,
        quota: Option<&Quota>,
        remaining: u32,
        reset: Duration,
    ) {
        let Some(quota) = quota else { return };
        let reset = ceil_secs(reset);
        if self.ietf {
            let name = sf_string(policy);
            let window = ceil_secs(quota.period());
            insert(
                headers,
                "ratelimit-policy",
                format!("{name};q={};w={window}", quota.limit()),
            );
            insert(
                headers,
                "ratelimit",
                format!("{name};r={remaining};t={reset}"),
            );
        }
        if self.legacy {
            insert(headers, "x-ratelimit-limit", quota.limit().to_string());
            insert(headers, "x-ratelimit-remaining", remaining.to_string());
            insert(headers, "x-ratelimit-reset", reset.to_string());
        }
    }
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: String) {
    // The values are digits, ASCII names and separators: always valid.
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// A structured-field string: quoted, with `"` and `\` escaped and anything
/// outside printable ASCII replaced.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                let _ = write!(out, "\\{c}");
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

impl<B> Annotate<http::Response<B>> for RateLimitHeaders {
    fn annotate(&self, response: &mut http::Response<B>, info: &RateLimitInfo) {
        self.write(
            response.headers_mut(),
            &info.policy,
            info.quota.as_ref(),
            info.remaining,
            info.reset,
        );
    }
}
