//! The edge checks every program's listener makes before a request reaches
//! its routes: a `Host` it does not answer to (421) and a request a browser
//! made for another site, by `Sec-Fetch-Site` or a foreign `Origin` (403).
//! One copy, used by the proxy gateway and the agent service.
//!
//! The `Host` check stops DNS rebinding (a page on `evil.example` whose name
//! is made to resolve to 127.0.0.1 then reads and writes through the
//! program); the `Origin` and `Sec-Fetch-Site` checks stop any other web
//! page a browser on the operator's machine visits from sending requests to
//! it (`text/plain` posts need no preflight). Requests without `Origin`
//! (curl, SDKs, same-origin page loads) are not cross-site and pass.
//!
//! ```
//! use serving::edge::{check, Refusal};
//! let listen = "127.0.0.1:8090".parse().ok();
//! let ok = http::Request::get("/").header("host", "127.0.0.1:8090").body(()).unwrap();
//! assert!(check(&ok, listen, &[], &[]).is_ok());
//! let rebound = http::Request::get("/").header("host", "evil.example:8090").body(()).unwrap();
//! assert_eq!(check(&rebound, listen, &[], &[]), Err(Refusal::UnknownHost));
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::uri::{Authority, Scheme, Uri};
use http::{HeaderValue, Request, StatusCode, header};

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
fn request_host<B>(req: &Request<B>) -> Option<Authority> {
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

/// Why a request was refused at the edge; each program words its own
/// answer (and says which setting would allow it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No single `Host` the program answers to (421).
    UnknownHost,
    /// `Sec-Fetch-Site` says a browser made it for another site (403).
    CrossSite,
    /// An `Origin` that is neither the program's own nor allowed, or more
    /// than one (403).
    ForeignOrigin,
}

impl Refusal {
    /// The status to answer with.
    pub fn status(self) -> StatusCode {
        match self {
            Self::UnknownHost => StatusCode::MISDIRECTED_REQUEST,
            Self::CrossSite | Self::ForeignOrigin => StatusCode::FORBIDDEN,
        }
    }

    /// The error code to answer with.
    pub fn code(self) -> &'static str {
        match self {
            Self::UnknownHost => "unknown_host",
            Self::CrossSite | Self::ForeignOrigin => "forbidden_origin",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownHost => "a Host this program does not answer to",
            Self::CrossSite => "a request a browser made for another site",
            Self::ForeignOrigin => "a foreign Origin",
        })
    }
}

/// Check `req` as received on `listen` (`None`: not known yet, so only
/// `allowed_hosts` answer): its `Host`, then `Sec-Fetch-Site`, then
/// `Origin`. Nothing of the request is echoed in the refusal.
pub fn check<B>(
    req: &Request<B>,
    listen: Option<SocketAddr>,
    allowed_hosts: &[AllowedHost],
    allowed_origins: &[AllowedOrigin],
) -> Result<(), Refusal> {
    let host = request_host(req)
        .filter(|host| host_allowed(host, listen, allowed_hosts))
        .ok_or(Refusal::UnknownHost)?;
    // A no-cors GET (an `<img>`) carries no `Origin`, but browsers mark
    // where it came from.
    if let Some(site) = req.headers().get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(Refusal::CrossSite);
        }
    }
    let mut origins = req.headers().get_all(header::ORIGIN).iter();
    if let Some(origin) = origins.next() {
        let one = origins.next().is_none();
        if !one || !origin_allowed(origin, &host, allowed_origins) {
            return Err(Refusal::ForeignOrigin);
        }
    }
    Ok(())
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
}
