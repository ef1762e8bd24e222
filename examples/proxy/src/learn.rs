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
//! route's next response after it), and at most `max_routes` routes learn.
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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use parking_lot::Mutex;
use serde::Serialize;
use tower_throttle::backoff::{Announced, Announcement, HeaderFamily, announced_limits_in};
use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::{
    Algorithm, KeyPattern, Limits, Quota, RateLimitHandle, Rule, Unit as QuotaUnit,
};
use tower_throttle::redact::{Escaped, Quoted};

use crate::config::Settings;
use crate::gateway::Route;

/// How learned rules are named: `(learned openai/gpt-4o)`. Configured
/// rules may not start so (see `config`).
pub const RULE_PREFIX: &str = "(learned ";

/// The shortest time between two retunes for one route.
pub const RETUNE_EVERY: Duration = Duration::from_secs(1);

/// What a quota counts, and so which learned limits may tighten it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Requests: `x-ratelimit-limit-requests` and the like.
    Requests,
    /// Tokens (a cost): `x-ratelimit-limit-tokens` and the like.
    Tokens,
}

/// One learned limit: `limit` units per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    /// Units per window.
    pub limit: u32,
    /// The window.
    pub window: Duration,
}

impl Learned {
    /// A limit a quota can be lowered to, from what a response said; `None`
    /// for a zero limit (which would silence the route: not trusted), no
    /// window, or a window no quota can have.
    pub fn from_announced(said: &Announced) -> Option<Self> {
        let limit = u32::try_from(said.limit?).unwrap_or(u32::MAX);
        let window = said.window?;
        Quota::new(limit, window).ok()?;
        Some(Self { limit, window })
    }
}

/// `quotas` tightened to `learned`, for the quotas counting `unit`: each of
/// the window's period lowered to the learned limit (never raised), and a
/// quota of the learned limit added when none has that period.
///
/// A token limit only lowers quotas counting tokens: a route with none is
/// charged no estimate, so one added would count a token per request.
pub fn tighten(quotas: &[Quota], unit: Unit, learned: &[Learned]) -> Vec<Quota> {
    let counts = |q: &Quota| match unit {
        Unit::Requests => q.unit() == QuotaUnit::Requests,
        Unit::Tokens => q.unit() == QuotaUnit::Cost,
    };
    let mut out = quotas.to_vec();
    for l in learned {
        let mut found = false;
        for q in out.iter_mut().filter(|q| counts(q)) {
            if q.period() != l.window || q.algorithm() == Algorithm::TurnBudget {
                continue;
            }
            found = true;
            if let Some(lower) = lowered(q, l.limit) {
                *q = lower;
            }
        }
        if !found && unit == Unit::Requests {
            let algorithm = quotas
                .iter()
                .map(Quota::algorithm)
                .find(|a| *a != Algorithm::TurnBudget)
                .unwrap_or(Algorithm::TokenBucket);
            if let Ok(q) = Quota::new(l.limit, l.window) {
                out.push(q.with_algorithm(algorithm).with_unit(QuotaUnit::Requests));
            }
        }
    }
    out
}

/// `q` with its limit (and burst) at most `limit`; `None` when that changes
/// nothing or cannot be built.
fn lowered(q: &Quota, limit: u32) -> Option<Quota> {
    if limit >= q.limit() {
        return None;
    }
    let lower = Quota::new(limit, q.period())
        .ok()?
        .with_algorithm(q.algorithm())
        .with_unit(q.unit());
    if q.algorithm() == Algorithm::TokenBucket {
        lower.with_burst(q.burst().min(limit)).ok()
    } else {
        Some(lower)
    }
}

/// What a route's provider said of one unit, and when.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitInfo {
    /// Units per window.
    pub limit: Option<u64>,
    /// Units left when it was said.
    pub remaining: Option<u64>,
    /// Seconds until the limit was whole again, as said.
    pub reset_seconds: Option<f64>,
    /// The window, seconds.
    pub window_seconds: Option<f64>,
    /// When it was said, Unix seconds.
    pub learned_unix: f64,
}

impl UnitInfo {
    fn new(said: &Announced, at: SystemTime) -> Self {
        Self {
            limit: said.limit,
            remaining: said.remaining,
            reset_seconds: said.reset.map(|d| d.as_secs_f64()),
            window_seconds: said.window.map(|d| d.as_secs_f64()),
            learned_unix: at
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }
}

/// A route's learned limits, as `/stats` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LearnedInfo {
    /// The rule the route is limited by.
    pub rule: String,
    /// Requests.
    pub requests: Option<UnitInfo>,
    /// Tokens (input and output).
    pub tokens: Option<UnitInfo>,
    /// Input tokens.
    pub input_tokens: Option<UnitInfo>,
    /// Output tokens.
    pub output_tokens: Option<UnitInfo>,
}

