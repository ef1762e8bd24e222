//! Wait mode across a retune: requests booked before it keep their instants
//! and go first; requests booked after it are held to the new quota on top
//! of what was booked.

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{ALGORITHMS, Inner, conforms, quota, request};
use tokio::task::JoinHandle;
use tokio::time::{self, Instant};
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::{GlobalKey, HeaderKey};
use tower_throttle::rate_limit::{
    Algorithm, KeyPattern, Quota, RateLimitHandle, RateLimitLayer, Rule,
};

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

type Waiting = JoinHandle<Result<http::Response<()>, BoxError>>;

/// Book requests `seqs` on key `k` (each is booked when called) and run
/// each in its own task; returns the tasks, in booking order.
async fn book<S>(svc: &mut S, seqs: std::ops::Range<usize>) -> Vec<(usize, Waiting)>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
    S::Future: Send + 'static,
{
    let mut booked = Vec::new();
    for seq in seqs {
        let call = svc.ready().await.unwrap().call(request("k", seq));
        booked.push((seq, tokio::spawn(call)));
    }
    // Let every task poll once: each is asleep until its instant.
    tokio::task::yield_now().await;
    booked
}

/// Wait for every task; each must be admitted.
async fn finish(tasks: Vec<(usize, Waiting)>) {
    for (seq, task) in tasks {
        task.await
            .unwrap()
            .unwrap_or_else(|e| panic!("#{seq} refused: {e}"));
    }
}

/// The inner service's calls: their order, and their instants in ms after
/// `start`.
fn calls(inner: &Inner, start: Instant) -> (Vec<usize>, Vec<u64>) {
    let seen = inner.record.seen.lock().clone();
    let order = seen.iter().map(|&(seq, _)| seq).collect();
    let ms = seen
        .iter()
        .map(|&(_, at)| (at - start).as_millis() as u64)
        .collect();
    (order, ms)
}

