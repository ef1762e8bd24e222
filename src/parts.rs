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
/// kept; a byte scan, as this runs per request for host keys and rules
/// (`http::uri::Authority::host` splits strings and costs several times
/// more).
fn host_of(authority: &str) -> &str {
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
