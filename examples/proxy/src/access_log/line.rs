//! One request's line, in JSON or logfmt.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tower_throttle::backoff::Announcement;

/// How each line is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    #[default]
    Json,
    /// `key=value` pairs, values quoted where they need it.
    Logfmt,
}

/// What the log says of one request. Holds no header value but the
/// upstream's stated limits, no query string, no body: nothing a client
/// sends as a secret.
#[derive(Debug, Serialize)]
pub struct Entry {
    /// When the request arrived, RFC 3339 in UTC.
    pub time: String,
    /// The `[[clients]]` entry that sent it, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// `provider/model`, once the gateway knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The request method.
    pub method: String,
    /// The path, without its query; cut at [`MAX_PATH`] bytes.
    pub path: String,
    /// The status sent.
    pub status: u16,
    /// `forwarded` (the upstream answered), `refused` (a limit refused),
    /// `error` (the gateway answered with an error of its own), `local`
    /// (an endpoint of the gateway's: the stats, the page) or `cancelled`
    /// (dropped before its answer: the client left; status 499).
    pub outcome: &'static str,
    /// What refused or failed: `rate_limited`, `queue_full`,
    /// `cooling_down`, `bad_path`, `upstream_timeout`, …
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    /// The limit (rule) that refused, when it has a name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// From arrival to the end of the answer's body, in milliseconds.
    pub latency_ms: f64,
    /// How long the layers held a forwarded request before it was sent
    /// (a rate limit's or a cooldown's wait, a concurrency queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<f64>,
    /// Request body bytes received.
    pub request_bytes: u64,
    /// Response body bytes sent.
    pub response_bytes: u64,
    /// False when the client went away before the answer's end.
    pub complete: bool,
    /// What the upstream's answer said of its request limit and what is
    /// left of it, and the same of its token limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_requests_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub upstream_requests_remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub upstream_tokens_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub upstream_tokens_remaining: Option<u64>,
}

impl Entry {
    /// A request dropped before its answer (499, as nginx logs a client
    /// that closed its connection first), and the start of every entry:
    /// the rest is filled in by the caller.
    pub fn cancelled() -> Self {
        Self {
            time: String::new(),
            client: None,
            route: None,
            method: String::new(),
            path: String::new(),
            status: 499,
            outcome: "cancelled",
            code: None,
            limit: None,
            latency_ms: 0.0,
            waited_ms: None,
            request_bytes: 0,
            response_bytes: 0,
            complete: false,
            upstream_requests_limit: None,
            upstream_requests_remaining: None,
            upstream_tokens_limit: None,
            upstream_tokens_remaining: None,
        }
    }
}

/// Longest path written, in bytes.
pub const MAX_PATH: usize = 256;

/// `path` cut to [`MAX_PATH`] bytes, on a character boundary.
pub fn cut_path(path: &str) -> String {
    let mut end = path.len().min(MAX_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path[..end].to_owned()
}

/// `time` in RFC 3339, to the millisecond.
pub fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Milliseconds, to the hundredth.
pub fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

impl Entry {
    /// The upstream's stated limits, from `said`.
    pub fn set_upstream(&mut self, said: &Announcement) {
        self.upstream_requests_limit = said.requests.limit;
        self.upstream_requests_remaining = said.requests.remaining;
        self.upstream_tokens_limit = said.tokens.limit;
        self.upstream_tokens_remaining = said.tokens.remaining;
    }

    /// The line, newline included.
    pub fn line(&self, format: Format) -> String {
        match format {
            Format::Json => {
                let mut line = serde_json::to_string(self).unwrap_or_default();
                line.push('\n');
                line
            }
            Format::Logfmt => self.logfmt(),
        }
    }

    fn logfmt(&self) -> String {
        let mut out = String::with_capacity(256);
        let mut pair = |key: &str, value: &str| {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(key);
            out.push('=');
            quote_logfmt(&mut out, value);
        };
        pair("time", &self.time);
        if let Some(client) = &self.client {
            pair("client", client);
        }
        if let Some(route) = &self.route {
            pair("route", route);
        }
        pair("method", &self.method);
        pair("path", &self.path);
        pair("status", &self.status.to_string());
        pair("outcome", self.outcome);
        if let Some(code) = self.code {
            pair("code", code);
        }
        if let Some(limit) = &self.limit {
            pair("limit", limit);
        }
        pair("latency_ms", &self.latency_ms.to_string());
        if let Some(waited) = self.waited_ms {
            pair("waited_ms", &waited.to_string());
        }
        pair("request_bytes", &self.request_bytes.to_string());
        pair("response_bytes", &self.response_bytes.to_string());
        pair("complete", if self.complete { "true" } else { "false" });
        let upstream = [
            ("upstream_requests_limit", self.upstream_requests_limit),
            (
                "upstream_requests_remaining",
                self.upstream_requests_remaining,
            ),
            ("upstream_tokens_limit", self.upstream_tokens_limit),
            ("upstream_tokens_remaining", self.upstream_tokens_remaining),
        ];
        for (key, value) in upstream {
            if let Some(n) = value {
                pair(key, &n.to_string());
            }
        }
        out.push('\n');
        out
    }
}

/// `value` as logfmt writes it: bare when it is plain, else in double
/// quotes with `"`, `\` and control characters escaped, so that no value
/// can end its line or forge another key. (logfmt has no crate kept well
/// enough to lean on; this is its whole quoting rule.)
fn quote_logfmt(out: &mut String, value: &str) {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
    if plain {
        out.push_str(value);
        return;
    }
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            time: timestamp(SystemTime::UNIX_EPOCH),
            client: None,
            route: Some("openai/gpt 4\"o".into()),
            method: "POST".into(),
            path: "/openai/v1/chat\ncompletions x=1".into(),
            status: 429,
            outcome: "refused",
            code: Some("rate_limited"),
            limit: None,
            latency_ms: 1.25,
            waited_ms: None,
            request_bytes: 10,
            response_bytes: 0,
            complete: true,
            upstream_requests_limit: Some(500),
            upstream_requests_remaining: None,
            upstream_tokens_limit: None,
            upstream_tokens_remaining: None,
        }
    }

    #[test]
    fn logfmt_quotes_what_could_forge_a_key_or_a_line() {
        let line = entry().line(Format::Logfmt);
        assert_eq!(
            line,
            "time=1970-01-01T00:00:00.000Z route=\"openai/gpt 4\\\"o\" method=POST \
             path=\"/openai/v1/chat\\ncompletions x=1\" status=429 outcome=refused \
             code=rate_limited latency_ms=1.25 request_bytes=10 response_bytes=0 \
             complete=true upstream_requests_limit=500\n"
        );
    }

    #[test]
    fn json_is_one_line_without_the_fields_not_known() {
        let line = entry().line(Format::Json);
        assert_eq!(line.matches('\n').count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["path"], "/openai/v1/chat\ncompletions x=1");
        assert_eq!(v["upstream_requests_limit"], 500);
        assert!(v.get("limit").is_none() && v.get("waited_ms").is_none());
    }

    #[test]
    fn a_long_path_is_cut_on_a_character_boundary() {
        let path = format!("/{}", "é".repeat(200));
        let cut = cut_path(&path);
        assert!(cut.len() <= MAX_PATH && path.starts_with(&cut));
    }
}
