//! Fixed windows: a counter per key, reset at each window boundary.

use super::{Grant, Meter};
use crate::clock::Nanos;
use crate::store::Idle;

/// The latest window with admissions booked in it, and how much of it is used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WindowCount {
    /// When that window ends.
    end: Nanos,
    used: u32,
}

impl Idle for WindowCount {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.end <= now
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    limit: u32,
    window: Nanos,
    /// Where boundaries fall on the limiter's timeline: a boundary is any
    /// instant `t` with `(t + phase) % window == 0`.
    phase: Nanos,
}

impl FixedWindow {
    pub(crate) fn new(limit: u32, window: Nanos, epoch_offset: Nanos) -> Self {
        let window = window.max(1);
        Self {
            limit,
            window,
            phase: epoch_offset % window,
        }
    }

    /// The end of the window that holds `t`.
    #[inline]
    pub(super) fn end_of(&self, t: Nanos) -> Nanos {
        let shifted = t.saturating_add(self.phase);
        (shifted / self.window + 1)
            .saturating_mul(self.window)
            .saturating_sub(self.phase)
    }

    fn fits(&self, used: u32, cost: u32) -> bool {
        u64::from(used) + u64::from(cost) <= u64::from(self.limit)
    }
}

impl Meter for FixedWindow {
    type State = WindowCount;

    fn earliest(&self, state: &mut WindowCount, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        if state.end > self.end_of(now.saturating_add(horizon)) {
            // Booked further ahead than any wait allows: the clock ran
            // backwards. Start the key afresh.
            *state = WindowCount::default();
        }
        if state.end <= now {
            *state = WindowCount::default();
            return now;
        }
        if self.fits(state.used, cost) {
            state.end.saturating_sub(self.window).max(now)
        } else {
            // Full: the first instant of the next window.
            state.end
        }
    }

    fn book(&self, state: &mut WindowCount, _now: Nanos, at: Nanos, cost: u32) -> Grant {
        let end = self.end_of(at);
        if end == state.end {
            state.used = state.used.saturating_add(cost);
        } else {
            *state = WindowCount { end, used: cost };
        }
        Grant {
            at,
            cost,
            mark: end,
        }
    }

    fn refund(&self, state: &mut WindowCount, _now: Nanos, grant: &Grant, _waiting: bool) {
        // Only a window that still counts can take a unit back; bookings in
        // later windows then still see their own window unchanged.
        if state.end == grant.mark {
            state.used = state.used.saturating_sub(grant.cost);
        }
    }

    fn settle(
        &self,
        state: &mut WindowCount,
        _now: Nanos,
        grant: &Grant,
        actual: u32,
        _waiting: bool,
    ) {
        // In the window it was counted in, while that window still counts;
        // later windows keep their own count (see `refund`).
        if state.end == grant.mark {
            state.used = if actual < grant.cost {
                state.used.saturating_sub(grant.cost - actual)
            } else {
                state.used.saturating_add(actual - grant.cost)
            };
        }
    }

    fn cancel(&self, state: &mut WindowCount, now: Nanos, grant: &Grant) {
        self.refund(state, now, grant, false);
    }

    fn retune(&self, old: &Self, state: &mut WindowCount, now: Nanos, booked: Nanos) {
        if old.window == self.window || state.end <= now {
            // Same boundaries: what was used stays used under the new limit.
            return;
        }
        // New boundaries. The state's bookings lie in its window, none
        // after the key's last waiter (a booking behind another quota's
        // wait or a floor can lie ahead of now in the window holding now):
        // count them in the new window holding the latest instant they can
        // have, so none is passed. Not later: counted at the old window's
        // end, a long old window's count would lie further ahead than any
        // wait allows, and `earliest` would take the key for one whose
        // clock ran backwards and start it afresh.
        // The first window on a limiter's timeline may start before 0.
        let start = state.end.saturating_sub(old.window);
        let latest = (state.end - 1).min(booked.max(start).max(now));
        let end = self.end_of(latest);
        // Earlier old windows overlapping the new one may each have used
        // their whole limit; counting them so never frees anything.
        let earlier = start
            .saturating_sub(end.saturating_sub(self.window))
            .div_ceil(old.window);
        let used =
            u64::from(state.used).saturating_add(u64::from(old.limit).saturating_mul(earlier));
        *state = WindowCount {
            end,
            used: u32::try_from(used).unwrap_or(u32::MAX),
        };
    }

