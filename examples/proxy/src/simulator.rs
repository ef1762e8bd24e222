//! A built-in upstream: an OpenAI-compatible `POST /v1/chat/completions`
//! (and `GET /v1/models`) that enforces its own limit per model, answering
//! 429 with `Retry-After` beyond it, and streams (`"stream": true`) as
//! server-sent events, one chunk every `stream_interval`.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::SimSettings;
use crate::edge;

/// What one model saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelCounts {
    /// The model.
    pub model: String,
    /// Requests that reached it (authorized, for a known model).
    pub received: u64,
    /// Answered 200 (streamed or not).
    pub answered: u64,
    /// Answered 429.
    pub refused: u64,
    /// Of the answered, streamed.
    pub streamed: u64,
}

struct ModelState {
    limit: u32,
    period: Duration,
    /// Admission instants within the last period, oldest first.
    log: VecDeque<Instant>,
    counts: ModelCounts,
}

struct Sim {
    settings: SimSettings,
    models: HashMap<String, Mutex<ModelState>>,
    /// Streams hold their last chunk while this is above zero.
    holds: watch::Sender<u32>,
    /// Requests refused for a missing or wrong key.
    unauthorized: Mutex<u64>,
    next_id: Mutex<u64>,
}

/// A running simulator.
pub struct Simulator {
    addr: SocketAddr,
    sim: Arc<Sim>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// While alive, streamed answers stop before their last chunk: a long
/// generation, for tests and demos.
#[allow(dead_code)] // built by the example's tests
pub struct StreamHold {
    holds: watch::Sender<u32>,
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.holds.send_modify(|n| *n = n.saturating_sub(1));
    }
}

