//! Model-based properties of `RateLimitLayer` in wait mode
//! (`with_max_wait`): generated histories of requests (each in a task of
//! its own), clock moves, dropped waiters, retunes, resets, new turns, the
//! switch and evictions, against the reference model in
//! `support/rate_model.rs`. Strict FIFO per key: each request reaches the
//! inner service at the instant the model books it (the earliest, not
//! before the key's earlier bookings, at which every quota admits it), a
//! request is refused exactly when that wait is over `max_wait` (with that
//! wait as `retry_after`), and a dropped waiter never lets more through.
//!
//! The driver moves the clock by whole milliseconds, and tokio's timers
//! fire on whole milliseconds: a waiter booked between two (a fixed window
//! starts where the wall clock says) is let through at the next one.
//!
//! `TT_PROPTEST_CASES` sets the cases per property (default below).

#![cfg(feature = "test-util")]

#[path = "support/props.rs"]
mod props;
#[path = "support/rate_layer.rs"]
mod rate_layer;
#[path = "support/rate_model.rs"]
mod rate_model;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use rate_layer::{
    Change, KEYS, Seen, agree, any_spec, as_told, change, changed, layer, request, spec, tables,
    verdict,
};
use rate_model::{Admission, Alg, MS, Model, Spec, Verdict, check_limits};
use tokio::task::JoinHandle;
use tokio::time::{self, Instant};
use tower::{BoxError, Service, ServiceExt};

/// Keeps this file within a few seconds in a debug build.
const DEFAULT_CASES: u32 = 96;

