//! ratecheck's inference (`examples/ratecheck/src/inference.rs`) over arbitrary
//! response timelines: any phases, send times in any order, latencies,
//! statuses (2xx, 429, others, no answer) and hints. It never panics, gives
//! the same verdict twice and after the timeline's JSON round trip, and
//! keeps its documented invariants: confidence within 0..=0.95, a design
//! named only from 0.6 up and with what it measured, `unknown` with no
//! measurement and only it with remaining candidates; candidates every
//! design or none, most likely first, probabilities within 0..=1 summing
//! to 1 (to their rounding); a measured limit and window within their
//! ranges; burst counts and shares consistent; every number finite.
//!
//! Needs the `ratecheck` crate.
//! Shared by the fuzz target and `examples/ratecheck/tests/fuzz_corpus.rs`.

use ratecheck::inference::{Limiter, infer};
use ratecheck::models::DESIGNS;
use ratecheck::schedule::Phase;
use ratecheck::timeline::{Request, Timeline};

const PHASES: [Phase; 7] = [
    Phase::Sustained,
    Phase::Burst,
    Phase::RefillProbe,
    Phase::SlidingProbe,
    Phase::BoundaryBefore,
    Phase::BoundaryAfter,
    Phase::LateBatch,
];

const STATUSES: [Option<u16>; 8] = [
    Some(200),
    Some(429),
    Some(200),
    Some(429),
    Some(204),
    Some(500),
    Some(503),
    None,
];

const WINDOWS: [f64; 8] = [1.0, 2.0, 0.5, 10.0, 60.0, 0.1, 3.0, 1.5];

/// The most requests a timeline gets: diagnose sends a few hundred; the
/// fits cost more than linear time, so fuzzing stays fast.
const MAX_REQUESTS: usize = 300;

/// A timeline from bytes: a head (window hint, limit hint, burst instant,
/// start; the interrupted flag in the first byte's top bit), then 4 bytes a
/// request (phase in the low 3 bits and status in the top 3 bits of the
/// first, the send instant in half milliseconds, the latency in 10 ms).
fn timeline(data: &[u8]) -> Option<Timeline> {
    let (head, body) = data.split_at_checked(4)?;
    let window_hint_s = WINDOWS[usize::from(head[0] % 8)];
    let limit_hint = u32::from(head[1]).max(1);
    let burst_at_s = f64::from(head[2]) / 20.0;
    let start_unix_s = 1.7e9 + f64::from(head[3]);
    let requests = body
        .chunks_exact(4)
        .take(MAX_REQUESTS)
        .map(|c| Request {
            phase: PHASES[usize::from(c[0] & 7) % 7],
            sent_s: f64::from(u16::from_le_bytes([c[1], c[2]])) / 2000.0,
            latency_s: f64::from(c[3]) / 100.0,
            status: STATUSES[usize::from(c[0] >> 5)],
        })
        .collect();
    Some(Timeline {
        start_unix_s,
        burst_at_s,
        limit_hint,
        window_hint_s,
        requests,
    })
}

fn finite(v: f64, what: &str) {
    assert!(v.is_finite(), "{what} is {v}");
}

fn share(v: Option<f64>, what: &str) {
    if let Some(v) = v {
        assert!((0.0..=1.0).contains(&v), "{what} is {v}");
    }
}

/// Decode `data` into a timeline and check the inference's verdict on it.
pub fn check(data: &[u8]) {
    let Some(timeline) = timeline(data) else {
        return;
    };
    let interrupted = data[0] & 0x80 != 0;
    let verdict = infer(&timeline, interrupted);
    assert_eq!(verdict, infer(&timeline, interrupted), "deterministic");
    let json = serde_json::to_string(&timeline).expect("a timeline serializes");
    let back: Timeline = serde_json::from_str(&json).expect("a timeline reads back");
    assert_eq!(back, timeline, "JSON round trip");
    assert_eq!(infer(&back, interrupted), verdict, "same verdict read back");
    serde_json::to_string(&verdict).expect("a verdict serializes");

    let c = verdict.confidence;
    assert!((0.0..=0.95).contains(&c), "confidence {c}");
    if verdict.likely_limiter == Limiter::Unknown {
        assert!(verdict.measured.is_none(), "unknown with a measurement");
    } else {
        assert!(
            c >= 0.6,
            "named {:?} at confidence {c}",
            verdict.likely_limiter
        );
        assert!(verdict.measured.is_some(), "named without a measurement");
        assert!(
            verdict.remaining.is_empty(),
            "named with candidates remaining"
        );
    }
    assert!(!verdict.reasons.is_empty(), "a verdict without a reason");

    let cands = &verdict.candidates;
    assert!(
        cands.is_empty() || cands.len() == DESIGNS.len(),
        "{} candidates",
        cands.len()
    );
    for pair in cands.windows(2) {
        assert!(
            pair[0].probability >= pair[1].probability,
            "not most likely first"
        );
    }
    if !cands.is_empty() {
        let sum: f64 = cands.iter().map(|c| c.probability).sum();
        assert!(
            (sum - 1.0).abs() <= 0.0005 * cands.len() as f64 + 1e-9,
            "probabilities sum to {sum}"
        );
        assert_eq!(
            verdict.likely_limiter == Limiter::Unknown,
            verdict.likely_limiter != cands[0].limiter,
            "the named design is the most likely one"
        );
    }
    let answers = timeline
        .requests
        .iter()
        .filter(|r| r.admitted().is_some())
        .count();
    for cand in cands {
        assert!((0.0..=1.0).contains(&cand.probability));
        assert!(
            cand.mismatches <= answers.max(1),
            "{} mismatches of {answers}",
            cand.mismatches
        );
    }
    for m in cands
        .iter()
        .map(|c| &c.fit)
        .chain(verdict.measured.as_ref())
    {
        let [lo, hi] = m.limit_range;
        assert!(
            lo <= m.limit && m.limit <= hi,
            "limit {} outside {lo}..{hi}",
            m.limit
        );
        if let Some(w) = m.window_s {
            finite(w, "window");
            assert!(w > 0.0, "window {w}");
            if let Some([a, b]) = m.window_range_s {
                assert!(a <= w && w <= b, "window {w} outside {a}..{b}");
            }
        }
        if let Some(r) = m.rate_per_s {
            finite(r, "rate");
        }
    }
    for l in &verdict.remaining {
        assert!(
            cands.iter().any(|c| c.limiter == *l),
            "{l:?} remains but was not fitted"
        );
    }

    let s = &verdict.signals;
    assert!(s.burst_admitted + s.burst_refused <= s.burst_sent, "{s:?}");
    share(Some(s.informative_share), "informative_share");
    share(s.boundary_before_admitted, "boundary_before_admitted");
    share(s.boundary_after_admitted, "boundary_after_admitted");
    share(s.late_batch_admitted, "late_batch_admitted");
    for v in [s.first_admitted_after_burst_s, s.probes_admitted_per_s]
        .into_iter()
        .flatten()
    {
        finite(v, "a signal");
    }
    if let Some(p) = s.probes_admitted_per_s {
        assert!(p >= 0.0, "probes admitted per second {p}");
    }
}
