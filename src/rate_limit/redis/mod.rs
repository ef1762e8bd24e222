//! The rate limiter's calls to Redis: the admission script's keys and
//! arguments, its reply, giving a booking back, and the local cache of
//! refused keys.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::{Script, Value};
use parking_lot::Mutex;

use super::{Algorithm, DEFAULT_POLICY, Quota, Unit};
use crate::clock::{Nanos, saturating_nanos};
use crate::error::ConfigError;
use crate::key::KeyHash;
use crate::redis::{RedisStore, StoreError};
use crate::store::PassThrough;

static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("admit.lua")));
/// `admit.lua` for one token bucket, no rules and nothing replaced: the
/// commonest call, at about what any GCRA on Redis costs.
static ADMIT_BUCKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("admit_bucket.lua")));
static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("give_back.lua")));
static CHARGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("charge.lua")));
static DELETE: LazyLock<Script> =
    LazyLock::new(|| Script::new("return redis.call('DEL', unpack(KEYS))"));

/// How far ahead of Redis's now a state may lie before it is taken for the
/// mark of a clock that ran backwards, at least: a day. Replicas may wait
/// for different lengths; a state booked by one with a long wait must not
/// look absurd to one with a short wait, which would reset the key.
const MIN_HORIZON_US: u64 = 86_400_000_000;

/// A rate above this many per second per key cannot be kept on Redis's
/// microsecond clock without changing it by more than 1%.
const FINEST_EMISSION_NS: u64 = 100_000;

/// One quota as the scripts take it: its kind and two numbers, times in
/// microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotaArgs {
    kind: char,
    a: u64,
    b: u64,
    /// Counts one per request, whatever the cost: the kind goes to the
    /// scripts in upper case (the state keeps its name).
    per_request: bool,
}

impl QuotaArgs {
    /// The kind as the scripts take it.
    fn arg_kind(&self) -> String {
        if self.per_request {
            self.kind.to_ascii_uppercase().to_string()
        } else {
            self.kind.to_string()
        }
    }
}

fn micros_up(nanos: Nanos) -> u64 {
    nanos.div_ceil(1_000).max(1)
}

impl QuotaArgs {
    pub(crate) fn of(quota: &Quota) -> Self {
        let period = saturating_nanos(quota.period());
        let limit = u64::from(quota.limit());
        let per_request = quota.unit() == Unit::Requests;
        let (kind, a, b) = match quota.algorithm() {
            // As `Params::of`: nanoseconds per unit rounded up, then up again
            // to whole microseconds (the same as rounding period / limit up
            // to microseconds at once).
            Algorithm::TokenBucket => (
                'g',
                micros_up(period.div_ceil(limit.max(1))),
                u64::from(quota.burst()),
            ),
            Algorithm::SlidingWindow => ('s', limit, micros_up(period)),
            Algorithm::FixedWindow => ('f', limit, micros_up(period)),
            // `TurnBudget` and any algorithm added later.
            _ => ('t', limit, micros_up(period)),
        };
        Self {
            kind,
            a,
            b,
            per_request,
        }
    }
}

/// Whether `quota` can be kept in Redis as it is in process.
pub(crate) fn check_quota(quota: &Quota) -> Result<(), ConfigError> {
    if quota.algorithm() == Algorithm::TokenBucket {
        let emission = saturating_nanos(quota.period()) / u64::from(quota.limit().max(1));
        if emission < FINEST_EMISSION_NS {
            return Err(ConfigError::new(
                "quota",
                format!(
                    "{} per {:?} is more than 10,000 per second per key, finer than a \
                     Redis store keeps time (microseconds) to 1%",
                    quota.limit(),
                    quota.period()
                ),
            ));
        }
    }
    if quota.algorithm() == Algorithm::SlidingWindow {
        let (counting, most, why, instead) = if quota.unit() == Unit::Requests {
            (
                "requests",
                RedisStore::MOST_SLIDING_REQUESTS,
                "each booking is kept, about 100 bytes",
                "",
            )
        } else {
            (
                "cost",
                RedisStore::MOST_SLIDING_COST,
                "each booking of several units is read to tell when a request fits, and Redis \
                 runs one script at a time",
                "count requests instead (unit = \"requests\", Unit::Requests: exact up to \
                 10,000), ",
            )
        };
        if quota.limit() > most {
            return Err(ConfigError::new(
                "quota",
                format!(
                    "a sliding window counting {counting}, {} per {:?}, is more than a Redis \
                     store keeps exactly ({most}: {why}); {instead}use a token bucket (the \
                     default algorithm, one value in Redis), or keep this limiter in process",
                    quota.limit(),
                    quota.period(),
                ),
            ));
        }
    }
    Ok(())
}