/// One step of a history.
#[derive(Clone, Debug)]
enum Op {
    /// A request on key `KEYS[key]` costing `cost` (0 counts as 1).
    Request {
        key: u8,
        cost: u32,
    },
    /// Let `ms` pass.
    Advance {
        ms: u64,
    },
    /// Let time pass to the next boundary of quota `quota`'s windows (a
    /// whole period on from the anchor), to the millisecond.
    ToBoundary {
        quota: usize,
    },
    /// Let the last refusal's `retry_after` pass, to the millisecond.
    ByRetry,
    /// Let time pass to the instant of waiter `which` (of those in line).
    ToWaiter {
        which: usize,
    },
    /// Drop waiter `which` (of those in line) before its instant.
    Drop {
        which: usize,
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

fn op(retunes: bool) -> BoxedStrategy<Op> {
    // Mostly one key, so that requests meet on it.
    let key = || prop_oneof![3 => Just(0u8), 1 => 1..3u8];
    let advance = prop_oneof![
        Just(0u64),
        1..400u64,
        prop::sample::select(vec![1u64, 1_000, 2_000]),
        400..2_500u64,
    ];
    let mut ops: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (
            12,
            (key(), 0..=3u32)
                .prop_map(|(key, cost)| Op::Request { key, cost })
                .boxed(),
        ),
        (3, advance.prop_map(|ms| Op::Advance { ms }).boxed()),
        (
            1,
            (0..3usize)
                .prop_map(|quota| Op::ToBoundary { quota })
                .boxed(),
        ),
        (1, Just(Op::ByRetry).boxed()),
        (
            2,
            (0..8usize).prop_map(|which| Op::ToWaiter { which }).boxed(),
        ),
        (3, (0..8usize).prop_map(|which| Op::Drop { which }).boxed()),
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

fn max_wait() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![300u64, 1_000, 2_500, 5_000])
}

/// The first whole millisecond at or after `t`: when tokio's timer lets a
/// waiter booked at `t` through.
fn to_ms(t: u64) -> u64 {
    t.div_ceil(MS) * MS
}

type Task = JoinHandle<Result<http::Response<()>, BoxError>>;

/// The history so far, for the failure message.
fn failure(trace: &[String], what: String) -> String {
    format!("{what}\n{}", trace.join("\n"))
}

/// Run `ops` on the layer and the model, waiting up to `max_wait_ms`;
/// `Err` describes the first difference or breach, with the history up to
/// it.
fn run(specs: &[Spec], max_wait_ms: u64, ops: &[Op]) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let max_wait = max_wait_ms * MS;
        let seen = Seen::default();
        let (mut svc, handle, origin, windows) =
            layer(specs, Duration::from_nanos(max_wait), &seen, false).await;
        let now = || u64::try_from((Instant::now() - origin).as_nanos()).unwrap();
        let mut model = Model::new(specs.to_vec(), windows);
        let mut trace = Vec::new();
        // Every admitted request: when the model says it goes.
        let mut expected: BTreeMap<usize, u64> = BTreeMap::new();
        let mut tasks: BTreeMap<usize, Task> = BTreeMap::new();
        let mut admissions: Vec<(usize, Admission)> = Vec::new();
        let mut carries = Vec::new();
        let mut next_table = specs.len();
        let mut epochs: Vec<Vec<(Spec, usize)>> = vec![specs.iter().copied().zip(0..).collect()];
        let mut segments = [0u64; 3];
        let mut last_retry = 0u64;
        for (step, op) in ops.iter().enumerate() {
            let t = now();
            let note = match *op {
                Op::Request { key, cost } => {
                    let req = request(key, cost, step);
                    let call = svc.ready().await.unwrap().call(req);
                    let want = as_told(
                        model.request_waiting(step, key, cost, t, max_wait),
                        &model.specs,
                    );
                    let task = tokio::spawn(call);
                    // Decided at once unless it waits: a few turns of the
                    // runtime see it through.
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                    // A waiter's instant is checked when it goes.
                    let got = if task.is_finished() {
                        Some(verdict(task.await.unwrap(), t, &model.specs))
                    } else {
                        tasks.insert(step, task);
                        None
                    };
                    let agreed = match (got, want) {
                        (None, Verdict::Admitted { at }) => at > t,
                        (Some(got), want) => got == want,
                        (None, _) => false,
                    };
                    if !agreed {
                        trace.push(format!("#{step} at {t} ns: {op:?}"));
                        let got = got.map_or(String::from("waits"), |v| format!("{v:?}"));
                        return Err(failure(&trace, format!("layer: {got}, model: {want:?}")));
                    }
                    match want {
                        Verdict::Admitted { at } => {
                            expected.insert(step, at);
                            if model.enabled {
                                admissions.push((
                                    step,
                                    Admission {
                                        key,
                                        at,
                                        cost,
                                        epoch: epochs.len() - 1,
                                        segment: segments[usize::from(key)],
                                        dropped: false,
                                        only: None,
                                    },
                                ));
                            }
                        }
                        Verdict::Refused { wait, .. } => last_retry = wait,
                        Verdict::TooCostly { .. } => {}
                    }
                    format!("{want:?}")
                }
                Op::Advance { ms } => {
                    time::sleep(Duration::from_millis(ms)).await;
                    String::new()
                }
                Op::ToBoundary { quota } => {
                    let period = model.specs[quota % model.specs.len()].period();
                    let shift = (period - windows.anchor % period) % period;
                    let next = ((t + shift) / period + 1) * period - shift;
                    time::sleep(Duration::from_nanos(to_ms(next) - t)).await;
                    String::new()
                }
                Op::ByRetry => {
                    time::sleep(Duration::from_nanos(to_ms(last_retry))).await;
                    String::new()
                }
                Op::ToWaiter { which } => {
                    let line = model.pending(t);
                    if line.is_empty() {
                        String::from("nobody in line")
                    } else {
                        let id = line[which % line.len()];
                        time::sleep(Duration::from_nanos(to_ms(expected[&id]) - t)).await;
                        format!("#{id}")
                    }
                }
                Op::Drop { which } => {
                    let line = model.pending(t);
                    if line.is_empty() {
                        String::from("nobody in line")
                    } else {
                        let id = line[which % line.len()];
                        let task = tasks.remove(&id).expect("a waiter's task");
                        task.abort();
                        if let Ok(outcome) = task.await {
                            return Err(failure(
                                &trace,
                                format!("#{step}: waiter #{id} had gone already: {outcome:?}"),
                            ));
                        }
                        model.drop_waiter(id, t);
                        expected.remove(&id);
                        format!("#{id}")
                    }
                }
                Op::Retune { ref change } => {
                    let new = changed(&model.specs, change);
                    let quotas = new.iter().map(Spec::quota).collect();
                    handle.retune(quotas, Vec::new()).unwrap();
                    let carried = model.retune(new.clone(), t);
                    let tabled = tables(&epochs[epochs.len() - 1], &new, &mut next_table);
                    epochs.push(tabled);
                    // Units in use carried over count in the new quota.
                    let epoch = epochs.len() - 1;
                    carries.extend(Admission::carried(&carried, t, epoch, &segments));
                    for (key, q, at, units) in model.opened_turns.drain(..) {
                        let opened = [(key, q, units)];
                        carries.extend(Admission::carried(&opened, at, epoch, &segments));
                    }
                    format!("{:?}", model.specs)
                }
                Op::Reset { key } => {
                    handle.reset(&[KEYS[usize::from(key)]]);
                    model.reset(key, t);
                    segments[usize::from(key)] += 1;
                    String::new()
                }
                Op::NewTurn { key } => {
                    if model.new_turn_is_unknowable(key, t) {
                        String::from("skipped: the model cannot tell")
                    } else {
                        handle.new_turn(&[KEYS[usize::from(key)]]);
                        model.new_turn(key, t);
                        segments[usize::from(key)] += 1;
                        String::new()
                    }
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
            trace.push(format!("#{step} at {t} ns: {op:?} {note}"));
            settle(origin, now(), &expected, &seen, &trace).await?;
        }
        // Everyone still in line goes in its turn.
        if let Some(&last) = model.pending(now()).iter().map(|id| &expected[id]).max() {
            time::sleep(Duration::from_nanos(to_ms(last) - now())).await;
        }
        settle(origin, now(), &expected, &seen, &trace).await?;
        for (id, task) in tasks {
            if let Err(e) = task.await.unwrap() {
                return Err(failure(&trace, format!("waiter #{id} failed: {e}")));
            }
        }
        if seen.lock().len() != expected.len() {
            let seen = seen.lock().clone();
            return Err(failure(
                &trace,
                format!(
                    "{} let through, expected {expected:?}: {seen:?}",
                    seen.len()
                ),
            ));
        }
        let admissions: Vec<Admission> = admissions
            .into_iter()
            .map(|(id, a)| Admission {
                dropped: !expected.contains_key(&id),
                ..a
            })
            .chain(carries)
            .collect();
        check_limits(&admissions, &epochs, windows).map_err(|breach| failure(&trace, breach))
    })
}

