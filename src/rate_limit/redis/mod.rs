//! The rate limiter's calls to Redis: the admission script's keys and
//! arguments here; its reply and a booking Redis holds (settled, charged or
//! given back later) in `reply`; the local cache of refused keys in
//! `refused`.

use std::sync::LazyLock;

use ::redis::{Script, Value};

use super::{Algorithm, DEFAULT_POLICY, Quota, Unit};
use crate::clock::{Nanos, saturating_nanos};
use crate::error::ConfigError;
use crate::redis::{RedisStore, StoreError};

mod refused;
mod reply;

pub(crate) use refused::{Epoch, Refused};
pub(crate) use reply::{RemoteGrant, Reply};

static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("admit.lua")));
/// `admit.lua` for one token bucket, no rules and nothing replaced: the
/// commonest call, at about what any GCRA on Redis costs.
static ADMIT_BUCKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("admit_bucket.lua")));
/// `admit.lua` for one sliding window counting requests, no rules and
/// nothing replaced: the window's own commands without the whole script's
/// loops. It answers `{2}` for a state it leaves to the whole script.
static ADMIT_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("admit_window.lua")));
/// `admit.lua` for one sliding window counter, no rules and nothing
/// replaced: at about what a token bucket's short script costs. It answers
/// `{2}` for a state kept under another window, left to the whole script.
static ADMIT_COUNTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("admit_counter.lua")));
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
            Algorithm::TurnBudget => ('t', limit, micros_up(period)),
            Algorithm::SlidingWindowCounter => ('a', limit, micros_up(period)),
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
                     store keeps exactly ({most}: {why}); {instead}use a sliding window \
                     counter (algorithm = \"sliding_window_counter\", \
                     Quota::sliding_window_counter(): approximate, one value at any \
                     limit), a token bucket (the default algorithm, one value in Redis), or \
                     keep this limiter in process",
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
    /// The short script for this call, when there is one.
    short: Option<&'static Script>,
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
        // One quota, no rules, nothing replaced: a short form of the
        // whole script, for a token bucket, a window counting requests or
        // a sliding window counter.
        let lone = ask.rule.is_none()
            && !probed
            && replaced_keys == 0
            && quotas.len() == 1
            && !store.whole_script_only();
        let short = match quotas.first() {
            Some(q) if lone && q.kind == 'g' => Some(&*ADMIT_BUCKET),
            Some(q) if lone && q.kind == 's' && q.per_request => Some(&*ADMIT_WINDOW),
            Some(q) if lone && q.kind == 'a' => Some(&*ADMIT_COUNTER),
            _ => None,
        };
        Self {
            keys,
            args,
            quotas,
            cost: ask.cost,
            probed,
            replaced_keys,
            longest_wait,
            short,
        }
    }

    /// Run the admission.
    pub(crate) async fn run(self, store: &RedisStore) -> Result<Reply, StoreError> {
        let mut reply: Vec<Value> = store
            .run(
                "rate limit",
                self.short.unwrap_or(&ADMIT),
                &self.keys,
                &self.args,
            )
            .await?;
        if self.short.is_some() && matches!(reply.as_slice(), [Value::Int(2)]) {
            // A state the short script leaves to the whole one, untouched.
            reply = store
                .run("rate limit", &ADMIT, &self.keys, &self.args)
                .await?;
        }
        Reply::parse(&reply, self).ok_or_else(|| {
            store.bad_reply("rate limit");
            StoreError::Reply
        })
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
        // The approximate window is offered by name, and kept at any limit.
        assert!(
            err.contains(r#"algorithm = "sliding_window_counter""#),
            "{err}"
        );
        let counter = Quota::per_minute(1_000_000)
            .unwrap()
            .sliding_window_counter();
        assert!(check_quota(&counter).is_ok());
        // Other algorithms keep one value per key, at any limit.
        assert!(check_quota(&Quota::per_hour(1_000_000).unwrap().fixed_window()).is_ok());
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
            short: None,
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
}
