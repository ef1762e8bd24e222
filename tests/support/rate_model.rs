//! A reference model of `RateLimitLayer`'s decisions, written to be read,
//! not to be fast: every key's quotas as plain lists and numbers, every
//! decision recomputed from them. Times are nanoseconds since the layer's
//! limiter was built.
//!
//! What each algorithm promises, as the rustdoc says it:
//!
//! - token bucket: GCRA in its textbook form (virtual scheduling): a
//!   theoretical arrival time `tat`; `n` units at `t` conform when
//!   `max(tat, t) + n·T − τ ≤ t`, with `T` the period over the limit
//!   (rounded up, so the rate is never exceeded) and `τ = burst·T`;
//! - sliding window: the list of admissions; a request fits at `t` when
//!   the admissions younger than a window plus its cost fit the limit;
//! - fixed window: the list of admissions, windows aligned to the wall
//!   clock (the test learns where their boundaries fall);
//! - turn budget: the current turn (its start and what it used); it starts
//!   at its first admission and ends at a new turn, or `period` after it
//!   started;
//! - sliding window counter: the list of admissions, windows aligned as the
//!   fixed window's; `n` units fit at `t` in window `[s, e)` when
//!   `previous·(e − t) + (current + n)·P ≤ limit·P`, with `previous` and
//!   `current` what the window before and this one admitted; the count only
//!   falls as time passes, so the first instant it fits is searched for.
//!
//! In wait mode a request goes at the earliest instant, not before the
//! key's earlier bookings (strict FIFO), at which every quota admits it.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Duration;

use tower_throttle::rate_limit::{Quota, Unit};

pub const MS: u64 = 1_000_000;

/// The algorithms, in the order shrinking prefers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alg {
    Bucket,
    Sliding,
    Fixed,
    Turn,
    Counter,
}

/// One quota, small enough to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    pub alg: Alg,
    pub limit: u32,
    pub period_ms: u64,
    /// The token bucket's burst (the limit for the others).
    pub burst: u32,
    /// Counts requests, not cost.
    pub per_request: bool,
}

impl Spec {
    pub fn new(alg: Alg, limit: u32, period_ms: u64, burst: u32, per_request: bool) -> Self {
        let burst = if alg == Alg::Bucket { burst } else { limit };
        Self {
            alg,
            limit,
            period_ms,
            burst,
            per_request,
        }
    }

    /// The library's quota for this spec.
    pub fn quota(&self) -> Quota {
        let period = Duration::from_millis(self.period_ms);
        let quota = match self.alg {
            Alg::Bucket => Quota::new(self.limit, period)
                .unwrap()
                .with_burst(self.burst)
                .unwrap(),
            Alg::Sliding => Quota::new(self.limit, period).unwrap().sliding_window(),
            Alg::Fixed => Quota::new(self.limit, period).unwrap().fixed_window(),
            Alg::Counter => Quota::new(self.limit, period)
                .unwrap()
                .sliding_window_counter(),
            Alg::Turn => Quota::per_turn(self.limit)
                .unwrap()
                .with_stale_after(period)
                .unwrap(),
        };
        if self.per_request {
            quota.with_unit(Unit::Requests)
        } else {
            quota
        }
    }

    pub fn period(&self) -> u64 {
        self.period_ms * MS
    }

    /// What a request of `cost` counts here.
    pub fn charge(&self, cost: u32) -> u32 {
        if self.per_request { 1 } else { cost }
    }

    /// The token bucket's emission interval: the period over the limit,
    /// rounded up.
    pub fn emission(&self) -> u64 {
        self.period().div_ceil(u64::from(self.limit))
    }

    fn tolerance(&self) -> u64 {
        self.emission() * u64::from(self.burst)
    }
}

/// One key's state under one quota.
#[derive(Clone, Debug)]
pub enum State {
    /// The theoretical arrival time.
    Bucket { tat: u64 },
    /// Every admission (instant, cost), oldest first.
    Log(Vec<(u64, u32)>),
    /// Every admission, and the latest window ever booked in (a window
    /// whose bookings were all cancelled still holds back newcomers).
    Windows {
        log: Vec<(u64, u32)>,
        latest: Option<u64>,
    },
    /// The current turn: when it started and what it used.
    Turn { started: u64, used: u32 },
    /// Every admission, and the latest instant booked (strict FIFO: a
    /// cancelled booking still holds back newcomers).
    Counter { log: Vec<(u64, u32)>, latest: u64 },
}

/// What a booking left, to undo it if its waiter is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub at: u64,
    pub cost: u32,
    /// The arrival time after it (bucket), its window (fixed, counter), its
    /// turn's start (turn).
    pub mark: u64,
}

