//! The gateway: finds a request's provider and model, and sends it upstream
//! through the client stack of all four layers.
//!
//! ```text
//! edge::guard   Host not ours -> 421, foreign browser Origin -> 403
//! axum handler: path that could leave the base path -> 400, provider from
//!               the path, body buffered (max_body_bytes), model from the
//!               body's JSON "model" (ambiguous or with control characters
//!               -> 400) resolved through the provider's aliases, Route put
//!               in extensions; with a provider key, the client's own
//!               credential headers dropped; anthropic-version added
//!   ThrottleResponseLayer   refusals -> 429/503 + Retry-After (+ RateLimit headers)
//!   map_result              transport errors -> 502/504; body -> axum Body;
//!                           the rate limiter's note -> RateLimit headers
//!   Backoff429Layer         route cooling after an upstream 429: refuse or hold
//!   ConcurrencyLayer        N in flight per route; the permit lives in the body
//!   RateLimitLayer          per-route quotas and rules; refuse, or wait in FIFO
//!   IdentityHeaderLayer     User-Agent, x-request-id by URL rules
//!   Timeout                 upstream_timeout, to the response headers
//!   Upstream                API key added here, last; Bytes -> Full; hyper client
//!                           (plain, or the provider's HTTPS one: see `tls`)
//! ```
//!
//! The layers run on `http::Request<Bytes>`: the body is buffered once (LLM
//! requests are small and must be whole before a JSON field can be read),
//! and converted to hyper's `Full<Bytes>` only in the innermost service. The
//! response is never buffered: hyper's `Incoming` body goes back to the
//! client chunk by chunk inside a `ConcurrencyBody`, so a streamed answer
//! holds its route's permit until its last chunk.
//!
//! The backoff layer is outermost of the three so that a cooling route is
//! refused before it takes a permit or a rate slot; the concurrency layer is
//! outside the rate limiter so that rate admissions are the instants
//! requests reach the upstream (see the crate's `concurrency` docs).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, header,
};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::backoff::{Backoff429Layer, BackoffHandle};
use tower_throttle::concurrency::{ConcurrencyBody, ConcurrencyHandle, ConcurrencyLayer};
use tower_throttle::error::{BoxError, ConfigError, KeyError, MissingKey};
use tower_throttle::identity::{IdentityHeaderLayer, StableIds};
use tower_throttle::key::{JsonFieldKey, KeyBuilder, KeyExtractor, key_parts};
use tower_throttle::rate_limit::{
    Annotate, CountAll, Estimated, Limits, RateLimitHandle, RateLimitInfo, RateLimitLayer,
    Settlement,
};
use tower_throttle::redact::{Escaped, Quoted};
use tower_throttle::respond::{RateLimitHeaders, Rejection, ThrottleResponseLayer};

use crate::config::{Credential, GatewaySettings, Settings, Upstream as UpstreamKind};
use crate::learn::Learner;
use crate::preset::{self, Aliases, Kind, LimitHeaders, UsageFormat};
use crate::simulator::Simulator;
use crate::stats::{OTHER, TrackedRoutes};
use crate::tls::{HttpsClient, TlsClients, UpstreamTls, Via};
use crate::usage::{self, Tally, UsageBody};
use crate::{edge, live, multipart, operator, serve, stats};

/// The model part of a route whose body names none (`GET /v1/models`).
pub const NO_MODEL: &str = "(none)";

/// A request's route, put in its extensions by the handler: the key every
/// layer counts it under.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The provider's name.
    pub provider: Arc<str>,
    /// The model the body's `"model"` resolves to through the provider's
    /// aliases, or [`NO_MODEL`].
    pub model: Arc<str>,
}

/// `provider/model`, each escaped as the layers show key parts (a model name
/// is the client's text): the name the layers' stats give the route, and
/// safe in a log line.
impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Escaped(&self.provider), Escaped(&self.model))
    }
}

/// Keys a request by its [`Route`]: two parts, so rules can match
/// `provider` and `model` patterns.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<http::Request<B>> for RouteKey {
    fn extract(&self, req: &http::Request<B>, key: &mut KeyBuilder<'_>) -> Result<(), KeyError> {
        let route = req
            .extensions()
            .get::<Route>()
            .ok_or_else(|| MissingKey::new("route"))?;
        key.push_str(&route.provider);
        key.push_str(&route.model);
        Ok(())
    }
}

/// What remains of a route's quota, kept on the response by the rate limiter
/// and written as the IETF `RateLimit` headers in [`finish`], outside the
/// backoff layer: written by the rate limiter itself, they would be read by
/// the backoff layer as the upstream's own (a cooldown as long as the
/// gateway's quota takes to refill, instead of the upstream's `Retry-After`
/// or `initial_backoff`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoteQuota;

impl<B> Annotate<http::Response<B>> for NoteQuota {
    fn annotate(&self, response: &mut http::Response<B>, info: &RateLimitInfo) {
        response.extensions_mut().insert(info.clone());
    }
}

/// The provider's API key, riding in the request's extensions to the
/// innermost service, which alone puts it in a header.
#[derive(Clone)]
struct Outbound(Credential);

impl fmt::Debug for Outbound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Outbound(<redacted>)")
    }
}

/// What upstreams answered, per route and in all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamCounts {
    /// Responses received (any status).
    pub responses: u64,
    /// 2xx and 3xx.
    pub ok: u64,
    /// 429.
    pub rate_limited: u64,
    /// Other 4xx.
    pub client_errors: u64,
    /// 5xx.
    pub server_errors: u64,
    /// No response: unreachable, reset, or too slow.
    pub failed: u64,
    /// The tokens of the answers' requests, where a quota counts tokens.
    pub tokens: TokenCounts,
}

