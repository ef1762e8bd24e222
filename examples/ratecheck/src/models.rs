//! The limiter designs diagnose knows, each as a small simulation that
//! replays a run's requests at the instants they were sent and predicts
//! which were admitted; and the fit that finds, for each design, the limit
//! and window that predict the run best.
//!
//! Written here rather than taken from a crate: the point is a plain,
//! literal model of each design as deployed (a Redis `INCR` + `EXPIRE`
//! counter, Cloudflare's weighted counter), not an efficient limiter.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::Serialize;

use crate::schedule::Phase;
use crate::timeline::Timeline;

/// A limiter design.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limiter {
    /// Token bucket, GCRA, or a leaky bucket that refuses (nginx
    /// `limit_req ... nodelay`): a burst, then a steady refill.
    TokenBucket,
    /// Counter reset at multiples of the window on the clock.
    FixedWindow,
    /// Counter that starts with the first request after the last window
    /// ended (`INCR` + `EXPIRE`).
    FixedWindowAnchored,
    /// Exact sliding window: at most the limit in any rolling window (a log
    /// of admissions).
    SlidingWindow,
    /// The current clock-aligned window's count plus the previous one's,
    /// weighted by the part of it still inside the rolling window.
    SlidingWindowCounter,
    /// Refuses while the limit's number of requests is in flight.
    Concurrency,
    /// None of them, or more than one, fits.
    Unknown,
}

/// Every design a run is fitted against.
pub const DESIGNS: [Limiter; 6] = [
    Limiter::TokenBucket,
    Limiter::FixedWindow,
    Limiter::FixedWindowAnchored,
    Limiter::SlidingWindow,
    Limiter::SlidingWindowCounter,
    Limiter::Concurrency,
];

impl Limiter {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Limiter::TokenBucket => "token_bucket",
            Limiter::FixedWindow => "fixed_window",
            Limiter::FixedWindowAnchored => "fixed_window_anchored",
            Limiter::SlidingWindow => "sliding_window",
            Limiter::SlidingWindowCounter => "sliding_window_counter",
            Limiter::Concurrency => "concurrency",
            Limiter::Unknown => "unknown",
        }
    }

    /// Whether its windows fall on multiples of the window since the epoch:
    /// only such windows are tried for it.
    fn clock_aligned(self) -> bool {
        matches!(self, Limiter::FixedWindow | Limiter::SlidingWindowCounter)
    }
}

/// A request as a simulation sees it.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// When it reached the limiter, seconds from the start of the run.
    pub t: f64,
    /// The same, in seconds since the Unix epoch.
    pub unix: f64,
    /// When the endpoint finished with it (its answer's end less the way
    /// back), seconds from the start.
    pub end: f64,
    /// When it reached the limiter as a concurrency limit sees it: an
    /// admitted probe's end less the fastest admitted answer, a refused
    /// one's end less the way back; a batch's requests, like `t`, all at
    /// once. Slow answers vary by more than the network's delay, and what
    /// counts for a concurrency limit is how many ended before this one
    /// arrived.
    pub arrived: f64,
    pub admitted: bool,
}

