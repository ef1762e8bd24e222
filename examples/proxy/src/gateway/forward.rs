//! The router, and the handler that forwards a request: its provider from
//! the path, its model from the body, its headers made fit to send, then the
//! client stack.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode, Uri, header};
use axum::routing::{get, post};
use bytes::Bytes;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::error::{ConfigError, KeyError};
use tower_throttle::key::key_parts;
use tower_throttle::rate_limit::Settlement;
use tower_throttle::redact::Quoted;
use tower_throttle::respond::ThrottleResponseLayer;

use super::callers::{Caller, Identified, WaitMark};
use super::upstream::Outbound;
use super::{Current, Gateway, NO_MODEL, Route, Target, deploy};
use crate::access_log::{Reached, Waited};
use crate::preset::{self, Kind};
use crate::reply::json_error;
use crate::tls::Via;
use crate::usage::{self, Tally, UsageBody};
use crate::{access_log, admin, edge, health, multipart, operator, stats};

/// Request headers a client may carry an API key in: removed when the
/// gateway sends its own (`Authorization` for OpenAI and most others,
/// `x-api-key` for Anthropic, `api-key` for Azure OpenAI).
const CLIENT_CREDENTIALS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];

/// Anthropic's API version header.
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// Request headers that concern one connection, not the request.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Drop hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests and answers carry none: one pass over the names
    // (standard ones compare as a tag) finds that, where a removal of each
    // of the eight would hash every name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// The router: the stats endpoints, the live page, and everything else
/// forwarded.
pub fn router(gateway: Gateway) -> Result<Router, ConfigError> {
    let operator = Router::new()
        .route("/", get(stats::page))
        // Browsers ask for it with the page; it is not the upstream's.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/stats", get(operator::get_stats))
        .route("/stats/reset", post(operator::reset))
        .route("/events", get(stats::events))
        .route("/metrics", get(stats::metrics))
        // Each view is built from every route's counters: hammered, they
        // would take the CPU the forwarded requests need (429 beyond).
        .route_layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(operator::rate_limit()?),
        )
        // With clients, only the operator (see `admin`).
        .route_layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            admin::guard,
        ));
    // Health first and outside every limit: a saturated gateway is alive.
    let health = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz));
    let app = operator
        .merge(health)
        .fallback(forward)
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            edge::guard,
        ));
    // Outermost: the edge's refusals are logged too.
    let app = match gateway.access_log() {
        Some(log) => app.layer(axum::middleware::from_fn_with_state(
            log.clone(),
            access_log::record,
        )),
        None => app,
    };
    Ok(app.with_state(gateway))
}

/// The provider for `path` and where in `path` the path to send it
/// begins (0 for the default provider's unprefixed paths), or `None`.
fn target_for<'t>(targets: &'t [Target], path: &str) -> Option<(&'t Target, usize)> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let first = trimmed.split('/').next().unwrap_or_default();
    if let Some(t) = targets.iter().find(|t| &*t.name == first) {
        let rest_at = path.len() - trimmed.len() + first.len();
        return Some((t, rest_at));
    }
    targets.iter().find(|t| t.default).map(|t| (t, 0))
}

async fn forward(State(gateway): State<Gateway>, req: Request<Body>) -> Response<Body> {
    let current = gateway.current();
    let (mut parts, body) = req.into_parts();
    // Who sends it; the gateway key's header never goes upstream.
    let (caller, counters) = match current.callers.identify(&parts.headers) {
        Identified::Client(caller) => {
            current.callers.strip_keys(&mut parts.headers);
            // For the clients' quotas (`ClientKey`).
            parts.extensions.insert(caller.clone());
            let counters = caller.counters.clone();
            (Some(caller), counters)
        }
        Identified::Anonymous(counters) => (None, counters),
        Identified::Refused(refused) => return refused,
    };
    // Waiting until it goes upstream (`Upstream` says so) or is answered.
    parts.extensions.insert(WaitMark::new(counters.clone()));
    let mut response = forward_read(&gateway, &current, parts, body).await;
    counters.answered(response.extensions());
    if let Some(caller) = caller {
        response.extensions_mut().insert(caller);
    }
    response
}

/// The request, its body read, to its provider or its route's deployment.
async fn forward_read(
    gateway: &Gateway,
    current: &Current,
    parts: http::request::Parts,
    body: Body,
) -> Response<Body> {
    if let Some(problem) = edge::path_problem(parts.uri.path()) {
        return json_error(StatusCode::BAD_REQUEST, "bad_path", problem);
    }
    let by_path = target_for(&current.targets, parts.uri.path());
    // An unprefixed path may name a `[[routes]]` model in its body: known
    // once the body is read.
    let may_route = !current.dispatch.is_empty() && by_path.is_none_or(|(_, rest_at)| rest_at == 0);
    if by_path.is_none() && !may_route {
        return no_provider(current);
    }
    let max_body = current.settings.gateway.max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large(max_body);
    }
    if let Some(problem) = edge::encoding_problem(&parts.headers) {
        return json_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "bad_encoding", problem);
    }
    let body = match edge::read_body(gateway, body, &current.settings.gateway).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    if !body.is_empty() && !matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        // No provider's API gives these a body: forwarded, the upstream
        // could act on a model the limiter never read.
        return json_error(
            StatusCode::BAD_REQUEST,
            "body_not_allowed",
            "a request of this method carries no body through the gateway",
        );
    }
    if may_route {
        let model = model_in(gateway, &body);
        if let Some(route) = model.and_then(|m| current.dispatch.route(&m)) {
            return deploy::send(gateway, current, route, parts, body).await;
        }
    }
    let Some((target, rest_at)) = by_path else {
        return no_provider(current);
    };
    send(gateway, current, target, rest_at, parts, body).await
}

