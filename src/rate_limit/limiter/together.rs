//! Several limiters judging one request together, each on its own key:
//! every one admits and each books, or nothing is booked anywhere.
//!
//! The keys' states are all held while the request is judged, so that no
//! other request can book in between. They are locked limiter by limiter in
//! the order of the limiters' addresses (see [`Limiter::id`]), and within one
//! limiter in the order of its quotas, as a one-limiter admission locks
//! them: two joint admissions over the same limiters, listed in any order,
//! lock in the same order and cannot deadlock. (A joint admission never
//! holds two keys of one limiter: the layer refuses a limiter given twice.)

use std::time::Duration;

use smallvec::SmallVec;

use super::{Denied, Limiter, Ticket};
use crate::clock::Nanos;
use crate::key::{KeyHash, KeyTexts};
use crate::rate_limit::algorithm::Grant;
use crate::rate_limit::policy::{Compiled, Policy};
use crate::rate_limit::table::Held;
use crate::stats::Event;
use crate::store::Tidy;

/// One limit of a joint admission: its limiter (switched on), the policy
/// its service last saw (see [`Limiter::refresh`]), the request's key under
/// it and what the request costs there.
pub(crate) struct Entrant<'a> {
    pub(crate) limiter: &'a Limiter,
    pub(crate) policy: &'a Policy,
    pub(crate) key: KeyHash,
    pub(crate) cost: u32,
    /// Renders the key's parts, for rule lookup and per-key counters.
    pub(crate) parts: &'a dyn Fn() -> KeyTexts,
}

/// What the limiters decided together.
#[derive(Debug)]
pub(crate) enum JointDecision {
    /// Every limiter admitted: a ticket per entrant that booked, when
    /// tickets were asked for (none for one without a quota, or one in a
    /// dry run that would have refused).
    Admitted(SmallVec<[Option<Box<Ticket>>; 2]>),
    /// Refused; nothing was booked anywhere. `first`: the first entrant,
    /// in the order given, that refused, and its refusal; `waits`: per
    /// entrant, how long until it would admit, for those that refused.
    Refused {
        first: usize,
        denied: Box<Denied>,
        waits: SmallVec<[Option<Duration>; 2]>,
    },
    /// The request costs more than entrant `index` can ever admit at once.
    TooCostly { index: usize, capacity: u32 },
}

/// An entrant with a quota to judge.
struct Plan<'a> {
    entrant: usize,
    rule_index: usize,
    rule: &'a Compiled,
    cost: u32,
    /// A dry run (of its limiter or its rule): refusing, it only counts.
    dry_run: bool,
}

/// How one entrant's quotas judged, while held.
struct Judged {
    now: Nanos,
    /// How long until every quota admits; 0: now.
    wait: Nanos,
    slowest: usize,
}

