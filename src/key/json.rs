//! [`JsonFieldKey`]: a top-level field of a JSON request body.
//!
//! The body is scanned by hand rather than walked with a serde visitor. A
//! limiter must count the key the upstream will act on, and upstreams read
//! JSON differently: the last of a repeated field wins (serde_json's `Value`,
//! Go, Python, JavaScript), Go's `encoding/json` matches field names whatever
//! their case, Python's `json.loads` on bytes skips a byte-order mark and
//! decodes UTF-16 and UTF-32, and they all nest deeper than serde_json's 128
//! levels. The scanner reports each of these as ambiguous instead of picking
//! a reading, and it does not recurse, so no depth limit applies to the
//! values it skips. It is also fast: one pass, strings skipped with
//! `memchr`, field names compared in place (decoded only when they hold an
//! escape), no allocation. Only the field's own value is handed to
//! serde_json, which decodes it without a copy when it has no escape.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{KeyBuilder, KeyExtractor};
use crate::error::{Ambiguity, AmbiguousKey, KeyError, MissingKey};
use crate::parts::BodyBytes;
use crate::redact::is_secret_name;

/// A top-level field of a JSON request body, such as `"model"` of an LLM
/// request. Strings key by their value, numbers and booleans by their text.
///
/// A body that is absent, not in memory, not a JSON object, or without the
/// field (or with `null`, an object or an array there) has no key
/// ([`MissingKey`], which a layer's fallback key may replace). A body that
/// could be read with another value for the field is refused
/// ([`AmbiguousKey`], never given the fallback key): the field given twice,
/// also given with a name differing only in case (`"MODEL"`, `"mod\u0045l"`;
/// Go reads it as the same field), an object that is not well-formed, or JSON
/// in UTF-16 or UTF-32. Names are compared after decoding their escapes, so
/// `"mod\u0065l"` is `"model"`.
///
/// Works for request types whose body bytes can be read without consuming the
/// body (see [`BodyBytes`]). Only the top-level object is walked; other
/// fields are skipped without being parsed, however deep they nest.
///
/// As with [`HeaderKey`](super::HeaderKey), a field whose name says it is a
/// secret (`api_key`, `token`, …: see [`is_secret_name`]) is shown only as
/// its fingerprint; a model name is shown as it is (escaped).
#[derive(Clone, Debug)]
pub struct JsonFieldKey {
    field: String,
    secret: bool,
}

impl JsonFieldKey {
    /// Key by the top-level field `field`.
    pub fn new(field: impl Into<String>) -> Self {
        let field = field.into();
        let secret = is_secret_name(&field);
        Self { field, secret }
    }

    /// Show the value as it is (escaped), even though the field's name says
    /// it is a secret.
    pub fn show_raw(mut self) -> Self {
        self.secret = false;
        self
    }

    /// Show only the value's fingerprint, whatever the field's name.
    pub fn redact(mut self) -> Self {
        self.secret = true;
        self
    }

    #[cold]
    fn missing(&self) -> KeyError {
        MissingKey::new(format!("JSON body field `{}`", self.field)).into()
    }

    #[cold]
    fn ambiguous(&self, reason: Ambiguity) -> KeyError {
        AmbiguousKey::new(format!("JSON body field `{}`", self.field), reason).into()
    }
}

impl<R: BodyBytes> KeyExtractor<R> for JsonFieldKey {
    fn extract(&self, req: &R, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let Some(body) = req.body_bytes() else {
            return Err(self.missing());
        };
        let value = match find_field(body, self.field.as_bytes()) {
            Ok(Some(value)) => value,
            Ok(None) => return Err(self.missing()),
            Err(reason) => return Err(self.ambiguous(reason)),
        };
        // Objects and arrays are no key; not parsed, so their depth does not
        // matter.
        if matches!(value.first(), Some(b'{' | b'[')) {
            return Err(self.missing());
        }
        let mut de = serde_json::Deserializer::from_slice(value);
        let read = Scalar {
            key,
            secret: self.secret,
        }
        .deserialize(&mut de);
        match read.and_then(|found| de.end().map(|()| found)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.missing()),
            // `NaN`, `1e999`, a lone surrogate, bytes that are not UTF-8:
            // some parser may still read a value there.
            Err(_) => Err(self.ambiguous(Ambiguity::Malformed)),
        }
    }
}

