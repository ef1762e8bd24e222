//! The built-in key extractors.

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;

use super::{KeyBuilder, KeyExtractor, KeyPart};
use crate::error::{Ambiguity, AmbiguousKey, ConfigError, KeyError, MissingKey};
use crate::parts::RequestParts;
use crate::redact::is_secret_name;

/// One key for every request: a limit on the whole service.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl<R> KeyExtractor<R> for GlobalKey {
    #[inline]
    fn extract(&self, _req: &R, _key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        Ok(())
    }
}

/// The value of one request header, e.g. an API key or a tenant id. A
/// request without it has no key ([`MissingKey`]); one that gives it more
/// than once is refused ([`AmbiguousKey`]), since servers differ on which of
/// the values they act on.
///
/// The value of a header whose name says it is a secret (`Authorization`,
/// `Cookie`, names containing `key`, `token`, `secret`, `password` or
/// `credential`: see [`is_secret_name`]) is a secret part: errors, stats
/// names and logs show its [fingerprint](crate::redact::Fingerprint), never
/// the value. [`show_raw`](Self::show_raw) and [`redact`](Self::redact) say
/// otherwise for one key.
///
/// ```
/// use tower_throttle::key::{HeaderKey, key_label};
///
/// let req = http::Request::builder()
///     .header("x-api-key", "sk-live-0000")
///     .header("x-tenant", "acme")
///     .body(())
///     .unwrap();
/// let shown = key_label(&HeaderKey::new("x-api-key").unwrap(), &req).unwrap();
/// assert!(shown.starts_with('#') && !shown.contains("sk-live"));
/// assert_eq!(key_label(&HeaderKey::new("x-tenant").unwrap(), &req).unwrap(), "acme");
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    secret: bool,
}

impl HeaderKey {
    /// Key by the header `name`; an invalid header name is an error.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        HeaderName::try_from(name)
            .map(Self::from_name)
            .map_err(|_| ConfigError::new("header", format!("`{name}` is not a valid header name")))
    }

    /// Key by an already valid header name.
    pub fn from_name(name: HeaderName) -> Self {
        let secret = is_secret_name(name.as_str());
        Self { name, secret }
    }

    /// Show the value as it is in errors, stats names and logs, even though
    /// the header's name says it is a secret: for values that are not, such
    /// as a `x-model-key` naming a model.
    pub fn show_raw(mut self) -> Self {
        self.secret = false;
        self
    }

    /// Show only the value's fingerprint, whatever the header's name: for
    /// values that identify a person, such as `x-user-email`.
    pub fn redact(mut self) -> Self {
        self.secret = true;
        self
    }
}

impl<R: RequestParts> KeyExtractor<R> for HeaderKey {
    #[inline]
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let mut values = req.headers().get_all(&self.name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => {
                key.push_part(value.as_bytes(), self.secret);
                Ok(())
            }
            // Servers differ on which of several they act on (the first,
            // the last, or all joined), so the limiter cannot know which.
            (Some(_), Some(_)) => Err(self.repeated()),
            (None, _) => Err(MissingKey::new(format!("header `{}`", self.name)).into()),
        }
    }
}

impl HeaderKey {
    #[cold]
    fn repeated(&self) -> KeyError {
        AmbiguousKey::new(format!("header `{}`", self.name), Ambiguity::Repeated).into()
    }
}

/// A typed request extension, e.g. an authenticated user id put there by an
/// earlier layer, or axum's `ConnectInfo`.
pub struct ExtensionKey<T> {
    _type: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Key by the extension of type `T`.
    pub fn new() -> Self {
        Self { _type: PhantomData }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<R, T> KeyExtractor<R> for ExtensionKey<T>
where
    R: RequestParts,
    T: KeyPart + Send + Sync + 'static,
{
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        match req.extensions().and_then(|ext| ext.get::<T>()) {
            Some(value) => {
                key.push(value);
                Ok(())
            }
            None => {
                Err(MissingKey::new(format!("extension `{}`", std::any::type_name::<T>())).into())
            }
        }
    }
}

/// The host the request is for, lower-cased.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostKey;

impl<R: RequestParts> KeyExtractor<R> for HostKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        match req.host() {
            Some(host) if host.bytes().any(|b| b.is_ascii_uppercase()) => {
                key.push_str(&host.to_ascii_lowercase());
                Ok(())
            }
            Some(host) => {
                key.push_str(host);
                Ok(())
            }
            None => Err(MissingKey::new("host").into()),
        }
    }
}

/// The first segments of the path: `segments(1)` keys `/openai/v1/chat` as
/// `/openai`. A shorter path is keyed whole.
#[derive(Clone, Copy, Debug)]
pub struct PathPrefixKey {
    segments: usize,
}

impl PathPrefixKey {
    /// Key by the first `segments` path segments; 0 is an error (use
    /// [`GlobalKey`]).
    pub fn segments(segments: usize) -> Result<Self, ConfigError> {
        if segments == 0 {
            return Err(ConfigError::new(
                "segments",
                "a path prefix needs at least one segment",
            ));
        }
        Ok(Self { segments })
    }
}

impl<R: RequestParts> KeyExtractor<R> for PathPrefixKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let path = req.path();
        // Each '/' after the first starts a new segment.
        let end = path
            .char_indices()
            .filter(|&(i, c)| c == '/' && i > 0)
            .nth(self.segments - 1)
            .map_or(path.len(), |(i, _)| i);
        key.push_str(&path[..end]);
        Ok(())
    }
}
