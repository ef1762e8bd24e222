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
//! Some parts are secret: the value of a header named like a credential
//! ([`HeaderKey`] on `x-api-key`, `Authorization`, …), a client address
//! ([`ClientIpKey`], any `IpAddr`), anything wrapped in [`Secret`]. Limits,
//! rules and [`key_text`] see their text like any other, but wherever the
//! layers show a key (errors, stats names, logs, refusal responses) a secret
//! part appears only as its [fingerprint](crate::redact::Fingerprint) and
//! the others [escaped](crate::redact::Escaped): see [`key_label`]. Each
//! extractor's `show_raw()` / `redact()` says otherwise for one key.
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

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::{FoldHasher, RandomState};

use crate::error::{KeyError, MissingKey};
use crate::redact::{fingerprint, push_escaped};

pub use client_ip::{ClientIpKey, ProxyHeader};
pub use extract::{ExtensionKey, GlobalKey, HeaderKey, HostKey, PathPrefixKey};
pub use json::JsonFieldKey;
pub use part::{KeyPart, Secret};

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
///
/// A part pushed as secret ([`push_secret_bytes`](Self::push_secret_bytes),
/// [`push_secret`](Self::push_secret)) is hashed and matched by rules like
/// any other; it only differs where the key is shown: errors, stats names and
/// logs show its [fingerprint](crate::redact::Fingerprint), never its text.
pub struct KeyBuilder<'a> {
    hasher: FoldHasher<'static>,
    text: Option<&'a mut KeyTexts>,
    parts: u32,
    /// Inside [`push_secret`](Self::push_secret): every part is secret.
    secret: bool,
    /// Set by a lane extractor: see [`set_weight`](Self::set_weight).
    weight: u32,
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
fn push_text(text: &mut KeyTexts, bytes: &[u8], secret: bool) {
    text.parts.push(String::from_utf8_lossy(bytes).into_owned());
    text.secret.push(secret);
}

impl<'a> KeyBuilder<'a> {
    #[inline]
    fn new(seed: &KeySeed, text: Option<&'a mut KeyTexts>) -> Self {
        Self {
            hasher: seed.0.build_hasher(),
            text,
            parts: 0,
            secret: false,
            weight: 1,
        }
    }

    /// For an extractor of fair-share *lanes* (callers, say: see
    /// [`ConcurrencyLayer::with_fair_share`](crate::concurrency::ConcurrencyLayer::with_fair_share)
    /// and [`FairQueueLayer`](crate::fair::FairQueueLayer)): the weight of
    /// this request's lane, how many turns in a row it takes when its turn
    /// comes (1 unless set; 0 counts as 1). It is no part of the key, and
    /// every other use of a key ignores it.
    pub fn set_weight(&mut self, weight: u32) {
        self.weight = weight.max(1);
    }

    /// Add one part, as raw bytes.
    #[inline]
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        self.push_part(bytes, false);
    }

    /// Add one part, as text.
    #[inline]
    pub fn push_str(&mut self, part: &str) {
        self.push_part(part.as_bytes(), false);
    }

    /// Add one part of any [`KeyPart`] type.
    pub fn push<P: KeyPart + ?Sized>(&mut self, part: &P) {
        part.push_to(self);
    }

    /// Add one secret part, as raw bytes: shown only as its fingerprint.
    #[inline]
    pub fn push_secret_bytes(&mut self, bytes: &[u8]) {
        self.push_part(bytes, true);
    }

    /// Add one secret part, as text: shown only as its fingerprint.
    #[inline]
    pub fn push_secret_str(&mut self, part: &str) {
        self.push_part(part.as_bytes(), true);
    }

    /// Add `part` (any [`KeyPart`]) as secret: every part it pushes is shown
    /// only as its fingerprint.
    pub fn push_secret<P: KeyPart + ?Sized>(&mut self, part: &P) {
        let outer = std::mem::replace(&mut self.secret, true);
        part.push_to(self);
        self.secret = outer;
    }

    /// Add one part; `secret` only matters where the key is shown, so it is
    /// only read when the text is collected.
    #[inline]
    pub(crate) fn push_part(&mut self, bytes: &[u8], secret: bool) {
        // The length goes in first so that parts cannot run into each other.
        self.hasher.write_usize(bytes.len());
        self.hasher.write(bytes);
        if let Some(text) = self.text.as_deref_mut() {
            push_text(text, bytes, secret || self.secret);
        }
        self.parts += 1;
    }

    #[inline]
    fn finish(&self) -> KeyHash {
        KeyHash(self.hasher.finish())
    }
}