/// The model a JSON body names, if it names one plainly.
fn model_in(gateway: &Gateway, body: &Bytes) -> Option<String> {
    let probe = http::Request::new(body.clone());
    key_parts(&gateway.inner.model_key, &probe).ok()?.pop()
}

fn no_provider(current: &Current) -> Response<Body> {
    let names: Vec<&str> = current.targets.iter().map(|t| &*t.name).collect();
    json_error(
        StatusCode::NOT_FOUND,
        "no_provider",
        &format!(
            "no provider for this path; use /PROVIDER/... with one of: {}",
            names.join(", ")
        ),
    )
}

/// Send a read request to `target`: the part of its path from `rest_at`
/// under the provider's base path, its model resolved, through the client
/// stack.
pub(super) async fn send(
    gateway: &Gateway,
    current: &Current,
    target: &Target,
    rest_at: usize,
    mut parts: http::request::Parts,
    body: Bytes,
) -> Response<Body> {
    // `/PROVIDER` alone is the provider's base path.
    let rest = match &parts.uri.path()[rest_at..] {
        "" => "/",
        rest => rest,
    };
    let path_and_query = match (parts.uri.query(), &target.api_version) {
        // A client's own api-version is kept: its body is written for it.
        (Some(q), Some(v)) if !has_param(q, "api-version") => {
            format!("{}{rest}?{q}&api-version={v}", target.base_path)
        }
        (Some(q), _) => format!("{}{rest}?{q}", target.base_path),
        (None, Some(v)) => format!("{}{rest}?api-version={v}", target.base_path),
        (None, None) => format!("{}{rest}", target.base_path),
    };
    let uri = Uri::builder()
        .scheme(target.scheme.clone())
        .authority(target.authority.clone())
        .path_and_query(path_and_query)
        .build();
    let Ok(uri) = uri else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "the request path cannot be forwarded",
        );
    };
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    if target.credential.is_some() {
        // The gateway's key alone goes upstream: a client's key for
        // another provider never leaves, and none can stand in for it.
        for name in &CLIENT_CREDENTIALS {
            headers.remove(name);
        }
    }
    if let Some(version) = &target.anthropic_version {
        // The client's own version wins: its body is written for it.
        headers
            .entry(ANTHROPIC_VERSION)
            .or_insert_with(|| version.clone());
    }
    let mut out = http::Request::new(body);
    if let Some(caller) = parts.extensions.get::<Caller>() {
        out.extensions_mut().insert(caller.clone());
    }
    // The client's counters, for the tokens its answer used.
    let client_counters = parts.extensions.get::<WaitMark>().map(WaitMark::counters);
    if let Some(mark) = parts.extensions.remove::<WaitMark>() {
        out.extensions_mut().insert(mark);
    }
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.headers_mut() = headers;
    // Only these carry a body (see above), so only these name a model.
    let reads_body = matches!(out.method(), &Method::POST | &Method::PUT | &Method::PATCH);
    // On an Azure deployment path the deployment is the model, whatever
    // the body says (Azure serves what is deployed under that name).
    let deployment = match target.kind {
        Kind::AzureOpenAi => preset::deployment(out.uri().path()).map(str::to_owned),
        _ => None,
    };
    let multipart = multipart::boundary(out.headers());
    let named = match key_parts(&gateway.inner.model_key, &out) {
        _ if deployment.is_some() => deployment,
        _ if !reads_body => None,
        // A form (an audio file to transcribe): its `model` field, read as
        // strictly as JSON's.
        _ if multipart.is_some() => {
            let read = match multipart {
                Some(Ok(boundary)) => multipart::model(out.body().clone(), boundary).await,
                Some(Err(problem)) => Err(problem),
                None => Ok(None),
            };
            match read {
                Ok(model) => model,
                Err(multipart::Problem::Ambiguous) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "ambiguous_body",
                        "the form has more than one model field",
                    );
                }
                Err(multipart::Problem::Malformed(e)) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "bad_multipart",
                        &format!("the form cannot be read: {e}"),
                    );
                }
            }
        }
        Ok(mut parts) => parts.pop(),
        // The limiter could count another model than the upstream serves.
        Err(KeyError::Ambiguous(e)) => {
            return json_error(StatusCode::BAD_REQUEST, "ambiguous_body", &e.to_string());
        }
        Err(_) => None,
    };
    if let Some(problem) = named.as_deref().and_then(edge::model_problem) {
        return json_error(StatusCode::BAD_REQUEST, "bad_model", problem);
    }
    // Counted under the model the upstream serves; the body goes as sent
    // unless the provider rewrites it to name that model.
    let model = match (reads_body, target.aliases.resolve(named.as_deref())) {
        (true, Some(resolved)) => {
            if target.rewrite_model && named.as_deref() != Some(&**resolved) {
                if let Some(body) = preset::rewrite_model(out.body(), resolved) {
                    *out.body_mut() = body;
                }
            }
            resolved.clone()
        }
        _ => Arc::from(named.as_deref().unwrap_or(NO_MODEL)),
    };
    let route = Route {
        provider: target.name.clone(),
        model,
    };
    out.extensions_mut().insert(route.clone());
    gateway.handles().learned.prepare(&route);
    if let Some(credential) = &target.credential {
        out.extensions_mut().insert(Outbound(credential.clone()));
    }
    // Charged its estimate, settled by its answer's usage: only on the
    // endpoints that answer with one (a file upload is not a prompt).
    let answers_usage = target
        .kind
        .endpoint(out.uri().path())
        .is_some_and(|e| e.usage);
    let settlement = (current.counts_tokens && reads_body && answers_usage).then(|| {
        let settlement = Settlement::new();
        let estimate = usage::estimate(out.body());
        out.extensions_mut().insert(estimate);
        out.extensions_mut().insert(settlement.clone());
        settlement
    });
    // A stream of OpenAI's shape reports its usage only when asked: asked
    // on the client's behalf, and the chunk taken out of what it receives.
    let mut unasked = false;
    if settlement.is_some() && target.kind.streams_usage_on_request(out.uri().path()) {
        if let Some(body) = usage::ask_for_usage(out.body()) {
            *out.body_mut() = body;
            unasked = true;
        }
    }
    if let Some(client) = &target.https {
        out.extensions_mut().insert(Via(client.clone()));
    }
    let method = out.method().clone();
    let called = Instant::now();
    let response = match current.service.clone().oneshot(out).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (mut parts, mut body) = response.into_parts();
    // For the access log: the route, and how long the layers held it.
    if let Some(&Reached(at)) = parts.extensions.get::<Reached>() {
        parts
            .extensions
            .insert(Waited(at.saturating_duration_since(called)));
    }
    parts.extensions.insert(route.clone());
    strip_hop_by_hop(&mut parts.headers);
    // Only an answer the upstream gave; a refusal or an error of the
    // gateway's own reports no usage, and its request was not admitted.
    if let Some((settlement, charged)) = settlement.and_then(|s| s.charged().map(|c| (s, c))) {
        if unasked {
            // The chunk taken out makes the answer shorter than it said.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let counters = gateway.inner.counters.clone();
        let settled = route.clone();
        let tally = Tally::new(move |used| {
            // What the answer said it used: a gateway error, or an answer
            // without usage, used nothing it can count.
            if let (Some(client), Some(used)) = (&client_counters, used) {
                client.used(used);
            }
            counters.settled(&settled, charged, used);
        });
        body = Body::new(UsageBody::new(
            body,
            &parts.headers,
            settlement,
            tally,
            unasked,
        ));
    }
    tracing::debug!(
        route = %Quoted(&route.to_string()),
        %method,
        status = parts.status.as_u16(),
        "forwarded"
    );
    Response::from_parts(parts, body)
}

