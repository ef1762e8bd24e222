//! The gateway's callers (`[[clients]]`): who sent a request, by the key
//! it carries in `Authorization: Bearer` or `x-api-key`, compared in
//! constant time; the key's header is taken off before forwarding.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use parking_lot::Mutex;
use serde::Serialize;
use subtle::ConstantTimeEq;

use tower_throttle::error::{BoxError, KeyError};
use tower_throttle::key::{KeyBuilder, KeyExtractor};
use tower_throttle::rate_limit::Counts;
use tower_throttle::respond::{Refused, Rejection};

use super::build::UNREACHABLE;
use crate::access_log::Reached;
use crate::config::Client;
use crate::reply::{ErrorCode, json_error};

/// The name of requests without a client key.
pub const ANONYMOUS: &str = "anonymous";

/// Who sent a request, in its response's extensions (for the access log),
/// with its counters.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The client's name (never its key).
    pub name: Arc<str>,
    pub counters: Arc<Counters>,
    /// Its share of a saturated route, in turns (`[[clients]] weight`).
    pub weight: u32,
}

/// One client's counters.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    admitted: AtomicU64,
    refused_client: AtomicU64,
    refused_route: AtomicU64,
    /// Requests in the gateway not yet sent upstream (see [`WaitMark`]).
    waiting: AtomicU64,
    /// Tokens its answers said they used.
    tokens: AtomicU64,
}

/// A request of a client counted as waiting, in the request's extensions,
/// until [`WaitMark::sent`] (it goes upstream) or until it is dropped
/// (refused, or its caller left); once, however often it was cloned.
#[derive(Clone, Debug)]
pub struct WaitMark(Arc<Marked>);

#[derive(Debug)]
struct Marked {
    counters: Arc<Counters>,
    done: AtomicBool,
}

impl WaitMark {
    /// Count one more request of `counters` waiting.
    pub fn new(counters: Arc<Counters>) -> Self {
        counters.waiting.fetch_add(1, Ordering::Relaxed);
        Self(Arc::new(Marked {
            counters,
            done: AtomicBool::new(false),
        }))
    }

    /// The request goes upstream: it waits no more.
    pub fn sent(&self) {
        self.0.end();
    }

    /// The counters of the request's client.
    pub fn counters(&self) -> Arc<Counters> {
        self.0.counters.clone()
    }
}

impl Marked {
    fn end(&self) {
        if !self.done.swap(true, Ordering::Relaxed) {
            self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        self.end();
    }
}

impl Counters {
    /// One of its answers used `tokens`.
    pub fn used(&self, tokens: u32) {
        self.tokens.fetch_add(u64::from(tokens), Ordering::Relaxed);
    }

    /// What became of one of its requests, from its answer's extensions:
    /// sent upstream, refused by its own quota, or by the route's limits.
    pub fn answered(&self, extensions: &http::Extensions) {
        let counter = match extensions.get::<Refused>() {
            Some(refused) if refused.limit.as_deref() == Some(CLIENT_LIMIT) => &self.refused_client,
            Some(_) => &self.refused_route,
            None if extensions.get::<Reached>().is_some() => &self.admitted,
            None => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The name of the clients' own limit, in refusals.
pub const CLIENT_LIMIT: &str = "client";

/// Counters per client since start, kept across reloads.
#[derive(Debug, Default)]
pub struct CallerCounts(Mutex<HashMap<Arc<str>, Arc<Counters>>>);

impl CallerCounts {
    fn counter(&self, name: &Arc<str>) -> Arc<Counters> {
        self.0.lock().entry(name.clone()).or_default().clone()
    }
}

/// One client's requests, for `/stats` and `/metrics`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CallerStats {
    /// The client's name (`anonymous` for requests without a key).
    pub name: String,
    /// Requests it sent to the gateway's routes.
    pub requests: u64,
    /// Of those, sent upstream.
    pub admitted: u64,
    /// Refused by its own quota.
    pub refused_client: u64,
    /// Refused by the routes' limits (rate, queue, cooldown).
    pub refused_route: u64,
    /// In the gateway now, not yet sent upstream (waiting for a route's
    /// turn, rate or permit).
    pub waiting: u64,
    /// Tokens its answers said they used, on the endpoints that answer
    /// with usage, when a quota counts tokens.
    pub tokens: u64,
}

/// The clients of one configuration.
pub struct Callers {
    /// Keys by their keyed hash: a lookup's time does not depend on how
    /// much of a key a guess got right; the key itself is then compared
    /// in constant time.
    by_hash: HashMap<u64, Vec<(usize, Vec<u8>)>>,
    hasher: RandomState,
    names: Vec<Arc<str>>,
    weights: Vec<u32>,
    counts: Vec<Arc<Counters>>,
    anonymous: Arc<Counters>,
    require: bool,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callers")
            .field("names", &self.names)
            .field("require", &self.require)
            .finish_non_exhaustive()
    }
}

/// What a request's headers say of its caller.
pub enum Identified {
    /// A configured client.
    Client(Caller),
    /// No client key (and none is required), with the anonymous counters.
    Anonymous(Arc<Counters>),
    /// Refused: 401.
    Refused(Response<Body>),
}

impl Callers {
    /// The callers of `clients`, counting into `counts`.
    pub fn new(clients: &[Client], require: bool, counts: &CallerCounts) -> Self {
        let hasher = RandomState::new();
        let mut by_hash: HashMap<u64, Vec<(usize, Vec<u8>)>> = HashMap::new();
        for (i, client) in clients.iter().enumerate() {
            for key in &client.keys {
                let hash = hash_of(&hasher, key);
                by_hash.entry(hash).or_default().push((i, key.clone()));
            }
        }
        let names: Vec<Arc<str>> = clients.iter().map(|c| c.name.clone()).collect();
        Self {
            counts: names.iter().map(|n| counts.counter(n)).collect(),
            anonymous: counts.counter(&Arc::from(ANONYMOUS)),
            by_hash,
            hasher,
            names,
            weights: clients.iter().map(|c| c.weight).collect(),
            require,
        }
    }

