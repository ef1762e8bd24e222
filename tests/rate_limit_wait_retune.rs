//! Wait mode across a retune: requests booked before it keep their instants
//! and go first; requests booked after it are held to the new quota on top
//! of what was booked.

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
/// multiples of their length).
async fn boundary(layer: &RateLimitLayer<HeaderKey>, probe: &str) -> Instant {
    let mut twin = layer.clone().layer(Inner::new());
    loop {
        let call = twin.ready().await.unwrap().call(request(probe, 0));
        if let Err(err) = call.await {
            let wait = err
                .downcast_ref::<RateLimited>()
                .expect("refused")
                .retry_after;
            return Instant::now() + wait;
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
                let old_boundary = boundary(&layer, "probe-old").await;
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
                let new_boundary = boundary(&layer, "probe-new").await;
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

/// A reset takes effect at once, retune or not: the newcomer does not
/// queue behind the old waiters.
#[tokio::test(start_paused = true)]
async fn a_reset_after_a_retune_admits_at_once() {
    let inner = Inner::new();
    let layer = RateLimitLayer::new(token_bucket(100, 1), HeaderKey::new("x-key").unwrap())
        .with_max_wait(10 * SECOND);
    let handle = layer.handle();
    let mut svc = layer.layer(inner.clone());
    let start = Instant::now();
    let mut tasks = book(&mut svc, 0..20).await;
    handle.set_default(vec![token_bucket(200, 1)]);
    handle.reset(&["k"]);
    tasks.extend(book(&mut svc, 20..21).await);
    finish(tasks).await;
    let (order, ms) = calls(&inner, start);
    let newcomer = order.iter().position(|&s| s == 20).unwrap();
    assert_eq!(ms[newcomer], 0, "the newcomer after a reset went at once");
}