/// Where fixed windows start: boundaries of a window of `P` fall at the
/// instants `t ≡ anchor (mod P)`.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub anchor: u64,
}

impl Windows {
    /// The index of the window of `period` holding `t`.
    pub fn index(&self, period: u64, t: u64) -> u64 {
        let shift = (period - self.anchor % period) % period;
        (t + shift) / period
    }

    /// When window `index` of `period` starts (0 for the first, which may
    /// have started before the limiter).
    pub fn start(&self, period: u64, index: u64) -> u64 {
        let shift = (period - self.anchor % period) % period;
        (index * period).saturating_sub(shift)
    }
}

impl State {
    fn fresh(spec: &Spec) -> Self {
        match spec.alg {
            Alg::Bucket => State::Bucket { tat: 0 },
            Alg::Sliding => State::Log(Vec::new()),
            Alg::Fixed => State::Windows {
                log: Vec::new(),
                latest: None,
            },
            Alg::Turn => State::Turn {
                started: 0,
                used: 0,
            },
            Alg::Counter => State::Counter {
                log: Vec::new(),
                latest: 0,
            },
        }
    }

    /// The earliest instant, not before `now` nor before the latest
    /// booking, at which `n` units fit.
    fn earliest(&self, spec: &Spec, windows: Windows, now: u64, n: u32) -> u64 {
        let limit = u64::from(spec.limit);
        let n64 = u64::from(n);
        match self {
            State::Bucket { tat } => {
                // Conforms at t when max(tat, t) + n·T − τ ≤ t.
                let allowed = (*tat).max(now) + n64 * spec.emission();
                allowed.saturating_sub(spec.tolerance()).max(now)
            }
            State::Log(log) => {
                let window = spec.period();
                let alive_at = |t: u64| -> u64 {
                    log.iter()
                        .filter(|&&(at, _)| at + window > t)
                        .map(|&(_, c)| u64::from(c))
                        .sum()
                };
                let first = log.last().map_or(now, |&(at, _)| at.max(now));
                // Admissions leave the window one by one: the first instant
                // among `first` and their leaving times where it fits.
                let mut candidates: Vec<u64> = std::iter::once(first)
                    .chain(log.iter().map(|&(at, _)| at + window))
                    .filter(|&t| t >= first)
                    .collect();
                candidates.sort_unstable();
                candidates
                    .into_iter()
                    .find(|&t| alive_at(t) + n64 <= limit)
                    .expect("a cost within the limit fits once every admission left")
            }
            State::Windows { log, latest } => {
                let period = spec.period();
                let current = windows.index(period, now);
                let w = latest.map_or(current, |l| l.max(current));
                let used: u64 = log
                    .iter()
                    .filter(|&&(at, _)| windows.index(period, at) == w)
                    .map(|&(_, c)| u64::from(c))
                    .sum();
                if used + n64 <= limit {
                    windows.start(period, w).max(now)
                } else {
                    windows.start(period, w + 1)
                }
            }
            State::Counter { log, latest } => {
                let from = now.max(*latest);
                let fits = |t: u64| counter_fits(spec, windows, log, t, n);
                if fits(from) {
                    return from;
                }
                // Nothing is booked after `from`, so the count only falls:
                // the first instant it fits, by bisection. Two windows on,
                // both windows counted are empty.
                let (mut lo, mut hi) = (from, from + 3 * spec.period());
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if fits(mid) { hi = mid } else { lo = mid }
                }
                hi
            }
            State::Turn { started, used } => {
                let stale_at = started + spec.period();
                // A turn a waiter opened ahead still holds the key until it
                // starts when that waiter was dropped: the turn before it
                // was full.
                if (*used == 0 && *started <= now) || stale_at <= now {
                    now
                } else if u64::from(*used) + n64 <= limit {
                    now.max(*started)
                } else {
                    stale_at
                }
            }
        }
    }

    fn book(&mut self, spec: &Spec, windows: Windows, now: u64, at: u64, n: u32) -> Grant {
        let mark = match self {
            State::Bucket { tat } => {
                *tat = (*tat).max(at).max(now) + u64::from(n) * spec.emission();
                *tat
            }
            State::Log(log) => {
                log.push((at, n));
                at
            }
            State::Windows { log, latest } => {
                log.push((at, n));
                let w = windows.index(spec.period(), at);
                *latest = Some(latest.map_or(w, |l| l.max(w)));
                w
            }
            State::Counter { log, latest } => {
                log.push((at, n));
                *latest = (*latest).max(at);
                windows.index(spec.period(), at)
            }
            State::Turn { started, used } => {
                if *used == 0 || at >= *started + spec.period() {
                    *started = at;
                    *used = n;
                } else {
                    *used += n;
                }
                *started
            }
        };
        Grant { at, cost: n, mark }
    }

    /// Nothing available at `at` nor before: for a quota new to a key
    /// whose waiters it cannot see (after what the key spent is carried).
    fn fill_until(&mut self, spec: &Spec, windows: Windows, at: u64) {
        match self {
            State::Bucket { tat } => *tat = (*tat).max(at + spec.tolerance()),
            State::Log(log) => log.push((at, spec.limit)),
            State::Windows { log, latest } => {
                // The window holding `at` full, counting what a carry put
                // in it already (not twice: a retune carries what was
                // spent, then fills for the waiters); nothing when a later
                // window is booked.
                let period = spec.period();
                let w = windows.index(period, at);
                if latest.is_none_or(|l| l <= w) {
                    let used: u64 = log
                        .iter()
                        .filter(|&&(t, _)| windows.index(period, t) == w)
                        .map(|&(_, c)| u64::from(c))
                        .sum();
                    let missing = u64::from(spec.limit).saturating_sub(used);
                    if missing > 0 {
                        log.push((at, missing as u32));
                    }
                    *latest = Some(w);
                }
            }
            State::Counter { log, latest } => {
                // The window holding `at` full, counting what a carry put
                // in it already; nothing when a later window is booked.
                let period = spec.period();
                if windows.index(period, *latest) <= windows.index(period, at) {
                    let (_, current, _) = counter_windows(spec, windows, log, at);
                    let missing = u64::from(spec.limit).saturating_sub(current);
                    if missing > 0 {
                        log.push((at, missing as u32));
                    }
                }
                *latest = (*latest).max(at);
            }
            State::Turn { started, used } => {
                if *used == 0 || *started + spec.period() <= at {
                    *started = at;
                    *used = spec.limit;
                } else {
                    // The turn running at `at` is used up; it ends as it
                    // would have.
                    *used = (*used).max(spec.limit);
                }
            }
        }
    }

    /// The units not available at `now`: what carries to a quota of
    /// another algorithm in a retune.
    fn in_use(&self, spec: &Spec, windows: Windows, now: u64) -> u32 {
        let limit = u64::from(spec.limit);
        let used = match self {
            State::Bucket { tat } => {
                let owed = tat.saturating_sub(now);
                let free = spec.tolerance().saturating_sub(owed) / spec.emission();
                return spec.burst - free.min(u64::from(spec.burst)) as u32;
            }
            State::Log(log) => log
                .iter()
                .filter(|&&(at, _)| at + spec.period() > now)
                .map(|&(_, c)| u64::from(c))
                .sum(),
            State::Windows { log, latest } => {
                let current = windows.index(spec.period(), now);
                match *latest {
                    Some(l) if l > current => limit,
                    Some(l) if l == current => log
                        .iter()
                        .filter(|&&(at, _)| windows.index(spec.period(), at) == current)
                        .map(|&(_, c)| u64::from(c))
                        .sum(),
                    _ => 0,
                }
            }
            State::Counter { log, latest } => {
                let period = spec.period();
                if windows.index(period, *latest) > windows.index(period, now) {
                    limit
                } else {
                    let (previous, current, end) = counter_windows(spec, windows, log, now);
                    (u128::from(previous) * u128::from(end - now)).div_ceil(u128::from(period))
                        as u64
                        + current
                }
            }
            State::Turn { started, used } => {
                let idle = (*used == 0 && *started <= now) || started + spec.period() <= now;
                if idle { 0 } else { u64::from(*used) }
            }
        };
        used.min(limit) as u32
    }

    /// Take `spent` units at `now` on top of what is in use, up to the
    /// capacity: what a key spent under the quota this one replaced.
    fn hold_spent(&mut self, spec: &Spec, windows: Windows, now: u64, spent: u32) {
        if spent == 0 {
            return;
        }
        let in_use = self.in_use(spec, windows, now);
        match self {
            State::Bucket { tat } => {
                let owed = spec.emission() * u64::from(spent.min(spec.burst));
                *tat = (*tat).max(now + owed);
            }
            State::Log(log) => {
                let missing = spent.min(spec.limit).saturating_sub(in_use);
                if missing > 0 {
                    let at = log.last().map_or(now, |&(last, _)| last.max(now));
                    log.push((at, missing));
                }
            }
            State::Windows { log, latest } => {
                let current = windows.index(spec.period(), now);
                if latest.is_none_or(|l| l <= current) {
                    let missing = spent.saturating_sub(in_use);
                    if missing > 0 {
                        log.push((now, missing));
                    }
                    *latest = Some(current);
                }
            }
            State::Counter { log, latest } => {
                // Now's window counts at least what was spent, as long as
                // it weighs in the latest window booked (that one, or the
                // one before it).
                let period = spec.period();
                if windows.index(period, *latest) <= windows.index(period, now) + 1 {
                    let (_, current, _) = counter_windows(spec, windows, log, now);
                    let missing = u64::from(spent).saturating_sub(current);
                    if missing > 0 {
                        log.push((now, missing as u32));
                    }
                }
            }
            State::Turn { started, used } => {
                if in_use == 0 && (*used == 0 || *started + spec.period() <= now) {
                    *started = now;
                    *used = spent;
                } else if *started < now + spec.period() {
                    *used = (*used).max(spent);
                }
                // A turn booked past a turn's length from now: not the
                // spending's.
            }
        }
    }

    /// Undo a dropped waiter's booking as far as that never over-admits: a
    /// bucket only its last booking (an earlier one keeps its slot, so no
    /// later booking moves), a log its entry, a window or a turn only its
    /// own, while it is the latest booked.
    fn cancel(&mut self, spec: &Spec, grant: &Grant) {
        match self {
            State::Bucket { tat } => {
                if *tat == grant.mark {
                    *tat -= u64::from(grant.cost) * spec.emission();
                }
            }
            State::Log(log) => {
                if let Some(i) = log.iter().rposition(|&e| e == (grant.at, grant.cost)) {
                    log.remove(i);
                }
            }
            State::Windows { log, latest } => {
                if *latest == Some(grant.mark) {
                    if let Some(i) = log.iter().rposition(|&e| e == (grant.at, grant.cost)) {
                        log.remove(i);
                    }
                }
            }
            State::Turn { started, used } => {
                if *started == grant.mark {
                    *used = used.saturating_sub(grant.cost);
                }
            }
            State::Counter { log, .. } => {
                if let Some(i) = log.iter().rposition(|&e| e == (grant.at, grant.cost)) {
                    log.remove(i);
                }
            }
        }
    }

    /// Carry the state from `old` to `new` (same algorithm and period).
    fn retune(&mut self, old: &Spec, new: &Spec, now: u64) {
        let State::Bucket { tat } = self else {
            // Windows and turns keep what they used; the new limit applies.
            return;
        };
        if *tat <= now || old == new {
            return;
        }
        // Waiters booked ahead keep their instants; the new bucket takes
        // over, empty, where the old one ran empty for the last of them.
        let last = *tat - old.tolerance().min(*tat);
        if last > now {
            *tat = last + new.tolerance();
            return;
        }
        // Otherwise the units owed under the old rate (rounded up) stay
        // owed: what is available never grows, and is at most the new burst.
        let owed = (*tat - now).div_ceil(old.emission());
        let available = u64::from(old.burst)
            .saturating_sub(owed)
            .min(u64::from(new.burst));
        *tat = now + new.emission() * (u64::from(new.burst) - available);
    }
}

