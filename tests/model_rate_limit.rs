//! Model-based properties of `RateLimitLayer` in reject mode: generated
//! histories of requests, clock moves, retunes, resets, new turns, the
//! switch and evictions, run against the layer (paused tokio time) and
//! against the reference model in `support/rate_model.rs`. Every decision
//! and every `retry_after` must match exactly, and every window of every
//! quota must hold its limit (checked on the admissions alone).
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
use rate_layer::{
    Change, KEYS, PERIODS_MS, Seen, agree, any_spec, as_told, change, changed, layer, request,
    spec, tables, verdict,
};
use rate_model::{Admission, Alg, MS, Model, Spec, Verdict, check_limits};
use tokio::time::{self, Instant};
use tower::{Service, ServiceExt};

/// One step of a history.
#[derive(Clone, Debug)]
enum Op {
    /// A request on key `KEYS[key]` costing `cost` (0 counts as 1).
    Request {
        key: u8,
        cost: u32,
    },
    /// Move the clock on by `ns`.
    Advance {
        ns: u64,
    },
    /// Move the clock to the next boundary of quota `quota`'s windows (a
    /// whole period on from the anchor), `nudge` ns off it.
    ToBoundary {
        quota: usize,
        nudge: i8,
    },
    /// Move the clock on by the last refusal's `retry_after`, `nudge` ns
    /// off it.
    ByRetry {
        nudge: i8,
    },
    /// Retune the quotas.
    Retune {
        change: Change,
    },
    Reset {
        key: u8,
    },
    NewTurn {
        key: u8,
    },
    Switch {
        on: bool,
    },
    Evict,
}

fn nudge() -> impl Strategy<Value = i8> {
    prop_oneof![Just(0i8), Just(-1i8), Just(1i8)]
}

fn op(retunes: bool) -> BoxedStrategy<Op> {
    // Mostly one key, so that requests meet on it.
    let key = || prop_oneof![3 => Just(0u8), 1 => 1..3u8];
    let advance = prop_oneof![
        Just(0u64),
        (1..2_500u64).prop_map(|ms| ms * MS),
        1..3_000_000_000u64,
        prop::sample::select(PERIODS_MS.to_vec()).prop_map(|ms| ms * MS),
    ];
    let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (
            8,
            (key(), 0..=3u32)
                .prop_map(|(key, cost)| Op::Request { key, cost })
                .boxed(),
        ),
        (4, advance.prop_map(|ns| Op::Advance { ns }).boxed()),
        (
            2,
            (0..3usize, nudge())
                .prop_map(|(quota, nudge)| Op::ToBoundary { quota, nudge })
                .boxed(),
        ),
        (2, nudge().prop_map(|nudge| Op::ByRetry { nudge }).boxed()),
        (1, key().prop_map(|key| Op::Reset { key }).boxed()),
        (1, any::<bool>().prop_map(|on| Op::Switch { on }).boxed()),
        (1, Just(Op::Evict).boxed()),
    ];
    if retunes {
        ops.push((3, change().prop_map(|change| Op::Retune { change }).boxed()));
        ops.push((1, key().prop_map(|key| Op::NewTurn { key }).boxed()));
    }
    prop::strategy::Union::new_weighted(ops).boxed()
}

fn history(retunes: bool) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(retunes), 1..60)
}

