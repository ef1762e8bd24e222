//! The HTTP API: routes, the checks before the limits, and the answers.
//!
//! Where nodes have keys, a request acts as the node whose key it presents
//! (`auth`): without one it gets 401; a message `from` another node, or
//! another node's inbox or turn, 403 `not_permitted`; `/reset` and `/stats`
//! need the operator's key.
//!
//! `POST /send` refuses, in this order, consuming nothing: no key (401), a
//! body that is not a message (400), a sender that is not the key's node
//! (403 `not-the-sender`), an id that cannot name a node (403
//! `unaddressable-node-id`), a message to oneself (403 `self-send`), a
//! receiver in none of the sender's projects (403 `cross-project`); then
//! the limits refuse (429, fan-out before pair); then a full inbox (409
//! `target_busy`, which gives back what the limits took).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tower::ServiceExt;
use tower_throttle::clock::ManualClock;
use tower_throttle::error::{ConfigError, RateLimited};

use crate::auth::{Caller, Denied};
use crate::flow::{self, Flow, Settings};
use crate::inbox::{Deliver, Delivery, Inboxes, Message};
use crate::projects::{Directory, addressable};
use crate::stats::{Counters, Refusal};

/// The largest `POST /send` body read (413 beyond).
pub const MAX_BODY: usize = 64 * 1024;

/// Everything the handlers share.
#[derive(Debug)]
struct Shared {
    directory: Directory,
    inboxes: Arc<Inboxes>,
    flow: Flow,
    counters: Counters,
}

/// The service, to route requests to.
#[derive(Clone, Debug)]
pub struct App(Arc<Shared>);

impl App {
    /// The service for `directory` under `settings`; `clock` replaces the
    /// limits' default clock (for tests).
    pub fn new(
        directory: Directory,
        settings: &Settings,
        clock: Option<ManualClock>,
    ) -> Result<Self, ConfigError> {
        let inboxes = Arc::new(Inboxes::new(&directory));
        let flow = flow::build(settings, Deliver(inboxes.clone()), clock)?;
        Ok(Self(Arc::new(Shared {
            directory,
            inboxes,
            flow,
            counters: Counters::default(),
        })))
    }

    /// The routes as served on `listen`: behind the programs' shared edge
    /// checks (`serving::edge`), so that a web page the operator opens can
    /// neither rebind a name to this service (421) nor post into or read
    /// and empty inboxes from another site (403).
    pub fn router_on(self, listen: SocketAddr) -> Router {
        self.router().layer(axum::middleware::from_fn(
            move |req: Request, next: Next| edge_guard(listen, req, next),
        ))
    }

    /// The routes, without the edge checks (for tests and for embedding
    /// behind checks of one's own; [`App::router_on`] is what runs).
    pub fn router(self) -> Router {
        Router::new()
            .route("/", get(index))
            .route("/send", post(send).layer(DefaultBodyLimit::max(MAX_BODY)))
            .route("/nodes/{id}/inbox", get(inbox))
            .route("/nodes/{id}/turn", post(turn))
            .route("/reset", post(reset))
            .route("/stats", get(stats))
            .with_state(self)
    }

    /// Who may act as which node.
    pub fn access(&self) -> &crate::auth::Access {
        &self.0.directory.access
    }

    /// The limits and their handles.
    #[allow(dead_code)] // for the tests, which look at the limiters' state
    pub fn flow(&self) -> &Flow {
        &self.0.flow
    }
}

/// `POST /send`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    from: String,
    to: String,
    text: String,
}

async fn index() -> Response {
    Json(json!({
        "service": "agent_messaging",
        "routes": [
            "POST /send {\"from\":ID,\"to\":ID,\"text\":TEXT}",
            "GET /nodes/{id}/inbox",
            "POST /nodes/{id}/turn",
            "POST /reset",
            "GET /stats",
        ],
    }))
    .into_response()
}

async fn send(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let app = &app.0;
    let caller = app.directory.access.caller(&headers);
    if caller == Caller::Unknown {
        app.counters.refused(Refusal::Unauthorized);
        return denied(Denied::Unauthorized, "");
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            // Too large (413), or cut short: answered in JSON like the rest.
            app.counters.refused(Refusal::Malformed);
            let status = rejection.status();
            let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "payload_too_large"
            } else {
                "bad_request"
            };
            return error(
                status,
                json!({"code": code, "message": rejection.body_text()}),
            );
        }
    };
    let body: SendBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            app.counters.refused(Refusal::Malformed);
            return error(
                StatusCode::BAD_REQUEST,
                json!({"code": "bad_request", "message": format!("not a message: {e}")}),
            );
        }
    };
    // Not about rate: refused before the limits, taking nothing.
    let refusal = if app.directory.access.acts_as(&caller, &body.from).is_err() {
        Err(Refusal::NotTheSender)
    } else if !addressable(&body.from) || !addressable(&body.to) {
        Err(Refusal::Unaddressable)
    } else if body.from == body.to {
        Err(Refusal::SelfSend)
    } else {
        app.directory
            .shared_project(&body.from, &body.to)
            .ok_or(Refusal::CrossProject)
    };
    let project = match refusal {
        Ok(project) => Arc::from(project),
        Err(refusal) => {
            app.counters.refused(refusal);
            return error(
                StatusCode::FORBIDDEN,
                json!({"code": "not_permitted", "reason": refusal.as_str()}),
            );
        }
    };
    let message = Message {
        from: Arc::from(body.from),
        to: Arc::from(body.to),
        project,
        text: body.text,
    };
    match app.flow.service.clone().oneshot(message).await {
        Ok(Delivery::Delivered(id)) => {
            app.counters.delivered();
            Json(json!({"delivered": true, "id": id})).into_response()
        }
        Ok(Delivery::Busy) => {
            app.counters.refused(Refusal::Busy);
            error(StatusCode::CONFLICT, json!({"code": "target_busy"}))
        }
        Err(e) => match e.downcast_ref::<RateLimited>() {
            Some(limited) => rate_limited(&app.counters, limited),
            None => {
                tracing::error!(error = %e, "delivery failed");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({"code": "internal"}),
                )
            }
        },
    }
}