/// Tokens of token quotas: what requests were charged at admission (their
/// estimates), and what their answers settled it to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TokenCounts {
    /// Tokens charged at admission: the requests' estimates.
    pub charged: u64,
    /// Tokens the answers reported used (those that reported usage).
    pub used: u64,
    /// Estimates above the usage, handed back to the limiter (a token
    /// bucket takes back only what it has not refilled since).
    pub given_back: u64,
    /// Usage above the estimate, charged after the answer.
    pub charged_after: u64,
    /// Answers that reported no usage, or ended early: their estimate
    /// stands.
    pub kept: u64,
}

impl TokenCounts {
    fn add(&mut self, charged: u32, used: Option<u32>) {
        self.charged += u64::from(charged);
        match used {
            Some(used) => {
                self.used += u64::from(used);
                self.given_back += u64::from(charged.saturating_sub(used));
                self.charged_after += u64::from(used.saturating_sub(charged));
            }
            None => self.kept += 1,
        }
    }
}

impl UpstreamCounts {
    fn add(&mut self, status: Option<StatusCode>) {
        let Some(status) = status else {
            self.failed += 1;
            return;
        };
        self.responses += 1;
        match status.as_u16() {
            429 => self.rate_limited += 1,
            400..=499 => self.client_errors += 1,
            500..=599 => self.server_errors += 1,
            _ => self.ok += 1,
        }
    }
}

/// Wakes the stats hub when something not counted by the layers moves; a
/// burst of changes wakes it once (the first change after it looked).
#[derive(Debug, Default)]
pub struct Changed {
    dirty: AtomicBool,
    epoch: AtomicU64,
    notify: Notify,
}

impl Changed {
    /// Something moved.
    pub fn touch(&self) {
        // In a burst the flag is already set: one load, nothing else.
        if !self.dirty.load(Ordering::Relaxed) && !self.dirty.swap(true, Ordering::AcqRel) {
            self.epoch.fetch_add(1, Ordering::Release);
            self.notify.notify_waiters();
        }
    }

    /// Wait until something moved since `seen`.
    pub async fn wait(&self, seen: &mut u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch != *seen {
                *seen = epoch;
                self.dirty.store(false, Ordering::Release);
                return;
            }
            notified.await;
        }
    }
}

/// Upstream answers by route: the [tracked](TrackedRoutes) ones by name,
/// the rest added up as [`OTHER`].
#[derive(Debug)]
pub struct UpstreamCounters {
    tracked: Arc<TrackedRoutes>,
    table: Mutex<(UpstreamCounts, HashMap<String, UpstreamCounts>)>,
    /// Touched on every answer.
    pub changed: Changed,
}

impl UpstreamCounters {
    fn new(tracked: Arc<TrackedRoutes>) -> Self {
        Self {
            tracked,
            table: Mutex::new(Default::default()),
            changed: Changed::default(),
        }
    }

    /// The name `route` is counted under: its own, or [`OTHER`].
    fn name(&self, route: &Route) -> String {
        let name = route.to_string();
        if self.tracked.contains(&name) {
            name
        } else {
            OTHER.to_owned()
        }
    }

    fn record(&self, route: Option<&Route>, status: Option<StatusCode>) {
        let name = route.map(|route| {
            // A route the upstream serves is real: counted by name from now.
            if status.is_some_and(|s| s.is_success()) {
                self.tracked.answered(route);
            }
            self.name(route)
        });
        {
            let mut table = self.table.lock();
            table.0.add(status);
            if let Some(name) = name {
                table.1.entry(name).or_default().add(status);
            }
        }
        self.changed.touch();
    }

    /// An answer on `route` whose request was charged `charged` tokens
    /// settled it to `used` (`None`: it reported none; the charge stands).
    pub fn settled(&self, route: &Route, charged: u32, used: Option<u32>) {
        let name = self.name(route);
        {
            let mut table = self.table.lock();
            table.0.tokens.add(charged, used);
            table.1.entry(name).or_default().tokens.add(charged, used);
        }
        self.changed.touch();
    }

    /// Zero every count.
    pub fn reset(&self) {
        *self.table.lock() = Default::default();
        self.changed.touch();
    }

