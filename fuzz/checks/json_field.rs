//! `JsonFieldKey` over arbitrary bodies, checked two ways.
//!
//! 1. Differential, when serde_json reads the whole body (after a UTF-8
//!    byte-order mark, which the docs say is skipped): the key must be what
//!    serde_json reads for the field (a string's value, a number's or a
//!    boolean's text); no key (`Missing`) for `null`, an object, an array,
//!    an absent field or a body that is no object; refused (`Ambiguous`)
//!    when the field is given twice or with a name that differs only under
//!    Go's case folding (the docs' rules; serde_json's `Value` would take
//!    the last).
//! 2. Against a reference written from the docs for every body: only the
//!    top-level object is walked, other values are skipped unparsed
//!    (however deep, and even when serde_json would refuse them), bytes
//!    after the object are not read; a top level that is not well-formed,
//!    a field value serde_json cannot read, or JSON in UTF-16/UTF-32 (as
//!    Python's `json.loads` tells it) is `Ambiguous`.
//!
//! Also: the same answer twice, and the key as shown is the fingerprint of
//! the value for a secret field, the escaped value otherwise.
//!
//! Input: a byte choosing the field name, then the body.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use tower_throttle::error::KeyError;
use tower_throttle::key::{JsonFieldKey, key_label, key_parts};
use tower_throttle::redact::{Escaped, fingerprint, is_secret_name};

const FIELDS: [&str; 6] = ["model", "api_key", "k", "stream", "m", "id"];

#[derive(Debug, PartialEq)]
enum Expect {
    Key(String),
    Missing,
    Ambiguous,
}

/// Go's fold of one rune (`ToUpper(ToLower(r))`, simple mappings).
fn go_fold(c: char) -> char {
    let simple = |mut it: std::iter::Peekable<std::vec::IntoIter<char>>, c: char| match (
        it.next(),
        it.peek(),
    ) {
        (Some(x), None) => x,
        _ => c,
    };
    let lower = if c == '\u{130}' {
        'i'
    } else {
        simple(
            c.to_lowercase().collect::<Vec<_>>().into_iter().peekable(),
            c,
        )
    };
    simple(
        lower
            .to_uppercase()
            .collect::<Vec<_>>()
            .into_iter()
            .peekable(),
        lower,
    )
}

fn folds_to(name: &str, field: &str) -> bool {
    name != field && name.chars().map(go_fold).eq(field.chars().map(go_fold))
}

/// The key a scalar gives, as the docs say: a string's value, a number's or
/// a boolean's text; none for the rest.
fn scalar(value: &Value) -> Expect {
    match value {
        Value::String(s) => Expect::Key(s.clone()),
        Value::Bool(b) => Expect::Key(b.to_string()),
        Value::Number(n) => Expect::Key(match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (None, Some(i), _) => i.to_string(),
            (None, None, Some(f)) => f.to_string(),
            (None, None, None) => unreachable!("a JSON number is one of the three"),
        }),
        Value::Null | Value::Array(_) | Value::Object(_) => Expect::Missing,
    }
}

/// The top-level names of an object, repeats included, in order.
struct Names(Vec<String>);

impl<'de> de::Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Names, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    names.push(name);
                }
                Ok(Names(names))
            }
        }
        de.deserialize_map(V)
    }
}

/// The answer by serde_json's reading of the whole body, or `None` when
/// serde_json cannot read it.
fn by_serde_json(body: &[u8], field: &str) -> Option<Expect> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let value: Value = serde_json::from_slice(body).ok()?;
    let Value::Object(map) = value else {
        return Some(Expect::Missing);
    };
    let names = serde_json::from_slice::<Names>(body).ok()?.0;
    let exact = names.iter().filter(|n| *n == field).count();
    if exact > 1 || names.iter().any(|n| folds_to(n, field)) {
        return Some(Expect::Ambiguous);
    }
    Some(match map.get(field) {
        Some(value) => scalar(value),
        None => Expect::Missing,
    })
}

/// Python's `json.loads` reads these bytes as UTF-16 or UTF-32 text
/// starting, after white space, with `{` (its `detect_encoding`).
fn wide_object(b: &[u8]) -> bool {
    let (unit, big, skip) = if b.starts_with(&[0, 0, 0xFE, 0xFF]) {
        (4, true, 4)
    } else if b.starts_with(&[0xFF, 0xFE, 0, 0]) {
        (4, false, 4)
    } else if b.starts_with(&[0xFE, 0xFF]) {
        (2, true, 2)
    } else if b.starts_with(&[0xFF, 0xFE]) {
        (2, false, 2)
    } else if b.len() >= 4 && b[0] == 0 {
        (if b[1] != 0 { 2 } else { 4 }, true, 0)
    } else if b.len() >= 4 && b[1] == 0 {
        (if b[2] != 0 || b[3] != 0 { 2 } else { 4 }, false, 0)
    } else if b.len() == 2 && (b[0] == 0 || b[1] == 0) {
        (2, b[0] == 0, 0)
    } else {
        return false;
    };
    for chunk in b[skip..].chunks_exact(unit) {
        let mut bytes = chunk.to_vec();
        if !big {
            bytes.reverse();
        }
        let u = bytes.iter().fold(0u32, |n, &x| (n << 8) | u32::from(x));
        if !matches!(u, 0x20 | 0x09 | 0x0A | 0x0D) {
            return u == u32::from(b'{');
        }
    }
    false
}