/// A 429 naming the limit, with the wait in milliseconds (rounded up) and
/// in `Retry-After` (whole seconds, rounded up).
fn rate_limited(counters: &Counters, limited: &RateLimited) -> Response {
    let limit = limited.limit.as_deref().unwrap_or("unknown");
    counters.refused(if limit == flow::PAIR {
        Refusal::Pair
    } else {
        Refusal::FanOut
    });
    let wait = limited.retry_after;
    let millis = wait.as_nanos().div_ceil(1_000_000);
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        json!({"code": "rate_limited", "limit": limit, "retry_after_ms": millis}),
    );
    let secs = wait.as_nanos().div_ceil(1_000_000_000).max(1);
    if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

async fn inbox(State(app): State<App>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let access = &app.0.directory.access;
    if let Err(why) = access.acts_as(&access.caller(&headers), &id) {
        return denied(why, "not-your-inbox");
    }
    match app.0.inboxes.drain(&id) {
        Some(messages) => Json(json!({"messages": messages})).into_response(),
        None => unknown_node(),
    }
}

async fn turn(State(app): State<App>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let access = &app.0.directory.access;
    // A node's own turn only: nobody refills another's fan-out.
    if let Err(why) = access.acts_as(&access.caller(&headers), &id) {
        return denied(why, "not-your-turn");
    }
    if app.0.directory.node(&id).is_none() {
        return unknown_node();
    }
    // This sender's turn only: nobody else's budget is touched.
    app.0.flow.turns.new_turn(&[id.as_str()]);
    StatusCode::NO_CONTENT.into_response()
}

async fn reset(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Some(refused) = operator(&app, &headers) {
        return refused;
    }
    app.0.flow.turns.reset_all();
    app.0.flow.pairs.reset_all();
    StatusCode::NO_CONTENT.into_response()
}

async fn stats(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Some(refused) = operator(&app, &headers) {
        return refused;
    }
    let app = &app.0;
    // Idle state (a pair whose interval is over, a turn unused or gone
    // stale) is dropped here, not left in and skipped: what is counted is
    // what is held.
    app.flow.pairs.evict_idle();
    app.flow.turns.evict_idle();
    let mut body = app.counters.snapshot();
    body["live"] = json!({
        "pairs": app.flow.pairs.key_count(),
        "turns": app.flow.turns.key_count(),
    });
    body["inboxes"] = json!({"waiting": app.inboxes.waiting()});
    Json(body).into_response()
}

/// The answer refusing the request the operator endpoints, if it may not
/// use them.
fn operator(app: &App, headers: &HeaderMap) -> Option<Response> {
    let access = &app.0.directory.access;
    access
        .operator_allowed(&access.caller(headers))
        .err()
        .map(|why| denied(why, "operator-only"))
}

/// 401 (with `WWW-Authenticate`), or 403 `not_permitted` with `reason`
/// (`no-operator-key` when the operator endpoints are off).
fn denied(why: Denied, reason: &str) -> Response {
    match why {
        Denied::Unauthorized => {
            let mut response = error(StatusCode::UNAUTHORIZED, json!({"code": "unauthorized"}));
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Denied::NotYou => error(
            StatusCode::FORBIDDEN,
            json!({"code": "not_permitted", "reason": reason}),
        ),
        Denied::NoOperatorKey => error(
            StatusCode::FORBIDDEN,
            json!({"code": "not_permitted", "reason": "no-operator-key"}),
        ),
    }
}

fn unknown_node() -> Response {
    error(StatusCode::NOT_FOUND, json!({"code": "unknown_node"}))
}

/// `{"error": detail}` with `status`. serde_json escapes every string it
/// writes, so user text in it (a parse error quoting a field name) cannot
/// break out.
/// The edge checks of every request, answered in this service's error
/// shape; nothing of the request is echoed.
async fn edge_guard(listen: SocketAddr, req: Request, next: Next) -> Response {
    match serving::edge::check(&req, Some(listen), &[], &[]) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            tracing::debug!("refused at the edge: {refusal}");
            error(refusal.status(), json!({ "code": refusal.code() }))
        }
    }
}

fn error(status: StatusCode, detail: serde_json::Value) -> Response {
    (status, Json(json!({ "error": detail }))).into_response()
}

/// The limits in force, for the banner.
pub fn describe(settings: &Settings) -> String {
    format!(
        "one message per (sender, receiver) every {}; {} per sender per turn, a turn ending \
         by itself after {}",
        humantime::format_duration(settings.pair_interval),
        settings.fan_out,
        humantime::format_duration(settings.turn_stale),
    )
}