/// The requests that were admitted or refused, in the order they reached
/// the limiter. Others (another status, no answer) are left out: whether
/// the limiter saw them is not known.
///
/// A request reaches the limiter some time after it was sent: half the
/// fastest answer of the run is taken as that one-way delay. Replaying at
/// the sending instants instead would put every request a little early,
/// and a design whose windows open exactly when a probe is sent would be
/// found to refuse what it admitted.
pub fn seen(timeline: &Timeline) -> Vec<Seen> {
    let one_way = timeline
        .requests
        .iter()
        .filter(|r| r.admitted().is_some())
        .map(|r| r.latency_s.max(0.0))
        .fold(f64::INFINITY, f64::min)
        / 2.0;
    let one_way = if one_way.is_finite() { one_way } else { 0.0 };
    let fastest_admitted = timeline
        .requests
        .iter()
        .filter(|r| r.admitted() == Some(true))
        .map(|r| r.latency_s.max(0.0))
        .fold(f64::INFINITY, f64::min);
    // A batch is sent at one instant, but leaves over a few milliseconds
    // on many connections and reaches the limiter in any order: all its
    // requests, and any probe that left while it was leaving or as long
    // again after (plus a millisecond), are taken to arrive when the first
    // was sent.
    let span = |phase: Phase| {
        let sent = timeline
            .requests
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.sent_s);
        let first = sent.clone().fold(f64::INFINITY, f64::min);
        let last = sent.fold(f64::NEG_INFINITY, f64::max);
        (first, last + (last - first) + 0.001)
    };
    let batches: Vec<(f64, f64)> = [
        Phase::Burst,
        Phase::BoundaryBefore,
        Phase::BoundaryAfter,
        Phase::LateBatch,
        Phase::AfterSilence,
    ]
    .into_iter()
    .map(span)
    .filter(|(first, last)| first <= last)
    .collect();
    let mut seen: Vec<Seen> = timeline
        .requests
        .iter()
        .filter_map(|r| {
            let admitted = r.admitted()?;
            let batch = batches
                .iter()
                .find(|(first, last)| (*first..=*last).contains(&r.sent_s));
            let sent = batch.map_or(r.sent_s, |&(first, _)| first);
            let t = sent.max(0.0) + one_way;
            // When the endpoint finished with it: its answer then still
            // had the way back to go.
            let end = (r.sent_s.max(0.0) + r.latency_s.max(0.0) - one_way).max(t);
            let in_batch = batch.is_some();
            let arrived = if in_batch {
                t
            } else if admitted {
                (end - fastest_admitted + 2.0 * one_way).max(t)
            } else {
                end
            };
            Some(Seen {
                t,
                unix: timeline.start_unix_s + t,
                end,
                arrived,
                admitted,
            })
        })
        .collect();
    // Which requests of a batch were admitted says nothing, only how many:
    // those admitted are put first, as if they had come first.
    seen.sort_by(|a, b| a.t.total_cmp(&b.t).then(b.admitted.cmp(&a.admitted)));
    seen
}

/// Room for float rounding in comparisons.
const EPS: f64 = 1e-9;

/// One design with one limit and window, replaying requests one by one.
enum Sim {
    TokenBucket {
        capacity: f64,
        rate: f64,
        tokens: f64,
        last: Option<f64>,
    },
    FixedWindow {
        limit: u32,
        window: f64,
        index: Option<i64>,
        count: u32,
    },
    Anchored {
        limit: u32,
        window: f64,
        anchor: Option<f64>,
        count: u32,
        /// Every request, refused or not, pushes the window's end back
        /// (`INCR` then `EXPIRE` on every request).
        counts_refusals: bool,
    },
    Log {
        limit: usize,
        window: f64,
        admitted: VecDeque<f64>,
        /// Refused requests are logged too.
        counts_refusals: bool,
    },
    Counter {
        limit: f64,
        window: f64,
        index: Option<i64>,
        previous: f64,
        current: f64,
        /// Refused requests are counted too.
        counts_refusals: bool,
    },
    Concurrency {
        limit: usize,
        /// Ends of the admitted requests in flight, in microseconds.
        in_flight: BinaryHeap<Reverse<u64>>,
    },
}

impl Sim {
    fn new(design: Limiter, limit: u32, window: f64, counts_refusals: bool) -> Sim {
        match design {
            Limiter::TokenBucket => Sim::TokenBucket {
                capacity: f64::from(limit),
                rate: f64::from(limit) / window,
                tokens: f64::from(limit),
                last: None,
            },
            Limiter::FixedWindow => Sim::FixedWindow {
                limit,
                window,
                index: None,
                count: 0,
            },
            Limiter::FixedWindowAnchored => Sim::Anchored {
                limit,
                window,
                anchor: None,
                count: 0,
                counts_refusals,
            },
            Limiter::SlidingWindowCounter => Sim::Counter {
                limit: f64::from(limit),
                window,
                index: None,
                previous: 0.0,
                current: 0.0,
                counts_refusals,
            },
            Limiter::Concurrency => Sim::Concurrency {
                limit: limit as usize,
                in_flight: BinaryHeap::new(),
            },
            Limiter::SlidingWindow | Limiter::Unknown => Sim::Log {
                limit: limit as usize,
                window,
                admitted: VecDeque::new(),
                counts_refusals,
            },
        }
    }

