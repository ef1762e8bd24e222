//! The quotas in force: the default and the rules, with their tables.

use std::sync::Arc;

use super::algorithm::Gcra;
use super::quota::{Algorithm, Quota, Unit};
use super::rule::{Matcher, Rule};
use super::table::{Params, Table};
use crate::clock::{Nanos, saturating_nanos};
use crate::key::KeyHash;
use crate::store::FastWord;

/// The global key's one-compare-and-swap admission, for a policy that is
/// one token bucket and no rules (see `Limiter::acquire`).
pub(crate) struct FastPath {
    /// Where the global key's arrival time is published; made anew with
    /// each policy, so that a word never outlives its parameters.
    pub(crate) word: Arc<FastWord>,
    /// The table's parameters when `word` was installed.
    pub(crate) gcra: Gcra,
}

/// A rule (or the default) with the tables its quotas live in.
pub(crate) struct Compiled {
    /// Identifies the rule across retunes.
    pub(crate) name: Arc<str>,
    pub(crate) quotas: Vec<Quota>,
    pub(crate) tables: Vec<Arc<Table>>,
    /// Per quota, the quota of another algorithm (same unit) it replaced
    /// in a retune, if any: a shared store finds a key's state under that
    /// quota's name and carries what it spent (see
    /// [`Table::carry_from`] for the same in process).
    pub(crate) replaced: Vec<Option<Quota>>,
    pub(crate) dry_run: bool,
    /// The most one request may cost: the smallest capacity of the quotas
    /// that count cost.
    pub(crate) capacity: u32,
    /// The first quota counts requests, not cost: precomputed, as the one
    /// quota's case reads it on every request.
    pub(crate) first_counts_requests: bool,
    /// The global key's fast path, when the policy allows one.
    pub(crate) fast: Option<FastPath>,
    /// Each quota's `RateLimit-Policy` value, formatted once.
    pub(crate) policy_fields: Vec<Option<http::HeaderValue>>,
}

/// Everything a decision reads, swapped whole on a retune.
pub(crate) struct Policy {
    /// Changes on every retune; a key's cached rule from another generation
    /// is looked up again.
    pub(crate) generation: u32,
    /// Index 0 is the default; rule `i` is at `i + 1`.
    pub(crate) compiled: Vec<Compiled>,
    pub(crate) rules: Vec<Rule>,
    matcher: Matcher,
    /// The longest any quota's state lasts after a request (its period;
    /// two for a sliding window counter): how long a key's rule is worth
    /// remembering after its last request.
    pub(crate) longest_period: Nanos,
}

/// The name the default quotas go by: the policy name of a key no rule
/// matches, in [`RateLimitInfo::policy`](super::RateLimitInfo),
/// [`RateLimited::policy`](crate::error::RateLimited) and the
/// `RateLimit-Policy` and `RateLimit` headers
/// ([`RateLimitHeaders`](crate::respond::RateLimitHeaders)).
///
/// In parentheses, like [`OTHER_KEYS`](crate::stats::OTHER_KEYS), so that it
/// cannot be taken for a rule: a rule may be named `default`, but not
/// `(default)`.
pub const DEFAULT_POLICY: &str = "(default)";