/// What a sliding window counter's log admitted in the window before the
/// one holding `t` and in that one, and when that one ends.
fn counter_windows(spec: &Spec, windows: Windows, log: &[(u64, u32)], t: u64) -> (u64, u64, u64) {
    let period = spec.period();
    let w = windows.index(period, t);
    let sum = |index: u64| -> u64 {
        log.iter()
            .filter(|&&(at, _)| windows.index(period, at) == index)
            .map(|&(_, c)| u64::from(c))
            .sum()
    };
    let previous = if w == 0 { 0 } else { sum(w - 1) };
    (previous, sum(w), windows.start(period, w + 1))
}

/// Whether `n` units fit at `t` under a sliding window counter.
fn counter_fits(spec: &Spec, windows: Windows, log: &[(u64, u32)], t: u64, n: u32) -> bool {
    let (previous, current, end) = counter_windows(spec, windows, log, t);
    let period = u128::from(spec.period());
    u128::from(previous) * u128::from(end - t) + u128::from(current + u64::from(n)) * period
        <= u128::from(spec.limit) * period
}

/// What the model decides for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted at `at` (now in reject mode; a booked instant in wait mode).
    Admitted { at: u64 },
    /// Refused: the wait, and the index of the quota that needed it.
    Refused { wait: u64, slowest: usize },
    /// The cost is above what the key can ever admit at once.
    TooCostly { capacity: u32 },
}

