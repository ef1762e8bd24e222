//! Token bucket as GCRA: one number per key, the theoretical arrival time.

use super::{Grant, Meter};
use crate::clock::Nanos;
use crate::store::{FastWord, Idle};

/// The theoretical arrival time: the instant at which the key's bucket is
/// full again. At or before now, the bucket is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tat(pub(crate) Nanos);

impl Idle for Tat {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.0 <= now
    }

    #[inline]
    fn to_word(&self) -> Option<u64> {
        Some(self.0)
    }

    #[inline]
    fn from_word(word: u64) -> Self {
        Self(word)
    }
}

/// What [`Gcra::admit_word`] decided.
pub(crate) enum Fast {
    /// Admitted now.
    Admitted,
    /// Refused: the wait, at this clock reading. Nothing changed.
    Refused { wait: Nanos, now: Nanos },
    /// Nothing is published in the word: the state is under the lock.
    Unpublished,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// Nanoseconds per unit, rounded up so the rate is never exceeded.
    emission: Nanos,
    /// How far ahead of now the arrival time may run: burst × emission.
    tolerance: Nanos,
    burst: u32,
}

impl Gcra {
    /// `emission` ns per unit with a burst of `burst` units. The quota has
    /// checked that `burst * emission` fits.
    pub(crate) fn new(emission: Nanos, burst: u32) -> Self {
        Self {
            emission,
            tolerance: emission.saturating_mul(u64::from(burst)),
            burst,
        }
    }

    fn units(&self, cost: u32) -> Nanos {
        self.emission.saturating_mul(u64::from(cost))
    }

    /// Admit `cost` units now or refuse, in reject mode, on a state
    /// published in `word`: exactly what `earliest` and `book` decide under
    /// the lock (with no wait allowed and no line), as one compare-and-swap
    /// of the arrival time, which is how governor admits too. The clock is
    /// read after each load of the word, as the locked path reads it after
    /// taking the lock: no state booked by a later reading is mistaken for
    /// a clock that ran backwards.
    #[inline(always)]
    pub(crate) fn admit_word(
        &self,
        word: &FastWord,
        now: impl Fn() -> Nanos,
        cost: u32,
        horizon: Nanos,
    ) -> Fast {
        let mut current = word.load();
        loop {
            if current == FastWord::UNPUBLISHED {
                return Fast::Unpublished;
            }
            let now = now();
            let mut tat = Tat(current);
            let at = self.earliest(&mut tat, now, cost, horizon);
            if at > now {
                // (A refusal never follows a reset: from an empty state
                // every cost up to the burst fits now.)
                return Fast::Refused {
                    wait: at - now,
                    now,
                };
            }
            let booked = tat.0.max(now).saturating_add(self.units(cost));
            if booked == FastWord::UNPUBLISHED {
                // Cannot be published; the locked path takes it.
                return Fast::Unpublished;
            }
            match word.swap_if(current, booked) {
                Ok(_) => return Fast::Admitted,
                Err(seen) => current = seen,
            }
        }
    }
}

impl Meter for Gcra {
    type State = Tat;

    #[inline]
    fn earliest(&self, tat: &mut Tat, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        // No clock running forwards can leave the arrival time this far
        // ahead (a burst of waiters within the horizon, and a burst of debt
        // a settlement charged on top); the clock ran backwards, so start
        // the key afresh.
        let debt = self.tolerance;
        if tat.0
            > now
                .saturating_add(self.tolerance)
                .saturating_add(debt)
                .saturating_add(horizon)
        {
            tat.0 = 0;
        }
        tat.0
            .max(now)
            .saturating_add(self.units(cost))
            .saturating_sub(self.tolerance)
            .max(now)
    }

    #[inline]
    fn book(&self, tat: &mut Tat, now: Nanos, at: Nanos, cost: u32) -> Grant {
        tat.0 = tat.0.max(at).max(now).saturating_add(self.units(cost));
        Grant {
            at,
            cost,
            mark: tat.0,
        }
    }

    fn refund(&self, tat: &mut Tat, now: Nanos, grant: &Grant, waiting: bool) {
        // What of the grant the bucket has not refilled by itself yet,
        // counted from the grant's own instant: by `at + units` its units
        // are back whatever happened since. Counted from the arrival time
        // instead, a grant whose units came back long ago would be given
        // back again, on top of the requests admitted since (a burst of 3
        // refilled, 3 admitted, then a slow answer refunded: a 4th at once).
        // No live booking since lies ahead of now (a waiter that gave up
        // left its slot, which nobody waits for), so none of them can have
        // used those units up: they are the key's to give back.
        let owed = grant
            .at
            .saturating_add(self.units(grant.cost))
            .saturating_sub(now);
        // With waiters booked ahead, the bucket's one number cannot tell how
        // much of the unit their bookings already absorbed (a burst of 1:
        // a waiter booked at the instant the unit would have come back has
        // taken it), and a newcomer may not go before them: it stays spent.
        if waiting || owed == 0 || tat.0 <= now {
            return;
        }
        tat.0 = tat.0.saturating_sub(owed).max(now);
    }

