//! Token bucket as GCRA: one number per key, the theoretical arrival time.

use super::{Acquire, Algorithm, Grant};
use crate::clock::Nanos;
use crate::store::Idle;

/// The theoretical arrival time: the instant at which the key's bucket is
/// full again. At or before now, the bucket is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tat(pub(crate) Nanos);

impl Idle for Tat {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.0 <= now
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Gcra {
    /// Nanoseconds per unit, rounded up so the rate is never exceeded.
    emission: Nanos,
    /// How far ahead of now the arrival time may run: burst × emission.
    tolerance: Nanos,
}

impl Gcra {
    /// `emission` ns per unit with a burst of `burst` units. Callers have
    /// checked that `burst * emission` fits.
    pub(crate) fn new(emission: Nanos, burst: u32) -> Self {
        Self {
            emission,
            tolerance: emission.saturating_mul(u64::from(burst)),
        }
    }
}

impl Algorithm for Gcra {
    type State = Tat;

    #[inline]
    fn acquire(
        &self,
        tat: &mut Tat,
        now: Nanos,
        cost: u32,
        max_wait: Nanos,
        horizon: Nanos,
    ) -> Acquire {
        // No clock running forwards can leave the arrival time this far
        // ahead; the clock ran backwards, so start the key afresh.
        if tat.0 > now.saturating_add(self.tolerance).saturating_add(horizon) {
            tat.0 = 0;
        }
        let new_tat = tat
            .0
            .max(now)
            .saturating_add(self.emission.saturating_mul(u64::from(cost)));
        let at = new_tat.saturating_sub(self.tolerance).max(now);
        let wait = at - now;
        if wait > max_wait {
            return Acquire::Denied { retry_after: wait };
        }
        tat.0 = new_tat;
        let grant = Grant {
            at,
            cost,
            mark: new_tat,
        };
        if wait == 0 {
            Acquire::Now(grant)
        } else {
            Acquire::Later(grant)
        }
    }

    fn refund(&self, tat: &mut Tat, now: Nanos, grant: &Grant) {
        // An arrival time beyond now + tolerance means a request is booked
        // for the future; lowering it would let a newcomer overtake it.
        if tat.0 > now && tat.0 <= now.saturating_add(self.tolerance) {
            let units = self.emission.saturating_mul(u64::from(grant.cost));
            tat.0 = tat.0.saturating_sub(units).max(now);
        }
    }

    fn cancel(&self, tat: &mut Tat, _now: Nanos, grant: &Grant) {
        // Only the last booking can be undone exactly; an earlier one keeps
        // its slot (which then goes unused) so no later booking moves.
        if tat.0 == grant.mark {
            let units = self.emission.saturating_mul(u64::from(grant.cost));
            tat.0 = tat.0.saturating_sub(units);
        }
    }
}