    /// The totals and the routes (`provider/model`), sorted.
    pub fn snapshot(&self) -> (UpstreamCounts, Vec<(String, UpstreamCounts)>) {
        let table = self.table.lock();
        let mut routes: Vec<_> = table
            .1
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        routes.sort_by(|a, b| a.0.cmp(&b.0));
        (table.0.clone(), routes)
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The innermost service: adds the API key, hands the request to hyper,
/// counts the answer.
#[derive(Clone)]
pub struct Upstream {
    client: HttpClient,
    counters: Arc<UpstreamCounters>,
    learned: Arc<Learner>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

/// The plain-HTTP client requests to http:// upstreams go out through
/// (https:// ones go through their provider's client, see `tls`).
fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(10)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

impl Service<http::Request<Bytes>> for Upstream {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // hyper's pooled client is always ready; it connects per request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Bytes>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let route = parts.extensions.get::<Route>().cloned();
        if let Some(Outbound(credential)) = parts.extensions.remove::<Outbound>() {
            parts.headers.insert(credential.header, credential.value);
        }
        let https = parts.extensions.remove::<Via>();
        let req = http::Request::from_parts(parts, Full::new(body));
        let future = match https {
            Some(Via(client)) => client.request(req),
            None => self.client.request(req),
        };
        let counters = self.counters.clone();
        let learned = self.learned.clone();
        Box::pin(async move {
            let result = future.await;
            if let (Some(route), Ok(response)) = (&route, &result) {
                learned.observe(route, response.headers());
            }
            counters.record(route.as_ref(), result.as_ref().ok().map(|r| r.status()));
            // hyper's body, boxed as is: frames still pass one by one.
            result.map(|r| r.map(Body::new)).map_err(|e| {
                if let Some(tls) = UpstreamTls::find(&e) {
                    let provider = route.as_ref().map(|r| &*r.provider).unwrap_or_default();
                    tracing::warn!(
                        provider = %Quoted(provider),
                        error = %Quoted(&Escaped(&tls.to_string()).to_string()),
                        "upstream TLS handshake failed; is its certificate trusted (ca_file)?"
                    );
                    return Box::new(tls) as BoxError;
                }
                let route = route.map(|r| r.to_string()).unwrap_or_default();
                let error = error_chain(&e);
                tracing::warn!(
                    route = %Quoted(&route.to_string()),
                    error = %Quoted(&Escaped(&error).to_string()),
                    "upstream request failed"
                );
                Box::new(e) as BoxError
            })
        })
    }
}

/// An error and its sources, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The whole client stack, boxed so a reload can swap it.
pub type ProxyService = BoxCloneSyncService<http::Request<Bytes>, Response<Body>, Infallible>;

/// The stateful layers, built once: their limiters, permits and cooldowns
/// outlive every reload. Each reload layers clones of them (sharing that
/// state) with the new waits and queue limits.
struct Layers {
    rate: RateLimitLayer<RouteKey, Estimated<TokenCost>, CountAll, NoteQuota>,
    concurrency: ConcurrencyLayer<RouteKey>,
    backoff: Backoff429Layer<RouteKey>,
    /// The identity layer's client/project/session ids, kept across reloads.
    stable: Mutex<Option<StableIds>>,
}

/// The rate limiter's cost of a request: its token estimate (see `usage`).
type TokenCost = fn(&http::Request<Bytes>) -> u32;

/// Live control and stats of the three stateful layers (see `live`).
#[derive(Clone, Debug)]
pub struct Handles {
    /// The rate limiter: retune, switch, stats.
    pub rate: RateLimitHandle,
    /// Requests in flight and queued.
    pub concurrency: ConcurrencyHandle,
    /// Cooldowns.
    pub backoff: BackoffHandle,
    /// Limits learned from providers, applied through `rate`.
    pub learned: Arc<Learner>,
}

/// One provider, resolved to where requests go.
#[derive(Clone)]
struct Target {
    name: Arc<str>,
    scheme: Scheme,
    /// The client for an https upstream.
    https: Option<HttpsClient>,
    authority: Authority,
    base_path: String,
    credential: Option<Credential>,
    default: bool,
    kind: Kind,
    anthropic_version: Option<HeaderValue>,
    limit_headers: LimitHeaders,
    usage_format: UsageFormat,
    aliases: Arc<Aliases>,
    /// `rewrite_model`: the body names the model an alias resolved to.
    rewrite_model: bool,
    /// `api-version` added to a query without one (Azure OpenAI).
    api_version: Option<String>,
    /// `insecure_skip_verify = true`: its certificate is not checked.
    insecure: bool,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("scheme", &self.scheme)
            .field("authority", &self.authority)
            .field("base_path", &self.base_path)
            .field("credential", &self.credential)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

/// A provider as `/stats` shows it: never its key.
#[derive(Clone, Debug, Serialize)]
pub struct ProviderInfo {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub upstream: String,
    /// Whether it serves unprefixed paths.
    pub default: bool,
    /// Whether the gateway sends it an API key.
    pub authenticated: bool,
    /// The API it speaks.
    pub kind: Kind,
    /// The rate-limit headers its answers carry.
    pub limit_headers: LimitHeaders,
    /// Where its answers state their token usage.
    pub usage_format: UsageFormat,
    /// `insecure_skip_verify = true`: its TLS certificate is NOT checked
    /// (shown so that an operator sees it on `/stats`, not only in the
    /// start log).
    pub insecure_skip_verify: bool,
}

/// The configuration in force, swapped whole by a reload.
pub struct Current {
    /// The settings it was built from.
    pub settings: Arc<Settings>,
    targets: Vec<Target>,
    service: ProxyService,
    /// 1 at start, one more per applied reload.
    pub generation: u64,
    /// Some quota counts tokens: requests are charged an estimate, settled
    /// by their answers' usage.
    counts_tokens: bool,
}

struct Inner {
    current: ArcSwap<Current>,
    layers: Layers,
    handles: Handles,
    upstream: Upstream,
    /// The HTTPS clients, kept across reloads.
    tls: TlsClients,
    counters: Arc<UpstreamCounters>,
    tracked: Arc<TrackedRoutes>,
    simulator: Option<SocketAddr>,
    source: String,
    config_changed: Changed,
    event_clients: AtomicUsize,
    event_bytes: Arc<AtomicUsize>,
    hub: watch::Sender<stats::Published>,
    /// The last publication's sequence number and body, for the hub.
    last_published: Mutex<(u64, String)>,
    shutdown: watch::Sender<bool>,
    started: SystemTime,
    model_key: JsonFieldKey,
    /// Where the gateway listens, once it does: the names it answers to.
    listen: OnceLock<SocketAddr>,
    /// The listener's connection counts, once it serves.
    connections: OnceLock<serve::Connections>,
}

/// The gateway's shared state; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway")
            .field("source", &self.inner.source)
            .field("generation", &self.current().generation)
            .finish_non_exhaustive()
    }
}

/// What a reload did.
#[derive(Debug)]
pub struct Applied {
    /// The new configuration's generation.
    pub generation: u64,
    /// Fields that changed but take effect on restart only.
    pub restart_only: Vec<&'static str>,
}

fn parse_duration(field: &str, text: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    text.map(|t| {
        humantime::parse_duration(t.trim())
            .map_err(|e| ConfigError::new(field, format!("`{t}` is not a duration ({e})")))
    })
    .transpose()
}

impl Gateway {
    /// A gateway for `settings`; `simulator` is where the built-in upstream
    /// listens, if it runs. `source` says where the configuration came from.
    pub fn new(
        settings: Settings,
        simulator: Option<SocketAddr>,
        source: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        // Routes are counted by name only once known to be real, so that
        // made-up models cannot push real routes out of the stats.
        let tracked = Arc::new(TrackedRoutes::new(
            settings.gateway.max_routes,
            settings.gateway.route_idle,
        ));
        tracked.add_configured(&settings);
        let routes = tracked.room();
        let is_tracked = |tracked: &Arc<TrackedRoutes>| {
            let tracked = tracked.clone();
            move |name: &str| tracked.contains(name)
        };
        // The layers' state, made once and as configured (so a start logs
        // no retune); what the settings say of it is applied through the
        // handles, now and on every reload (`live`).
        let limits = settings.stack.rate_limit.clone().unwrap_or_default();
        // Quotas counting tokens are charged each request's estimate,
        // settled at the end of its answer; quotas counting requests, one.
        let rate = RateLimitLayer::from_limits(&limits, RouteKey)
            .with_cost(Estimated(usage::estimated_cost as TokenCost))
            .with_key_stats_where(routes, is_tracked(&tracked));
        let backoff =
            Backoff429Layer::new(RouteKey).with_key_stats_where(routes, is_tracked(&tracked));
        // With a `[store]`, rate limits and cooldowns are shared with every
        // gateway on the same Redis; concurrency stays per gateway.
        #[cfg(feature = "redis")]
        let (rate, backoff) = match settings.stack.redis_store() {
            Some(store) => {
                tracing::info!(
                    prefix = %Escaped(store.prefix()),
                    "rate limits and cooldowns in Redis"
                );
                let rate = rate
                    .with_store(store.clone())
                    .map_err(|e| e.within("rate_limit"))?;
                (rate, backoff.with_store(store.clone()))
            }
            None => (rate, backoff),
        };
        let rate = rate.with_response_headers(NoteQuota);
        let concurrency = ConcurrencyLayer::new(live::max_in_flight(&settings), RouteKey)
            .map_err(|e| e.within("concurrency"))?
            .with_key_stats_where(routes, is_tracked(&tracked));
        let handles = Handles {
            rate: rate.handle(),
            concurrency: concurrency.handle(),
            backoff: backoff.handle(),
            learned: Arc::new(Learner::new(rate.handle())),
        };
        live::apply(&handles, &settings)?;
        let counters = Arc::new(UpstreamCounters::new(tracked.clone()));
        let upstream = Upstream {
            client: http_client(),
            counters: counters.clone(),
            learned: handles.learned.clone(),
        };
        let layers = Layers {
            rate,
            concurrency,
            backoff,
            stable: Mutex::new(None),
        };
        let tls = TlsClients::default();
        let current = build(&layers, &upstream, &tls, simulator, settings, 1)?;
        Ok(Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(current),
                layers,
                handles,
                upstream,
                tls,
                counters,
                tracked,
                simulator,
                source: source.into(),
                config_changed: Changed::default(),
                event_clients: AtomicUsize::new(0),
                event_bytes: Arc::default(),
                hub: watch::Sender::new(stats::Published::default()),
                last_published: Mutex::new((0, String::new())),
                shutdown: watch::Sender::new(false),
                started: SystemTime::now(),
                model_key: JsonFieldKey::new(preset::MODEL_FIELD),
                listen: OnceLock::new(),
                connections: OnceLock::new(),
            }),
        })
    }

    /// Apply a new configuration without a restart: the stateful layers'
    /// settings through their handles (see `live`: spent capacity stays
    /// spent, waiting requests keep their turns, requests in flight their
    /// permits), the rest by swapping the client stack, whose stateful
    /// layers are clones of the running ones. Nothing changes on error.
    pub fn apply(&self, mut settings: Settings) -> Result<Applied, ConfigError> {
        let old = self.current();
        // `--allow-insecure` is the command line's, not the file's: a
        // reload keeps what the process was started with.
        settings.allow_insecure = old.settings.allow_insecure;
        let restart_only = old.settings.restart_only_changes(&settings);
        let generation = old.generation + 1;
        // Everything that can fail is done before anything changes.
        let current = build(
            &self.inner.layers,
            &self.inner.upstream,
            &self.inner.tls,
            self.inner.simulator,
            settings,
            generation,
        )?;
        live::apply(&self.inner.handles, &current.settings)?;
        self.inner.tracked.add_configured(&current.settings);
        self.inner.current.store(Arc::new(current));
        self.inner.config_changed.touch();
        Ok(Applied {
            generation,
            restart_only,
        })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Current> {
        self.inner.current.load_full()
    }

    /// The layers' handles.
    pub fn handles(&self) -> &Handles {
        &self.inner.handles
    }

    /// Upstream answers by route.
    pub fn counters(&self) -> &UpstreamCounters {
        &self.inner.counters
    }

    /// The routes counted by name.
    pub fn tracked(&self) -> &TrackedRoutes {
        &self.inner.tracked
    }

    /// Touched on every applied reload.
    pub fn config_changed(&self) -> &Changed {
        &self.inner.config_changed
    }

    /// Where the configuration came from.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// When the gateway started, in Unix seconds.
    pub fn started_unix(&self) -> u64 {
        self.inner
            .started
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// Connections closed because their client stopped reading a response
    /// for `body_write_timeout` (0 before the gateway serves).
    pub fn write_timeouts(&self) -> u64 {
        self.inner
            .connections
            .get()
            .map_or(0, serve::Connections::write_timeouts)
    }

    /// Where the gateway listens, once it does.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.listen.get().copied()
    }

    /// Clients connected to `/events` now.
    pub fn event_clients(&self) -> &AtomicUsize {
        &self.inner.event_clients
    }

    /// Bytes of snapshots handed to `/events` clients' connections and not
    /// yet written out, counted once per client.
    pub fn event_bytes(&self) -> &Arc<AtomicUsize> {
        &self.inner.event_bytes
    }

    /// The latest stats published to `/events`.
    pub fn hub(&self) -> &watch::Sender<stats::Published> {
        &self.inner.hub
    }

    /// The last publication, for the hub.
    pub fn last_published(&self) -> &Mutex<(u64, String)> {
        &self.inner.last_published
    }

    /// True once shutdown has begun.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.inner.shutdown.subscribe()
    }

    /// Begin shutting down: stop accepting, end `/events` streams (each
    /// gets the final snapshot first), stop watching the config file.
    pub fn begin_shutdown(&self) {
        stats::publish(self);
        self.inner.shutdown.send_replace(true);
    }

    /// The providers, as `/stats` shows them.
    pub fn providers(&self) -> Vec<ProviderInfo> {
        self.current()
            .targets
            .iter()
            .map(|t| ProviderInfo {
                name: t.name.to_string(),
                upstream: format!("{}://{}{}", t.scheme, t.authority, t.base_path),
                default: t.default,
                authenticated: t.credential.is_some(),
                kind: t.kind,
                limit_headers: t.limit_headers,
                usage_format: t.usage_format,
                insecure_skip_verify: t.insecure,
            })
            .collect()
    }
}

