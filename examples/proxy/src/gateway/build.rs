//! The client stack for a configuration: its providers resolved, the
//! stateful layers' clones layered with the configured waits and queues.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, StatusCode};
use http::uri::{Authority, Scheme};
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;
use tower_throttle::concurrency::ConcurrencyBody;
use tower_throttle::error::{BoxError, ConfigError};
use tower_throttle::fair::PassTurnLayer;
use tower_throttle::identity::IdentityHeaderLayer;
use tower_throttle::rate_limit::{Limits, RateLimitInfo};
use tower_throttle::redact::Quoted;
use tower_throttle::respond::{RateLimitHeaders, Rejection, ThrottleResponseLayer};

use super::callers::Callers;
use super::deploy::Dispatch;
use super::{Current, Layers, Target, Upstream};
use crate::config::{Settings, Upstream as UpstreamKind};
use crate::live;
use crate::reply::json_error;
use crate::tls::{HttpsClient, TlsClients, UpstreamTls};
use hyper_util::client::legacy::Error as ClientError;

/// Resolve the providers and layer the client stack for `settings`.
pub(super) fn build(
    layers: &Layers,
    upstream: &Upstream,
    tls: &TlsClients,
    simulator: Option<SocketAddr>,
    settings: Settings,
    generation: u64,
) -> Result<Current, ConfigError> {
    let mut targets = Vec::new();
    let mut https = https_clients(tls, &settings)?.into_iter();
    for (i, p) in settings.providers.iter().enumerate() {
        let (scheme, authority, base_path) = match &p.upstream {
            UpstreamKind::Http {
                authority,
                base_path,
            } => (Scheme::HTTP, authority.clone(), base_path.clone()),
            UpstreamKind::Https {
                authority,
                base_path,
                ..
            } => (Scheme::HTTPS, authority.clone(), base_path.clone()),
            UpstreamKind::Simulator => {
                let addr = simulator.ok_or_else(|| {
                    ConfigError::new(
                        format!("providers[{i}].base_url"),
                        "the simulator is not running; a new [simulator] section takes effect on restart",
                    )
                })?;
                let authority = Authority::try_from(addr.to_string()).map_err(|_| {
                    ConfigError::new(format!("providers[{i}].base_url"), "bad simulator address")
                })?;
                (Scheme::HTTP, authority, String::new())
            }
        };
        let (https, insecure) = match &p.upstream {
            UpstreamKind::Https { tls, .. } => (https.next(), tls.insecure_skip_verify),
            _ => (None, false),
        };
        targets.push(Target {
            name: p.name.clone(),
            scheme,
            https,
            authority,
            base_path,
            credential: p.credential.clone(),
            default: p.default,
            kind: p.kind,
            anthropic_version: p.anthropic_version.clone(),
            limit_headers: p.limit_headers,
            usage_format: p.usage_format,
            aliases: p.aliases.clone(),
            rewrite_model: p.rewrite_model,
            api_version: p.api_version.clone(),
            insecure,
        });
    }
    let rate_wait = settings
        .stack
        .rate_limit
        .as_ref()
        .map_or(Duration::ZERO, |l: &Limits| l.max_wait);
    // The long-lived layers, with this configuration's line and waits.
    let concurrency = match &settings.stack.concurrency {
        Some(c) => c
            .configure(layers.concurrency.clone())
            .map_err(|e| e.within("concurrency"))?,
        None => layers.concurrency.clone().with_max_queue(usize::MAX),
    };
    let backoff_wait = settings
        .stack
        .backoff
        .as_ref()
        .map_or(Duration::ZERO, |b| b.wait());
    let identity = identity_layer(layers, &settings)?;

    let rate = layers.rate.clone().with_max_wait(rate_wait);
    let backoff = layers.backoff.clone().with_max_wait(backoff_wait);
    let service = ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .layer(layers.clients.clone())
        .layer(layers.client_models.clone())
        .map_result(finish)
        .layer(backoff)
        .layer(concurrency)
        // Waiting for the route's rate, clients take turns (see `Layers`);
        // without clients, every request is in one lane, and the route's
        // line stays the rate limiter's own (judged exactly at arrival).
        .option_layer(
            (!rate_wait.is_zero() && !settings.clients.is_empty())
                .then(|| {
                    let fair = layers.fair.clone();
                    fair.map(|fair| fair.with_max_wait(rate_wait).with_name("route"))
                })
                .flatten(),
        )
        .layer(rate)
        .layer(PassTurnLayer::new())
        .layer(identity)
        .timeout(settings.gateway.upstream_timeout)
        .service(upstream.clone());
    let dispatch = Dispatch::new(&settings.routes, &layers.deploy);
    let callers = Callers::new(
        &settings.clients,
        settings.gateway.require_client_key,
        &layers.callers,
    );
    Ok(Current {
        dispatch,
        callers,
        // The routes' quotas, or a client's own.
        counts_tokens: crate::config::counts_tokens(settings.stack.rate_limit.as_ref())
            || settings
                .clients
                .iter()
                .flat_map(|c| c.quotas.iter().chain(c.models.iter().flat_map(|(_, q)| q)))
                .any(|q| q.unit() == tower_throttle::rate_limit::Unit::Cost),
        settings: Arc::new(settings),
        targets,
        service: BoxCloneSyncService::new(service),
        generation,
    })
}

