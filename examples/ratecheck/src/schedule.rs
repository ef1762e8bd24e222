//! When each request goes: pure functions of the configuration and the
//! current wall-clock time, so every schedule is tested without a network.
//!
//! Times are offsets from the start of the run. Arithmetic is done in integer
//! nanoseconds (`i * window / rpm`), so long schedules do not drift.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cli::{Config, Mode};

/// The most requests one run may plan; more is almost surely a unit mistake.
pub const MAX_REQUESTS: u64 = 1_000_000;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// What a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One of a steady stream.
    Sustained,
    /// One of the burst at t = 0 (or at the burst instant of diagnose).
    Burst,
    /// A probe at the expected refill rate after the burst.
    RefillProbe,
    /// A once-a-second probe after the burst.
    SlidingProbe,
    /// The batch just before a window boundary.
    BoundaryBefore,
    /// The batch just after it.
    BoundaryAfter,
    /// Diagnose's last batch, after the probes: it tells a sliding log
    /// (a few slots free) from a window anchored at a request (all free).
    LateBatch,
    /// Sent only when nothing after the burst was admitted: a batch after
    /// a window of silence. A limiter that reopens after silence but never
    /// under the probes' pressure counts refused requests too.
    AfterSilence,
    /// Two single requests after that batch, half a window and one and a
    /// half windows later: a limiter counting every request admits the
    /// second, one whose window is longer than the run does not.
    QuietProbe,
}

/// One planned request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// When to send it, from the start of the run.
    pub at: Duration,
    pub phase: Phase,
}

/// The window boundary a plan straddles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Boundary {
    /// When it falls, from the start of the run.
    pub at: Duration,
    /// When it falls, from the Unix epoch.
    pub unix: Duration,
    /// How far before and after it the batches go.
    pub offset: Duration,
}

/// Every request of a run, in the order they go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Sorted by `at`.
    pub events: Vec<Event>,
    /// When the burst goes, if there is one: probes are timed from it.
    pub burst_at: Option<Duration>,
    /// The boundary the batches straddle, if any.
    pub boundary: Option<Boundary>,
    /// The spacing of refill probes, if any.
    pub probe_interval: Option<Duration>,
    /// What a budgeted diagnose run had no time for, and what that leaves
    /// unseen (for the report).
    pub left_out: Vec<&'static str>,
    /// Diagnose's batch after silence, if the answers call for it.
    pub silence: Option<Silence>,
}

/// Diagnose's batch after a window of silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Silence {
    /// How long after the last planned request it goes.
    pub after: Duration,
    /// The window hint, and the offset (for the probes after the batch).
    pub window: Duration,
    pub offset: Duration,
    /// How many requests.
    pub count: u32,
    /// The run's budget: not sent if it would go later.
    pub latest: Option<Duration>,
}

impl Plan {
    /// How long the run waits before its first request (to line up with a
    /// window boundary).
    pub fn initial_wait(&self) -> Duration {
        self.events.first().map_or(Duration::ZERO, |e| e.at)
    }

    /// When the last request goes.
    pub fn last_at(&self) -> Duration {
        self.events.last().map_or(Duration::ZERO, |e| e.at)
    }

    /// The batch after silence, given whether each planned request was
    /// admitted (`None`: no answer, or another status) and when the last
    /// was sent: sent when the
    /// burst admitted some and nothing after it was admitted, which the
    /// probes at twice the rate cannot tell from a window longer than the
    /// run. Empty otherwise.
    pub fn after_silence(
        &self,
        admitted: impl Fn(usize) -> Option<bool>,
        last_sent: Duration,
    ) -> Vec<Event> {
        let Some(silence) = self.silence else {
            return Vec::new();
        };
        let answers = |later: bool| {
            self.events
                .iter()
                .enumerate()
                .filter(move |(_, e)| (e.phase != Phase::Burst) == later)
                .filter_map(|(i, _)| admitted(i))
        };
        let burst_admitted = answers(false).any(|ok| ok);
        let answered_after = answers(true).next().is_some();
        let none_after = answers(true).all(|ok| !ok);
        // From the last request as it went (a busy run sends late).
        let at = self.last_at().max(last_sent) + silence.after;
        if !(burst_admitted && answered_after && none_after)
            || silence.latest.is_some_and(|latest| at > latest)
        {
            return Vec::new();
        }
        let mut events = Vec::new();
        push(&mut events, at, Phase::AfterSilence, silence.count);
        // Half a window after the batch (refused by every design), then a
        // window after that one: a limiter that counts every request has
        // let both go by then, one with a window longer than the run has
        // not.
        let half = silence.window / 2;
        let later = half + silence.window + silence.offset;
        for probe in [at + half, at + later] {
            if silence.latest.is_none_or(|latest| probe <= latest) {
                push(&mut events, probe, Phase::QuietProbe, 1);
            }
        }
        events
    }
}

