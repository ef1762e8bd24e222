//! Which limiter is it, and what does it enforce? The reading of a
//! `diagnose` run.
//!
//! Diagnose sends, from an instant `t0` halfway through a clock-aligned
//! window W (the `--window` hint): a burst larger than the limit; probes at
//! twice the expected rate for two windows; a batch just before and one
//! just after the clock boundary at `t0 + W/2`; and a batch a quarter
//! window after the probes (a `--probe-seconds` budget may leave the wait,
//! the batches or some probes out: the models replay what was sent).
//! Each design leaves its own trace:
//!
//! | design                  | after the burst                        | clock boundary  | last batch |
//! |-------------------------|----------------------------------------|-----------------|------------|
//! | token bucket / GCRA     | admits at the refill rate at once      | nothing special | refill only |
//! | fixed window (clock)    | shut until the boundary                | all reopen      | as its window has left |
//! | fixed window (anchored) | shut one window, then a window's worth | nothing         | all reopen |
//! | sliding window (log)    | shut one window, then a window's worth | nothing         | about half |
//! | sliding-window counter  | shut until the boundary, then the rate | a trickle       | refill only |
//! | concurrency             | admits whenever few are in flight      | as in flight    | as in flight |
//!
//! Rather than thresholds on a few numbers, every design is replayed over
//! the requests as they reached the limiter ([`crate::models`]), with the
//! limit and window that predict the answers best. The design that predicts
//! best is named; its confidence is its share of the evidence (each answer
//! another design gets wrong counts against that design), lowered by the
//! answers even the best gets wrong. `unknown` is answered, with the
//! candidates that remain, when no design is clearly ahead. The thresholds
//! below were set on the fixtures of `fixtures.rs` (every design, clean,
//! jittered and with lost requests) and the end-to-end runs of
//! `tests/ratecheck_diagnose.rs`: no wrong name at or above [`NAME_FROM`].

use serde::Serialize;

pub use crate::models::Limiter;
use crate::models::{self, DESIGNS, Fit, Seen};
use crate::schedule::Phase;
use crate::timeline::Timeline;

/// Below this share of answers that are 2xx or 429, the run says too little.
pub const MIN_INFORMATIVE: f64 = 0.8;
/// How much less likely a design is for each answer it gets wrong that the
/// best gets right, in nats: e^-0.7 ≈ one half. Mild on purpose: answers
/// near a refill or a boundary flip together with timing noise, so a margin
/// of one or two says little; five or more (one batch) says a lot.
const NATS_PER_MISMATCH: f64 = 0.7;
/// Confidence is never higher: a probe sees only what one client sees.
const MAX_CONFIDENCE: f64 = 0.95;
/// A design is named only from this confidence up: above one half, so that
/// two designs that fit equally well are never named.
const NAME_FROM: f64 = 0.6;
/// Candidates that remain: at least this likely.
const CANDIDATE_FROM: f64 = 0.1;
/// When even the best design gets more than this share of answers wrong,
/// none of them is what the endpoint runs.
const MAX_WRONG_SHARE: f64 = 0.15;
/// The confidence of an `unknown`.
const UNKNOWN_CONFIDENCE: f64 = 0.1;
/// Measured and hinted limits further apart than this are pointed out.
const HINT_TOLERANCE: f64 = 0.1;

/// What the run showed, for people; the verdict comes from the fits.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Signals {
    /// The `--window` hint, in seconds.
    pub window_hint_s: f64,
    /// The `--rpm` hint: the limit expected per window.
    pub limit_hint: u32,
    pub burst_sent: u64,
    /// What the burst got through: the limit (or burst) when the probe
    /// starts from idle.
    pub burst_admitted: u64,
    pub burst_refused: u64,
    /// Share of all answers that were 2xx or 429 (the rest say nothing
    /// about the limiter).
    pub informative_share: f64,
    /// Seconds from the burst to the first admission after it.
    pub first_admitted_after_burst_s: Option<f64>,
    /// Probes admitted per second, from the burst to the last probe.
    pub probes_admitted_per_s: Option<f64>,
    /// Share admitted of the batch just before the clock boundary.
    pub boundary_before_admitted: Option<f64>,
    /// Share admitted of the batch just after it.
    pub boundary_after_admitted: Option<f64>,
    /// Share admitted of the batch at the end.
    pub late_batch_admitted: Option<f64>,
    /// Share admitted of the batch after a quiet window (sent only when
    /// nothing after the burst was admitted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_silence_admitted: Option<f64>,
    /// The fewest of this probe's admitted requests still in flight when a
    /// 429 came: 0 rules out a concurrency limit.
    pub fewest_in_flight_at_refusal: Option<u32>,
}

