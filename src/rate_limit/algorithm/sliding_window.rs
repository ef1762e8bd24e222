//! Exact sliding window: a log of the admissions inside the window.

use std::collections::VecDeque;

use super::{Grant, Meter};
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

    fn clear(&mut self) {
        self.entries.clear();
        self.sum = 0;
    }
}

impl Idle for Log {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.expires <= now
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}

impl Meter for SlidingWindow {
    type State = Log;

    fn earliest(&self, log: &mut Log, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        if log
            .latest()
            .is_some_and(|at| at > now.saturating_add(horizon))
        {
            // Booked further ahead than any wait allows: the clock ran
            // backwards. Start the key afresh.
            log.clear();
        }
        // An admission at `at` counts while `t - at < window`: one exactly a
        // window old has expired.
        while let Some(&(at, c)) = log.entries.front() {
            if at.saturating_add(self.window) > now {
                break;
            }
            log.entries.pop_front();
            log.sum -= u64::from(c);
        }
        // Not before the latest booking (strict FIFO; the count below
        // already implies it, this says it).
        let mut at = log.latest().map_or(now, |latest| latest.max(now));
        let mut alive = log.sum;
        let room = u64::from(self.limit).saturating_sub(u64::from(cost));
        // Oldest first, admissions leave the window until this one fits;
        // usually none or one has to.
        for &(booked, c) in &log.entries {
            if alive <= room {
                break;
            }
            at = at.max(booked.saturating_add(self.window));
            alive -= u64::from(c);
        }
        at
    }

    fn book(&self, log: &mut Log, _now: Nanos, at: Nanos, cost: u32) -> Grant {
        log.entries.push_back((at, cost));
        log.sum += u64::from(cost);
        log.expires = at.saturating_add(self.window);
        Grant { at, cost, mark: at }
    }

    fn refund(&self, log: &mut Log, _now: Nanos, grant: &Grant, _waiting: bool) {
        // Removing an admission only lowers counts, and a newcomer is still
        // booked no earlier than the latest booking, so no queue reorders:
        // exact whatever is booked behind it, waiters included (the log
        // holds every booking, so nothing is guessed).
        if let Some(i) = log
            .entries
            .iter()
            .rposition(|&(at, c)| at == grant.at && c == grant.cost)
        {
            log.entries.remove(i);
            log.sum -= u64::from(grant.cost);
        }
    }

    fn settle(&self, log: &mut Log, _now: Nanos, grant: &Grant, actual: u32, _waiting: bool) {
        // The request's own entry takes its real cost, at most the whole
        // window's limit: exact for a refund, as `refund` is. An entry gone
        // has left the window, which no longer counts it.
        let Some(entry) = log
            .entries
            .iter_mut()
            .rev()
            .find(|(at, c)| *at == grant.at && *c == grant.cost)
        else {
            return;
        };
        let actual = actual.min(self.limit);
        log.sum = log.sum - u64::from(entry.1) + u64::from(actual);
        entry.1 = actual;
        if actual == 0 {
            if let Some(i) = log
                .entries
                .iter()
                .rposition(|&(at, c)| at == grant.at && c == 0)
            {
                log.entries.remove(i);
            }
        }
    }

    fn cancel(&self, log: &mut Log, now: Nanos, grant: &Grant) {
        self.refund(log, now, grant, false);
    }

    fn retune(&self, old: &Self, log: &mut Log, _now: Nanos, _booked: Nanos) {
        // The log holds real instants, so a new limit or window applies to it
        // as it is; only the idle deadline moves with the window.
        if old.window != self.window {
            log.expires = log.latest().map_or(0, |at| at.saturating_add(self.window));
        }
    }