/// Judge `entrants` together, booking in every one or in none. A limiter
/// switched off is not to be an entrant. The clock of each limiter is read
/// once its keys' states are all held.
pub(crate) fn acquire_joint(entrants: &[Entrant<'_>], want_tickets: bool) -> JointDecision {
    let mut plans: SmallVec<[Plan<'_>; 2]> = SmallVec::new();
    let mut unlimited: SmallVec<[usize; 2]> = SmallVec::new();
    for (i, e) in entrants.iter().enumerate() {
        let limiter = e.limiter;
        let rule_index = if e.policy.has_rules() {
            limiter.rule_of(e.policy, e.key, limiter.timeline.now(), e.parts)
        } else {
            0
        };
        let rule = &e.policy.compiled[rule_index];
        let cost = e.cost.max(1);
        if rule.tables.is_empty() {
            unlimited.push(i);
            continue;
        }
        if cost > rule.capacity {
            limiter
                .stats
                .record(e.key, Event::Rejected, &|| (e.parts)().label());
            return JointDecision::TooCostly {
                index: i,
                capacity: rule.capacity,
            };
        }
        let dry_run = rule.dry_run || limiter.is_dry_run();
        plans.push(Plan {
            entrant: i,
            rule_index,
            rule,
            cost,
            dry_run,
        });
    }
    // Lock in the limiters' order, whatever the entrants' order.
    let mut order: SmallVec<[usize; 2]> = (0..plans.len()).collect();
    order.sort_unstable_by_key(|&p| entrants[plans[p].entrant].limiter.id());
    let mut held: SmallVec<[(usize, SmallVec<[Held<'_>; 2]>); 2]> = order
        .iter()
        .map(|&p| {
            let key = entrants[plans[p].entrant].key;
            (
                p,
                plans[p].rule.tables.iter().map(|t| t.lock(key)).collect(),
            )
        })
        .collect();
    let mut judged: SmallVec<[Option<Judged>; 2]> = plans.iter().map(|_| None).collect();
    for (p, states) in &mut held {
        let plan = &plans[*p];
        let limiter = entrants[plan.entrant].limiter;
        let now = limiter.timeline.now();
        // Nobody waits here: only state a clock that ran backwards left
        // ahead is dropped, as in reject mode.
        let horizon = limiter.horizon_for(0);
        let (mut at, mut slowest) = (now, 0);
        for (i, (state, quota)) in states.iter_mut().zip(&plan.rule.quotas).enumerate() {
            let earliest = state.earliest(now, quota.cost_of(plan.cost), horizon);
            if earliest > at {
                (at, slowest) = (earliest, i);
            }
        }
        judged[*p] = Some(Judged {
            now,
            wait: at - now,
            slowest,
        });
    }
    let judged: SmallVec<[Judged; 2]> = judged.into_iter().flatten().collect();
    // Plans are in the entrants' order: the first that refuses is the one
    // reported.
    let refused = plans
        .iter()
        .zip(&judged)
        .position(|(plan, j)| j.wait > 0 && !plan.dry_run);
    // Booked at now in every entrant that admits (a dry run that would
    // refuse books nothing, as on its own), or nowhere.
    let mut grants: SmallVec<[SmallVec<[Grant; 2]>; 2]> =
        plans.iter().map(|_| SmallVec::new()).collect();
    if refused.is_none() {
        for (p, states) in &mut held {
            let j = &judged[*p];
            if j.wait == 0 {
                let plan = &plans[*p];
                for (state, quota) in states.iter_mut().zip(&plan.rule.quotas) {
                    grants[*p].push(state.book(j.now, j.now, quota.cost_of(plan.cost)));
                }
            }
        }
    }
    let tidy: SmallVec<[(usize, SmallVec<[Tidy; 2]>); 2]> = held
        .iter()
        .map(|(p, states)| (*p, states.iter().map(Held::tidy).collect()))
        .collect();
    drop(held);
    for (p, tidy) in tidy {
        let plan = &plans[p];
        let key = entrants[plan.entrant].key;
        for (table, tidy) in plan.rule.tables.iter().zip(tidy) {
            table.tidy(key, judged[p].now, tidy);
        }
    }
    match refused {
        Some(first) => refusal(entrants, &plans, &judged, first),
        None => admission(entrants, &plans, &judged, grants, &unlimited, want_tickets),
    }
}

/// Count a joint admission in each limiter's stats, with its tickets.
fn admission(
    entrants: &[Entrant<'_>],
    plans: &[Plan<'_>],
    judged: &[Judged],
    grants: SmallVec<[SmallVec<[Grant; 2]>; 2]>,
    unlimited: &[usize],
    want_tickets: bool,
) -> JointDecision {
    let mut tickets: SmallVec<[Option<Box<Ticket>>; 2]> = entrants.iter().map(|_| None).collect();
    for ((plan, j), grants) in plans.iter().zip(judged).zip(grants) {
        let e = &entrants[plan.entrant];
        let text = || (e.parts)().label();
        if j.wait > 0 {
            // A dry run that would have refused: admitted, and counted.
            e.limiter.stats.record(e.key, Event::WouldReject, &text);
            tracing::debug!(
                retry_after = ?Duration::from_nanos(j.wait),
                "rate limit (dry run, joint): would refuse"
            );
        }
        e.limiter.stats.record(e.key, Event::Admitted, &text);
        if want_tickets && !grants.is_empty() {
            tickets[plan.entrant] = Some(Box::new(Ticket {
                key: e.key,
                generation: e.policy.generation,
                rule: plan.rule_index as u32,
                grants,
                remote: None,
            }));
        }
    }
    for &i in unlimited {
        let e = &entrants[i];
        e.limiter
            .stats
            .record(e.key, Event::Admitted, &|| (e.parts)().label());
    }
    JointDecision::Admitted(tickets)
}

/// Count a joint refusal in the limiters that refused; plan `first` is
/// the one reported.
fn refusal(
    entrants: &[Entrant<'_>],
    plans: &[Plan<'_>],
    judged: &[Judged],
    first: usize,
) -> JointDecision {
    let mut waits: SmallVec<[Option<Duration>; 2]> = entrants.iter().map(|_| None).collect();
    for (plan, j) in plans.iter().zip(judged) {
        if j.wait == 0 {
            continue;
        }
        let e = &entrants[plan.entrant];
        let text = || (e.parts)().label();
        e.limiter.timeline.check_paused_time(j.now);
        if plan.dry_run {
            e.limiter.stats.record(e.key, Event::WouldReject, &text);
        } else {
            e.limiter.stats.record(e.key, Event::Rejected, &text);
            waits[plan.entrant] = Some(Duration::from_nanos(j.wait));
        }
    }
    let (plan, j) = (&plans[first], &judged[first]);
    let denied = Denied {
        retry_after: Duration::from_nanos(j.wait),
        quota: plan.rule.quotas[j.slowest],
        policy: plan.rule.name.clone(),
    };
    JointDecision::Refused {
        first: plan.entrant,
        denied: Box::new(denied),
        waits,
    }
}
