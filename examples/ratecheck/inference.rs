//! Which limiter is it? A best-effort reading of a `diagnose` run.
//!
//! Diagnose sends a burst half a window before a window boundary (at `t0`),
//! larger than the limit so that it is exhausted, then refill probes for 1.5
//! windows, and one batch just before and one just after the boundary. Each
//! limiter leaves its own trace:
//!
//! | after the burst        | token bucket   | fixed window        | sliding window |
//! |------------------------|----------------|---------------------|----------------|
//! | early (0, W/2)         | refill admitted | all refused        | all refused    |
//! | batch before boundary  | ~nothing       | all refused         | all refused    |
//! | batch after boundary   | ~nothing       | all admitted        | all refused    |
//! | mid [W/2, W)           | refill admitted | admitted           | all refused    |
//! | late [W, 1.5W]         | refill admitted | (what the window has left) | admitted |
//!
//! The numbers are in [`Signals`]; [`infer`] turns them into a verdict with
//! the rules below, and says which numbers led there.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::probe::Outcome;
use crate::schedule::{Phase, Plan};

/// At most this share admitted: "mostly refused".
pub(crate) const MOSTLY_REFUSED: f64 = 0.25;
/// At least this share of the expected refill admitted: "near rpm/window".
pub(crate) const NEAR_REFILL: f64 = 0.5;
/// The batch after the boundary admits at least this much more (as a share
/// of the batch) than the one before: "far more".
pub(crate) const FAR_MORE: f64 = 0.5;
/// Below this share of answers that are 2xx or 429, the run says too little.
pub(crate) const MIN_INFORMATIVE: f64 = 0.8;
/// A sliding window's first probe admitted after the burst comes between
/// these multiples of the window.
pub(crate) const RECOVERY: (f64, f64) = (0.8, 1.3);
/// Confidence when a primary rule holds and no supporting one does; all
/// supporting rules add up to `MAX_CONFIDENCE`.
const BASE_CONFIDENCE: f64 = 0.5;
const MAX_CONFIDENCE: f64 = 0.95;
/// Taken off when another limiter's primary rule holds too.
const CONFLICT_PENALTY: f64 = 0.3;
/// The confidence of an `unknown`.
const UNKNOWN_CONFIDENCE: f64 = 0.1;

/// The limiter a diagnose run points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Limiter {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    Unknown,
}

impl Limiter {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Limiter::TokenBucket => "token_bucket",
            Limiter::FixedWindow => "fixed_window",
            Limiter::SlidingWindow => "sliding_window",
            Limiter::Unknown => "unknown",
        }
    }
}

/// What a diagnose run measured. Ratios of admissions are against the
/// refill expected at `rpm / window` over the span, less one refill (the
/// first refill races the first probe), and never more than was sent; a
/// ratio is absent when less than one admission was expected.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Signals {
    /// The window, in seconds.
    pub(crate) window_s: f64,
    /// The refill rate `--rpm` implies, per second.
    pub(crate) expected_per_s: f64,
    pub(crate) burst_sent: u64,
    /// What the burst got through: an estimate of the limit's capacity.
    pub(crate) burst_admitted: u64,
    pub(crate) burst_refused: u64,
    /// Share of all answers that were 2xx or 429 (the rest say nothing
    /// about the limiter).
    pub(crate) informative_share: f64,
    /// Admissions in (0, W/2) after the burst: probes and the batch before
    /// the boundary.
    pub(crate) early_admission_ratio: Option<f64>,
    /// Admissions in [W/2, W): the batch after the boundary and probes.
    pub(crate) mid_admission_ratio: Option<f64>,
    /// Admissions from one window after the burst to the end.
    pub(crate) late_admission_ratio: Option<f64>,
    /// When the first refill probe was admitted, seconds after the burst.
    pub(crate) first_probe_admitted_s: Option<f64>,
    /// Share of the batch before the boundary admitted (of 2xx + 429).
    pub(crate) boundary_before_admitted: Option<f64>,
    /// Share of the batch after the boundary admitted.
    pub(crate) boundary_after_admitted: Option<f64>,
    /// After minus before.
    pub(crate) boundary_gap: Option<f64>,
}

/// The verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Inference {
    pub(crate) likely_limiter: Limiter,
    /// From 0 to 0.95: how far to trust `likely_limiter`.
    pub(crate) confidence: f64,
    pub(crate) signals: Signals,
    /// Which rules held or failed, with their numbers.
    pub(crate) reasons: Vec<String>,
    /// The confidence each limiter would get (0 when its main rule fails).
    pub(crate) scores: BTreeMap<&'static str, f64>,
}

#[derive(Default)]
struct Tally {
    sent: u64,
    admitted: u64,
    refused: u64,
}

impl Tally {
    fn add(&mut self, o: &Outcome) {
        self.sent += 1;
        self.admitted += u64::from(o.is_success());
        self.refused += u64::from(o.is_refused());
    }

    fn informative(&self) -> u64 {
        self.admitted + self.refused
    }