/// Resolve the providers and layer the client stack for `settings`.
fn build(
    layers: &Layers,
    upstream: &Upstream,
    tls: &TlsClients,
    simulator: Option<SocketAddr>,
    settings: Settings,
    generation: u64,
) -> Result<Current, ConfigError> {
    let mut targets = Vec::new();
    let mut https = https_clients(tls, &settings)?.into_iter();
    for (i, p) in settings.providers.iter().enumerate() {
        let (scheme, authority, base_path) = match &p.upstream {
            UpstreamKind::Http {
                authority,
                base_path,
            } => (Scheme::HTTP, authority.clone(), base_path.clone()),
            UpstreamKind::Https {
                authority,
                base_path,
                ..
            } => (Scheme::HTTPS, authority.clone(), base_path.clone()),
            UpstreamKind::Simulator => {
                let addr = simulator.ok_or_else(|| {
                    ConfigError::new(
                        format!("providers[{i}].base_url"),
                        "the simulator is not running; a new [simulator] section takes effect on restart",
                    )
                })?;
                let authority = Authority::try_from(addr.to_string()).map_err(|_| {
                    ConfigError::new(format!("providers[{i}].base_url"), "bad simulator address")
                })?;
                (Scheme::HTTP, authority, String::new())
            }
        };
        let (https, insecure) = match &p.upstream {
            UpstreamKind::Https { tls, .. } => (https.next(), tls.insecure_skip_verify),
            _ => (None, false),
        };
        targets.push(Target {
            name: p.name.clone(),
            scheme,
            https,
            authority,
            base_path,
            credential: p.credential.clone(),
            default: p.default,
            kind: p.kind,
            anthropic_version: p.anthropic_version.clone(),
            limit_headers: p.limit_headers,
            usage_format: p.usage_format,
            aliases: p.aliases.clone(),
            rewrite_model: p.rewrite_model,
            api_version: p.api_version.clone(),
            insecure,
        });
    }
    let rate_wait = settings
        .stack
        .rate_limit
        .as_ref()
        .map_or(Duration::ZERO, |l: &Limits| l.max_wait);
    let (max_queue, queue_timeout, release_at_headers) = match &settings.file.concurrency {
        Some(c) => (
            c.max_queue
                .map_or(usize::MAX, |q| usize::try_from(q).unwrap_or(usize::MAX)),
            parse_duration("concurrency.queue_timeout", c.queue_timeout.as_deref())?,
            c.release_at_headers == Some(true),
        ),
        None => (usize::MAX, None, false),
    };
    let backoff_wait = match &settings.file.backoff {
        Some(b) if b.mode.as_deref() == Some("wait") => {
            parse_duration("backoff.max_wait", b.max_wait.as_deref())?.unwrap_or(Duration::ZERO)
        }
        _ => Duration::ZERO,
    };
    let identity = identity_layer(layers, &settings)?;

    let rate = layers.rate.clone().with_max_wait(rate_wait);
    let mut concurrency = layers.concurrency.clone().with_max_queue(max_queue);
    if let Some(timeout) = queue_timeout {
        concurrency = concurrency.with_queue_timeout(timeout);
    }
    if release_at_headers {
        concurrency = concurrency.release_at_headers();
    }
    let backoff = layers.backoff.clone().with_max_wait(backoff_wait);
    let service = ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .map_result(finish)
        .layer(backoff)
        .layer(concurrency)
        .layer(rate)
        .layer(identity)
        .timeout(settings.gateway.upstream_timeout)
        .service(upstream.clone());
    Ok(Current {
        counts_tokens: crate::config::counts_tokens(settings.stack.rate_limit.as_ref()),
        settings: Arc::new(settings),
        targets,
        service: BoxCloneSyncService::new(service),
        generation,
    })
}

