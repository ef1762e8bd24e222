//! Several limits on their own keys judged as one (`JointRateLimitLayer`),
//! named limits, retry floors, and resetting every key through the handle.

#![cfg(feature = "test-util")]

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, CostTooHigh, RateLimited};
use tower_throttle::rate_limit::{JointRateLimitLayer, Quota, RateLimitLayer};

/// A message between two agents.
#[derive(Clone, Debug)]
struct Message {
    from: &'static str,
    to: &'static str,
    /// What the receiver answers: delivered or not.
    deliver: bool,
}

fn sender(m: &Message) -> Option<String> {
    Some(m.from.to_owned())
}

fn receiver(m: &Message) -> Option<String> {
    Some(m.to.to_owned())
}

type Sender = fn(&Message) -> Option<String>;

const INTERVAL: Duration = Duration::from_secs(10);

/// At most `fan_out` per sender per turn ("fan_out") and one per pair per
/// 10 s ("pair").
fn limits(fan_out: u32) -> (RateLimitLayer<Sender>, RateLimitLayer<(Sender, Sender)>) {
    let turns = RateLimitLayer::new(Quota::per_turn(fan_out).unwrap(), sender as Sender)
        .with_name("fan_out")
        .with_retry_floor(INTERVAL);
    let pairs = RateLimitLayer::new(
        Quota::new(1, INTERVAL).unwrap(),
        (sender as Sender, receiver as Sender),
    )
    .with_name("pair");
    (turns, pairs)
}

/// The inner service: answers whether the message was delivered, and
/// counts its calls.
#[derive(Clone, Default)]
struct Deliver(Arc<AtomicUsize>);

impl Service<Message> for Deliver {
    type Response = bool;
    type Error = Infallible;
    type Future = std::future::Ready<Result<bool, Infallible>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, m: Message) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(m.deliver))
    }
}

fn msg(from: &'static str, to: &'static str) -> Message {
    Message {
        from,
        to,
        deliver: true,
    }
}

async fn send<S>(svc: &mut S, m: Message) -> Result<bool, BoxError>
where
    S: Service<Message, Response = bool, Error = BoxError>,
{
    svc.ready().await?.call(m).await
}

fn refusal(result: Result<bool, BoxError>) -> RateLimited {
    let err = result.expect_err("refused");
    err.downcast_ref::<RateLimited>()
        .unwrap_or_else(|| panic!("expected RateLimited, got {err}"))
        .clone()
}

#[tokio::test(start_paused = true)]
async fn a_refusal_by_one_limit_takes_nothing_from_the_other() {
    let (turns, pairs) = limits(2);
    let joint = JointRateLimitLayer::new(turns).unwrap().and(pairs).unwrap();
    let inner = Deliver::default();
    let mut svc = joint.layer(inner.clone());
    send(&mut svc, msg("a", "b")).await.unwrap();
    // Refused by the pair, five times: a's turn keeps its second message.
    for _ in 0..5 {
        assert_eq!(
            refusal(send(&mut svc, msg("a", "b")).await)
                .limit
                .as_deref(),
            Some("pair")
        );
    }
    send(&mut svc, msg("a", "c"))
        .await
        .expect("a's turn had one left");
    // Refused by the turn: the pair a→d is not started.
    assert_eq!(
        refusal(send(&mut svc, msg("a", "d")).await)
            .limit
            .as_deref(),
        Some("fan_out")
    );
    assert_eq!(
        refusal(send(&mut svc, msg("a", "d")).await)
            .limit
            .as_deref(),
        Some("fan_out")
    );
    assert_eq!(inner.0.load(Ordering::SeqCst), 2, "refusals never reach it");
}

#[tokio::test(start_paused = true)]
async fn the_first_limit_given_that_refuses_is_reported_with_the_longest_floored_wait() {
    let (turns, pairs) = limits(1);
    let fan_out_first = JointRateLimitLayer::new(turns.clone())
        .unwrap()
        .and(pairs.clone())
        .unwrap();
    let mut svc = fan_out_first.layer(Deliver::default());
    send(&mut svc, msg("a", "b")).await.unwrap();
    time::advance(Duration::from_secs(3)).await;
    // Both refuse a→b: the turn (stale in 297 s) is reported, and waits
    // longest.
    let refused = refusal(send(&mut svc, msg("a", "b")).await);
    assert_eq!(refused.limit.as_deref(), Some("fan_out"));
    assert_eq!(refused.key, "a");
    assert_eq!(refused.retry_after, Duration::from_secs(297));
    // The same limits the other way round: the pair is reported, with the
    // longest wait of the two still.
    let pair_first = JointRateLimitLayer::new(pairs).unwrap().and(turns).unwrap();
    let mut svc = pair_first.layer(Deliver::default());
    let refused = refusal(send(&mut svc, msg("a", "b")).await);
    assert_eq!(refused.limit.as_deref(), Some("pair"));
    assert_eq!(refused.key, "a/b");
    assert_eq!(refused.retry_after, Duration::from_secs(297));
    // Near the turn's end, its wait is raised to its floor, the interval.
    time::advance(Duration::from_secs(296)).await;
    let refused = refusal(send(&mut svc, msg("a", "c")).await);
    assert_eq!(refused.limit.as_deref(), Some("fan_out"));
    assert_eq!(refused.retry_after, INTERVAL, "1 s left, floored");
}