/// Let the runtime run every task due by `now`, then check that exactly
/// the requests the model has let through by then reached the inner
/// service, each at its instant.
async fn settle(
    origin: Instant,
    now: u64,
    expected: &BTreeMap<usize, u64>,
    seen: &Seen,
    trace: &[String],
) -> Result<(), String> {
    let due = expected.values().filter(|&&at| at <= now).count();
    // A hang guard: each waiter goes in a turn or two of the runtime.
    for _ in 0..(8 + 4 * expected.len()) {
        if seen.lock().len() >= due {
            break;
        }
        tokio::task::yield_now().await;
    }
    let seen: Vec<(usize, Instant)> = seen.lock().clone();
    for &(id, at) in &seen {
        let at = u64::try_from((at - origin).as_nanos()).unwrap();
        match expected.get(&id) {
            Some(&want) if to_ms(want) == at => {}
            want => {
                return Err(failure(
                    trace,
                    format!("#{id} let through at {at} ns, expected at {want:?} (to the ms)"),
                ));
            }
        }
    }
    if seen.len() != due {
        return Err(failure(
            trace,
            format!(
                "{} let through by {now} ns, the model lets {due}: {expected:?}",
                seen.len()
            ),
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(props::config(DEFAULT_CASES))]

    /// One token bucket: waiters go at their GCRA instants, in order.
    #[test]
    fn waiters_on_a_token_bucket_go_as_the_model(
        quota in spec(Alg::Bucket), max_wait in max_wait(), ops in history(false),
    ) {
        agree(run(&[quota], max_wait, &ops))?;
    }

    /// One sliding window.
    #[test]
    fn waiters_on_a_sliding_window_go_as_the_model(
        quota in spec(Alg::Sliding), max_wait in max_wait(), ops in history(false),
    ) {
        agree(run(&[quota], max_wait, &ops))?;
    }

    /// One fixed window, aligned to the wall clock.
    #[test]
    fn waiters_on_a_fixed_window_go_as_the_model(
        quota in spec(Alg::Fixed), max_wait in max_wait(), ops in history(false),
    ) {
        agree(run(&[quota], max_wait, &ops))?;
    }

    /// One sliding window counter, aligned as a fixed window.
    #[test]
    fn waiters_on_a_sliding_window_counter_go_as_the_model(
        quota in spec(Alg::Counter), max_wait in max_wait(), ops in history(false),
    ) {
        agree(run(&[quota], max_wait, &ops))?;
    }

    /// One turn budget: a full turn's waiters wait for it to go stale.
    #[test]
    fn waiters_on_a_turn_budget_go_as_the_model(
        quota in spec(Alg::Turn), max_wait in max_wait(), ops in history(false),
    ) {
        agree(run(&[quota], max_wait, &ops))?;
    }

    /// Two or three quotas of any algorithms: a waiter goes when all admit.
    #[test]
    fn waiters_on_several_quotas_go_as_the_model(
        quotas in prop::collection::vec(any_spec(), 2..=3),
        max_wait in max_wait(),
        ops in history(false),
    ) {
        agree(run(&quotas, max_wait, &ops))?;
    }

    /// Retunes and new turns while requests wait: those booked before keep
    /// their instants, those booked after go after them.
    #[test]
    fn waiters_across_retunes_go_as_the_model(
        quotas in prop::collection::vec(any_spec(), 1..=3),
        max_wait in max_wait(),
        ops in history(true),
    ) {
        agree(run(&quotas, max_wait, &ops))?;
    }
}
