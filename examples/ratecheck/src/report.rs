//! The JSON report, and the short summary printed for people.
//!
//! A report holds counts, times and status codes only: never a request body,
//! a header value, URL credentials or a query string (the header *names*
//! sent are listed, and the body's length). Response bodies are never read
//! into it either.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cli::{Config, Mode, header_names};
use crate::inference::{self, Inference};
use crate::probe::{Class, Outcome, Run};
use crate::schedule::{Phase, Plan};
use crate::timeline::Timeline;

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub mode: Mode,
    /// The URL without credentials, query string or fragment.
    pub target: String,
    pub request: RequestShape,
    pub run: RunInfo,
    pub summary: Summary,
    /// Per-phase detail, for the modes that have phases.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode_detail: Option<ModeDetail>,
    pub errors: Errors,
}

/// What was sent, without anything that could be a secret.
#[derive(Clone, Debug, Serialize)]
pub struct RequestShape {
    pub method: String,
    /// Names only, lower case; values are never stored.
    pub header_names: Vec<String>,
    /// The body's length; its content is never stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<usize>,
}

/// The run as planned and as it went.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// RFC 3339, UTC, milliseconds.
    pub started_at: String,
    /// From the start (including any wait for a window boundary) until the
    /// last response.
    pub duration_ms: u64,
    /// The wait before the first request, to line up with a window.
    pub wait_ms: u64,
    pub window_ms: u64,
    /// `--rpm`: the limit probed, in requests per window.
    pub target_rpm: u32,
    pub burst: u32,
    pub concurrency: usize,
    pub planned_requests: usize,
    /// Requests sent per window: n requests sent over the time from the
    /// first to the last is n - 1 intervals. 0 when fewer than two were
    /// sent, or all at one instant (a burst).
    pub actual_rpm: f64,
    /// The admitted (2xx) share of `actual_rpm`.
    pub admitted_rpm: f64,
    /// Stopped early (Ctrl-C); the counts cover what was sent.
    pub interrupted: bool,
}

/// Totals over every request sent.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub actual_requests: u64,
    /// 2xx responses.
    pub success: u64,
    /// Everything else: `refused` plus `other_failure`.
    pub failure: u64,
    /// 429 responses: refusals by the limiter.
    pub refused: u64,
    /// Other statuses and transport failures; not refusals.
    pub other_failure: u64,
    /// Over every request that got a complete response (any status).
    pub latency_ms: Option<Latency>,
}

/// Latency percentiles, in milliseconds (HdrHistogram, 3 significant
/// digits).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Counts for one group of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub sent: u64,
    pub success: u64,
    pub refused: u64,
    pub other_failure: u64,
}

impl Counts {
    fn add(&mut self, o: &Outcome) {
        self.sent += 1;
        self.success += u64::from(o.is_success());
        self.refused += u64::from(o.is_refused());
        self.other_failure += u64::from(o.is_other_failure());
    }
}

/// Probes after a burst, second by second.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeDetail {
    /// Spacing of the probes.
    pub interval_ms: f64,
    /// The refill rate `--rpm` implies.
    pub expected_per_s: f64,
    /// Probes admitted per second over the whole probe span.
    pub admitted_per_s: f64,
    /// Seconds from the burst to the first admitted probe.
    pub first_admitted_s: Option<f64>,
    /// Second `n` holds the probes planned in [n, n+1) s after the burst.
    pub per_second: Vec<Second>,
}

/// One second of probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Second {
    pub second: u64,
    #[serde(flatten)]
    pub counts: Counts,
}

/// The batches either side of a window boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BoundaryDetail {
    /// The boundary, in milliseconds since the Unix epoch.
    pub boundary_unix_ms: u64,
    /// The boundary, in milliseconds from the start of the run.
    pub boundary_at_ms: u64,
    pub offset_ms: u64,
    pub before: Counts,
    pub after: Counts,
}

/// Per-phase detail; each part only where the mode has it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModeDetail {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<Counts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refill_probe: Option<ProbeDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_probe: Option<ProbeDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_boundary: Option<BoundaryDetail>,
    /// Diagnose's batch at the end of the probes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_batch: Option<Counts>,
    /// Diagnose's batch after a quiet window, sent when nothing after the
    /// burst was admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_silence: Option<Counts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference: Option<Inference>,
    /// What diagnose had no time for within `--probe-seconds`, and what
    /// that leaves unseen.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<&'static str>,
    /// Every request of a diagnose run (phase, times, status), so that the
    /// verdict can be checked, or the run judged again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

