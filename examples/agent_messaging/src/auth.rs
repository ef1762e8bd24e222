//! Who a request acts as: the node whose key it presents
//! (`Authorization: Bearer KEY`), or the operator.
//!
//! Keys come from the projects file by reference (`key_env`, `key_file`),
//! never inline, and the operator's from `--admin-key-env`. They are
//! compared in constant time (`subtle`), every node's key on every request
//! so the time taken says nothing of which matched, and never logged: a
//! [`Secret`] prints as `<redacted>`.

use std::fmt;

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;

/// The fewest bytes a key may have: shorter ones can be guessed.
pub const MIN_KEY_BYTES: usize = 16;

/// The most bytes a key may have (and a key file may hold).
pub const MAX_KEY_BYTES: usize = 4096;

/// A key. Its bytes never reach a log, an answer or a `Debug` print.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// `text` as a key, once it is checked: surrounding whitespace (a key
    /// file's final newline) is not part of it; `what` names it in errors.
    pub fn new(text: &str, what: &str) -> Result<Self, String> {
        let key = text.trim();
        if key.len() < MIN_KEY_BYTES {
            return Err(format!(
                "{what} is {} bytes; a key needs at least {MIN_KEY_BYTES}",
                key.len()
            ));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(format!("{what} is longer than {MAX_KEY_BYTES} bytes"));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{what} has a space or a character a header cannot carry"
            ));
        }
        Ok(Self(key.as_bytes().into()))
    }

    /// Whether `presented` is this key, in time that depends only on the
    /// lengths.
    fn is(&self, presented: &[u8]) -> bool {
        bool::from(self.0.ct_eq(presented))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.is(&other.0)
    }
}

/// Who may do what.
#[derive(Debug, Default)]
pub struct Access {
    /// Each node's key; empty when the projects file names none (anyone
    /// acts as any node: loopback only, see `main`).
    nodes: Vec<(String, Secret)>,
    /// The operator's key, for `/reset` and `/stats`.
    operator: Option<Secret>,
}

/// Who a request acts as.
#[derive(Debug, PartialEq, Eq)]
pub enum Caller {
    /// No keys anywhere: anyone acts as any node.
    Anyone,
    /// The node whose key was presented.
    Node(String),
    /// The operator's key was presented.
    Operator,
    /// No key, or one that is nobody's.
    Unknown,
}

impl Access {
    /// Keys for `nodes`; the caller has checked that none is used twice.
    pub fn new(nodes: Vec<(String, Secret)>) -> Self {
        Self {
            nodes,
            operator: None,
        }
    }

    /// Whether nodes have keys (if not, anyone acts as any node).
    pub fn has_node_keys(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// Whether `/reset` and `/stats` can be reached at all: with node keys,
    /// only with the operator's.
    pub fn has_operator_key(&self) -> bool {
        self.operator.is_some()
    }

    /// Set the operator's key; refused when it is a node's key too.
    pub fn set_operator(&mut self, key: Secret) -> Result<(), String> {
        if self.nodes.iter().any(|(_, k)| *k == key) {
            return Err("the operator key is also a node's key".to_owned());
        }
        self.operator = Some(key);
        Ok(())
    }

    /// Who the request with `headers` acts as.
    pub fn caller(&self, headers: &HeaderMap) -> Caller {
        let presented = bearer(headers);
        let mut found = None;
        // Every key is compared, whatever matched: the time taken does not
        // say which node a key belongs to, nor how far down the list.
        for (node, key) in &self.nodes {
            if presented.is_some_and(|p| key.is(p)) {
                found = Some(node);
            }
        }
        let operator = self
            .operator
            .as_ref()
            .is_some_and(|key| presented.is_some_and(|p| key.is(p)));
        match (found, operator) {
            (Some(node), _) => Caller::Node(node.clone()),
            (None, true) => Caller::Operator,
            (None, false) if self.nodes.is_empty() => Caller::Anyone,
            (None, false) => Caller::Unknown,
        }
    }

    /// Whether the request may use the operator endpoints: with an
    /// operator key, only by presenting it; without one, only when nodes
    /// have no keys (the open, loopback-only demo).
    pub fn operator_allowed(&self, caller: &Caller) -> Result<(), Denied> {
        match (&self.operator, caller) {
            (Some(_), Caller::Operator) => Ok(()),
            (Some(_), Caller::Node(_)) => Err(Denied::NotYou),
            (Some(_), _) => Err(Denied::Unauthorized),
            (None, _) if self.nodes.is_empty() => Ok(()),
            (None, _) => Err(Denied::NoOperatorKey),
        }
    }

    /// Whether the request may act as `node`.
    pub fn acts_as(&self, caller: &Caller, node: &str) -> Result<(), Denied> {
        match caller {
            Caller::Anyone => Ok(()),
            Caller::Node(id) if id == node => Ok(()),
            Caller::Node(_) | Caller::Operator => Err(Denied::NotYou),
            Caller::Unknown => Err(Denied::Unauthorized),
        }
    }
}

/// Why a request may not do what it asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No key, or one that is nobody's: 401.
    Unauthorized,
    /// A node's key, for another node: 403.
    NotYou,
    /// Node keys, but no operator key configured: the operator endpoints
    /// are off (403).
    NoOperatorKey,
}

/// The key in `Authorization: Bearer KEY` (the scheme in any case, as
/// RFC 9110 says it is case-insensitive).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        // Two credentials: which one acts is ambiguous, so neither does.
        return None;
    }
    let bytes = value.as_bytes();
    let (scheme, key) = bytes.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(header::AUTHORIZATION, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_key_acts_as_its_node_and_nothing_else_does() {
        let alice = Secret::new("alice-key-0123456789", "key").unwrap();
        let bob = Secret::new("bob-key-0123456789ab", "key").unwrap();
        let mut access = Access::new(vec![("alice".into(), alice), ("bob".into(), bob)]);
        access
            .set_operator(Secret::new("operator-key-0123456", "key").unwrap())
            .unwrap();
        let alice = Caller::Node("alice".into());
        assert_eq!(
            access.caller(&headers(&["Bearer alice-key-0123456789"])),
            alice
        );
        assert_eq!(
            access.caller(&headers(&["bearer alice-key-0123456789"])),
            alice
        );
        assert_eq!(
            access.caller(&headers(&["Bearer operator-key-0123456"])),
            Caller::Operator
        );
        for unknown in [
            &[][..],
            &["Bearer alice-key-012345678"],
            &["Basic alice-key-0123456789"],
            &["Bearer alice-key-0123456789", "Bearer alice-key-0123456789"],
        ] {
            assert_eq!(
                access.caller(&headers(unknown)),
                Caller::Unknown,
                "{unknown:?}"
            );
        }
        assert_eq!(access.acts_as(&alice, "alice"), Ok(()));
        assert_eq!(access.acts_as(&alice, "bob"), Err(Denied::NotYou));
        assert_eq!(access.operator_allowed(&alice), Err(Denied::NotYou));
        assert_eq!(
            access.operator_allowed(&Caller::Unknown),
            Err(Denied::Unauthorized)
        );
        assert_eq!(access.operator_allowed(&Caller::Operator), Ok(()));
    }

    #[test]
    fn keys_are_checked_and_never_printed() {
        assert!(Secret::new("short", "key").is_err());
        assert!(Secret::new("has a space in it here", "key").is_err());
        let key = Secret::new("  a-long-enough-key-123\n", "key").unwrap();
        assert_eq!(format!("{key:?}"), "<redacted>");
        assert!(key.is(b"a-long-enough-key-123"));
    }
}