/// The whole limiter: every key's state under every quota.
#[derive(Clone, Debug)]
pub struct Model {
    pub specs: Vec<Spec>,
    pub windows: Windows,
    pub enabled: bool,
    keys: BTreeMap<u8, Vec<State>>,
    /// Per key, the instant before which nothing may be booked: the last
    /// waiter's instant when a retune came, while waiters are in line.
    floors: BTreeMap<u8, u64>,
    /// Per key, the first booking a retune holds newcomers back for
    /// (bookings before a reset or a lifting new turn do not count).
    since: BTreeMap<u8, u64>,
    /// Moves on at every retune and reset, and at a new turn that forgets
    /// a turn started now or ahead: a waiter booked under another gives
    /// nothing back when dropped.
    generation: u64,
    /// Every booking ahead of its instant (wait mode).
    pub waiters: Vec<Waiter>,
    /// Turns a retune opened, full, at the instant of a key's last waiter
    /// (key, quota, instant, units): the invariant checks start the turn
    /// there, where no admission shows it. Taken by the caller.
    pub opened_turns: Vec<(u8, usize, u64, u32)>,
}

/// A request booked ahead of now, in its key's line until its instant.
#[derive(Clone, Debug)]
pub struct Waiter {
    pub id: usize,
    pub key: u8,
    pub at: u64,
    pub grants: Vec<Grant>,
    generation: u64,
    /// Booking order.
    seq: u64,
    pub dropped: bool,
}