/// Whether query `q` has parameter `name` (as written: a client that
/// encodes the name differently gets one added, which Azure refuses
/// loudly rather than guessing).
fn has_param(q: &str, name: &str) -> bool {
    q.split('&')
        .any(|pair| pair.split('=').next() == Some(name))
}

fn too_large(max: usize) -> Response<Body> {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        &edge::too_large_message(max),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            );
        }
        map
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut map = headers(&[
            ("content-type", "application/json"),
            ("connection", "keep-alive, X-Hop-Secret"),
            ("connection", "close"),
            ("x-hop-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("x-kept", "2"),
        ]);
        strip_hop_by_hop(&mut map);
        let left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type", "x-kept"]);
    }

    #[test]
    fn a_hop_by_hop_header_alone_is_dropped_and_the_rest_kept() {
        for hop in ["te", "transfer-encoding", "proxy-connection", "trailer"] {
            let mut map = headers(&[("accept", "*/*"), ("user-agent", "sdk")]);
            map.insert(
                HeaderName::from_static(hop),
                http::HeaderValue::from_static("x"),
            );
            strip_hop_by_hop(&mut map);
            let left: Vec<&str> = map.keys().map(HeaderName::as_str).collect();
            assert_eq!(left, ["accept", "user-agent"], "{hop}");
        }
        let mut plain = headers(&[("accept", "*/*"), ("x-a", "1")]);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 2);
    }
}
