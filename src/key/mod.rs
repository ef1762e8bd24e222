//! Keys: which bucket a request is counted in.
//!
//! A [`KeyExtractor`] reads a request and feeds the parts of its key to a
//! [`KeyBuilder`]. The builder hashes the parts as they arrive (no allocation
//! per request); the text form of a key (parts joined by `/`) is only built
//! when something needs to show it, such as an error.
//!
//! Extractors compose: a tuple of extractors is one extractor whose key has
//! every part in order, so `(HeaderKey, JsonFieldKey)` is a `(provider, model)`
//! route and `(sender, receiver)` a directed pair: A→B, A→C and B→A are three
//! keys. Each part is hashed with its length, so `("ab", "c")` and `("a", "bc")`
//! never meet. A closure `Fn(&Request) -> Option<impl KeyPart>` is an extractor
//! too.
//!
//! ```
//! use tower_throttle::key::{HeaderKey, KeyExtractor, PathPrefixKey, key_text};
//!
//! let route = (PathPrefixKey::segments(1).unwrap(), HeaderKey::new("x-model").unwrap());
//! let req = http::Request::builder()
//!     .uri("/openai/v1/chat/completions")
//!     .header("x-model", "gpt-4o")
//!     .body(())
//!     .unwrap();
//! assert_eq!(key_text(&route, &req).unwrap(), "/openai/gpt-4o");
//! ```

mod client_ip;
mod extract;
mod json;
mod part;

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::{FoldHasher, RandomState};

use crate::error::{KeyError, MissingKey};

pub use client_ip::ClientIpKey;
pub use extract::{ExtensionKey, GlobalKey, HeaderKey, HostKey, PathPrefixKey};
pub use json::JsonFieldKey;
pub use part::KeyPart;

/// Reads a request's limit key.
///
/// Implemented by the extractors in this module, by tuples of extractors, and
/// by closures `Fn(&R) -> Option<T>` where `T:` [`KeyPart`].
pub trait KeyExtractor<R>: Send + Sync + 'static {
    /// Push the parts of `req`'s key into `key`, or say why there is none:
    /// [`KeyError::Missing`] (a layer may use its fallback key instead) or
    /// [`KeyError::Ambiguous`] (the request is refused).
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError>;
}

/// Collects the parts of one key: hashes them, and writes their text when
/// asked to.
pub struct KeyBuilder<'a> {
    hasher: FoldHasher<'static>,
    text: Option<&'a mut Vec<String>>,
    parts: u32,
}

impl fmt::Debug for KeyBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyBuilder")
            .field("parts", &self.parts)
            .finish_non_exhaustive()
    }
}

/// The text of a part, only wanted for rules, per-key statistics, errors and
/// logs: out of line, so that the hashing around it stays small enough to
/// inline.
#[cold]
#[inline(never)]
fn push_text(text: &mut Vec<String>, bytes: &[u8]) {
    text.push(String::from_utf8_lossy(bytes).into_owned());
}

impl<'a> KeyBuilder<'a> {
    #[inline]
    fn new(seed: &KeySeed, text: Option<&'a mut Vec<String>>) -> Self {
        Self {
            hasher: seed.0.build_hasher(),
            text,
            parts: 0,
        }
    }

    /// Add one part, as raw bytes.
    #[inline]
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        // The length goes in first so that parts cannot run into each other.
        self.hasher.write_usize(bytes.len());
        self.hasher.write(bytes);
        if let Some(text) = self.text.as_deref_mut() {
            push_text(text, bytes);
        }
        self.parts += 1;
    }

    /// Add one part, as text.
    #[inline]
    pub fn push_str(&mut self, part: &str) {
        self.push_bytes(part.as_bytes());
    }

    /// Add one part of any [`KeyPart`] type.
    pub fn push<P: KeyPart + ?Sized>(&mut self, part: &P) {
        part.push_to(self);
    }

    #[inline]
    fn finish(&self) -> KeyHash {
        KeyHash(self.hasher.finish())
    }
}

/// The randomly seeded hash function of one limiter.
///
/// Keys are client IPs, API keys and model names chosen by whoever sends the
/// requests, so the hash is seeded at random per limiter (foldhash: fast on
/// short keys, and not predictable from outside, unlike an unseeded FxHash).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeySeed(RandomState);

/// A key's 64-bit hash under one limiter's seed: what the state store is
/// indexed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyHash(pub(crate) u64);

impl KeySeed {
    /// The hash of `req`'s key.
    #[inline]
    pub(crate) fn hash<R, X: KeyExtractor<R> + ?Sized>(
        &self,
        extractor: &X,
        req: &R,
    ) -> Result<KeyHash, KeyError> {
        let mut builder = KeyBuilder::new(self, None);
        extractor.extract(req, &mut builder)?;
        Ok(builder.finish())
    }

    /// The hash of the key with no parts: [`GlobalKey`]'s.
    pub(crate) fn global(&self) -> KeyHash {
        KeyBuilder::new(self, None).finish()
    }

    /// The hash of a key given as its parts' texts (a fallback key, or a
    /// key named through a handle).
    pub(crate) fn hash_parts<S: AsRef<str>>(&self, parts: &[S]) -> KeyHash {
        let mut builder = KeyBuilder::new(self, None);
        for part in parts {
            builder.push_str(part.as_ref());
        }
        builder.finish()
    }
}

/// The texts of `req`'s key parts under `extractor`.
pub fn key_parts<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<Vec<String>, KeyError> {
    let seed = KeySeed::default();
    let mut parts = Vec::new();
    let mut builder = KeyBuilder::new(&seed, Some(&mut parts));
    extractor.extract(req, &mut builder)?;
    Ok(parts)
}

/// A key's text: its parts joined by `/`, and `(global)` for a key with no
/// parts.
pub(crate) fn join_parts<S: AsRef<str>>(parts: &[S]) -> String {
    if parts.is_empty() {
        return "(global)".to_owned();
    }
    parts
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join("/")
}

/// The text form of `req`'s key under `extractor`: parts joined by `/`, and
/// `(global)` for a key with no parts.
pub fn key_text<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<String, KeyError> {
    key_parts(extractor, req).map(|parts| join_parts(&parts))
}

impl<R, F, T> KeyExtractor<R> for F
where
    F: Fn(&R) -> Option<T> + Send + Sync + 'static,
    T: KeyPart,
{
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        match self(req) {
            Some(part) => {
                key.push(&part);
                Ok(())
            }
            None => Err(MissingKey::new("the closure's key").into()),
        }
    }
}

macro_rules! tuple_extractor {
    ($($name:ident),+) => {
        impl<R, $($name),+> KeyExtractor<R> for ($($name,)+)
        where
            $($name: KeyExtractor<R>,)+
        {
            #[allow(non_snake_case)]
            fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
                let ($($name,)+) = self;
                $($name.extract(req, key)?;)+
                Ok(())
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);
