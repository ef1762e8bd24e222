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
#[path = "support/retune_period.rs"]
mod retune_period;

use std::time::Duration;

use proptest::prelude::*;
use rate_layer::{PERIODS_MS, Seen, agree, layer, request};
use rate_model::{Alg, MS, Spec};
use retune_period::{Admitted, Op, holds, ops, retune};
use tokio::time::{self, Instant};
use tower::{Service, ServiceExt};

/// Run `before`, the retune of the first quota from `old` to `new`, then
/// `after`, waiting up to `max_wait_ms` (0: reject mode), with `other` a
/// second quota (its waits book the first quota's units anywhere in a
/// window), which the retune keeps or drops; check every admission
/// requested after the retune at the instant it went; `Err` says what
/// broke, with the history.
fn run(
    (old, new): (Spec, Spec),
    (other, kept): (Option<Spec>, bool),
    max_wait_ms: u64,
    before: &[Op],
    after: &[Op],
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let seen = Seen::default();
        let max_wait = Duration::from_millis(max_wait_ms);
        let specs: Vec<Spec> = std::iter::once(old).chain(other).collect();
        let (mut svc, handle, origin, windows) = layer(&specs, max_wait, &seen, false).await;
        let since_origin = |at: Instant| u64::try_from((at - origin).as_nanos()).unwrap();
        let now = || since_origin(Instant::now());
        // Each request: its key, cost and whether it came after the retune.
        let mut asked: Vec<(u8, u32, bool)> = Vec::new();
        let mut tasks = Vec::new();
        let mut trace = Vec::new();
        let mut retune_at = 0;
        for (retuned, ops) in [(false, before), (true, after)] {
            if retuned {
                let other = other.filter(|_| kept);
                let quotas = std::iter::once(new).chain(other).map(|s| s.quota());
                handle.retune(quotas.collect(), Vec::new()).unwrap();
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
        agree(run((old, new), (None, false), 0, &before, &after))?;
    }

    #[test]
    fn a_sliding_window_on_another_period_counts_what_it_spent(
        (old, new) in retune(Alg::Sliding), before in ops(), after in ops(),
    ) {
        agree(run((old, new), (None, false), 0, &before, &after))?;
    }

    #[test]
    fn a_sliding_window_counter_on_another_period_counts_what_it_spent(
        (old, new) in retune(Alg::Counter), before in ops(), after in ops(),
    ) {
        agree(run((old, new), (None, false), 0, &before, &after))?;
    }

    #[test]
    fn a_token_bucket_on_another_period_stays_within_it(
        (old, new) in retune(Alg::Bucket), before in ops(), after in ops(),
    ) {
        agree(run((old, new), (None, false), 0, &before, &after))?;
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
        agree(run((old, new), (None, false), max_wait_ms, &before, &after))?;
    }
}

proptest! {
    // Its finding needs the second quota dropped, a fixed window and the
    // right waits: more cases.
    #![proptest_config(props::config(2048))]

    /// The same behind a second quota, a token bucket whose waits book the
    /// first quota's units inside its windows, ahead of now in the window
    /// holding now too; the retune keeps it or drops it (then only
    /// the first quota keeps newcomers apart from those waiters).
    #[test]
    fn waiting_behind_another_quota_on_another_period_counts_what_was_spent(
        (old, new) in prop_oneof![Just(Alg::Fixed), Just(Alg::Sliding), Just(Alg::Bucket)]
        .prop_flat_map(retune),
        // Emissions of whole milliseconds: its waiters go on a tick, so
        // the instant seen is the instant booked, and no window edge falls
        // between the two.
        other in (
            prop::sample::select(vec![1u32, 2, 4, 5]),
            prop::sample::select(PERIODS_MS.to_vec()),
            1..=6u32,
        )
            .prop_map(|(limit, period_ms, burst)| Spec::new(Alg::Bucket, limit, period_ms, burst, false)),
        kept in any::<bool>(),
        max_wait_ms in prop::sample::select(vec![300u64, 1_000, 2_500]),
        before in ops(),
        after in ops(),
    ) {
        agree(run((old, new), (Some(other), kept), max_wait_ms, &before, &after))?;
    }
}
