//! What the gateway refuses at its edge, before anything is forwarded: a
//! `Host` it does not answer to (421), a browser `Origin` it does not allow
//! (403), a path that could leave the provider's base path, and a model name
//! with control characters (400). Refusals never echo what was sent.
//!
//! The `Host` and `Origin` checks are the programs' shared ones
//! (`serving::edge`, also the agent service's): the `Host` check stops DNS
//! rebinding (a page on `evil.example` whose name is made to resolve to
//! 127.0.0.1) and the `Origin` check stops any other web page a browser on
//! the operator's machine visits from spending the operator's API key
//! through the gateway.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::LengthLimitError;
use percent_encoding::percent_decode;
use tower_throttle::redact::is_hidden;

use serving::edge::Refusal;
pub use serving::edge::{AllowedHost, AllowedOrigin};

use crate::config::{GatewaySettings, MAX_MODEL_LEN};
use crate::gateway::Gateway;
use crate::reply::json_error;

/// Middleware on every route: 421 for a `Host` the gateway does not answer
/// to, 403 for a foreign browser `Origin`. Requests without `Origin` (curl,
/// SDKs, same-origin page loads) are not cross-site and pass.
pub async fn guard(State(gateway): State<Gateway>, req: Request, next: Next) -> Response<Body> {
    // Only what can be forwarded under a provider's base path: no tunnels,
    // no echo of the request (with the API key) back to the caller, and no
    // `*` or absolute-form targets.
    if matches!(*req.method(), Method::CONNECT | Method::TRACE) {
        return json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "bad_method",
            "CONNECT and TRACE are not forwarded",
        );
    }
    // HTTP/2 always names the authority (`:authority`, checked as the
    // Host below); over HTTP/1 it would be an absolute-form target.
    let absolute = req.version() < http::Version::HTTP_2 && req.uri().authority().is_some();
    if !req.uri().path().starts_with('/') || absolute {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "only paths starting with `/` are forwarded",
        );
    }
    let current = gateway.current();
    let settings = &current.settings.gateway;
    let checked = serving::edge::check(
        &req,
        gateway.listen_addr(),
        &settings.allowed_hosts,
        &settings.allowed_origins,
    );
    if let Err(refusal) = checked {
        tracing::debug!("refused at the edge: {refusal}");
        let hint = match refusal {
            Refusal::UnknownHost => {
                "this gateway does not answer to that Host; add it to gateway.allowed_hosts"
            }
            Refusal::CrossSite => "requests a browser makes for another site are refused",
            Refusal::ForeignOrigin => {
                "requests from that Origin are refused; add it to gateway.allowed_origins"
            }
        };
        return json_error(refusal.status(), refusal.code(), hint);
    }
    drop(current);
    next.run(req).await
}

/// Why `path` may not be forwarded, if it may not: a segment that is `.` or
/// `..` (also percent-encoded, in any case, once or twice, or before a
/// `;parameter`), a backslash or an encoded `/` (an upstream may take either
/// for a separator), an empty segment (`//`), or percent-encoded bytes that
/// are control characters or not UTF-8. Any of these could take the request
/// outside the provider's base path on an upstream that decodes or
/// normalizes paths.
pub fn path_problem(path: &str) -> Option<&'static str> {
    if path.contains('%') {
        encoded_path_problem(path)
    } else {
        plain_path_problem(path)
    }
}

/// [`path_problem`] for a path with nothing percent-encoded, the usual
/// case: its segments read as they decode, so they are checked in place,
/// without the copies decoding makes (once per request, every request).
fn plain_path_problem(path: &str) -> Option<&'static str> {
    let mut segments = path.split('/').skip(1).peekable();
    while let Some(raw) = segments.next() {
        if raw.is_empty() && segments.peek().is_some() {
            return Some("the path has an empty segment (`//`)");
        }
        if raw.contains('\\') {
            return Some("the path has a backslash or an encoded `/`");
        }
        let name = raw.split(';').next().unwrap_or_default();
        if name == "." || name == ".." {
            return Some("the path has a `.` or `..` segment");
        }
        if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Some("the path has encoded bytes that are control characters or not UTF-8");
        }
    }
    None
}

/// [`path_problem`] for a path with percent-encoded bytes: each segment is
/// decoded once and twice, and both are checked.
fn encoded_path_problem(path: &str) -> Option<&'static str> {
    // An encoded `%` only hides what a later decoding would find.
    if path
        .as_bytes()
        .windows(3)
        .any(|w| w[0] == b'%' && w[1] == b'2' && w[2] == b'5')
    {
        return Some("the path has an encoded `%`");
    }
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, raw) in segments.iter().enumerate() {
        if raw.is_empty() && i + 1 < segments.len() {
            return Some("the path has an empty segment (`//`)");
        }
        let once: Vec<u8> = percent_decode(raw.as_bytes()).collect();
        let twice: Vec<u8> = percent_decode(&once).collect();
        for decoded in [&once, &twice] {
            if decoded.iter().any(|&b| b == b'/' || b == b'\\') {
                return Some("the path has a backslash or an encoded `/`");
            }
            let name = decoded.split(|&b| b == b';').next().unwrap_or_default();
            if name == b"." || name == b".." {
                return Some("the path has a `.` or `..` segment");
            }
        }
        if std::str::from_utf8(&once).is_err() || once.iter().any(|&b| b < 0x20 || b == 0x7f) {
            return Some("the path has encoded bytes that are control characters or not UTF-8");
        }
    }
    None
}

