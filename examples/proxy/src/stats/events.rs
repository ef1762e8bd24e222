//! `GET /events`: each client's stream of server-sent events, its frames
//! shared and counted, at most `max_event_clients` at once.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use tokio::sync::watch;

use super::Published;
use super::snapshot::{snapshot, to_json};
use crate::gateway::Gateway;
use crate::reply::json_error;

/// Counts a client on `/events` while its stream lives.
struct Client(Gateway);

impl Client {
    /// A place among `max` clients, or `None` when every one is taken.
    fn join(gateway: Gateway, max: usize) -> Option<Self> {
        gateway
            .event_clients()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Self(gateway))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.0.event_clients().fetch_sub(1, Ordering::AcqRel);
    }
}

/// A snapshot's JSON as a body frame: shared with every other client (an
/// `Arc`, not a copy per client), and counted in the gateway's
/// [`Gateway::event_bytes`] until hyper has written and dropped it.
struct Held {
    json: Arc<str>,
    bytes: Arc<AtomicUsize>,
}

impl Held {
    fn frame(json: &Arc<str>, bytes: &Arc<AtomicUsize>) -> Bytes {
        bytes.fetch_add(json.len(), Ordering::Relaxed);
        Bytes::from_owner(Held {
            json: json.clone(),
            bytes: bytes.clone(),
        })
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.json.as_bytes()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.bytes.fetch_sub(self.json.len(), Ordering::Relaxed);
    }
}

/// One client's stream. It holds no queue: a client that reads slowly is
/// not polled while hyper's buffer for it is full, and then gets the
/// latest publication, skipping those it missed.
struct Feed {
    first: Option<Published>,
    rx: watch::Receiver<Published>,
    shutdown: watch::Receiver<bool>,
    last: u64,
    heartbeat: Duration,
    /// The rest of the event being sent, last part first.
    rest: Vec<Bytes>,
    bytes: Arc<AtomicUsize>,
    _client: Client,
}

impl Feed {
    /// `p` as a server-sent event in three frames: `id` and `data:`, the
    /// shared JSON (serde_json writes no raw newline), the blank line.
    fn event(&mut self, p: &Published, retry: bool) -> Bytes {
        self.last = p.seq;
        self.rest = vec![
            Bytes::from_static(b"\n\n"),
            Held::frame(&p.json, &self.bytes),
        ];
        let retry = if retry { "retry: 2000\n" } else { "" };
        Bytes::from(format!("{retry}id: {}\ndata: ", p.seq))
    }
}

/// The next frame of a feed: the snapshot on connect, then each
/// publication, a heartbeat comment when nothing was sent for a while; on
/// shutdown, the latest publication not yet sent, then the end.
async fn next(mut feed: Feed) -> Option<(Result<Bytes, Infallible>, Feed)> {
    if let Some(part) = feed.rest.pop() {
        return Some((Ok(part), feed));
    }
    if let Some(first) = feed.first.take() {
        let frame = feed.event(&first, true);
        return Some((Ok(frame), feed));
    }
    loop {
        let ending = tokio::select! {
            biased;
            changed = feed.rx.changed() => {
                if changed.is_err() {
                    return None;
                }
                Some(false)
            }
            _ = feed.shutdown.wait_for(|s| *s) => Some(true),
            () = tokio::time::sleep(feed.heartbeat) => None,
        };
        let Some(ending) = ending else {
            return Some((Ok(Bytes::from_static(b": heartbeat\n\n")), feed));
        };
        // On shutdown, the latest publication not yet sent goes out first.
        let published = feed.rx.borrow_and_update().clone();
        if published.seq > feed.last {
            let frame = feed.event(&published, false);
            return Some((Ok(frame), feed));
        }
        if ending {
            return None;
        }
    }
}

/// `GET /events`: a snapshot on connect, then one per burst of changes,
/// and a heartbeat comment when nothing happens; 503 when
/// `max_event_clients` are connected already.
pub async fn events(State(gateway): State<Gateway>) -> Response<Body> {
    let settings = gateway.current().settings.clone();
    let max = settings.gateway.max_event_clients;
    // Counted before the first snapshot, which then includes this client.
    let Some(client) = Client::join(gateway.clone(), max) else {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_event_clients",
            &format!("{max} clients are on /events already (max_event_clients)"),
        );
    };
    let rx = gateway.hub().subscribe();
    let seq = rx.borrow().seq;
    let first = Published {
        seq,
        json: Arc::from(to_json(&snapshot(&gateway, seq))),
    };
    let feed = Feed {
        first: Some(first),
        rx,
        shutdown: gateway.shutdown_signal(),
        last: 0,
        heartbeat: settings.gateway.events_heartbeat,
        rest: Vec::new(),
        bytes: gateway.event_bytes().clone(),
        _client: client,
    };
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(futures::stream::unfold(feed, next)),
    )
        .into_response()
}
