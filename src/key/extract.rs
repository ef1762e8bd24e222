//! The built-in key extractors.

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{KeyBuilder, KeyExtractor, KeyPart};
use crate::error::{ConfigError, MissingKey};
use crate::parts::{BodyBytes, RequestParts};

/// One key for every request: a limit on the whole service.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl<R> KeyExtractor<R> for GlobalKey {
    #[inline]
    fn extract(&self, _req: &R, _key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
        Ok(())
    }
}

/// The value of one request header (the first, if it repeats), e.g. an API key
/// or a tenant id.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Key by the header `name`; an invalid header name is an error.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        HeaderName::try_from(name)
            .map(|name| Self { name })
            .map_err(|_| ConfigError::new("header", format!("`{name}` is not a valid header name")))
    }

    /// Key by an already valid header name.
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }
}

impl<R: RequestParts> KeyExtractor<R> for HeaderKey {
    #[inline]
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
        match req.headers().get(&self.name) {
            Some(value) => {
                key.push_bytes(value.as_bytes());
                Ok(())
            }
            None => Err(MissingKey::new(format!("header `{}`", self.name))),
        }
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
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
        match req.extensions().and_then(|ext| ext.get::<T>()) {
            Some(value) => {
                key.push(value);
                Ok(())
            }
            None => Err(MissingKey::new(format!(
                "extension `{}`",
                std::any::type_name::<T>()
            ))),
        }
    }
}

/// The host the request is for, lower-cased.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostKey;

impl<R: RequestParts> KeyExtractor<R> for HostKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
        match req.host() {
            Some(host) if host.bytes().any(|b| b.is_ascii_uppercase()) => {
                key.push_str(&host.to_ascii_lowercase());
                Ok(())
            }
            Some(host) => {
                key.push_str(host);
                Ok(())
            }
            None => Err(MissingKey::new("host")),
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
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
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

/// A top-level field of a JSON request body, such as `"model"` of an LLM
/// request. Strings key by their value, numbers and booleans by their text;
/// a body that is absent, not in memory, not JSON, or without the field (or
/// with `null`, an object or an array there) has no key.
///
/// Works for request types whose body bytes can be read without consuming the
/// body (see [`BodyBytes`]). Only the top-level object is walked; other fields
/// are skipped without being built.
#[derive(Clone, Debug)]
pub struct JsonFieldKey {
    field: String,
}

impl JsonFieldKey {
    /// Key by the top-level field `field`.
    pub fn new(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
        }
    }
}

impl<R: BodyBytes> KeyExtractor<R> for JsonFieldKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), MissingKey> {
        let missing = || MissingKey::new(format!("JSON body field `{}`", self.field));
        let body = req.body_bytes().ok_or_else(missing)?;
        let mut de = serde_json::Deserializer::from_slice(body);
        let found = FindField {
            field: &self.field,
            key,
        }
        .deserialize(&mut de)
        .map_err(|_| missing())?;
        if found { Ok(()) } else { Err(missing()) }
    }
}

/// Walks a JSON object, pushing the named field's value into the key.
struct FindField<'f, 'k, 'b> {
    field: &'f str,
    key: &'k mut KeyBuilder<'b>,
}

impl<'de> DeserializeSeed<'de> for FindField<'_, '_, '_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FindField<'_, '_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !found && name == self.field {
                found = map.next_value_seed(Scalar { key: self.key })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Pushes a JSON scalar into the key; reports whether it was a scalar.
struct Scalar<'k, 'b> {
    key: &'k mut KeyBuilder<'b>,
}

impl<'de> DeserializeSeed<'de> for Scalar<'_, '_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scalar<'_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.key.push_str(v);
        Ok(true)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        self.key.push(&v);
        Ok(true)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.key.push(&v);
        Ok(true)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.key.push(&v);
        Ok(true)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        self.key.push_str(&v.to_string());
        Ok(true)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}
