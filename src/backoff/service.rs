//! `Backoff429`: refuses or holds requests to a route that is cooling down.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::cooldown::{Admit, Cooldowns};
use super::future::ResponseFuture;
use super::handle::BackoffHandle;
use crate::error::{BoxError, KeyError};
use crate::home::Home;
use crate::key::{KeyExtractor, KeyHash, key_label};
use crate::parts::ResponseParts;
use crate::redact::Escaped;

/// Everything a backoff service reads per request, shared by its clones.
pub(crate) struct Shared<X> {
    pub(crate) engine: Arc<Cooldowns>,
    /// Where handles find `engine` (see [`Home`]).
    pub(crate) home: Home<Cooldowns>,
    pub(crate) extractor: Arc<X>,
    pub(crate) max_wait: Duration,
    pub(crate) fallback: Option<(KeyHash, Arc<str>)>,
}

impl<X> Clone for Shared<X> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            home: self.home.clone(),
            extractor: self.extractor.clone(),
            max_wait: self.max_wait,
            fallback: self.fallback.clone(),
        }
    }
}

impl<X> fmt::Debug for Shared<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff429")
            .field("cooldowns", &self.engine)
            .field("extractor", &std::any::type_name::<X>())
            .field("max_wait", &self.max_wait)
            .field("fallback", &self.fallback.as_ref().map(|(_, key)| key))
            .finish()
    }
}

impl<X> Shared<X> {
    /// `req`'s key as it may be shown, for errors, stats and the cooldown
    /// list (secret parts as fingerprints).
    fn key_text<R>(&self, req: &R) -> Arc<str>
    where
        X: KeyExtractor<R>,
    {
        match (key_label(&*self.extractor, req), &self.fallback) {
            (Ok(label), _) => Arc::from(label),
            (Err(_), Some((_, key))) => Arc::from(Escaped(key).to_string()),
            (Err(e), None) => Arc::from(e.wanted()),
        }
    }
}

/// Cools routes down after upstream 429s; made by
/// [`Backoff429Layer`](super::Backoff429Layer).
pub struct Backoff429<S, X> {
    inner: S,
    shared: Arc<Shared<X>>,
}

impl<S, X> Backoff429<S, X> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<X>>) -> Self {
        Self { inner, shared }
    }

    inner_service_accessors!(inner: S);

    /// A handle on the cooldowns this service shares with its clones.
    pub fn handle(&self) -> BackoffHandle {
        BackoffHandle::new(self.shared.home.cell())
    }
}

impl<S: Clone, X> Clone for Backoff429<S, X> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, X> fmt::Debug for Backoff429<S, X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff429")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

impl<S, R, X> Service<R> for Backoff429<S, X>
where
    S: Service<R> + Clone,
    S::Error: Into<BoxError>,
    S::Response: ResponseParts,
    X: KeyExtractor<R>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let shared = &*self.shared;
        if !shared.engine.is_enabled() {
            // Switched off: not even the key is looked at, nor the response.
            return ResponseFuture::passed(self.inner.call(req));
        }
        let key = match shared.engine.seed().hash(&*shared.extractor, &req) {
            Ok(key) => key,
            // Only a missing key takes the fallback; an ambiguous one is
            // refused.
            Err(e) => match (&e, &shared.fallback) {
                (KeyError::Missing(_), Some((key, _))) => *key,
                _ => return ResponseFuture::failed(no_key(e)),
            },
        };
        #[cfg(feature = "redis")]
        if let Some(store) = &shared.engine.store {
            let store = store.clone();
            return self.call_remote(req, key, store);
        }
        let text = || shared.key_text(&req);
        match shared.engine.admit(key, shared.max_wait, &text) {
            Admit::Go(watch) => ResponseFuture::called(self.inner.call(req), watch),
            Admit::Wait(slot, head) => {
                // The ready inner service goes with the waiting request; this
                // service keeps a fresh clone, to be polled ready again.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::waiting(inner, req, slot, head)
            }
            Admit::Refused(error) => ResponseFuture::failed(Box::new(error)),
        }
    }
}

#[cfg(feature = "redis")]
impl<S, X> Backoff429<S, X> {
    /// A request on a route whose cooldown is shared: read it from Redis
    /// first, then decide as in process.
    #[inline(never)]
    fn call_remote<R>(
        &mut self,
        req: R,
        key: KeyHash,
        store: crate::redis::RedisStore,
    ) -> ResponseFuture<S::Future, S, R>
    where
        S: Service<R> + Clone,
        X: KeyExtractor<R>,
    {
        let shared = &*self.shared;
        let parts = match (
            crate::key::key_parts(&*shared.extractor, &req),
            &shared.fallback,
        ) {
            (Ok(parts), _) => parts,
            (Err(_), Some((_, fallback))) => vec![fallback.to_string()],
            // Refused by `call` already.
            (Err(e), None) => return ResponseFuture::failed(no_key(e)),
        };
        let name = super::redis::route_key(&store, &parts);
        let text = shared.key_text(&req);
        let read = {
            let (store, name) = (store.clone(), name.clone());
            Box::pin(async move { super::redis::read(&store, &name).await })
        };
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::reading(Box::new(super::future::Reading {
            read,
            started: tokio::time::Instant::now(),
            inner: Some(inner),
            req: Some(req),
            key,
            text,
            max_wait: shared.max_wait,
            engine: shared.engine.clone(),
            route: Some(Box::new((store, name, Duration::ZERO))),
        }))
    }
}

fn no_key(e: KeyError) -> BoxError {
    tracing::debug!(error = %e, "backoff: request has no usable key");
    e.into_box()
}