impl LearnedInfo {
    /// The units said, with their names as `/metrics` labels them.
    pub fn units(&self) -> [(&'static str, Option<&UnitInfo>); 4] {
        [
            ("requests", self.requests.as_ref()),
            ("tokens", self.tokens.as_ref()),
            ("input_tokens", self.input_tokens.as_ref()),
            ("output_tokens", self.output_tokens.as_ref()),
        ]
    }
}

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
    /// provider its rule, so that learning later retunes it in place.
    pub fn prepare(&self, route: &Route) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock();
        if !state.config.learning.contains_key(&route.provider) || state.routes.contains_key(route)
        {
            return;
        }
        if state.routes.len() >= state.config.max_routes {
            if !state.full {
                state.full = true;
                tracing::warn!(
                    max_routes = state.config.max_routes,
                    "learn_limits: max_routes routes learn already; new routes keep their configured limits"
                );
            }
            return;
        }
        let id = state.next_id;
        state.next_id += 1;
        state.routes.insert(
            route.clone(),
            Entry {
                id,
                info: LearnedInfo {
                    rule: rule_name(route),
                    ..LearnedInfo::default()
                },
                applied: Limited::default(),
                said: Limited::default(),
                last_retune: None,
            },
        );
        self.retune(&mut state);
    }

    /// Read what `route`'s response says of its limits; retune when its
    /// request limit changed (at most once a second per route).
    pub fn observe(&self, route: &Route, headers: &HeaderMap) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let now = SystemTime::now();
        let mut state = self.state.lock();
        let Some(&family) = state.config.learning.get(&route.provider) else {
            return;
        };
        let said = announced_limits_in(headers, now, family);
        if said.is_empty() {
            return;
        }
        let Some(entry) = state.routes.get_mut(route) else {
            return;
        };
        record(&mut entry.info, &said, now);
        if let Some(learned) = Learned::from_announced(&said.requests) {
            entry.said.requests = Some(learned);
        }
        if let Some(learned) = Learned::from_announced(&said.tokens) {
            entry.said.tokens = Some(learned);
        }
        let due = entry
            .last_retune
            .is_none_or(|at| at.elapsed() >= RETUNE_EVERY);
        if entry.said != entry.applied && due {
            entry.applied = entry.said;
            entry.last_retune = Some(Instant::now());
            tracing::info!(
                route = %Quoted(&route.to_string()),
                requests = entry.applied.requests.map(|l| l.limit),
                tokens = entry.applied.tokens.map(|l| l.limit),
                window = ?entry.applied.requests.or(entry.applied.tokens).map(|l| l.window),
                "learn_limits: the provider states its limits"
            );
            self.retune(&mut state);
        }
    }

    /// Every learning route's learned values, by route name.
    pub fn snapshot(&self) -> HashMap<String, LearnedInfo> {
        self.state
            .lock()
            .routes
            .iter()
            .map(|(route, entry)| (route.to_string(), entry.info.clone()))
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

/// The route's rule's name, from the route itself: the same in every
/// gateway and after a restart, so that gateways sharing their limits
/// through Redis (where state is kept by rule name) share the learned ones.
fn rule_name(route: &Route) -> String {
    format!("{RULE_PREFIX}{route})")
}

fn record(info: &mut LearnedInfo, said: &Announcement, at: SystemTime) {
    let units = [
        (&mut info.requests, &said.requests),
        (&mut info.tokens, &said.tokens),
        (&mut info.input_tokens, &said.input_tokens),
        (&mut info.output_tokens, &said.output_tokens),
    ];
    for (slot, said) in units {
        if !said.is_empty() {
            *slot = Some(UnitInfo::new(said, at));
        }
    }
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
        let parts = [&*route.provider, &*route.model];
        let (quotas, dry_run) = match Rule::find(&config.limits.rules, &parts) {
            Some(rule) => (rule.quotas(), rule.is_dry_run()),
            None => (&config.limits.default[..], false),
        };
        let requests: Vec<Learned> = entry.applied.requests.into_iter().collect();
        let tokens: Vec<Learned> = entry.applied.tokens.into_iter().collect();
        let mut rule =
            Rule::new(rule_name(route), KeyPattern::literal(parts)?).with_dry_run(dry_run);
        let quotas = tighten(quotas, Unit::Requests, &requests);
        for quota in tighten(&quotas, Unit::Tokens, &tokens) {
            rule = rule.with_quota(quota);
        }
        rules.push(rule);
    }
    rules.extend(config.limits.rules.iter().cloned());
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_minute(limit: u32) -> Learned {
        Learned {
            limit,
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn tighten_lowers_never_raises_and_adds_a_missing_period() {
        let requests = |q: Quota| q.with_unit(QuotaUnit::Requests);
        let config = [
            requests(Quota::per_minute(60).unwrap().with_burst(10).unwrap()),
            requests(Quota::per_second(5).unwrap().sliding_window()),
        ];
        let lower = tighten(&config, Unit::Requests, &[per_minute(5)]);
        assert_eq!(lower[0].limit(), 5);
        assert_eq!(lower[0].burst(), 5);
        assert_eq!(lower[1], config[1]);

        let higher = tighten(&config, Unit::Requests, &[per_minute(1000)]);
        assert_eq!(higher, config.to_vec());

        let hourly = Learned {
            limit: 100,
            window: Duration::from_secs(3600),
        };
        let added = tighten(&config, Unit::Requests, &[hourly]);
        assert_eq!(added.len(), 3);
        assert_eq!(added[2].limit(), 100);
        assert_eq!(added[2].algorithm(), Algorithm::TokenBucket);

        assert_eq!(added[2].unit(), QuotaUnit::Requests);

        let unlimited = tighten(&[], Unit::Requests, &[per_minute(7)]);
        assert_eq!(unlimited, vec![requests(Quota::per_minute(7).unwrap())]);

        // A token limit lowers only quotas counting tokens, and adds none.
        assert_eq!(
            tighten(&config, Unit::Tokens, &[per_minute(5)]),
            config.to_vec()
        );
        let with_tokens = [config[0], Quota::per_minute(30_000).unwrap()];
        let lower = tighten(&with_tokens, Unit::Tokens, &[per_minute(20_000)]);
        assert_eq!(lower[0], config[0]);
        assert_eq!(lower[1].limit(), 20_000);
        assert_eq!(lower[1].unit(), QuotaUnit::Cost);
    }
}
