//! Approximate sliding window: two fixed windows, the previous one weighted
//! by how much of it the rolling window still covers.
//!
//! The count at `t`, in the aligned window `[end - window, end)`, is
//! `previous × (end - t) / window + current`: the previous window's
//! admissions are taken to be spread evenly over it. Its state is a few
//! numbers whatever the limit, where the exact window keeps every
//! admission; the price is the assumption. Never more than `limit` in an
//! aligned window (as a fixed window), never more than twice `limit` in a
//! rolling one (the previous window's admissions all at its end), and
//! about `limit` when traffic is steady.
//!
//! Decisions compare `previous × (end - t) + (current + cost) × window`
//! with `limit × window` in 128 bits: exact. The Redis script does the
//! same sums in microseconds, exactly too (`mul_div` in `admit.lua`), so
//! the two decide alike and an instant one works out is the other's
//! rounded up to the microsecond.

use super::fixed_window::FixedWindow;
use super::{Grant, Meter};
use crate::clock::Nanos;
use crate::store::Idle;

/// What the two latest windows counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// When the window `current` counts in ends.
    end: Nanos,
    /// A window after `end`: the current window weighs nothing from then
    /// on, which the store can tell without knowing the window.
    idle_at: Nanos,
    /// The latest instant booked: strict FIFO, which a refund must not
    /// undo by letting a newcomer in before a waiter.
    latest: Nanos,
    previous: u32,
    current: u32,
}