    fn remaining(&self, state: &WindowCount, now: Nanos) -> (u32, Nanos) {
        if state.end <= now {
            return (self.limit, 0);
        }
        // Units booked in a later window leave this one's room as it is.
        let used = if state.end == self.end_of(now) {
            state.used
        } else {
            self.limit
        };
        (self.limit.saturating_sub(used), state.end - now)
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    fn hold_spent(&self, state: &mut WindowCount, now: Nanos, spent: u32) {
        let end = self.end_of(now);
        if state.end == end {
            state.used = state.used.max(spent);
        } else if state.end < end && spent > 0 {
            *state = WindowCount { end, used: spent };
        }
        // A window booked ahead means the current one is full already.
    }

    fn fill_until(&self, state: &mut WindowCount, at: Nanos) {
        let end = self.end_of(at);
        if end > state.end {
            *state = WindowCount {
                end,
                used: self.limit,
            };
        } else if end == state.end {
            state.used = state.used.max(self.limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window count with `cost` booked at each of `at`.
    fn booked(window: &FixedWindow, at: &[Nanos], cost: u32) -> WindowCount {
        let mut state = WindowCount::default();
        for &t in at {
            window.book(&mut state, t, t, cost);
        }
        state
    }

    #[test]
    fn a_retune_leaves_a_window_that_has_ended_behind() {
        // Full in [0, 1 s); at 5 s the window is new under any length, and
        // its count with it.
        let (old, new) = (FixedWindow::new(2, 1_000, 0), FixedWindow::new(2, 2_000, 0));
        let mut state = booked(&old, &[100, 200], 1);
        new.retune(&old, &mut state, 5_000, 0);
        assert_eq!(new.remaining(&state, 5_000).0, 2);
        let mut copy = state;
        assert_eq!(new.earliest(&mut copy, 5_000, 2, 0), 5_000);
    }

    #[test]
    fn a_retune_counts_waiters_in_the_new_window_of_their_last_instant() {
        // A waiter booked in [2 s, 3 s) while it is 0.5 s: under windows
        // of 0.5 s it is counted in [2.5 s, 3 s), which the old window's
        // last instant lies in, not the one after.
        let (old, new) = (FixedWindow::new(2, 1_000, 0), FixedWindow::new(2, 500, 0));
        let mut state = WindowCount::default();
        old.book(&mut state, 500, 2_500, 1);
        new.retune(&old, &mut state, 500, 2_500);
        assert_eq!(state.end, 3_000);
        assert_eq!(new.earliest(&mut state, 500, 1, 10_000), 2_500);
    }

    #[test]
    fn a_waiter_booked_ahead_in_the_window_of_now_is_counted_where_it_goes() {
        // [0, 60 s) holds two units, the second booked at 5 s behind
        // another quota's wait; retuned at 2 s to one a second, the two
        // count in [5 s, 6 s), where the waiter goes, not in [2 s, 3 s).
        let (old, new) = (
            FixedWindow::new(2, 60_000, 0),
            FixedWindow::new(1, 1_000, 0),
        );
        let mut state = booked(&old, &[0, 5_000], 1);
        new.retune(&old, &mut state, 2_000, 5_000);
        assert_eq!(
            state,
            WindowCount {
                end: 6_000,
                used: 2
            }
        );
        assert_eq!(new.earliest(&mut state, 4_000, 1, 2_000), 6_000);
    }

    #[test]
    fn a_long_window_retuned_shorter_keeps_its_waiters_count_within_reach() {
        // A minute's window full, a waiter booked at the next minute's
        // start; retuned to one a second at 59.5 s. The waiter's unit
        // counts in the second it goes in, [60 s, 61 s): counted at the end
        // of the old window instead (120 s), the state would lie further
        // ahead than a newcomer may wait, be taken for a clock that ran
        // backwards and start afresh, and the newcomer would go in the
        // waiter's second too.
        let (old, new) = (
            FixedWindow::new(2, 60_000, 0),
            FixedWindow::new(1, 1_000, 0),
        );
        let mut state = booked(&old, &[100, 200], 1);
        old.book(&mut state, 59_500, 60_000, 1);
        new.retune(&old, &mut state, 59_500, 60_000);
        assert_eq!(
            state,
            WindowCount {
                end: 61_000,
                used: 1
            }
        );
        assert_eq!(new.earliest(&mut state, 59_500, 1, 2_000), 61_000);
    }

    #[test]
    fn holding_what_is_spent_leaves_a_window_booked_ahead() {
        let window = FixedWindow::new(2, 1_000, 0);
        let mut state = WindowCount::default();
        window.book(&mut state, 500, 2_500, 2);
        let ahead = state;
        window.hold_spent(&mut state, 500, 1);
        assert_eq!(state, ahead);
    }

    #[test]
    fn filling_until_an_instant_fills_its_window_only() {
        let window = FixedWindow::new(2, 1_000, 0);
        // A later window than the state's: filled whole.
        let mut state = booked(&window, &[100], 1);
        window.fill_until(&mut state, 1_500);
        assert_eq!(
            state,
            WindowCount {
                end: 2_000,
                used: 2
            }
        );
        // The state's own window: filled, a debt beyond the limit kept.
        let mut state = booked(&window, &[100], 1);
        window.fill_until(&mut state, 500);
        assert_eq!(
            state,
            WindowCount {
                end: 1_000,
                used: 2
            }
        );
        let mut owing = booked(&window, &[100], 3);
        window.fill_until(&mut owing, 500);
        assert_eq!(owing.used, 3);
        // An earlier window than one booked ahead: nothing changes.
        let mut ahead = WindowCount::default();
        window.book(&mut ahead, 500, 2_500, 1);
        let before = ahead;
        window.fill_until(&mut ahead, 500);
        assert_eq!(ahead, before);
    }
}