#[tokio::test(start_paused = true)]
async fn the_wait_reported_is_the_longest_of_all_refusals_each_raised_to_its_floor() {
    let (turns, pairs) = limits(2);
    let mut svc = JointRateLimitLayer::new(pairs)
        .unwrap()
        .and(turns)
        .unwrap()
        .layer(Deliver::default());
    send(&mut svc, msg("a", "x")).await.unwrap(); // a's turn starts
    time::advance(Duration::from_secs(293)).await;
    send(&mut svc, msg("a", "b")).await.unwrap(); // and is used up
    time::advance(Duration::from_secs(5)).await;
    // The pair waits 5 s more, the turn 2 s: the pair is reported, but
    // the turn's 2 s is raised to its floor, 10 s, the longest.
    let refused = refusal(send(&mut svc, msg("a", "b")).await);
    assert_eq!(refused.limit.as_deref(), Some("pair"));
    assert_eq!(refused.retry_after, INTERVAL);
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_does_not_count_gives_back_what_it_took_in_every_limit() {
    let (turns, pairs) = limits(2);
    let joint = JointRateLimitLayer::new(turns)
        .unwrap()
        .and(pairs)
        .unwrap()
        .count_only(|outcome: &Result<bool, Infallible>| matches!(outcome, Ok(true)));
    let mut svc = joint.layer(Deliver::default());
    send(&mut svc, msg("a", "b")).await.unwrap();
    // Not delivered, many times: neither a's turn nor the pair a→c used.
    for _ in 0..5 {
        let undelivered = Message {
            deliver: false,
            ..msg("a", "c")
        };
        assert!(!send(&mut svc, undelivered).await.unwrap());
    }
    send(&mut svc, msg("a", "c"))
        .await
        .expect("pair and turn intact");
    assert_eq!(
        refusal(send(&mut svc, msg("a", "d")).await)
            .limit
            .as_deref(),
        Some("fan_out")
    );
}

#[tokio::test(start_paused = true)]
async fn a_limit_given_twice_or_a_waiting_part_is_refused_when_built() {
    let (turns, _) = limits(2);
    let twice = JointRateLimitLayer::new(turns.clone()).unwrap().and(turns);
    assert_eq!(twice.unwrap_err().field, "limits");
    let (turns, pairs) = limits(2);
    let waiting = JointRateLimitLayer::new(turns)
        .unwrap()
        .and(pairs.with_max_wait(Duration::from_secs(1)));
    assert_eq!(waiting.unwrap_err().field, "max_wait");
}

#[cfg(feature = "redis")]
#[tokio::test(start_paused = true)]
async fn a_part_on_a_shared_store_is_refused_when_built() {
    // Nothing connects until a request: no server is needed to be refused.
    let store = || tower_throttle::redis::RedisStore::new("redis://127.0.0.1:1").unwrap();
    let (turns, pairs) = limits(2);
    let shared = JointRateLimitLayer::new(turns.with_store(store()).unwrap());
    assert_eq!(shared.unwrap_err().field, "store");
    let later = JointRateLimitLayer::new(pairs)
        .unwrap()
        .and(limits(2).0.with_store(store()).unwrap());
    assert_eq!(later.unwrap_err().field, "store");
}

#[tokio::test(start_paused = true)]
async fn a_limit_switched_off_or_in_a_dry_run_refuses_nothing() {
    let (turns, pairs) = limits(1);
    let (turn_handle, pair_handle) = (turns.handle(), pairs.handle());
    let mut svc = JointRateLimitLayer::new(turns)
        .unwrap()
        .and(pairs)
        .unwrap()
        .layer(Deliver::default());
    turn_handle.set_enabled(false);
    send(&mut svc, msg("a", "b")).await.unwrap();
    send(&mut svc, msg("a", "c")).await.unwrap();
    pair_handle.set_dry_run(true);
    send(&mut svc, msg("a", "b"))
        .await
        .expect("the pair only counts");
    assert_eq!(pair_handle.stats().aggregate.would_reject, 1);
    turn_handle.set_enabled(true);
    send(&mut svc, msg("a", "d")).await.unwrap();
    assert_eq!(
        refusal(send(&mut svc, msg("a", "e")).await)
            .limit
            .as_deref(),
        Some("fan_out")
    );
    assert_eq!(turn_handle.stats().aggregate.rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_costing_more_than_a_limit_holds_is_refused_before_any_is_judged() {
    let (turns, pairs) = limits(2);
    let turns = turns.with_cost(|m: &Message| if m.to == "all" { 3 } else { 1 });
    let mut svc = JointRateLimitLayer::new(pairs)
        .unwrap()
        .and(turns)
        .unwrap()
        .layer(Deliver::default());
    let err = send(&mut svc, msg("a", "all")).await.unwrap_err();
    let too_costly = err.downcast_ref::<CostTooHigh>().expect("CostTooHigh");
    assert_eq!((too_costly.cost, too_costly.capacity), (3, 2));
    // Named after the limit that could never hold it.
    assert_eq!(too_costly.limit.as_deref(), Some("fan_out"));
    send(&mut svc, msg("a", "all"))
        .await
        .expect_err("still too costly: the pair a→all was not started");
    send(&mut svc, msg("a", "b")).await.unwrap();
}

// Two joint layers over the same two limiters, given in opposite orders,
// on threads hammering the same keys: locked in one order, they finish.
#[test]
fn joint_layers_over_the_same_limits_in_opposite_orders_never_deadlock() {
    let turns = RateLimitLayer::new(Quota::per_second(1_000_000).unwrap(), sender as Sender);
    let pairs = RateLimitLayer::new(
        Quota::per_second(1_000_000).unwrap(),
        (sender as Sender, receiver as Sender),
    );
    let forward = JointRateLimitLayer::new(turns.clone())
        .unwrap()
        .and(pairs.clone())
        .unwrap();
    let backward = JointRateLimitLayer::new(pairs).unwrap().and(turns).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let threads: Vec<_> = [forward, backward.clone(), backward, {
        let (t, p) = limits(1_000_000);
        JointRateLimitLayer::new(t).unwrap().and(p).unwrap()
    }]
    .into_iter()
    .map(|layer| {
        let done = done.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut svc = layer.layer(Deliver::default());
                for _ in 0..10_000 {
                    let _ = send(&mut svc, msg("a", "b")).await;
                }
            });
            let _ = done.send(());
        })
    })
    .collect();
    // A hang guard, generous: the threads take well under a second.
    for _ in &threads {
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("a thread is stuck: the joint layers deadlocked");
    }
    for thread in threads {
        thread.join().expect("no panic");
    }
}