impl Idle for Counts {
    #[inline]
    fn is_idle(&self, now: Nanos) -> bool {
        self.idle_at <= now
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlidingCounter {
    windows: FixedWindow,
    limit: u32,
    window: Nanos,
}

impl SlidingCounter {
    pub(crate) fn new(limit: u32, window: Nanos, epoch_offset: Nanos) -> Self {
        let windows = FixedWindow::new(limit, window, epoch_offset);
        Self {
            windows,
            limit,
            window: window.max(1),
        }
    }

    /// Move `counts` forward to the window holding `t`, when it is behind.
    fn roll(&self, counts: &mut Counts, t: Nanos) {
        let end = self.windows.end_of(t);
        if counts.end >= end {
            return;
        }
        counts.previous = if counts.end.saturating_add(self.window) == end {
            counts.current
        } else {
            0
        };
        counts.current = 0;
        counts.end = end;
        counts.idle_at = end.saturating_add(self.window);
    }

    /// What `counts`, kept under these parameters, may have counted in
    /// `[from, to)`: the two windows it knows, where they overlap it, and
    /// every older window overlapping it at the whole limit.
    fn counted_in(&self, counts: &Counts, from: Nanos, to: Nanos) -> u64 {
        let (end, w) = (counts.end, self.window);
        // Window `j` back from the counts' own (0) is
        // `[end - (j + 1)·w, end - j·w)`.
        let overlaps = |j: u64| {
            end.saturating_sub(j.saturating_mul(w)) > from
                && end.saturating_sub((j + 1).saturating_mul(w)) < to
        };
        let mut sum = 0u64;
        if overlaps(0) {
            sum += u64::from(counts.current);
        }
        if overlaps(1) {
            sum += u64::from(counts.previous);
        }
        if end > from {
            // j from the first whose end is past `from`... back to the
            // last whose start is before `to`, from 2 on.
            let last = (end - from).div_ceil(w) - 1;
            let first = (end.saturating_sub(to) / w).max(2);
            if last >= first {
                sum = sum.saturating_add(u64::from(self.limit).saturating_mul(last - first + 1));
            }
        }
        sum
    }

    /// The count at `t` in `counts`' window, rounded up.
    fn count_at(&self, counts: &Counts, t: Nanos) -> u64 {
        let w = u128::from(self.window);
        let weighted = u128::from(counts.previous) * u128::from(counts.end.saturating_sub(t));
        let count = weighted.div_ceil(w) + u128::from(counts.current);
        u64::try_from(count).unwrap_or(u64::MAX)
    }

    /// The earliest instant not before `from`, inside `counts`' window or
    /// the next, at which `cost` fits.
    fn first_fit(&self, counts: &Counts, from: Nanos, cost: u32) -> Nanos {
        let w = u128::from(self.window);
        let limit = u128::from(self.limit);
        let start = counts.end.saturating_sub(self.window);
        let from = from.max(start);
        let wanted = u128::from(counts.current) + u128::from(cost);
        if wanted <= limit {
            if counts.previous == 0 {
                return from;
            }
            // previous × (end - t) ≤ (limit - wanted) × window.
            let span = (limit - wanted) * w / u128::from(counts.previous);
            let at = u128::from(counts.end).saturating_sub(span);
            return from.max(u64::try_from(at).unwrap_or(0));
        }
        // Not in this window: in the next, where this one's count is the
        // previous and nothing is current (`cost` is at most the limit).
        let next_end = counts.end.saturating_add(self.window);
        if counts.current == 0 {
            return counts.end;
        }
        let span = (limit - u128::from(cost)) * w / u128::from(counts.current);
        let at = u128::from(next_end).saturating_sub(span);
        counts.end.max(u64::try_from(at).unwrap_or(Nanos::MAX))
    }
}

impl Meter for SlidingCounter {
    type State = Counts;

    fn earliest(&self, counts: &mut Counts, now: Nanos, cost: u32, horizon: Nanos) -> Nanos {
        let ahead = now.saturating_add(horizon);
        if counts.latest > ahead || counts.end > self.windows.end_of(ahead) {
            // Booked further ahead than any wait allows: the clock ran
            // backwards. Start the key afresh.
            *counts = Counts::default();
        }
        self.roll(counts, now);
        // Not before the latest booking: strict FIFO, whatever a refund
        // gave back since.
        self.first_fit(counts, now.max(counts.latest), cost)
    }

    fn book(&self, counts: &mut Counts, _now: Nanos, at: Nanos, cost: u32) -> Grant {
        self.roll(counts, at);
        // `at` is never before the counts' window (see `earliest`); were it,
        // counting it in the later window still never frees anything.
        counts.current = counts.current.saturating_add(cost);
        counts.latest = counts.latest.max(at);
        Grant {
            at,
            cost,
            mark: counts.end,
        }
    }

    fn refund(&self, counts: &mut Counts, _now: Nanos, grant: &Grant, _waiting: bool) {
        // In the window that counted it, while it still weighs: what has
        // weighed out of the count came back by itself, and taking the cost
        // off the previous window takes off only its remaining weight.
        // Waiters keep their turn through `latest`.
        if counts.end == grant.mark {
            counts.current = counts.current.saturating_sub(grant.cost);
        } else if counts.end == grant.mark.saturating_add(self.window) {
            counts.previous = counts.previous.saturating_sub(grant.cost);
        }
    }

    fn settle(&self, counts: &mut Counts, _now: Nanos, grant: &Grant, actual: u32, _waiting: bool) {
        let count = if counts.end == grant.mark {
            &mut counts.current
        } else if counts.end == grant.mark.saturating_add(self.window) {
            &mut counts.previous
        } else {
            // Weighed out of the count: nothing to give back or charge.
            return;
        };
        *count = if actual < grant.cost {
            count.saturating_sub(grant.cost - actual)
        } else {
            count.saturating_add(actual - grant.cost)
        };
    }

    fn cancel(&self, counts: &mut Counts, now: Nanos, grant: &Grant) {
        self.refund(counts, now, grant, false);
    }

    fn retune(&self, old: &Self, counts: &mut Counts, now: Nanos, _booked: Nanos) {
        if old.window == self.window || counts.is_idle(now) {
            // Same boundaries: what was counted stays counted under the
            // new limit.
            return;
        }
        // New boundaries: the new window holding the latest instant booked
        // (or now), and the one before it, which weighs in it, each take
        // what the old windows overlapping them counted: the two the
        // counts know, and every older one at its whole limit (forgotten,
        // so perhaps full), as a fixed window's retune does. So nothing is
        // freed now, nor at any instant booked, that the old windows
        // counted, and the old admissions and the new ones together keep
        // the new quota (later, shorter new windows let them go sooner:
        // the new quota's pace).
        // And at least what the old count is then, which only falls
        // after it: a shorter new window can hold less of the old ones
        // than still weighs under the old.
        let latest = now.max(counts.latest);
        let end = self.windows.end_of(latest);
        let start = end.saturating_sub(self.window);
        let before = start.saturating_sub(self.window);
        let mut then = *counts;
        old.roll(&mut then, latest);
        let current = old
            .counted_in(counts, start, end)
            .max(old.count_at(&then, latest));
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        *counts = Counts {
            end,
            idle_at: end.saturating_add(self.window),
            latest: counts.latest,
            previous: clamp(old.counted_in(counts, before, start)),
            current: clamp(current),
        };
    }

    fn remaining(&self, counts: &Counts, now: Nanos) -> (u32, Nanos) {
        let mut counts = *counts;
        self.roll(&mut counts, now);
        let reset = if counts.current > 0 {
            counts.idle_at
        } else if counts.previous > 0 {
            counts.end
        } else {
            now
        };
        // Units booked in a later window leave this one's room as it is.
        let used = if counts.end == self.windows.end_of(now) {
            self.count_at(&counts, now)
        } else {
            u64::from(self.limit)
        };
        let free = u64::from(self.limit).saturating_sub(used);
        (u32::try_from(free).unwrap_or(0), reset.saturating_sub(now))
    }

    fn capacity(&self) -> u32 {
        self.limit
    }

    fn hold_spent(&self, counts: &mut Counts, now: Nanos, spent: u32) {
        self.roll(counts, now);
        let end = self.windows.end_of(now);
        if counts.end == end {
            // The count now is at least the current window's.
            counts.current = counts.current.max(spent);
        } else if counts.end == end.saturating_add(self.window) {
            // The next window is booked (a waiter): now's window is its
            // previous, and still weighs there.
            counts.previous = counts.previous.max(spent);
        }
        // Booked further ahead, now's window weighs nothing there.
    }

    fn fill_until(&self, counts: &mut Counts, at: Nanos) {
        self.roll(counts, at);
        if counts.end == self.windows.end_of(at) {
            counts.current = counts.current.max(self.limit);
        }
        counts.latest = counts.latest.max(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether `cost` more fits at `t`: the decision as the module's docs
    /// state it, with `counts` moved to `t`'s window first.
    fn fits(meter: &SlidingCounter, counts: &Counts, t: Nanos, cost: u32) -> bool {
        let mut counts = *counts;
        meter.roll(&mut counts, t);
        let w = u128::from(meter.window);
        let weighted = u128::from(counts.previous) * u128::from(counts.end - t);
        weighted + (u128::from(counts.current) + u128::from(cost)) * w
            <= u128::from(meter.limit) * w
    }

    fn admit(meter: &SlidingCounter, counts: &mut Counts, now: Nanos, cost: u32) -> bool {
        let at = meter.earliest(counts, now, cost, 0);
        if at > now {
            return false;
        }
        meter.book(counts, now, at, cost);
        true
    }

    proptest! {
        #[test]
        fn the_earliest_instant_is_the_first_that_fits(
            limit in 1u32..8,
            window in 1u64..40,
            steps in proptest::collection::vec((0u64..30, 1u32..8), 0..12),
            from in 0u64..30,
            cost in 1u32..8,
        ) {
            let meter = SlidingCounter::new(limit, window, 3);
            let cost = cost.min(limit);
            let mut counts = Counts::default();
            let mut now = 0;
            for (gap, c) in steps {
                now += gap;
                let at = meter.earliest(&mut counts, now, c.min(limit), 1_000);
                meter.book(&mut counts, now, at, c.min(limit));
            }
            let now = now + from;
            let mut probe = counts;
            let at = meter.earliest(&mut probe, now, cost, 1_000);
            let first = (now.max(counts.latest)..).find(|&t| fits(&meter, &counts, t, cost));
            prop_assert_eq!(Some(at), first);
        }

        #[test]
        fn an_aligned_window_admits_the_limit_and_a_rolling_one_twice_it_at_most(
            limit in 1u32..6,
            window in 2u64..30,
            gaps in proptest::collection::vec(0u64..6, 1..120),
        ) {
            let meter = SlidingCounter::new(limit, window, 0);
            let mut counts = Counts::default();
            let (mut now, mut admitted) = (0, Vec::new());
            for gap in gaps {
                now += gap;
                if admit(&meter, &mut counts, now, 1) {
                    admitted.push(now);
                }
            }
            for &t in &admitted {
                let aligned = t / window * window;
                let in_aligned = admitted.iter().filter(|&&a| a / window * window == aligned).count();
                prop_assert!(in_aligned <= limit as usize);
                let rolling = admitted.iter().filter(|&&a| a <= t && a + window > t).count();
                prop_assert!(rolling <= 2 * limit as usize);
            }
        }
    }

    #[test]
    fn steady_traffic_is_held_near_the_limit_in_every_rolling_window() {
        // 100 a second offered at twice that, one request every 5 ms: any
        // rolling second admits about 100.
        let meter = SlidingCounter::new(100, 1_000_000_000, 0);
        let mut counts = Counts::default();
        let mut admitted = Vec::new();
        for i in 0..2_000u64 {
            let now = i * 5_000_000;
            if admit(&meter, &mut counts, now, 1) {
                admitted.push(now);
            }
        }
        for start in (2_000_000_000..9_000_000_000u64).step_by(7_000_000) {
            let n = admitted
                .iter()
                .filter(|&&a| a >= start && a < start + 1_000_000_000)
                .count();
            assert!((95..=105).contains(&n), "{n} admitted from {start}");
        }
    }

    #[test]
    fn a_refund_lets_no_newcomer_before_a_waiter() {
        let meter = SlidingCounter::new(2, 1_000, 0);
        let mut counts = Counts::default();
        let first = meter.book(&mut counts, 0, 0, 1);
        meter.book(&mut counts, 0, 0, 1);
        // Full until the next window; a waiter books its first instant.
        let at = meter.earliest(&mut counts, 10, 1, 5_000);
        assert!(at >= 1_000);
        meter.book(&mut counts, 10, at, 1);
        meter.refund(&mut counts, 20, &first, true);
        assert!(meter.earliest(&mut counts, 20, 1, 5_000) >= at);
    }

    #[test]
    fn a_refund_takes_off_only_what_still_weighs() {
        // Booked in [0, 1000), given back at 1500: the previous window's
        // count loses it, so the count at 1500 drops by half a unit.
        let meter = SlidingCounter::new(4, 1_000, 0);
        let mut counts = Counts::default();
        let grants: Vec<_> = (0..4).map(|_| meter.book(&mut counts, 0, 0, 1)).collect();
        assert_eq!(meter.remaining(&counts, 1_500).0, 2);
        meter.refund(&mut counts, 1_500, &grants[0], false);
        assert_eq!(
            meter.count_at(
                &{
                    let mut c = counts;
                    meter.roll(&mut c, 1_500);
                    c
                },
                1_500
            ),
            2
        );
        // Two windows on, it weighs nothing and is not given back again.
        let mut later = counts;
        meter.roll(&mut later, 2_500);
        meter.refund(&mut later, 2_500, &grants[1], false);
        assert_eq!(later.previous, 0);
        assert!(counts.is_idle(2_000) && !counts.is_idle(1_999));
    }

    #[test]
    fn a_retune_to_other_windows_frees_nothing_the_old_ones_counted() {
        let old = SlidingCounter::new(10, 1_000, 0);
        let mut counts = Counts::default();
        for t in [100, 200, 1_100] {
            meter_book(&old, &mut counts, t);
        }
        // Windows of 4 s hold [0, 4 s): both old windows' three admissions.
        let new = SlidingCounter::new(10, 4_000, 0);
        new.retune(&old, &mut counts, 1_200, 0);
        assert_eq!(new.remaining(&counts, 1_200).0, 7);
        // Windows of 100 ms: the one holding now keeps the old count then
        // (the two of the old previous window weighed 0.85, rounded up,
        // and one), and the one before it holds the old window holding it.
        let mut counts = Counts::default();
        for t in [100, 200, 1_100] {
            meter_book(&old, &mut counts, t);
        }
        let short = SlidingCounter::new(10, 100, 0);
        short.retune(&old, &mut counts, 1_150, 0);
        assert_eq!((counts.previous, counts.current), (1, 3));
        assert_eq!(short.remaining(&counts, 1_150).0, 6);
        // From 1 s windows to 4 s ones after four full windows: the two
        // it knows and the two before them, forgotten, at their limit.
        let mut counts = Counts {
            end: 4_000,
            idle_at: 5_000,
            latest: 3_900,
            previous: 10,
            current: 10,
        };
        let long = SlidingCounter::new(100, 4_000, 0);
        long.retune(&old, &mut counts, 3_950, 0);
        assert_eq!((counts.previous, counts.current), (0, 40));
        // As admit.lua converts it (tests/redis_short_scripts.rs): three a
        // minute, all at 600 s, to six every two minutes at 601 s: three
        // in the new window, the forgotten minute before as full in the
        // one before, and the next fits 40 s in.
        let minute = SlidingCounter::new(3, 60_000, 0);
        let mut counts = Counts::default();
        for _ in 0..3 {
            meter_book(&minute, &mut counts, 600_000);
        }
        let two = SlidingCounter::new(6, 120_000, 0);
        two.retune(&minute, &mut counts, 601_000, 0);
        assert_eq!((counts.previous, counts.current), (3, 3));
        assert_eq!(two.earliest(&mut counts, 601_000, 1, 0), 640_000);
    }

    fn meter_book(meter: &SlidingCounter, counts: &mut Counts, t: Nanos) {
        let at = meter.earliest(counts, t, 1, 0);
        assert_eq!(at, t);
        meter.book(counts, t, at, 1);
    }

    #[test]
    fn what_was_spent_still_weighs_in_a_next_window_a_waiter_booked() {
        // 4 carried, a waiter of 7 booked into the next window at 1,250:
        // then the key turns out to have spent 10 now (admitted under the
        // old quota meanwhile). Counted in the previous window, the
        // waiter's instant would not fit; a newcomer goes after 1,700.
        let meter = SlidingCounter::new(10, 1_000, 0);
        let mut counts = Counts::default();
        meter.hold_spent(&mut counts, 100, 4);
        let at = meter.earliest(&mut counts, 100, 7, 10_000);
        assert_eq!(at, 1_250);
        meter.book(&mut counts, 100, at, 7);
        meter.hold_spent(&mut counts, 100, 10);
        assert_eq!(counts.previous, 10);
        assert_eq!(meter.earliest(&mut counts, 100, 1, 10_000), 1_800);
    }

    #[test]
    fn a_state_booked_past_the_horizon_starts_afresh() {
        let meter = SlidingCounter::new(1, 1_000, 0);
        let mut counts = Counts::default();
        meter.book(&mut counts, 50_000, 50_000, 1);
        assert_eq!(meter.earliest(&mut counts, 10_000, 1, 500), 10_000);
        // A window far ahead with nothing booked in it (what was spent,
        // carried there by a clock since stepped back) says the same.
        let mut counts = Counts::default();
        meter.hold_spent(&mut counts, 50_000, 1);
        assert_eq!(counts.latest, 0);
        assert_eq!(meter.earliest(&mut counts, 10_000, 1, 500), 10_000);
    }

    #[test]
    fn what_remains_is_all_back_when_both_windows_weigh_nothing() {
        let meter = SlidingCounter::new(4, 1_000, 0);
        let mut counts = Counts::default();
        meter.book(&mut counts, 100, 100, 2);
        // In its window: back a window after it ends.
        assert_eq!(meter.remaining(&counts, 500), (2, 1_500));
        // The next window, nothing in it: back when it ends; 2 × 0.5 weighs.
        assert_eq!(meter.remaining(&counts, 1_500), (3, 500));
        // Two windows on: all back now.
        assert_eq!(meter.remaining(&counts, 2_500), (4, 0));
    }

    #[test]
    fn a_settlement_reaches_a_booking_counted_in_the_previous_window() {
        // Booked for 3 in [0, 1000), settled at 0 once a booking in
        // [1000, 2000) moved the counts on: the previous window's count
        // takes it, so 1 × 0.5 weighs at 1,500, not 4 × 0.5.
        let meter = SlidingCounter::new(4, 1_000, 0);
        let mut counts = Counts::default();
        let first = meter.book(&mut counts, 100, 100, 3);
        meter.book(&mut counts, 1_200, 1_200, 1);
        assert_eq!(meter.remaining(&counts, 1_500).0, 1);
        meter.settle(&mut counts, 1_500, &first, 0, false);
        assert_eq!(counts.previous, 0);
        assert_eq!(meter.remaining(&counts, 1_500).0, 3);
    }

    #[test]
    fn nothing_is_counted_from_the_end_of_the_counts_on() {
        let meter = SlidingCounter::new(5, 1_000, 0);
        let mut counts = Counts::default();
        meter.book(&mut counts, 100, 100, 3);
        assert_eq!(meter.counted_in(&counts, 1_000, 2_000), 0);
        assert_eq!(meter.counted_in(&counts, 999, 2_000), 3);
    }
}
