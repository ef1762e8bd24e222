//! Values that can be one part of a key.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;

use super::KeyBuilder;

/// A value that can be one part of a key.
///
/// Numbers and addresses are keyed by their text form, so `42u64` and `"42"`
/// are the same part. Addresses (`IpAddr`, `SocketAddr`) are secret parts:
/// where the key is shown, they appear as their
/// [fingerprint](crate::redact::Fingerprint). Wrap any other value in
/// [`Secret`] to treat it the same way.
pub trait KeyPart {
    /// Push this value into `key` as one part.
    fn push_to(&self, key: &mut KeyBuilder<'_>);
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn push_to(&self, key: &mut KeyBuilder<'_>) {
        (**self).push_to(key);
    }
}

macro_rules! bytes_part {
    ($($ty:ty),+) => {$(
        impl KeyPart for $ty {
            fn push_to(&self, key: &mut KeyBuilder<'_>) {
                key.push_bytes(AsRef::<[u8]>::as_ref(self));
            }
        }
    )+};
}

bytes_part!([u8], Vec<u8>, Bytes);

macro_rules! str_part {
    ($($ty:ty),+) => {$(
        impl KeyPart for $ty {
            fn push_to(&self, key: &mut KeyBuilder<'_>) {
                key.push_str(self);
            }
        }
    )+};
}

str_part!(str, String, Arc<str>, Box<str>, Cow<'_, str>);

impl KeyPart for HeaderValue {
    fn push_to(&self, key: &mut KeyBuilder<'_>) {
        key.push_bytes(self.as_bytes());
    }
}

/// Formats into a stack buffer, so that numbers and addresses need no
/// allocation per request.
struct StackText {
    buf: [u8; 64],
    len: usize,
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

pub(super) fn push_display(value: &dyn fmt::Display, key: &mut KeyBuilder<'_>, secret: bool) {
    let mut text = StackText {
        buf: [0; 64],
        len: 0,
    };
    if write!(text, "{value}").is_ok() {
        key.push_part(&text.buf[..text.len], secret);
    } else {
        // Longer than any number or address; never expected, still correct.
        key.push_part(value.to_string().as_bytes(), secret);
    }
}

macro_rules! display_part {
    ($secret:expr => $($ty:ty),+) => {$(
        impl KeyPart for $ty {
            fn push_to(&self, key: &mut KeyBuilder<'_>) {
                push_display(self, key, $secret);
            }
        }
    )+};
}

display_part!(false => char, bool);
// A client's address identifies a person: shown only as a fingerprint.
display_part!(true => IpAddr, SocketAddr);

/// A key part that is secret: hashed and matched by rules like `T`, but
/// shown only as its [fingerprint](crate::redact::Fingerprint) in errors,
/// stats names and logs. For closures and extensions whose value is a
/// credential or a person's identifier.
///
/// ```
/// use tower_throttle::key::{KeyExtractor, Secret, key_label, key_text};
///
/// let session = |req: &http::Request<()>| {
///     req.headers().get("x-session").map(|v| Secret(v.clone()))
/// };
/// let req = http::Request::builder().header("x-session", "s3cr3t").body(()).unwrap();
/// assert_eq!(key_text(&session, &req).unwrap(), "s3cr3t");
/// assert!(!key_label(&session, &req).unwrap().contains("s3cr3t"));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Secret<T>(pub T);

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl<T: KeyPart> KeyPart for Secret<T> {
    fn push_to(&self, key: &mut KeyBuilder<'_>) {
        key.push_secret(&self.0);
    }
}

// Integers are formatted by `itoa`: the same text as `Display`, without
// `core::fmt`'s machinery (a per-request cost with integer keys).
macro_rules! integer_part {
    ($($ty:ty),+) => {$(
        impl KeyPart for $ty {
            #[inline]
            fn push_to(&self, key: &mut KeyBuilder<'_>) {
                key.push_str(itoa::Buffer::new().format(*self));
            }
        }
    )+};
}

integer_part!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);
