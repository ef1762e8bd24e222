//! The operator's endpoints beside `/stats`: one route's stats with the wait
//! a request would have now (`GET /stats?route=PROVIDER/MODEL`), and
//! zeroing every counter (`POST /stats/reset`).
//!
//! The route is the client's text: it is percent-decoded, checked like a
//! model name in a request body (no control or invisible characters, at
//! most `MAX_MODEL_LEN` bytes), must name a configured provider, and is only
//! answered for a route counted by name (configured, or answered by the
//! upstream); any other gets 404. It is never echoed back.

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;
use percent_encoding::percent_decode_str;
use serde::Serialize;
use tower_throttle::error::ConfigError;
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::stats::KeyStats;

use crate::edge;
use crate::gateway::{Gateway, Route};
use crate::reply::json_error;
use crate::stats::{self, RouteStats};

/// What the operator endpoints (`/`, `/stats`, `/events`, `/metrics`)
/// answer in all, whoever asks: 50 a second, in bursts of 100. Far above
/// a dashboard's or a scraper's needs, far below what would starve the
/// forwarded requests of CPU; refused with 429 beyond.
pub fn rate_limit() -> Result<RateLimitLayer<GlobalKey>, ConfigError> {
    let quota = Quota::per_second(50)?.with_burst(100)?;
    Ok(RateLimitLayer::new(quota, GlobalKey))
}

/// One route's stats, and how long a request to it would wait now.
#[derive(Clone, Debug, Serialize)]
pub struct OneRoute {
    /// What each layer did with the route's requests.
    #[serde(flatten)]
    pub stats: RouteStats,
    /// How long a request arriving now would wait for its rate-limit turn,
    /// in milliseconds (0: it would go at once); nothing is booked to find
    /// out.
    pub peek_wait_ms: f64,
}

/// `GET /stats`: every route, or with `?route=PROVIDER/MODEL` one.
pub async fn get_stats(
    State(gateway): State<Gateway>,
    RawQuery(query): RawQuery,
) -> Response<Body> {
    let route = match query.as_deref().map(route_param).transpose() {
        Ok(route) => route.flatten(),
        Err(problem) => return json_error(StatusCode::BAD_REQUEST, "bad_route", problem),
    };
    match route {
        Some(route) => one_route(&gateway, &route),
        None => stats::json(State(gateway)).await,
    }
}

/// The `route` parameter of a query string, percent-decoded: `None` when
/// there is none; an error when it is given twice or does not decode.
fn route_param(query: &str) -> Result<Option<String>, &'static str> {
    let mut found = None;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "route" {
            continue;
        }
        if found.is_some() {
            // Which one would be meant is a guess: refuse.
            return Err("`route` is given more than once");
        }
        let value = value.replace('+', " ");
        let decoded = percent_decode_str(&value)
            .decode_utf8()
            .map_err(|_| "`route` is not UTF-8 once decoded")?;
        found = Some(decoded.into_owned());
    }
    Ok(found)
}

/// The answer for one route.
fn one_route(gateway: &Gateway, route: &str) -> Response<Body> {
    let Some((provider, model)) = route.split_once('/') else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_route",
            "`route` is PROVIDER/MODEL, e.g. sim/sim-small",
        );
    };
    if let Some(problem) = edge::model_problem(model) {
        return json_error(StatusCode::BAD_REQUEST, "bad_route", problem);
    }
    let providers = gateway.providers();
    let Some(provider) = providers.iter().find(|p| p.name == provider) else {
        return unknown();
    };
    // An alias is asked for as the route it is counted under.
    let current = gateway.current();
    let aliases = current
        .settings
        .providers
        .iter()
        .find(|p| *p.name == *provider.name)
        .map(|p| p.aliases.clone());
    let model = match aliases.as_deref().and_then(|a| a.resolve(Some(model))) {
        Some(resolved) => &**resolved,
        None => model,
    };
    let name = Route {
        provider: provider.name.as_str().into(),
        model: model.into(),
    }
    .to_string();
    if !gateway.tracked().contains(&name) {
        return unknown();
    }
    let snapshot = stats::snapshot(gateway, gateway.hub().borrow().seq);
    let stats = snapshot
        .routes
        .into_iter()
        .find(|r| r.route == name)
        .unwrap_or_else(|| blank(&provider.name, model, name));
    let wait = gateway
        .handles()
        .rate
        .peek_wait(&[provider.name.as_str(), model]);
    let body = OneRoute {
        stats,
        peek_wait_ms: wait.as_secs_f64() * 1e3,
    };
    // Plain data; serializing it cannot fail.
    let json = serde_json::to_string(&body).unwrap_or_else(|_| "{}".to_owned());
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

fn unknown() -> Response<Body> {
    json_error(
        StatusCode::NOT_FOUND,
        "unknown_route",
        "no stats are kept for this route: it is neither configured nor answered by its upstream",
    )
}

/// A counted route that has seen no request yet.
fn blank(provider: &str, model: &str, name: String) -> RouteStats {
    let counters = || {
        let mut stats = KeyStats::default();
        stats.key = name.clone();
        stats
    };
    RouteStats {
        provider: provider.to_owned(),
        model: model.to_owned(),
        rate_limit: counters(),
        concurrency: counters(),
        backoff: counters(),
        cooldown: None,
        upstream: Default::default(),
        learned: None,
        route: name.clone(),
    }
}

/// `POST /stats/reset`: zero every counter (the layers' and the upstream
/// answers'); what the limits decide by is untouched.
pub async fn reset(State(gateway): State<Gateway>) -> Response<Body> {
    let handles = gateway.handles();
    handles.rate.reset_stats();
    handles.concurrency.reset_stats();
    handles.backoff.reset_stats();
    gateway.counters().reset();
    tracing::info!("stats reset");
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"reset":true}"#,
    )
        .into_response()
}
