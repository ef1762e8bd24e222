//! The keyed limiter behind every clone of a rate-limit service: the policy
//! in force, each quota's keyed state, the switches and the counters.

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::algorithm::{Fast, Grant};
use super::lines::{Lines, turn_for};
use super::policy::{Compiled, Policy};
use super::quota::Quota;
use super::rule::Rule;
use super::table::{Ask, Held, One, Table};
use crate::clock::{ClockSource, Nanos, Timeline};
use crate::key::{KeyHash, KeySeed, KeyTexts};
use crate::redact::Quoted;
use crate::stats::{Event, KeyTracking, Stats};
use crate::store::{Idle, Store, Tidy};

mod controls;
mod peek;
// The one place the limiter names its store: Redis, or none at all.
#[cfg_attr(not(feature = "redis"), path = "limiter/no_store.rs")]
mod remote;
mod settle;
mod together;

#[cfg(feature = "redis")]
pub(crate) use remote::Asked;
pub(crate) use remote::{Remote, RemoteGrant, check_quotas};
pub(crate) use together::{Entrant, JointDecision, acquire_joint};

/// Capacity booked on one key: enough to give it back.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    key: KeyHash,
    generation: u32,
    rule: u32,
    grants: SmallVec<[Grant; 2]>,
    /// The booking in Redis, for a limiter that keeps its state there.
    remote: Option<Arc<RemoteGrant>>,
}

/// What a caller of [`Limiter::acquire`] needs back besides the decision.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Want {
    /// A ticket for an immediate admission, to give its capacity back
    /// later (a waiter always gets one).
    pub(crate) ticket: bool,
    /// What remains of the key's tightest quota.
    pub(crate) info: bool,
}

/// What the limiter decided for one request. The rarely present parts are
/// boxed, so the common decision is small to return.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Go now, with nothing to hand back: the common case (also a key with
    /// no quota, and a dry run that would have refused).
    Go,
    /// Go now, with a ticket (when the caller wants one), what remains (when
    /// it asked), or both.
    Now {
        ticket: Option<Box<Ticket>>,
        info: Option<Box<RateLimitInfo>>,
    },
    /// Go at `until`, and not before the key's earlier waiters: `turn` is
    /// the place in the key's line. The capacity is booked.
    Later {
        until: Instant,
        ticket: Box<Ticket>,
        info: Option<Box<RateLimitInfo>>,
        turn: u64,
        /// It could have gone now but for the waiters ahead: no timer.
        due: bool,
    },
    /// Refused; nothing consumed.
    Denied(Box<Denied>),
    /// The request costs more than the key can ever admit at once.
    TooCostly { capacity: u32 },
    /// The shared store did not answer, and the limiter fails closed.
    #[cfg(feature = "redis")]
    Unavailable,
}

/// A refusal: how long to wait, and the quota with the longest wait.
#[derive(Debug)]
pub(crate) struct Denied {
    pub(crate) retry_after: Duration,
    pub(crate) quota: Quota,
    pub(crate) policy: Arc<str>,
}

/// What remains of a key's tightest quota after an admission: what the
/// `RateLimit` headers of a response say.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RateLimitInfo {
    /// The rule whose quotas apply ([`DEFAULT_POLICY`](super::DEFAULT_POLICY),
    /// `(default)`, for the default quotas).
    pub policy: Arc<str>,
    /// The quota with the least left. (An unlimited key's responses carry no
    /// `RateLimitInfo` at all.)
    pub quota: Option<Quota>,
    /// Units left now.
    pub remaining: u32,
    /// Time until all of the quota is available again.
    pub reset: Duration,
    /// The quota's `RateLimit-Policy` value, made with the policy (see
    /// [`RateLimitHeaders`](crate::respond::RateLimitHeaders)).
    pub(crate) policy_field: Option<http::HeaderValue>,
}

/// A key's rule, as last looked up.
#[derive(Clone, Copy, Debug, Default)]
struct RuleSlot {
    generation: u32,
    rule: u32,
    /// Which rule by name, to tell a key that moved to another rule.
    name: u64,
    /// After this, the key's quota states are idle too.
    idle_at: Nanos,
}

