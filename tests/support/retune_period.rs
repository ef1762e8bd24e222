//! What `rate_limit_retune_period.rs` and `redis_retune_period.rs` share:
//! histories around a retune to another period, and what the new quota
//! must hold after it.
#![allow(dead_code, unreachable_pub)]

use proptest::prelude::*;

use super::rate_layer::PERIODS_MS;
use super::rate_model::{Alg, Spec, Windows};

#[derive(Clone, Debug)]
pub enum Op {
    /// A request on key `key` costing `cost`.
    Request { key: u8, cost: u32 },
    /// The clock moves on.
    Advance { ms: u64 },
}

pub fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (prop_oneof![3 => Just(0u8), 1 => Just(1u8)], 1..=3u32)
            .prop_map(|(key, cost)| Op::Request { key, cost }),
        2 => prop_oneof![0..300u64, 300..2_500u64].prop_map(|ms| Op::Advance { ms }),
    ];
    prop::collection::vec(op, 1..40)
}

/// Periods whose windows the layer's probe places (they divide its two
/// seconds): twice and four times longer or shorter.
pub const PERIODS: [u64; 3] = [500, PERIODS_MS[0], PERIODS_MS[1]];

/// An old quota and a new one of the same algorithm on another period.
pub fn retune(alg: Alg) -> impl Strategy<Value = (Spec, Spec)> {
    (
        0..PERIODS.len(),
        1..PERIODS.len(),
        1..=5u32,
        1..=5u32,
        1..=6u32,
        1..=6u32,
    )
        .prop_map(
            move |(from, step, old_limit, new_limit, old_burst, new_burst)| {
                let to = (from + step) % PERIODS.len();
                (
                    Spec::new(alg, old_limit, PERIODS[from], old_burst, false),
                    Spec::new(alg, new_limit, PERIODS[to], new_burst, false),
                )
            },
        )
}

/// One admission: its key, instant (ns from the limiter's origin), cost,
/// and whether it came after the retune.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    pub key: u8,
    pub at: u64,
    pub cost: u32,
    pub after: bool,
}

/// Whether the old quota still counted admission `a` at the retune, at
/// `retuned` ns.
fn remembered(old: &Spec, windows: Windows, retuned: u64, a: &Admitted) -> bool {
    let period = old.period();
    match old.alg {
        // Its window, or one booked ahead.
        Alg::Fixed => windows.index(period, a.at) >= windows.index(period, retuned),
        // The previous window weighs too.
        Alg::Counter => windows.index(period, a.at) + 1 >= windows.index(period, retuned),
        Alg::Sliding => a.at + period > retuned,
        Alg::Bucket | Alg::Turn => true,
    }
}

/// Whether `new` holds at the admission `last` (the latest of `all`, on
/// its key), counting the key's admissions since the retune and those
/// before it that the old quota still counted; `Err` says how not.
///
/// `slack`: how much later than booked an instant may be seen (a waiter
/// goes on tokio's next millisecond tick).
pub fn holds(
    (old, new): (&Spec, &Spec),
    windows: Windows,
    retuned: u64,
    all: &[Admitted],
    last: Admitted,
    slack: u64,
) -> Result<(), String> {
    let period = new.period();
    let limit = u64::from(new.limit);
    let mine = || {
        all.iter()
            .filter(|a| a.key == last.key && (a.after || remembered(old, windows, retuned, a)))
    };
    let t = last.at;
    match new.alg {
        Alg::Fixed => {
            let w = windows.index(period, t);
            let used: u64 = mine()
                .filter(|a| windows.index(period, a.at) == w)
                .map(|a| u64::from(a.cost))
                .sum();
            (used <= limit).then_some(()).ok_or(format!(
                "{used} units in the new window holding {t} ns, limit {limit}"
            ))
        }
        Alg::Sliding => {
            let used: u64 = mine()
                .filter(|a| a.at + period > t + slack)
                .map(|a| u64::from(a.cost))
                .sum();
            (used <= limit).then_some(()).ok_or(format!(
                "{used} units in the rolling window ending at {t} ns, limit {limit}"
            ))
        }
        Alg::Counter => {
            let w = windows.index(period, t);
            let sum = |index: u64| -> u64 {
                mine()
                    .filter(|a| windows.index(period, a.at) == index)
                    .map(|a| u64::from(a.cost))
                    .sum()
            };
            let previous = if w == 0 { 0 } else { sum(w - 1) };
            let current = sum(w);
            let end = windows.start(period, w + 1);
            let weighed = u128::from(previous) * u128::from(end - t)
                + u128::from(current) * u128::from(period);
            (weighed <= u128::from(limit) * u128::from(period))
                .then_some(())
                .ok_or(format!(
                    "previous window {previous}, current {current} at {t} ns \
                     ({} ns before its end), limit {limit}",
                    end - t
                ))
        }
        Alg::Bucket => {
            // What the old bucket had left at the retune (in ns of its
            // emission), replayed from the key's admissions under it; a
            // full bucket is a fresh one, the new burst.
            let old_emission = old.emission();
            // (Seen up to `slack` after booked: taken as booked that much
            // sooner, which leaves the old bucket no emptier than it was.)
            let tat = mine().filter(|a| !a.after).fold(0u64, |tat, a| {
                tat.max(a.at.saturating_sub(slack)) + u64::from(a.cost) * old_emission
            });
            let emission = new.emission();
            let burst = u128::from(new.burst);
            let (e1, e2) = (u128::from(old_emission), u128::from(emission));
            // In units of 1 / (e1 × e2): exact, where the library may round
            // what is owed up (never down).
            let left = if tat <= retuned {
                burst * e1 * e2
            } else {
                let tolerance = u128::from(old_emission) * u128::from(old.burst);
                let left_ns = tolerance.saturating_sub(u128::from(tat - retuned));
                (left_ns * e2).min(burst * e1 * e2)
            };
            let since: Vec<&Admitted> = mine().filter(|a| a.after).collect();
            // Since the retune: no more than what was left (at most the new
            // burst) and what refilled at the new rate; from any admission
            // after it on, no more than a burst and what refilled since.
            let used: u64 = since.iter().map(|a| u64::from(a.cost)).sum();
            let most = left + u128::from(t - retuned) * e1;
            if u128::from(used) * e1 * e2 > most {
                return Err(format!(
                    "{used} units since the retune at {retuned} ns to {t} ns, at most {:.3}",
                    most as f64 / (e1 * e2) as f64
                ));
            }
            for (i, from) in since.iter().enumerate() {
                let used: u64 = since[i..].iter().map(|a| u64::from(a.cost)).sum();
                let most = u64::from(new.burst) + (t - from.at.saturating_sub(slack)) / emission;
                if used > most {
                    return Err(format!(
                        "{used} units from {} ns to {t} ns, at most {most}",
                        from.at
                    ));
                }
            }
            Ok(())
        }
        Alg::Turn => Ok(()),
    }
}
