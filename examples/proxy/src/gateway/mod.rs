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

// The state (`Gateway` and what it holds) is here; what it does, in the
// modules below, whose public items keep their paths `gateway::Name`.
mod build;
mod callers;
mod counts;
mod deploy;
mod forward;
mod route;
mod running;
mod upstream;

pub use callers::{ANONYMOUS, Caller, CallerStats, bearer_token};
pub use counts::{Changed, TokenCounts, UpstreamCounters, UpstreamCounts};
pub use deploy::{DOWN_FOR, DeploymentShare, RouteShares};
pub use forward::router;
pub use route::{NO_MODEL, NoteQuota, Route, RouteKey};
pub use running::{Running, StartError, start};
pub use upstream::Upstream;

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::http::{HeaderValue, Response};
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::watch;
use tower::util::BoxCloneSyncService;
use tower_throttle::backoff::{Backoff429Layer, BackoffHandle};
use tower_throttle::concurrency::{ConcurrencyHandle, ConcurrencyLayer};
use tower_throttle::error::ConfigError;
use tower_throttle::fair::FairQueueLayer;
use tower_throttle::identity::StableIds;
use tower_throttle::key::JsonFieldKey;
use tower_throttle::rate_limit::{CountAll, Estimated, RateLimitHandle, RateLimitLayer};
#[cfg(feature = "redis")]
use tower_throttle::redact::Escaped;

use crate::access_log::AccessLog;
use crate::config::{Credential, Settings};
use crate::learn::Learner;
use crate::preset::{self, Aliases, Kind, LimitHeaders, UsageFormat};
use crate::stats::TrackedRoutes;
use crate::tls::{HttpsClient, TlsClients};
use crate::{health, live, serve, stats, usage};
use build::build;
use callers::{CLIENT_LIMIT, CallerCounts, Callers, ClientKey, ClientModelKey, PassedRoute};
use deploy::{DeployState, Dispatch};
use upstream::http_client;

/// The whole client stack, boxed so a reload can swap it.
pub type ProxyService = BoxCloneSyncService<http::Request<Bytes>, Response<Body>, Infallible>;