    /// Who sent a request with `headers`.
    pub fn identify(&self, headers: &HeaderMap) -> Identified {
        if self.names.is_empty() {
            return Identified::Anonymous(self.anonymous.clone());
        }
        let mut presented = false;
        for (_, key) in presented_keys(headers) {
            presented = true;
            if let Some(i) = self.find(key) {
                let counters = self.counts[i].clone();
                counters.requests.fetch_add(1, Ordering::Relaxed);
                return Identified::Client(Caller {
                    name: self.names[i].clone(),
                    counters,
                    weight: self.weights[i],
                });
            }
        }
        if !self.require {
            self.anonymous.requests.fetch_add(1, Ordering::Relaxed);
            return Identified::Anonymous(self.anonymous.clone());
        }
        let (code, message) = if presented {
            (
                "unknown_key",
                "the key is not one of this gateway's clients' keys",
            )
        } else {
            (
                "missing_key",
                "this gateway needs a client key: Authorization: Bearer KEY, or x-api-key: KEY",
            )
        };
        let mut refused = json_error(StatusCode::UNAUTHORIZED, code, message);
        refused
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Identified::Refused(refused)
    }

    /// Take off every header of `headers` that carries a client's key
    /// (a request may send its key both ways): none goes upstream.
    pub fn strip_keys(&self, headers: &mut HeaderMap) {
        let carrying: Vec<HeaderName> = presented_keys(headers)
            .filter(|(_, key)| self.find(key).is_some())
            .map(|(name, _)| name)
            .collect();
        for name in carrying {
            headers.remove(name);
        }
    }

    fn find(&self, key: &[u8]) -> Option<usize> {
        let candidates = self.by_hash.get(&hash_of(&self.hasher, key))?;
        let mut found = None;
        for (i, known) in candidates {
            if bool::from(known.as_slice().ct_eq(key)) {
                found = Some(*i);
            }
        }
        found
    }

    /// Requests by client, the anonymous ones last.
    pub fn stats(&self) -> Vec<CallerStats> {
        self.names
            .iter()
            .zip(&self.counts)
            .map(|(name, n)| (name.to_string(), n))
            .chain((!self.names.is_empty()).then(|| (ANONYMOUS.to_owned(), &self.anonymous)))
            .map(|(name, n)| CallerStats {
                name,
                requests: n.requests.load(Ordering::Relaxed),
                admitted: n.admitted.load(Ordering::Relaxed),
                refused_client: n.refused_client.load(Ordering::Relaxed),
                refused_route: n.refused_route.load(Ordering::Relaxed),
                waiting: n.waiting.load(Ordering::Relaxed),
                tokens: n.tokens.load(Ordering::Relaxed),
            })
            .collect()
    }
}

fn hash_of(hasher: &RandomState, key: &[u8]) -> u64 {
    let mut h = hasher.build_hasher();
    h.write(key);
    h.finish()
}

/// The token of `Authorization: Bearer TOKEN` (the scheme in any case).
pub fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then_some(rest.trim_ascii())
}

/// The keys a request presents: `Authorization: Bearer KEY` (the scheme in
/// any case), then `x-api-key: KEY`, with the header each came in.
fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = (HeaderName, &[u8])> {
    let bearer = bearer_token(headers).map(|key| (header::AUTHORIZATION, key));
    let api_key = headers.get("x-api-key").map(|v| {
        (
            HeaderName::from_static("x-api-key"),
            v.as_bytes().trim_ascii(),
        )
    });
    bearer.into_iter().chain(api_key)
}

/// Keys a request by its caller's name (`anonymous` without one), for the
/// clients' own quotas and their turns in a route's line.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientKey;

impl<B> KeyExtractor<http::Request<B>> for ClientKey {
    fn extract(&self, req: &http::Request<B>, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let caller = req.extensions().get::<Caller>();
        key.push_str(caller.map_or(ANONYMOUS, |caller| &*caller.name));
        // Its share of a route it waits on with others (the fair lines).
        key.set_weight(caller.map_or(1, |caller| caller.weight));
        Ok(())
    }
}

/// Keys a request by its caller's name and its route's model, for the
/// clients' quotas per model pattern (`[[clients.models]]`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientModelKey;

impl<B> KeyExtractor<http::Request<B>> for ClientModelKey {
    fn extract(&self, req: &http::Request<B>, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        ClientKey.extract(req, key)?;
        let route = req
            .extensions()
            .get::<super::Route>()
            .ok_or_else(|| tower_throttle::error::MissingKey::new("route"))?;
        key.push_str(&route.model);
        Ok(())
    }
}

/// A client's quota counts a request the routes' limits did not refuse:
/// refused there, it gives back what it took (all or nothing, as if both
/// were judged at once).
#[derive(Clone, Copy, Debug, Default)]
pub struct PassedRoute;

impl<B> Counts<http::Response<B>, BoxError> for PassedRoute {
    fn counts(&self, outcome: &Result<http::Response<B>, BoxError>) -> bool {
        match outcome {
            Err(e) => Rejection::of(e).is_none(),
            // Not sent (no connection, no TLS session): a fallback sends it
            // to another deployment, where it is counted again.
            Ok(answer) => !matches!(
                answer.extensions().get::<ErrorCode>(),
                Some(ErrorCode(c)) if *c == UNREACHABLE || *c == "upstream_tls"
            ),
        }
    }
}
