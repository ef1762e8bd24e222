//! The client's IP address, for servers.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::part::push_display;
use super::{KeyBuilder, KeyExtractor};
use crate::error::{KeyError, MissingKey};
use crate::parts::RequestParts;

/// The address of the client that sent the request.
///
/// By default this is the peer address of the connection, found in the
/// request's extensions as axum's `ConnectInfo<SocketAddr>` (feature `axum`;
/// serve with `into_make_service_with_connect_info::<SocketAddr>()`) or as a
/// plain `SocketAddr`/`IpAddr` put there by an earlier layer. Headers that a
/// client can write itself are never trusted unless
/// [`trust_proxies`](Self::trust_proxies) says how many proxies in front of
/// the server add to one of them ([`ProxyHeader`]: `X-Forwarded-For` unless
/// [`via`](Self::via) names another): then the address those proxies saw is
/// used, entries a client put before them are ignored, and the other headers
/// are never read (a client could add them).
///
/// IPv6 addresses are keyed by their first 64 bits (one subnet, what one
/// client usually holds, so rotating addresses within it gains nothing; see
/// [`ipv6_prefix`](Self::ipv6_prefix)), and IPv4-mapped IPv6 addresses as the
/// IPv4 address they carry.
///
/// An address identifies a person: errors, stats names and logs show its
/// [fingerprint](crate::redact::Fingerprint), unless
/// [`show_raw`](Self::show_raw) says otherwise.
///
/// ```
/// use tower_throttle::key::{ClientIpKey, key_text};
///
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "203.0.113.9, 198.51.100.7")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("10.0.0.2:5555".parse::<std::net::SocketAddr>().unwrap());
/// // The default trusts no header: the peer (the proxy) is the client.
/// assert_eq!(key_text(&ClientIpKey::new(), &req).unwrap(), "10.0.0.2");
/// // Behind one proxy, the address it saw is the last one it appended.
/// assert_eq!(key_text(&ClientIpKey::new().trust_proxies(1), &req).unwrap(), "198.51.100.7");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ClientIpKey {
    trusted_proxies: usize,
    header: ProxyHeader,
    ipv6_prefix: u8,
    show_raw: bool,
}

/// The header trusted proxies write the client's address to (see
/// [`ClientIpKey::via`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For`: each proxy appends the address it saw.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239): each proxy appends a `for=` element.
    Forwarded,
    /// `X-Real-IP`: the one proxy in front sets it to the address it saw
    /// (with [`trust_proxies(1)`](ClientIpKey::trust_proxies) only).
    XRealIp,
}

impl Default for ClientIpKey {
    fn default() -> Self {
        Self {
            trusted_proxies: 0,
            header: ProxyHeader::XForwardedFor,
            ipv6_prefix: 64,
            show_raw: false,
        }
    }
}

impl ClientIpKey {
    /// The connection's peer address; no header is trusted.
    pub fn new() -> Self {
        Self::default()
    }

    /// `n` proxies you run stand in front of the server and each appends the
    /// address it saw to the [`via`](Self::via) header (`X-Forwarded-For` by
    /// default). The client is then the `n`-th address from the right. A
    /// request whose list is shorter (a hop that did not append) is keyed by
    /// its peer address.
    pub fn trust_proxies(mut self, n: usize) -> Self {
        self.trusted_proxies = n;
        self
    }

    /// The header the trusted proxies write; only that one is read.
    pub fn via(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Key IPv6 addresses by their first `bits` bits (clamped to 128;
    /// default 64, one subnet). 128 keys each address apart.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Show the address as it is in errors, stats names and logs, not as
    /// its fingerprint.
    pub fn show_raw(mut self) -> Self {
        self.show_raw = true;
        self
    }

    fn peer<R: RequestParts>(req: &R) -> Option<IpAddr> {
        let ext = req.extensions()?;
        #[cfg(feature = "axum")]
        if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(info.0.ip());
        }
        ext.get::<SocketAddr>()
            .map(SocketAddr::ip)
            .or_else(|| ext.get::<IpAddr>().copied())
    }

    /// The address the outermost trusted proxy saw, from the one header
    /// they write.
    fn forwarded<R: RequestParts>(&self, req: &R) -> Option<IpAddr> {
        let n = self.trusted_proxies;
        let headers = req.headers();
        let lines = |name| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
        };
        let list: Vec<&str> = match self.header {
            ProxyHeader::XForwardedFor => lines(X_FORWARDED_FOR).map(str::trim).collect(),
            ProxyHeader::Forwarded => lines("forwarded").filter_map(forwarded_for).collect(),
            ProxyHeader::XRealIp => {
                // Set, not appended, by the one proxy: more than one value
                // is a client's.
                let mut values = headers.get_all(X_REAL_IP).iter();
                let (Some(value), None) = (values.next(), values.next()) else {
                    return None;
                };
                return (n == 1).then(|| parse_ip(value.to_str().ok()?.trim()))?;
            }
        };
        // Our n proxies appended the last n entries; the n-th from the
        // right is what the outermost of them saw. A shorter list means a
        // hop did not append: trust nothing from it.
        let i = list.len().checked_sub(n)?;
        parse_ip(list[i])
    }