impl Model {
    pub fn new(specs: Vec<Spec>, windows: Windows) -> Self {
        Self {
            specs,
            windows,
            enabled: true,
            keys: BTreeMap::new(),
            floors: BTreeMap::new(),
            since: BTreeMap::new(),
            generation: 0,
            waiters: Vec::new(),
            opened_turns: Vec::new(),
        }
    }

    /// The most one request may cost: the smallest burst of the quotas
    /// that count cost.
    pub fn capacity(&self) -> u32 {
        self.specs
            .iter()
            .filter(|s| !s.per_request)
            .map(|s| s.burst)
            .min()
            .unwrap_or(u32::MAX)
    }

    fn states(&mut self, key: u8) -> &mut Vec<State> {
        let specs = &self.specs;
        self.keys
            .entry(key)
            .or_insert_with(|| specs.iter().map(State::fresh).collect())
    }

    /// A request of `cost` on `key` at `now`, allowed to wait `max_wait`
    /// (zero: reject mode). Also returns the grants, for a waiter.
    pub fn request(
        &mut self,
        key: u8,
        cost: u32,
        now: u64,
        max_wait: u64,
    ) -> (Verdict, Vec<Grant>) {
        if !self.enabled {
            return (Verdict::Admitted { at: now }, Vec::new());
        }
        // A zero cost counts as one.
        let cost = cost.max(1);
        let capacity = self.capacity();
        if cost > capacity {
            return (Verdict::TooCostly { capacity }, Vec::new());
        }
        let specs = self.specs.clone();
        let windows = self.windows;
        // Only a request that may wait looks for a floor.
        let floor = if max_wait > 0 {
            self.floors.get(&key).copied().unwrap_or(0)
        } else {
            0
        };
        let states = self.states(key);
        // The latest of the instants the quotas allow; the first quota
        // needing it is the one a refusal names.
        let mut at = floor.max(now);
        let mut slowest = 0;
        for (i, (state, spec)) in states.iter().zip(&specs).enumerate() {
            let earliest = state.earliest(spec, windows, now, spec.charge(cost));
            if earliest > at {
                at = earliest;
                slowest = i;
            }
        }
        if at - now > max_wait {
            return (
                Verdict::Refused {
                    wait: at - now,
                    slowest,
                },
                Vec::new(),
            );
        }
        let grants = states
            .iter_mut()
            .zip(&specs)
            .map(|(state, spec)| state.book(spec, windows, now, at, spec.charge(cost)))
            .collect();
        (Verdict::Admitted { at }, grants)
    }

    /// A request allowed to wait `max_wait`: as [`request`](Self::request),
    /// and a booking ahead of now joins the key's line as waiter `id`.
    pub fn request_waiting(
        &mut self,
        id: usize,
        key: u8,
        cost: u32,
        now: u64,
        max_wait: u64,
    ) -> Verdict {
        self.tidy(now);
        let (verdict, grants) = self.request(key, cost, now, max_wait);
        if let Verdict::Admitted { at } = verdict {
            if at > now {
                let seq = self.waiters.len() as u64;
                self.waiters.push(Waiter {
                    id,
                    key,
                    at,
                    grants,
                    generation: self.generation,
                    seq,
                    dropped: false,
                });
            }
        }
        verdict
    }

