//! Health for a load balancer or an orchestrator: `GET /healthz` (the
//! process is up: always 200) and `GET /readyz` (ready to serve: 200, or
//! 503 with the reason).
//!
//! Both are answered before any route work and outside every limit (the
//! routes' and the operator endpoints'), so a saturated gateway still
//! says it is alive. The gateway serves only once its configuration
//! loaded, so readiness is about what it depends on: with a Redis store in
//! fail-closed mode (`[store] on_error = "closed"`), every request is
//! refused while Redis does not answer, so the gateway is not ready then.
//! Redis is asked with one `PING` at most every [`CHECK_EVERY`], however
//! often the probe comes; in fail-open mode a Redis outage degrades the
//! limits but not the service, and `/readyz` stays 200.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::Serialize;

use crate::gateway::Gateway;

/// The most often `/readyz` asks Redis.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Response {
    ([(header::CACHE_CONTROL, "no-store")], "ok\n").into_response()
}

/// What `/readyz` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// Whether the gateway can serve.
    pub ready: bool,
    /// Why not, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /readyz`: 200 when ready, 503 with the reason otherwise.
pub async fn readyz(State(gateway): State<Gateway>) -> Response {
    let readiness = gateway.readiness().await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        Json(readiness),
    )
        .into_response()
}

/// What readiness depends on, and its last answer.
#[derive(Default)]
pub struct Dependencies {
    /// A store in fail-closed mode, which every request needs.
    #[cfg(feature = "redis")]
    needed: Option<tower_throttle::redis::RedisStore>,
    /// When Redis was last asked, and what it said (`None`: it answered).
    last: Mutex<Option<(Instant, Option<String>)>>,
    /// One check at a time: the others take the last answer.
    checking: tokio::sync::Mutex<()>,
}

impl Dependencies {
    /// Readiness depends on `store` when it fails closed.
    #[cfg(feature = "redis")]
    pub fn on(store: Option<&tower_throttle::redis::RedisStore>) -> Self {
        use tower_throttle::redis::OnError;
        Self {
            needed: store.filter(|s| s.error_mode() == OnError::Closed).cloned(),
            ..Self::default()
        }
    }

    /// Ready, or why not.
    pub async fn readiness(&self) -> Readiness {
        let problem = self.problem().await;
        Readiness {
            ready: problem.is_none(),
            reason: problem,
        }
    }

    async fn problem(&self) -> Option<String> {
        let fresh = |last: &Option<(Instant, Option<String>)>| {
            last.as_ref()
                .filter(|(at, _)| at.elapsed() < CHECK_EVERY)
                .map(|(_, problem)| problem.clone())
        };
        if let Some(problem) = fresh(&self.last.lock()) {
            return problem;
        }
        let _one = self.checking.lock().await;
        if let Some(problem) = fresh(&self.last.lock()) {
            return problem;
        }
        let problem = self.ask().await;
        *self.last.lock() = Some((Instant::now(), problem.clone()));
        problem
    }

    async fn ask(&self) -> Option<String> {
        #[cfg(feature = "redis")]
        if let Some(store) = &self.needed {
            return store.check().await.err().map(|e| {
                format!(
                    "the Redis store does not answer and fails closed: {}",
                    e.reason
                )
            });
        }
        None
    }
}