/// Why a model name is refused before routing, if it is: empty, longer
/// than [`MAX_MODEL_LEN`], or holding a control character (C0, DEL, C1),
/// a line or paragraph separator, a bidirectional or zero-width format
/// character: they could forge log lines, break metrics or hide text.
pub fn model_problem(model: &str) -> Option<&'static str> {
    if model.is_empty() || model.len() > MAX_MODEL_LEN {
        return Some("the model name is empty or too long");
    }
    model
        .chars()
        .any(is_hidden)
        .then_some("the model name has control or invisible format characters")
}

/// Whether a body read failed on its length limit.
pub fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The message of a 413, gateway's or simulator's.
pub fn too_large_message(max: usize) -> String {
    format!("the request body is larger than max_body_bytes ({max})")
}

/// Why a request body in this encoding is refused: a compressed body could
/// name another model than the limiter reads (the upstream may decode it).
pub fn encoding_problem(headers: &HeaderMap) -> Option<&'static str> {
    let mut encodings = headers.get_all(header::CONTENT_ENCODING).iter();
    encodings
        .any(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"))
        .then_some(
            "request bodies are forwarded as they are read: send them without Content-Encoding",
        )
}

/// Read a request body whole: at most `max_body` bytes, within
/// `body_read_timeout` (408 beyond: a body that trickles in must not hold a
/// connection for good), and given up at once when the gateway shuts down (a
/// request that never arrived whole is not one to wait for).
pub async fn read_body(
    gateway: &Gateway,
    body: Body,
    settings: &GatewaySettings,
) -> Result<Bytes, Response<Body>> {
    let max = settings.max_body;
    let mut stop = gateway.shutdown_signal();
    let read = tokio::time::timeout(settings.body_read_timeout, axum::body::to_bytes(body, max));
    tokio::select! {
        read = read => match read {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) if is_length_limit(&e) => Err(json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                &too_large_message(max),
            )),
            Ok(Err(_)) => Err(json_error(
                StatusCode::BAD_REQUEST,
                "bad_body",
                "the request body could not be read",
            )),
            Err(_) => Err(json_error(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the request body did not arrive within gateway.body_read_timeout",
            )),
        },
        _ = stop.wait_for(|stopping| *stopping) => Err(json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the gateway is shutting down",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path of up to six characters after its `/`, from an alphabet
    /// of what the checks look for, without `%`: read in place, it gets
    /// the answer the decoding reader gives.
    #[test]
    fn a_path_with_nothing_encoded_is_judged_as_decoding_would() {
        const ALPHABET: [&str; 7] = ["a", ".", "/", "\\", ";", "\u{1}", "é"];
        let mut paths = vec![String::from("/")];
        let mut last = paths.clone();
        for _ in 0..6 {
            last = last
                .iter()
                .flat_map(|p| ALPHABET.iter().map(move |c| format!("{p}{c}")))
                .collect();
            paths.extend(last.iter().cloned());
        }
        assert!(paths.len() > 100_000);
        for path in &paths {
            assert_eq!(
                plain_path_problem(path),
                encoded_path_problem(path),
                "{path:?}"
            );
        }
    }

    #[test]
    fn dot_segments_backslashes_and_encoded_slashes_are_found_in_every_spelling() {
        for bad in [
            "/echo/../secret.txt",
            "/echo/./x",
            "/echo/%2e%2E/secret.txt",
            "/echo/.%2e/x",
            "/echo/%2E./x",
            "/echo/%252e%252e/x",
            "/echo/..;/x",
            "/echo/..%5csecret.txt",
            "/echo/a\\b",
            "/echo/a%2Fb",
            "/echo//x",
            "/echo/%00",
            "/echo/%c0%ae%c0%ae",
            "/..",
        ] {
            assert!(path_problem(bad).is_some(), "{bad}");
        }
        for ok in [
            "/",
            "/v1/chat/completions",
            "/v1/models/",
            "/echo/a.b/..x/...",
            "/echo/%41",
        ] {
            assert!(path_problem(ok).is_none(), "{ok}");
        }
    }

    #[test]
    fn models_with_control_or_format_characters_are_refused() {
        for bad in [
            "",
            "x\n2026 ERROR",
            "a\u{1b}[2J",
            "a\u{7f}",
            "a\u{85}",
            "a\u{202e}b",
            "a\u{2028}",
        ] {
            assert!(model_problem(bad).is_some(), "{bad:?}");
        }
        assert!(model_problem("sim-large").is_none());
        assert!(model_problem("模型-7b:q4").is_none());
    }
}
