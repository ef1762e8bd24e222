//! Limits learned from the provider (`learn_limits = true` on a provider):
//! its routes are held to what its responses say, never looser than the
//! configuration.
//!
//! Every response of such a provider is read with the crate's
//! [`announced_limits_in`], in the family of headers the provider's
//! `limit_headers` names (OpenAI `x-ratelimit-*`, Anthropic
//! `anthropic-ratelimit-*`, or the IETF `RateLimit`/`RateLimit-Policy`
//! fields and the earlier draft's), so that another family's headers (a
//! CDN's) are not taken for its limits. The values are kept per route and
//! shown in `/stats` and `/metrics`.
//!
//! How a learned request limit `L` per window `W` tightens a route: the
//! route gets a rule of its own, named `(learned PROVIDER/MODEL)`,
//! matching exactly its provider and model, with the quotas the configuration gives the route
//! (its rule's, or the default quotas when no rule matches), each request
//! quota of period `W` lowered to `L` (limit and burst; never raised), and,
//! when the route has no quota of period `W` (or none at all), a quota of
//! `L` per `W` added with the algorithm of its other quotas. So the route
//! never goes above the configuration and never above what the provider
//! states.
//!
//! The rule is made when a route of a learning provider is first seen,
//! before its first request is admitted, with the configured quotas as
//! they are: learning then retunes that rule in place, so the route keeps
//! what it has spent (a key moved to another rule would start it spent).
//! One caveat follows from the crate's retune: a quota added for a period
//! the configuration lacks starts whole, and a token bucket lowered to `L`
//! keeps up to `L` available, so in the window a route first learns its
//! limit, it may admit what it had admitted before on top (exactly `L` with
//! a sliding or fixed window already of that period).
//!
//! The limiter is retuned only when a learned limit changes, at most once
//! a second per route (a change within that second is applied with the
//! route's next request or response after it), and at most `max_routes`
//! routes learn.
//!
//! A learned limit is released (the route goes back to its configured
//! quotas) when a response states a higher one (up to the configured
//! value, which `tighten` never exceeds), after [`RELEASE_AFTER_SILENT`]
//! responses in a row that state none, or when the route's next request
//! comes [`LAPSE_AFTER`] (an hour) after its last response. Refusals by the
//! learned limit itself release nothing: they are not responses. Each
//! change is logged, at most one line per route per [`LOG_EVERY`].
//! A reload re-applies the learned rules on top of the new configuration;
//! a provider whose `learn_limits` a reload turns off has its learned
//! rules dropped (its routes go back to their configured rule, spent).
//!
//! Token limits (`x-ratelimit-limit-tokens`, `anthropic-ratelimit-tokens-*`,
//! an IETF policy with `qu="tokens"`) tighten the route's quotas that count
//! tokens (`unit = "tokens"`) the same way; a route with none gets none
//! added, since it is charged no token estimate to count against one.
//!
//! `remaining = 0` with a reset: the backoff layer's proactive mode starts
//! the route's cooldown from that response, before any 429. The gateway
//! turns proactive mode on whenever a provider learns (see `live`); on
//! other providers' routes it acts only on a response that says its limit
//! is spent, which a 429 would follow anyway.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use parking_lot::Mutex;
use tower_throttle::backoff::{HeaderFamily, announced_limits_in};
use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::{KeyPattern, Limits, Quota, RateLimitHandle, Rule};
use tower_throttle::redact::{Escaped, Quoted};

use crate::config::Settings;
use crate::gateway::Route;

mod info;
mod shared;
mod tighten;

pub use info::{LearnedInfo, QuotaInfo, UnitInfo};
pub use shared::SYNC_EVERY;
pub use tighten::{Learned, Unit, tighten};

use info::record;

/// How learned rules are named: `(learned openai/gpt-4o)`. Configured
/// rules may not start so (see `config`).
pub const RULE_PREFIX: &str = "(learned ";

/// The shortest time between two retunes for one route.
pub const RETUNE_EVERY: Duration = Duration::from_secs(1);

/// Responses in a row that state no limit, after which a route's learned
/// limits are released: the provider stopped announcing them (a changed
/// plan, another deployment behind the same URL). Several, so that one
/// error page from a proxy in between does not release them.
pub const RELEASE_AFTER_SILENT: u32 = 5;