/// The docs' reading, for any body.
fn by_docs(body: &[u8], field: &str) -> Expect {
    if wide_object(body) {
        return Expect::Ambiguous;
    }
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let mut c = Cursor { b: body, i: 0 };
    c.ws();
    if !c.eat(b'{') {
        return Expect::Missing;
    }
    c.ws();
    if c.eat(b'}') {
        return Expect::Missing;
    }
    let mut values = Vec::new();
    let mut folded = false;
    loop {
        c.ws();
        let Some(name) = c.string() else {
            return Expect::Ambiguous;
        };
        c.ws();
        if !c.eat(b':') {
            return Expect::Ambiguous;
        }
        c.ws();
        let Some(value) = c.value() else {
            return Expect::Ambiguous;
        };
        // Names are compared after decoding their escapes; one serde_json
        // cannot decode is not the field.
        if let Ok(name) = serde_json::from_slice::<String>(name) {
            if name == field {
                values.push(value);
            }
            folded |= folds_to(&name, field);
        }
        c.ws();
        if c.eat(b',') {
            continue;
        }
        if c.eat(b'}') {
            break;
        }
        return Expect::Ambiguous;
    }
    if values.len() > 1 || folded {
        return Expect::Ambiguous;
    }
    let Some(value) = values.first() else {
        return Expect::Missing;
    };
    if matches!(value.first(), Some(b'{' | b'[')) {
        return Expect::Missing;
    }
    match serde_json::from_slice::<Value>(value) {
        Ok(v) => scalar(&v),
        Err(_) => Expect::Ambiguous,
    }
}

/// A cursor over the top-level object.
struct Cursor<'b> {
    b: &'b [u8],
    i: usize,
}

impl<'b> Cursor<'b> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.b.get(self.i) == Some(&byte) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// A string, quotes included: up to the first quote not escaped.
    fn string(&mut self) -> Option<&'b [u8]> {
        let start = self.i;
        if !self.eat(b'"') {
            return None;
        }
        let mut escaped = false;
        while let Some(&x) = self.b.get(self.i) {
            self.i += 1;
            match (escaped, x) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => return Some(&self.b[start..self.i]),
                _ => {}
            }
        }
        None
    }

    /// A value, skipped: a string; brackets counted outside strings; or a
    /// run up to a delimiter or white space.
    fn value(&mut self) -> Option<&'b [u8]> {
        let start = self.i;
        match self.b.get(self.i)? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while !matches!(
                    self.b.get(self.i),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.i += 1;
                }
            }
        }
        (self.i > start).then(|| &self.b[start..self.i])
    }
}

fn answer(result: Result<Vec<String>, KeyError>) -> Expect {
    match result {
        Ok(mut parts) => {
            assert_eq!(parts.len(), 1, "one field, one part: {parts:?}");
            Expect::Key(parts.remove(0))
        }
        Err(KeyError::Missing(_)) => Expect::Missing,
        Err(KeyError::Ambiguous(_)) => Expect::Ambiguous,
        Err(e) => panic!("an error the docs do not name: {e:?}"),
    }
}

/// Check `JsonFieldKey` on the body in `data[1..]`.
pub fn check(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let field = FIELDS[usize::from(pick) % FIELDS.len()];
    let key = JsonFieldKey::new(field);
    let body = body.to_vec();
    let got = answer(key_parts(&key, &body));
    assert_eq!(got, answer(key_parts(&key, &body)), "deterministic");
    if let Some(expected) = by_serde_json(&body, field) {
        assert_eq!(got, expected, "serde_json reads field `{field}` otherwise");
    }
    assert_eq!(
        got,
        by_docs(&body, field),
        "the docs read field `{field}` otherwise"
    );
    if let Expect::Key(value) = &got {
        let shown = key_label(&key, &body).expect("a key has a label");
        if is_secret_name(field) {
            assert_eq!(shown, fingerprint(value).to_string());
        } else {
            assert_eq!(shown, Escaped(value).to_string());
        }
    }
}