    /// Whether the design admits `r`; records it if so.
    fn admit(&mut self, r: &Seen) -> bool {
        match self {
            Sim::TokenBucket {
                capacity,
                rate,
                tokens,
                last,
            } => {
                if let Some(last) = *last {
                    *tokens = (*tokens + (r.t - last).max(0.0) * *rate).min(*capacity);
                }
                *last = Some(r.t);
                let ok = *tokens >= 1.0 - EPS;
                if ok {
                    *tokens -= 1.0;
                }
                ok
            }
            Sim::FixedWindow {
                limit,
                window,
                index,
                count,
            } => {
                let now = (r.unix / *window).floor() as i64;
                if *index != Some(now) {
                    *index = Some(now);
                    *count = 0;
                }
                let ok = *count < *limit;
                *count += u32::from(ok);
                ok
            }
            Sim::Anchored {
                limit,
                window,
                anchor,
                count,
                counts_refusals,
            } => {
                // Counting refused requests changes nothing while the
                // window ends at a time its first request set; a window
                // every request pushes back never ends under pressure.
                if anchor.is_none_or(|a| r.t >= a + *window - EPS) {
                    *count = 0;
                    *anchor = Some(r.t);
                }
                if *counts_refusals {
                    *anchor = Some(r.t);
                }
                let ok = *count < *limit;
                *count += u32::from(ok);
                ok
            }
            Sim::Log {
                limit,
                window,
                admitted,
                counts_refusals,
            } => {
                while admitted.front().is_some_and(|&a| a + *window <= r.t + EPS) {
                    admitted.pop_front();
                }
                let ok = admitted.len() < *limit;
                if ok || *counts_refusals {
                    admitted.push_back(r.t);
                }
                ok
            }
            Sim::Counter {
                limit,
                window,
                index,
                previous,
                current,
                counts_refusals,
            } => {
                let now = (r.unix / *window).floor() as i64;
                if *index != Some(now) {
                    *previous = if index.is_some_and(|i| i + 1 == now) {
                        *current
                    } else {
                        0.0
                    };
                    *current = 0.0;
                    *index = Some(now);
                }
                let into = (r.unix - now as f64 * *window) / *window;
                let estimate = *previous * (1.0 - into).clamp(0.0, 1.0) + *current;
                // Admitted while the estimate is under the limit, as
                // Cloudflare and Upstash describe theirs.
                let ok = estimate + EPS < *limit;
                if ok || *counts_refusals {
                    *current += 1.0;
                }
                ok
            }
            Sim::Concurrency { limit, in_flight } => {
                let now = (r.arrived * 1e6) as u64;
                while in_flight.peek().is_some_and(|Reverse(end)| *end <= now) {
                    in_flight.pop();
                }
                let ok = in_flight.len() < *limit;
                if ok {
                    in_flight.push(Reverse((r.end * 1e6) as u64));
                }
                ok
            }
        }
    }
}

/// How many of `seen` the design gets wrong, or `None` once more than
/// `give_up` are wrong (the fit only wants the best).
fn mismatches(
    design: Limiter,
    (limit, window, counts_refusals): (u32, f64, bool),
    seen: &[Seen],
    give_up: usize,
) -> Option<usize> {
    let mut sim = Sim::new(design, limit, window, counts_refusals);
    let mut wrong = 0;
    for r in seen {
        if sim.admit(r) != r.admitted {
            wrong += 1;
            if wrong > give_up {
                return None;
            }
        }
    }
    Some(wrong)
}

/// The best a design does on a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub limiter: Limiter,
    /// Requests whose answer it predicts wrongly, at best.
    pub mismatches: usize,
    /// The limit (for a token bucket, its burst; for a concurrency limit,
    /// the requests in flight) of the best fit.
    pub limit: u32,
    /// Every limit that fits as well.
    pub limit_range: (u32, u32),
    /// The window in seconds (for a token bucket: the time to refill the
    /// burst); none for a concurrency limit.
    pub window_s: Option<f64>,
    /// Every window that fits as well (of those tried).
    pub window_range_s: Option<(f64, f64)>,
    /// Refused requests count against the limit too (or, for a window
    /// anchored at a request, push its end back): a client that keeps
    /// sending faster than the limit is refused for ever.
    pub counts_refusals: bool,
}

/// Whether a design can count refused requests in a way the answers show.
/// A fixed window aligned to the clock cannot: once its limit is reached
/// it refuses until its end either way.
fn may_count_refusals(design: Limiter) -> bool {
    matches!(
        design,
        Limiter::FixedWindowAnchored | Limiter::SlidingWindow | Limiter::SlidingWindowCounter
    )
}