/// The HTTPS client of each https provider of `settings`, in order. A
/// provider that skips verification is warned about here: at start and on
/// every reload.
fn https_clients(tls: &TlsClients, settings: &Settings) -> Result<Vec<HttpsClient>, ConfigError> {
    settings.check_insecure()?;
    let mut wanted = Vec::new();
    for p in &settings.providers {
        if let UpstreamKind::Https { tls, .. } = &p.upstream {
            if tls.insecure_skip_verify {
                tracing::warn!(
                    provider = %Quoted(&p.name),
                    "insecure_skip_verify = true: this provider's TLS certificate is NOT checked; \
                     anyone on the path can read and change its traffic, API key included. \
                     For tests only"
                );
            }
            wanted.push(tls);
        }
    }
    tls.clients_for(&wanted)
        .map_err(|m| ConfigError::new("providers", m))
}

/// The identity layer for `settings`, keeping the ids of the first one
/// unless the file pins its own. Rebuilt on every reload, so its rules are
/// live; with the master switch off it has no rule, so it touches nothing.
fn identity_layer(
    layers: &Layers,
    settings: &Settings,
) -> Result<IdentityHeaderLayer, ConfigError> {
    // Checked even when off, so that a bad rule is refused either way.
    let configured = settings.stack.identity_layer()?;
    let mut layer = match configured {
        Some(layer) if live::enabled(settings) => layer,
        _ => IdentityHeaderLayer::new([]).map_err(|e| e.within("identity"))?,
    };
    let mut stable = layers.stable.lock();
    match *stable {
        None => *stable = Some(layer.stable_ids()),
        Some(ids) => {
            let pinned = settings.file.identity.as_ref().map(|c| &c.stable_ids);
            if pinned.is_none_or(|p| p.client.is_none()) {
                layer = layer.with_client_id(ids.client);
            }
            if pinned.is_none_or(|p| p.project.is_none()) {
                layer = layer.with_project_id(ids.project);
            }
            if pinned.is_none_or(|p| p.session.is_none()) {
                layer = layer.with_session_id(ids.session);
            }
        }
    }
    Ok(layer)
}