/// How long a learned limit lasts with no response at all on its route.
/// Not shorter: refusals by the learned limit itself stop the responses
/// that would restate it, and that must not loosen it.
pub const LAPSE_AFTER: Duration = Duration::from_secs(3600);

/// The shortest time between two log lines for one route's changes.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// A route's learned request and token limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Limited {
    requests: Option<Learned>,
    tokens: Option<Learned>,
}

/// One learning route.
struct Entry {
    id: u64,
    info: LearnedInfo,
    /// The request and token limits the rule holds now.
    applied: Limited,
    /// The request and token limits last said.
    said: Limited,
    last_retune: Option<Instant>,
    /// The last response on the route, with or without limits.
    last_response: Instant,
    /// Responses in a row that stated no limit.
    silent: u32,
    /// The last change logged, and how many changes were not logged since.
    logged: Option<Instant>,
    unlogged: u32,
    /// The newest note from another gateway applied (see `shared`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    synced: u64,
}

impl Entry {
    /// Forget what was said: the route goes back to its configuration.
    fn release(&mut self) {
        self.said = Limited::default();
    }

    /// Apply what was said, if it changed and the route may be retuned
    /// `at`; true when it was. A release is applied at once: it follows
    /// several responses, so it cannot come faster than they do.
    fn apply_said(&mut self, at: Instant) -> bool {
        let due = self.said == Limited::default()
            || self
                .last_retune
                .is_none_or(|last| at.saturating_duration_since(last) >= RETUNE_EVERY);
        if self.said == self.applied || !due {
            return false;
        }
        self.applied = self.said;
        self.last_retune = Some(at);
        self.info.in_force = self.applied.requests.is_some() || self.applied.tokens.is_some();
        true
    }

    /// One log line per route per [`LOG_EVERY`] at most: a provider whose
    /// stated limit moves with every response must not flood the log.
    fn log_change(&mut self, route: &Route, at: Instant) {
        if self
            .logged
            .is_some_and(|last| at.saturating_duration_since(last) < LOG_EVERY)
        {
            self.unlogged = self.unlogged.saturating_add(1);
            return;
        }
        let unlogged = std::mem::take(&mut self.unlogged);
        self.logged = Some(at);
        let route = Quoted(&route.to_string()).to_string();
        if self.applied == Limited::default() {
            tracing::info!(
                route,
                changes_not_logged = unlogged,
                "learn_limits: released; the route is back to its configured limits"
            );
        } else {
            tracing::info!(
                route,
                requests = self.applied.requests.map(|l| l.limit),
                tokens = self.applied.tokens.map(|l| l.limit),
                window = ?self.applied.requests.or(self.applied.tokens).map(|l| l.window),
                changes_not_logged = unlogged,
                "learn_limits: the provider states its limits"
            );
        }
    }
}

/// The configuration the learned rules are built on.
#[derive(Default)]
struct Config {
    /// The learning providers, and the headers each states its limits in.
    learning: HashMap<Arc<str>, HeaderFamily>,
    limits: Limits,
    max_routes: usize,
}

#[derive(Default)]
struct State {
    config: Config,
    routes: HashMap<Route, Entry>,
    next_id: u64,
    /// `max_routes` was reached and said so.
    full: bool,
}

/// The learned limits of every route, and the rules they make.
pub struct Learner {
    rate: RateLimitHandle,
    /// Some provider learns: lets the others' requests skip the lock.
    any: AtomicBool,
    state: Mutex<State>,
    /// What is learned here, told to the other gateways on the same Redis.
    sharing: shared::Sharing,
}

impl fmt::Debug for Learner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Learner")
            .field("routes", &self.state.lock().routes.len())
            .finish_non_exhaustive()
    }
}

impl Learner {
    /// Learned rules for the limiter behind `rate`; none until
    /// [`apply`](Self::apply).
    pub fn new(rate: RateLimitHandle) -> Self {
        Self {
            rate,
            any: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            sharing: shared::Sharing::default(),
        }
    }

