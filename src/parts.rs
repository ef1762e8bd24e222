//! What the layers read from a request or a response, whichever HTTP library
//! built it.
//!
//! One layer serves `http::Request<B>` (hyper, axum, tonic) and, with the
//! `reqwest` feature, `reqwest::Request`, through these small traits rather
//! than a copy of each layer per library.
//!
//! ```
//! use tower_throttle::parts::RequestParts;
//!
//! let req = http::Request::builder()
//!     .uri("https://api.example.com/v1/chat?x=1")
//!     .body(())
//!     .unwrap();
//! assert_eq!(req.host(), Some("api.example.com"));
//! assert_eq!(RequestParts::path(&req), "/v1/chat");
//! ```

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, StatusCode};

/// Read access to an outgoing or incoming request.
pub trait RequestParts {
    /// The request method.
    fn method(&self) -> &Method;
    /// The request headers.
    fn headers(&self) -> &HeaderMap;
    /// The host the request is for: from the URI, else the `Host` header.
    fn host(&self) -> Option<&str>;
    /// The path, without the query string.
    fn path(&self) -> &str;
    /// The whole target URL as text, when the request knows it (a client
    /// request does; a server request usually only has the path).
    fn url(&self) -> String;
    /// Typed extensions, for request types that carry them.
    fn extensions(&self) -> Option<&Extensions>;
}

/// Read access to a request body's bytes without consuming it, for bodies
/// that are already in memory.
///
/// Implemented for `Bytes`, `String`, `Vec<u8>` and `&'static str`; streaming
/// bodies (and `http_body_util::Full`, which has no accessor for its bytes)
/// cannot be read without being consumed, so they do not implement it.
pub trait BodyBytes {
    /// The body's bytes, if they are in memory.
    fn body_bytes(&self) -> Option<&[u8]>;
}

/// Read access to a response.
pub trait ResponseParts {
    /// The status code.
    fn status(&self) -> StatusCode;
    /// The response headers.
    fn headers(&self) -> &HeaderMap;
}

impl<B> RequestParts for http::Request<B> {
    fn method(&self) -> &Method {
        self.method()
    }

    fn headers(&self) -> &HeaderMap {
        self.headers()
    }

    fn host(&self) -> Option<&str> {
        let authority = self.uri().authority().map(|a| host_of(a.as_str()));
        authority.or_else(|| {
            let host = self.headers().get(http::header::HOST)?.to_str().ok()?;
            Some(host_of(host))
        })
    }

    fn path(&self) -> &str {
        self.uri().path()
    }

    fn url(&self) -> String {
        self.uri().to_string()
    }

    fn extensions(&self) -> Option<&Extensions> {
        Some(self.extensions())
    }
}

/// The host of an authority (`user@host:port`), brackets of an IPv6 literal
/// kept. This runs per request for host keys and identity rules, so a
/// bare host (the usual authority) costs one word-at-a-time search and
/// nothing else; `rfind('@')` then `find(':')` cost about four times as
/// much, and `http::uri::Authority::host` more again.
#[inline]
fn host_of(authority: &str) -> &str {
    // An IPv6 literal ends at its bracket, whatever follows it.
    if authority.starts_with('[') || has_user_or_port(authority.as_bytes()) {
        host_with_parts(authority)
    } else {
        authority
    }
}

/// Whether `bytes` holds an `@` or a `:`, eight bytes at a time, the last
/// word overlapping the one before. Written here rather than with memchr:
/// hosts are 10 to 30 bytes, where memchr's portable search finishes byte
/// by byte and its vector search costs more to set up than this whole test.
#[inline]
fn has_user_or_port(bytes: &[u8]) -> bool {
    let Some(last) = bytes.last_chunk::<8>() else {
        return bytes.iter().any(|&b| b == b'@' || b == b':');
    };
    let mut rest = bytes;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        if word_has_user_or_port(word) {
            return true;
        }
        rest = tail;
    }
    word_has_user_or_port(last)
}