/// The limit the named design enforces, and how sure the probe is of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// Requests per window; for a token bucket its burst; for a concurrency
    /// limit, requests in flight.
    pub limit: u32,
    /// Every limit that fits the run as well.
    pub limit_range: [u32; 2],
    /// Seconds; for a token bucket, the time to refill its burst.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Every window that fits the run as well (of those tried).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_range_s: Option<[f64; 2]>,
    /// `limit / window`: the refill rate of a token bucket, the average
    /// rate of a window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    /// Refused requests count too (or push an anchored window's end back):
    /// a client sending faster than the limit is refused for ever, and
    /// must fall silent for a whole window to be admitted again.
    pub counts_refusals: bool,
}

/// How well one design explains the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub limiter: Limiter,
    /// Its share of the evidence, from 0 to 1.
    pub probability: f64,
    /// Answers its best fit predicts wrongly.
    pub mismatches: usize,
    pub fit: Measured,
}

/// The verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Inference {
    pub likely_limiter: Limiter,
    /// From 0 to 0.95: how far to trust `likely_limiter`.
    pub confidence: f64,
    /// What the named design enforces; none for `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
    /// For `unknown`: the designs that remain possible.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remaining: Vec<Limiter>,
    pub signals: Signals,
    /// What led there, with the numbers.
    pub reasons: Vec<String>,
    /// Every design, most likely first (empty when the run said too
    /// little to fit them).
    pub candidates: Vec<Candidate>,
}

fn round(v: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    if v.is_finite() {
        (v * k).round() / k
    } else {
        0.0
    }
}

#[derive(Default)]
struct Tally {
    sent: u64,
    admitted: u64,
    refused: u64,
}

impl Tally {
    fn share(&self) -> Option<f64> {
        let informative = self.admitted + self.refused;
        (informative > 0).then(|| round(self.admitted as f64 / informative as f64, 3))
    }
}

/// The fewest admitted requests in flight at any refusal.
fn fewest_in_flight(seen: &[Seen]) -> Option<u32> {
    let mut starts: Vec<f64> = seen.iter().filter(|r| r.admitted).map(|r| r.t).collect();
    let mut ends: Vec<f64> = seen.iter().filter(|r| r.admitted).map(|r| r.end).collect();
    starts.sort_by(f64::total_cmp);
    ends.sort_by(f64::total_cmp);
    seen.iter()
        .filter(|r| !r.admitted)
        .map(|r| {
            let begun = starts.partition_point(|&s| s <= r.t);
            let ended = ends.partition_point(|&e| e <= r.t);
            u32::try_from(begun.saturating_sub(ended)).unwrap_or(u32::MAX)
        })
        .min()
}