    /// Admitted against the refill expected over `span` at `per_s`, less one.
    fn refill_ratio(&self, span_s: f64, per_s: f64) -> Option<f64> {
        let expected = (span_s * per_s - 1.0).min(self.informative() as f64);
        (expected >= 1.0).then(|| self.admitted as f64 / expected)
    }

    fn admitted_share(&self) -> Option<f64> {
        (self.informative() > 0).then(|| self.admitted as f64 / self.informative() as f64)
    }
}

/// The signals of a diagnose run: `plan` and its `outcomes`, probing
/// `rpm` per `window` for `probe` after the burst.
pub(crate) fn measure(
    plan: &Plan,
    outcomes: &[Outcome],
    rpm: u32,
    window: Duration,
    probe: Duration,
) -> Signals {
    let w = window.as_secs_f64();
    let per_s = f64::from(rpm) / w;
    let mut signals = Signals {
        window_s: w,
        expected_per_s: per_s,
        ..Signals::default()
    };
    let Some(t0) = plan.burst_at else {
        return signals;
    };
    let (mut burst, mut before, mut after) = (Tally::default(), Tally::default(), Tally::default());
    let (mut early, mut mid, mut late) = (Tally::default(), Tally::default(), Tally::default());
    let mut informative = 0u64;
    let mut first_admitted: Option<f64> = None;
    for o in outcomes {
        let Some(event) = plan.events.get(o.event) else {
            continue;
        };
        informative += u64::from(!o.is_other_failure());
        let rel = event.at.saturating_sub(t0).as_secs_f64();
        let segment: &mut Tally = match event.phase {
            Phase::Burst => &mut burst,
            _ if rel < w / 2.0 => &mut early,
            _ if rel < w => &mut mid,
            _ => &mut late,
        };
        segment.add(o);
        match event.phase {
            Phase::BoundaryBefore => before.add(o),
            Phase::BoundaryAfter => after.add(o),
            Phase::RefillProbe | Phase::SlidingProbe if o.is_success() => {
                first_admitted = Some(first_admitted.map_or(rel, |f| f.min(rel)));
            }
            _ => {}
        }
    }
    signals.burst_sent = burst.sent;
    signals.burst_admitted = burst.admitted;
    signals.burst_refused = burst.refused;
    signals.informative_share = if outcomes.is_empty() {
        0.0
    } else {
        informative as f64 / outcomes.len() as f64
    };
    signals.early_admission_ratio = early.refill_ratio(w / 2.0, per_s);
    signals.mid_admission_ratio = mid.refill_ratio(w / 2.0, per_s);
    let late_span = (probe.as_secs_f64() - w).max(0.0);
    signals.late_admission_ratio = late.refill_ratio(late_span, per_s);
    signals.first_probe_admitted_s = first_admitted;
    signals.boundary_before_admitted = before.admitted_share();
    signals.boundary_after_admitted = after.admitted_share();
    signals.boundary_gap = signals
        .boundary_after_admitted
        .zip(signals.boundary_before_admitted)
        .map(|(a, b)| a - b);
    signals
}

/// One rule: whether it held, and what it read.
struct Rule {
    held: bool,
    text: String,
}

fn show(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.2}"))
}

fn at_most(name: &str, v: Option<f64>, limit: f64, meaning: &str) -> Rule {
    Rule {
        held: v.is_some_and(|v| v <= limit),
        text: format!("{name} {} <= {limit} ({meaning})", show(v)),
    }
}

fn at_least(name: &str, v: Option<f64>, limit: f64, meaning: &str) -> Rule {
    Rule {
        held: v.is_some_and(|v| v >= limit),
        text: format!("{name} {} >= {limit} ({meaning})", show(v)),
    }
}

fn all(rules: Vec<Rule>) -> Rule {
    Rule {
        held: rules.iter().all(|r| r.held),
        text: rules
            .into_iter()
            .map(|r| r.text)
            .collect::<Vec<_>>()
            .join(" and "),
    }
}

/// A limiter's main rule and the rules that support it.
struct Case {
    limiter: Limiter,
    primary: Rule,
    support: Vec<Rule>,
}

impl Case {
    fn score(&self) -> f64 {
        if !self.primary.held {
            return 0.0;
        }
        let held = self.support.iter().filter(|r| r.held).count() as f64;
        let total = self.support.len().max(1) as f64;
        BASE_CONFIDENCE + (MAX_CONFIDENCE - BASE_CONFIDENCE) * held / total
    }
}

