//! What the gateway refuses at its edge, before anything is forwarded: a
//! `Host` it does not answer to (421), a browser `Origin` it does not allow
//! (403), a path that could leave the provider's base path, and a model name
//! with control characters (400). Refusals never echo what was sent.
//!
//! The `Host` check stops DNS rebinding (a page on `evil.example` whose name
//! is made to resolve to 127.0.0.1) and the `Origin` check stops any other
//! web page a browser on the operator's machine visits from spending the
//! operator's API key through the gateway.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http::uri::{Authority, Scheme, Uri};
use http_body_util::LengthLimitError;
use percent_encoding::percent_decode;
use tower_throttle::redact::is_hidden;

use crate::config::{GatewaySettings, MAX_MODEL_LEN};
use crate::gateway::{Gateway, json_error};

/// A `Host` the operator allows besides the listen address's: a name or
/// address, on one port or on any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    /// Lower case; an IPv6 address in brackets.
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

impl AllowedHost {
    /// `name`, `name:port`, `1.2.3.4:port` or `[::1]:port`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let authority = authority(text.trim()).ok_or_else(|| {
            format!("`{text}` is not a host; write e.g. \"gateway.example\" or \"10.0.0.5:8080\"")
        })?;
        Ok(Self {
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }

    fn matches(&self, host: &Authority) -> bool {
        host.host().eq_ignore_ascii_case(&self.host)
            && self.port.is_none_or(|p| p == host.port_u16().unwrap_or(80))
    }
}

/// A browser origin: scheme, host and port (the scheme's default if none is
/// written), as the `Origin` header sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedOrigin {
    https: bool,
    /// Lower case; an IPv6 address in brackets.
    host: String,
    port: u16,
}

impl AllowedOrigin {
    /// `http://host[:port]` or `https://host[:port]`, without a path.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!("`{text}` is not an origin; write e.g. \"https://dashboard.example\" (no path)")
        };
        let uri: Uri = text.trim().parse().map_err(|_| bad())?;
        let https = match uri.scheme() {
            Some(s) if *s == Scheme::HTTP => false,
            Some(s) if *s == Scheme::HTTPS => true,
            _ => return Err(bad()),
        };
        let authority = uri.authority().ok_or_else(bad)?;
        let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
        if !path_ok || authority.as_str().contains('@') {
            return Err(bad());
        }
        Ok(Self {
            https,
            host: authority.host().to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        })
    }

    /// Whether this is the origin of a page served under `host`: same name,
    /// same port (a `Host` without a port has this scheme's default).
    fn is_served_by(&self, host: &Authority) -> bool {
        let default = if self.https { 443 } else { 80 };
        host.host().eq_ignore_ascii_case(&self.host)
            && host.port_u16().unwrap_or(default) == self.port
    }
}

/// A host (a DNS name, an IPv4 address, or an IPv6 address in brackets) and
/// an optional port: no user info, no wildcard.
fn authority(text: &str) -> Option<Authority> {
    let authority = Authority::try_from(text).ok()?;
    let host = authority.host();
    let name = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    let v6 = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
    // `http` takes `host:junk` for a host without a port.
    let port_ok = authority.as_str().len() == host.len() || authority.port_u16().is_some();
    (!authority.as_str().contains('@') && (name || v6) && port_ok).then_some(authority)
}

/// The host a request is for: the request target's authority (HTTP/2, or an
/// absolute URI) or its one `Host` header; when both are given they must
/// agree. `None` when there is none, or more than one.
fn request_host(req: &Request) -> Option<Authority> {
    let mut headers = req.headers().get_all(header::HOST).iter();
    let header = headers.next();
    if headers.next().is_some() {
        return None;
    }
    let header = match header {
        Some(value) => Some(authority(value.to_str().ok()?)?),
        None => None,
    };
    match (req.uri().authority(), header) {
        (Some(target), Some(header)) => target
            .as_str()
            .eq_ignore_ascii_case(header.as_str())
            .then_some(header),
        (Some(target), None) => authority(target.as_str()),
        (None, header) => header,
    }
}

