//! Showing text that came from a request: secrets as fingerprints, control
//! characters escaped.
//!
//! A key's text can be a secret (an API key, a bearer token, a client's
//! address) and can hold anything a client sent (a newline that forges a log
//! line, an escape sequence that repaints a terminal). The layers therefore
//! never show a key part as it came wherever they render it (an error's
//! `Display`, a stats name, a log line, a response): a secret part is shown as
//! its [`Fingerprint`], `#` and 8 hex digits of a keyed hash, the same for the
//! same text for the life of the process, so an operator can still follow one
//! caller through the logs; every other part is shown [`Escaped`]. Which
//! parts are secret is decided by [`is_secret_name`], the rule the identity
//! layer also uses for header values, and by the key extractors (see
//! [`key`](crate::key)).
//!
//! Redaction costs nothing on the request path: it happens only where text is
//! rendered, never on a plain admission.
//!
//! ```
//! use tower_throttle::redact::{Escaped, fingerprint, is_secret_name};
//!
//! assert!(is_secret_name("x-api-key"));
//! assert!(!is_secret_name("x-model"));
//! let shown = fingerprint("sk-live-0000").to_string();
//! assert_eq!(shown.len(), 9);
//! assert!(shown.starts_with('#'));
//! assert_eq!(fingerprint("sk-live-0000"), fingerprint("sk-live-0000"));
//! assert_eq!(Escaped("a\nb\u{1b}[2J").to_string(), r"a\nb\u{1b}[2J");
//! ```

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// Parts of a header (or field) name that mark its value as secret.
const SECRET_MARKERS: [&str; 7] = [
    "authorization",
    "cookie",
    "key",
    "token",
    "secret",
    "password",
    "credential",
];

/// Whether a header or field with this name carries a secret by its name
/// alone: `Authorization`, `Cookie`, and any name containing `key`, `token`,
/// `secret`, `password` or `credential`, in any case.
pub fn is_secret_name(name: &str) -> bool {
    SECRET_MARKERS.iter().any(|marker| {
        name.as_bytes()
            .windows(marker.len())
            .any(|w| w.eq_ignore_ascii_case(marker.as_bytes()))
    })
}

/// A short stand-in for a secret: `#` and the first 8 hex digits of a keyed
/// hash of its text. The key is drawn at random once per process, so a
/// fingerprint is stable while the process runs (the same caller has the same
/// fingerprint in every log line, error and stats name) and tells nothing
/// about the text to anyone without the key: not even a client address,
/// whose few billion values could otherwise be tried one by one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(u32);

/// The fingerprint of `text` in this process.
pub fn fingerprint(text: impl AsRef<[u8]>) -> Fingerprint {
    // std's `RandomState` is SipHash-1-3 under a random 128-bit key: a keyed
    // pseudo-random function made for short inputs, with no new dependency.
    static KEY: OnceLock<std::hash::RandomState> = OnceLock::new();
    let mut hasher = KEY.get_or_init(std::hash::RandomState::new).build_hasher();
    hasher.write(text.as_ref());
    Fingerprint((hasher.finish() >> 32) as u32)
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:08x}", self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Text as it may be shown in a log line, an error or a stats name:
/// backslashes doubled and control characters (newline, carriage return,
/// escape, NUL, …) written as Rust escapes (`\n`, `\r`, `\u{1b}`, `\0`), so
/// nothing it holds can start a new line or reach a terminal raw. Everything
/// else is kept as it is.
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if c == '\\' || c.is_control() {
                f.write_str(&text[start..i])?;
                if c == '\\' {
                    f.write_str("\\\\")?;
                } else {
                    // `\0` reads better than `escape_default`'s `\u{0}`.
                    match c {
                        '\0' => f.write_str("\\0")?,
                        c => {
                            for e in c.escape_default() {
                                f.write_char(e)?;
                            }
                        }
                    }
                }
                start = i + c.len_utf8();
            }
        }
        f.write_str(&text[start..])
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Append `text`, [escaped](Escaped), to `out`.
pub(crate) fn push_escaped(out: &mut String, text: &str) {
    let _ = write!(out, "{}", Escaped(text));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        for name in [
            "authorization",
            "Proxy-Authorization",
            "x-api-key",
            "X-Auth-Token",
            "client-secret",
            "cookie",
            "x-password",
            "api_key",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["user-agent", "x-title", "x-request-id", "accept", "model"] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn escaped_text_has_no_control_characters_and_reads_back_unambiguously() {
        let nasty = "x\n2026-12-01T00:00:00Z ERROR admin\r\u{1b}[2J\0\\n\u{7f}é";
        let shown = Escaped(nasty).to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            r"x\n2026-12-01T00:00:00Z ERROR admin\r\u{1b}[2J\0\\n\u{7f}é"
        );
        assert_eq!(Escaped("plain/text").to_string(), "plain/text");
    }

    #[test]
    fn fingerprints_are_stable_short_and_differ() {
        let a = fingerprint("alice").to_string();
        assert_eq!(a, fingerprint(b"alice").to_string());
        assert_eq!(a.len(), 9);
        assert!(a[1..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(fingerprint("alice"), fingerprint("alicf"));
    }
}