/// Responses to the client's body type; failures that are not the layers'
/// refusals (those become 429/503 in `ThrottleResponseLayer`) to 502/504.
fn finish(
    result: Result<Response<ConcurrencyBody<Body>>, BoxError>,
) -> Result<Response<Body>, BoxError> {
    match result {
        Ok(mut response) => {
            if let Some(info) = response.extensions_mut().remove::<RateLimitInfo>() {
                RateLimitHeaders::ietf().write(
                    response.headers_mut(),
                    &info.policy,
                    info.quota.as_ref(),
                    info.remaining,
                    info.reset,
                );
            }
            Ok(response.map(Body::new))
        }
        Err(e) if Rejection::of(&e).is_some() => Err(e),
        Err(e) if e.is::<UpstreamTls>() => Ok(json_error(
            StatusCode::BAD_GATEWAY,
            "upstream_tls",
            &format!("{e}; the gateway's log names the provider"),
        )),
        Err(e) if e.is::<tower::timeout::error::Elapsed>() => Ok(json_error(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            "the upstream did not answer within upstream_timeout",
        )),
        Err(_) => Ok(json_error(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "the upstream could not be reached",
        )),
    }
}

/// An error in the same shape as the layers' refusals.
pub fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Request headers a client may carry an API key in: removed when the
/// gateway sends its own (`Authorization` for OpenAI and most others,
/// `x-api-key` for Anthropic, `api-key` for Azure OpenAI).
const CLIENT_CREDENTIALS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];

/// Anthropic's API version header.
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// Request headers that concern one connection, not the request.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Drop hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// The router: the stats endpoints, the live page, and everything else
/// forwarded.
pub fn router(gateway: Gateway) -> Result<Router, ConfigError> {
    let operator = Router::new()
        .route("/", get(stats::page))
        // Browsers ask for it with the page; it is not the upstream's.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/stats", get(operator::get_stats))
        .route("/stats/reset", post(operator::reset))
        .route("/events", get(stats::events))
        .route("/metrics", get(stats::metrics))
        // Each view is built from every route's counters: hammered, they
        // would take the CPU the forwarded requests need (429 beyond).
        .route_layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(operator::rate_limit()?),
        );
    Ok(operator
        .fallback(forward)
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            edge::guard,
        ))
        .with_state(gateway))
}

/// The provider for `path` and the path to send it, or `None`.
fn target_for<'a>(targets: &'a [Target], path: &'a str) -> Option<(&'a Target, &'a str)> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let (first, rest) = match trimmed.find('/') {
        Some(i) => (&trimmed[..i], &trimmed[i..]),
        None => (trimmed, "/"),
    };
    if let Some(t) = targets.iter().find(|t| &*t.name == first) {
        return Some((t, rest));
    }
    targets.iter().find(|t| t.default).map(|t| (t, path))
}