// Some methods are for the example's tests.
#[allow(dead_code)]
impl Simulator {
    /// Listen on `settings.listen` and serve.
    pub async fn start(settings: SimSettings) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(settings.listen).await?;
        let addr = listener.local_addr()?;
        let models = settings
            .models
            .iter()
            .map(|m| {
                let state = ModelState {
                    limit: m.limit,
                    period: m.period,
                    log: VecDeque::new(),
                    counts: ModelCounts {
                        model: m.name.clone(),
                        ..ModelCounts::default()
                    },
                };
                (m.name.clone(), Mutex::new(state))
            })
            .collect();
        let sim = Arc::new(Sim {
            settings,
            models,
            holds: watch::Sender::new(0),
            unauthorized: Mutex::new(0),
            next_id: Mutex::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/models", get(list_models))
            .with_state(sim.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        // The gateway's serving code: capped, heads timed, so that its
        // port cannot take the process's file descriptors.
        let limits = sim.settings.serve;
        let task = tokio::spawn(crate::serve::serve(
            listener,
            app,
            limits,
            crate::serve::Connections::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Ok(Self {
            addr,
            sim,
            stop: Some(stop),
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A handle on its counters and stream holds.
    pub fn handle(&self) -> SimHandle {
        SimHandle(self.sim.clone())
    }

    /// What `model` saw.
    pub fn count(&self, model: &str) -> ModelCounts {
        self.handle().count(model)
    }

    /// Hold streamed answers before their last chunk until the guard drops.
    pub fn hold_streams(&self) -> StreamHold {
        self.handle().hold_streams()
    }

    /// Stop accepting, let answers finish (at most `grace`), and return.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Held streams would never end.
        self.sim.holds.send_replace(0);
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

/// The simulator's counters and stream holds; cheap to clone.
#[derive(Clone)]
pub struct SimHandle(Arc<Sim>);

// Some methods are for the example's tests.
#[allow(dead_code)]
impl SimHandle {
    /// What each model saw, in the order configured.
    pub fn counts(&self) -> Vec<ModelCounts> {
        let mut all: Vec<ModelCounts> = self
            .0
            .models
            .values()
            .map(|m| m.lock().counts.clone())
            .collect();
        let order = |name: &str| {
            self.0
                .settings
                .models
                .iter()
                .position(|m| m.name == name)
                .unwrap_or(usize::MAX)
        };
        all.sort_by_key(|c| order(&c.model));
        all
    }

    /// What `model` saw.
    pub fn count(&self, model: &str) -> ModelCounts {
        self.0
            .models
            .get(model)
            .map(|m| m.lock().counts.clone())
            .unwrap_or_default()
    }

    /// Requests refused with 401.
    pub fn unauthorized(&self) -> u64 {
        *self.0.unauthorized.lock()
    }

    /// Hold streamed answers before their last chunk until the guard drops.
    pub fn hold_streams(&self) -> StreamHold {
        self.0.holds.send_modify(|n| *n += 1);
        StreamHold {
            holds: self.0.holds.clone(),
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "code": code}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn list_models(State(sim): State<Arc<Sim>>) -> Response {
    let data: Vec<_> = sim
        .settings
        .models
        .iter()
        .map(|m| json!({"id": m.name, "object": "model", "owned_by": "simulator"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// A Go-style duration for the `x-ratelimit-reset-requests` header: `850ms`,
/// `1s`, `1m30s`.
fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        return format!("{}s", (secs * 1000.0).round() / 1000.0);
    }
    format!("{}m{}s", d.as_secs() / 60, d.as_secs() % 60)
}

/// The body, up to the configured limit (the gateway's): beyond it a JSON
/// 413 in the gateway's words, not axum's plain-text one at 2 MiB.
async fn read_body(sim: &Sim, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let max = sim.settings.max_body;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            edge::too_large_message(max),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, max).await.map_err(|e| {
        if edge::is_length_limit(&e) {
            too_large()
        } else {
            error(
                StatusCode::BAD_REQUEST,
                "bad_body",
                "the request body could not be read".to_owned(),
            )
        }
    })
}

async fn completions(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Body) -> Response {
    if let Some(key) = &sim.settings.api_key {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if sent != Some(key.as_str()) {
            *sim.unauthorized.lock() += 1;
            return error(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "Incorrect API key provided.".to_owned(),
            );
        }
    }
    let body = match read_body(&sim, &headers, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("We could not parse the JSON body of your request: {e}"),
            );
        }
    };
    let Some(model) = request.get("model").and_then(|m| m.as_str()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_model",
            "You must provide a model parameter.".to_owned(),
        );
    };
    let Some(state) = sim.models.get(model) else {
        return error(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("The model `{model}` does not exist."),
        );
    };
    let stream = request.get("stream").and_then(|s| s.as_bool()) == Some(true);
    // As OpenAI: a last chunk with the usage, when asked for.
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(|s| s.as_bool())
        == Some(true);
    let limit_headers = {
        let mut m = state.lock();
        m.counts.received += 1;
        let now = Instant::now();
        let period = m.period;
        while m
            .log
            .front()
            .is_some_and(|t| now.duration_since(*t) >= period)
        {
            m.log.pop_front();
        }
        if m.limit > 0 && m.log.len() >= m.limit as usize {
            m.counts.refused += 1;
            let wait = m
                .log
                .front()
                .map(|t| (*t + period).saturating_duration_since(now))
                .unwrap_or(period);
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let message = format!(
                "Rate limit reached for {model}: {} requests per {}. Please try again in {:.3}s.",
                m.limit,
                go_duration(period),
                wait.as_secs_f64()
            );
            drop(m);
            let body = json!({"error": {"message": message, "type": "requests", "code": "rate_limit_exceeded"}});
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    (header::CONTENT_TYPE, "application/json".to_owned()),
                    (header::RETRY_AFTER, secs.max(1).to_string()),
                    (
                        header::HeaderName::from_static("x-ratelimit-remaining-requests"),
                        "0".to_owned(),
                    ),
                    (
                        header::HeaderName::from_static("x-ratelimit-reset-requests"),
                        go_duration(wait),
                    ),
                ],
                body.to_string(),
            )
                .into_response();
        }
        m.log.push_back(now);
        m.counts.answered += 1;
        if stream {
            m.counts.streamed += 1;
        }
        (m.limit > 0).then(|| {
            let reset = m
                .log
                .front()
                .map(|t| (*t + period).saturating_duration_since(now))
                .unwrap_or(period);
            (m.limit, m.limit as usize - m.log.len(), reset)
        })
    };
    let id = {
        let mut n = sim.next_id.lock();
        *n += 1;
        format!("chatcmpl-sim-{n}")
    };
    if !sim.settings.latency.is_zero() {
        // (A zero sleep would still wait for the timer's next tick, 1 ms.)
        tokio::time::sleep(sim.settings.latency).await;
    }
    let mut response = if stream {
        stream_answer(&sim, id, model.to_owned(), include_usage)
    } else {
        let text = answer_text(model);
        let body = json!({
            "id": id,
            "object": "chat.completion",
            "created": unix_now(),
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }],
            "usage": usage(&text),
        });
        (
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    };
    if let Some((limit, remaining, reset)) = limit_headers {
        let h = response.headers_mut();
        for (name, value) in [
            ("x-ratelimit-limit-requests", limit.to_string()),
            ("x-ratelimit-remaining-requests", remaining.to_string()),
            ("x-ratelimit-reset-requests", go_duration(reset)),
        ] {
            if let Ok(value) = header::HeaderValue::try_from(value) {
                h.insert(header::HeaderName::from_static(name), value);
            }
        }
    }
    response
}

/// What an answer `text` reports as its usage: a prompt of 8 tokens, and a
/// token per word.
fn usage(text: &str) -> serde_json::Value {
    let words = text.split(' ').count();
    json!({"prompt_tokens": 8, "completion_tokens": words, "total_tokens": 8 + words})
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn answer_text(model: &str) -> String {
    format!(
        "This is a simulated answer from {model}, sent by the tower-throttle proxy's built-in upstream."
    )
}

/// The answer as `chat.completion.chunk` events: the role first, then the
/// words spread over `stream_chunks - 1` chunks, one every
/// `stream_interval`, a final chunk with the finish reason, with
/// `include_usage` a chunk with the usage and no choices, and `[DONE]`.
fn stream_answer(sim: &Arc<Sim>, id: String, model: String, include_usage: bool) -> Response {
    let chunks = sim.settings.stream_chunks.max(1) as usize;
    let interval = sim.settings.stream_interval;
    let words: Vec<String> = answer_text(&model)
        .split(' ')
        .map(|w| format!("{w} "))
        .collect();
    let per = words.len().div_ceil(chunks.saturating_sub(1).max(1));
    let parts: Vec<String> = words.chunks(per.max(1)).map(|c| c.concat()).collect();
    let mut holds = sim.holds.subscribe();
    let created = unix_now();
    let usage_chunk = include_usage.then(|| {
        let chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(&answer_text(&model)),
        });
        Bytes::from(format!("data: {chunk}\n\n"))
    });
    let event = move |delta: serde_json::Value, finish: Option<&str>| {
        let chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        Bytes::from(format!("data: {chunk}\n\n"))
    };
    let stream = async_stream(move |tx| async move {
        if tx
            .send(event(json!({"role": "assistant", "content": ""}), None))
            .await
            .is_err()
        {
            return;
        }
        for part in parts {
            tokio::time::sleep(interval).await;
            if tx
                .send(event(json!({"content": part}), None))
                .await
                .is_err()
            {
                return;
            }
        }
        // A held stream waits here, its permit upstream and downstream taken.
        let _ = holds.wait_for(|n| *n == 0).await;
        tokio::time::sleep(interval).await;
        let _ = tx.send(event(json!({}), Some("stop"))).await;
        if let Some(chunk) = usage_chunk {
            let _ = tx.send(chunk).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(stream)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A body fed by a task through a small channel: each chunk is sent as soon
/// as it is made. The task ends when the client goes away.
fn async_stream<F, Fut>(produce: F) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    tokio::spawn(produce(tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Body::from_stream(stream)
}
