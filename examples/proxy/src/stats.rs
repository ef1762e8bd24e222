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
//! written (JSON by serde, Prometheus label values by [`label_value`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::response::{Html, IntoResponse};
use bytes::Bytes;
use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::watch;
use tower_throttle::backoff::CooldownEntry;
use tower_throttle::stats::{KeyStats, OTHER_KEYS};

use crate::config::{Settings, Upstream};
use crate::gateway::{Gateway, ProviderInfo, Route, UpstreamCounts};
use crate::learn::{LearnedInfo, UnitInfo};
use crate::reply::json_error;

/// The route every route not counted by name is added up in.
pub const OTHER: &str = OTHER_KEYS;

/// The routes counted by name: those the configuration names (a rate-limit
/// rule for one provider and one model, a simulator model), always, and
/// those the upstream answered with a 2xx, in the room the configured ones
/// leave of `max_routes - 1` (the last entry being [`OTHER`]). An answered
/// name keeps its place while it is answered; one not answered for
/// `route_idle` gives it to the next new name, so made-up names an upstream
/// happens to answer cannot crowd out a real model for good. A configured
/// route added by a reload makes room by dropping answered ones.
#[derive(Debug)]
pub struct TrackedRoutes {
    room: usize,
    idle: Duration,
    /// What `seen` instants count from.
    origin: tokio::time::Instant,
    names: RwLock<Names>,
    /// When a full table was last searched for an idle name (seconds from
    /// `origin`): at most once a second, so a flood of new names costs a
    /// search a second, not one each.
    searched: AtomicU64,
}

#[derive(Debug, Default)]
struct Names {
    configured: HashSet<String>,
    /// Each with when it was last answered, in seconds from `origin`.
    answered: HashMap<String, AtomicU64>,
}

impl TrackedRoutes {
    /// Room for `max_routes` entries in all, [`OTHER`] included; an
    /// answered name idle for `idle` can be replaced.
    pub fn new(max_routes: usize, idle: Duration) -> Self {
        Self {
            room: max_routes.saturating_sub(1),
            idle,
            origin: tokio::time::Instant::now(),
            names: RwLock::new(Names::default()),
            searched: AtomicU64::new(u64::MAX),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_secs()
    }

    /// How many routes the layers count by name: the room, and as many
    /// again for names dropped by a reload, whose counts stay behind.
    pub fn room(&self) -> usize {
        self.room.saturating_mul(2)
    }

    /// Whether the route shown as `name` is counted by name.
    pub fn contains(&self, name: &str) -> bool {
        let names = self.names.read();
        names.configured.contains(name) || names.answered.contains_key(name)
    }

    /// Track `name`, which the configuration names.
    fn add_named(&self, name: String) {
        let mut names = self.names.write();
        names.answered.remove(&name);
        names.configured.insert(name);
        while names.configured.len() + names.answered.len() > self.room {
            let Some(dropped) = names.answered.keys().next().cloned() else {
                break;
            };
            names.answered.remove(&dropped);
        }
    }

    /// Track the routes `settings` names.
    pub fn add_configured(&self, settings: &Settings) {
        let rules = settings.file.rate_limit.iter().flat_map(|r| &r.rules);
        for rule in rules {
            if let (Some(provider), Some(model)) = (&rule.provider, &rule.model) {
                if !provider.contains(['*', '?']) && !model.contains(['*', '?']) {
                    self.add_named(route_name(provider, model));
                }
            }
        }
        // An alias leads to a model the configuration names.
        for provider in &settings.providers {
            for model in provider.aliases.targets() {
                self.add_named(route_name(&provider.name, model));
            }
        }
        let simulated = settings
            .providers
            .iter()
            .filter(|p| p.upstream == Upstream::Simulator);
        for provider in simulated {
            for model in settings.simulator.iter().flat_map(|s| &s.models) {
                self.add_named(route_name(&provider.name, &model.name));
            }
        }
    }

    /// The upstream answered `route` with a 2xx: it is real. Tracked if
    /// the configured routes leave room, or an answered name idle for
    /// `route_idle` gives its place.
    pub fn answered(&self, route: &Route) {
        let name = route.to_string();
        let now = self.now();
        {
            let names = self.names.read();
            if names.configured.contains(&name) {
                return;
            }
            if let Some(seen) = names.answered.get(&name) {
                seen.store(now, Ordering::Relaxed);
                return;
            }
        }
        let mut names = self.names.write();
        if names.configured.len() + names.answered.len() >= self.room {
            if self.searched.swap(now, Ordering::Relaxed) == now {
                return;
            }
            let idle = self.idle.as_secs();
            let oldest = names
                .answered
                .iter()
                .map(|(name, seen)| (seen.load(Ordering::Relaxed), name))
                .min();
            match oldest {
                Some((seen, oldest)) if now.saturating_sub(seen) >= idle => {
                    let oldest = oldest.clone();
                    names.answered.remove(&oldest);
                }
                _ => return,
            }
        }
        names
            .answered
            .entry(name)
            .or_insert_with(|| AtomicU64::new(now));
    }
}

/// A route's name as the layers show it (see [`Route`]'s `Display`).
fn route_name(provider: &str, model: &str) -> String {
    Route {
        provider: provider.into(),
        model: model.into(),
    }
    .to_string()
}

/// How long the hub gathers a burst of changes into one event.
pub const COALESCE: Duration = Duration::from_millis(50);

/// While a route cools down, how often its remaining time is republished
/// (a cooldown running out is a change nobody is told of).
const COOLDOWN_TICK: Duration = Duration::from_secs(1);

/// The live page.
const PAGE: &str = include_str!("page.html");

/// One snapshot as published to `/events`.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// Rises with every publication; the events' `id`.
    pub seq: u64,
    /// The snapshot's JSON.
    pub json: Arc<str>,
}

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
    }
}