    fn settle(&self, tat: &mut Tat, now: Nanos, grant: &Grant, actual: u32, waiting: bool) {
        if actual < grant.cost {
            // The units it should not have taken are its last: they come
            // back between `at + units(actual)` and `at + units(cost)`, and
            // only what has not come back by itself is owed (as in `refund`).
            let owed = grant
                .at
                .saturating_add(self.units(grant.cost))
                .saturating_sub(now)
                .min(self.units(grant.cost - actual));
            if waiting || owed == 0 || tat.0 <= now {
                return;
            }
            tat.0 = tat.0.saturating_sub(owed).max(now);
        } else {
            // Charged now, after every booking, so none moves, also on a
            // bucket already empty (a busy key, where it matters most). At
            // most one burst: beyond it, one bad estimate would silence the
            // key for longer than a refill. `earliest` allows for that debt
            // before it takes a state ahead for a clock that ran backwards.
            // And one burst of debt in all: several charges add up to no
            // more than an empty bucket and a burst (past that, `earliest`
            // would take the debt for a clock that ran backwards and start
            // the key afresh, forgiving it all).
            let from = tat.0.max(now);
            let most = now
                .saturating_add(self.tolerance.saturating_mul(2))
                .max(from);
            tat.0 = from
                .saturating_add(self.units(actual - grant.cost).min(self.tolerance))
                .min(most);
        }
    }

    fn cancel(&self, tat: &mut Tat, _now: Nanos, grant: &Grant) {
        // Only the last booking can be undone exactly; an earlier one keeps
        // its slot (which then goes unused) so no later booking moves.
        if tat.0 == grant.mark {
            tat.0 = tat.0.saturating_sub(self.units(grant.cost));
        }
    }

    fn retune(&self, old: &Self, tat: &mut Tat, now: Nanos, _booked: Nanos) {
        if tat.0 <= now || old == self {
            return;
        }
        // Waiters keep the instants they were booked at; the last one went
        // where the old bucket ran empty, a tolerance before the arrival
        // time. The new quota takes over there with the bucket as empty, so
        // newcomers follow the last waiter at the new rate, faster or
        // slower: never between the waiters (which would mint capacity),
        // and never so far out that the queue's length is counted twice.
        let last = tat.0 - old.tolerance.min(tat.0);
        if last > now {
            tat.0 = last.saturating_add(self.tolerance);
            return;
        }
        // No queue: units owed under the old rate, rounded up. What is
        // available may shrink with the new burst but never grow.
        let owed = (tat.0 - now).div_ceil(old.emission.max(1));
        let available = u64::from(old.burst)
            .saturating_sub(owed)
            .min(u64::from(self.burst));
        let owed = u64::from(self.burst) - available;
        tat.0 = now.saturating_add(self.emission.saturating_mul(owed));
    }

    fn remaining(&self, tat: &Tat, now: Nanos) -> (u32, Nanos) {
        let owed = tat.0.saturating_sub(now);
        let free = self.tolerance.saturating_sub(owed) / self.emission.max(1);
        (
            u32::try_from(free).unwrap_or(u32::MAX).min(self.burst),
            owed,
        )
    }

    fn capacity(&self) -> u32 {
        self.burst
    }

    fn hold_spent(&self, tat: &mut Tat, now: Nanos, spent: u32) {
        // At most a full bucket owed: more would read as a clock that ran
        // backwards (see `earliest`'s horizon) and be dropped.
        let owed = self.units(spent.min(self.burst));
        tat.0 = tat.0.max(now.saturating_add(owed));
    }

    fn fill_until(&self, tat: &mut Tat, at: Nanos) {
        tat.0 = tat.0.max(at.saturating_add(self.tolerance));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arrival_time_at_the_edge_of_the_horizon_is_kept() {
        // 10 units of 1 s: a tolerance of 10 s, as much debt again, and a
        // horizon of 5 s. At exactly that far ahead the state is one a
        // forward clock can leave (waiters and debt); one nanosecond
        // further, it is the mark of a clock that ran backwards.
        let gcra = Gcra::new(1_000_000_000, 10);
        let (now, horizon) = (100_000_000_000, 5_000_000_000);
        let edge = now + 10_000_000_000 + 10_000_000_000 + horizon;
        let mut kept = Tat(edge);
        assert_eq!(
            gcra.earliest(&mut kept, now, 1, horizon),
            edge - 10_000_000_000 + 1_000_000_000
        );
        assert_eq!(kept, Tat(edge));
        let mut reset = Tat(edge + 1);
        assert_eq!(gcra.earliest(&mut reset, now, 1, horizon), now);
        assert_eq!(reset, Tat(0));
    }
}