    fn remaining(&self, log: &Log, now: Nanos) -> (u32, Nanos) {
        let live = log
            .entries
            .iter()
            .filter(|&&(at, _)| at.saturating_add(self.window) > now)
            .map(|&(_, c)| u64::from(c))
            .sum::<u64>();
        let free = u64::from(self.limit).saturating_sub(live);
        (
            u32::try_from(free).unwrap_or(0),
            log.expires.saturating_sub(now),
        )
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    fn hold_spent(&self, log: &mut Log, now: Nanos, spent: u32) {
        let (free, _) = self.remaining(log, now);
        let live = self.limit - free;
        let missing = spent.min(self.limit).saturating_sub(live);
        if missing > 0 {
            // After any booking ahead, as entries stay in time order.
            let at = log.latest().map_or(now, |latest| latest.max(now));
            self.book(log, now, at, missing);
        }
    }

    fn fill_until(&self, log: &mut Log, at: Nanos) {
        // A whole window's worth at `at`, after any later booking so the log
        // stays in order: nothing fits until a window after it.
        let at = log.latest().map_or(at, |latest| latest.max(at));
        self.book(log, at, at, self.limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log with one booking of `cost` at each of `at`.
    fn booked(window: &SlidingWindow, at: &[Nanos], cost: u32) -> Log {
        let mut log = Log::default();
        for &t in at {
            window.book(&mut log, t, t, cost);
        }
        log
    }

    #[test]
    fn a_booking_at_the_edge_of_the_horizon_is_kept() {
        // At exactly now + horizon a booking is one a forward clock can
        // leave (a waiter); one nanosecond further, the mark of a clock
        // that ran backwards, and the key starts afresh.
        let window = SlidingWindow::new(1, 1_000);
        let (now, horizon) = (10_000, 500);
        let mut kept = booked(&window, &[now + horizon], 1);
        assert_eq!(
            window.earliest(&mut kept, now, 1, horizon),
            now + horizon + 1_000
        );
        let mut reset = booked(&window, &[now + horizon + 1], 1);
        assert_eq!(window.earliest(&mut reset, now, 1, horizon), now);
    }

    #[test]
    fn what_remains_leaves_out_a_booking_exactly_a_window_old() {
        let window = SlidingWindow::new(2, 1_000);
        let log = booked(&window, &[0, 500], 1);
        assert_eq!(window.remaining(&log, 999).0, 0);
        assert_eq!(window.remaining(&log, 1_000).0, 1);
    }

    #[test]
    fn settling_to_nothing_removes_that_booking_and_no_other() {
        // Two bookings at one instant: the second settled to nothing
        // leaves the first counted.
        let window = SlidingWindow::new(3, 1_000);
        let mut log = booked(&window, &[100, 100], 1);
        let grant = Grant {
            at: 100,
            cost: 1,
            mark: 100,
        };
        window.settle(&mut log, 200, &grant, 0, false);
        assert_eq!(log.entries, [(100, 1)]);
        assert_eq!(log.sum, 1);
        assert_eq!(window.remaining(&log, 200).0, 2);
        // Of two bookings at one instant with different costs, the one
        // settled goes, though the other was booked after it.
        let mut log = Log::default();
        window.book(&mut log, 100, 100, 2);
        window.book(&mut log, 100, 100, 1);
        let grant = Grant {
            at: 100,
            cost: 2,
            mark: 100,
        };
        window.settle(&mut log, 200, &grant, 0, false);
        assert_eq!(log.entries, [(100, 1)]);
        assert_eq!(window.remaining(&log, 200).0, 2);
    }

    #[test]
    fn a_longer_window_keeps_the_log_alive_longer() {
        let (short, long) = (SlidingWindow::new(1, 100), SlidingWindow::new(1, 1_000));
        let mut log = booked(&short, &[0], 1);
        assert!(log.is_idle(100));
        long.retune(&short, &mut log, 50, 0);
        assert!(
            !log.is_idle(100),
            "idle before its booking left the new window"
        );
        assert_eq!(window_reset(&long, &log, 50), 950);
    }

    fn window_reset(window: &SlidingWindow, log: &Log, now: Nanos) -> Nanos {
        window.remaining(log, now).1
    }

    #[test]
    fn holding_what_is_already_spent_books_nothing() {
        let window = SlidingWindow::new(5, 1_000);
        let mut log = booked(&window, &[0], 2);
        window.hold_spent(&mut log, 500, 2);
        assert_eq!(log.entries, [(0, 2)]);
        assert_eq!(log.expires, 1_000, "the log's deadline did not move");
    }
}