/// The state key of quota `i` of kind `kind` under the rule tagged `tag`.
/// A sliding window's is `…w`: one sorted set of its bookings and their
/// figures (an older version kept them in `…s` and `…s:n`, never read
/// now: during a rolling upgrade the two versions count apart).
fn state_key(base: &str, tag: &str, i: usize, kind: char) -> String {
    let kind = if kind == 's' { 'w' } else { kind };
    format!("{base}:rl:{tag}:{i}{kind}")
}

/// The rule marker of the key with `parts`, then the state key of each
/// quota `which` accepts, under the rule tagged `tag`.
fn state_keys(
    store: &RedisStore,
    parts: &[String],
    tag: &str,
    quotas: &[QuotaArgs],
    which: impl Fn(&QuotaArgs) -> bool,
) -> Vec<String> {
    let base = store.names.base(&store.prefix, parts);
    let mut keys = Vec::with_capacity(quotas.len() + 2);
    keys.push(format!("{base}:rl:r"));
    for (i, q) in quotas.iter().enumerate() {
        if !which(q) {
            continue;
        }
        keys.push(state_key(&base, tag, i, q.kind));
    }
    keys
}

/// The state keys, under the rule tagged `tag`, of the quotas of another
/// algorithm that `replaced` says each quota replaced.
fn replaced_keys(
    store: &RedisStore,
    parts: &[String],
    tag: &str,
    replaced: &[Option<QuotaArgs>],
) -> Vec<String> {
    if replaced.iter().all(Option::is_none) {
        return Vec::new();
    }
    let base = store.names.base(&store.prefix, parts);
    let mut keys = Vec::new();
    for (i, q) in replaced.iter().enumerate() {
        let Some(q) = q else { continue };
        keys.push(state_key(&base, tag, i, q.kind));
    }
    keys
}

/// The Redis keys of the key with `parts` under `rule`: every quota's and
/// the rule marker (a reset), or the turn budgets' only (a new turn).
pub(crate) fn forget_keys(
    store: &RedisStore,
    parts: &[String],
    rule: &str,
    quotas: &[Quota],
    replaced: &[Option<Quota>],
    turns_only: bool,
) -> Vec<String> {
    let tag = store.names.tag(rule);
    let quotas: Vec<QuotaArgs> = quotas.iter().map(QuotaArgs::of).collect();
    let mut keys = state_keys(store, parts, &tag, &quotas, |q| {
        !turns_only || q.kind == 't'
    });
    if turns_only {
        // The rule marker stays: the key still spent under its rule.
        keys.remove(0);
    } else {
        // What a replaced quota still holds would be carried back in.
        let replaced: Vec<Option<QuotaArgs>> = replaced
            .iter()
            .map(|q| q.map(|q| QuotaArgs::of(&q)))
            .collect();
        keys.extend(replaced_keys(store, parts, &tag, &replaced));
    }
    keys
}

/// Delete `keys`.
pub(crate) async fn delete(store: &RedisStore, keys: &[String]) -> Result<(), StoreError> {
    if !keys.is_empty() {
        let _: i64 = store.run("rate limit", &DELETE, keys, &[]).await?;
    }
    Ok(())
}

/// One admission: the script's keys and arguments.
pub(crate) struct Admission {
    keys: Vec<String>,
    args: Vec<String>,
    quotas: Vec<QuotaArgs>,
    cost: u32,
    /// The last key is the default's state, probed.
    probed: bool,
    /// After it, this many keys of replaced quotas' states.
    replaced_keys: usize,
    /// The longest wait the script can answer, in microseconds: a state
    /// further ahead than the horizon is started afresh, so no quota
    /// waits (or resets) much longer than the horizon and one period.
    longest_wait: u64,
    /// One token bucket, no rules, nothing replaced: `admit_bucket.lua`.
    one_bucket: bool,
}