async fn forward(State(gateway): State<Gateway>, req: Request<Body>) -> Response<Body> {
    let current = gateway.current();
    let (parts, body) = req.into_parts();
    if let Some(problem) = edge::path_problem(parts.uri.path()) {
        return json_error(StatusCode::BAD_REQUEST, "bad_path", problem);
    }
    let Some((target, rest)) = target_for(&current.targets, parts.uri.path()) else {
        let names: Vec<&str> = current.targets.iter().map(|t| &*t.name).collect();
        return json_error(
            StatusCode::NOT_FOUND,
            "no_provider",
            &format!(
                "no provider for this path; use /PROVIDER/... with one of: {}",
                names.join(", ")
            ),
        );
    };
    let max_body = current.settings.gateway.max_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large(max_body);
    }
    if let Some(problem) = edge::encoding_problem(&parts.headers) {
        return json_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "bad_encoding", problem);
    }
    let body = match edge::read_body(&gateway, body, &current.settings.gateway).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    if !body.is_empty() && !matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        // No provider's API gives these a body: forwarded, the upstream
        // could act on a model the limiter never read.
        return json_error(
            StatusCode::BAD_REQUEST,
            "body_not_allowed",
            "a request of this method carries no body through the gateway",
        );
    }
    let path_and_query = match (parts.uri.query(), &target.api_version) {
        // A client's own api-version is kept: its body is written for it.
        (Some(q), Some(v)) if !has_param(q, "api-version") => {
            format!("{}{rest}?{q}&api-version={v}", target.base_path)
        }
        (Some(q), _) => format!("{}{rest}?{q}", target.base_path),
        (None, Some(v)) => format!("{}{rest}?api-version={v}", target.base_path),
        (None, None) => format!("{}{rest}", target.base_path),
    };
    let uri = Uri::builder()
        .scheme(target.scheme.clone())
        .authority(target.authority.clone())
        .path_and_query(path_and_query)
        .build();
    let Ok(uri) = uri else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "the request path cannot be forwarded",
        );
    };
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    if target.credential.is_some() {
        // The gateway's key alone goes upstream: a client's key for
        // another provider never leaves, and none can stand in for it.
        for name in &CLIENT_CREDENTIALS {
            headers.remove(name);
        }
    }
    if let Some(version) = &target.anthropic_version {
        // The client's own version wins: its body is written for it.
        headers
            .entry(ANTHROPIC_VERSION)
            .or_insert_with(|| version.clone());
    }
    let mut out = http::Request::new(body);
    *out.method_mut() = parts.method;
    *out.uri_mut() = uri;
    *out.headers_mut() = headers;
    // Only these carry a body (see above), so only these name a model.
    let reads_body = matches!(out.method(), &Method::POST | &Method::PUT | &Method::PATCH);
    // On an Azure deployment path the deployment is the model, whatever
    // the body says (Azure serves what is deployed under that name).
    let deployment = match target.kind {
        Kind::AzureOpenAi => preset::deployment(out.uri().path()).map(str::to_owned),
        _ => None,
    };
    let multipart = multipart::boundary(out.headers());
    let named = match key_parts(&gateway.inner.model_key, &out) {
        _ if deployment.is_some() => deployment,
        _ if !reads_body => None,
        // A form (an audio file to transcribe): its `model` field, read as
        // strictly as JSON's.
        _ if multipart.is_some() => {
            let read = match multipart {
                Some(Ok(boundary)) => multipart::model(out.body().clone(), boundary).await,
                Some(Err(problem)) => Err(problem),
                None => Ok(None),
            };
            match read {
                Ok(model) => model,
                Err(multipart::Problem::Ambiguous) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "ambiguous_body",
                        "the form has more than one model field",
                    );
                }
                Err(multipart::Problem::Malformed(e)) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "bad_multipart",
                        &format!("the form cannot be read: {e}"),
                    );
                }
            }
        }
        Ok(mut parts) => parts.pop(),
        // The limiter could count another model than the upstream serves.
        Err(KeyError::Ambiguous(e)) => {
            return json_error(StatusCode::BAD_REQUEST, "ambiguous_body", &e.to_string());
        }
        Err(_) => None,
    };
    if let Some(problem) = named.as_deref().and_then(edge::model_problem) {
        return json_error(StatusCode::BAD_REQUEST, "bad_model", problem);
    }
    // Counted under the model the upstream serves; the body goes as sent
    // unless the provider rewrites it to name that model.
    let model = match (reads_body, target.aliases.resolve(named.as_deref())) {
        (true, Some(resolved)) => {
            if target.rewrite_model && named.as_deref() != Some(&**resolved) {
                if let Some(body) = preset::rewrite_model(out.body(), resolved) {
                    *out.body_mut() = body;
                }
            }
            resolved.clone()
        }
        _ => Arc::from(named.as_deref().unwrap_or(NO_MODEL)),
    };
    let route = Route {
        provider: target.name.clone(),
        model,
    };
    out.extensions_mut().insert(route.clone());
    gateway.handles().learned.prepare(&route);
    if let Some(credential) = &target.credential {
        out.extensions_mut().insert(Outbound(credential.clone()));
    }
    // Charged its estimate, settled by its answer's usage: only on the
    // endpoints that answer with one (a file upload is not a prompt).
    let answers_usage = target
        .kind
        .endpoint(out.uri().path())
        .is_some_and(|e| e.usage);
    let settlement = (current.counts_tokens && reads_body && answers_usage).then(|| {
        let settlement = Settlement::new();
        let estimate = usage::estimate(out.body());
        out.extensions_mut().insert(estimate);
        out.extensions_mut().insert(settlement.clone());
        settlement
    });
    // A stream of OpenAI's shape reports its usage only when asked: asked
    // on the client's behalf, and the chunk taken out of what it receives.
    let mut unasked = false;
    if settlement.is_some() && target.kind.streams_usage_on_request(out.uri().path()) {
        if let Some(body) = usage::ask_for_usage(out.body()) {
            *out.body_mut() = body;
            unasked = true;
        }
    }
    if let Some(client) = &target.https {
        out.extensions_mut().insert(Via(client.clone()));
    }
    let method = out.method().clone();
    let response = match current.service.clone().oneshot(out).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (mut parts, mut body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // Only an answer the upstream gave; a refusal or an error of the
    // gateway's own reports no usage, and its request was not admitted.
    if let Some((settlement, charged)) = settlement.and_then(|s| s.charged().map(|c| (s, c))) {
        if unasked {
            // The chunk taken out makes the answer shorter than it said.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let counters = gateway.inner.counters.clone();
        let settled = route.clone();
        let tally = Tally::new(move |used| counters.settled(&settled, charged, used));
        body = Body::new(UsageBody::new(
            body,
            &parts.headers,
            settlement,
            tally,
            unasked,
        ));
    }
    tracing::debug!(
        route = %Quoted(&route.to_string()),
        %method,
        status = parts.status.as_u16(),
        "forwarded"
    );
    Response::from_parts(parts, body)
}

/// Whether query `q` has parameter `name` (as written: a client that
/// encodes the name differently gets one added, which Azure refuses
/// loudly rather than guessing).
fn has_param(q: &str, name: &str) -> bool {
    q.split('&')
        .any(|pair| pair.split('=').next() == Some(name))
}

fn too_large(max: usize) -> Response<Body> {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        &edge::too_large_message(max),
    )
}