/// What a schedule needs from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub mode: Mode,
    pub rpm: u32,
    pub burst: u32,
    pub window: Duration,
    pub duration: Duration,
    pub probe: Duration,
    pub offset: Duration,
    /// Diagnose with `--probe-seconds`: the whole run, its wait for the
    /// middle of a window included, stays within this.
    pub budget: Option<Duration>,
}

impl Params {
    pub fn of(config: &Config) -> Params {
        Params {
            mode: config.mode,
            rpm: config.rpm,
            burst: config.burst,
            window: config.window,
            duration: config.duration,
            probe: config.probe,
            offset: config.offset,
            budget: config.budget,
        }
    }
}

/// A plan would send more than [`MAX_REQUESTS`].
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyRequests(pub u128);

impl fmt::Display for TooManyRequests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this run would send {} requests, more than the {MAX_REQUESTS} allowed; \
             lower --rpm, --burst, --duration or --probe-seconds",
            self.0
        )
    }
}

impl std::error::Error for TooManyRequests {}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

fn from_nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Start times of a sustained run: one every `window / rpm`, from 0, while
/// earlier than `duration`.
pub fn sustained(rpm: u32, window: Duration, duration: Duration) -> Vec<Duration> {
    let (w, n) = (nanos(window), u128::from(rpm));
    // i * w / n < d  <=>  i * w < d * n  <=>  i < ceil(d * n / w)
    let count = sustained_count(rpm, window, duration);
    (0..count).map(|i| from_nanos(i * w / n)).collect()
}

fn sustained_count(rpm: u32, window: Duration, duration: Duration) -> u128 {
    let (w, n, d) = (nanos(window), u128::from(rpm), nanos(duration));
    (d * n).div_ceil(w.max(1))
}

/// The spacing of refill probes: the expected refill interval `window / rpm`,
/// but at least one probe per second.
pub fn probe_interval(rpm: u32, window: Duration) -> Duration {
    let (w, n) = (nanos(window), u128::from(rpm));
    if w <= n * NANOS_PER_SEC {
        from_nanos(w / n)
    } else {
        Duration::from_secs(1)
    }
}

/// Times of refill probes after a burst at 0: at the refill interval (at
/// least one per second), from one interval after the burst up to `span`.
pub fn refill_probes(rpm: u32, window: Duration, span: Duration) -> Vec<Duration> {
    let (w, n) = (nanos(window), u128::from(rpm));
    let count = refill_count(rpm, window, span);
    if w <= n * NANOS_PER_SEC {
        (1..=count).map(|i| from_nanos(i * w / n)).collect()
    } else {
        (1..=count).map(|i| from_nanos(i * NANOS_PER_SEC)).collect()
    }
}

fn refill_count(rpm: u32, window: Duration, span: Duration) -> u128 {
    let (w, n, s) = (nanos(window), u128::from(rpm), nanos(span));
    if w <= n * NANOS_PER_SEC {
        s * n / w.max(1)
    } else {
        s / NANOS_PER_SEC
    }
}

/// The spacing of diagnose's probes: twice the expected rate
/// (`window / (2 × rpm)`), and at least twenty a window, so that a window's
/// reopening is timed to a twentieth of it whatever the limit.
pub fn diagnose_probe_interval(rpm: u32, window: Duration) -> Duration {
    from_nanos(diagnose_probe_nanos(rpm, window))
}

fn diagnose_probe_nanos(rpm: u32, window: Duration) -> u128 {
    let w = nanos(window);
    // At least 1 ns, so that counting probes never divides by zero.
    (w / (2 * u128::from(rpm).max(1))).min(w / 20).max(1)
}

/// Times of diagnose's probes after a burst at 0: one every
/// [`diagnose_probe_interval`] `q`, at `q/2`, `3q/2`, ... up to `span`.
/// Half an interval off the multiples of `q`: a limiter timed from the
/// burst (a token's refill, a window's end) changes its answer at a multiple
/// of `q` when the hint is right, and a probe sent right then would be
/// admitted or not by a millisecond of jitter.
pub fn diagnose_probes(rpm: u32, window: Duration, span: Duration) -> Vec<Duration> {
    let q = diagnose_probe_nanos(rpm, window);
    let count = diagnose_probe_count(rpm, window, span);
    (1..=count).map(|i| from_nanos(i * q - q / 2)).collect()
}

