//! The admission algorithms, each a pure function of (state, now, cost).
//!
//! governor's GCRA would fit the token bucket's arithmetic, but not what the
//! layer needs around it: giving a unit back when the response says the
//! request did not count, cancelling a dropped waiter's booking, booking a
//! future instant for strict FIFO waits, admitting only when several quotas
//! all admit (look at each, then book each), retuning a key's state without
//! minting a free burst, and dropping state from a clock that ran backwards.
//! So the algorithms are written here, over one keyed store that drops idle
//! state losslessly.

mod fixed_window;
mod gcra;
mod sliding_counter;
mod sliding_window;
mod turn_budget;

pub(crate) use fixed_window::FixedWindow;
pub(crate) use gcra::{Fast, Gcra};
pub(crate) use sliding_counter::SlidingCounter;
pub(crate) use sliding_window::SlidingWindow;
pub(crate) use turn_budget::TurnBudget;

use crate::clock::Nanos;
use crate::store::Idle;

/// Capacity handed out: enough to give it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// When the request is admitted (now, or a booked future instant).
    pub(crate) at: Nanos,
    pub(crate) cost: u32,
    /// Algorithm-specific: what identifies the booking in the state.
    pub(crate) mark: u64,
}

/// What one [`Algorithm`](super::Algorithm) runs: its arithmetic over a
/// key's state, metering the key's use.
///
/// Admission is two steps so that several quotas can admit together: each
/// says the earliest instant it could admit, and each books the latest of
/// those. Nothing is booked when any quota's instant is too far away.
pub(crate) trait Meter: Clone + Send + Sync + 'static {
    type State: Idle + Clone;

    /// The earliest instant, not before `now` nor before any earlier
    /// booking, at which `cost` units fit. May drop what has expired (which
    /// changes no decision) and state lying more than `horizon` ahead (the
    /// clock ran backwards). `cost` is at least 1 and at most the capacity.
    fn earliest(&self, state: &mut Self::State, now: Nanos, cost: u32, horizon: Nanos) -> Nanos;

    /// Book `cost` units at `at`, an instant no earlier than `earliest` said.
    fn book(&self, state: &mut Self::State, now: Nanos, at: Nanos, cost: u32) -> Grant;

    /// The admitted request turned out not to count: give back what it
    /// took, as far as that can be done without over-admitting (the units
    /// are counted once: none that came back by themselves, none a later
    /// booking relies on) and without letting a later arrival go before a
    /// booked one. `waiting`: requests are waiting on the key now (booked
    /// ahead of now, in its line).
    fn refund(&self, state: &mut Self::State, now: Nanos, grant: &Grant, waiting: bool);

    /// The admitted request's real cost was `actual`, not `grant.cost`:
    /// give back the excess as [`refund`](Self::refund) gives back a whole
    /// grant (never more than was taken, never what came back by itself),
    /// or charge the shortfall without refusal (never moving a booking).
    fn settle(
        &self,
        state: &mut Self::State,
        now: Nanos,
        grant: &Grant,
        actual: u32,
        waiting: bool,
    );

    /// A queued request left before its instant: give back what can be given
    /// back without ever over-admitting.
    fn cancel(&self, state: &mut Self::State, now: Nanos, grant: &Grant);

    /// Carry `state`, kept under `old`'s parameters, over to this algorithm's
    /// without making more capacity available than it had, now or at any
    /// instant a request is already booked at: nothing booked after the
    /// retune may pass what was booked before it. `booked` is the key's
    /// floor in the wait lines: none of its bookings, under any quota, goes
    /// later (0 when none waits).
    fn retune(&self, old: &Self, state: &mut Self::State, now: Nanos, booked: Nanos);

    /// How many units are available now, and how long until all are
    /// available again.
    fn remaining(&self, state: &Self::State, now: Nanos) -> (u32, Nanos);

    /// The most units a key can have available at once.
    fn capacity(&self) -> u32;

    /// Leave no more than the capacity less `spent` available now, as if
    /// `spent` units had been taken at `now`: for a key whose quota changed
    /// algorithm, carrying what it spent under the old one (see
    /// [`Table::carry_from`](super::table::Table::carry_from)). Never frees
    /// anything, so applying it twice takes no more than once.
    fn hold_spent(&self, state: &mut Self::State, now: Nanos, spent: u32);

    /// Leave nothing available at `at` (nor before): for a key that moves
    /// to this quota from another, whose spending is not known here, and
    /// whose last request may be booked at `at`. Never frees anything.
    fn fill_until(&self, state: &mut Self::State, at: Nanos);
}
