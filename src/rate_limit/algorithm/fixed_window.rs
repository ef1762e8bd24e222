//! Fixed windows: a counter per key, reset at each window boundary.

use super::{Acquire, Algorithm, Grant};
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

#[derive(Clone, Copy, Debug)]
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
    fn end_of(&self, t: Nanos) -> Nanos {
        let shifted = t.saturating_add(self.phase);
        (shifted / self.window + 1)
            .saturating_mul(self.window)
            .saturating_sub(self.phase)
    }
}

impl Algorithm for FixedWindow {
    type State = WindowCount;

    fn acquire(
        &self,
        state: &mut WindowCount,
        now: Nanos,
        cost: u32,
        max_wait: Nanos,
        horizon: Nanos,
    ) -> Acquire {
        if state.end > self.end_of(now.saturating_add(horizon)) {
            // Booked further ahead than any wait allows: the clock ran
            // backwards. Start the key afresh.
            *state = WindowCount::default();
        }
        let (end, used) = if state.end <= now {
            (self.end_of(now), 0)
        } else {
            (state.end, state.used)
        };
        let (at, booked) = if u64::from(used) + u64::from(cost) <= u64::from(self.limit) {
            let start = end.saturating_sub(self.window);
            (
                start.max(now),
                WindowCount {
                    end,
                    used: used + cost,
                },
            )
        } else {
            // Full: the first instant of the next window.
            (
                end,
                WindowCount {
                    end: end.saturating_add(self.window),
                    used: cost,
                },
            )
        };
        let wait = at - now;
        if wait > max_wait {
            return Acquire::Denied { retry_after: wait };
        }
        *state = booked;
        let grant = Grant {
            at,
            cost,
            mark: booked.end,
        };
        if wait == 0 {
            Acquire::Now(grant)
        } else {
            Acquire::Later(grant)
        }
    }

    fn refund(&self, state: &mut WindowCount, _now: Nanos, grant: &Grant) {
        // Only a window that still counts can take a unit back; bookings in
        // later windows then still see their own window unchanged.
        if state.end == grant.mark {
            state.used = state.used.saturating_sub(grant.cost);
        }
    }

    fn cancel(&self, state: &mut WindowCount, now: Nanos, grant: &Grant) {
        self.refund(state, now, grant);
    }
}