/// Failures by kind: status codes other than 2xx (429 included), and
/// transport failures. Counts only; never a body or a message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Errors {
    pub status: BTreeMap<String, u64>,
    pub transport: BTreeMap<String, u64>,
}

fn round3(v: f64) -> f64 {
    if v.is_finite() {
        (v * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Latency percentiles over the outcomes that got a response.
pub fn latency(outcomes: &[Outcome], timeout: Duration) -> Option<Latency> {
    let high = u64::try_from((timeout + Duration::from_secs(1)).as_micros())
        .unwrap_or(u64::MAX)
        .max(2);
    let mut hist = Histogram::<u64>::new_with_bounds(1, high, 3).ok()?;
    for o in outcomes {
        if matches!(o.class, Class::Status(_)) {
            let us = u64::try_from(o.latency.as_micros()).unwrap_or(u64::MAX);
            hist.saturating_record(us.max(1));
        }
    }
    if hist.is_empty() {
        return None;
    }
    let at = |q: f64| round3(hist.value_at_quantile(q) as f64 / 1000.0);
    Some(Latency {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: round3(hist.max() as f64 / 1000.0),
    })
}

/// Counts of the outcomes whose planned event is in `phases`.
fn counts_of(plan: &Plan, outcomes: &[Outcome], phases: &[Phase]) -> Counts {
    let mut counts = Counts::default();
    for o in outcomes {
        if plan
            .events
            .get(o.event)
            .is_some_and(|e| phases.contains(&e.phase))
        {
            counts.add(o);
        }
    }
    counts
}

/// Probes of `phase`, second by second after the burst.
fn probe_detail(
    plan: &Plan,
    outcomes: &[Outcome],
    phase: Phase,
    expected_per_s: f64,
) -> Option<ProbeDetail> {
    let t0 = plan.burst_at?;
    let interval = plan.probe_interval?;
    let mut seconds: BTreeMap<u64, Counts> = BTreeMap::new();
    let mut first: Option<f64> = None;
    let mut admitted = 0u64;
    let mut span = Duration::ZERO;
    for e in plan.events.iter().filter(|e| e.phase == phase) {
        span = span.max(e.at.saturating_sub(t0));
        seconds
            .entry(e.at.saturating_sub(t0).as_secs())
            .or_default();
    }
    for o in outcomes {
        let Some(e) = plan.events.get(o.event).filter(|e| e.phase == phase) else {
            continue;
        };
        let rel = e.at.saturating_sub(t0);
        seconds.entry(rel.as_secs()).or_default().add(o);
        if o.is_success() {
            admitted += 1;
            let rel = rel.as_secs_f64();
            first = Some(first.map_or(rel, |f| f.min(rel)));
        }
    }
    let span_s = span.as_secs_f64();
    Some(ProbeDetail {
        interval_ms: round3(interval.as_secs_f64() * 1000.0),
        expected_per_s: round3(expected_per_s),
        admitted_per_s: if span_s > 0.0 {
            round3(admitted as f64 / span_s)
        } else {
            0.0
        },
        first_admitted_s: first.map(round3),
        per_second: seconds
            .into_iter()
            .map(|(second, counts)| Second { second, counts })
            .collect(),
    })
}

fn boundary_detail(plan: &Plan, outcomes: &[Outcome]) -> Option<BoundaryDetail> {
    let b = plan.boundary?;
    Some(BoundaryDetail {
        boundary_unix_ms: ms(b.unix),
        boundary_at_ms: ms(b.at),
        offset_ms: ms(b.offset),
        before: counts_of(plan, outcomes, &[Phase::BoundaryBefore]),
        after: counts_of(plan, outcomes, &[Phase::BoundaryAfter]),
    })
}

fn mode_detail(config: &Config, run: &Run) -> Option<ModeDetail> {
    let (plan, outcomes) = (&run.plan, run.outcomes.as_slice());
    let per_s = f64::from(config.rpm) / config.window.as_secs_f64();
    let burst = || Some(counts_of(plan, outcomes, &[Phase::Burst]));
    let detail = match config.mode {
        Mode::Sustained => return None,
        Mode::Burst => ModeDetail {
            burst: burst(),
            ..ModeDetail::default()
        },
        Mode::TokenBucket => ModeDetail {
            burst: burst(),
            refill_probe: probe_detail(plan, outcomes, Phase::RefillProbe, per_s),
            ..ModeDetail::default()
        },
        Mode::SlidingWindow => ModeDetail {
            burst: burst(),
            sliding_probe: probe_detail(plan, outcomes, Phase::SlidingProbe, per_s),
            ..ModeDetail::default()
        },
        Mode::WindowBoundary => ModeDetail {
            window_boundary: boundary_detail(plan, outcomes),
            ..ModeDetail::default()
        },
        Mode::Diagnose => {
            let start_unix = run
                .started_at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            let timeline = Timeline::of(
                plan,
                outcomes,
                start_unix,
                config.rpm,
                config.window.as_secs_f64(),
            );
            ModeDetail {
                burst: burst(),
                refill_probe: probe_detail(plan, outcomes, Phase::RefillProbe, per_s),
                window_boundary: boundary_detail(plan, outcomes),
                late_batch: plan
                    .events
                    .iter()
                    .any(|e| e.phase == Phase::LateBatch)
                    .then(|| counts_of(plan, outcomes, &[Phase::LateBatch])),
                after_silence: plan
                    .events
                    .iter()
                    .any(|e| e.phase == Phase::AfterSilence)
                    .then(|| counts_of(plan, outcomes, &[Phase::AfterSilence])),
                inference: Some(inference::infer(&timeline, run.interrupted)),
                left_out: plan.left_out.clone(),
                timeline: Some(timeline),
                ..ModeDetail::default()
            }
        }
    };
    Some(detail)
}

fn errors(outcomes: &[Outcome]) -> Errors {
    let mut errors = Errors::default();
    for o in outcomes {
        match o.class {
            Class::Status(s) if (200..300).contains(&s) => {}
            Class::Status(s) => *errors.status.entry(s.to_string()).or_default() += 1,
            Class::Transport(kind) => {
                *errors.transport.entry(kind.name().to_string()).or_default() += 1;
            }
        }
    }
    errors
}

/// Requests sent per second: `n` sends from the first to the last span
/// `n - 1` intervals (dividing `n` by the span, or by the time to the last
/// response, overstates it: 3 requests a second apart are 1/s, not 1.5/s).
/// `None` for fewer than two sends, or sends planned at one instant (a
/// burst has no rate: its sends are microseconds apart only because they
/// cannot all leave at once).
pub fn sent_per_second(plan: &Plan, outcomes: &[Outcome]) -> Option<f64> {
    let planned = |o: &Outcome| plan.events.get(o.event).map(|e| e.at);
    let first_planned = outcomes.iter().filter_map(planned).min()?;
    let last_planned = outcomes.iter().filter_map(planned).max()?;
    if first_planned == last_planned {
        return None;
    }
    let first = outcomes.iter().map(|o| o.sent).min()?;
    let last = outcomes.iter().map(|o| o.sent).max()?;
    let span = (last - first).as_secs_f64();
    (outcomes.len() > 1 && span > 0.0).then(|| (outcomes.len() - 1) as f64 / span)
}

/// The report of `run`, made with `config`.
pub fn build(config: &Config, run: &Run) -> Report {
    let outcomes = run.outcomes.as_slice();
    let all = {
        let mut counts = Counts::default();
        outcomes.iter().for_each(|o| counts.add(o));
        counts
    };
    let wait = run.plan.initial_wait().min(run.elapsed);
    let sent_per_s = sent_per_second(&run.plan, outcomes).unwrap_or(0.0);
    // The share of the sent rate that `n` of the `all.sent` requests are.
    let per_window = |n: u64| {
        let share = if all.sent == 0 {
            0.0
        } else {
            n as f64 / all.sent as f64
        };
        round3(sent_per_s * share * config.window.as_secs_f64())
    };
    Report {
        mode: config.mode,
        target: config.target.clone(),
        request: RequestShape {
            method: config.method.as_str().to_owned(),
            header_names: header_names(&config.headers),
            body_bytes: config.body.as_ref().map(|b| b.0.len()),
        },
        run: RunInfo {
            started_at: humantime::format_rfc3339_millis(run.started_at).to_string(),
            duration_ms: ms(run.elapsed),
            wait_ms: ms(wait),
            window_ms: ms(config.window),
            target_rpm: config.rpm,
            burst: config.burst,
            concurrency: config.concurrency,
            planned_requests: run.plan.events.len(),
            actual_rpm: per_window(all.sent),
            admitted_rpm: per_window(all.success),
            interrupted: run.interrupted,
        },
        summary: Summary {
            actual_requests: all.sent,
            success: all.success,
            failure: all.refused + all.other_failure,
            refused: all.refused,
            other_failure: all.other_failure,
            latency_ms: latency(outcomes, config.timeout),
        },
        mode_detail: mode_detail(config, run),
        errors: errors(outcomes),
    }
}

fn share(c: &Counts) -> String {
    format!("{}/{} admitted", c.success, c.sent)
}

/// A few lines for people; no secrets either.
pub fn summary_text(report: &Report) -> String {
    let mut out = String::new();
    let r = &report.run;
    let s = &report.summary;
    let burst = if report.mode == Mode::Sustained {
        String::new()
    } else {
        format!(", burst {}", r.burst)
    };
    let _ = writeln!(
        out,
        "ratecheck {}: {} {} ({} per {} window{burst})",
        report.mode.name(),
        report.request.method,
        report.target,
        r.target_rpm,
        humantime::format_duration(Duration::from_millis(r.window_ms)),
    );
    let _ = writeln!(
        out,
        "  {} requests in {:.1} s{}: {} admitted (2xx), {} refused (429), {} other failures",
        s.actual_requests,
        r.duration_ms as f64 / 1000.0,
        if r.interrupted { " (interrupted)" } else { "" },
        s.success,
        s.refused,
        s.other_failure
    );
    if report.mode == Mode::Sustained {
        let _ = writeln!(
            out,
            "  rate: {} sent and {} admitted per window",
            r.actual_rpm, r.admitted_rpm
        );
    }
    if let Some(l) = &s.latency_ms {
        let _ = writeln!(
            out,
            "  latency: p50 {} ms, p95 {} ms, p99 {} ms, max {} ms",
            l.p50, l.p95, l.p99, l.max
        );
    }
    if let Some(d) = &report.mode_detail {
        if let Some(b) = &d.burst {
            // Diagnose sends more than the burst it was told to expect; say
            // so where the larger number shows, or it reads as a mistake.
            let why = if report.mode == Mode::Diagnose {
                format!(
                    " (the expected burst of {} and half as many again, at least 2 more: \
                     1.5x, so that the limit's edge shows as 429s)",
                    r.burst
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  burst: {} sent{why}, {}, {} refused",
                b.sent,
                share(b),
                b.refused
            );
        }
        for (name, p) in [
            ("refill probes", &d.refill_probe),
            ("sliding probes", &d.sliding_probe),
        ] {
            if let Some(p) = p {
                let first = p
                    .first_admitted_s
                    .map_or_else(|| "never".to_string(), |t| format!("{t} s"));
                let _ = writeln!(
                    out,
                    "  {name}: {} admitted/s (expected {}), first admitted after {first}",
                    p.admitted_per_s, p.expected_per_s
                );
            }
        }
        if let Some(b) = &d.window_boundary {
            let _ = writeln!(
                out,
                "  window boundary ±{} ms: before {}, after {}",
                b.offset_ms,
                share(&b.before),
                share(&b.after)
            );
        }
        if let Some(b) = &d.late_batch {
            let _ = writeln!(out, "  batch at the end: {}", share(b));
        }
        if let Some(b) = &d.after_silence {
            let _ = writeln!(out, "  batch after a quiet window: {}", share(b));
        }
        for part in &d.left_out {
            let _ = writeln!(out, "  no time within --probe-seconds for {part}");
        }
        if let Some(i) = &d.inference {
            let _ = writeln!(
                out,
                "  likely limiter: {} (confidence {})",
                i.likely_limiter.name(),
                i.confidence
            );
            if let Some(m) = &i.measured {
                let _ = writeln!(
                    out,
                    "  enforces: {} ({})",
                    inference::describe(i.likely_limiter, m),
                    inference::certainty(m)
                );
            }
            for reason in &i.reasons {
                let _ = writeln!(out, "    - {reason}");
            }
        }
    }
    if !report.errors.status.is_empty() || !report.errors.transport.is_empty() {
        let listed: Vec<String> = report
            .errors
            .status
            .iter()
            .chain(report.errors.transport.iter())
            .map(|(k, n)| format!("{k} x{n}"))
            .collect();
        let _ = writeln!(out, "  errors: {}", listed.join(", "));
    }
    out
}
