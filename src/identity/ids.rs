//! The dynamic ids: a fresh ULID per request, and ids that stay the same for
//! the layer's lifetime.

use std::fmt;

use http::HeaderValue;
use parking_lot::Mutex;
use ulid::{Generator, ULID_LEN, Ulid};

/// The ids an [`IdentityHeaderLayer`](super::IdentityHeaderLayer) sends that
/// stay the same for its lifetime (and across every clone of it and of its
/// services).
///
/// Each is a random ULID made when the layer is built, unless pinned with
/// [`with_client_id`](super::IdentityHeaderLayer::with_client_id) and its
/// siblings (to keep one client id across restarts, say).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct StableIds {
    /// The client id.
    pub client: Ulid,
    /// The project id.
    pub project: Ulid,
    /// The session id.
    pub session: Ulid,
}

impl StableIds {
    /// Fresh random ids.
    pub(super) fn random() -> Self {
        Self {
            client: Ulid::generate(),
            project: Ulid::generate(),
            session: Ulid::generate(),
        }
    }
}

impl fmt::Debug for StableIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StableIds")
            .field("client", &format_args!("{}", self.client))
            .field("project", &format_args!("{}", self.project))
            .field("session", &format_args!("{}", self.session))
            .finish()
    }
}

/// The stable ids as header values, made once.
#[derive(Clone, Debug)]
pub(super) struct StableValues {
    pub(super) ids: StableIds,
    pub(super) client: HeaderValue,
    pub(super) project: HeaderValue,
    pub(super) session: HeaderValue,
}

impl StableValues {
    pub(super) fn new(ids: StableIds) -> Self {
        Self {
            ids,
            client: ulid_value(ids.client),
            project: ulid_value(ids.project),
            session: ulid_value(ids.session),
        }
    }
}

/// Makes request ids: ULIDs, strictly increasing within the layer, even
/// within one millisecond.
pub(super) struct RequestIds(Mutex<Generator>);

impl RequestIds {
    pub(super) fn new() -> Self {
        Self(Mutex::new(Generator::new()))
    }

    /// The next request id.
    pub(super) fn next(&self) -> Ulid {
        let mut generator = self.0.lock();
        match generator.generate() {
            Ok(ulid) => ulid,
            // 2^80 ids in one millisecond: borrow the next millisecond, which
            // keeps the order.
            Err(overflow) => overflow.commit_overflow_increment(),
        }
    }

    /// The next request id, as a header value.
    pub(super) fn next_value(&self) -> HeaderValue {
        ulid_value(self.next())
    }
}

impl fmt::Debug for RequestIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestIds")
    }
}

/// A ULID as a header value: 26 Crockford base-32 characters.
pub(super) fn ulid_value(ulid: Ulid) -> HeaderValue {
    let mut buf = [0u8; ULID_LEN];
    let text = ulid.array_to_str(&mut buf);
    // Crockford base-32 is always a valid header value; the fallback is never
    // taken and only keeps this free of a panic path.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}
