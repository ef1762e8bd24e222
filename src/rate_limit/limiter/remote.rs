//! The limiter on Redis: each decision is one script call; the in-process
//! tables only serve when Redis is away (failing open with the local
//! fallback).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::{Booked, Decision, Limiter, Ticket, Want};
use crate::clock::{Nanos, saturating_nanos};
use crate::error::ConfigError;
use crate::key::{KeyHash, KeyTexts};
use crate::rate_limit::lines::turn_for;
use crate::rate_limit::policy::Policy;
use crate::rate_limit::quota::Quota;
pub(crate) use crate::rate_limit::redis::RemoteGrant;
use crate::rate_limit::redis::{self as rate, Admission, Epoch, Refused, RemoteAsk, Reply};
use crate::rate_limit::rule::Rule;
use crate::redis::{OnError, RedisStore, StoreError};
use crate::stats::{Event, StoreCounters};

/// A limiter's link to Redis.
pub(crate) struct Remote {
    pub(crate) store: RedisStore,
    pub(crate) refused: Refused,
    pub(crate) counters: Arc<StoreCounters>,
}

impl Remote {
    pub(crate) fn new(store: RedisStore, counters: Arc<StoreCounters>) -> Self {
        Self {
            store,
            refused: Refused::default(),
            counters,
        }
    }

    /// How long a request of cost 1 on `key` would wait, as far as the
    /// refusals remembered here say (zero: nothing remembered).
    pub(crate) fn peek_refused(&self, key: KeyHash, generation: u32) -> std::time::Duration {
        let now = self.store.local_micros();
        self.refused
            .check(key, 1, 0, now, generation)
            .map_or(std::time::Duration::ZERO, |(wait, _)| wait)
    }

    /// Give a booking on `key` back, in a task of its own: a response
    /// future or a waiter being dropped cannot wait for Redis. Once Redis
    /// has it, a refusal of the key remembered here no longer holds. Outside
    /// a runtime, or when the call fails, the capacity stays spent.
    pub(crate) fn give_back(self: &Arc<Self>, grant: Arc<RemoteGrant>, key: KeyHash, cancel: bool) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let remote = self.clone();
        runtime.spawn(async move {
            if grant.give_back(&remote.store, cancel).await.is_ok() {
                remote.refused.forget(Some(key));
            }
        });
    }

    /// Charge `extra` more on `grant` of `key`, in a task of its own (see
    /// [`RemoteGrant::charge`]). Once Redis has it, a refusal of the key
    /// remembered here no longer says how long the key waits: forgotten.
    pub(crate) fn charge(self: &Arc<Self>, grant: Arc<RemoteGrant>, key: KeyHash, extra: u32) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let remote = self.clone();
        runtime.spawn(async move {
            if grant.charge(&remote.store, extra).await.is_ok() {
                remote.refused.forget(Some(key));
            }
        });
    }
}

/// A decision on Redis, to be awaited.
pub(crate) type RemoteDecision = Pin<Box<dyn Future<Output = Decision> + Send>>;

/// What a request on a Redis-backed limiter gets: a decision made here (no
/// quota, a cost above capacity, a key refused a moment ago), or one to
/// await.
pub(crate) enum Asked {
    Decided(Decision),
    Asking(RemoteDecision),
}

/// One request's question to Redis, to read the answer by.
struct Question<'a> {
    index: usize,
    key: KeyHash,
    texts: &'a KeyTexts,
    cost: u32,
    max_wait: Nanos,
    want: Want,
    /// When it was sent, on the store's local clock.
    sent: u64,
    /// Where the refusal cache was then (see `Refused::epoch`).
    asked: Epoch,
}

/// Whether every quota can be kept on Redis as in process.
pub(crate) fn check_quotas(default: &[Quota], rules: &[Rule]) -> Result<(), ConfigError> {
    for (i, quota) in default.iter().enumerate() {
        rate::check_quota(quota).map_err(|e| e.within(&format!("quotas[{i}]")))?;
    }
    for (r, rule) in rules.iter().enumerate() {
        for (i, quota) in rule.quotas.iter().enumerate() {
            rate::check_quota(quota).map_err(|e| e.within(&format!("rules[{r}].quotas[{i}]")))?;
        }
    }
    Ok(())
}

impl Limiter {
    /// The limiter's link to Redis, if it keeps its state there.
    #[inline]
    pub(crate) fn remote(&self) -> Option<&Arc<Remote>> {
        self.remote.as_ref()
    }