/// What one admission asks of Redis.
pub(crate) struct RemoteAsk<'a> {
    pub(crate) parts: &'a [String],
    /// The rule's name; `None` when the limiter has no rules (no key can
    /// move between rules, so none is remembered).
    pub(crate) rule: Option<&'a str>,
    /// For a key under a rule: the default's first quota, whose state shows
    /// whether a key never seen under a rule spent under the default before
    /// the rules came.
    pub(crate) default_quota: Option<&'a Quota>,
    pub(crate) quotas: &'a [Quota],
    /// Per quota, the quota of another algorithm it replaced in a retune
    /// (see `Compiled::replaced`): a key with no state yet under the new
    /// quota carries what it spent under that one.
    pub(crate) replaced: &'a [Option<Quota>],
    pub(crate) cost: u32,
    pub(crate) max_wait: Nanos,
    /// Report what remains.
    pub(crate) info: bool,
    /// The request waits for its instant (else it goes now, in a dry run).
    pub(crate) waits: bool,
    /// The longest period of the policy: how long a key's rule is
    /// remembered after its last request.
    pub(crate) longest_period: Nanos,
}

impl Admission {
    pub(crate) fn new(store: &RedisStore, ask: RemoteAsk<'_>) -> Self {
        let tag = store.names.tag(ask.rule.unwrap_or(DEFAULT_POLICY));
        let quotas: Vec<QuotaArgs> = ask.quotas.iter().map(QuotaArgs::of).collect();
        let mut keys = state_keys(store, ask.parts, &tag, &quotas, |_| true);
        let probe = ask.rule.and(ask.default_quota).map(|quota| {
            let default = store.names.tag(DEFAULT_POLICY);
            let base = store.names.base(&store.prefix, ask.parts);
            state_key(&base, &default, 0, QuotaArgs::of(quota).kind)
        });
        let probed = probe.is_some();
        keys.extend(probe);
        let replaced: Vec<Option<QuotaArgs>> = (0..quotas.len())
            .map(|i| {
                ask.replaced
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|q| QuotaArgs::of(&q))
            })
            .collect();
        let before = keys.len();
        keys.extend(replaced_keys(store, ask.parts, &tag, &replaced));
        let replaced_keys = keys.len() - before;
        let max_wait = ask.max_wait / 1_000;
        let horizon = max_wait.max(MIN_HORIZON_US).saturating_add(1_000_000);
        let period = quotas
            .iter()
            .map(|q| match q.kind {
                'g' => q.a.saturating_mul(q.b),
                _ => q.b,
            })
            .max()
            .unwrap_or(0);
        // Twice the period, and a second, to spare.
        let longest_wait = horizon
            .saturating_add(period.saturating_mul(2))
            .saturating_add(1_000_000);
        // As an in-process limiter remembers a key's rule: its longest
        // period and the longest wait past its last request.
        let marker_ttl =
            (ask.longest_period.saturating_add(ask.max_wait) / 1_000_000).saturating_add(1_000);
        let mut args = Vec::with_capacity(9 + 6 * quotas.len());
        args.push(ask.cost.to_string());
        args.push(max_wait.to_string());
        args.push(horizon.to_string());
        args.push(u8::from(ask.info).to_string());
        args.push(u8::from(ask.waits).to_string());
        args.push(if ask.rule.is_some() {
            tag
        } else {
            String::new()
        });
        args.push(marker_ttl.to_string());
        args.push(store.now_arg());
        args.push(u8::from(probed).to_string());
        for (q, before) in quotas.iter().zip(&replaced) {
            args.push(q.arg_kind());
            args.push(q.a.to_string());
            args.push(q.b.to_string());
            // The replaced quota's kind and numbers ("-": none).
            match before {
                Some(b) => {
                    args.push(b.kind.to_string());
                    args.push(b.a.to_string());
                    args.push(b.b.to_string());
                }
                None => args.extend(["-".to_owned(), "0".to_owned(), "0".to_owned()]),
            }
        }
        let one_bucket = ask.rule.is_none()
            && !probed
            && replaced_keys == 0
            && quotas.len() == 1
            && quotas[0].kind == 'g'
            && !store.whole_script_only();
        Self {
            keys,
            args,
            quotas,
            cost: ask.cost,
            probed,
            replaced_keys,
            longest_wait,
            one_bucket,
        }
    }

    /// Run the admission.
    pub(crate) async fn run(self, store: &RedisStore) -> Result<Reply, StoreError> {
        let script = if self.one_bucket {
            &*ADMIT_BUCKET
        } else {
            &*ADMIT
        };
        let reply: Vec<Value> = store
            .run("rate limit", script, &self.keys, &self.args)
            .await?;
        Reply::parse(&reply, self).ok_or_else(|| {
            store.bad_reply("rate limit");
            StoreError::Reply
        })
    }
}