/// The bytes of `field`'s value in the top-level object of `body`; `None`
/// when `body` is not an object or has no such field; or why the field
/// cannot be told.
fn find_field<'b>(body: &'b [u8], field: &[u8]) -> Result<Option<&'b [u8]>, Ambiguity> {
    let start = match body {
        // Python's `json.loads` on bytes skips a UTF-8 byte-order mark.
        [0xEF, 0xBB, 0xBF, ..] => 3,
        _ if wide_object(body) => return Err(Ambiguity::NotUtf8),
        _ => 0,
    };
    let mut s = Scanner {
        bytes: body,
        pos: start,
    };
    s.skip_ws();
    if !s.eat(b'{') {
        return Ok(None);
    }
    s.skip_ws();
    if s.eat(b'}') {
        return Ok(None);
    }
    let mut found = None;
    loop {
        s.skip_ws();
        let name = s.string()?;
        s.skip_ws();
        if !s.eat(b':') {
            return Err(Ambiguity::Malformed);
        }
        s.skip_ws();
        let value = s.value()?;
        match compare_name(name, field) {
            Name::Exact => {
                if found.replace(value).is_some() {
                    return Err(Ambiguity::Repeated);
                }
            }
            Name::Folded => return Err(Ambiguity::CaseVariant),
            Name::Other => {}
        }
        s.skip_ws();
        match s.next() {
            Some(b',') => {}
            Some(b'}') => return Ok(found),
            _ => return Err(Ambiguity::Malformed),
        }
    }
}

/// A cursor over the body. Only the top-level object's structure is checked;
/// the values it skips are not parsed (a lenient reading: an upstream that
/// is stricter refuses such a body itself).
struct Scanner<'b> {
    bytes: &'b [u8],
    pos: usize,
}

impl<'b> Scanner<'b> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.bytes.get(self.pos) == Some(&byte);
        self.pos += usize::from(hit);
        hit
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.bytes.get(self.pos).copied();
        self.pos += 1;
        byte
    }

    /// A string starting here, quotes included.
    fn string(&mut self) -> Result<&'b [u8], Ambiguity> {
        let start = self.pos;
        if !self.eat(b'"') {
            return Err(Ambiguity::Malformed);
        }
        loop {
            let rest = self.bytes.get(self.pos..).unwrap_or_default();
            let at = memchr::memchr2(b'"', b'\\', rest).ok_or(Ambiguity::Malformed)?;
            self.pos += at + 1;
            if rest[at] == b'"' {
                return Ok(&self.bytes[start..self.pos]);
            }
            // An escape: the byte after the backslash is never the end.
            self.pos += 1;
        }
    }

    /// A value starting here, skipped without being parsed.
    fn value(&mut self) -> Result<&'b [u8], Ambiguity> {
        let start = self.pos;
        match self.bytes.get(self.pos) {
            Some(b'"') => {
                self.string()?;
            }
            Some(b'{' | b'[') => self.nested()?,
            Some(_) => {
                while let Some(b) = self.bytes.get(self.pos) {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.pos += 1;
                }
            }
            None => return Err(Ambiguity::Malformed),
        }
        if self.pos == start {
            return Err(Ambiguity::Malformed);
        }
        Ok(&self.bytes[start..self.pos])
    }

    /// An object or array, by counting brackets outside strings: no
    /// recursion, so no depth limit.
    fn nested(&mut self) -> Result<(), Ambiguity> {
        let mut depth = 0usize;
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b'"' => {
                    self.string()?;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
        Err(Ambiguity::Malformed)
    }
}

/// How a field name compares with the wanted one.
enum Name {
    Exact,
    /// Equal only under Go's case folding.
    Folded,
    Other,
}

/// Compare a quoted field name with `field`, after decoding its escapes.
fn compare_name(quoted: &[u8], field: &[u8]) -> Name {
    let raw = &quoted[1..quoted.len() - 1];
    if !raw.contains(&b'\\') {
        return compare_text(raw, field);
    }
    // Escapes are rare in names; serde_json decodes them exactly. A name it
    // cannot decode (a lone surrogate) is no valid UTF-8 text, so never the
    // field.
    match serde_json::from_slice::<String>(quoted) {
        Ok(name) => compare_text(name.as_bytes(), field),
        Err(_) => Name::Other,
    }
}

fn compare_text(name: &[u8], field: &[u8]) -> Name {
    if name == field {
        Name::Exact
    } else if folds_equal(name, field) {
        Name::Folded
    } else {
        Name::Other
    }
}