/// Run `ops` on the layer and the model; `Err` describes the first
/// difference or breach, with the history up to it.
fn run(specs: &[Spec], ops: &[Op], global: bool) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let seen = Seen::default();
        let (mut svc, handle, origin, windows) = layer(specs, Duration::ZERO, &seen, global).await;
        let now = || u64::try_from((Instant::now() - origin).as_nanos()).unwrap();
        // The key's parts, as the handle names it.
        let parts = |key: u8| {
            if global {
                vec![]
            } else {
                vec![KEYS[usize::from(key)]]
            }
        };
        let mut model = Model::new(specs.to_vec(), windows);
        let mut trace = Vec::new();
        let mut admissions = Vec::new();
        let mut next_table = specs.len();
        let mut epochs: Vec<Vec<(Spec, usize)>> = vec![specs.iter().copied().zip(0..).collect()];
        // Each key's segment of history: it moves on at its resets and new turns.
        let mut segments = [0u64; 3];
        let mut last_retry = 0u64;
        for (step, op) in ops.iter().enumerate() {
            let note = match *op {
                Op::Request { key, cost } => {
                    let key = if global { 0 } else { key };
                    let t = now();
                    let req = request(key, cost, step);
                    let outcome = svc.ready().await.unwrap().call(req).await;
                    let got = verdict(outcome, t, &model.specs);
                    let want = as_told(model.request(key, cost, t, 0).0, &model.specs);
                    if got != want {
                        trace.push(format!("#{step} at {t} ns: {op:?}"));
                        return Err(format!(
                            "layer: {got:?}, model: {want:?}\n{}",
                            trace.join("\n")
                        ));
                    }
                    if let Verdict::Refused { wait, .. } = got {
                        last_retry = wait;
                    }
                    if matches!(got, Verdict::Admitted { .. }) && model.enabled {
                        admissions.push(Admission {
                            key,
                            at: t,
                            cost,
                            epoch: epochs.len() - 1,
                            segment: segments[usize::from(key)],
                            dropped: false,
                            only: None,
                        });
                    }
                    format!("{got:?}")
                }
                Op::Advance { ns } => {
                    time::advance(Duration::from_nanos(ns)).await;
                    String::new()
                }
                Op::ToBoundary { quota, nudge } => {
                    let period = model.specs[quota % model.specs.len()].period();
                    let t = now();
                    let shift = (period - windows.anchor % period) % period;
                    let next = ((t + shift) / period + 1) * period - shift;
                    let by = (next - t).saturating_add_signed(i64::from(nudge));
                    time::advance(Duration::from_nanos(by)).await;
                    format!("by {by} ns")
                }
                Op::ByRetry { nudge } => {
                    let by = last_retry.saturating_add_signed(i64::from(nudge));
                    time::advance(Duration::from_nanos(by)).await;
                    format!("by {by} ns")
                }
                Op::Retune { ref change } => {
                    let new = changed(&model.specs, change);
                    let quotas = new.iter().map(Spec::quota).collect();
                    handle.retune(quotas, Vec::new()).unwrap();
                    let carried = model.retune(new.clone(), now());
                    let tabled = tables(&epochs[epochs.len() - 1], &new, &mut next_table);
                    epochs.push(tabled);
                    // Units in use carried over count in the new quota.
                    let epoch = epochs.len() - 1;
                    admissions.extend(Admission::carried(&carried, now(), epoch, &segments));
                    format!("{:?}", model.specs)
                }
                Op::Reset { key } => {
                    let key = if global { 0 } else { key };
                    handle.reset(&parts(key));
                    model.reset(key, now());
                    segments[usize::from(key)] += 1;
                    String::new()
                }
                Op::NewTurn { key } => {
                    let key = if global { 0 } else { key };
                    handle.new_turn(&parts(key));
                    model.new_turn(key, now());
                    segments[usize::from(key)] += 1;
                    String::new()
                }
                Op::Switch { on } => {
                    handle.set_enabled(on);
                    model.enabled = on;
                    String::new()
                }
                Op::Evict => {
                    // Only idle state goes, which decides nothing: the model
                    // does nothing.
                    let evicted = handle.evict_idle();
                    format!("{evicted} evicted")
                }
            };
            trace.push(format!("#{step} at {} ns: {op:?} {note}", now()));
        }
        check_limits(&admissions, &epochs, windows)
            .map_err(|breach| format!("{breach}\n{}", trace.join("\n")))
    })
}

/// Keeps this file within a few seconds in a debug build.
const DEFAULT_CASES: u32 = 128;

proptest! {
    #![proptest_config(props::config(DEFAULT_CASES))]

    /// One token bucket: decisions and waits as textbook GCRA says.
    #[test]
    fn a_token_bucket_decides_as_the_model(quota in spec(Alg::Bucket), ops in history(false)) {
        agree(run(&[quota], &ops, false))?;
    }

    /// One sliding window: decisions and waits from the admission log.
    #[test]
    fn a_sliding_window_decides_as_the_model(quota in spec(Alg::Sliding), ops in history(false)) {
        agree(run(&[quota], &ops, false))?;
    }

    /// One fixed window, aligned to the wall clock.
    #[test]
    fn a_fixed_window_decides_as_the_model(quota in spec(Alg::Fixed), ops in history(false)) {
        agree(run(&[quota], &ops, false))?;
    }

    #[test]
    fn a_sliding_window_counter_decides_as_the_model(
        quota in spec(Alg::Counter),
        ops in history(false),
    ) {
        agree(run(&[quota], &ops, false))?;
    }

    /// One turn budget, whose turns go stale after their period.
    #[test]
    fn a_turn_budget_decides_as_the_model(quota in spec(Alg::Turn), ops in history(false)) {
        agree(run(&[quota], &ops, false))?;
    }

    /// Two or three quotas of any algorithms on each key, some counting
    /// requests: all admit or nothing is taken, and a refusal names the
    /// first quota with the longest wait.
    #[test]
    fn several_quotas_decide_as_the_model(
        quotas in prop::collection::vec(any_spec(), 2..=3),
        ops in history(false),
    ) {
        agree(run(&quotas, &ops, false))?;
    }

    /// Retunes (tighter and looser limits and bursts) and new turns between
    /// the requests, one quota of any algorithm: keys keep what they spent.
    #[test]
    fn a_retuned_quota_decides_as_the_model(quota in any_spec(), ops in history(true)) {
        agree(run(&[quota], &ops, false))?;
    }

    /// Retunes and new turns over several quotas.
    #[test]
    fn retuned_quotas_decide_as_the_model(
        quotas in prop::collection::vec(any_spec(), 2..=3),
        ops in history(true),
    ) {
        agree(run(&quotas, &ops, false))?;
    }

    /// One token bucket on one key for every request, which it admits by
    /// one compare-and-swap (until a retune to another algorithm).
    #[test]
    fn a_global_token_bucket_decides_as_the_model(quota in spec(Alg::Bucket), ops in history(true)) {
        agree(run(&[quota], &ops, true))?;
    }
}