fn to_json(snapshot: &Snapshot) -> String {
    // Plain data; serializing it cannot fail.
    serde_json::to_string(snapshot).unwrap_or_else(|_| "{}".to_owned())
}

/// Publish a snapshot to `/events` clients if it differs from the last one
/// published (a cooldown's remaining time counts as a difference).
pub fn publish(gateway: &Gateway) {
    if gateway.hub().receiver_count() == 0 {
        return;
    }
    let mut last = gateway.last_published().lock();
    let seq = last.0 + 1;
    let json = to_json(&snapshot(gateway, seq));
    // The sequence number differs every time; compare without it.
    let body = json.split_once(',').map_or("", |(_, rest)| rest);
    if body == last.1 {
        return;
    }
    *last = (seq, body.to_owned());
    gateway.hub().send_replace(Published {
        seq,
        json: Arc::from(json),
    });
}

/// Publish a snapshot whenever the counters move, a burst at a time.
pub async fn run_hub(gateway: Gateway) {
    let handles = gateway.handles().clone();
    let mut rate = handles.rate.subscribe();
    let mut concurrency = handles.concurrency.subscribe();
    let mut backoff = handles.backoff.subscribe();
    let mut upstream_seen = 0;
    let mut config_seen = 0;
    let mut shutdown = gateway.shutdown_signal();
    loop {
        let cooling = !handles.backoff.cooldowns().is_empty();
        let tick = async {
            if cooling {
                tokio::time::sleep(COOLDOWN_TICK).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = rate.changed() => {}
            _ = concurrency.changed() => {}
            _ = backoff.changed() => {}
            _ = gateway.counters().changed.wait(&mut upstream_seen) => {}
            _ = gateway.config_changed().wait(&mut config_seen) => {}
            _ = tick => {}
        }
        tokio::time::sleep(COALESCE).await;
        publish(&gateway);
    }
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

/// `GET /`.
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}

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

/// Prometheus text exposition, one family at a time.
struct Prom {
    out: String,
}

/// A label value as the text format wants it: `\`, `"` and line feeds
/// escaped as `\\`, `\"` and `\n`. The format lets every other character
/// through raw; a control character (CR, ESC, NUL, …) is written as the text
/// of its Rust escape instead (the value then reads `\u{1b}`), so none
/// reaches a scraper or a terminal. For raw text; a route's provider and
/// model come escaped from the layers and go through [`route_label_value`].
///
/// Written here rather than with `prometheus-client`: that crate writes
/// OpenMetrics (`# EOF`, counter families named without `_total`), which
/// would change every series this endpoint has always served.
pub fn label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\0' => out.push_str("\\\\0"),
            c if c.is_control() => {
                // `\u{1b}` with its backslash escaped: `\\u{1b}`.
                out.push('\\');
                out.extend(c.escape_default());
            }
            c => out.push(c),
        }
    }
    out
}

