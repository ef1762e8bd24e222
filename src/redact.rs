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

/// Parts of a header (or field) name that mark its value as secret: a
/// credential, or who the client is (a session, an address).
const SECRET_MARKERS: [&str; 11] = [
    "auth",
    "cookie",
    "key",
    "token",
    "secret",
    "password",
    "credential",
    "session",
    "jwt",
    "signature",
    "forwarded",
];

/// Whether a header or field with this name carries a secret by its name
/// alone, in any case: `Authorization`, `Cookie`, names containing `auth`,
/// `key`, `token`, `secret`, `password`, `credential`, `session`, `jwt`,
/// `signature` or `forwarded` (`X-Forwarded-For`), and names ending in
/// `-ip` or `_ip` (`X-Real-IP`, `CF-Connecting-IP`), which carry a client's
/// address.
pub fn is_secret_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let address = bytes.len() >= 3
        && matches!(bytes[bytes.len() - 3], b'-' | b'_')
        && bytes[bytes.len() - 2..].eq_ignore_ascii_case(b"ip");
    address
        || SECRET_MARKERS.iter().any(|marker| {
            bytes
                .windows(marker.len())
                .any(|w| w.eq_ignore_ascii_case(marker.as_bytes()))
        })
}

/// Whether `c` must not reach a log line, a terminal or a label as it is:
/// control characters, and the invisible ones that change how text around
/// them reads (line and paragraph separators, bidirectional marks and
/// overrides, zero-width characters, the byte-order mark).
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
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
/// backslashes doubled and [hidden](is_hidden) characters (newline, carriage
/// return, escape, NUL, bidirectional overrides, …) written as Rust escapes
/// (`\n`, `\r`, `\u{1b}`, `\0`, `\u{202e}`), so nothing it holds can start a
/// new line, reach a terminal raw or make text read backwards. Everything
/// else is kept as it is. (Logged as a field, it is [quoted](Quoted).)
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if c == '\\' || is_hidden(c) {
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

/// Text already [escaped](Escaped) (a key's label), shown as one quoted
/// field of a log line: in double quotes, with double quotes inside escaped,
/// so that text such as `x status=500` cannot pass for more fields. (A
/// label's backslashes are already doubled, so `\"` reads back as one
/// quote.)
#[derive(Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        let mut parts = self.0.split('"');
        if let Some(first) = parts.next() {
            f.write_str(first)?;
        }
        for part in parts {
            f.write_str("\\\"")?;
            f.write_str(part)?;
        }
        f.write_char('"')
    }
}

impl fmt::Debug for Quoted<'_> {
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
        for name in [
            "x-session-id",
            "X-Real-IP",
            "cf-connecting-ip",
            "x-forwarded-for",
            "Forwarded",
            "x-amz-signature",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "user-agent",
            "x-title",
            "x-request-id",
            "accept",
            "model",
            "zip",
        ] {
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
        assert_eq!(
            Quoted(r#"x" status=500 y="#).to_string(),
            r#""x\" status=500 y=""#
        );
        assert_eq!(
            Escaped("a\u{202e}b\u{2028}c\u{200b}").to_string(),
            r"a\u{202e}b\u{2028}c\u{200b}"
        );
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