/// Whether the gateway answers to `host`: an `allowed_hosts` entry, or a
/// name of the address it listens on, with its port. On a loopback address
/// that is `localhost` or a loopback address; on `0.0.0.0` or `[::]`,
/// `localhost` or any IP address (an address, unlike a name, cannot be
/// rebound to another server); else that address.
fn host_allowed(host: &Authority, listen: Option<SocketAddr>, allowed: &[AllowedHost]) -> bool {
    if allowed.iter().any(|a| a.matches(host)) {
        return true;
    }
    let Some(listen) = listen else {
        return false;
    };
    if host.port_u16().unwrap_or(80) != listen.port() {
        return false;
    }
    let name = host.host();
    let ip = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let localhost = name.eq_ignore_ascii_case("localhost");
    if listen.ip().is_unspecified() {
        localhost || ip.is_some()
    } else if listen.ip().is_loopback() {
        localhost || ip.is_some_and(|ip| ip.is_loopback())
    } else {
        ip == Some(listen.ip())
    }
}

/// Whether a request with this `Origin` may go on: the gateway's own origin
/// (that of a page served under the request's `host`, such as the live
/// page), or an `allowed_origins` entry. `null` and anything unparsable are
/// foreign.
fn origin_allowed(origin: &HeaderValue, host: &Authority, allowed: &[AllowedOrigin]) -> bool {
    let Some(origin) = origin
        .to_str()
        .ok()
        .and_then(|o| AllowedOrigin::parse(o).ok())
    else {
        return false;
    };
    origin.is_served_by(host) || allowed.contains(&origin)
}

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
    if !req.uri().path().starts_with('/') || req.uri().authority().is_some() {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "only paths starting with `/` are forwarded",
        );
    }
    let current = gateway.current();
    let settings = &current.settings.gateway;
    let host = request_host(&req)
        .filter(|host| host_allowed(host, gateway.listen_addr(), &settings.allowed_hosts));
    let Some(host) = host else {
        tracing::debug!("refused a request for a host this gateway does not answer to");
        return json_error(
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            "this gateway does not answer to that Host; add it to gateway.allowed_hosts",
        );
    };
    // A request a browser made for another site's page: a no-cors GET (an
    // `<img>`) carries no `Origin`, but browsers mark where it came from.
    if let Some(site) = req.headers().get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            tracing::debug!("refused a request a browser made for another site");
            return json_error(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "requests a browser makes for another site are refused",
            );
        }
    }
    let mut origins = req.headers().get_all(header::ORIGIN).iter();
    if let Some(origin) = origins.next() {
        let one = origins.next().is_none();
        if !one || !origin_allowed(origin, &host, &settings.allowed_origins) {
            tracing::debug!("refused a request from a foreign origin");
            return json_error(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "requests from that Origin are refused; add it to gateway.allowed_origins",
            );
        }
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

    fn host(text: &str) -> Authority {
        authority(text).unwrap()
    }

    #[test]
    fn the_listen_address_answers_to_its_own_names_only() {
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(host_allowed(&host(ok), Some(loopback), &[]), "{ok}");
        }
        for bad in [
            "127.0.0.1:8081",
            "evil.example:8080",
            "localhost",
            "10.0.0.1:8080",
        ] {
            assert!(!host_allowed(&host(bad), Some(loopback), &[]), "{bad}");
        }
        let any: SocketAddr = "0.0.0.0:80".parse().unwrap();
        assert!(host_allowed(&host("192.168.1.5"), Some(any), &[]));
        assert!(!host_allowed(&host("evil.example"), Some(any), &[]));
        for bad in [
            "",
            "*",
            "a b",
            "http://x/",
            "user@host",
            "host:port",
            "[::1",
        ] {
            assert!(AllowedHost::parse(bad).is_err(), "{bad}");
        }
        let allowed = [AllowedHost::parse("Gateway.Example").unwrap()];
        assert!(host_allowed(
            &host("gateway.example:9999"),
            Some(any),
            &allowed
        ));
        assert!(!host_allowed(&host("gateway.example"), None, &[]));
    }

    #[test]
    fn a_page_served_under_the_host_is_the_gateways_own_origin() {
        let own = |origin: &str, h: &str| {
            origin_allowed(&HeaderValue::from_str(origin).unwrap(), &host(h), &[])
        };
        assert!(own("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(own("http://localhost", "localhost"));
        assert!(own("https://gw.example", "gw.example"));
        assert!(!own("http://localhost:3000", "localhost:8080"));
        assert!(!own("null", "localhost:8080"));
        assert!(!own("http://127.0.0.1:8080/page", "127.0.0.1:8080"));
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