#[tokio::test(start_paused = true)]
async fn reset_all_forgets_every_key_and_gives_the_memory_back() {
    let (turns, pairs) = limits(1);
    let (turn_handle, pair_handle) = (turns.handle(), pairs.handle());
    let mut svc = JointRateLimitLayer::new(turns)
        .unwrap()
        .and(pairs)
        .unwrap()
        .layer(Deliver::default());
    for from in ["a", "b", "c"] {
        send(&mut svc, msg(from, "x")).await.unwrap();
        send(&mut svc, msg(from, "x")).await.unwrap_err();
    }
    assert_eq!((turn_handle.key_count(), pair_handle.key_count()), (3, 3));
    turn_handle.reset_all();
    pair_handle.reset_all();
    assert_eq!((turn_handle.key_count(), pair_handle.key_count()), (0, 0));
    for from in ["a", "b", "c"] {
        send(&mut svc, msg(from, "x")).await.expect("afresh");
    }
    // The counters are kept.
    assert_eq!(turn_handle.stats().aggregate.admitted, 6);
}

#[tokio::test(start_paused = true)]
async fn a_named_layer_names_itself_and_keeps_its_floor_in_its_refusals() {
    let layer = RateLimitLayer::new(
        Quota::new(1, Duration::from_secs(2)).unwrap(),
        sender as Sender,
    )
    .with_name("per-sender\n")
    .with_retry_floor(Duration::from_secs(5));
    let mut svc = layer.layer(Deliver::default());
    send(&mut svc, msg("a", "b")).await.unwrap();
    let refused = refusal(send(&mut svc, msg("a", "b")).await);
    assert_eq!(refused.limit.as_deref(), Some("per-sender\n"));
    assert_eq!(refused.retry_after, Duration::from_secs(5), "2 s, floored");
    assert_eq!(
        refused.to_string(),
        "rate limited on key `a` by limit `per-sender\\n`; retry after 5.000 s"
    );
    // Above the floor, the wait is exact.
    let layer = RateLimitLayer::new(
        Quota::new(1, Duration::from_secs(9)).unwrap(),
        sender as Sender,
    )
    .with_retry_floor(Duration::from_secs(5));
    let mut svc = layer.layer(Deliver::default());
    send(&mut svc, msg("a", "b")).await.unwrap();
    time::advance(Duration::from_secs(1)).await;
    let refused = refusal(send(&mut svc, msg("a", "b")).await);
    assert_eq!(refused.retry_after, Duration::from_secs(8));
    assert_eq!(refused.limit, None);
}
