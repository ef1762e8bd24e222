//! The innermost service: the request as hyper sends it, to the upstream
//! over plain HTTP or the provider's HTTPS client, its answer counted.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::Service;
use tower_throttle::backoff::announced_limits;
use tower_throttle::error::BoxError;
use tower_throttle::redact::{Escaped, Quoted};

use super::callers::WaitMark;
use super::{Route, UpstreamCounters};
use crate::access_log::{Reached, UpstreamSaid};
use crate::config::Credential;
use crate::learn::Learner;
use crate::tls::{UpstreamTls, Via};

/// The provider's API key, riding in the request's extensions to the
/// innermost service, which alone puts it in a header.
#[derive(Clone)]
pub(super) struct Outbound(pub(super) Credential);

impl fmt::Debug for Outbound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Outbound(<redacted>)")
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The innermost service: adds the API key, hands the request to hyper,
/// counts the answer.
#[derive(Clone)]
pub struct Upstream {
    pub(super) client: HttpClient,
    pub(super) counters: Arc<UpstreamCounters>,
    pub(super) learned: Arc<Learner>,
    /// Put what each answer states of the upstream's limits in its
    /// extensions, for the access log.
    pub(super) log_limits: bool,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

/// The plain-HTTP client requests to http:// upstreams go out through
/// (https:// ones go through their provider's client, see `tls`).
pub(super) fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(10)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

impl Service<http::Request<Bytes>> for Upstream {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's pooled client is always ready; it connects per request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Bytes>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let route = parts.extensions.get::<Route>().cloned();
        if let Some(Outbound(credential)) = parts.extensions.remove::<Outbound>() {
            parts.headers.insert(credential.header, credential.value);
        }
        let https = parts.extensions.remove::<Via>();
        if let Some(mark) = parts.extensions.remove::<WaitMark>() {
            mark.sent();
        }
        let req = http::Request::from_parts(parts, Full::new(body));
        let future = match https {
            Some(Via(client)) => client.request(req),
            None => self.client.request(req),
        };
        let counters = self.counters.clone();
        let learned = self.learned.clone();
        let log_limits = self.log_limits;
        let reached = Reached(Instant::now());
        Box::pin(async move {
            let mut result = future.await;
            if let (Some(route), Ok(response)) = (&route, &result) {
                learned.observe(route, response.headers());
            }
            if let Ok(response) = &mut result {
                if log_limits {
                    let said = announced_limits(response.headers(), SystemTime::now());
                    response.extensions_mut().insert(UpstreamSaid(said));
                }
                response.extensions_mut().insert(reached);
            }
            counters.record(route.as_ref(), result.as_ref().ok().map(|r| r.status()));
            // hyper's body, boxed as is: frames still pass one by one.
            result.map(|r| r.map(Body::new)).map_err(|e| {
                if let Some(tls) = UpstreamTls::find(&e) {
                    let provider = route.as_ref().map(|r| &*r.provider).unwrap_or_default();
                    tracing::warn!(
                        provider = %Quoted(provider),
                        error = %Quoted(&Escaped(&tls.to_string()).to_string()),
                        "upstream TLS handshake failed; is its certificate trusted (ca_file)?"
                    );
                    return Box::new(tls) as BoxError;
                }
                let route = route.map(|r| r.to_string()).unwrap_or_default();
                let error = error_chain(&e);
                tracing::warn!(
                    route = %Quoted(&route.to_string()),
                    error = %Quoted(&Escaped(&error).to_string()),
                    "upstream request failed"
                );
                Box::new(e) as BoxError
            })
        })
    }
}

/// An error and its sources, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