/// Why the proxy could not start.
#[derive(Debug)]
pub enum StartError {
    /// The configuration cannot run (exit code 2).
    Config(ConfigError),
    /// A socket could not be opened (exit code 1).
    Io(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "{e}"),
            Self::Io(e) => f.write_str(e),
        }
    }
}

/// A gateway serving, with its simulator if it has one.
pub struct Running {
    /// The gateway's state.
    pub gateway: Gateway,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The built-in upstream, if configured.
    pub simulator: Option<Simulator>,
    /// Client connections and requests in progress.
    pub connections: serve::Connections,
    server: JoinHandle<()>,
    hub: JoinHandle<()>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Start the simulator (if configured), then the gateway on `listen`.
pub async fn start(
    settings: Settings,
    listen: SocketAddr,
    source: impl Into<String>,
) -> Result<Running, StartError> {
    let simulator = match &settings.simulator {
        Some(sim) => Some(Simulator::start(sim.clone()).await.map_err(|e| {
            StartError::Io(format!("cannot start the simulator on {}: {e}", sim.listen))
        })?),
        None => None,
    };
    let gateway = Gateway::new(settings, simulator.as_ref().map(Simulator::addr), source)
        .map_err(StartError::Config)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| StartError::Io(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Io(format!("cannot listen on {listen}: {e}")))?;
    let _ = gateway.inner.listen.set(addr);
    if addr.ip().is_unspecified() {
        tracing::warn!(
            %addr,
            "listening on every interface: requests are answered for localhost and IP \
             addresses on this port; other host names need gateway.allowed_hosts"
        );
    }
    let limits = serve_limits(&gateway.current().settings.gateway);
    let hub = tokio::spawn(stats::run_hub(gateway.clone()));
    let app = router(gateway.clone()).map_err(StartError::Config)?;
    let mut stop = gateway.shutdown_signal();
    let connections = serve::Connections::default();
    let _ = gateway.inner.connections.set(connections.clone());
    let server = tokio::spawn(serve::serve(
        listener,
        app,
        limits,
        connections.clone(),
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ));
    Ok(Running {
        gateway,
        addr,
        simulator,
        connections,
        server,
        hub,
    })
}

/// The server's limits from `[gateway]`; a `max_connections` the fd limit
/// cannot carry is logged, since the process would run out of descriptors
/// before it reached it.
fn serve_limits(settings: &GatewaySettings) -> serve::ServeLimits {
    let max_connections = settings
        .max_connections
        .unwrap_or_else(serve::default_max_connections);
    let fd_limit = serve::fd_limit();
    if let Some(fds) = fd_limit {
        if max_connections as u64 > serve::connections_within(fds) {
            tracing::warn!(
                max_connections,
                fd_limit = fds,
                "max_connections is above what the open-file limit can carry; raise `ulimit -n` or lower it"
            );
        }
    }
    tracing::debug!(max_connections, ?fd_limit, "connection limit");
    serve::ServeLimits {
        max_connections,
        header_read_timeout: settings.header_read_timeout,
        max_header_bytes: settings.max_header_bytes,
        body_write_timeout: settings.body_write_timeout,
    }
}

impl Running {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, end `/events` streams, let in-flight requests finish
    /// for at most `shutdown_grace`, then stop the simulator. Connections
    /// with no request in progress (idle, or a request head never
    /// completed) are closed at once. True when everything finished in
    /// time.
    pub async fn shutdown(mut self) -> bool {
        let grace = self.gateway.current().settings.gateway.shutdown_grace;
        self.gateway.begin_shutdown();
        let in_flight = self.connections.requests();
        if in_flight > 0 {
            tracing::info!(in_flight, ?grace, "waiting for requests in flight");
        }
        let clean = tokio::time::timeout(grace, &mut self.server).await.is_ok();
        if !clean {
            tracing::warn!(
                in_flight = self.connections.requests(),
                ?grace,
                "requests still in flight after shutdown_grace; closing them"
            );
            self.server.abort();
        }
        if let Some(simulator) = self.simulator.take() {
            simulator.stop(Duration::from_secs(1)).await;
        }
        self.hub.abort();
        clean
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.abort();
        self.hub.abort();
    }
}