fn token_bucket(per_second: u32, burst: u32) -> Quota {
    Quota::per_second(per_second)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// The repro from the report: 20 waiters at 100/s, a retune to 200/s, 20
/// more. The first 20 keep 0, 10, …, 190 ms; the next start 5 ms after the
/// last of them and follow at the new rate.
#[tokio::test(start_paused = true)]
async fn a_faster_retune_keeps_booked_waiters_ahead_and_mints_nothing() {
    let inner = Inner::new();
    let layer = RateLimitLayer::new(token_bucket(100, 1), GlobalKey).with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    let start = Instant::now();
    let mut tasks = book(&mut svc, 0..20).await;
    handle.set_default(vec![token_bucket(200, 1)]);
    tasks.extend(book(&mut svc, 20..40).await);
    finish(tasks).await;

    let (order, ms) = calls(&inner, start);
    assert_eq!(order, (0..40).collect::<Vec<_>>(), "call order");
    let expected: Vec<u64> = (0..20)
        .map(|i| 10 * i)
        .chain((0..20).map(|i| 195 + 5 * i))
        .collect();
    assert_eq!(ms, expected, "call instants, ms");
    // 10 booked before the retune plus 1 after it; 200/s allows 20.
    let in_window = ms.iter().filter(|&&t| (100..200).contains(&t)).count();
    assert_eq!(in_window, 11, "calls in [100, 200) ms");
}

/// A slower rate: the waiters keep their instants, and newcomers follow the
/// last of them at the new rate.
#[tokio::test(start_paused = true)]
async fn a_slower_retune_keeps_booked_instants_and_spaces_newcomers_after_them() {
    let inner = Inner::new();
    let layer = RateLimitLayer::new(token_bucket(100, 1), GlobalKey).with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    let start = Instant::now();
    let mut tasks = book(&mut svc, 0..20).await;
    handle.set_default(vec![token_bucket(50, 1)]);
    tasks.extend(book(&mut svc, 20..30).await);
    finish(tasks).await;

    let (order, ms) = calls(&inner, start);
    assert_eq!(order, (0..30).collect::<Vec<_>>(), "call order");
    let expected: Vec<u64> = (0..20)
        .map(|i| 10 * i)
        .chain((0..10).map(|i| 210 + 20 * i))
        .collect();
    assert_eq!(ms, expected, "call instants, ms");
}

/// A fixed-window boundary of `quota` on the layer's limiter, found by a
/// reject-mode twin filling a probe key (windows turn over at wall-clock
/// multiples of their length). A sliding window counter filled at once
/// admits again `ceil(period / limit)` into the next window, its previous
/// window then weighing one unit less than the limit.
async fn boundary(layer: &RateLimitLayer<HeaderKey>, probe: &str, quota: &Quota) -> Instant {
    let mut twin = layer.clone().layer(Inner::new());
    loop {
        let call = twin.ready().await.unwrap().call(request(probe, 0));
        if let Err(err) = call.await {
            let wait = err
                .downcast_ref::<RateLimited>()
                .expect("refused")
                .retry_after;
            return support::boundary_of(
                quota.algorithm(),
                quota.limit(),
                quota.period(),
                Instant::now() + wait,
            );
        }
    }
}

/// The changes a generic retune test goes through: to a faster quota, a
/// slower one, and (for windows) one with a longer period.
fn retunes(algorithm: Algorithm) -> Vec<(&'static str, Quota)> {
    let period = 100 * MS;
    vec![
        ("faster", quota(algorithm, 10, period)),
        ("slower", quota(algorithm, 2, period)),
        // 60/s over 400 ms: at least the old rate over any span.
        ("longer period", quota(algorithm, 24, 4 * period)),
    ]
}

/// For every algorithm, one quota or two, each kind of retune: 30 waiters
/// at 5 per 100 ms, some dropped before the retune and some after it, then
/// 30 more. Booked before goes before booked after; what was booked before
/// keeps its quota; what is booked after keeps the new one; and after a
/// faster retune everything, old and new, keeps the new quota together.
#[tokio::test(start_paused = true)]
async fn after_any_retune_newcomers_queue_behind_booked_waiters_and_keep_the_new_quota() {
    let period = 100 * MS;
    for algorithm in ALGORITHMS {
        for (change, new) in retunes(algorithm) {
            for several in [false, true] {
                let case = format!("{algorithm:?}, {change}, several quotas: {several}");
                let old = quota(algorithm, 5, period);
                // A second quota that never binds, of another algorithm.
                let loose = quota(Algorithm::SlidingWindow, 1_000, SECOND);
                let with = |q: Quota| if several { vec![q, loose] } else { vec![q] };
                let inner = Inner::new();
                // Reject mode: the probes' twin; the service waits.
                let layer =
                    RateLimitLayer::with_quotas(with(old), HeaderKey::new("x-key").unwrap());
                let handle = layer.handle();
                let old_boundary = boundary(&layer, "probe-old", &old).await;
                time::sleep_until(old_boundary).await;
                let mut svc = layer
                    .clone()
                    .with_max_wait(100 * SECOND)
                    .layer(inner.clone());

                let mut before = book(&mut svc, 0..30).await;
                // Dropped before the retune: one in the middle, and the
                // last (whose booking can be undone).
                for seq in [29, 12] {
                    let i = before.iter().position(|&(s, _)| s == seq).unwrap();
                    before.remove(i).1.abort();
                }
                time::sleep(3 * MS).await;
                handle.set_default(with(new));
                // Nor does a request that cannot wait pass them.
                let mut twin = layer.clone().layer(Inner::new());
                let refused = twin.ready().await.unwrap().call(request("k", 99)).await;
                assert!(
                    refused.is_err(),
                    "{case}: a reject-mode request passed the waiters"
                );
                let new_boundary = boundary(&layer, "probe-new", &new).await;
                let mut after = book(&mut svc, 30..60).await;
                // Dropped after the retune: an old waiter and a new one.
                for (tasks, seq) in [(&mut before, 20), (&mut after, 41)] {
                    let i = tasks.iter().position(|&(s, _)| s == seq).unwrap();
                    tasks.remove(i).1.abort();
                }
                let kept: Vec<usize> = before.iter().chain(&after).map(|&(s, _)| s).collect();
                finish(before).await;
                finish(after).await;

                let seen = inner.record.seen.lock().clone();
                let order: Vec<usize> = seen.iter().map(|&(s, _)| s).collect();
                assert_eq!(order, kept, "{case}: call order");
                let old_calls: Vec<Instant> = seen
                    .iter()
                    .filter(|&&(s, _)| s < 30)
                    .map(|&(_, t)| t)
                    .collect();
                let new_calls: Vec<Instant> = seen
                    .iter()
                    .filter(|&&(s, _)| s >= 30)
                    .map(|&(_, t)| t)
                    .collect();
                let last_old = *old_calls.iter().max().unwrap();
                assert!(
                    new_calls.iter().all(|&t| t >= last_old),
                    "{case}: a request booked after the retune went before one booked before it"
                );
                conforms(&old, old_boundary, &old_calls)
                    .unwrap_or_else(|e| panic!("{case}: before the retune: {e}"));
                conforms(&new, new_boundary, &new_calls)
                    .unwrap_or_else(|e| panic!("{case}: after the retune: {e}"));
                if change != "slower" {
                    // The old quota fits inside the new one, so together they
                    // must fit it too: nothing minted between the waiters.
                    let all: Vec<Instant> = seen.iter().map(|&(_, t)| t).collect();
                    conforms(&new, new_boundary, &all)
                        .unwrap_or_else(|e| panic!("{case}: old and new together: {e}"));
                }
            }
        }
    }
}

/// Turn budgets: waiters booked for the next turns keep their turns; a
/// larger budget lets newcomers into the turn already booked (behind its
/// waiters), a smaller one sends them to the next.
#[tokio::test(start_paused = true)]
async fn a_turn_budget_retune_keeps_booked_turns_and_counts_them() {
    let per_turn = |n| {
        Quota::per_turn(n)
            .unwrap()
            .with_stale_after(SECOND)
            .unwrap()
    };
    for (limit, expected_new) in [(6, [2000, 2000, 2000, 3000]), (2, [3000, 3000, 4000, 4000])] {
        let inner = Inner::new();
        let layer = RateLimitLayer::new(per_turn(4), GlobalKey).with_max_wait(100 * SECOND);
        let handle = layer.handle();
        let mut svc = layer.layer(inner.clone());
        let start = Instant::now();
        // 4 now, 4 when the turn goes stale at 1 s, 4 at 2 s; one of
        // those gives up before the retune.
        let mut tasks = book(&mut svc, 0..12).await;
        tasks.remove(10).1.abort();
        time::sleep(MS).await;
        handle.set_default(vec![per_turn(limit)]);
        tasks.extend(book(&mut svc, 12..16).await);
        finish(tasks).await;

        let (order, ms) = calls(&inner, start);
        let kept: Vec<usize> = (0..16).filter(|&s| s != 10).collect();
        assert_eq!(order, kept, "limit {limit}: order");
        assert_eq!(
            &ms[..11],
            &[0, 0, 0, 0, 1000, 1000, 1000, 1000, 2000, 2000, 2000]
        );
        assert_eq!(
            &ms[11..],
            &expected_new,
            "limit {limit}: newcomers' instants"
        );
    }
}

/// A key with waiters that moves to another rule (new, or kept from before),
/// or whose quota changes algorithm (a new table that knows nothing of the
/// old bookings), starts the new quota spent at its last waiter's instant.
#[tokio::test(start_paused = true)]
async fn a_key_with_waiters_that_changes_rule_or_algorithm_queues_newcomers_behind_them() {
    let fast = |pattern| {
        Rule::new("fast", KeyPattern::parts([pattern]).unwrap()).with_quota(token_bucket(200, 1))
    };
    let sliding = quota(Algorithm::SlidingWindow, 1, 5 * MS);
    for change in ["new rule", "existing rule", "algorithm"] {
        let inner = Inner::new();
        let mut layer = RateLimitLayer::new(token_bucket(100, 1), HeaderKey::new("x-key").unwrap())
            .with_max_wait(10 * SECOND);
        if change == "existing rule" {
            // The rule's table is kept and retuned in place: only the key's
            // move to it can start it spent.
            layer = layer.with_rule(fast("other")).unwrap();
        }
        let handle: RateLimitHandle = layer.handle();
        let mut svc = layer.layer(inner.clone());
        let start = Instant::now();
        let mut tasks = book(&mut svc, 0..20).await;
        match change {
            "algorithm" => handle.set_default(vec![sliding]),
            _ => handle.set_rules(vec![fast("k")]).unwrap(),
        }
        tasks.extend(book(&mut svc, 20..30).await);
        finish(tasks).await;

        let (order, ms) = calls(&inner, start);
        assert_eq!(order, (0..30).collect::<Vec<_>>(), "{change}: order");
        // Spent at 190 ms: the new quota's first unit comes 5 ms later.
        let expected: Vec<u64> = (0..20)
            .map(|i| 10 * i)
            .chain((0..10).map(|i| 195 + 5 * i))
            .collect();
        assert_eq!(ms, expected, "{change}: call instants, ms");
    }
}

/// A reset takes effect at once, retune or not, whichever comes first: the
/// newcomer does not queue behind the old waiters.
#[tokio::test(start_paused = true)]
async fn a_reset_takes_effect_at_once_before_or_after_a_retune() {
    for reset_first in [false, true] {
        let inner = Inner::new();
        let layer = RateLimitLayer::new(token_bucket(100, 1), HeaderKey::new("x-key").unwrap())
            .with_max_wait(10 * SECOND);
        let handle = layer.handle();
        let mut svc = layer.layer(inner.clone());
        let start = Instant::now();
        let mut tasks = book(&mut svc, 0..20).await;
        if reset_first {
            handle.reset(&["k"]);
            tasks.extend(book(&mut svc, 20..21).await);
            time::sleep(20 * MS).await;
            // The same quota again: only the floor could hold anyone back.
            handle.set_default(vec![token_bucket(100, 1)]);
        } else {
            handle.set_default(vec![token_bucket(200, 1)]);
            handle.reset(&["k"]);
            tasks.extend(book(&mut svc, 20..21).await);
            time::sleep(20 * MS).await;
        }
        tasks.extend(book(&mut svc, 21..22).await);
        finish(tasks).await;
        let seen = inner.record.seen.lock().clone();
        let at = |seq| {
            let &(_, t) = seen.iter().find(|&&(s, _)| s == seq).unwrap();
            (t - start).as_millis()
        };
        assert_eq!(
            (at(20), at(21)),
            (0, 20),
            "reset first: {reset_first}: newcomers after the reset went at once"
        );
    }
}

/// A new turn refills turn budgets only: the floor that keeps the key's
/// other quotas in order after a retune stays.
#[tokio::test(start_paused = true)]
async fn a_new_turn_after_a_retune_keeps_newcomers_behind_the_waiters() {
    let turns = Quota::per_turn(1_000)
        .unwrap()
        .with_stale_after(Duration::from_secs(3_600))
        .unwrap();
    let window = |limit, period| quota(Algorithm::FixedWindow, limit, period);
    let inner = Inner::new();
    let layer = RateLimitLayer::with_quotas(
        vec![window(5, 100 * MS), turns],
        HeaderKey::new("x-key").unwrap(),
    );
    let handle = layer.handle();
    time::sleep_until(boundary(&layer, "probe", &window(5, 100 * MS)).await).await;
    let mut svc = layer.with_max_wait(100 * SECOND).layer(inner.clone());
    let mut tasks = book(&mut svc, 0..30).await;
    time::sleep(3 * MS).await;
    // Longer windows: only the floor keeps newcomers behind the waiters.
    handle.set_default(vec![window(24, 400 * MS), turns]);
    handle.new_turn(&["k"]);
    tasks.extend(book(&mut svc, 30..40).await);
    finish(tasks).await;
    assert_eq!(inner.record.order(), (0..40).collect::<Vec<_>>());
}

/// A key with waiters moved back to a rule it already has state in starts
/// it spent at the last waiter's instant, state or not.
#[tokio::test(start_paused = true)]
async fn a_key_moved_back_to_a_rule_it_has_state_in_queues_behind_its_waiters() {
    let rule = |name, pattern, quota| {
        Rule::new(name, KeyPattern::parts([pattern]).unwrap()).with_quota(quota)
    };
    let (a, b) = (token_bucket(10, 10), token_bucket(100, 1));
    let inner = Inner::new();
    let layer = RateLimitLayer::new(token_bucket(1, 1), HeaderKey::new("x-key").unwrap())
        .with_rule(rule("a", "k", a))
        .unwrap()
        .with_rule(rule("b", "x", b))
        .unwrap()
        .with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    let start = Instant::now();
    let mut tasks = book(&mut svc, 0..1).await;
    handle
        .set_rules(vec![rule("a", "x", a), rule("b", "k", b)])
        .unwrap();
    tasks.extend(book(&mut svc, 1..21).await);
    handle
        .set_rules(vec![rule("a", "k", a), rule("b", "x", b)])
        .unwrap();
    tasks.extend(book(&mut svc, 21..31).await);
    finish(tasks).await;
    let (order, ms) = calls(&inner, start);
    assert_eq!(order, (0..31).collect::<Vec<_>>());
    // 0 under a; 10..200 ms under b; back under a, spent at 200 ms: 10/s.
    let expected: Vec<u64> = std::iter::once(0)
        .chain((1..21).map(|i| 10 * i))
        .chain((1..11).map(|i| 200 + 100 * i))
        .collect();
    assert_eq!(ms, expected);
}

/// The quota that put the waiters in order is removed: the one left has
/// room, and only the floor keeps newcomers behind them.
#[tokio::test(start_paused = true)]
async fn removing_the_quota_that_ordered_the_waiters_keeps_newcomers_behind_them() {
    let loose = token_bucket(1_000, 1_000);
    let inner = Inner::new();
    let layer = RateLimitLayer::with_quotas(vec![loose, token_bucket(100, 1)], GlobalKey)
        .with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    let start = Instant::now();
    let mut tasks = book(&mut svc, 0..20).await;
    handle.set_default(vec![loose]);
    tasks.extend(book(&mut svc, 20..30).await);
    finish(tasks).await;
    let (order, ms) = calls(&inner, start);
    assert_eq!(order, (0..30).collect::<Vec<_>>());
    let expected: Vec<u64> = (0..20).map(|i| 10 * i).chain([190; 10]).collect();
    assert_eq!(ms, expected);
}

/// Fixed windows line up with the wall clock, so a limiter's first window
/// starts before its timeline does: a retune to another window length then
/// must neither underflow nor shut the key.
#[tokio::test(start_paused = true)]
async fn a_fixed_window_retuned_in_its_first_window_keeps_what_it_used() {
    let window = |period| quota(Algorithm::FixedWindow, 5, period);
    let layer = RateLimitLayer::new(window(60 * SECOND), GlobalKey);
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    svc.ready()
        .await
        .unwrap()
        .call(request("k", 0))
        .await
        .unwrap();
    handle.set_default(vec![window(30 * SECOND)]);
    let mut admitted = 0;
    while svc
        .ready()
        .await
        .unwrap()
        .call(request("k", 1))
        .await
        .is_ok()
    {
        admitted += 1;
    }
    assert_eq!(admitted, 4, "one of five was used before the retune");
}

/// Eight tasks on a multi-threaded runtime send to one key in wait mode
/// while another retunes it between two rates every 2 ms: each task's
/// requests reach the inner service in the order it sent them, and every
/// one is admitted. (The instants are checked exactly, without timers, by
/// the limiter's own threaded test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_sending_through_retunes_on_many_threads_keep_their_order() {
    let rate = |n| token_bucket(n, 1);
    let inner = Inner::new();
    let layer = RateLimitLayer::new(rate(2_000), GlobalKey).with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let svc = layer.layer(inner.clone());
    let retuner = tokio::spawn(async move {
        for i in 0..60 {
            handle.set_default(vec![rate(if i % 2 == 0 { 4_000 } else { 2_000 })]);
            time::sleep(2 * MS).await;
        }
    });
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let mut svc = svc.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    let seq = task * 1_000 + i;
                    let call = svc.ready().await.unwrap().call(request("k", seq));
                    call.await.unwrap_or_else(|e| panic!("#{seq} refused: {e}"));
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    retuner.await.unwrap();
    let order = inner.record.order();
    assert_eq!(order.len(), 8 * 40);
    for task in 0..8 {
        let sent: Vec<usize> = order
            .iter()
            .copied()
            .filter(|s| s / 1_000 == task)
            .collect();
        assert_eq!(sent, (0..40).map(|i| task * 1_000 + i).collect::<Vec<_>>());
    }
}
