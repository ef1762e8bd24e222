//! Exact sliding window: a log of the admissions inside the window.

use std::collections::VecDeque;

use super::{Acquire, Algorithm, Grant};
use crate::clock::Nanos;
use crate::store::Idle;

/// Admissions (instant, cost), oldest first, possibly booked into the future.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<(Nanos, u32)>,
    /// The sum of the entries' costs, kept so a check need not add them up.
    sum: u64,
    /// When the latest entry leaves the window: from then on the log is
    /// idle, which the store can tell without knowing the window.
    expires: Nanos,
}

impl Log {
    fn latest(&self) -> Option<Nanos> {
        self.entries.back().map(|&(at, _)| at)
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SlidingWindow {
    limit: u32,
    window: Nanos,
}

impl SlidingWindow {
    pub(crate) fn new(limit: u32, window: Nanos) -> Self {
        Self {
            limit,
            window: window.max(1),
        }
    }

    /// An admission at `at` counts at `t` while `t - at < window`: one
    /// exactly a window old has expired.
    #[inline]
    fn expired(&self, at: Nanos, t: Nanos) -> bool {
        at.saturating_add(self.window) <= t
    }
}

impl Algorithm for SlidingWindow {
    type State = Log;

    fn acquire(
        &self,
        log: &mut Log,
        now: Nanos,
        cost: u32,
        max_wait: Nanos,
        horizon: Nanos,
    ) -> Acquire {
        if log
            .latest()
            .is_some_and(|at| at > now.saturating_add(horizon))
        {
            // Booked further ahead than any wait allows: the clock ran
            // backwards. Start the key afresh.
            log.entries.clear();
            log.sum = 0;
        }
        while let Some(&(at, c)) = log.entries.front() {
            if !self.expired(at, now) {
                break;
            }
            log.entries.pop_front();
            log.sum -= u64::from(c);
        }
        // Strict FIFO: never before the latest booking.
        let mut at = log.latest().map_or(now, |latest| latest.max(now));
        let mut alive = log.sum;
        let need = u64::from(self.limit).saturating_sub(u64::from(cost));
        // Oldest first, admissions leave the window until this one fits;
        // usually none or one has to.
        for &(booked, c) in &log.entries {
            if alive <= need {
                break;
            }
            at = at.max(booked.saturating_add(self.window));
            alive -= u64::from(c);
        }
        let wait = at - now;
        if wait > max_wait {
            return Acquire::Denied { retry_after: wait };
        }
        log.entries.push_back((at, cost));
        log.sum += u64::from(cost);
        log.expires = at.saturating_add(self.window);
        let grant = Grant { at, cost, mark: at };
        if wait == 0 {
            Acquire::Now(grant)
        } else {
            Acquire::Later(grant)
        }
    }

    fn refund(&self, log: &mut Log, _now: Nanos, grant: &Grant) {
        // Removing an admission only lowers counts, and a newcomer is still
        // booked no earlier than the latest booking, so no queue reorders.
        if let Some(i) = log
            .entries
            .iter()
            .rposition(|&(at, c)| at == grant.at && c == grant.cost)
        {
            log.entries.remove(i);
            log.sum -= u64::from(grant.cost);
        }
    }

    fn cancel(&self, log: &mut Log, now: Nanos, grant: &Grant) {
        self.refund(log, now, grant);
    }
}

impl Idle for Log {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.expires <= now
    }
}