    /// The waiters of `key` still in line at `now`.
    fn line(&self, key: u8, now: u64) -> impl Iterator<Item = &Waiter> {
        self.waiters
            .iter()
            .filter(move |w| w.key == key && !w.dropped && w.at > now)
    }

    /// The waiters in line at `now`, of every key, in booking order.
    pub fn pending(&self, now: u64) -> Vec<usize> {
        self.waiters
            .iter()
            .filter(|w| !w.dropped && w.at > now)
            .map(|w| w.id)
            .collect()
    }

    /// A key's floor and its retune mark go with its line once it empties.
    pub fn tidy(&mut self, now: u64) {
        for key in 0..=u8::MAX {
            if self.line(key, now).next().is_none() {
                self.floors.remove(&key);
                self.since.remove(&key);
            }
        }
    }

    /// Waiter `id` is dropped before its instant: it leaves its line, and
    /// gives back what its booking took, unless a retune or a reset came
    /// since.
    pub fn drop_waiter(&mut self, id: usize, now: u64) {
        let Some(i) = self.waiters.iter().position(|w| w.id == id) else {
            return;
        };
        self.waiters[i].dropped = true;
        let waiter = self.waiters[i].clone();
        if waiter.generation == self.generation {
            let specs = self.specs.clone();
            if let Some(states) = self.keys.get_mut(&waiter.key) {
                for ((state, spec), grant) in states.iter_mut().zip(&specs).zip(&waiter.grants) {
                    state.cancel(spec, grant);
                }
            }
        }
        self.tidy(now);
    }

    /// A lifted line: no floor, and a later retune holds newcomers back
    /// only for the waiters booked from now on.
    fn lift(&mut self, key: u8, now: u64) {
        if self.line(key, now).next().is_some() {
            self.floors.remove(&key);
            self.since.insert(key, self.waiters.len() as u64);
        }
    }

    /// Forget everything `key` spent. Waiters keep their instants;
    /// newcomers do not queue behind them.
    pub fn reset(&mut self, key: u8, now: u64) {
        self.tidy(now);
        self.keys.remove(&key);
        self.lift(key, now);
        self.generation += 1;
    }

    /// Whether the model cannot tell what a new turn for `key` does to
    /// the tickets from before: its turn starts now with nothing used,
    /// which is idle state the layer may have swept (then no ticket is told
    /// apart) or not (then every ticket from before is).
    pub fn new_turn_is_unknowable(&self, key: u8, now: u64) -> bool {
        self.turns_from(key, now)
            .any(|(started, used)| started == now && used == 0)
    }

    /// The turns of `key` that start at or after `now`: (start, used).
    fn turns_from(&self, key: u8, now: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        let states = self.keys.get(&key).into_iter().flatten();
        states
            .zip(&self.specs)
            .filter_map(move |(state, spec)| match (spec.alg, state) {
                (Alg::Turn, State::Turn { started, used }) if *started >= now => {
                    Some((*started, *used))
                }
                _ => None,
            })
    }

    /// A new turn for `key`: its turn budgets start afresh; with nothing but
    /// turn budgets, newcomers do not queue behind its waiters.
    pub fn new_turn(&mut self, key: u8, now: u64) {
        self.tidy(now);
        let specs = self.specs.clone();
        // A turn that started now or ahead could be taken for the new one:
        // tickets from before are told apart.
        if self
            .turns_from(key, now)
            .any(|(started, used)| used > 0 || started > now)
        {
            self.generation += 1;
        }
        if specs.iter().all(|s| s.alg == Alg::Turn) {
            self.lift(key, now);
        }
        if let Some(states) = self.keys.get_mut(&key) {
            for (state, spec) in states.iter_mut().zip(&specs) {
                if spec.alg == Alg::Turn {
                    *state = State::fresh(spec);
                }
            }
        }
    }