/// A route's provider or model, as the layers name it (already
/// [escaped](tower_throttle::redact::Escaped): backslashes doubled, hidden
/// characters as the text of their escapes), as a label value a scraper
/// reads back as the name itself: a doubled backslash is one backslash,
/// `\n` a line feed, `"` a quote, and every other escape stays the text it
/// is (`\u{1b}`). Escaping the escaped text again would double every
/// backslash a model name holds.
pub fn route_label_value(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut chars = label.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.peek() {
                Some('\\') => {
                    chars.next();
                    out.push_str("\\\\");
                }
                Some('n') => {
                    chars.next();
                    out.push_str("\\n");
                }
                // The start of an escape's text (`\r`, `\0`, `\u{1b}`):
                // its backslash shown as one.
                _ => out.push_str("\\\\"),
            },
            // Never in an escaped label; written safely all the same.
            c => out.push_str(&label_value(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out
}

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.route_sample(name, None, labels, value);
    }

    /// A sample labelled with `route`'s provider and model (escaped names,
    /// see [`route_label_value`]) first, then `labels` (raw text).
    fn route_sample(
        &mut self,
        name: &str,
        route: Option<&RouteStats>,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        self.out.push_str(name);
        let route = route.map(|r| {
            [
                ("provider", route_label_value(&r.provider)),
                ("model", route_label_value(&r.model)),
            ]
        });
        let raw = labels.iter().map(|(k, v)| (*k, label_value(v)));
        let all: Vec<(&str, String)> = route.into_iter().flatten().chain(raw).collect();
        if !all.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in all.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family with one sample per route.
    fn per_route(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        routes: &[RouteStats],
        value: impl Fn(&RouteStats) -> Option<f64>,
    ) {
        self.family(name, kind, help);
        for r in routes {
            if let Some(v) = value(r) {
                self.route_sample(name, Some(r), &[], v);
            }
        }
    }
}

/// The snapshot in Prometheus text format (version 0.0.4).
pub fn prometheus(s: &Snapshot) -> String {
    let mut p = Prom { out: String::new() };
    let r = &s.routes;
    let n = |v: u64| Some(v as f64);
    p.per_route(
        "proxy_rate_limit_admitted_total",
        "counter",
        "Requests the rate limiter let through.",
        r,
        |x| n(x.rate_limit.admitted),
    );
    p.per_route(
        "proxy_rate_limit_rejected_total",
        "counter",
        "Requests the rate limiter refused (429).",
        r,
        |x| n(x.rate_limit.rejected),
    );
    p.per_route(
        "proxy_rate_limit_would_reject_total",
        "counter",
        "Requests a dry-run limit would have refused.",
        r,
        |x| n(x.rate_limit.would_reject),
    );
    p.per_route(
        "proxy_rate_limit_waited_total",
        "counter",
        "Admitted requests that waited for their turn.",
        r,
        |x| n(x.rate_limit.waited),
    );
    p.per_route(
        "proxy_rate_limit_wait_seconds_total",
        "counter",
        "Time those requests waited.",
        r,
        |x| Some(x.rate_limit.total_wait_ms / 1e3),
    );
    p.per_route(
        "proxy_rate_limit_queued",
        "gauge",
        "Requests waiting for their turn now.",
        r,
        |x| n(x.rate_limit.queued_now),
    );
    p.per_route(
        "proxy_concurrency_admitted_total",
        "counter",
        "Requests given a concurrency permit.",
        r,
        |x| n(x.concurrency.admitted),
    );
    p.per_route(
        "proxy_concurrency_rejected_total",
        "counter",
        "Requests refused for a full queue or a queue timeout (503).",
        r,
        |x| n(x.concurrency.rejected),
    );
    p.per_route(
        "proxy_concurrency_waited_total",
        "counter",
        "Requests that waited for a permit.",
        r,
        |x| n(x.concurrency.waited),
    );
    p.per_route(
        "proxy_concurrency_wait_seconds_total",
        "counter",
        "Time those requests waited.",
        r,
        |x| Some(x.concurrency.total_wait_ms / 1e3),
    );
    p.per_route(
        "proxy_concurrency_queued",
        "gauge",
        "Requests waiting for a permit now.",
        r,
        |x| n(x.concurrency.queued_now),
    );
    p.per_route(
        "proxy_concurrency_in_flight",
        "gauge",
        "Requests in flight now, streamed bodies until their end.",
        r,
        |x| n(x.concurrency.in_flight.unwrap_or(0)),
    );
    p.per_route(
        "proxy_backoff_admitted_total",
        "counter",
        "Requests the backoff layer let through.",
        r,
        |x| n(x.backoff.admitted),
    );
    p.per_route(
        "proxy_backoff_rejected_total",
        "counter",
        "Requests refused while their route cooled down (503).",
        r,
        |x| n(x.backoff.rejected),
    );
    p.per_route(
        "proxy_backoff_waited_total",
        "counter",
        "Requests held until a cooldown ended.",
        r,
        |x| n(x.backoff.waited),
    );
    p.per_route(
        "proxy_backoff_cooldown_seconds",
        "gauge",
        "Time left of the route's cooldown.",
        r,
        |x| x.cooldown.as_ref().map(|c| c.remaining.as_secs_f64()),
    );
    p.family(
        "proxy_upstream_responses_total",
        "counter",
        "Upstream answers by status class.",
    );
    for x in r {
        let u = &x.upstream;
        for (class, v) in [
            ("2xx", u.ok),
            ("429", u.rate_limited),
            ("4xx", u.client_errors),
            ("5xx", u.server_errors),
        ] {
            p.route_sample(
                "proxy_upstream_responses_total",
                Some(x),
                &[("class", class)],
                v as f64,
            );
        }
    }
    p.per_route(
        "proxy_upstream_failures_total",
        "counter",
        "Upstream requests without an answer.",
        r,
        |x| n(x.upstream.failed),
    );
    p.family(
        "proxy_tokens_total",
        "counter",
        "Tokens of token quotas: charged at admission (estimates), used (as answers reported), \
         given back (estimates above the usage), charged after (usage above the estimate).",
    );
    for x in r {
        let t = &x.upstream.tokens;
        for (kind, v) in [
            ("charged", t.charged),
            ("used", t.used),
            ("given_back", t.given_back),
            ("charged_after", t.charged_after),
        ] {
            p.route_sample("proxy_tokens_total", Some(x), &[("kind", kind)], v as f64);
        }
    }
    p.per_route(
        "proxy_tokens_kept_total",
        "counter",
        "Answers that reported no usage, or ended early: their estimate stands.",
        r,
        |x| n(x.upstream.tokens.kept),
    );
    learned_families(&mut p, r);
    p.family(
        "proxy_backoff_cooldowns_started_total",
        "counter",
        "Cooldowns started.",
    );
    p.sample(
        "proxy_backoff_cooldowns_started_total",
        &[],
        s.aggregate.cooldowns_started as f64,
    );
    p.family(
        "proxy_untracked_routes",
        "gauge",
        "Requests of routes beyond the stats tables, counted under (other).",
    );
    p.sample("proxy_untracked_routes", &[], s.untracked_routes as f64);
    p.family(
        "proxy_config_generation",
        "gauge",
        "1 at start, one more per applied reload.",
    );
    p.sample("proxy_config_generation", &[], s.config.generation as f64);
    p.family("proxy_event_clients", "gauge", "Clients on /events now.");
    p.sample("proxy_event_clients", &[], s.event_clients as f64);
    p.family(
        "proxy_write_timeouts_total",
        "counter",
        "Connections closed because their client stopped reading a response.",
    );
    p.sample("proxy_write_timeouts_total", &[], s.write_timeouts as f64);
    p.out
}

/// The learned limits, one sample per route and unit said.
fn learned_families(p: &mut Prom, routes: &[RouteStats]) {
    type Value = fn(&UnitInfo) -> Option<f64>;
    let families: [(&str, &str, Value); 4] = [
        (
            "proxy_learned_limit",
            "Units per window the provider states (learn_limits).",
            |u| u.limit.map(|v| v as f64),
        ),
        (
            "proxy_learned_remaining",
            "Units left, as the provider last said.",
            |u| u.remaining.map(|v| v as f64),
        ),
        (
            "proxy_learned_reset_seconds",
            "Seconds until the limit is whole, as the provider last said.",
            |u| u.reset_seconds,
        ),
        (
            "proxy_learned_timestamp_seconds",
            "When the provider last said it, Unix seconds.",
            |u| Some(u.learned_unix),
        ),
    ];
    for (name, help, value) in families {
        p.family(name, "gauge", help);
        for r in routes {
            let Some(learned) = &r.learned else { continue };
            for (unit, info) in learned.units() {
                if let Some(v) = info.and_then(value) {
                    p.route_sample(name, Some(r), &[("unit", unit)], v);
                }
            }
        }
    }
}

/// `GET /metrics`.
pub async fn metrics(State(gateway): State<Gateway>) -> Response<Body> {
    let text = prometheus(&snapshot(&gateway, gateway.hub().borrow().seq));
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