/// The HTTPS client of each https provider of `settings`, in order. A
/// provider that skips verification is warned about here: at start and on
/// every reload.
fn https_clients(tls: &TlsClients, settings: &Settings) -> Result<Vec<HttpsClient>, ConfigError> {
    settings.check_insecure()?;
    let mut wanted = Vec::new();
    for p in &settings.providers {
        if let UpstreamKind::Https { tls, .. } = &p.upstream {
            if tls.insecure_skip_verify {
                tracing::warn!(
                    provider = %Quoted(&p.name),
                    "insecure_skip_verify = true: this provider's TLS certificate is NOT checked; \
                     anyone on the path can read and change its traffic, API key included. \
                     For tests only"
                );
            }
            wanted.push(tls);
        }
    }
    tls.clients_for(&wanted)
        .map_err(|m| ConfigError::new("providers", m))
}

/// The identity layer for `settings`, keeping the ids of the first one
/// unless the file pins its own. Rebuilt on every reload, so its rules are
/// live; with the master switch off it has no rule, so it touches nothing.
fn identity_layer(
    layers: &Layers,
    settings: &Settings,
) -> Result<IdentityHeaderLayer, ConfigError> {
    // Checked even when off, so that a bad rule is refused either way.
    let configured = settings.stack.identity_layer()?;
    let mut layer = match configured {
        Some(layer) if live::enabled(settings) => layer,
        _ => IdentityHeaderLayer::new([]).map_err(|e| e.within("identity"))?,
    };
    let mut stable = layers.stable.lock();
    match *stable {
        None => *stable = Some(layer.stable_ids()),
        Some(ids) => {
            let pinned = settings.stack.identity.as_ref().map(|c| &c.stable_ids);
            if pinned.is_none_or(|p| p.client.is_none()) {
                layer = layer.with_client_id(ids.client);
            }
            if pinned.is_none_or(|p| p.project.is_none()) {
                layer = layer.with_project_id(ids.project);
            }
            if pinned.is_none_or(|p| p.session.is_none()) {
                layer = layer.with_session_id(ids.session);
            }
        }
    }
    Ok(layer)
}

/// Responses to the client's body type; failures that are not the layers'
/// refusals (those become 429/503 in `ThrottleResponseLayer`) to 502/504.
fn finish(
    result: Result<Response<ConcurrencyBody<Body>>, BoxError>,
) -> Result<Response<Body>, BoxError> {
    match result {
        Ok(mut response) => {
            if let Some(info) = response.extensions_mut().remove::<RateLimitInfo>() {
                RateLimitHeaders::ietf().write(
                    response.headers_mut(),
                    &info.policy,
                    info.quota.as_ref(),
                    info.remaining,
                    info.reset,
                );
            }
            Ok(response.map(Body::new))
        }
        Err(e) if Rejection::of(&e).is_some() => Err(e),
        Err(e) if e.is::<UpstreamTls>() => Ok(json_error(
            StatusCode::BAD_GATEWAY,
            "upstream_tls",
            &format!("{e}; the gateway's log names the provider"),
        )),
        Err(e) if e.is::<tower::timeout::error::Elapsed>() => Ok(json_error(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "the upstream did not answer within upstream_timeout",
        )),
        // No connection: nothing was sent (a fallback may send it again).
        Err(e)
            if e.downcast_ref::<ClientError>()
                .is_some_and(ClientError::is_connect) =>
        {
            Ok(json_error(
                StatusCode::BAD_GATEWAY,
                UNREACHABLE,
                "the upstream could not be reached",
            ))
        }
        // The connection failed once the request may have gone out.
        Err(_) => Ok(json_error(
            StatusCode::BAD_GATEWAY,
            "upstream_failed",
            "the connection to the upstream failed before its answer",
        )),
    }
}

/// The code of an answer the gateway gave because no connection to the
/// upstream could be made: the request was not sent.
pub(super) const UNREACHABLE: &str = "upstream_unreachable";