fn cases(s: &Signals) -> Vec<Case> {
    let recovery = s.first_probe_admitted_s.map(|t| t / s.window_s);
    vec![
        Case {
            limiter: Limiter::TokenBucket,
            primary: at_least(
                "early_admission_ratio",
                s.early_admission_ratio,
                NEAR_REFILL,
                "probes admitted near rpm/window right after the burst",
            ),
            support: vec![
                Rule {
                    held: s.boundary_gap.is_some_and(|g| g < FAR_MORE),
                    text: format!(
                        "boundary_gap {} < {FAR_MORE} (no reset at the window boundary)",
                        show(s.boundary_gap)
                    ),
                },
                at_least(
                    "mid_admission_ratio",
                    s.mid_admission_ratio,
                    NEAR_REFILL,
                    "refill keeps coming",
                ),
                at_least(
                    "late_admission_ratio",
                    s.late_admission_ratio,
                    NEAR_REFILL,
                    "refill keeps coming",
                ),
            ],
        },
        Case {
            limiter: Limiter::FixedWindow,
            primary: Rule {
                held: s.boundary_gap.is_some_and(|g| g >= FAR_MORE),
                text: format!(
                    "boundary_gap {} >= {FAR_MORE} (the batch after the boundary got far more \
                     through than the one before)",
                    show(s.boundary_gap)
                ),
            },
            support: vec![
                at_most(
                    "early_admission_ratio",
                    s.early_admission_ratio,
                    MOSTLY_REFUSED,
                    "nothing refills before the boundary",
                ),
                at_most(
                    "boundary_before_admitted",
                    s.boundary_before_admitted,
                    MOSTLY_REFUSED,
                    "the window was spent",
                ),
                at_least(
                    "mid_admission_ratio",
                    s.mid_admission_ratio,
                    NEAR_REFILL,
                    "capacity back well before one window had passed",
                ),
            ],
        },
        Case {
            limiter: Limiter::SlidingWindow,
            primary: all(vec![
                at_most(
                    "early_admission_ratio",
                    s.early_admission_ratio,
                    MOSTLY_REFUSED,
                    "probes refused",
                ),
                at_most(
                    "mid_admission_ratio",
                    s.mid_admission_ratio,
                    MOSTLY_REFUSED,
                    "still refused across the boundary",
                ),
                at_least(
                    "late_admission_ratio",
                    s.late_admission_ratio,
                    NEAR_REFILL,
                    "admitted again one window after the burst",
                ),
            ]),
            support: vec![
                at_most(
                    "boundary_after_admitted",
                    s.boundary_after_admitted,
                    MOSTLY_REFUSED,
                    "no reset at the boundary",
                ),
                Rule {
                    held: recovery.is_some_and(|r| (RECOVERY.0..=RECOVERY.1).contains(&r)),
                    text: format!(
                        "first probe admitted at {} windows after the burst, within {}..{}",
                        show(recovery),
                        RECOVERY.0,
                        RECOVERY.1
                    ),
                },
            ],
        },
    ]
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn unknown(
    signals: Signals,
    reasons: Vec<String>,
    scores: BTreeMap<&'static str, f64>,
) -> Inference {
    Inference {
        likely_limiter: Limiter::Unknown,
        confidence: UNKNOWN_CONFIDENCE,
        signals,
        reasons,
        scores,
    }
}

/// The verdict on `signals`. `interrupted` runs are judged on what they
/// have, and say so.
pub(crate) fn infer(signals: Signals, interrupted: bool) -> Inference {
    let mut reasons = Vec::new();
    if interrupted {
        reasons.push("the run was interrupted; judged on the requests that were sent".to_string());
    }
    if signals.informative_share < MIN_INFORMATIVE {
        reasons.push(format!(
            "informative_share {:.2} < {MIN_INFORMATIVE}: too many answers other than 2xx and \
             429 (see errors) to read the limiter",
            signals.informative_share
        ));
        return unknown(signals, reasons, BTreeMap::new());
    }
    if signals.burst_refused == 0 {
        reasons.push(format!(
            "the burst of {} saw no 429 ({} admitted): the limit is above that, or not enforced \
             on this route; try a larger --rpm or --burst",
            signals.burst_sent, signals.burst_admitted
        ));
        return unknown(signals, reasons, BTreeMap::new());
    }

    let cases = cases(&signals);
    let scores: BTreeMap<&'static str, f64> = cases
        .iter()
        .map(|c| (c.limiter.name(), round2(c.score())))
        .collect();
    let mut ranked: Vec<(&Case, f64)> = cases.iter().map(|c| (c, c.score())).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let (best, best_score) = ranked[0];
    let (second, second_score) = ranked[1];
    if best_score == 0.0 || best_score == second_score {
        reasons.push("no limiter's main rule held (or two held equally):".to_string());
        for case in &cases {
            reasons.push(format!("{}: {}", case.limiter.name(), case.primary.text));
        }
        return unknown(signals, reasons, scores);
    }
    let mut confidence = best_score;
    reasons.push(format!("{}: {}", best.limiter.name(), best.primary.text));
    for rule in &best.support {
        let mark = if rule.held {
            "supports"
        } else {
            "does not support"
        };
        reasons.push(format!("{mark}: {}", rule.text));
    }
    if second_score > 0.0 {
        confidence = (confidence - CONFLICT_PENALTY).max(UNKNOWN_CONFIDENCE);
        reasons.push(format!(
            "also consistent with {}: {}",
            second.limiter.name(),
            second.primary.text
        ));
    }
    Inference {
        likely_limiter: best.limiter,
        confidence: round2(confidence),
        signals,
        reasons,
        scores,
    }
}
