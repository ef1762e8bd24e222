//! The admission algorithms, each a pure function of (state, now, cost).
//!
//! governor's GCRA would fit the token bucket's arithmetic, but not what the
//! layer needs around it: giving a unit back when the response says the
//! request did not count, cancelling a dropped waiter's booking, booking a
//! future instant for strict FIFO waits, and dropping state from a clock that
//! ran backwards. So the three algorithms are written here, over one keyed
//! store that drops idle state losslessly.

mod fixed_window;
mod gcra;
mod sliding_window;

pub(crate) use fixed_window::FixedWindow;
pub(crate) use gcra::Gcra;
pub(crate) use sliding_window::SlidingWindow;

use crate::clock::Nanos;
use crate::store::Idle;

/// A unit of capacity handed out: enough to give it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// When the request is admitted (now, or a booked future instant).
    pub(crate) at: Nanos,
    pub(crate) cost: u32,
    /// Algorithm-specific: what identifies the booking in the state.
    pub(crate) mark: u64,
}

/// The outcome of one admission check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Admitted now.
    Now(Grant),
    /// Admitted at `grant.at`, later than now; the capacity is booked.
    Later(Grant),
    /// Refused; nothing was consumed. Admission would be possible after
    /// `retry_after` nanoseconds.
    Denied { retry_after: Nanos },
}

/// One admission algorithm over its per-key state.
pub(crate) trait Algorithm: Send + Sync + 'static {
    type State: Idle;

    /// Admit `cost` units at `now` or at most `max_wait` later, booking the
    /// capacity; or refuse without changing anything that matters.
    /// `cost` is at least 1 and at most the capacity. No booking is ever
    /// further than `horizon` (the longest wait this limiter has allowed)
    /// ahead of its arrival: state beyond it means the clock ran backwards.
    fn acquire(
        &self,
        state: &mut Self::State,
        now: Nanos,
        cost: u32,
        max_wait: Nanos,
        horizon: Nanos,
    ) -> Acquire;

    /// The admitted request turned out not to count: give its capacity back,
    /// unless that would let a later arrival overtake a queued one.
    fn refund(&self, state: &mut Self::State, now: Nanos, grant: &Grant);

    /// A queued request left before its instant: give back what can be given
    /// back without ever over-admitting.
    fn cancel(&self, state: &mut Self::State, now: Nanos, grant: &Grant);
}