/// Windows tried for designs whose windows may start anywhere: a quarter of
/// the hint to four times it, 1% apart.
fn free_windows(hint: f64) -> Vec<f64> {
    (-139..=139).map(|i| hint * 1.01f64.powi(i)).collect()
}

/// Windows tried for clock-aligned designs: boundaries fall on multiples of
/// the window, so only windows that are simple fractions or multiples of
/// the hint, or round lengths, can line up with what was seen.
fn aligned_windows(hint: f64) -> Vec<f64> {
    const ROUND: [f64; 14] = [
        0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 3600.0,
    ];
    let mut all: Vec<f64> = (1..=4u32)
        .flat_map(|k| [hint * f64::from(k), hint / f64::from(k)])
        .chain(
            ROUND
                .iter()
                .copied()
                .filter(|w| (hint / 4.5..=hint * 4.5).contains(w)),
        )
        .collect();
    all.sort_by(f64::total_cmp);
    all.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    all
}

/// Limits tried: around what the burst got through, which is the limit of
/// every design when the probe starts from idle.
fn limits(design: Limiter, burst_admitted: u32) -> Vec<u32> {
    let b = burst_admitted.max(1);
    if design == Limiter::Concurrency {
        return (1..=b.saturating_add(2).min(5_000)).collect();
    }
    let spread = (b / 25).max(2);
    let step = (spread / 4).max(1);
    let low = b.saturating_sub(spread).max(1);
    (low..=b.saturating_add(spread))
        .step_by(step as usize)
        .chain([b])
        .collect()
}

/// Windows around the one the probes measured (`burst` refilled at
/// `per_s`), 1% apart within about 30% of it either way, when it lies outside what the hint
/// spans: nginx at `rate=120r/m` refills every 0.5 s, a window of 5.5 s
/// for its burst of 11, which a 60 s hint never reaches.
fn measured_windows(burst: u32, per_s: Option<f64>, hint: f64) -> Vec<f64> {
    let Some(per_s) = per_s.filter(|r| r.is_finite() && *r > 0.0) else {
        return Vec::new();
    };
    let measured = f64::from(burst.max(1)) / per_s;
    let spanned = hint / 1.01f64.powi(139)..=hint * 1.01f64.powi(139);
    if spanned.contains(&measured) {
        return Vec::new();
    }
    (-30..=30).map(|i| measured * 1.01f64.powi(i)).collect()
}

/// The best limit and window for `design` on `seen`: the candidates with
/// the fewest mismatches; their spread is how sure the fit is. `per_s` is
/// the rate the probes after the burst were admitted at, if measured: for a
/// token bucket the windows it implies are tried too, so a wrong hint cannot
/// hide the truth, and of windows that fit as well the nearest to it wins.
pub fn fit(
    design: Limiter,
    seen: &[Seen],
    burst_admitted: u32,
    window_hint: f64,
    per_s: Option<f64>,
) -> Fit {
    let plain = fit_as(design, false, seen, burst_admitted, window_hint, per_s);
    if !may_count_refusals(design) || plain.mismatches == 0 {
        return plain;
    }
    // Counting refusals is named only when it predicts strictly better:
    // the usual design wins a tie.
    let counting = fit_as(design, true, seen, burst_admitted, window_hint, per_s);
    if counting.mismatches < plain.mismatches {
        counting
    } else {
        plain
    }
}