fn diagnose_probe_count(rpm: u32, window: Duration, span: Duration) -> u128 {
    nanos(span) / diagnose_probe_nanos(rpm, window)
}

/// Times of once-a-second probes after a burst at 0, up to `span`.
pub fn sliding_probes(span: Duration) -> Vec<Duration> {
    (1..=span.as_secs()).map(Duration::from_secs).collect()
}

/// How long from `now_unix` until the next window boundary (a multiple of
/// `window` since the Unix epoch), strictly in the future.
pub fn until_boundary(now_unix: Duration, window: Duration) -> Duration {
    let w = nanos(window).max(1);
    from_nanos(w - nanos(now_unix) % w)
}

/// How long from `now_unix` until the instant halfway through a window (the
/// next boundary is then half a window away). Zero if that is now.
pub fn until_mid_window(now_unix: Duration, window: Duration) -> Duration {
    let w = nanos(window).max(1);
    let into = nanos(now_unix) % w;
    from_nanos((w / 2 + w - into) % w)
}

fn push(events: &mut Vec<Event>, at: Duration, phase: Phase, count: u32) {
    events.extend((0..count).map(|_| Event { at, phase }));
}

/// One `phase` request at each of `times`: how every mode adds its probes.
fn push_each(events: &mut Vec<Event>, times: impl IntoIterator<Item = Duration>, phase: Phase) {
    events.extend(times.into_iter().map(|at| Event { at, phase }));
}

/// When diagnose's last batch goes after its burst: a quarter window
/// after the probes (at least the window offset).
pub fn late_batch_after(probe: Duration, window: Duration, offset: Duration) -> Duration {
    probe + (window / 4).max(offset)
}

/// Where diagnose's parts go, from the start of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Diagnose {
    burst: Duration,
    /// How long the probes go on after the burst.
    probes: Duration,
    /// The clock boundary the batches straddle, if there is time for it.
    boundary: Option<Duration>,
    /// The last batch, if there is time for it.
    late: Option<Duration>,
    left_out: Vec<&'static str>,
}

impl Diagnose {
    /// The whole design: the burst halfway through a clock window, probes
    /// for `probe`, the boundary half a window after the burst, the last
    /// batch a quarter window after the probes.
    fn full(now_unix: Duration, window: Duration, probe: Duration, offset: Duration) -> Self {
        let burst = until_mid_window(now_unix, window);
        Self {
            burst,
            probes: probe,
            boundary: Some(burst + window / 2),
            late: Some(burst + late_batch_after(probe, window, offset)),
            left_out: Vec::new(),
        }
    }

    /// As much of the design as fits in `budget`, the last request at
    /// `budget` at the latest: the wait for the middle of a window only
    /// when a window of probes and the last batch still fit after it, the
    /// boundary batches at the next clock boundary that fits, the last
    /// batch when a window of probes fits before it.
    fn within(now_unix: Duration, window: Duration, offset: Duration, budget: Duration) -> Self {
        let gap = (window / 4).max(offset);
        let mid = until_mid_window(now_unix, window);
        let burst = if mid + window + gap <= budget {
            mid
        } else {
            Duration::ZERO
        };
        let left = budget - burst;
        let mut left_out = Vec::new();
        let (probes, late) = if left >= window + gap {
            (left - gap, Some(budget))
        } else {
            left_out.push(
                "the last batch (a sliding log and a window anchored at a request look alike)",
            );
            (left, None)
        };
        // The first clock boundary after the burst with room before it
        // for the batch that goes just before.
        let mut boundary = burst + until_boundary(now_unix + burst, window);
        if boundary < burst + offset.saturating_mul(2) {
            boundary += window;
        }
        let boundary = if boundary + offset <= budget {
            Some(boundary)
        } else {
            left_out.push(
                "a clock boundary (a fixed window aligned to the clock and one anchored at a \
                 request look alike)",
            );
            None
        };
        if probes < window.saturating_mul(2) {
            left_out.push(
                "two windows of probes (a window's reopening after a full window of probes is \
                 not seen)",
            );
        }
        Self {
            burst,
            probes,
            boundary,
            late,
            left_out,
        }
    }
}

/// How many requests diagnose sends in its burst: half as many again as
/// `--burst`, so that the limit's edge shows as 429s.
pub fn diagnose_burst(burst: u32) -> u32 {
    burst.saturating_add((burst / 2).max(2))
}

