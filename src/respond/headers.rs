//! `RateLimitHeaders`: which rate-limit headers an answer carries, and writing them.

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
        self.write_cached(headers, policy, None, quota, remaining, reset);
    }

    /// [`write`](Self::write), with the `RateLimit-Policy` value `cached`
    /// when `policy` was made (see [`policy_field`]), if there is one: it is
    /// the same on every response of the quota.
    fn write_cached(
        &self,
        headers: &mut HeaderMap,
        policy: &str,
        cached: Option<&HeaderValue>,
        quota: Option<&Quota>,
        remaining: u32,
        reset: Duration,
    ) {
        let Some(quota) = quota else { return };
        let reset = ceil_secs(reset);
        if self.ietf {
            let quoted;
            let name: &[u8] = match cached {
                Some(field) => {
                    headers.insert(RATELIMIT_POLICY, field.clone());
                    // The quoted name is the cached value's start: what
                    // precedes its `;q=N;w=M`, whose `;` are the value's
                    // last two (digits follow them; the name's own `;`, if
                    // any, come before). memrchr: a third of a scan of
                    // three-byte windows, on every response.
                    let bytes = field.as_bytes();
                    memchr::memrchr_iter(b';', bytes)
                        .nth(1)
                        .map_or(bytes, |end| &bytes[..end])
                }
                None => {
                    let mut name = Vec::with_capacity(policy.len() + 2);
                    sf_string(&mut name, policy);
                    insert(headers, RATELIMIT_POLICY, policy_value(&name, quota));
                    quoted = name;
                    &quoted
                }
            };
            // Built by hand with `itoa` rather than `format!`: these are
            // written on every admitted response, and `core::fmt` cost
            // several times what the limiter itself does. Exactly as long
            // as it needs: a `Vec` with room to spare costs `Bytes` a
            // second allocation, for its shared header.
            let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
            let (r, t) = (r.format(remaining).as_bytes(), t.format(reset).as_bytes());
            let mut state = Vec::with_capacity(name.len() + 6 + r.len() + t.len());
            state.extend_from_slice(name);
            state.extend_from_slice(b";r=");
            state.extend_from_slice(r);
            state.extend_from_slice(b";t=");
            state.extend_from_slice(t);
            insert(headers, RATELIMIT, state);
        }
        if self.legacy {
            // (http formats integers with `itoa` too.)
            let mut number = |name, n: u64| {
                headers.insert(name, HeaderValue::from(n));
            };
            number(X_RATELIMIT_LIMIT, quota.limit().into());
            number(X_RATELIMIT_REMAINING, remaining.into());
            number(X_RATELIMIT_RESET, reset);
        }
    }
}

/// The `RateLimit-Policy` value of `quota` under the policy whose quoted
/// name is `name`.
fn policy_value(name: &[u8], quota: &Quota) -> Vec<u8> {
    let mut digits = itoa::Buffer::new();
    let mut value = Vec::with_capacity(name.len() + 24);
    value.extend_from_slice(name);
    value.extend_from_slice(b";q=");
    value.extend_from_slice(digits.format(quota.limit()).as_bytes());
    value.extend_from_slice(b";w=");
    value.extend_from_slice(digits.format(ceil_secs(quota.period())).as_bytes());
    value
}

/// The `RateLimit-Policy` value of `quota` under `policy`, made once per
/// quota when a policy is built, and shared by every response (a clone is a
/// reference count).
pub(crate) fn policy_field(policy: &str, quota: &Quota) -> Option<HeaderValue> {
    let mut name = Vec::with_capacity(policy.len() + 2);
    sf_string(&mut name, policy);
    HeaderValue::from_maybe_shared(bytes::Bytes::from(policy_value(&name, quota))).ok()
}

// Constants, so that the names are checked once, when compiled, not on
// every response.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

fn insert(headers: &mut HeaderMap, name: HeaderName, value: Vec<u8>) {
    // The values are digits, ASCII names and separators: always valid.
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
        headers.insert(name, value);
    }
}

/// Append `text` as a structured-field string: quoted, with `"` and `\`
/// escaped and anything outside printable ASCII replaced.
fn sf_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push(b'\\');
                out.push(c as u8);
            }
            ' '..='~' => out.push(c as u8),
            _ => out.push(b'_'),
        }
    }
    out.push(b'"');
}

impl<B> Annotate<http::Response<B>> for RateLimitHeaders {
    fn annotate(&self, response: &mut http::Response<B>, info: &RateLimitInfo) {
        self.write_cached(
            response.headers_mut(),
            &info.policy,
            info.policy_field.as_ref(),
            info.quota.as_ref(),
            info.remaining,
            info.reset,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A response of a limiter carries the `RateLimit-Policy` value made with
    // its policy; the fields must be what `write` makes from scratch, for
    // any name (quotes, escapes, a `;q=` inside, non-ASCII).
    #[test]
    fn the_cached_policy_value_writes_what_write_does() {
        let quota = Quota::per_minute(60).expect("valid");
        for name in ["(default)", "a\"b\\c", "x;q=1", "y;q=1;w=2", "café"] {
            let headers = RateLimitHeaders::both();
            // The same inputs to both.
            let (quota, left, reset) = (Some(&quota), 7, Duration::from_millis(1500));
            let mut plain = HeaderMap::new();
            headers.write(&mut plain, name, quota, left, reset);
            let field = policy_field(name, quota.unwrap()).expect("a valid value");
            let mut cached = HeaderMap::new();
            headers.write_cached(&mut cached, name, Some(&field), quota, left, reset);
            assert_eq!(plain, cached, "{name}");
            assert_eq!(plain.len(), 5, "{name}");
        }
    }
}