fn fit_as(
    design: Limiter,
    counts_refusals: bool,
    seen: &[Seen],
    burst_admitted: u32,
    window_hint: f64,
    per_s: Option<f64>,
) -> Fit {
    // A concurrency limit sees requests in the order they arrived.
    let mut by_arrival;
    let seen = if design == Limiter::Concurrency {
        by_arrival = seen.to_vec();
        by_arrival.sort_by(|a, b| {
            a.arrived
                .total_cmp(&b.arrived)
                .then(b.admitted.cmp(&a.admitted))
        });
        &by_arrival[..]
    } else {
        seen
    };
    let windows = if design == Limiter::Concurrency {
        vec![window_hint]
    } else if design.clock_aligned() {
        aligned_windows(window_hint)
    } else {
        let mut windows = free_windows(window_hint);
        // Only a token bucket: its refill is what the probes measure. A
        // window's average rate can be matched by a slow endpoint's
        // concurrency limit too, which then no longer stands out.
        if design == Limiter::TokenBucket {
            windows.extend(measured_windows(burst_admitted, per_s, window_hint));
        }
        windows
    };
    // Nearest the burst and the hint first: the best is usually there, and
    // once it is known every worse candidate is given up early.
    let mut windows = windows;
    windows.sort_by(|a, b| {
        (a / window_hint)
            .ln()
            .abs()
            .total_cmp(&(b / window_hint).ln().abs())
    });
    let mut limits = limits(design, burst_admitted);
    limits.sort_by_key(|l| l.abs_diff(burst_admitted));
    let mut best = usize::MAX;
    let mut ties: Vec<(u32, f64)> = Vec::new();
    // The burst from idle shows the limit directly, where later answers
    // hinge on timing to the millisecond: nginx's 10 in 2 s once predicted
    // one answer more wrongly than 9 in 1.81 s or 11 in 2.21 s. So the
    // burst's limit is kept while it predicts at most one answer worse.
    let trust_burst = design != Limiter::Concurrency;
    let mut burst_row: Vec<(f64, usize)> = Vec::new();
    for limit in limits {
        for &window in &windows {
            let keep_row = trust_burst && limit == burst_admitted;
            let give_up = if keep_row {
                best.saturating_add(1)
            } else {
                best
            };
            let Some(wrong) = mismatches(design, (limit, window, counts_refusals), seen, give_up)
            else {
                continue;
            };
            if keep_row {
                burst_row.push((window, wrong));
            }
            if wrong < best {
                best = wrong;
                ties.clear();
            }
            if wrong == best {
                ties.push((limit, window));
            }
        }
    }
    let burst_best = burst_row.iter().map(|r| r.1).min();
    // Kept among the ties; the design's `mismatches` stays its best, so
    // that designs are still weighed by how well they can fit.
    if let Some(near) = burst_best.filter(|&w| w == best.saturating_add(1)) {
        ties.extend(
            burst_row
                .iter()
                .filter(|r| r.1 == near)
                .map(|r| (burst_admitted, r.0)),
        );
    }
    // The middle of the windows that fit best; of its limits, the one
    // nearest the burst's (and the burst's own, below, whenever it is
    // among them).
    ties.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    ties.dedup();
    let (mut limit, mut window) = ties
        .get(ties.len() / 2)
        .copied()
        .unwrap_or((burst_admitted, window_hint));
    if let Some(&(l, _)) = ties
        .iter()
        .filter(|t| (t.1 - window).abs() < EPS)
        .min_by_key(|t| t.0.abs_diff(burst_admitted))
    {
        limit = l;
    }
    if ties.iter().any(|t| t.0 == burst_admitted) && limit != burst_admitted {
        let of_burst: Vec<f64> = ties
            .iter()
            .filter(|t| t.0 == burst_admitted)
            .map(|t| t.1)
            .collect();
        limit = burst_admitted;
        window = of_burst[of_burst.len() / 2];
    }
    // A token bucket's refill is seen directly in the probes' admissions:
    // of the windows that fit as well for this limit, the nearest to it
    // (probes 0.25 s apart cannot tell a refill every 0.3 s from one every
    // 0.5 s; the rate they were admitted at can).
    if let Some(per_s) =
        per_s.filter(|r| design == Limiter::TokenBucket && r.is_finite() && *r > 0.0)
    {
        let seen_window = f64::from(limit) / per_s;
        if let Some(&(_, w)) = ties.iter().filter(|t| t.0 == limit).min_by(|a, b| {
            (a.1 / seen_window)
                .ln()
                .abs()
                .total_cmp(&(b.1 / seen_window).ln().abs())
        }) {
            window = w;
        }
    }
    let limit_range = (
        ties.iter().map(|t| t.0).min().unwrap_or(limit),
        ties.iter().map(|t| t.0).max().unwrap_or(limit),
    );
    let window_range = (
        ties.iter().map(|t| t.1).fold(f64::INFINITY, f64::min),
        ties.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max),
    );
    let has_window = design != Limiter::Concurrency;
    Fit {
        limiter: design,
        mismatches: if best == usize::MAX { seen.len() } else { best },
        limit,
        limit_range,
        window_s: has_window.then_some(window),
        window_range_s: (has_window && window_range.0.is_finite()).then_some(window_range),
        counts_refusals,
    }
}
