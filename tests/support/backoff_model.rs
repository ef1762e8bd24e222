//! A reference model of `Backoff429Layer` in reject mode, written for
//! clarity, not speed: per route its streak of 429s, the end of its cooldown
//! and when a quiet route forgets its streak; per request whether it was
//! sent before the route's latest cooldown started (while the route still
//! remembers that cooldown). Times are nanoseconds
//! since the start of the history. Header values are a small, readable
//! subset of what the layer parses; the model reads them itself.
#![allow(dead_code, unreachable_pub)]

/// A header value: a number in the header's unit, a number with one
/// decimal, or something that must not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Val {
    Whole(u64),
    /// `whole.tenth`
    Tenths(u64, u8),
    Garbage(&'static str),
}

pub const GARBAGE: [&str; 6] = ["-5", "1e3", "nan", "inf", "abc", "+7"];

impl Val {
    /// The value in units of `unit` nanoseconds, if it parses.
    pub fn nanos(self, unit: u64) -> Option<u64> {
        match self {
            Self::Whole(n) => Some(n * unit),
            Self::Tenths(n, t) => Some(n * unit + u64::from(t) * unit / 10),
            Self::Garbage(_) => None,
        }
    }

    /// As a decimal header (`Retry-After`, `retry-after-ms`).
    pub fn decimal(self) -> String {
        match self {
            Self::Whole(n) => n.to_string(),
            Self::Tenths(n, t) => format!("{n}.{t}"),
            Self::Garbage(g) => g.to_owned(),
        }
    }

    /// As a Go duration in milliseconds (`x-ratelimit-reset-requests`);
    /// garbage has no unit or a sign.
    pub fn go_millis(self) -> String {
        match self {
            Self::Whole(n) => format!("{n}ms"),
            Self::Tenths(n, t) => format!("{n}.{t}ms"),
            Self::Garbage(g) => g.to_owned(),
        }
    }
}

pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

/// What the upstream says with its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// `retry-after-ms`, milliseconds.
    pub retry_after_ms: Option<Val>,
    /// `Retry-After`, seconds.
    pub retry_after: Option<Val>,
    /// `x-ratelimit-reset-requests` (milliseconds, as a Go duration), and
    /// whether `x-ratelimit-remaining-requests: 0` comes with it.
    pub reset: Option<(Val, bool)>,
}

/// Where a cooldown's length came from (mirrors the layer's `Reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    RetryAfterMs,
    RetryAfter,
    ResetDuration,
    Exponential { streak: u32 },
}

impl Headers {
    /// `retry-after-ms` if it parses, else `Retry-After` if it parses.
    fn retry_after(&self) -> Option<(u64, Why)> {
        if let Some(wait) = self.retry_after_ms.and_then(|v| v.nanos(MS)) {
            return Some((wait, Why::RetryAfterMs));
        }
        let wait = self.retry_after.and_then(|v| v.nanos(SEC))?;
        Some((wait, Why::RetryAfter))
    }

    /// The reset header, if it parses (and, for a success, only when the
    /// route is exhausted).
    fn reset(&self, need_exhausted: bool) -> Option<(u64, Why)> {
        let (val, exhausted) = self.reset?;
        if need_exhausted && !exhausted {
            return None;
        }
        Some((val.nanos(MS)?, Why::ResetDuration))
    }

    /// What a response with `status` asks for, before clamping.
    pub fn advice(&self, status: u16) -> Option<(u64, Why)> {
        match status {
            429 => self.retry_after().or_else(|| self.reset(false)),
            503 => self.retry_after(),
            200..=299 => self.reset(true),
            _ => None,
        }
    }
}

/// Cooldown lengths, in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Lengths {
    pub initial: u64,
    /// Zero: no doubling.
    pub max_backoff: u64,
    pub max_cooldown: u64,
}

impl Lengths {
    /// The longest exponential cooldown before `max_cooldown`.
    pub fn cap(&self) -> u64 {
        if self.max_backoff == 0 {
            self.initial
        } else {
            self.max_backoff
        }
    }

    /// The `streak`th consecutive 429's cooldown: `initial` doubled per
    /// 429 after the first, capped.
    pub fn exponential(&self, streak: u32) -> u64 {
        let doubled = u128::from(self.initial) << streak.saturating_sub(1).min(100);
        doubled.min(u128::from(self.cap())) as u64
    }
}

#[derive(Clone, Debug, Default)]
pub struct Route {
    pub streak: u32,
    /// Cooling while `now < until`.
    pub until: u64,
    pub forget_at: u64,
    /// When (in [`Model::seq`] order) the latest cooldown the route
    /// remembers started.
    pub started_at: Option<u64>,
    /// The latest start's reason and status.
    pub why: Option<(Why, u16)>,
}

