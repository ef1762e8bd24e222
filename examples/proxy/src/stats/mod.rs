//! What the layers did, per route and in all: `GET /stats` (JSON),
//! `GET /events` (server-sent events), `GET /metrics` (Prometheus text) and
//! `GET /` (a live page fed by `/events`).
//!
//! One hub task listens to the three layers' subscriptions, the upstream
//! counters and config reloads; when something moves it waits
//! [`COALESCE`] for the rest of the burst, builds one snapshot and publishes
//! it to every `/events` client through a `watch` channel (a slow client
//! skips to the latest). With nobody listening it builds nothing. Every
//! client is sent the same JSON (shared, not copied), a reader that stops
//! reading holds at most the server's per-connection buffer, and at most
//! `max_event_clients` are connected at once.
//!
//! Model names are chosen by clients, so a flood of made-up ones must not
//! push real routes out of the stats: only [`TrackedRoutes`] are counted by
//! name, everything else is added up as one route, [`OTHER`], and no view
//! lists more than `max_routes` routes. Every name is escaped where it is
//! written (JSON by serde, Prometheus label values by the text encoder).

mod events;
mod hub;
mod prometheus;
mod snapshot;
mod tracked;

pub use self::prometheus::{metrics, prometheus};
pub use events::events;
pub use hub::{COALESCE, Published, publish, run_hub};
pub use snapshot::{Aggregate, ConfigInfo, RouteStats, Snapshot, json, snapshot};
pub use tracked::TrackedRoutes;

use axum::response::Html;
use tower_throttle::stats::OTHER_KEYS;

/// The route every route not counted by name is added up in.
pub const OTHER: &str = OTHER_KEYS;

/// The live page.
const PAGE: &str = include_str!("../page.html");

/// `GET /`.
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
