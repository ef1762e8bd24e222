//! A circuit breaker on the store's calls: after [`TRIP_AFTER`] calls in a
//! row get no answer, the store stops asking Redis for a while and every
//! request is decided by the fail mode at once, instead of each paying the
//! whole timeout; then one call goes through as a probe, and its answer
//! closes the breaker (or its silence opens it again, for twice as long,
//! up to [`MAX_BACKOFF_US`]).
//!
//! Written here rather than taken from a crate: it is four atomics, and
//! what counts as a failure (no answer; an error reply is an answer) and
//! what is logged belong to the store.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Calls in a row without an answer that open the breaker.
pub(crate) const TRIP_AFTER: u32 = 3;

/// How long the breaker first stays open, in microseconds.
const FIRST_BACKOFF_US: u64 = 250_000;

/// The longest it stays open before a probe: a Redis back again is used
/// within this.
pub(crate) const MAX_BACKOFF_US: u64 = 1_000_000;

/// Whether a call may go to Redis.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Closed: ask.
    Ask,
    /// Open, and its backoff over: this call is the one probe.
    Probe,
    /// Open: decide without asking.
    Refuse,
}

/// What a failed call did to the breaker.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// Below the threshold: still closed.
    Counted,
    /// It opened the breaker now.
    Tripped,
    /// It was open already (a probe, or a call sent before it opened).
    StillOpen,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    failures: AtomicU32,
    /// While open, until when (microseconds on the caller's clock); zero
    /// while closed.
    open_until: AtomicU64,
    /// How long the next opening lasts.
    backoff: AtomicU64,
    probing: AtomicBool,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            backoff: AtomicU64::new(FIRST_BACKOFF_US),
            probing: AtomicBool::new(false),
        }
    }
}

impl Breaker {
    /// Whether a call at `now` may ask Redis.
    pub(crate) fn pass(&self, now: u64) -> Pass {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            Pass::Ask
        } else if now >= until
            && self
                .probing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            Pass::Probe
        } else {
            Pass::Refuse
        }
    }

    /// A call was answered. Returns whether the breaker was open.
    pub(crate) fn answered(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        if self.open_until.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.backoff.store(FIRST_BACKOFF_US, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        self.open_until.swap(0, Ordering::AcqRel) != 0
    }

    /// The probe ended without an outcome (its request was dropped, its
    /// client gone): the next call after the backoff may probe.
    pub(crate) fn probe_abandoned(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// A call got no answer, found out at `now`; `probe`: it was the probe.
    /// A call sent before the breaker opened changes nothing once it is
    /// open: only the probe's silence opens it again.
    pub(crate) fn failed(&self, now: u64, probe: bool) -> Failed {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let open = self.open_until.load(Ordering::Acquire) != 0;
        if open && !probe {
            return Failed::StillOpen;
        }
        if !open && failures < TRIP_AFTER {
            return Failed::Counted;
        }
        let backoff = self.backoff.load(Ordering::Relaxed);
        self.backoff
            .store((backoff * 2).min(MAX_BACKOFF_US), Ordering::Relaxed);
        self.open_until
            .store(now.saturating_add(backoff).max(1), Ordering::Release);
        self.probing.store(false, Ordering::Release);
        if open {
            Failed::StillOpen
        } else {
            Failed::Tripped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_opens_after_failures_in_a_row_probes_once_and_closes_on_an_answer() {
        let b = Breaker::default();
        assert_eq!(b.failed(0, false), Failed::Counted);
        assert!(!b.answered(), "an answer between failures resets the count");
        assert_eq!(b.failed(0, false), Failed::Counted);
        assert_eq!(b.failed(0, false), Failed::Counted);
        assert_eq!(b.failed(10, false), Failed::Tripped);
        assert_eq!(b.pass(11), Pass::Refuse);
        // A call sent before it opened, failing now, changes nothing.
        assert_eq!(b.failed(12, false), Failed::StillOpen);
        // After the backoff: one probe, the others still refused.
        assert_eq!(b.pass(10 + FIRST_BACKOFF_US), Pass::Probe);
        assert_eq!(b.pass(10 + FIRST_BACKOFF_US), Pass::Refuse);
        // The probe fails: open again, twice as long.
        let at = 10 + FIRST_BACKOFF_US;
        assert_eq!(b.failed(at, true), Failed::StillOpen);
        assert_eq!(b.pass(at + 2 * FIRST_BACKOFF_US - 1), Pass::Refuse);
        assert_eq!(b.pass(at + 2 * FIRST_BACKOFF_US), Pass::Probe);
        assert!(b.answered(), "closed by the probe's answer");
        assert_eq!(b.pass(at), Pass::Ask);
    }

    #[test]
    fn a_probe_dropped_without_an_outcome_lets_the_next_call_probe() {
        let b = Breaker::default();
        for _ in 0..TRIP_AFTER {
            b.failed(0, false);
        }
        assert_eq!(b.pass(FIRST_BACKOFF_US), Pass::Probe);
        assert_eq!(b.pass(FIRST_BACKOFF_US), Pass::Refuse);
        b.probe_abandoned();
        assert_eq!(b.pass(FIRST_BACKOFF_US), Pass::Probe);
    }

    #[test]
    fn the_backoff_never_passes_its_cap() {
        let b = Breaker::default();
        let mut now = 0;
        for _ in 0..20 {
            b.failed(now, true);
            now += MAX_BACKOFF_US;
        }
        assert_eq!(b.pass(now - 1 + MAX_BACKOFF_US), Pass::Probe);
    }
}
