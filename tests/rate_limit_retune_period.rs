//! A retune that changes a quota's period (same algorithm), as a reload
//! from "per minute" to "per hour" does: generated histories of requests
//! and clock moves on a few keys, the retune in the middle, and after it
//! every admission is checked against the new quota, counting every
//! admission of the key the old state still held at the retune. "Keys
//! keep what they have spent": what the old quota still counted counts in
//! the new one, so no window of the new quota holds more than its limit of
//! it. (What the old quota had let go of by the retune, a window that
//! ended or a booking that left the rolling window, is not counted again:
//! the state that held it may be gone, idle keys being dropped.)
//!
//! `TT_PROPTEST_CASES` sets the cases per property (default below).

#![cfg(feature = "test-util")]

#[path = "support/props.rs"]
mod props;
#[path = "support/rate_layer.rs"]
mod rate_layer;
#[path = "support/rate_model.rs"]
mod rate_model;

use std::time::Duration;

use proptest::prelude::*;
use rate_layer::{PERIODS_MS, Seen, agree, layer, request};
use rate_model::{Alg, MS, Spec, Windows};
use tokio::time::{self, Instant};
use tower::{Service, ServiceExt};

#[derive(Clone, Debug)]
enum Op {
    Request { key: u8, cost: u32 },
    Advance { ms: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (prop_oneof![3 => Just(0u8), 1 => Just(1u8)], 1..=3u32)
            .prop_map(|(key, cost)| Op::Request { key, cost }),
        2 => prop_oneof![0..300u64, 300..2_500u64].prop_map(|ms| Op::Advance { ms }),
    ];
    prop::collection::vec(op, 1..40)
}

/// Periods whose windows the layer's probe places (they divide its two
/// seconds): twice and four times longer or shorter.
const PERIODS: [u64; 3] = [500, PERIODS_MS[0], PERIODS_MS[1]];

/// An old quota and a new one of the same algorithm on another period.
fn retune(alg: Alg) -> impl Strategy<Value = (Spec, Spec)> {
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
struct Admitted {
    key: u8,
    at: u64,
    cost: u32,
    after: bool,
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
fn holds(
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
            let tat = mine().filter(|a| !a.after).fold(0u64, |tat, a| {
                tat.max(a.at) + u64::from(a.cost) * old_emission
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

/// Run `before`, the retune, then `after`, waiting up to `max_wait_ms`
/// (0: reject mode), and check every admission requested after the retune
/// at the instant it went; `Err` says what broke, with the history.
fn run(old: Spec, new: Spec, max_wait_ms: u64, before: &[Op], after: &[Op]) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let seen = Seen::default();
        let max_wait = Duration::from_millis(max_wait_ms);
        let (mut svc, handle, origin, windows) = layer(&[old], max_wait, &seen, false).await;
        let since_origin = |at: Instant| u64::try_from((at - origin).as_nanos()).unwrap();
        let now = || since_origin(Instant::now());
        // Each request: its key, cost and whether it came after the retune.
        let mut asked: Vec<(u8, u32, bool)> = Vec::new();
        let mut tasks = Vec::new();
        let mut trace = Vec::new();
        let mut retune_at = 0;
        for (retuned, ops) in [(false, before), (true, after)] {
            if retuned {
                handle.retune(vec![new.quota()], Vec::new()).unwrap();
                retune_at = now();
                trace.push(format!("retune to {new:?} at {retune_at} ns"));
            }
            for op in ops {
                match *op {
                    Op::Advance { ms } => time::sleep(Duration::from_millis(ms)).await,
                    Op::Request { key, cost } => {
                        let id = asked.len();
                        asked.push((key, cost, retuned));
                        let call = svc.ready().await.unwrap().call(request(key, cost, id));
                        tasks.push(tokio::spawn(call));
                        // Decided at once unless it waits.
                        for _ in 0..4 {
                            tokio::task::yield_now().await;
                        }
                        trace.push(format!("{} ns: #{id} key {key} cost {cost}", now()));
                    }
                }
            }
        }
        // Every waiter goes (or gives up) within its longest wait.
        time::sleep(max_wait + Duration::from_secs(1)).await;
        for task in tasks {
            let _ = task.await;
        }
        let mut all: Vec<Admitted> = seen
            .lock()
            .iter()
            .map(|&(id, at)| {
                let (key, cost, after) = asked[id];
                Admitted {
                    key,
                    at: since_origin(at),
                    cost,
                    after,
                }
            })
            .collect();
        all.sort_by_key(|a| a.at);
        // A waiter is seen on the millisecond tick after its instant; one
        // decided at once, at its instant.
        let slack = if max_wait_ms == 0 { 0 } else { MS };
        for a in all.iter().filter(|a| a.after) {
            // Everything that went by then, at the same instant too.
            let by_then: Vec<Admitted> = all.iter().copied().filter(|b| b.at <= a.at).collect();
            holds((&old, &new), windows, retune_at, &by_then, *a, slack).map_err(|e| {
                let went: Vec<String> = all
                    .iter()
                    .map(|a| {
                        format!(
                            "{} ns: key {} cost {} after {}",
                            a.at, a.key, a.cost, a.after
                        )
                    })
                    .collect();
                format!(
                    "{e}\nfrom {old:?}\n{}\nwent:\n{}",
                    trace.join("\n"),
                    went.join("\n")
                )
            })?;
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(props::config(256))]

    #[test]
    fn a_fixed_window_on_another_period_counts_what_it_spent(
        (old, new) in retune(Alg::Fixed), before in ops(), after in ops(),
    ) {
        agree(run(old, new, 0, &before, &after))?;
    }

    #[test]
    fn a_sliding_window_on_another_period_counts_what_it_spent(
        (old, new) in retune(Alg::Sliding), before in ops(), after in ops(),
    ) {
        agree(run(old, new, 0, &before, &after))?;
    }

    #[test]
    fn a_sliding_window_counter_on_another_period_counts_what_it_spent(
        (old, new) in retune(Alg::Counter), before in ops(), after in ops(),
    ) {
        agree(run(old, new, 0, &before, &after))?;
    }

    #[test]
    fn a_token_bucket_on_another_period_stays_within_it(
        (old, new) in retune(Alg::Bucket), before in ops(), after in ops(),
    ) {
        agree(run(old, new, 0, &before, &after))?;
    }

    /// The same with waiting: requests booked ahead before the retune go
    /// at their instants, and newcomers after them. (Not the counter: its
    /// waiters go at any instant, and one seen on the tick after a window
    /// ends cannot be told from one booked in the next.)
    #[test]
    fn waiting_requests_on_another_period_count_what_was_spent(
        (old, new) in prop_oneof![Just(Alg::Fixed), Just(Alg::Sliding), Just(Alg::Bucket)]
        .prop_flat_map(retune),
        max_wait_ms in prop::sample::select(vec![300u64, 1_000, 2_500]),
        before in ops(),
        after in ops(),
    ) {
        agree(run(old, new, max_wait_ms, &before, &after))?;
    }
}