impl Idle for RuleSlot {
    fn is_idle(&self, now: Nanos) -> bool {
        self.idle_at <= now
    }
}

fn name_id(name: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(name)
}

/// `ask` as the rule's first quota counts it.
#[inline]
fn charged_first<'a>(rule: &Compiled, ask: Ask<'a>) -> Ask<'a> {
    if rule.first_counts_requests {
        Ask { cost: 1, ..ask }
    } else {
        ask
    }
}

/// See [`Limiter::horizon_for`].
const CLOCK_SLACK: Nanos = 1_000_000_000;

/// What the quotas said, decided while their states were held.
enum Verdict {
    /// Refused: the longest wait, and which quota needed it.
    Refused { wait: Nanos, slowest: usize },
    /// Booked in every quota.
    Booked(Booked),
}

/// Booked at `at` in every quota; with what remains of the tightest (units,
/// time to whole, quota index) when asked, and the turn in the key's line
/// when it joined one.
struct Booked {
    at: Nanos,
    grants: SmallVec<[Grant; 2]>,
    remaining: Option<(u32, Nanos, usize)>,
    turn: Option<u64>,
}

/// Decide on held quota states: the earliest instant all admit, booked if
/// it is within `max_wait`.
#[inline]
fn judge(
    held: &mut [Held<'_>],
    quotas: &[Quota],
    key: KeyHash,
    now: Nanos,
    ask: Ask<'_>,
    timeline: &Timeline,
) -> Verdict {
    let Ask {
        cost,
        horizon,
        max_wait,
        info,
        line,
    } = ask;
    let mut at = line.map_or(now, |line| line.floor(key, now, horizon).max(now));
    let mut slowest = 0;
    for (i, (h, quota)) in held.iter_mut().zip(quotas).enumerate() {
        let earliest = h.earliest(now, quota.cost_of(cost), horizon);
        if earliest > at {
            at = earliest;
            slowest = i;
        }
    }
    if at - now > max_wait {
        return Verdict::Refused {
            wait: at - now,
            slowest,
        };
    }
    let mut grants = SmallVec::new();
    for (h, quota) in held.iter_mut().zip(quotas) {
        grants.push(h.book(now, at, quota.cost_of(cost)));
    }
    // The quota with the least left is the one a client must heed; as of
    // the instant the request goes, which its response reports (now, unless
    // it waits: in a dry run nobody does).
    let goes = if line.is_some() { at } else { now };
    let remaining = info.then(|| {
        let mut tightest = (u32::MAX, 0, 0);
        for (i, h) in held.iter_mut().enumerate() {
            let (left, reset) = h.remaining(goes);
            if left < tightest.0 || (left == tightest.0 && reset > tightest.1) {
                tightest = (left, reset, i);
            }
        }
        tightest
    });
    let turn = turn_for(line, key, at, now, timeline);
    Verdict::Booked(Booked {
        at,
        grants,
        remaining,
        turn,
    })
}

pub(crate) struct Limiter {
    timeline: Timeline,
    seed: KeySeed,
    /// The global key's hash under `seed`: the key of the fast path.
    global: KeyHash,
    policy: ArcSwap<Policy>,
    /// `policy`'s generation, stored after it: services cache the policy
    /// and compare this to theirs.
    generation: AtomicU32,
    /// Each key's rule, when there are rules.
    rules: Store<RuleSlot, ()>,
    /// The longest wait ever allowed on this limiter, in nanoseconds: how far
    /// ahead a booking can legitimately be.
    horizon: AtomicU64,
    enabled: AtomicBool,
    dry_run: AtomicBool,
    pub(crate) stats: Arc<Stats>,
    /// The order waiters go in.
    pub(crate) lines: Lines,
    /// Retunes one at a time.
    retuning: Mutex<()>,
    /// Where the state lives when not in this process.
    remote: Option<Arc<Remote>>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = self.policy.load();
        f.debug_struct("Limiter")
            .field("default", &policy.compiled[0].quotas)
            .field("rules", &policy.rules)
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .field("dry_run", &self.dry_run.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter for `default` and `rules`, whose names the caller checked.
    pub(crate) fn new(
        default: Vec<Quota>,
        rules: Vec<Rule>,
        clock: ClockSource,
        key_stats: KeyTracking,
    ) -> Self {
        let timeline = Timeline::new(clock);
        let seed = KeySeed::default();
        let policy = Policy::build(
            1,
            &default,
            rules,
            None,
            timeline.epoch_offset(),
            0,
            seed.global(),
            &|_| 0,
        );
        Self {
            timeline,
            global: seed.global(),
            seed,
            policy: ArcSwap::from_pointee(policy),
            generation: AtomicU32::new(1),
            rules: Store::new((), 60_000_000_000),
            horizon: AtomicU64::new(0),
            enabled: AtomicBool::new(true),
            dry_run: AtomicBool::new(false),
            stats: Arc::new(Stats::new(key_stats)),
            lines: Lines::default(),
            retuning: Mutex::new(()),
            remote: None,
        }
    }

    #[inline]
    pub(crate) fn seed(&self) -> &KeySeed {
        &self.seed
    }

    /// Where this limiter lives: unique among the limiters alive (each is
    /// in an `Arc` of its own, and does not move), and the order in which a
    /// joint admission locks the states of several limiters.
    pub(crate) fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The policy in force, refreshing `cached` if a retune replaced it:
    /// one atomic load per request instead of an `ArcSwap` load.
    #[inline]
    pub(crate) fn refresh(&self, cached: &mut Arc<Policy>) {
        if self.generation.load(Ordering::Acquire) != cached.generation {
            *cached = self.policy.load_full();
        }
    }

    /// The policy in force now, for a service to cache.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Admit `cost` units on `key` now, or book them at most `max_wait`
    /// ahead, under `policy` (see [`Limiter::refresh`]). `parts` renders the
    /// key's parts, for rule lookup and per-key counters; it is only called
    /// when those need it. `want` says what the caller needs back.
    #[inline]
    pub(crate) fn acquire(
        &self,
        policy: &Policy,
        key: KeyHash,
        cost: u32,
        max_wait: Nanos,
        parts: &dyn Fn() -> KeyTexts,
        want: Want,
    ) -> Decision {
        let text = || parts().label();
        if let Some(fast) = &policy.compiled[0].fast {
            // One token bucket, no rules (see `Policy::build`).
            if key == self.global
                && max_wait == 0
                && !want.ticket
                && !want.info
                && !self.dry_run.load(Ordering::Relaxed)
            {
                if let Some(decision) = self.fast(policy, fast, key, cost, &text) {
                    return decision;
                }
            }
        }
        let index = if policy.has_rules() {
            self.rule_of(policy, key, self.timeline.now(), parts)
        } else {
            0
        };
        let rule = &policy.compiled[index];
        // A zero cost would take nothing; count it as one so it cannot slip
        // past a key that is full.
        let cost = cost.max(1);
        if rule.tables.is_empty() {
            // No quota: unlimited.
            self.stats.record(key, Event::Admitted, &text);
            return Decision::Go;
        }
        if cost > rule.capacity {
            self.stats.record(key, Event::Rejected, &text);
            return Decision::TooCostly {
                capacity: rule.capacity,
            };
        }
        let ask = Ask {
            cost,
            horizon: self.horizon_for(max_wait),
            max_wait,
            info: want.info,
            // Nobody waits in a dry run, nor in reject mode; a request that
            // cannot wait does not look for a line either.
            line: (max_wait > 0 && !rule.dry_run && !self.dry_run.load(Ordering::Relaxed))
                .then_some(&self.lines),
        };
        // Look at every quota, holding them all, then book at the latest
        // instant any of them allows: all admit, or nothing is consumed. One
        // quota (the common case) skips the collection.
        // The clock is read once the key's states are held: read before, a
        // request that waited for the lock could see a state booked by a
        // later reading of the clock, mistake it for a clock that ran
        // backwards, and reset the key. (With rules, the rule lookup reads
        // it once more before, only to date the key's rule.)
        match rule.tables.as_slice() {
            [table] => match table.admit(key, &self.timeline, charged_first(rule, ask)) {
                (One::Refused { wait }, now) => self.refused(rule, key, now, wait, 0, &text),
                (
                    One::Booked {
                        grant,
                        remaining,
                        turn,
                    },
                    now,
                ) => {
                    if grant.at == now && turn.is_none() && !want.ticket && remaining.is_none() {
                        // The common case, with nothing to hand back.
                        self.stats.record(key, Event::Admitted, &text);
                        return Decision::Go;
                    }
                    let mut grants = SmallVec::new();
                    grants.push(grant);
                    let remaining = remaining.map(|(n, reset)| (n, reset, 0));
                    let booked = Booked {
                        at: grant.at,
                        grants,
                        remaining,
                        turn,
                    };
                    self.booked(policy, index, key, booked, now, want, &text)
                }
            },
            tables => match self.judge_all(tables, &rule.quotas, key, ask) {
                (Verdict::Booked(booked), now) => {
                    self.booked(policy, index, key, booked, now, want, &text)
                }
                (Verdict::Refused { wait, slowest }, now) => {
                    self.refused(rule, key, now, wait, slowest, &text)
                }
            },
        }
    }

    /// The global key in reject mode, with nothing to hand back, under one
    /// token bucket and no rules: one compare-and-swap on the arrival time
    /// published outside the lock (see [`FastWord`](crate::store::FastWord)),
    /// deciding exactly as the locked path would. `None`: the locked path
    /// decides (nothing is published, as after a retune, a reset or any
    /// locked use of the key; or the request costs more than the bucket
    /// holds).
    #[inline]
    fn fast(
        &self,
        policy: &Policy,
        fast: &super::policy::FastPath,
        key: KeyHash,
        cost: u32,
        text: &dyn Fn() -> String,
    ) -> Option<Decision> {
        let rule = &policy.compiled[0];
        let cost = if rule.first_counts_requests {
            1
        } else {
            cost.max(1)
        };
        if cost > rule.capacity {
            return None;
        }
        let horizon = self.horizon_for(0);
        let now = || self.timeline.now();
        let mut fast_decision = fast.gcra.admit_word(&fast.word, now, cost, horizon);
        if matches!(fast_decision, Fast::Unpublished) && rule.tables[0].publish(&fast.word) {
            fast_decision = fast.gcra.admit_word(&fast.word, now, cost, horizon);
        }
        match fast_decision {
            Fast::Admitted => {
                self.stats.record(key, Event::Admitted, text);
                Some(Decision::Go)
            }
            Fast::Refused { wait, now } => Some(self.refused(rule, key, now, wait, 0, text)),
            Fast::Unpublished => None,
        }
    }

    /// Any booking but a plain one-quota admission: several quotas, or
    /// something to hand back (a ticket, what remains, a turn in the key's
    /// line). Out of line, so that the common admission stays small.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn booked(
        &self,
        policy: &Policy,
        index: usize,
        key: KeyHash,
        booked: Booked,
        now: Nanos,
        want: Want,
        text: &dyn Fn() -> String,
    ) -> Decision {
        let Booked {
            at,
            grants,
            remaining,
            turn,
        } = booked;
        let rule = &policy.compiled[index];
        let info = remaining.map(|(remaining, reset, i)| {
            Box::new(RateLimitInfo {
                policy: rule.name.clone(),
                quota: rule.quotas.get(i).copied(),
                remaining,
                reset: Duration::from_nanos(reset),
                policy_field: rule.policy_fields.get(i).cloned().flatten(),
            })
        });
        let ticket = |grants| {
            Box::new(Ticket {
                key,
                generation: policy.generation,
                rule: index as u32,
                grants,
                remote: None,
            })
        };
        // Not in a line: go now. (A request in a line waits for the waiters
        // ahead, even when its instant is now.)
        let Some(turn) = turn else {
            self.stats.record(key, Event::Admitted, text);
            return match (want.ticket.then(|| ticket(grants)), info) {
                (None, None) => Decision::Go,
                (ticket, info) => Decision::Now { ticket, info },
            };
        };
        self.timeline.check_paused_time(now);
        self.stats.record(key, Event::Queued, text);
        Decision::Later {
            until: self.timeline.instant(at),
            ticket: ticket(grants),
            info,
            turn,
            due: at == now,
        }
    }

    /// Several quotas: lock them all, read the clock, judge, release. Out of
    /// line, so that the one-quota path keeps a small stack frame.
    #[inline(never)]
    fn judge_all(
        &self,
        tables: &[Arc<Table>],
        quotas: &[Quota],
        key: KeyHash,
        ask: Ask<'_>,
    ) -> (Verdict, Nanos) {
        let mut held: SmallVec<[Held<'_>; 4]> = tables.iter().map(|t| t.lock(key)).collect();
        let now = self.timeline.now();
        let verdict = judge(&mut held, quotas, key, now, ask, &self.timeline);
        let tidy: SmallVec<[Tidy; 4]> = held.iter().map(Held::tidy).collect();
        drop(held);
        for (table, tidy) in tables.iter().zip(tidy) {
            table.tidy(key, now, tidy);
        }
        (verdict, now)
    }

    /// A refusal (or, in a dry run, the admission that stands in for it).
    #[cold]
    fn refused(
        &self,
        rule: &Compiled,
        key: KeyHash,
        now: Nanos,
        wait: Nanos,
        slowest: usize,
        text: &dyn Fn() -> String,
    ) -> Decision {
        self.timeline.check_paused_time(now);
        let retry_after = Duration::from_nanos(wait);
        if rule.dry_run || self.dry_run.load(Ordering::Relaxed) {
            self.stats.record(key, Event::WouldReject, text);
            self.stats.record(key, Event::Admitted, text);
            tracing::debug!(
                key = %Quoted(&text()),
                ?retry_after,
                "rate limit (dry run): would refuse"
            );
            return Decision::Go;
        }
        self.stats.record(key, Event::Rejected, text);
        Decision::Denied(Box::new(Denied {
            retry_after,
            quota: rule.quotas[slowest],
            policy: rule.name.clone(),
        }))
    }

    /// How far ahead of now a key's state may lie before it is taken for the
    /// mark of a clock that ran backwards: the longest wait this limiter has
    /// allowed (raised to `max_wait`), plus a second of slack so that clock
    /// readings racing on several threads, or a clock stepped back a little,
    /// never reset a key (which would admit a free burst).
    #[inline]
    fn horizon_for(&self, max_wait: Nanos) -> Nanos {
        let mut horizon = self.horizon.load(Ordering::Relaxed);
        if max_wait > horizon {
            self.horizon.fetch_max(max_wait, Ordering::Relaxed);
            horizon = max_wait;
        }
        horizon.saturating_add(CLOCK_SLACK)
    }

    /// The compiled index of `key`'s rule: cached per key, looked up once
    /// per key and policy generation.
    fn rule_of(
        &self,
        policy: &Policy,
        key: KeyHash,
        now: Nanos,
        parts: &dyn Fn() -> KeyTexts,
    ) -> usize {
        let idle_at = now
            .saturating_add(policy.longest_period)
            .saturating_add(self.horizon.load(Ordering::Relaxed));
        let mut locked = self.rules.lock(key, now);
        let ((), slot) = locked.get();
        if slot.generation == policy.generation {
            slot.idle_at = idle_at;
            return slot.rule as usize;
        }
        let index = policy.find(parts().parts());
        let name = name_id(&policy.compiled[index].name);
        let moved = if slot.generation == 0 {
            // Not seen under any rule: it may have spent under the default
            // before the rules came.
            index != 0 && policy.compiled[0].tables.iter().any(|t| t.in_use(key, now))
        } else {
            slot.name != name && !slot.is_idle(now)
        };
        *slot = RuleSlot {
            generation: policy.generation,
            rule: index as u32,
            name,
            idle_at,
        };
        drop(locked);
        if moved {
            // The key spent under another rule; how much is not known here,
            // so it starts its new rule with nothing, never a free burst,
            // and after the waiters it has from before, even where it has
            // state from an earlier stay.
            let floor = self.lines.floor(key, now, Nanos::MAX);
            for table in &policy.compiled[index].tables {
                table.start_spent(key, now);
                if floor > now {
                    table.fill_until(key, now, floor);
                }
            }
        }
        index
    }
}

#[cfg(test)]
mod tests;
