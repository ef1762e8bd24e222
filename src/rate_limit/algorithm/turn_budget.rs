//! Budget per turn: at most N admissions per key until the key's turn ends,
//! by an explicit `new_turn` or by going stale.

use super::{Grant, Meter};
use crate::clock::Nanos;
use crate::store::Idle;

/// The current turn: when it started and how much of it is used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Turn {
    started: Nanos,
    used: u32,
    /// A turn with nothing used has not started; only `used > 0` counts.
    stale_at: Nanos,
}

impl Turn {
    /// When the turn started (or starts, booked ahead by a waiter).
    pub(crate) fn started(&self) -> Nanos {
        self.started
    }
}

impl Idle for Turn {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        // A turn booked ahead by a waiter replaced the running one, which
        // was full; with its bookings all cancelled it still holds the key
        // until it starts, or the running turn's budget would come back.
        (self.used == 0 && self.started <= now) || self.stale_at <= now
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TurnBudget {
    limit: u32,
    /// A turn nobody ends ends by itself this long after it started.
    stale_after: Nanos,
}

impl TurnBudget {
    pub(crate) fn new(limit: u32, stale_after: Nanos) -> Self {
        Self {
            limit,
            stale_after: stale_after.max(1),
        }
    }
}

impl Meter for TurnBudget {
    type State = Turn;

    fn earliest(&self, turn: &mut Turn, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        if turn.is_idle(now) || turn.started > now.saturating_add(horizon) {
            *turn = Turn::default();
            return now;
        }
        if u64::from(turn.used) + u64::from(cost) <= u64::from(self.limit) {
            now.max(turn.started)
        } else {
            // Only the sender's own new turn, or staleness, frees the budget;
            // staleness is the one that can be waited for.
            turn.stale_at
        }
    }

    fn book(&self, turn: &mut Turn, _now: Nanos, at: Nanos, cost: u32) -> Grant {
        if turn.used == 0 || at >= turn.stale_at {
            *turn = Turn {
                started: at,
                used: cost,
                stale_at: at.saturating_add(self.stale_after),
            };
        } else {
            turn.used = turn.used.saturating_add(cost);
        }
        Grant {
            at,
            cost,
            mark: turn.started,
        }
    }

    fn refund(&self, turn: &mut Turn, _now: Nanos, grant: &Grant, _waiting: bool) {
        // Into the turn it was taken from only: a later turn (the key's
        // new turn, or one a waiter opened) has its own budget, and the old
        // turn's unit could only be used by going before that turn's
        // bookings. A turn is named by the instant it started; a new turn
        // that starts at the instant the forgotten one did is told apart by
        // the limiter (see `Limiter::new_turn`).
        if turn.started == grant.mark {
            turn.used = turn.used.saturating_sub(grant.cost);
        }
    }

    fn settle(&self, turn: &mut Turn, _now: Nanos, grant: &Grant, actual: u32, _waiting: bool) {
        // In the turn it was taken from only (see `refund`).
        if turn.started == grant.mark {
            turn.used = if actual < grant.cost {
                turn.used.saturating_sub(grant.cost - actual)
            } else {
                turn.used.saturating_add(actual - grant.cost)
            };
        }
    }

    fn cancel(&self, turn: &mut Turn, now: Nanos, grant: &Grant) {
        self.refund(turn, now, grant, false);
    }

    fn retune(&self, _old: &Self, _turn: &mut Turn, _now: Nanos, _booked: Nanos) {
        // What was used stays used; a new stale period applies to new turns.
    }

    fn remaining(&self, turn: &Turn, now: Nanos) -> (u32, Nanos) {
        if turn.is_idle(now) {
            return (self.limit, 0);
        }
        (self.limit.saturating_sub(turn.used), turn.stale_at - now)
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    fn hold_spent(&self, turn: &mut Turn, now: Nanos, spent: u32) {
        if spent == 0 {
            return;
        }
        if turn.is_idle(now) {
            *turn = Turn {
                started: now,
                used: spent,
                stale_at: now.saturating_add(self.stale_after),
            };
        } else if turn.started < now.saturating_add(self.stale_after) {
            // The running turn, or one booked ahead within a turn's length
            // of now: the turn the spending would have opened now holds it.
            turn.used = turn.used.max(spent);
        }
        // A turn booked further ahead starts after the spending's turn
        // would have gone stale (a fill behind a full turn): not its.
    }

    fn fill_until(&self, turn: &mut Turn, at: Nanos) {
        if turn.used == 0 || turn.stale_at <= at {
            *turn = Turn {
                started: at,
                used: self.limit,
                stale_at: at.saturating_add(self.stale_after),
            };
        } else {
            // The turn running at `at` is used up; it ends as it would have.
            turn.used = turn.used.max(self.limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_started_at_the_edge_of_the_horizon_is_kept() {
        // Booked ahead by a waiter up to now + horizon; any later, the mark
        // of a clock that ran backwards, and the key starts afresh.
        let budget = TurnBudget::new(1, 10_000);
        let (now, horizon) = (1_000, 500);
        let mut kept = Turn::default();
        budget.book(&mut kept, now, now + horizon, 1);
        assert_eq!(budget.earliest(&mut kept, now, 1, horizon), kept.stale_at);
        let mut reset = Turn::default();
        budget.book(&mut reset, now, now + horizon + 1, 1);
        assert_eq!(budget.earliest(&mut reset, now, 1, horizon), now);
        assert_eq!(reset, Turn::default());
    }

    #[test]
    fn what_remains_resets_when_the_turn_goes_stale() {
        let budget = TurnBudget::new(3, 10_000);
        let mut turn = Turn::default();
        budget.book(&mut turn, 1_000, 1_000, 1);
        assert_eq!(budget.remaining(&turn, 4_000), (2, 7_000));
    }

    #[test]
    fn what_was_spent_before_a_turn_booked_ahead_stays_out_of_it() {
        // A retune carries what a key spent (at 0) and fills the turn its
        // waiter opened (at 10 s): carried again, the spending belongs to
        // the turn that ran at 0, not to the waiter's.
        let budget = TurnBudget::new(2, 10_000);
        let mut turn = Turn::default();
        budget.hold_spent(&mut turn, 0, 4);
        budget.fill_until(&mut turn, 10_000);
        let filled = turn;
        budget.hold_spent(&mut turn, 0, 4);
        assert_eq!(turn, filled);
        assert_eq!(turn.used, 2);
    }

    #[test]
    fn what_was_spent_is_held_by_a_turn_booked_ahead_within_a_turn() {
        // No turn ran; a waiter (held back by another quota) opened one at
        // 2 s. What the key spent now, carried, would have opened a turn
        // now that the waiter's falls in: that turn holds it.
        let budget = TurnBudget::new(3, 10_000);
        let mut turn = Turn::default();
        budget.book(&mut turn, 0, 2_000, 1);
        budget.hold_spent(&mut turn, 0, 3);
        assert_eq!(turn.used, 3);
    }
}
