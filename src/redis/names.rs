//! Redis key names: `prefix{hash}:suffix`.
//!
//! The hash is SipHash-2-4 with a 128-bit output, keyed, over the key's
//! parts (each with its length first, so that `("ab", "c")` and `("a",
//! "bc")` never meet). Keyed, because key text can be a client address:
//! an unkeyed hash of an IPv4 address is reversed by trying all 2³² of
//! them, while a keyed one cannot be tried without the key. The key comes
//! from the configuration (the same in every replica, unlike the random seed
//! of an in-process limiter), so every replica names a key alike. The hash
//! stands between braces, a Redis Cluster hash tag: every state of one key
//! lives in one slot, which a script touching them all needs.

use std::fmt::Write as _;
use std::hash::Hasher as _;

use siphasher::sip128::{Hasher128 as _, SipHasher};

/// Mixed into the hash key derived from a configured secret, so that the
/// derived key is not simply the secret's SipHash under the zero key.
const DERIVE: [u8; 16] = *b"tower-throttle:1";

/// Names the Redis keys of one store.
#[derive(Clone)]
pub(crate) struct Namer {
    key: [u8; 16],
    keyed: bool,
}

impl Namer {
    /// Keyed by `secret` (any length), or by a fixed, public key when there
    /// is none.
    pub(crate) fn new(secret: Option<&[u8]>) -> Self {
        match secret {
            Some(secret) => {
                let mut h = SipHasher::new_with_key(&DERIVE);
                h.write(secret);
                Self {
                    key: h.finish128().as_bytes(),
                    keyed: true,
                }
            }
            None => Self {
                key: DERIVE,
                keyed: false,
            },
        }
    }

    /// Whether a secret keys the hash.
    pub(crate) fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// The 128-bit hash of a key's parts.
    pub(crate) fn hash<S: AsRef<str>>(&self, parts: &[S]) -> [u8; 16] {
        let mut h = SipHasher::new_with_key(&self.key);
        h.write_u64(parts.len() as u64);
        for part in parts {
            let part = part.as_ref().as_bytes();
            h.write_u64(part.len() as u64);
            h.write(part);
        }
        h.finish128().as_bytes()
    }

    /// `prefix{hash}`: what every key name of these parts starts with.
    pub(crate) fn base<S: AsRef<str>>(&self, prefix: &str, parts: &[S]) -> String {
        let mut name = String::with_capacity(prefix.len() + 34 + 24);
        name.push_str(prefix);
        name.push('{');
        for byte in self.hash(parts) {
            let _ = write!(name, "{byte:02x}");
        }
        name.push('}');
        name
    }

    /// A short, stable tag for a rule name (rule names are configuration,
    /// any text): 16 hex digits.
    pub(crate) fn tag(&self, name: &str) -> String {
        let mut h = SipHasher::new_with_key(&DERIVE);
        h.write(name.as_bytes());
        format!("{:016x}", h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hold_no_key_text_and_one_hash_tag() {
        let namer = Namer::new(Some(b"secret"));
        let name = namer.base("tt:", &["10.0.0.1", "gpt-4o"]);
        assert!(name.starts_with("tt:{"), "{name}");
        assert!(name.ends_with('}'));
        assert_eq!(name.len(), "tt:".len() + 34);
        assert!(!name.contains("10.0.0.1") && !name.contains("gpt"));
    }

    #[test]
    fn the_hash_is_stable_and_keyed() {
        let a = Namer::new(Some(b"one"));
        let b = Namer::new(Some(b"one"));
        let other = Namer::new(Some(b"two"));
        let unkeyed = Namer::new(None);
        let parts = ["10.0.0.1"];
        assert_eq!(a.hash(&parts), b.hash(&parts));
        assert_ne!(a.hash(&parts), other.hash(&parts));
        assert_ne!(a.hash(&parts), unkeyed.hash(&parts));
        // Parts cannot run into each other.
        assert_ne!(a.hash(&["ab", "c"]), a.hash(&["a", "bc"]));
        assert_ne!(a.hash(&["a"]), a.hash(&["a", ""]));
        // The same on every machine and in every release: key names in a
        // shared Redis must not change under a running fleet.
        let hex: String = Namer::new(Some(b"k"))
            .hash(&["x"])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, PINNED);
    }

    /// The hash of `["x"]` under the secret `k`.
    const PINNED: &str = "045c293e6005e270b82677f68e364c7d";
}