/// The texts of a key's parts, each marked secret or not: rules match the
/// texts, and [`label`](Self::label) is what errors, stats and logs show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyTexts {
    parts: Vec<String>,
    secret: Vec<bool>,
}

impl KeyTexts {
    /// One part that is not secret: a fallback key, or what was missing.
    pub(crate) fn plain(text: impl Into<String>) -> Self {
        Self {
            parts: vec![text.into()],
            secret: vec![false],
        }
    }

    /// Parts given by text (through a handle), none marked secret: for
    /// matching rules, not for showing.
    pub(crate) fn of_parts<S: AsRef<str>>(parts: &[S]) -> Self {
        Self {
            parts: parts.iter().map(|p| p.as_ref().to_owned()).collect(),
            secret: vec![false; parts.len()],
        }
    }

    /// The parts' texts, as the request had them: what rules match.
    pub(crate) fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The key as it may be shown: parts joined by `/`, a secret part as its
    /// fingerprint, the others with control characters escaped; `(global)`
    /// for a key with no parts.
    pub(crate) fn label(&self) -> String {
        if self.parts.is_empty() {
            return "(global)".to_owned();
        }
        let mut out = String::new();
        for (i, (part, &secret)) in self.parts.iter().zip(&self.secret).enumerate() {
            if i > 0 {
                out.push('/');
            }
            if secret {
                let _ = write!(out, "{}", fingerprint(part));
            } else {
                push_escaped(&mut out, part);
            }
        }
        out
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

    /// The hash of `req`'s key under `extractor`, and the lane weight it
    /// set (see [`KeyBuilder::set_weight`]).
    pub(crate) fn hash_weighted<R, X: KeyExtractor<R> + ?Sized>(
        &self,
        extractor: &X,
        req: &R,
    ) -> Result<(KeyHash, u32), KeyError> {
        let mut builder = KeyBuilder::new(self, None);
        extractor.extract(req, &mut builder)?;
        Ok((builder.finish(), builder.weight))
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

/// The texts of `req`'s key parts under `extractor`, as the request had
/// them, secret parts included: for rules and tests, not for showing (see
/// [`key_label`]).
pub fn key_parts<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<Vec<String>, KeyError> {
    key_texts(extractor, req).map(|texts| texts.parts)
}

/// The texts of `req`'s key parts, each marked secret or not.
pub(crate) fn key_texts<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<KeyTexts, KeyError> {
    let seed = KeySeed::default();
    let mut texts = KeyTexts::default();
    let mut builder = KeyBuilder::new(&seed, Some(&mut texts));
    extractor.extract(req, &mut builder)?;
    Ok(texts)
}

/// The text form of `req`'s key under `extractor`, as the request had it:
/// parts joined by `/`, and `(global)` for a key with no parts. Secret parts
/// are included as they are; [`key_label`] is what may be shown.
pub fn key_text<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<String, KeyError> {
    key_parts(extractor, req).map(|parts| {
        if parts.is_empty() {
            "(global)".to_owned()
        } else {
            parts.join("/")
        }
    })
}

/// `req`'s key as the layers show it in errors, stats names and logs: parts
/// joined by `/`, each secret part as its
/// [fingerprint](crate::redact::Fingerprint), the others
/// [escaped](crate::redact::Escaped); `(global)` for a key with no parts.
///
/// ```
/// use tower_throttle::key::{HeaderKey, PathPrefixKey, key_label};
/// use tower_throttle::redact::fingerprint;
///
/// let key = (PathPrefixKey::segments(1).unwrap(), HeaderKey::new("x-api-key").unwrap());
/// let req = http::Request::builder()
///     .uri("/chat/completions")
///     .header("x-api-key", "sk-live-0000")
///     .body(())
///     .unwrap();
/// assert_eq!(key_label(&key, &req).unwrap(), format!("/chat/{}", fingerprint("sk-live-0000")));
/// ```
pub fn key_label<R, X: KeyExtractor<R> + ?Sized>(
    extractor: &X,
    req: &R,
) -> Result<String, KeyError> {
    key_texts(extractor, req).map(|texts| texts.label())
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