/// The stateful layers, built once: their limiters, permits and cooldowns
/// outlive every reload. Each reload layers clones of them (sharing that
/// state) with the new waits and queue limits.
struct Layers {
    rate: RateLimitLayer<RouteKey, Estimated<TokenCost>, CountAll, NoteQuota>,
    /// A route's waiters take turns by client (a fair share of the route).
    concurrency: ConcurrencyLayer<RouteKey, ClientKey>,
    /// The line of requests waiting for a route's rate, in turns by
    /// client; `None` with a Redis store (each request would hold its
    /// route's turn for a round trip to Redis).
    fair: Option<FairQueueLayer<RouteKey, ClientKey>>,
    backoff: Backoff429Layer<RouteKey>,
    /// The identity layer's client/project/session ids, kept across reloads.
    stable: Mutex<Option<StableIds>>,
    /// Deployments' counts and failures, kept across reloads.
    deploy: DeployState,
    /// Requests per client, kept across reloads.
    callers: CallerCounts,
    /// The clients' own quotas, judged before the routes'.
    clients: RateLimitLayer<ClientKey, Estimated<TokenCost>, PassedRoute>,
    /// The clients' quotas per model pattern, judged with them.
    client_models: RateLimitLayer<ClientModelKey, Estimated<TokenCost>, PassedRoute>,
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
    /// The clients' own quotas.
    pub clients: RateLimitHandle,
    /// The clients' quotas per model pattern.
    pub client_models: RateLimitHandle,
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
    /// `[[routes]]`: models served by several deployments.
    dispatch: Dispatch,
    /// `[[clients]]`: who sends each request.
    callers: Callers,
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
    /// What `/readyz` depends on.
    dependencies: health::Dependencies,
    /// The access log, when `[gateway] access_log` is set.
    access_log: Option<AccessLog>,
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
        let store = settings.stack.redis_store().cloned();
        #[cfg(feature = "redis")]
        let (rate, backoff) = match store.clone() {
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
        // With a store too: the route's turn is then held for the rate
        // limiter's round trip to Redis, which bounds a route's requests
        // to one per round trip while clients wait (1,000/s at 1 ms).
        let fair = Some(FairQueueLayer::new(RouteKey, ClientKey));
        let concurrency = ConcurrencyLayer::new(live::max_in_flight(&settings), RouteKey)
            .map_err(|e| e.within("concurrency"))?
            .with_key_stats_where(routes, is_tracked(&tracked))
            .with_fair_share(ClientKey);
        // A client over its own quota is refused at once; one the routes
        // refuse gets back what it took (see `callers`).
        let client_limits =
            crate::config::client_limits(&settings.clients).map_err(|e| e.within("clients"))?;
        // Counting requests, or tokens (`unit = "tokens"`) as the routes'
        // quotas do: charged the estimate, settled with the route's.
        let clients = RateLimitLayer::from_limits(&client_limits, ClientKey)
            .with_cost(Estimated(usage::estimated_cost as TokenCost))
            .count_only(PassedRoute)
            .with_name(CLIENT_LIMIT);
        let model_limits = crate::config::client_model_limits(&settings.clients)
            .map_err(|e| e.within("clients"))?;
        let client_models = RateLimitLayer::from_limits(&model_limits, ClientModelKey)
            .with_cost(Estimated(usage::estimated_cost as TokenCost))
            .count_only(PassedRoute)
            .with_name(CLIENT_LIMIT);
        let rate = rate.with_name("route");
        let handles = Handles {
            clients: clients.handle(),
            client_models: client_models.handle(),
            rate: rate.handle(),
            concurrency: concurrency.handle(),
            backoff: backoff.handle(),
            learned: Arc::new(Learner::new(rate.handle())),
        };
        #[cfg(feature = "redis")]
        if let Some(store) = &store {
            // What one gateway learns of a provider's limits, all apply.
            handles.learned.share_through(store.clone());
        }
        live::apply(&handles, &settings)?;
        let counters = Arc::new(UpstreamCounters::new(tracked.clone()));
        // Opened before anything serves: a path that cannot be written is
        // a mistake in the configuration.
        let access_log = match &settings.gateway.access_log {
            Some(log) => Some(AccessLog::start(log).map_err(|e| {
                ConfigError::new(
                    "gateway.access_log",
                    tower_throttle::redact::Escaped(&e.to_string()).to_string(),
                )
            })?),
            None => None,
        };
        let upstream = Upstream {
            client: http_client(),
            counters: counters.clone(),
            learned: handles.learned.clone(),
            // Read only for the log: a parse per answer otherwise spent.
            log_limits: access_log.is_some(),
        };
        let layers = Layers {
            rate,
            concurrency,
            fair,
            backoff,
            stable: Mutex::new(None),
            deploy: DeployState::default(),
            callers: CallerCounts::default(),
            clients,
            client_models,
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
                #[cfg(feature = "redis")]
                dependencies: health::Dependencies::on(store.as_ref()),
                #[cfg(not(feature = "redis"))]
                dependencies: health::Dependencies::default(),
                access_log,
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

    /// Requests per client (none without `[[clients]]`).
    pub fn caller_stats(&self) -> Vec<CallerStats> {
        self.current().callers.stats()
    }

    /// Each `[[routes]]` model's deployments and their shares.
    pub fn deployment_shares(&self) -> Vec<RouteShares> {
        self.current().dispatch.shares(&self.inner.layers.deploy)
    }

    /// The access log, when one is written.
    pub fn access_log(&self) -> Option<&AccessLog> {
        self.inner.access_log.as_ref()
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Current> {
        self.inner.current.load_full()
    }

    /// Whether the gateway can serve (`/readyz`).
    pub async fn readiness(&self) -> health::Readiness {
        self.inner.dependencies.readiness().await
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