#[inline]
fn word_has_user_or_port(word: &[u8; 8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // `x` has a zero byte exactly when `(x - ONES) & !x & HIGHS` is not 0.
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let word = u64::from_ne_bytes(*word);
    zero_byte(word ^ u64::from_ne_bytes([b'@'; 8]))
        | zero_byte(word ^ u64::from_ne_bytes([b':'; 8]))
        != 0
}

/// [`host_of`] for an authority with a user, a port or a bracket: one
/// forward pass.
fn host_with_parts(authority: &str) -> &str {
    // The host starts after the last `@` and ends at the first `:` after it.
    let mut start = 0;
    let mut colon = None;
    for (i, &b) in authority.as_bytes().iter().enumerate() {
        if b == b'@' {
            start = i + 1;
            colon = None;
        } else if b == b':' && colon.is_none() {
            colon = Some(i);
        }
    }
    let host = &authority[start..];
    let end = if host.starts_with('[') {
        // An IPv6 literal holds colons: it ends at its bracket.
        host.find(']').map_or(host.len(), |i| i + 1)
    } else {
        colon.map_or(host.len(), |i| i - start)
    };
    &host[..end]
}

impl BodyBytes for Bytes {
    fn body_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl BodyBytes for String {
    fn body_bytes(&self) -> Option<&[u8]> {
        Some(self.as_bytes())
    }
}

impl BodyBytes for Vec<u8> {
    fn body_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl BodyBytes for &'static str {
    fn body_bytes(&self) -> Option<&[u8]> {
        Some(self.as_bytes())
    }
}

impl<B: BodyBytes> BodyBytes for http::Request<B> {
    fn body_bytes(&self) -> Option<&[u8]> {
        self.body().body_bytes()
    }
}

impl<B> ResponseParts for http::Response<B> {
    fn status(&self) -> StatusCode {
        self.status()
    }

    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
}

#[cfg(feature = "reqwest")]
mod reqwest_impls {
    use super::*;

    impl RequestParts for reqwest::Request {
        fn method(&self) -> &Method {
            self.method()
        }

        fn headers(&self) -> &HeaderMap {
            self.headers()
        }

        fn host(&self) -> Option<&str> {
            self.url().host_str()
        }

        fn path(&self) -> &str {
            self.url().path()
        }

        fn url(&self) -> String {
            self.url().to_string()
        }

        fn extensions(&self) -> Option<&Extensions> {
            // reqwest::Request has no public extensions.
            None
        }
    }

    impl BodyBytes for reqwest::Request {
        fn body_bytes(&self) -> Option<&[u8]> {
            self.body()?.as_bytes()
        }
    }

    impl ResponseParts for reqwest::Response {
        fn status(&self) -> StatusCode {
            self.status()
        }

        fn headers(&self) -> &HeaderMap {
            self.headers()
        }
    }
}

/// Write access to a request's headers, for layers that set headers on the
/// way out (such as [`IdentityHeaderLayer`](crate::identity::IdentityHeaderLayer)).
///
/// Implemented for `http::Request<B>` and, with the `reqwest` feature,
/// `reqwest::Request`.
///
/// ```
/// use tower_throttle::parts::RequestHeadersMut;
///
/// let mut req = http::Request::new(());
/// RequestHeadersMut::headers_mut(&mut req)
///     .insert("x-title", http::HeaderValue::from_static("demo"));
/// assert_eq!(req.headers()["x-title"], "demo");
/// ```
pub trait RequestHeadersMut {
    /// The request headers, mutably.
    fn headers_mut(&mut self) -> &mut HeaderMap;
}

impl<B> RequestHeadersMut for http::Request<B> {
    fn headers_mut(&mut self) -> &mut HeaderMap {
        self.headers_mut()
    }
}

#[cfg(feature = "reqwest")]
impl RequestHeadersMut for reqwest::Request {
    fn headers_mut(&mut self) -> &mut HeaderMap {
        self.headers_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;
    use proptest::prelude::*;

    /// `host_of` written the plain way, as the reference.
    fn reference(authority: &str) -> &str {
        let host = match authority.rfind('@') {
            Some(at) => &authority[at + 1..],
            None => authority,
        };
        let end = if host.starts_with('[') {
            host.find(']').map_or(host.len(), |i| i + 1)
        } else {
            host.find(':').unwrap_or(host.len())
        };
        &host[..end]
    }

    #[test]
    fn hosts_of_authorities() {
        for (authority, host) in [
            ("api.example.com", "api.example.com"),
            ("api.example.com:8443", "api.example.com"),
            ("user:pw@api.example.com:80", "api.example.com"),
            ("a@b@host", "host"),
            ("[::1]:8080", "[::1]"),
            ("u:p@[2001:db8::1]", "[2001:db8::1]"),
            ("[::1", "[::1"),
            ("[]é", "[]"),
            ("[v]x", "[v]"),
            ("", ""),
            (":80", ""),
            ("host@", ""),
        ] {
            assert_eq!(host_of(authority), host, "{authority:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn host_of_agrees_with_the_reference(authority in "[a-zé@:\\[\\]1.]{0,40}") {
            prop_assert_eq!(host_of(&authority), reference(&authority));
        }
    }
}
