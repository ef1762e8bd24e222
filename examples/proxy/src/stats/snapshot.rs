//! The [`Snapshot`] of every counter that `/stats`, `/events` and
//! `/metrics` show, its JSON, and `GET /stats`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, header};
use axum::response::IntoResponse;
use serde::Serialize;
use tower_throttle::backoff::CooldownEntry;
use tower_throttle::stats::KeyStats;

use super::OTHER;
use crate::access_log::AccessLog;
use crate::gateway::{CallerStats, Gateway, ProviderInfo, RouteShares, UpstreamCounts};
use crate::learn::LearnedInfo;

/// Everything `/stats` and `/events` show.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The publication this belongs to (0 before the first).
    pub seq: u64,
    /// When the gateway started, Unix seconds.
    pub started_unix: u64,
    /// The configuration in force.
    pub config: ConfigInfo,
    /// The providers (never their keys).
    pub providers: Vec<ProviderInfo>,
    /// Every route added up.
    pub aggregate: Aggregate,
    /// Per (provider, model) route, sorted: at most `max_routes`, routes not
    /// counted by name added up as one, [`OTHER`].
    pub routes: Vec<RouteStats>,
    /// Requests of routes beyond `max_routes`, counted in the aggregate and
    /// [`OTHER`] only.
    pub untracked_routes: u64,
    /// Clients on `/events` now.
    pub event_clients: usize,
    /// Connections closed because their client stopped reading a response
    /// for `gateway.body_write_timeout` (what they held released).
    pub write_timeouts: u64,
    /// Access log lines dropped (its writer behind or failing); absent
    /// without an access log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log_dropped: Option<u64>,
    /// Each `[[routes]]` model's deployments and their shares; absent
    /// without routes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deployments: Vec<RouteShares>,
    /// Requests per `[[clients]]` entry, and the anonymous ones; absent
    /// without clients.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<CallerStats>,
}

/// Where the configuration came from, and how often it was reloaded.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigInfo {
    /// `--config` path, or "embedded default".
    pub source: String,
    /// 1 at start, +1 per applied reload.
    pub generation: u64,
}

/// Totals.
#[derive(Clone, Debug, Serialize)]
pub struct Aggregate {
    /// The rate limiter's counters.
    pub rate_limit: KeyStats,
    /// The concurrency layer's counters.
    pub concurrency: KeyStats,
    /// The backoff layer's counters.
    pub backoff: KeyStats,
    /// Cooldowns started since the gateway started.
    pub cooldowns_started: u64,
    /// What upstreams answered.
    pub upstream: UpstreamCounts,
}

/// One route: what each layer did with its requests.
#[derive(Clone, Debug, Serialize)]
pub struct RouteStats {
    /// `provider/model`.
    pub route: String,
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// Admitted, waited, refused by the rate limiter.
    pub rate_limit: KeyStats,
    /// In flight, queued, refused for a full queue or a timeout.
    pub concurrency: KeyStats,
    /// Let through, or refused while cooling down.
    pub backoff: KeyStats,
    /// The cooldown in force, if any.
    pub cooldown: Option<CooldownEntry>,
    /// What the upstream answered.
    pub upstream: UpstreamCounts,
    /// What the provider said of its limits, for a provider with
    /// `learn_limits` (see `learn`).
    pub learned: Option<LearnedInfo>,
}

fn keyed(stats: Vec<KeyStats>) -> BTreeMap<String, KeyStats> {
    stats.into_iter().map(|k| (k.key.clone(), k)).collect()
}

/// The counters now.
pub fn snapshot(gateway: &Gateway, seq: u64) -> Snapshot {
    let handles = gateway.handles();
    let rate = handles.rate.stats();
    let concurrency = handles.concurrency.stats();
    let backoff = handles.backoff.stats();
    let (upstream_total, upstream) = gateway.counters().snapshot();
    let current = gateway.current();
    let untracked_routes = rate
        .untracked_keys
        .max(concurrency.untracked_keys)
        .max(backoff.requests.untracked_keys);
    let mut rate_keys = keyed(rate.keys);
    let mut concurrency_keys = keyed(concurrency.keys);
    let mut backoff_keys = keyed(backoff.requests.keys);
    // A cooldown is listed on its route's line, so only a tracked route's.
    let tracked = gateway.tracked();
    let mut cooldowns: BTreeMap<String, CooldownEntry> = backoff
        .cooldowns
        .into_iter()
        .filter(|c| tracked.contains(&c.key))
        .map(|c| (c.key.clone(), c))
        .collect();
    let mut upstream: BTreeMap<String, UpstreamCounts> = upstream.into_iter().collect();
    let mut learned: BTreeMap<String, LearnedInfo> = handles
        .learned
        .snapshot()
        .into_iter()
        .filter(|(name, _)| tracked.contains(name))
        .collect();
    let mut names: Vec<String> = rate_keys
        .keys()
        .chain(learned.keys())
        .chain(concurrency_keys.keys())
        .chain(backoff_keys.keys())
        .chain(cooldowns.keys())
        .chain(upstream.keys())
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    let blank = |key: &str| {
        let mut stats = KeyStats::default();
        stats.key = key.to_owned();
        stats
    };
    let routes = names
        .into_iter()
        .map(|route| {
            let (provider, model) = match route.split_once('/') {
                _ if route == OTHER => (OTHER, OTHER),
                Some(split) => split,
                None => (route.as_str(), ""),
            };
            RouteStats {
                provider: provider.to_owned(),
                model: model.to_owned(),
                rate_limit: rate_keys.remove(&route).unwrap_or_else(|| blank(&route)),
                concurrency: concurrency_keys
                    .remove(&route)
                    .unwrap_or_else(|| blank(&route)),
                backoff: backoff_keys.remove(&route).unwrap_or_else(|| blank(&route)),
                cooldown: cooldowns.remove(&route),
                upstream: upstream.remove(&route).unwrap_or_default(),
                learned: learned.remove(&route),
                route,
            }
        })
        .collect();
    Snapshot {
        seq,
        started_unix: gateway.started_unix(),
        config: ConfigInfo {
            source: gateway.source().to_owned(),
            generation: current.generation,
        },
        providers: gateway.providers(),
        aggregate: Aggregate {
            rate_limit: rate.aggregate,
            concurrency: concurrency.aggregate,
            backoff: backoff.requests.aggregate,
            cooldowns_started: backoff.cooldowns_started,
            upstream: upstream_total,
        },
        routes,
        untracked_routes,
        event_clients: gateway.event_clients().load(Ordering::Relaxed),
        write_timeouts: gateway.write_timeouts(),
        access_log_dropped: gateway.access_log().map(AccessLog::dropped),
        deployments: gateway.deployment_shares(),
        clients: gateway.caller_stats(),
    }
}

pub(super) fn to_json(snapshot: &Snapshot) -> String {
    // Plain data; serializing it cannot fail.
    serde_json::to_string(snapshot).unwrap_or_else(|_| "{}".to_owned())
}

/// `GET /stats`.
pub async fn json(State(gateway): State<Gateway>) -> Response<Body> {
    let seq = gateway.hub().borrow().seq;
    (
        [(header::CONTENT_TYPE, "application/json")],
        to_json(&snapshot(&gateway, seq)),
    )
        .into_response()
}