/// The signals of `timeline`.
pub fn signals(timeline: &Timeline) -> Signals {
    let t0 = timeline.burst_at_s;
    let mut burst = Tally::default();
    let mut before = Tally::default();
    let mut after = Tally::default();
    let mut late = Tally::default();
    let mut quiet = Tally::default();
    let mut informative = 0u64;
    let mut first_after: Option<f64> = None;
    let (mut probes_admitted, mut last_probe) = (0u64, None::<f64>);
    for r in &timeline.requests {
        let Some(admitted) = r.admitted() else {
            continue;
        };
        informative += 1;
        let tally = match r.phase {
            Phase::Burst => Some(&mut burst),
            Phase::BoundaryBefore => Some(&mut before),
            Phase::BoundaryAfter => Some(&mut after),
            Phase::LateBatch => Some(&mut late),
            Phase::AfterSilence => Some(&mut quiet),
            _ => None,
        };
        if let Some(t) = tally {
            t.sent += 1;
            t.admitted += u64::from(admitted);
            t.refused += u64::from(!admitted);
        }
        let rel = r.sent_s - t0;
        if r.phase != Phase::Burst && admitted {
            first_after = Some(first_after.map_or(rel, |f| f.min(rel)));
        }
        if r.phase == Phase::RefillProbe {
            probes_admitted += u64::from(admitted);
            last_probe = Some(last_probe.map_or(rel, |l| l.max(rel)));
        }
    }
    let burst_sent = timeline
        .requests
        .iter()
        .filter(|r| r.phase == Phase::Burst)
        .count() as u64;
    let seen = models::seen(timeline);
    Signals {
        window_hint_s: timeline.window_hint_s,
        limit_hint: timeline.limit_hint,
        burst_sent,
        burst_admitted: burst.admitted,
        burst_refused: burst.refused,
        informative_share: if timeline.requests.is_empty() {
            0.0
        } else {
            round(informative as f64 / timeline.requests.len() as f64, 3)
        },
        first_admitted_after_burst_s: first_after.map(|f| round(f, 3)),
        probes_admitted_per_s: last_probe
            .filter(|&l| l > 0.0)
            .map(|l| round(probes_admitted as f64 / l, 3)),
        boundary_before_admitted: before.share(),
        boundary_after_admitted: after.share(),
        late_batch_admitted: late.share(),
        after_silence_admitted: quiet.share(),
        fewest_in_flight_at_refusal: fewest_in_flight(&seen),
    }
}

fn measured(fit: &Fit) -> Measured {
    Measured {
        limit: fit.limit,
        limit_range: [fit.limit_range.0, fit.limit_range.1],
        window_s: fit.window_s.map(|w| round(w, 3)),
        window_range_s: fit.window_range_s.map(|(a, b)| [round(a, 3), round(b, 3)]),
        rate_per_s: fit
            .window_s
            .filter(|&w| w > 0.0)
            .map(|w| round(f64::from(fit.limit) / w, 3)),
        counts_refusals: fit.counts_refusals,
    }
}

/// "10 per 2.00 s" and the like.
pub fn describe(limiter: Limiter, m: &Measured) -> String {
    let window = m.window_s.unwrap_or_default();
    match limiter {
        Limiter::Concurrency => format!("{} in flight", m.limit),
        Limiter::TokenBucket => format!(
            "burst {}, refill {:.3}/s ({} per {window:.2} s)",
            m.limit,
            m.rate_per_s.unwrap_or_default(),
            m.limit
        ),
        _ if m.counts_refusals => format!(
            "{} per {window:.2} s, counting refused requests too",
            m.limit
        ),
        _ => format!("{} per {window:.2} s", m.limit),
    }
}

/// How sure the probe is of a measurement, in words.
pub fn certainty(m: &Measured) -> String {
    let limit = if m.limit_range[0] == m.limit_range[1] {
        "limit exact".to_string()
    } else {
        format!("limit {}..{}", m.limit_range[0], m.limit_range[1])
    };
    match m.window_range_s {
        Some([a, b]) => {
            let w = m.window_s.unwrap_or(1.0).max(f64::MIN_POSITIVE);
            let spread = ((b - a) / 2.0 / w * 100.0).max(0.0);
            format!("{limit}; window {a:.3}..{b:.3} s (±{spread:.1}%)")
        }
        None => limit,
    }
}

fn unknown(signals: Signals, reasons: Vec<String>) -> Inference {
    Inference {
        likely_limiter: Limiter::Unknown,
        confidence: UNKNOWN_CONFIDENCE,
        measured: None,
        remaining: Vec::new(),
        signals,
        reasons,
        candidates: Vec::new(),
    }
}

fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{:.0}%", v * 100.0))
}