    /// Keep this limiter's state in `store`.
    pub(crate) fn with_remote(mut self, store: &RedisStore) -> Self {
        let counters = Arc::new(StoreCounters::default());
        // A new limiter's stats are its own.
        self.stats = match Arc::try_unwrap(self.stats) {
            Ok(stats) => Arc::new(stats.with_store_counters(counters.clone())),
            Err(shared) => shared,
        };
        self.remote = Some(Arc::new(Remote::new(store.clone(), counters)));
        self
    }

    /// Decide on `key` (its parts `texts`) in Redis: as
    /// [`Limiter::acquire`], with a round trip.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ask_remote(
        self: &Arc<Self>,
        remote: &Arc<Remote>,
        policy: &Arc<Policy>,
        key: KeyHash,
        texts: KeyTexts,
        cost: u32,
        max_wait: Nanos,
        want: Want,
    ) -> Asked {
        let text = || texts.label();
        let index = if policy.has_rules() {
            policy.find(texts.parts())
        } else {
            0
        };
        let rule = &policy.compiled[index];
        let cost = cost.max(1);
        if rule.tables.is_empty() {
            self.stats.record(key, Event::Admitted, &text);
            return Asked::Decided(Decision::Go);
        }
        if cost > rule.capacity {
            self.stats.record(key, Event::Rejected, &text);
            return Asked::Decided(Decision::TooCostly {
                capacity: rule.capacity,
            });
        }
        let local = remote.store.local_micros();
        if let Some((wait, slowest)) =
            remote
                .refused
                .check(key, cost, max_wait, local, policy.generation)
        {
            StoreCounters::add(&remote.counters.cached_refusals);
            let now = self.timeline.now();
            return Asked::Decided(self.refused(
                rule,
                key,
                now,
                saturating_nanos(wait),
                slowest,
                &text,
            ));
        }
        let dry_run = rule.dry_run || self.dry_run.load(Ordering::Relaxed);
        let waits = max_wait > 0 && !dry_run;
        let admission = Admission::new(
            &remote.store,
            RemoteAsk {
                parts: texts.parts(),
                rule: policy.has_rules().then_some(&*rule.name),
                default_quota: (index != 0)
                    .then(|| policy.compiled[0].quotas.first())
                    .flatten(),
                quotas: &rule.quotas,
                replaced: &rule.replaced,
                cost,
                max_wait,
                info: want.info,
                waits,
                longest_period: policy.longest_period,
            },
        );
        let (limiter, remote, policy) = (self.clone(), remote.clone(), policy.clone());
        Asked::Asking(Box::pin(async move {
            // The refusal's wait counts from Redis's now, which lies between
            // sending and hearing back: counted from the sending, the cache
            // never refuses past the instant.
            let sent = remote.store.local_micros();
            let asked = remote.refused.epoch();
            let reply = admission.run(&remote.store).await;
            let question = Question {
                index,
                key,
                texts: &texts,
                cost,
                max_wait,
                want,
                sent,
                asked,
            };
            limiter.answered(&remote, &policy, question, reply)
        }))
    }

    /// Turn Redis's answer (or its absence) into a decision.
    fn answered(
        &self,
        remote: &Remote,
        policy: &Policy,
        question: Question<'_>,
        reply: Result<Reply, StoreError>,
    ) -> Decision {
        let Question {
            index,
            key,
            texts,
            cost,
            max_wait,
            want,
            sent,
            asked,
        } = question;
        let text = || texts.label();
        let rule = &policy.compiled[index];
        let now = self.timeline.now();
        // Redis's reply is outside input: a booking further off than the
        // script was allowed to make is an error (what it booked stays
        // spent), not a request asleep for years.
        let reply = reply.and_then(|reply| match reply {
            Reply::Booked { wait, .. } if saturating_nanos(wait) > max_wait => {
                // Booked all the same: what it took stays spent.
                remote.refused.booked(key);
                remote.store.bad_reply("rate limit");
                Err(StoreError::Reply)
            }
            reply => Ok(reply),
        });
        match reply {
            Ok(Reply::Refused { wait, slowest }) => {
                // Under the policy asked about: a retune since voids it.
                remote
                    .refused
                    .insert(key, cost, sent, wait, slowest, policy.generation, asked);
                self.refused(rule, key, now, saturating_nanos(wait), slowest, &text)
            }
            Ok(Reply::Booked {
                wait,
                left,
                reset,
                tightest,
                grant,
            }) => {
                // What it took lengthens any refusal of the key remembered here.
                remote.refused.booked(key);
                let at = now.saturating_add(saturating_nanos(wait));
                let dry_run = rule.dry_run || self.dry_run.load(Ordering::Relaxed);
                let line = (max_wait > 0 && !dry_run).then_some(&self.lines);
                let turn = turn_for(line, key, at, now, &self.timeline);
                let booked = Booked {
                    at,
                    grants: SmallVec::new(),
                    remaining: want.info.then(|| (left, saturating_nanos(reset), tightest)),
                    turn,
                };
                let mut decision = self.booked(policy, index, key, booked, now, want, &text);
                match &mut decision {
                    Decision::Now {
                        ticket: Some(ticket),
                        ..
                    }
                    | Decision::Later { ticket, .. } => ticket.remote = Some(grant),
                    _ => {}
                }
                decision
            }
            Err(_) => {
                StoreCounters::add(&remote.counters.errors);
                match (remote.store.on_error, remote.store.local_fallback) {
                    (OnError::Closed, _) => {
                        self.stats.record(key, Event::Rejected, &text);
                        Decision::Unavailable
                    }
                    (OnError::Open, true) => {
                        StoreCounters::add(&remote.counters.fallbacks);
                        self.acquire(policy, key, cost, max_wait, &|| texts.clone(), want)
                    }
                    (OnError::Open, false) => {
                        StoreCounters::add(&remote.counters.fallbacks);
                        self.stats.record(key, Event::Admitted, &text);
                        Decision::Go
                    }
                }
            }
        }
    }

    /// A reset or a new turn of the key with `parts`: forget its refusal
    /// here, and its state in Redis (in a task of its own).
    pub(crate) fn forget_remote<P: AsRef<str>>(&self, parts: &[P], turns_only: bool) {
        let Some(remote) = &self.remote else {
            return;
        };
        let parts: Vec<String> = parts.iter().map(|p| p.as_ref().to_owned()).collect();
        let key = self.seed.hash_parts(&parts);
        remote.refused.forget(Some(key));
        let policy = self.policy.load();
        let rule = &policy.compiled[if policy.has_rules() {
            policy.find(&parts)
        } else {
            0
        }];
        let keys = rate::forget_keys(
            &remote.store,
            &parts,
            &rule.name,
            &rule.quotas,
            &rule.replaced,
            turns_only,
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let remote = remote.clone();
        runtime.spawn(async move {
            if rate::delete(&remote.store, &keys).await.is_ok() {
                // A request refused meanwhile saw the state before the reset.
                remote.refused.forget(Some(key));
            }
        });
    }

    /// A retune, or a reset of every key: refusals remembered here no
    /// longer hold.
    pub(crate) fn forget_remote_refusals(&self) {
        if let Some(remote) = &self.remote {
            remote.refused.forget(None);
        }
    }

    /// Quotas a retune would give a limiter on Redis: each must be one the
    /// store keeps as the process does.
    pub(crate) fn check_remote_quotas(
        &self,
        default: &[Quota],
        rules: &[Rule],
    ) -> Result<(), ConfigError> {
        match self.remote {
            Some(_) => check_quotas(default, rules),
            None => Ok(()),
        }
    }

    /// How long a request of cost 1 on `key` would wait as far as a limiter
    /// on Redis knows without asking (a refusal remembered); none for a
    /// limiter in process.
    pub(crate) fn peek_remote(&self, key: KeyHash) -> Option<std::time::Duration> {
        let remote = self.remote.as_ref()?;
        Some(remote.peek_refused(key, self.policy.load().generation))
    }

    /// Give back a ticket booked in Redis (see [`Limiter::give_back`]);
    /// false: it was booked here.
    pub(crate) fn give_back_remote(&self, ticket: &Ticket, cancel: bool) -> bool {
        let Some(grant) = &ticket.remote else {
            return false;
        };
        if let Some(remote) = &self.remote {
            self.gave_back(ticket.key);
            remote.give_back(grant.clone(), ticket.key, cancel);
        }
        true
    }

    /// Settle a ticket booked in Redis (see [`Limiter::settle`]); false: it
    /// was booked here.
    pub(crate) fn settle_remote(&self, ticket: &Ticket, actual: u32) -> bool {
        let Some(grant) = &ticket.remote else {
            return false;
        };
        if let Some(remote) = &self.remote {
            if let Some(excess) = grant.excess_over(actual) {
                self.gave_back(ticket.key);
                remote.give_back(Arc::new(excess), ticket.key, false);
            } else if grant.falls_short_of(actual) {
                remote.charge(grant.clone(), ticket.key, actual - grant.cost());
            }
        }
        true
    }
}