    /// Apply `limits` (from `settings`) to the rate limiter with the
    /// learned rules on top; a provider no longer learning loses its
    /// routes' rules. Nothing changes on error.
    pub fn apply(&self, settings: &Settings, limits: &Limits) -> Result<(), ConfigError> {
        let mut state = self.state.lock();
        let config = Config {
            learning: settings
                .providers
                .iter()
                .filter(|p| p.learn_limits)
                .map(|p| (p.name.clone(), p.limit_headers.family()))
                .collect(),
            limits: limits.clone(),
            max_routes: settings.gateway.max_routes,
        };
        let mut with_learned = limits.clone();
        with_learned.rules = rules(&config, &state.routes)?;
        self.rate.apply(&with_learned)?;
        self.any
            .store(!config.learning.is_empty(), Ordering::Relaxed);
        state
            .routes
            .retain(|route, _| config.learning.contains_key(&route.provider));
        state.config = config;
        Ok(())
    }

    /// The configured limits last applied (without what was learned).
    pub fn configured(&self) -> Limits {
        self.state.lock().config.limits.clone()
    }

    /// Before `route`'s request is admitted: give a new route of a learning
    /// provider its rule, so that learning later retunes it in place; and
    /// release a route's learned limits after [`LAPSE_AFTER`] without a
    /// response.
    pub fn prepare(&self, route: &Route) {
        self.prepare_at(route, Instant::now());
    }

    /// [`prepare`](Self::prepare) at `at`.
    pub fn prepare_at(&self, route: &Route, at: Instant) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock();
        if !state.config.learning.contains_key(&route.provider) {
            return;
        }
        if let Some(entry) = state.routes.get_mut(route) {
            if at.saturating_duration_since(entry.last_response) >= LAPSE_AFTER {
                entry.release();
            }
            // Also a change held back by RETUNE_EVERY, now due.
            if entry.apply_said(at) {
                entry.log_change(route, at);
                self.sharing.publish(route, entry.applied);
                self.retune(&mut state);
            }
            return;
        }
        if add(&mut state, route, at).is_some() {
            self.retune(&mut state);
        }
    }

    /// Apply what another gateway on the same Redis learned of `route`
    /// (put at `put`, microseconds on Redis's clock): as if its response had
    /// come here. Nothing for a provider that does not learn here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn apply_shared(&self, route: &Route, said: Limited, put: u64, at: Instant) {
        let mut state = self.state.lock();
        if !state.config.learning.contains_key(&route.provider) {
            return;
        }
        let known = state.routes.contains_key(route);
        let Some(entry) = add(&mut state, route, at) else {
            return;
        };
        if entry.synced >= put {
            return;
        }
        entry.synced = put;
        entry.said = said;
        entry.silent = 0;
        entry.last_response = at;
        if entry.apply_said(at) {
            entry.log_change(route, at);
            self.retune(&mut state);
        } else if !known {
            self.retune(&mut state);
        }
    }

    /// Read what `route`'s response says of its limits; retune when its
    /// limits changed (at most once a second per route). After
    /// [`RELEASE_AFTER_SILENT`] responses in a row that state none, the
    /// route's learned limits are released.
    pub fn observe(&self, route: &Route, headers: &HeaderMap) {
        self.observe_at(route, headers, SystemTime::now(), Instant::now());
    }

    /// [`observe`](Self::observe) at wall-clock `now`, monotonic `at`.
    pub fn observe_at(&self, route: &Route, headers: &HeaderMap, now: SystemTime, at: Instant) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock();
        let Some(&family) = state.config.learning.get(&route.provider) else {
            return;
        };
        let Some(entry) = state.routes.get_mut(route) else {
            return;
        };
        entry.last_response = at;
        let said = announced_limits_in(headers, now, family);
        if said.is_empty() {
            entry.silent = entry.silent.saturating_add(1);
            if entry.silent >= RELEASE_AFTER_SILENT {
                entry.release();
            }
        } else {
            entry.silent = 0;
            record(&mut entry.info, &said, now);
            if let Some(learned) = Learned::from_announced(&said.requests) {
                entry.said.requests = Some(learned);
            }
            if let Some(learned) = Learned::from_announced(&said.tokens) {
                entry.said.tokens = Some(learned);
            }
        }
        if entry.apply_said(at) {
            entry.log_change(route, at);
            self.sharing.publish(route, entry.applied);
            self.retune(&mut state);
        }
    }

    /// Every learning route's learned values, by route name.
    pub fn snapshot(&self) -> HashMap<String, LearnedInfo> {
        let state = self.state.lock();
        state
            .routes
            .iter()
            .map(|(route, entry)| {
                let (configured, _, quotas) = route_quotas(&state.config, route, entry);
                let info = LearnedInfo {
                    configured: configured.iter().map(QuotaInfo::from).collect(),
                    quotas: quotas.iter().map(QuotaInfo::from).collect(),
                    ..entry.info.clone()
                };
                (route.to_string(), info)
            })
            .collect()
    }

    fn retune(&self, state: &mut State) {
        let result = rules(&state.config, &state.routes)
            .and_then(|rules| self.rate.retune(state.config.limits.default.clone(), rules));
        if let Err(e) = result {
            // A rule's name carries the route's model, the client's text.
            tracing::warn!(
                error = %Quoted(&Escaped(&e.to_string()).to_string()),
                "learn_limits: the rate limiter was not retuned"
            );
        }
    }
}

