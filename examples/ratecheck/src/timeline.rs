//! A diagnose run as the inference reads it: every request's phase, when it
//! was sent and what came back. It is written into diagnose's report, so a
//! report can be judged again later (the unit tests replay recorded ones).
//! Times and status codes only: no header, body or URL.

use serde::{Deserialize, Serialize};

use crate::probe::{Class, Outcome};
use crate::schedule::{Phase, Plan};

/// The requests of one run, in the order they were planned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The run's start, in seconds since the Unix epoch: it places the
    /// windows aligned to the clock.
    pub start_unix_s: f64,
    /// When the burst went, in seconds from the start.
    pub burst_at_s: f64,
    /// `--rpm`: the limit the probe was told to expect, per `--window`.
    pub limit_hint: u32,
    /// `--window`, in seconds.
    pub window_hint_s: f64,
    pub requests: Vec<Request>,
}

/// One request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub phase: Phase,
    /// When it was sent, in seconds from the start of the run.
    pub sent_s: f64,
    /// From sending to the end of the response (or the failure), seconds.
    pub latency_s: f64,
    /// The status code; none when no complete response came.
    pub status: Option<u16>,
}

impl Request {
    /// Admitted (2xx), refused (429), or neither (another status, or no
    /// answer): such a request says nothing about the limiter.
    pub fn admitted(&self) -> Option<bool> {
        match self.status {
            Some(s) if (200..300).contains(&s) => Some(true),
            Some(429) => Some(false),
            _ => None,
        }
    }
}

/// Microseconds are plenty, and keep the report readable.
fn micros(s: f64) -> f64 {
    if s.is_finite() {
        (s * 1e6).round() / 1e6
    } else {
        0.0
    }
}

impl Timeline {
    /// The timeline of `plan`, run from `start_unix_s`, with its `outcomes`
    /// (in plan order; requests never sent are absent).
    pub fn of(
        plan: &Plan,
        outcomes: &[Outcome],
        start_unix_s: f64,
        limit_hint: u32,
        window_hint_s: f64,
    ) -> Timeline {
        let requests = outcomes
            .iter()
            .filter_map(|o| {
                let event = plan.events.get(o.event)?;
                Some(Request {
                    phase: event.phase,
                    sent_s: micros(o.sent.as_secs_f64()),
                    latency_s: micros(o.latency.as_secs_f64()),
                    status: match o.class {
                        Class::Status(s) => Some(s),
                        Class::Transport(_) => None,
                    },
                })
            })
            .collect();
        Timeline {
            start_unix_s: micros(start_unix_s),
            burst_at_s: micros(plan.burst_at.unwrap_or_default().as_secs_f64()),
            limit_hint,
            window_hint_s,
            requests,
        }
    }
}