/// How many requests the plan for `params` sends, counted without making
/// it (the count does not depend on the time).
pub fn planned_requests(params: &Params) -> u128 {
    let burst = u128::from(params.burst);
    match params.mode {
        Mode::Sustained => sustained_count(params.rpm, params.window, params.duration),
        Mode::Burst => burst,
        Mode::TokenBucket => burst + refill_count(params.rpm, params.window, params.probe),
        Mode::SlidingWindow => burst + u128::from(params.probe.as_secs()),
        Mode::WindowBoundary => 2 * burst,
        Mode::Diagnose => {
            // With a budget, at most the budget is probed.
            let span = params.budget.unwrap_or(params.probe);
            u128::from(diagnose_burst(params.burst))
                + 3 * burst
                + diagnose_probe_count(params.rpm, params.window, span)
        }
    }
}

/// The plan for `params`, made at wall-clock time `now_unix` (since the Unix
/// epoch), which places window boundaries.
pub fn plan(params: &Params, now_unix: Duration) -> Result<Plan, TooManyRequests> {
    let Params {
        mode,
        rpm,
        burst,
        window,
        duration,
        probe,
        offset,
        budget,
    } = *params;
    let count = planned_requests(params);
    if count > u128::from(MAX_REQUESTS) {
        return Err(TooManyRequests(count));
    }
    let mut events = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    let mut burst_at = None;
    let mut boundary = None;
    let mut probe_every = None;
    let mut left_out = Vec::new();
    let mut silence = None;
    match mode {
        Mode::Sustained => {
            push_each(
                &mut events,
                sustained(rpm, window, duration),
                Phase::Sustained,
            );
        }
        Mode::Burst => {
            push(&mut events, Duration::ZERO, Phase::Burst, burst);
            burst_at = Some(Duration::ZERO);
        }
        Mode::TokenBucket => {
            push(&mut events, Duration::ZERO, Phase::Burst, burst);
            push_each(
                &mut events,
                refill_probes(rpm, window, probe),
                Phase::RefillProbe,
            );
            burst_at = Some(Duration::ZERO);
            probe_every = Some(probe_interval(rpm, window));
        }
        Mode::SlidingWindow => {
            push(&mut events, Duration::ZERO, Phase::Burst, burst);
            push_each(&mut events, sliding_probes(probe), Phase::SlidingProbe);
            burst_at = Some(Duration::ZERO);
            probe_every = Some(Duration::from_secs(1));
        }
        Mode::WindowBoundary => {
            let mut until = until_boundary(now_unix, window);
            if until < offset {
                until += window;
            }
            push(&mut events, until - offset, Phase::BoundaryBefore, burst);
            push(&mut events, until + offset, Phase::BoundaryAfter, burst);
            boundary = Some(Boundary {
                at: until,
                unix: now_unix + until,
                offset,
            });
        }
        Mode::Diagnose => {
            // The burst goes halfway through a window, so that a window
            // aligned to the clock resets half a window later, and one
            // counted from the burst (a sliding log, an anchored fixed
            // window) a whole window later. Probes at twice the expected
            // rate follow for --probe-seconds (two windows by default), so
            // that the window is read to a twentieth; one batch straddles
            // the clock boundary and one goes a quarter window after the
            // probes, when a sliding log has freed only the slots of the
            // probes it admitted in the quarter window after it reopened
            // (about half its limit) and an anchored window has freed all
            // of them: a gap of half the limit that stretching the window
            // a little cannot hide.
            let big = diagnose_burst(burst);
            let shape = match budget {
                None => Diagnose::full(now_unix, window, probe, offset),
                Some(budget) => Diagnose::within(now_unix, window, offset, budget),
            };
            let t0 = shape.burst;
            push(&mut events, t0, Phase::Burst, big);
            let probes = diagnose_probes(rpm, window, shape.probes);
            push_each(
                &mut events,
                probes.into_iter().map(|at| t0 + at),
                Phase::RefillProbe,
            );
            if let Some(at) = shape.boundary {
                push(&mut events, at - offset, Phase::BoundaryBefore, burst);
                push(&mut events, at + offset, Phase::BoundaryAfter, burst);
                boundary = Some(Boundary {
                    at,
                    unix: now_unix + at,
                    offset,
                });
            }
            if let Some(at) = shape.late {
                push(&mut events, at, Phase::LateBatch, burst);
            }
            burst_at = Some(t0);
            probe_every = Some(diagnose_probe_interval(rpm, window));
            left_out = shape.left_out;
            // A window and the offset after the last request: a window
            // that counts every request has let them all go by then.
            silence = Some(Silence {
                after: window + offset,
                window,
                offset,
                count: burst,
                latest: budget,
            });
        }
    }
    // Stable: at equal times the order of pushing is kept.
    events.sort_by_key(|e| e.at);
    Ok(Plan {
        events,
        burst_at,
        boundary,
        probe_interval: probe_every,
        left_out,
        silence,
    })
}