    /// Replace the quotas by `specs`, position by position: a quota of the
    /// same algorithm, unit and period keeps each key's state, converted;
    /// any other starts afresh, but for what the key has in use under a
    /// quota of the same unit it replaces. Keys with waiters get a floor at their
    /// last waiter's instant (nothing booked after the retune goes before
    /// it), and a fresh quota leaves them nothing before their floor.
    ///
    /// Returns what carried: (key, quota, units) for each key that had
    /// units in use under a quota replaced by another algorithm.
    pub fn retune(&mut self, specs: Vec<Spec>, now: u64) -> Vec<(u8, usize, u32)> {
        self.tidy(now);
        let mut carried = Vec::new();
        if specs == self.specs {
            return carried;
        }
        for key in 0..=u8::MAX {
            let since = self.since.get(&key).copied().unwrap_or(0);
            let last = self
                .line(key, now)
                .filter(|w| w.seq >= since)
                .map(|w| w.at)
                .max();
            if let Some(last) = last {
                let floor = self.floors.entry(key).or_insert(0);
                *floor = (*floor).max(last);
            }
        }
        let old = std::mem::replace(&mut self.specs, specs.clone());
        let kept = |i: usize| {
            old.get(i).is_some_and(|o| {
                o.alg == specs[i].alg
                    && o.per_request == specs[i].per_request
                    && o.period_ms == specs[i].period_ms
            })
        };
        let windows = self.windows;
        let floors = self.floors.clone();
        for (&key, &floor) in &floors {
            // A key held back has a state in each fresh quota.
            if floor > now {
                self.states(key);
            }
        }
        for (key, states) in self.keys.iter_mut() {
            let floor = floors.get(key).copied().filter(|&f| f > now);
            let mut new_states = Vec::new();
            for (i, new) in specs.iter().enumerate() {
                if kept(i) {
                    let mut state = states[i].clone();
                    state.retune(&old[i], new, now);
                    new_states.push(state);
                } else {
                    let mut state = State::fresh(new);
                    // Another algorithm counting the same thing: what the
                    // key has in use carries.
                    if let Some(before) = old.get(i).filter(|o| o.per_request == new.per_request) {
                        let spent = states[i].in_use(before, windows, now);
                        state.hold_spent(new, windows, now, spent);
                        if spent > 0 {
                            // What the new quota can hold of it.
                            carried.push((*key, i, spent.min(new.burst)));
                        }
                    }
                    if let Some(floor) = floor {
                        let before = state.clone();
                        state.fill_until(new, windows, floor);
                        if let (
                            State::Turn {
                                started: s0,
                                used: u0,
                            },
                            State::Turn { started, used },
                        ) = (before, &state)
                        {
                            // A turn opened at the waiter's instant, or one
                            // already open (by what carried) filled up there.
                            let (at, units) = if u0 == 0 || s0 != *started {
                                (*started, *used)
                            } else {
                                (floor, used - u0)
                            };
                            if units > 0 {
                                self.opened_turns.push((*key, i, at, units));
                            }
                        }
                    }
                    new_states.push(state);
                }
            }
            *states = new_states;
        }
        self.generation += 1;
        carried
    }
}

/// One admission, as the invariant checks see it: the key, the instant, the
/// cost asked, the quotas in force (an index into the retunes' quotas),
/// and the key's segment of history (a new one starts at each reset and
/// new turn of the key).
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub key: u8,
    pub at: u64,
    pub cost: u32,
    pub epoch: usize,
    pub segment: u64,
    /// A waiter dropped before its instant: not an admission.
    pub dropped: bool,
    /// Units a retune carried into quota `q` from the quota of another
    /// algorithm it replaced: they count there alone, as if admitted at
    /// the retune (a turn they open starts then). `None`: every quota.
    pub only: Option<usize>,
}

impl Admission {
    /// What `Model::retune` carried, as admissions at `at`.
    pub fn carried(
        carried: &[(u8, usize, u32)],
        at: u64,
        epoch: usize,
        segments: &[u64],
    ) -> Vec<Admission> {
        carried
            .iter()
            .map(|&(key, q, units)| Admission {
                key,
                at,
                cost: units,
                epoch,
                segment: segments[usize::from(key)],
                dropped: false,
                only: Some(q),
            })
            .collect()
    }
}

