//! `IdentityHeader`: sets the matching rule's headers on each outbound request.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderMap;
use tower_service::Service;

use super::compile::{Compiled, Value};
use super::ids::{RequestIds, StableValues};
use super::matching::RuleSet;
use crate::parts::{RequestHeadersMut, RequestParts};
use crate::redact::Escaped;

/// What every service of one layer shares: the rules, the stable ids and the
/// request id generator.
pub(super) struct Shared {
    pub(super) rules: RuleSet,
    pub(super) stable: StableValues,
    pub(super) request_ids: RequestIds,
}

impl Clone for Shared {
    /// The same rules and stable ids, with a request id generator of its own
    /// (two generators copied from one state could hand out the same id).
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            stable: self.stable.clone(),
            request_ids: RequestIds::new(),
        }
    }
}

impl Shared {
    /// Set the headers of the first rule that matches `req`, if any.
    fn apply<R: RequestParts + RequestHeadersMut>(&self, req: &mut R) {
        let Some(rule) = self.rules.find(req).and_then(|i| self.rules.get(i)) else {
            return;
        };
        tracing::trace!(rule = %Escaped(&rule.label), "identity: rule applies");
        self.write(rule, RequestHeadersMut::headers_mut(req));
    }

    fn write(&self, rule: &Compiled, headers: &mut HeaderMap) {
        // Room for every write at once rather than growing on the way (one
        // write reserves its own room); if the map is at its size limit, the
        // writes below report it.
        if rule.writes.len() > 1 {
            let _ = headers.try_reserve(rule.writes.len());
        }
        for write in rule.writes.iter() {
            let mut value = match &write.value {
                Value::Fixed(value) => value.clone(),
                Value::RequestId => self.request_ids.next_value(),
                Value::ClientId => self.stable.client.clone(),
                Value::ProjectId => self.stable.project.clone(),
                Value::SessionId => self.stable.session.clone(),
            };
            if write.sensitive {
                value.set_sensitive(true);
            }
            let written = if write.append {
                headers.try_append(write.name.clone(), value).map(drop)
            } else {
                headers.try_insert(write.name.clone(), value).map(drop)
            };
            if written.is_err() {
                // `HeaderMap` holds at most 32,768 headers; never panic over it.
                tracing::warn!(
                    rule = %Escaped(&rule.label),
                    header = %write.name,
                    "identity: request has too many headers; header not set"
                );
            }
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityHeaders")
            .field("stable_ids", &self.stable.ids)
            .field("rules", &self.rules)
            .finish()
    }
}

/// Gives matching requests the identity of their rule, then calls the inner
/// service; made by [`IdentityHeaderLayer`](super::IdentityHeaderLayer).
///
/// Headers are set before the inner service is called, so the response
/// future is the inner service's own, and errors are passed through as they
/// are.
pub struct IdentityHeader<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> IdentityHeader<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    inner_service_accessors!(inner: S);
}

impl<S: Clone> Clone for IdentityHeader<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdentityHeader<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityHeader")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, R> Service<R> for IdentityHeader<S>
where
    S: Service<R>,
    R: RequestParts + RequestHeadersMut,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: R) -> Self::Future {
        self.shared.apply(&mut req);
        self.inner.call(req)
    }
}
