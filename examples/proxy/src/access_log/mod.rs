//! The access log: one line per request (JSON lines or logfmt), to stderr
//! or to a file rotated by size, written by a thread of its own.
//!
//! Each line says when the request came, its route, method and path (never
//! its query), the status, how long it took and how long the layers held
//! it, its bytes, what the layers decided (forwarded, refused and by which
//! limit, or an error of the gateway's own), and the limits the upstream's
//! answer stated. It holds no header value a client sends, no body, no
//! key. `/healthz` and `/readyz` are not logged (a load balancer asks them
//! every second).
//!
//! ```toml
//! [gateway]
//! access_log = "/var/log/proxy/access.log"   # or "stderr"; no line without it
//! access_log_format = "json"                 # or "logfmt"
//! access_log_max_bytes = 104857600           # then renamed to access.log.1
//! access_log_sample = 0.1                    # forwarded requests; refusals and errors always
//! ```

mod body;
mod line;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::time::Instant;
use tower_throttle::backoff::Announcement;
use tower_throttle::respond::Refused;

pub use line::{Entry, Format, MAX_PATH};
pub use writer::{Destination, FLUSH_EVERY, QUEUE_LINES, Writer, rotated};

use crate::gateway::{Caller, Route};
use crate::reply::ErrorCode;

/// Default `access_log_max_bytes`: 100 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 100 << 20;

/// `[gateway] access_log*`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where the lines go.
    pub to: Destination,
    /// JSON or logfmt.
    pub format: Format,
    /// The share of forwarded and local requests logged, in (0, 1];
    /// refusals, errors and 5xx answers are always logged.
    pub sample: f64,
}

/// The running access log; cheap to clone.
#[derive(Clone, Debug)]
pub struct AccessLog {
    writer: Writer,
    format: Format,
    sample: f64,
    seen: Arc<AtomicU64>,
}

/// When the upstream was sent a request: put in its answer's extensions by
/// the innermost service.
#[derive(Clone, Copy, Debug)]
pub struct Reached(pub Instant);

/// How long the layers held a forwarded request.
#[derive(Clone, Copy, Debug)]
pub struct Waited(pub Duration);

/// What the upstream's answer stated of its limits.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamSaid(pub Announcement);

impl AccessLog {
    /// Open the destination and start its writer.
    pub fn start(settings: &Settings) -> std::io::Result<Self> {
        Ok(Self {
            writer: Writer::start(&settings.to)?,
            format: settings.format,
            sample: settings.sample,
            seen: Arc::default(),
        })
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.writer.dropped()
    }

    /// Wait until every line so far is written.
    pub async fn flush(&self) {
        self.writer.flush().await;
    }

    /// Whether this sampled request is written: spread evenly (every
    /// tenth at 0.1), not by chance, so a test and an operator can count.
    fn sampled(&self) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * self.sample).floor() > (n * self.sample).floor()
    }

    fn write(&self, entry: &Entry) {
        let always =
            matches!(entry.outcome, "refused" | "error" | "cancelled") || entry.status >= 500;
        if always || self.sampled() {
            self.writer.send(entry.line(self.format));
        }
    }
}

/// A request on its way to its answer: its line if it never gets one.
struct Unanswered(Option<Entry>, AccessLog, Instant, Arc<AtomicU64>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(mut entry) = self.0.take() {
            entry.latency_ms = line::millis(self.2.elapsed());
            entry.request_bytes = self.3.load(Ordering::Relaxed);
            self.1.write(&entry);
        }
    }
}

/// Middleware outside every other: the request's byte count, then, when
/// its answer's body ends or is dropped, its line.
pub async fn record(State(log): State<AccessLog>, req: Request, next: Next) -> Response {
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return next.run(req).await;
    }
    let received = Arc::new(AtomicU64::new(0));
    // Written as `cancelled` if the request is dropped before its answer
    // (the client left while it waited in a line, a reset stream).
    let mut waiting = Unanswered(
        Some(Entry {
            time: line::timestamp(SystemTime::now()),
            method: req.method().to_string(),
            path: line::cut_path(req.uri().path()),
            ..Entry::cancelled()
        }),
        log.clone(),
        Instant::now(),
        received.clone(),
    );
    let req = req.map(|b| Body::new(body::Counted::new(b, received.clone())));
    let response = next.run(req).await;
    let Some(Entry {
        time, method, path, ..
    }) = waiting.0.take()
    else {
        return response;
    };
    let started = waiting.2;
    let (parts, answer) = response.into_parts();
    let ext = &parts.extensions;
    let refused = ext.get::<Refused>();
    let error = ext.get::<ErrorCode>();
    let route = ext.get::<Route>();
    let outcome = match (refused, error, route) {
        (Some(_), _, _) => "refused",
        (None, Some(_), _) => "error",
        (None, None, Some(_)) => "forwarded",
        (None, None, None) => "local",
    };
    let mut entry = Entry {
        time,
        client: ext.get::<Caller>().map(|caller| caller.name.to_string()),
        route: route.map(ToString::to_string),
        method,
        path,
        status: parts.status.as_u16(),
        outcome,
        code: refused.map(|r| r.code).or(error.map(|e| e.0)),
        limit: refused.and_then(|r| r.policy.clone()),
        waited_ms: ext.get::<Waited>().map(|w| line::millis(w.0)),
        // Latency, bytes and completeness once the body ends.
        ..Entry::cancelled()
    };
    if let Some(UpstreamSaid(said)) = ext.get::<UpstreamSaid>() {
        entry.set_upstream(said);
    }
    let pending = body::Pending {
        log,
        entry,
        started,
        received,
    };
    Response::from_parts(parts, Body::new(body::Logged::new(answer, pending)))
}