/// `route`'s entry, made when it has none and `max_routes` allows (the
/// route keeps its configured limits when it does not).
fn add<'s>(state: &'s mut State, route: &Route, at: Instant) -> Option<&'s mut Entry> {
    if !state.routes.contains_key(route) {
        if state.routes.len() >= state.config.max_routes {
            if !state.full {
                state.full = true;
                tracing::warn!(
                    max_routes = state.config.max_routes,
                    "learn_limits: max_routes routes learn already; new routes keep their configured limits"
                );
            }
            return None;
        }
        let id = state.next_id;
        state.next_id += 1;
        let entry = Entry {
            id,
            info: LearnedInfo {
                rule: rule_name(route),
                ..LearnedInfo::default()
            },
            applied: Limited::default(),
            said: Limited::default(),
            last_retune: None,
            last_response: at,
            silent: 0,
            logged: None,
            unlogged: 0,
            synced: 0,
        };
        state.routes.insert(route.clone(), entry);
    }
    state.routes.get_mut(route)
}

/// The route's rule's name, from the route itself: the same in every
/// gateway and after a restart, so that gateways sharing their limits
/// through Redis (where state is kept by rule name) share the learned ones.
fn rule_name(route: &Route) -> String {
    format!("{RULE_PREFIX}{route})")
}

/// The quotas the configuration gives `route`, whether its rule is a dry
/// run, and those quotas tightened by what `entry` holds in force.
fn route_quotas<'c>(
    config: &'c Config,
    route: &Route,
    entry: &Entry,
) -> (&'c [Quota], bool, Vec<Quota>) {
    let parts = [&*route.provider, &*route.model];
    let (configured, dry_run) = match Rule::find(&config.limits.rules, &parts) {
        Some(rule) => (rule.quotas(), rule.is_dry_run()),
        None => (&config.limits.default[..], false),
    };
    let requests: Vec<Learned> = entry.applied.requests.into_iter().collect();
    let tokens: Vec<Learned> = entry.applied.tokens.into_iter().collect();
    let quotas = tighten(configured, Unit::Requests, &requests);
    let quotas = tighten(&quotas, Unit::Tokens, &tokens);
    (configured, dry_run, quotas)
}

/// The learned rules (first, so that they win over a configured rule of the
/// same exact route) and then the configured ones.
fn rules(config: &Config, routes: &HashMap<Route, Entry>) -> Result<Vec<Rule>, ConfigError> {
    let mut learning: Vec<(&Route, &Entry)> = routes
        .iter()
        .filter(|(route, _)| config.learning.contains_key(&route.provider))
        .collect();
    learning.sort_by_key(|(_, entry)| entry.id);
    let mut rules = Vec::with_capacity(learning.len() + config.limits.rules.len());
    for (route, entry) in learning {
        let (_, dry_run, quotas) = route_quotas(config, route, entry);
        let parts = [&*route.provider, &*route.model];
        let mut rule =
            Rule::new(rule_name(route), KeyPattern::literal(parts)?).with_dry_run(dry_run);
        for quota in quotas {
            rule = rule.with_quota(quota);
        }
        rules.push(rule);
    }
    rules.extend(config.limits.rules.iter().cloned());
    Ok(rules)
}

#[cfg(test)]
mod tests;