impl Route {
    /// A quiet route (its cooldown over, and its streak, if any, past
    /// `forget_at`) forgets its streak and its latest cooldown: it decides
    /// as a route never seen.
    fn refresh(&mut self, now: u64) {
        if self.until <= now && (self.streak == 0 || self.forget_at <= now) {
            self.streak = 0;
            self.started_at = None;
        }
    }
}

/// A request sent, whose answer is awaited.
#[derive(Clone, Debug)]
pub struct Sent {
    pub route: usize,
    /// `None`: sent while the layer was off; its answer is not read.
    pub watch: Option<Watch>,
}

#[derive(Clone, Copy, Debug)]
pub struct Watch {
    /// When it was sent, in [`Model::seq`] order.
    pub sent_at: u64,
    /// The route had a streak when it was sent.
    pub streak_open: bool,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub lengths: Lengths,
    pub on_503: bool,
    pub proactive: bool,
    pub enabled: bool,
    pub now: u64,
    /// Orders sends and cooldown starts.
    pub seq: u64,
    pub routes: Vec<Route>,
    pub admitted: u64,
    pub rejected: u64,
    /// Cooldowns started on a route that was not cooling.
    pub started: u64,
}

impl Model {
    pub fn new(lengths: Lengths, on_503: bool, proactive: bool, routes: usize) -> Self {
        Self {
            lengths,
            on_503,
            proactive,
            enabled: true,
            now: 0,
            seq: 0,
            routes: vec![Route::default(); routes],
            admitted: 0,
            rejected: 0,
            started: 0,
        }
    }

    /// A request on `route`: sent (`Ok`), or refused with the time left
    /// of its cooldown (`Err`).
    pub fn send(&mut self, route: usize) -> Result<Sent, u64> {
        if !self.enabled {
            return Ok(Sent { route, watch: None });
        }
        let now = self.now;
        let r = &mut self.routes[route];
        r.refresh(now);
        if r.until > now {
            self.rejected += 1;
            return Err(r.until - now);
        }
        self.admitted += 1;
        self.seq += 1;
        let watch = Watch {
            sent_at: self.seq,
            streak_open: r.streak > 0,
        };
        Ok(Sent {
            route,
            watch: Some(watch),
        })
    }

    /// The upstream answers `sent` with `status` and `headers`.
    pub fn answer(&mut self, sent: &Sent, status: u16, headers: &Headers) {
        let Some(watch) = sent.watch else { return };
        let refused = status == 429;
        let unavailable = status == 503 && self.on_503;
        let success = (200..300).contains(&status);
        if !(refused || unavailable || success) || !self.enabled {
            return;
        }
        if success && !watch.streak_open && !self.proactive {
            return;
        }
        let lengths = self.lengths;
        let advised = if refused || unavailable || self.proactive {
            headers
                .advice(status)
                .map(|(wait, why)| (wait.min(lengths.max_cooldown), why))
        } else {
            None
        };
        let now = self.now;
        let r = &mut self.routes[sent.route];
        r.refresh(now);
        // An answer to a request sent before the route's latest cooldown
        // started was in flight meanwhile: it says nothing new of the streak.
        let fresh = r.started_at.is_none_or(|at| at < watch.sent_at);
        let forget_after = lengths.cap().min(lengths.max_cooldown);
        let start = if refused {
            if fresh {
                r.streak = r.streak.saturating_add(1);
                // Quiet time runs from this 429 too, cooldown or not: a
                // 429 advising no wait still counts in the streak.
                r.forget_at = r.forget_at.max(now + forget_after);
            }
            match advised {
                Some(advised) => Some(advised),
                None if fresh => {
                    let streak = r.streak;
                    let wait = lengths.exponential(streak).min(lengths.max_cooldown);
                    Some((wait, Why::Exponential { streak }))
                }
                None => None,
            }
        } else if unavailable {
            advised
        } else {
            if fresh {
                r.streak = 0;
            }
            advised
        };
        if let Some((wait, why)) = start {
            let until = now + wait;
            // Only a longer cooldown counts; a zero wait starts nothing.
            if until > r.until && until > now {
                if r.until <= now {
                    self.started += 1;
                }
                r.until = until;
                r.forget_at = until + forget_after;
                self.seq += 1;
                r.started_at = Some(self.seq);
                r.why = Some((why, status));
            }
        }
    }

    pub fn advance(&mut self, nanos: u64) {
        self.now += nanos;
    }

    /// Routes cooling now: route, time left, reason, status.
    pub fn cooling(&self) -> Vec<(usize, u64, Why, u16)> {
        self.routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.until > self.now)
            .filter_map(|(i, r)| {
                let (why, status) = r.why?;
                Some((i, r.until - self.now, why, status))
            })
            .collect()
    }
}