/// The verdict on `timeline`. `interrupted` runs are judged on what they
/// have, and say so.
pub fn infer(timeline: &Timeline, interrupted: bool) -> Inference {
    let signals = signals(timeline);
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
        return unknown(signals, reasons);
    }
    if signals.burst_refused == 0 {
        reasons.push(format!(
            "the burst of {} saw no 429 ({} admitted): the limit is above that, or not enforced \
             on this route; try a larger --rpm or --burst",
            signals.burst_sent, signals.burst_admitted
        ));
        return unknown(signals, reasons);
    }
    let w = timeline.window_hint_s;
    reasons.push(format!(
        "burst: {} of {} admitted",
        signals.burst_admitted, signals.burst_sent
    ));
    if let Some(quiet) = signals.after_silence_admitted {
        reasons.push(format!(
            "nothing was admitted under the probes; after a quiet window, {} of the batch was",
            share(Some(quiet))
        ));
    }
    match signals.first_admitted_after_burst_s {
        Some(f) => reasons.push(format!(
            "first admission after the burst: {f:.3} s later ({:.2} of the {w} s hint window)",
            f / w
        )),
        None => {
            // The batch after a quiet window, when it went, rules out a
            // limiter counting refusals; a budget may have left no time.
            let counting = if signals.after_silence_admitted.is_some() {
                ""
            } else {
                ", or the limiter counts refused requests too (a run with room for a quiet \
                 window after the probes, without --probe-seconds or with a longer one, tells)"
            };
            reasons.push(format!(
                "nothing was admitted after the burst: the window is longer than this run, or \
                 the limit does not refill{counting}; try a longer --window and --probe-seconds \
                 (the probe ran {:.1} s after the burst)",
                timeline
                    .requests
                    .iter()
                    .map(|r| r.sent_s - timeline.burst_at_s)
                    .fold(0.0, f64::max)
            ));
            return unknown(signals, reasons);
        }
    }
    reasons.push(format!(
        "batches admitted: {} just before the clock boundary, {} just after it, {} at the end",
        share(signals.boundary_before_admitted),
        share(signals.boundary_after_admitted),
        share(signals.late_batch_admitted)
    ));
    if let Some(k) = signals.fewest_in_flight_at_refusal {
        reasons.push(format!(
            "fewest admitted requests in flight at a 429: {k}{}",
            if k == 0 {
                " (not a concurrency limit)"
            } else {
                ""
            }
        ));
    }

    let seen = models::seen(timeline);
    let burst = u32::try_from(signals.burst_admitted).unwrap_or(u32::MAX);
    let mut fits: Vec<Fit> = DESIGNS
        .iter()
        .map(|&d| models::fit(d, &seen, burst, w, None))
        .collect();
    // When no design around the hint fits every answer and the best token
    // bucket there refills at a rate the probes did not see (a quarter
    // off), the hint is far off: the bucket is fitted again from the refill
    // the probes measured. Not otherwise: a slow endpoint's concurrency
    // limit also admits at a steady rate, and a bucket at that rate would
    // blur a design that fits every answer.
    let best = fits.iter().map(|f| f.mismatches).min().unwrap_or(0);
    let bucket_rate = fits
        .iter()
        .find(|f| f.limiter == Limiter::TokenBucket)
        .and_then(|f| Some(f64::from(f.limit) / f.window_s?));
    let off = match (bucket_rate, signals.probes_admitted_per_s) {
        (Some(fitted), Some(seen_rate)) if seen_rate.is_finite() && seen_rate > 0.0 => {
            (fitted / seen_rate).ln().abs() > 1.25f64.ln()
        }
        _ => false,
    };
    if best > 0 && off {
        for f in fits
            .iter_mut()
            .filter(|f| f.limiter == Limiter::TokenBucket)
        {
            *f = models::fit(
                Limiter::TokenBucket,
                &seen,
                burst,
                w,
                signals.probes_admitted_per_s,
            );
        }
    }
    let best_wrong = fits.iter().map(|f| f.mismatches).min().unwrap_or(0);
    let mut weights: Vec<f64> = fits
        .iter()
        .map(|f| (-NATS_PER_MISMATCH * (f.mismatches - best_wrong) as f64).exp())
        .collect();
    // With a limit of one, a token bucket and every window admit one
    // request per interval alike (nginx `limit_req` without `burst`): the
    // bucket, when it fits best, is named for all of them.
    let bucket = fits.iter().position(|f| {
        f.limiter == Limiter::TokenBucket && f.limit == 1 && f.mismatches == best_wrong
    });
    if let Some(bucket) = bucket {
        let mut merged = false;
        for (i, f) in fits.iter().enumerate() {
            if i != bucket && f.limit == 1 && f.limiter != Limiter::Concurrency {
                weights[bucket] += weights[i];
                weights[i] = 0.0;
                merged = true;
            }
        }
        if merged {
            reasons.push(
                "with a limit of one, a token bucket and a window admit one request per \
                 interval alike: named as the bucket"
                    .to_string(),
            );
        }
    }
    // A log of every request and a window every request pushes back both
    // stay shut under pressure and reopen after a quiet window; nothing
    // short of probing at the window's own length tells them apart, and a
    // client treats them alike. Tied, the log (the more common) is named
    // for both.
    let counting = |design: Limiter| {
        fits.iter()
            .position(|f| f.limiter == design && f.counts_refusals && f.mismatches == best_wrong)
    };
    if let (Some(log), Some(pushed)) = (
        counting(Limiter::SlidingWindow),
        counting(Limiter::FixedWindowAnchored),
    ) {
        weights[log] += weights[pushed];
        weights[pushed] = 0.0;
        reasons.push(
            "a fixed window that every request pushes back (INCR and EXPIRE on every request) \
             would answer the same: both count refused requests"
                .to_string(),
        );
    }
    let total: f64 = weights.iter().sum();
    let mut candidates: Vec<Candidate> = fits
        .iter()
        .zip(&weights)
        .map(|(f, weight)| Candidate {
            limiter: f.limiter,
            probability: round(weight / total, 3),
            mismatches: f.mismatches,
            fit: measured(f),
        })
        .collect();
    candidates.sort_by(|a, b| b.probability.total_cmp(&a.probability));
    let n = seen.len().max(1);
    for c in &candidates {
        reasons.push(format!(
            "{}: {} predicts {} of {n} answers (probability {:.2})",
            c.limiter.name(),
            describe(c.limiter, &c.fit),
            n - c.mismatches.min(n),
            c.probability
        ));
    }
    let best = &candidates[0];
    let wrong_share = best.mismatches as f64 / n as f64;
    let quality = (1.0 - 2.0 * wrong_share).max(0.0);
    let confidence = round((best.probability * quality).min(MAX_CONFIDENCE), 2);
    if wrong_share > MAX_WRONG_SHARE || confidence < NAME_FROM {
        let remaining: Vec<Limiter> = candidates
            .iter()
            .filter(|c| c.probability >= CANDIDATE_FROM)
            .map(|c| c.limiter)
            .collect();
        if wrong_share > MAX_WRONG_SHARE {
            reasons.push(format!(
                "even the best design gets {:.0}% of the answers wrong: none of these is what \
                 the endpoint runs (or other clients share its limit)",
                wrong_share * 100.0
            ));
        }
        reasons.push(format!(
            "no design is clearly ahead; candidates that remain: {}",
            remaining
                .iter()
                .map(|l| l.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        return Inference {
            remaining,
            candidates,
            ..unknown(signals, reasons)
        };
    }
    let m = best.fit.clone();
    reasons.push(format!(
        "measured: {} ({})",
        describe(best.limiter, &m),
        certainty(&m)
    ));
    if let Some(note) = hint_note(best.limiter, &m, timeline) {
        reasons.push(note);
    }
    if m.counts_refusals {
        reasons.push(format!(
            "it counts refused requests too: a client that keeps sending faster than the \
             limit is refused for ever; after a 429, send nothing for a whole window \
             ({:.1} s) before trying again",
            m.window_s.unwrap_or_default()
        ));
    }
    Inference {
        likely_limiter: best.limiter,
        confidence,
        measured: Some(m),
        remaining: Vec::new(),
        signals,
        reasons,
        candidates,
    }
}

/// Says so when the endpoint enforces something else than the hint.
fn hint_note(limiter: Limiter, m: &Measured, timeline: &Timeline) -> Option<String> {
    let hint_limit = f64::from(timeline.limit_hint);
    let hint_window = timeline.window_hint_s;
    let off = |got: f64, hint: f64| hint > 0.0 && ((got - hint) / hint).abs() > HINT_TOLERANCE;
    let hinted = format!("the hint was {} per {hint_window} s", timeline.limit_hint);
    match (limiter, m.window_s) {
        (Limiter::Concurrency, _) => Some(format!(
            "the endpoint limits requests in flight, not a rate: {hinted}, which it does not \
             enforce as such"
        )),
        (_, Some(window)) if off(f64::from(m.limit), hint_limit) || off(window, hint_window) => {
            Some(format!(
                "the endpoint enforces {} ({hinted})",
                describe(limiter, m)
            ))
        }
        _ => None,
    }
}