impl Policy {
    /// Build a policy, reusing `previous`'s tables for the same rule name and
    /// quota position where the algorithm is unchanged (retuning them in
    /// place, `hold` running for each key as it is converted), so no key's
    /// spending is forgotten.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        generation: u32,
        default: &[Quota],
        rules: Vec<Rule>,
        previous: Option<&Policy>,
        epoch_offset: Nanos,
        now: Nanos,
        global: KeyHash,
        hold: &dyn Fn(KeyHash) -> Nanos,
    ) -> Self {
        let mut compiled = Vec::with_capacity(rules.len() + 1);
        let named = std::iter::once((DEFAULT_POLICY, default, false)).chain(
            rules
                .iter()
                .map(|r| (r.name.as_str(), &r.quotas[..], r.dry_run)),
        );
        let mut longest_period = 0;
        // One token bucket and no rules: the global key's admissions can
        // skip the lock (see `Limiter::acquire`).
        let fast_params = match default {
            [quota] if rules.is_empty() => match Params::of(quota, epoch_offset) {
                Params::TokenBucket(gcra) => Some(gcra),
                _ => None,
            },
            _ => None,
        };
        for (name, quotas, dry_run) in named {
            let fast = fast_params
                .filter(|_| compiled.is_empty())
                .map(|gcra| FastPath {
                    word: Arc::new(FastWord::new()),
                    gcra,
                });
            let word = fast.as_ref().map(|f| f.word.clone());
            let old = previous.and_then(|p| p.compiled.iter().find(|c| &*c.name == name));
            let replaced = quotas
                .iter()
                .enumerate()
                .map(|(i, quota)| {
                    let before = old.and_then(|c| c.quotas.get(i))?;
                    if before.unit() != quota.unit() {
                        None
                    } else if before.algorithm() != quota.algorithm() {
                        Some(*before)
                    } else {
                        // Retuned in place: an earlier replacement may
                        // still hold a key's state.
                        old.and_then(|c| c.replaced.get(i).cloned().flatten())
                    }
                })
                .collect();
            let tables = quotas
                .iter()
                .enumerate()
                .map(|(i, quota)| {
                    let params = Params::of(quota, epoch_offset);
                    let period = saturating_nanos(quota.period());
                    // A sliding window counter's window weighs until a
                    // whole window after it ended.
                    let lasts = if quota.algorithm() == Algorithm::SlidingWindowCounter {
                        period.saturating_mul(2)
                    } else {
                        period
                    };
                    longest_period = longest_period.max(lasts);
                    // A quota that now counts something else starts afresh
                    // (spent, see `Limiter::retune`): tokens are not requests.
                    let same_unit = old
                        .and_then(|c| c.quotas.get(i))
                        .is_some_and(|q| q.unit() == quota.unit());
                    match old.and_then(|c| c.tables.get(i)) {
                        Some(table) if same_unit && table.accepts(&params) => {
                            // Before the conversion: the old word is
                            // taken back and retired, so no admission
                            // computed under the old parameters lands
                            // after it.
                            table.install_fast(word.clone());
                            table.retune(&params, now, hold);
                            table.clone()
                        }
                        _ => {
                            let table = Table::new(params, sweep_every(period), global);
                            table.install_fast(word.clone());
                            Arc::new(table)
                        }
                    }
                })
                .collect();
            compiled.push(Compiled {
                name: Arc::from(name),
                quotas: quotas.to_vec(),
                tables,
                replaced,
                dry_run,
                // A quota counting requests takes one unit whatever the cost.
                capacity: quotas
                    .iter()
                    .filter(|q| q.unit() == Unit::Cost)
                    .map(Quota::burst)
                    .min()
                    .unwrap_or(u32::MAX),
                first_counts_requests: quotas.first().is_some_and(|q| q.unit() == Unit::Requests),
                fast,
                policy_fields: quotas
                    .iter()
                    .map(|q| crate::respond::policy_field(name, q))
                    .collect(),
            });
        }
        Self {
            generation,
            compiled,
            matcher: Matcher::new(&rules),
            rules,
            longest_period,
        }
    }

    /// The same policy under `generation`: the same tables (so nothing is
    /// converted or forgotten), rules and quotas.
    pub(crate) fn renumbered(&self, generation: u32) -> Self {
        let compiled = self
            .compiled
            .iter()
            .map(|c| Compiled {
                name: c.name.clone(),
                quotas: c.quotas.clone(),
                tables: c.tables.clone(),
                replaced: c.replaced.clone(),
                dry_run: c.dry_run,
                capacity: c.capacity,
                first_counts_requests: c.first_counts_requests,
                policy_fields: c.policy_fields.clone(),
                // The same tables and parameters: the same word.
                fast: c.fast.as_ref().map(|f| FastPath {
                    word: f.word.clone(),
                    gcra: f.gcra,
                }),
            })
            .collect();
        Self {
            generation,
            compiled,
            rules: self.rules.clone(),
            matcher: Matcher::new(&self.rules),
            longest_period: self.longest_period,
        }
    }

    /// The tables of `self` that replaced one of `old`'s because the quota
    /// at that rule and position changed algorithm, each with the table it
    /// replaced (see [`Table::carry_from`]).
    pub(crate) fn replaced(&self, old: &Policy) -> Vec<(Arc<Table>, Arc<Table>)> {
        let mut pairs = Vec::new();
        for new in &self.compiled {
            let Some(before) = old.compiled.iter().find(|c| c.name == new.name) else {
                continue;
            };
            for (i, table) in new.tables.iter().enumerate() {
                let (Some(was), Some(quota), Some(old_quota)) = (
                    before.tables.get(i),
                    new.quotas.get(i),
                    before.quotas.get(i),
                ) else {
                    continue;
                };
                if !Arc::ptr_eq(was, table) && quota.unit() == old_quota.unit() {
                    pairs.push((was.clone(), table.clone()));
                }
            }
        }
        pairs
    }

    /// Whether any rule exists (if not, every key uses the default).
    #[inline]
    pub(crate) fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The compiled index for a key with these parts.
    pub(crate) fn find(&self, parts: &[String]) -> usize {
        self.matcher.find(&self.rules, parts).map_or(0, |i| i + 1)
    }
}

/// Idle keys are looked for about once a period, at least every second and
/// at most every minute.
fn sweep_every(period: Nanos) -> Nanos {
    period.clamp(1_000_000_000, 60_000_000_000)
}