/// Check, without the model, that every window of every quota held its
/// limit in each key's segments, under the quotas then in force:
/// `epochs[epoch]` holds each quota with the table it lives in (a new one
/// when a retune starts it afresh). Windows and buckets are checked within
/// one epoch each, a turn across the retunes that keep its table, under
/// the highest limit it saw. Returns the first breach found.
pub fn check_limits(
    admissions: &[Admission],
    epochs: &[Vec<(Spec, usize)>],
    windows: Windows,
) -> Result<(), String> {
    let mut segments: BTreeMap<(u8, u64), Vec<Admission>> = BTreeMap::new();
    for a in admissions {
        segments.entry((a.key, a.segment)).or_default().push(*a);
    }
    for ((key, _), mut log) in segments {
        log.sort_by_key(|a| a.at);
        let breach = |spec: Spec, what: String| Err(format!("key {key}, {spec:?}: {what}"));
        // Turns, by table: (instant, units, spec, dropped) in order.
        let mut turns: BTreeMap<usize, Vec<(u64, u64, Spec, bool)>> = BTreeMap::new();
        // Everything else, by epoch and quota.
        let mut runs: BTreeMap<(usize, usize), Vec<(u64, u64)>> = BTreeMap::new();
        for a in &log {
            for (q, &(spec, table)) in epochs[a.epoch].iter().enumerate() {
                if a.only.is_some_and(|only| only != q) {
                    continue;
                }
                let units = u64::from(spec.charge(a.cost.max(1)));
                if spec.alg == Alg::Turn {
                    turns
                        .entry(table)
                        .or_default()
                        .push((a.at, units, spec, a.dropped));
                } else if !a.dropped {
                    runs.entry((a.epoch, q)).or_default().push((a.at, units));
                }
            }
        }
        for (_, log) in turns {
            // A dropped waiter's booking can open a turn, which then starts
            // before the first admission in it (while it is booked into);
            // where turns start then is the model's to say, not this check's.
            if log.iter().any(|&(.., dropped)| dropped) {
                continue;
            }
            // A turn starts at its first admission and lasts a period.
            let mut turn: Option<(u64, u64, u64)> = None;
            for (at, c, spec, _) in log {
                let limit = u64::from(spec.limit);
                turn = match turn {
                    Some((start, sum, most)) if at < start + spec.period() => {
                        Some((start, sum + c, most.max(limit)))
                    }
                    _ => Some((at, c, limit)),
                };
                if let Some((start, sum, _)) = turn.filter(|&(_, sum, most)| sum > most) {
                    return breach(spec, format!("{sum} in the turn from {start} ns"));
                }
            }
        }
        for ((epoch, q), charged) in runs {
            let spec = epochs[epoch][q].0;
            let limit = u64::from(spec.limit);
            match spec.alg {
                Alg::Bucket => {
                    // Any run of admissions fits the burst plus what refilled
                    // between its first and its last.
                    let (t, tau) = (spec.emission(), spec.tolerance());
                    for i in 0..charged.len() {
                        let mut sum = 0;
                        for j in i..charged.len() {
                            sum += charged[j].1;
                            if sum * t > charged[j].0 - charged[i].0 + tau {
                                let (from, to) = (charged[i].0, charged[j].0);
                                return breach(spec, format!("{sum} units from {from} to {to} ns"));
                            }
                        }
                    }
                }
                Alg::Sliding => {
                    for &(from, _) in &charged {
                        let sum: u64 = charged
                            .iter()
                            .filter(|&&(at, _)| at >= from && at < from + spec.period())
                            .map(|&(_, c)| c)
                            .sum();
                        if sum > limit {
                            return breach(
                                spec,
                                format!("{sum} in the rolling window from {from} ns"),
                            );
                        }
                    }
                }
                Alg::Fixed => {
                    let mut used: BTreeMap<u64, u64> = BTreeMap::new();
                    for &(at, c) in &charged {
                        *used.entry(windows.index(spec.period(), at)).or_default() += c;
                    }
                    if let Some((w, sum)) = used.into_iter().find(|&(_, sum)| sum > limit) {
                        let from = windows.start(spec.period(), w);
                        return breach(spec, format!("{sum} in the window from {from} ns"));
                    }
                }
                Alg::Counter => {
                    // An aligned window to the limit, a rolling one to twice it.
                    let mut used: BTreeMap<u64, u64> = BTreeMap::new();
                    for &(at, c) in &charged {
                        *used.entry(windows.index(spec.period(), at)).or_default() += c;
                    }
                    if let Some((w, sum)) = used.into_iter().find(|&(_, sum)| sum > limit) {
                        let from = windows.start(spec.period(), w);
                        return breach(spec, format!("{sum} in the window from {from} ns"));
                    }
                    // And at each admission the weighted count held: the
                    // window before, by the share of it still covered, and
                    // this one's admissions up to that instant.
                    let period = spec.period();
                    for &(t, _) in &charged {
                        let w = windows.index(period, t);
                        let sum = |index: u64, upto: u64| -> u64 {
                            charged
                                .iter()
                                .filter(|&&(at, _)| {
                                    at <= upto && windows.index(period, at) == index
                                })
                                .map(|&(_, c)| c)
                                .sum()
                        };
                        let previous = if w == 0 { 0 } else { sum(w - 1, t) };
                        let end = windows.start(period, w + 1);
                        let weighed = u128::from(previous) * u128::from(end - t)
                            + u128::from(sum(w, t)) * u128::from(period);
                        if weighed > u128::from(limit) * u128::from(period) {
                            return breach(
                                spec,
                                format!("a weighted count over the limit at {t} ns"),
                            );
                        }
                    }
                }
                Alg::Turn => unreachable!("checked by table"),
            }
        }
    }
    Ok(())
}