/// What the admission script said.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Refused: the time until every quota would admit, and the quota that
    /// needs the longest.
    Refused { wait: Duration, slowest: usize },
    /// Booked `wait` from now (Redis's now) in every quota.
    Booked {
        wait: Duration,
        left: u32,
        reset: Duration,
        tightest: usize,
        grant: Arc<RemoteGrant>,
    },
}

fn int(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::Int(n) => Some(n.to_string()),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl Reply {
    fn parse(reply: &[Value], admission: Admission) -> Option<Self> {
        // Indices name one of the quotas asked about, or the reply is bad.
        let quotas = admission.quotas.len();
        let index = |n: u64| usize::try_from(n).ok().filter(|&i| i < quotas);
        // A wait no script of ours answers is a bad reply, not a key
        // refused (and remembered as refused) for years.
        let wait = |n: u64| (n <= admission.longest_wait).then(|| Duration::from_micros(n));
        match int(reply.first())? {
            0 => Some(Self::Refused {
                wait: wait(int(reply.get(1))?)?,
                slowest: index(int(reply.get(2))?)?,
            }),
            1 => {
                // The rule marker, the probe and the replaced quotas'
                // states are not the booking's.
                let mut keys = admission.keys;
                keys.truncate(keys.len().saturating_sub(admission.replaced_keys));
                if admission.probed {
                    keys.pop();
                }
                if !keys.is_empty() {
                    keys.remove(0);
                }
                let at = int(reply.get(1))?;
                let now = int(reply.get(2))?;
                // A reply is outside input: a short one is an error, not a panic.
                let marks = reply
                    .get(6..)?
                    .iter()
                    .map(|v| text(Some(v)))
                    .collect::<Option<Vec<_>>>()?;
                if marks.len() != admission.quotas.len() {
                    return None;
                }
                Some(Self::Booked {
                    wait: Duration::from_micros(at.saturating_sub(now)),
                    left: u32::try_from(int(reply.get(3))?).unwrap_or(u32::MAX),
                    reset: wait(int(reply.get(4))?)?,
                    tightest: index(int(reply.get(5))?)?,
                    grant: Arc::new(RemoteGrant {
                        keys,
                        at,
                        quotas: admission.quotas,
                        marks,
                        cost: admission.cost,
                        excess_of: None,
                    }),
                })
            }
            _ => None,
        }
    }
}

/// A booking in Redis: enough to give it back.
#[derive(Debug)]
pub(crate) struct RemoteGrant {
    keys: Vec<String>,
    /// The instant booked, on Redis's clock.
    at: u64,
    quotas: Vec<QuotaArgs>,
    marks: Vec<String>,
    cost: u32,
    /// Only the excess of a settled cost, `cost` units of this whole
    /// charge, goes back.
    excess_of: Option<u32>,
}

impl RemoteGrant {
    /// The part of the booking above `actual`, to give back when the
    /// request's real cost turned out lower (see
    /// [`Settlement`](crate::rate_limit::Settlement)); none when it is not
    /// lower, or when no quota can take it: a quota counting requests has
    /// none (a sliding window's booking is written again at its smaller
    /// cost).
    pub(crate) fn excess_over(&self, actual: u32) -> Option<RemoteGrant> {
        let takes_excess = |q: &QuotaArgs| !q.per_request;
        if actual >= self.cost || !self.quotas.iter().any(takes_excess) {
            return None;
        }
        Some(RemoteGrant {
            keys: self.keys.clone(),
            at: self.at,
            quotas: self.quotas.clone(),
            marks: self.marks.clone(),
            cost: self.cost - actual,
            excess_of: Some(self.cost),
        })
    }

    /// What the booking charged.
    pub(crate) fn cost(&self) -> u32 {
        self.cost
    }

    /// Whether a real cost of `actual` is above this booking's charge, on a
    /// quota that counts cost (see [`charge`](Self::charge)).
    pub(crate) fn falls_short_of(&self, actual: u32) -> bool {
        self.excess_of.is_none() && actual > self.cost && self.quotas.iter().any(|q| !q.per_request)
    }

    /// The arguments give_back.lua and charge.lua share: now, the instant
    /// booked, and per quota its kind, numbers and mark.
    fn push_booking(&self, store: &RedisStore, args: &mut Vec<String>) {
        args.push(store.now_arg());
        args.push(self.at.to_string());
        for (q, mark) in self.quotas.iter().zip(&self.marks) {
            args.push(q.arg_kind());
            args.push(q.a.to_string());
            args.push(q.b.to_string());
            args.push(mark.clone());
        }
    }

    /// Charge `extra` more on this booking, without refusal (a settled
    /// estimate below the real cost). When the call fails the estimate
    /// stands.
    pub(crate) async fn charge(&self, store: &RedisStore, extra: u32) -> Result<(), StoreError> {
        let mut args = Vec::with_capacity(3 + 4 * self.quotas.len());
        args.push(extra.to_string());
        self.push_booking(store, &mut args);
        let _: i64 = store.run("rate limit", &CHARGE, &self.keys, &args).await?;
        Ok(())
    }

    /// Give the booking back (`cancel`: a waiter left before its turn;
    /// else the outcome did not count). When the call fails the capacity
    /// stays spent: the safe side.
    pub(crate) async fn give_back(
        &self,
        store: &RedisStore,
        cancel: bool,
    ) -> Result<(), StoreError> {
        let mut args = Vec::with_capacity(4 + 4 * self.quotas.len());
        // The whole charge goes with an excess: what of it has come back
        // by itself is counted from the whole booking, as in process.
        let mode = match (self.excess_of, cancel) {
            (Some(whole), _) => format!("x{whole}"),
            (None, true) => "c".to_owned(),
            (None, false) => "r".to_owned(),
        };
        args.push(mode);
        args.push(self.cost.to_string());
        self.push_booking(store, &mut args);
        let _: i64 = store
            .run("rate limit", &GIVE_BACK, &self.keys, &args)
            .await?;
        Ok(())
    }
}

/// Keys Redis refused, until they could be admitted again: a flood of
/// requests on a refused key costs no round trips.
pub(crate) struct Refused {
    keys: Mutex<HashMap<u64, Refusal, BuildHasherDefault<PassThrough>>>,
    /// Moves on at every forget, under the lock: a refusal asked before a
    /// reset and heard after it (the reset's deletion raced its reply) is
    /// not remembered, or the key would stay refused here past the reset.
    forgets: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The earliest a request of `cost` could be admitted, on the store's
    /// local clock ([`RedisStore::local_micros`]).
    until: u64,
    /// Until when the refusal is answered from here: at most
    /// [`CACHED_FOR`] after it was heard, since a reset, a new turn or a
    /// give-back on another replica changes Redis without telling this one.
    expires: u64,
    cost: u32,
    /// An index into the quotas of the policy generation below.
    slowest: usize,
    /// The limiter's policy generation the refusal was made under: a
    /// retune or a reset since (which may have heard it late) voids it.
    generation: u32,
}

/// At most this many refused keys are remembered; more are asked again.
const MAX_REFUSED: usize = 10_000;

/// The longest a refusal is answered from a replica's cache, in
/// microseconds: what another replica's reset, new turn or give-back can
/// take to be seen here. A flood on a refused key then costs one round
/// trip a second, not one per request.
const CACHED_FOR: u64 = 1_000_000;

impl Default for Refused {
    fn default() -> Self {
        Self {
            keys: Mutex::new(HashMap::default()),
            forgets: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Refused {
    /// The wait and slowest quota of a request of `cost` on `key` at `now`
    /// under policy `generation` that is sure to be refused: one of the
    /// same cost was refused under it, and the instant it could go is still
    /// beyond `max_wait`. Only the same cost: a costlier request is refused
    /// too, but may have to wait longer, and its `retry_after` is exact.
    pub(crate) fn check(
        &self,
        key: KeyHash,
        cost: u32,
        max_wait: Nanos,
        now: u64,
        generation: u32,
    ) -> Option<(Duration, usize)> {
        let mut keys = self.keys.lock();
        let refusal = *keys.get(&key.0)?;
        if refusal.expires <= now || refusal.generation != generation {
            keys.remove(&key.0);
            return None;
        }
        let wait = Duration::from_micros(refusal.until - now);
        (cost == refusal.cost && saturating_nanos(wait) > max_wait)
            .then_some((wait, refusal.slowest))
    }

    /// Where the forgets are: taken before asking Redis, given back to
    /// [`insert`](Self::insert).
    pub(crate) fn epoch(&self) -> u64 {
        self.forgets.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Remember at `now` that a request of `cost` on `key` cannot go for
    /// `wait` under policy `generation`, unless something was forgotten
    /// since [`epoch`](Self::epoch) said `asked`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert(
        &self,
        key: KeyHash,
        cost: u32,
        now: u64,
        wait: Duration,
        slowest: usize,
        generation: u32,
        asked: u64,
    ) {
        let until = now.saturating_add(u64::try_from(wait.as_micros()).unwrap_or(u64::MAX));
        let mut keys = self.keys.lock();
        if self.forgets.load(std::sync::atomic::Ordering::Acquire) != asked {
            return;
        }
        if keys.len() >= MAX_REFUSED && !keys.contains_key(&key.0) {
            keys.retain(|_, r| r.expires > now);
            if keys.len() >= MAX_REFUSED {
                return;
            }
        }
        let refusal = Refusal {
            until,
            expires: until.min(now.saturating_add(CACHED_FOR)),
            cost,
            slowest,
            generation,
        };
        keys.entry(key.0)
            .and_modify(|r| {
                // The cheaper refusal answers more of a flood (the cheaper
                // requests; the costlier ask Redis); one that is over, or
                // of an older policy, is replaced.
                if cost <= r.cost || r.expires <= now || r.generation != generation {
                    *r = refusal;
                }
            })
            .or_insert(refusal);
    }

    /// Forget `key` (a reset), or every key (`None`: a retune).
    pub(crate) fn forget(&self, key: Option<KeyHash>) {
        let mut keys = self.keys.lock();
        self.forgets
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        match key {
            Some(key) => {
                keys.remove(&key.0);
            }
            None => keys.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_window_beyond_what_redis_keeps_exactly_is_refused_by_name() {
        let window = |limit| Quota::per_minute(limit).unwrap().sliding_window();
        assert!(check_quota(&window(RedisStore::MOST_SLIDING_COST)).is_ok());
        let err = check_quota(&window(RedisStore::MOST_SLIDING_COST + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("counting cost, 151 per 60s"), "{err}");
        assert!(err.contains("(150: "), "{err}");
        assert!(err.contains(r#"unit = "requests""#), "{err}");
        assert!(err.contains("token bucket"), "{err}");
        let requests = |limit| window(limit).with_unit(Unit::Requests);
        assert!(check_quota(&requests(RedisStore::MOST_SLIDING_REQUESTS)).is_ok());
        let err = check_quota(&requests(RedisStore::MOST_SLIDING_REQUESTS + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("counting requests, 10001 per 60s"), "{err}");
        assert!(!err.contains("unit ="), "{err}");
        // Other algorithms keep one value per key, at any limit.
        assert!(check_quota(&Quota::per_hour(1_000_000).unwrap().fixed_window()).is_ok());
    }

    #[test]
    fn a_refused_key_is_refused_locally_until_it_could_go() {
        let refused = Refused::default();
        let key = KeyHash(1);
        refused.insert(
            key,
            2,
            1_000,
            Duration::from_micros(500),
            0,
            1,
            refused.epoch(),
        );
        // As costly, beyond max_wait: refused here.
        assert_eq!(
            refused.check(key, 2, 0, 1_100, 1),
            Some((Duration::from_micros(400), 0))
        );
        // Costlier: refused too, but its wait may be longer, which only
        // Redis can tell.
        assert_eq!(refused.check(key, 3, 0, 1_100, 1), None);
        // Under another policy generation (a retune, a reset): void.
        assert_eq!(refused.check(key, 2, 0, 1_100, 2), None);
        refused.insert(
            key,
            2,
            1_000,
            Duration::from_micros(500),
            0,
            1,
            refused.epoch(),
        );
        // Cheaper: Redis may admit it.
        assert_eq!(refused.check(key, 1, 0, 1_100, 1), None);
        // Within the wait allowed: Redis books it.
        assert_eq!(refused.check(key, 2, 400_000, 1_100, 1), None);
        // At the instant: asked again, and forgotten.
        assert_eq!(refused.check(key, 2, 0, 1_500, 1), None);
        assert!(refused.keys.lock().is_empty());
    }

    #[test]
    fn a_long_refusal_is_answered_from_the_cache_for_a_second_at_most() {
        // Another replica's reset or new turn is not seen here: past a
        // second the key is asked again, whatever its wait.
        let refused = Refused::default();
        let key = KeyHash(1);
        let five_minutes = Duration::from_secs(300);
        refused.insert(key, 1, 0, five_minutes, 0, 1, refused.epoch());
        assert_eq!(
            refused.check(key, 1, 0, 999_999, 1),
            Some((five_minutes - Duration::from_micros(999_999), 0)),
            "the true wait, not the cache's"
        );
        assert_eq!(refused.check(key, 1, 0, 1_000_000, 1), None);
    }

    #[test]
    fn a_short_or_odd_reply_is_an_error_not_a_panic() {
        let one = QuotaArgs {
            kind: 't',
            a: 1,
            b: 1,
            per_request: false,
        };
        let admission = || Admission {
            keys: vec!["r".into(), "k".into()],
            args: Vec::new(),
            quotas: vec![one],
            cost: 1,
            probed: false,
            replaced_keys: 0,
            longest_wait: 1_000,
            one_bucket: false,
        };
        let int = Value::Int;
        let mark = || Value::BulkString(b"m".to_vec());
        let good = [
            vec![int(0), int(5), int(0)],
            vec![int(1), int(5), int(3), int(0), int(0), int(0), mark()],
        ];
        for reply in &good {
            assert!(Reply::parse(reply, admission()).is_some(), "{reply:?}");
        }
        let bad = [
            vec![],
            vec![int(1), int(5), int(3)],
            vec![int(1), int(5), int(3), int(0), int(0), int(0)],
            vec![
                int(1),
                int(5),
                int(3),
                int(0),
                int(0),
                int(0),
                mark(),
                mark(),
            ],
            vec![int(1), int(5), int(3), int(0), int(0), int(1), mark()],
            vec![int(0), int(-1), int(0)],
            vec![int(0), int(5), int(1)],
            vec![int(0), int(5), int(-1)],
            vec![int(0), int(1_001), int(0)],
            vec![int(0), int(i64::MAX), int(0)],
            vec![int(1), int(5), int(3), int(0), int(1_001), int(0), mark()],
            vec![int(7)],
            vec![Value::Nil, int(1)],
        ];
        for reply in &bad {
            assert!(Reply::parse(reply, admission()).is_none(), "{reply:?}");
        }
    }

    #[test]
    fn the_cache_of_refused_keys_is_bounded() {
        let refused = Refused::default();
        for k in 0..(MAX_REFUSED as u64 + 100) {
            refused.insert(
                KeyHash(k),
                1,
                0,
                Duration::from_secs(60),
                0,
                1,
                refused.epoch(),
            );
        }
        assert_eq!(refused.keys.lock().len(), MAX_REFUSED);
        // Once those are over, new ones take their place.
        refused.insert(
            KeyHash(u64::MAX),
            1,
            61_000_000,
            Duration::from_secs(1),
            0,
            1,
            refused.epoch(),
        );
        assert_eq!(refused.keys.lock().len(), 1);
    }
}