/// Whether Go's `encoding/json` takes `a` and `b` for the same field name:
/// it compares names folded rune by rune as `ToUpper(ToLower(r))`.
fn folds_equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() == b.len() && a.eq_ignore_ascii_case(b) {
        return true;
    }
    if a.is_ascii() && b.is_ascii() {
        return false;
    }
    // Non-ASCII: `K` (Kelvin) folds as `k`, `ſ` (long s) as `s`.
    match (std::str::from_utf8(a), std::str::from_utf8(b)) {
        (Ok(a), Ok(b)) => a.chars().map(go_fold).eq(b.chars().map(go_fold)),
        _ => false,
    }
}

/// Go's fold of one rune, with its simple (one-rune) case mappings.
fn go_fold(c: char) -> char {
    let mut lower = c.to_lowercase();
    let lower = match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        // U+0130 lowers to two chars; its simple mapping is `i`.
        _ if c == '\u{130}' => 'i',
        _ => c,
    };
    let mut upper = lower.to_uppercase();
    match (upper.next(), upper.next()) {
        (Some(u), None) => u,
        _ => lower,
    }
}

/// Whether `body` is, to Python's `json.loads` (which tells the encoding by
/// its byte-order mark or its zero bytes), UTF-16 or UTF-32 text that
/// starts, after white space, with `{`.
fn wide_object(body: &[u8]) -> bool {
    let (unit, big_endian, skip) = match *body {
        [0, 0, 0xFE, 0xFF, ..] => (4, true, 4),
        [0xFF, 0xFE, 0, 0, ..] => (4, false, 4),
        [0xFE, 0xFF, ..] => (2, true, 2),
        [0xFF, 0xFE, ..] => (2, false, 2),
        [0, b1, _, _, ..] => (if b1 == 0 { 4 } else { 2 }, true, 0),
        [_, 0, b2, b3, ..] => (if b2 == 0 && b3 == 0 { 4 } else { 2 }, false, 0),
        [0, _] => (2, true, 0),
        [_, 0] => (2, false, 0),
        _ => return false,
    };
    let first = body[skip..]
        .chunks_exact(unit)
        .map(|c| {
            let fold = |n: u32, &b: &u8| n << 8 | u32::from(b);
            if big_endian {
                c.iter().fold(0, fold)
            } else {
                c.iter().rev().fold(0, fold)
            }
        })
        .find(|&u| !matches!(u, 0x20 | 0x09 | 0x0A | 0x0D));
    first == Some(u32::from(b'{'))
}

/// Pushes a JSON scalar into the key; reports whether it was a scalar.
struct Scalar<'k, 'b> {
    key: &'k mut KeyBuilder<'b>,
    secret: bool,
}

impl Scalar<'_, '_> {
    fn push(self, text: &str) -> bool {
        self.key.push_part(text.as_bytes(), self.secret);
        true
    }
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
        Ok(self.push(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(self.push(if v { "true" } else { "false" }))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        Ok(self.push(itoa::Buffer::new().format(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        Ok(self.push(itoa::Buffer::new().format(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        Ok(self.push(&v.to_string()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    // Objects and arrays are turned away before parsing; these are here so
    // that the visitor is whole.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_folds_kelvin_and_long_s_like_their_ascii_letters() {
        assert!(folds_equal("\u{212A}ey".as_bytes(), b"key"));
        assert!(folds_equal("\u{17F}tream".as_bytes(), b"stream"));
        assert!(folds_equal(b"MoDeL", b"model"));
        assert!(!folds_equal(b"models", b"model"));
        assert!(!folds_equal("mod\u{e9}l".as_bytes(), b"model"));
    }

    #[test]
    fn wide_json_objects_are_told_by_their_zero_bytes_or_mark() {
        let utf16 = |text: &str, big: bool| -> Vec<u8> {
            text.encode_utf16()
                .flat_map(|u| {
                    if big {
                        u.to_be_bytes()
                    } else {
                        u.to_le_bytes()
                    }
                })
                .collect()
        };
        assert!(wide_object(&utf16(r#"{"model":"m"}"#, true)));
        assert!(wide_object(&utf16(r#"  {"model":"m"}"#, false)));
        let mut marked = vec![0xFF, 0xFE];
        marked.extend(utf16("{}", false));
        assert!(wide_object(&marked));
        let utf32: Vec<u8> = "\n{}"
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect();
        assert!(wide_object(&utf32));
        // Not an object, or not wide: not this case.
        assert!(!wide_object(&utf16("[1]", true)));
        assert!(!wide_object(b"{\"model\":\"m\"}"));
        assert!(!wide_object(b"\0\0\0\x20ftypisom"));
    }
}
