//! A fake provider on 127.0.0.1:0 that records every request it receives
//! (method, path, headers, body bytes) and answers it: with a canned JSON
//! body, or, once [`FakeUpstream::stream_next`] armed it, with a body the
//! test writes chunk by chunk.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::channel::mpsc;
use parking_lot::Mutex;

use testkit::local_server::Server;

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    /// Path and query.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// Every value of `name`, as text.
    pub fn values(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }
}

/// A streamed answer waiting for its request.
struct Armed {
    headers: Vec<(&'static str, &'static str)>,
    body: mpsc::UnboundedReceiver<Result<Bytes, Infallible>>,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    armed: Mutex<Option<Armed>>,
    answer: Mutex<Option<String>>,
    /// How long each canned answer takes.
    delay: Mutex<Duration>,
    /// Requests being answered now, and the most there ever were.
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

/// A running fake provider.
pub struct FakeUpstream {
    server: Server,
    shared: Arc<Shared>,
}

impl FakeUpstream {
    /// Start one answering `{"ok":true}` to everything.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(answer).with_state(shared.clone());
        Self {
            server: Server::start(app).await,
            shared,
        }
    }

    /// `http://127.0.0.1:PORT`, a provider's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Answer every request with `json` (status 200) from now on.
    pub fn answer_with(&self, json: &str) {
        *self.shared.answer.lock() = Some(json.to_owned());
    }

    /// Answer the next request with `headers` and a body that stays open
    /// until the returned sender is dropped; each chunk sent on it is one
    /// write.
    pub fn stream_next(
        &self,
        headers: Vec<(&'static str, &'static str)>,
    ) -> mpsc::UnboundedSender<Result<Bytes, Infallible>> {
        let (tx, body) = mpsc::unbounded();
        *self.shared.armed.lock() = Some(Armed { headers, body });
        tx
    }

    /// Take `delay` over each canned answer from now on.
    pub fn answer_after(&self, delay: Duration) {
        *self.shared.delay.lock() = delay;
    }

    /// The most requests it was ever answering at once.
    pub fn most_in_flight(&self) -> usize {
        self.shared.most_in_flight.load(Ordering::SeqCst)
    }

    /// Every request received so far, oldest first.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().clone()
    }

    pub async fn stop(self) {
        self.server.stop().await;
    }
}

async fn answer(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    shared.received.lock().push(Received {
        method: parts.method,
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    });
    if let Some(armed) = shared.armed.lock().take() {
        let mut response = Response::new(Body::from_stream(armed.body));
        for (name, value) in armed.headers {
            response
                .headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
        return response;
    }
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.most_in_flight.fetch_max(now, Ordering::SeqCst);
    let delay = *shared.delay.lock();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    let json = shared
        .answer
        .lock()
        .clone()
        .unwrap_or_else(|| r#"{"ok":true}"#.to_owned());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json))
        .unwrap_or_default()
}