    /// The part of `ip` a client is keyed by.
    fn keyed(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let bits = u32::from(self.ipv6_prefix);
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
            v4 => v4,
        }
    }
}

const X_FORWARDED_FOR: &str = "x-forwarded-for";
const X_REAL_IP: &str = "x-real-ip";

/// The `for=` value of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim().trim_matches('"'))
    })
}

/// An address as proxies write it: bare, `[v6]`, `[v6]:port` or `v4:port`.
fn parse_ip(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    text.strip_prefix('[')?
        .split(']')
        .next()?
        .parse::<IpAddr>()
        .ok()
}

impl<R: RequestParts> KeyExtractor<R> for ClientIpKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let ip = if self.trusted_proxies > 0 {
            self.forwarded(req).or_else(|| Self::peer(req))
        } else {
            Self::peer(req)
        };
        match ip {
            Some(ip) => {
                push_display(&self.keyed(ip), key, !self.show_raw);
                Ok(())
            }
            None => Err(MissingKey::new("the client address")
                .with_hint(self.hint())
                .into()),
        }
    }
}

impl ClientIpKey {
    /// What to change so the address can be found: the usual cause is the
    /// build (the `axum` feature off) or the way the server is started, not
    /// the request.
    fn hint(&self) -> String {
        // Without the feature this crate cannot see axum's `ConnectInfo`,
        // even when the server puts it in every request.
        #[cfg(not(feature = "axum"))]
        const SERVE: &str = "enable tower-throttle's `axum` feature so `ClientIpKey` reads \
            axum's `ConnectInfo<SocketAddr>`, and serve with \
            `into_make_service_with_connect_info::<SocketAddr>()` (or insert a \
            `SocketAddr` request extension in a layer before)";
        #[cfg(feature = "axum")]
        const SERVE: &str = "the request has no `ConnectInfo<SocketAddr>` extension: serve \
            with `into_make_service_with_connect_info::<SocketAddr>()` (or insert a \
            `SocketAddr` request extension in a layer before)";
        if self.trusted_proxies > 0 {
            format!(
                "no trusted `X-Forwarded-For`, `Forwarded` or `X-Real-IP` entry and no \
                 peer address; for the peer address, {SERVE}"
            )
        } else {
            SERVE.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::key_text;

    fn refusal(key: &ClientIpKey) -> String {
        let req = http::Request::new(());
        match key_text(key, &req) {
            Err(e) => e.to_string(),
            Ok(text) => panic!("a key without an address: {text}"),
        }
    }

    // Run by `cargo test --lib` without features: the message must send the
    // user to the feature, not only to the way the server is started.
    #[cfg(not(feature = "axum"))]
    #[test]
    fn without_the_axum_feature_a_missing_address_names_the_feature() {
        for key in [ClientIpKey::new(), ClientIpKey::new().trust_proxies(1)] {
            let text = refusal(&key);
            assert!(text.contains("`axum` feature"), "{text}");
            assert!(
                text.contains("into_make_service_with_connect_info"),
                "{text}"
            );
        }
    }

    #[cfg(feature = "axum")]
    #[test]
    fn with_the_axum_feature_a_missing_address_names_the_extension() {
        let text = refusal(&ClientIpKey::new());
        assert!(text.contains("no `ConnectInfo<SocketAddr>`"), "{text}");
        assert!(
            text.contains("into_make_service_with_connect_info"),
            "{text}"
        );
        assert!(!text.contains("feature"), "{text}");
        let text = refusal(&ClientIpKey::new().trust_proxies(1));
        assert!(text.contains("X-Forwarded-For"), "{text}");
        assert!(text.contains("no `ConnectInfo<SocketAddr>`"), "{text}");
    }
}
