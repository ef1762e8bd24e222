//! Live control and observation: several quotas per key, dry run, retune,
//! the master switch, turn budgets, stats and their subscription.

#![cfg(feature = "test-util")]

mod support;

use std::time::Duration;

use support::{Inner, Lcg, request};
use tokio::time;
use tokio_test::{assert_pending, task};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Algorithm, KeyPattern, Quota, RateLimitLayer, Rule, Unit};
use tower_throttle::respond::RateLimitHeaders;

const MINUTE: Duration = Duration::from_secs(60);

fn key() -> HeaderKey {
    // The test keys are plain names, not secrets: shown as they are.
    HeaderKey::new("x-key").unwrap().show_raw()
}

async fn send<S>(svc: &mut S, key: &str) -> Result<http::Response<()>, BoxError>
where
    S: Service<http::Request<()>, Response = http::Response<()>, Error = BoxError>,
{
    svc.ready().await?.call(request(key, 0)).await
}

fn retry_after(err: &BoxError) -> Duration {
    err.downcast_ref::<RateLimited>()
        .unwrap_or_else(|| panic!("expected RateLimited, got {err}"))
        .retry_after
}

#[tokio::test(start_paused = true)]
async fn a_refusal_by_one_quota_consumes_nothing_from_the_others() {
    // 2 per rolling minute and 4 per hour.
    let layer = RateLimitLayer::new(Quota::per_minute(2).unwrap().sliding_window(), key())
        .with_quota(Quota::per_hour(4).unwrap().sliding_window());
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "a").await.unwrap();
    send(&mut svc, "a").await.unwrap();
    // Refused by the minute quota, ten times: the hour quota must not count
    // any of them, or the next minute would admit fewer than 2.
    for _ in 0..10 {
        assert_eq!(retry_after(&send(&mut svc, "a").await.unwrap_err()), MINUTE);
    }
    time::advance(MINUTE).await;
    send(&mut svc, "a").await.expect("hour quota has 2 left");
    send(&mut svc, "a").await.expect("hour quota has 1 left");
    // Now both refuse; retry_after is the longer wait: the hour's.
    time::advance(MINUTE).await;
    let wait = retry_after(&send(&mut svc, "a").await.unwrap_err());
    assert_eq!(wait, Duration::from_secs(3_600) - 2 * MINUTE);
}

#[tokio::test(start_paused = true)]
async fn requests_and_tokens_per_minute_both_hold() {
    // 10 requests and 1,000 tokens per minute; the cost closure reads the
    // request's token estimate.
    let layer = RateLimitLayer::new(Quota::per_minute(1_000).unwrap(), key()).with_cost(
        |req: &http::Request<()>| {
            req.headers()
                .get("x-tokens")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        },
    );
    let requests = RateLimitLayer::new(Quota::per_minute(10).unwrap(), key());
    let mut svc = tower::ServiceBuilder::new()
        .layer(requests)
        .layer(layer)
        .service(Inner::new());
    let ask = |tokens: u32| {
        http::Request::builder()
            .header("x-key", "a")
            .header("x-tokens", tokens.to_string())
            .body(())
            .unwrap()
    };
    for _ in 0..3 {
        svc.ready().await.unwrap().call(ask(300)).await.unwrap();
    }
    let err = svc.ready().await.unwrap().call(ask(300)).await.unwrap_err();
    assert!(err.is::<RateLimited>(), "tokens: 1200 > 1000");
    for _ in 0..6 {
        svc.ready().await.unwrap().call(ask(1)).await.unwrap();
    }
    let err = svc.ready().await.unwrap().call(ask(1)).await.unwrap_err();
    assert!(err.is::<RateLimited>(), "requests: 11 > 10");
}

#[tokio::test(start_paused = true)]
async fn dry_run_never_refuses_and_counts_exactly_what_enforcing_would_refuse() {
    let quota = Quota::per_second(3).unwrap().with_burst(5).unwrap();
    let enforcing = RateLimitLayer::new(quota, key());
    let dry = RateLimitLayer::new(quota, key()).with_dry_run(true);
    let (enforcing_handle, dry_handle) = (enforcing.handle(), dry.handle());
    let mut enforce = enforcing.layer(Inner::new());
    let mut observe = dry.layer(Inner::new());
    let mut rng = Lcg(3);
    let mut refused = 0;
    for _ in 0..2_000 {
        let who = ["a", "b", "c"][(rng.next() % 3) as usize];
        if send(&mut enforce, who).await.is_err() {
            refused += 1;
        }
        send(&mut observe, who)
            .await
            .expect("dry run never refuses");
        time::advance(Duration::from_millis(rng.next() % 200)).await;
    }
    assert!(
        refused > 100,
        "the traffic should be over the limit: {refused}"
    );
    let (enforced, observed) = (enforcing_handle.stats(), dry_handle.stats());
    assert_eq!(enforced.aggregate.rejected, refused);
    assert_eq!(observed.aggregate.would_reject, refused);
    assert_eq!(observed.aggregate.rejected, 0);
    assert_eq!(observed.aggregate.admitted, 2_000);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_rule_lets_its_keys_through_and_counts_them() {
    let layer = RateLimitLayer::new(Quota::per_minute(1).unwrap(), key())
        .with_rule(
            Rule::new("trial", KeyPattern::text("trial-*").unwrap())
                .with_quota(Quota::per_minute(1).unwrap())
                .with_dry_run(true),
        )
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    for _ in 0..3 {
        send(&mut svc, "trial-1").await.expect("dry-run rule");
    }
    send(&mut svc, "paying").await.unwrap();
    assert!(send(&mut svc, "paying").await.is_err(), "enforced rule");
    let stats = handle.stats().aggregate;
    assert_eq!((stats.would_reject, stats.rejected), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn retuning_never_mints_a_free_burst() {
    let layer = RateLimitLayer::new(Quota::per_minute(10).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    for _ in 0..10 {
        send(&mut svc, "a").await.unwrap();
    }
    assert!(send(&mut svc, "a").await.is_err());
    // Twice the burst: the spent key stays spent.
    handle.set_default(vec![Quota::per_minute(10).unwrap().with_burst(20).unwrap()]);
    assert!(
        send(&mut svc, "a").await.is_err(),
        "a bigger burst minted capacity"
    );
    // Ten times the rate: still spent now, but refills at the new rate.
    handle.set_default(vec![
        Quota::per_minute(100).unwrap().with_burst(20).unwrap(),
    ]);
    let wait = retry_after(&send(&mut svc, "a").await.unwrap_err());
    assert_eq!(
        wait,
        Duration::from_millis(600),
        "one unit at 100 per minute"
    );
    time::advance(wait).await;
    send(&mut svc, "a").await.expect("refilled at the new rate");
    // A smaller burst takes effect at once for a key with room.
    handle.set_default(vec![Quota::per_minute(100).unwrap().with_burst(2).unwrap()]);
    send(&mut svc, "fresh").await.unwrap();
    send(&mut svc, "fresh").await.unwrap();
    assert!(send(&mut svc, "fresh").await.is_err(), "burst lowered to 2");
}

#[tokio::test(start_paused = true)]
async fn services_made_before_a_retune_follow_it() {
    let layer = RateLimitLayer::new(Quota::per_minute(100).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    // Never called before the retune, as a server's template service is.
    let template = svc.clone();
    send(&mut svc, "a").await.unwrap();
    // Another algorithm: the default's table is replaced, not retuned.
    handle.set_default(vec![
        Quota::per_minute(1)
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow),
    ]);
    send(&mut svc, "b").await.unwrap();
    assert!(
        send(&mut svc, "b").await.is_err(),
        "a service kept the policy it had before the retune"
    );
    let mut clone = template.clone();
    send(&mut clone, "c").await.unwrap();
    assert!(
        send(&mut clone, "c").await.is_err(),
        "a clone of an older service kept the old policy"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_moved_to_another_rule_starts_it_spent() {
    let layer = RateLimitLayer::new(Quota::per_minute(2).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "vip").await.unwrap();
    send(&mut svc, "vip").await.unwrap();
    handle
        .set_rules(vec![
            Rule::new("vip", KeyPattern::text("vip").unwrap())
                .with_quota(Quota::per_minute(60).unwrap()),
        ])
        .unwrap();
    assert!(
        send(&mut svc, "vip").await.is_err(),
        "moving rules minted a burst"
    );
    time::advance(Duration::from_secs(1)).await;
    send(&mut svc, "vip")
        .await
        .expect("refills at the new rule's rate");
    // A duplicate rule name is refused and changes nothing.
    let twice = Rule::new("x", KeyPattern::text("x").unwrap());
    assert!(handle.set_rules(vec![twice.clone(), twice]).is_err());
    assert_eq!(handle.config().1.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_master_switch_passes_everything_untouched() {
    let layer = RateLimitLayer::new(Quota::per_minute(1).unwrap(), key());
    let handle = layer.handle();
    let inner = Inner::new();
    let mut svc = layer.layer(inner.clone());
    send(&mut svc, "a").await.unwrap();
    assert!(send(&mut svc, "a").await.is_err());
    handle.set_enabled(false);
    for _ in 0..50 {
        send(&mut svc, "a").await.expect("switched off");
    }
    // No key needed either: nothing is looked at.
    let no_key = http::Request::builder().body(()).unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(no_key)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        handle.stats().aggregate.admitted,
        1,
        "switched-off requests were counted"
    );
    handle.set_enabled(true);
    assert!(
        send(&mut svc, "a").await.is_err(),
        "the key's state survived the switch"
    );
    assert_eq!(inner.record.calls(), 52);
}

#[tokio::test(start_paused = true)]
async fn reset_forgets_one_key() {
    let layer = RateLimitLayer::new(Quota::per_minute(1).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "a").await.unwrap();
    send(&mut svc, "b").await.unwrap();
    handle.reset(&["a"]);
    send(&mut svc, "a").await.expect("reset");
    assert!(send(&mut svc, "b").await.is_err(), "b was reset too");
}

fn pair(from: &str, to: &str) -> http::Request<()> {
    http::Request::builder()
        .header("x-from", from)
        .header("x-to", to)
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_turn_budget_resets_only_on_the_senders_own_new_turn_or_when_stale() {
    // Each sender may send 2 messages per turn, and 5 per minute whatever
    // its turns.
    let layer = RateLimitLayer::new(
        Quota::per_turn(2).unwrap(),
        HeaderKey::new("x-from").unwrap(),
    )
    .with_quota(Quota::per_minute(5).unwrap().sliding_window());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    let mut send_from = async |from: &str| svc.ready().await.unwrap().call(pair(from, "x")).await;
    send_from("A").await.unwrap();
    send_from("A").await.unwrap();
    let err = send_from("A").await.unwrap_err();
    let wait = retry_after(&err);
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_secs(300),
        "{wait:?}"
    );
    send_from("B").await.unwrap();
    // B's new turn does not reset A.
    handle.new_turn(&["B"]);
    assert!(send_from("A").await.is_err());
    // A's own does, and only its turn: the per-minute quota keeps counting.
    handle.new_turn(&["A"]);
    send_from("A").await.unwrap();
    send_from("A").await.unwrap();
    handle.new_turn(&["A"]);
    send_from("A").await.unwrap();
    let err = send_from("A").await.unwrap_err();
    assert_eq!(
        retry_after(&err),
        MINUTE,
        "5 per minute: the oldest leaves in a minute"
    );
    assert!(send_from("A").await.is_err());
    // A turn nobody ends goes stale five minutes after it started.
    send_from("C").await.unwrap();
    send_from("C").await.unwrap();
    time::advance(Duration::from_secs(300) - Duration::from_nanos(1)).await;
    let err = send_from("C").await.unwrap_err();
    assert_eq!(retry_after(&err), Duration::from_nanos(1));
    time::advance(Duration::from_nanos(1)).await;
    send_from("C").await.expect("stale turn ended by itself");
}

#[tokio::test(start_paused = true)]
async fn stats_count_per_key_and_the_queue_gauge_returns_to_zero() {
    let layer = RateLimitLayer::new(Quota::per_second(1).unwrap(), key())
        .with_max_wait(Duration::from_secs(3))
        .with_key_stats(100);
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "a").await.unwrap();
    // Two waiters, one given up on while queued.
    svc.ready().await.unwrap();
    let waiting = tokio::spawn(svc.call(request("a", 1)));
    svc.ready().await.unwrap();
    let mut dropped = task::spawn(svc.call(request("a", 2)));
    assert_pending!(dropped.poll());
    assert_eq!(handle.stats().aggregate.queued_now, 2);
    drop(dropped);
    assert_eq!(handle.stats().aggregate.queued_now, 1);
    // The dropped waiter was last in the queue: its slot at 2 s is given
    // back, so the next request gets it.
    send(&mut svc, "a").await.expect("turn at 2 s");
    waiting.await.unwrap().unwrap();
    send(&mut svc, "b").await.unwrap();
    let stats = handle.stats();
    assert_eq!(stats.aggregate.queued_now, 0);
    assert_eq!(stats.aggregate.admitted, 4);
    assert_eq!(stats.aggregate.waited, 2);
    assert_eq!(stats.aggregate.total_wait_ms, 3_000.0);
    assert_eq!(stats.aggregate.avg_wait_ms, 1_500.0);
    let keys: Vec<_> = stats
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.admitted))
        .collect();
    assert_eq!(keys, vec![("a", 3), ("b", 1)]);
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["aggregate"]["admitted"], 4);
}

#[tokio::test(start_paused = true)]
async fn a_subscription_fires_on_change_and_coalesces_bursts() {
    let layer = RateLimitLayer::new(Quota::per_second(1_000).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    let mut sub = handle.subscribe();
    let mut next = task::spawn(async move {
        let first = sub.changed().await;
        (first, sub)
    });
    assert_pending!(next.poll(), "nothing has happened yet");
    for _ in 0..100 {
        send(&mut svc, "a").await.unwrap();
    }
    assert!(next.is_woken(), "a change wakes the subscriber");
    let (first, mut sub) = next.await;
    assert_eq!(
        first.aggregate.admitted, 100,
        "one snapshot tells of the whole burst"
    );
    // No change since: it waits.
    let mut again = task::spawn(async move { sub.changed().await });
    assert_pending!(again.poll());
    send(&mut svc, "a").await.unwrap();
    assert_eq!(again.await.aggregate.admitted, 101);
}

#[tokio::test(start_paused = true)]
async fn builder_methods_after_from_limits_keep_the_switches() {
    let limits = tower_throttle::rate_limit::RateLimitConfig::from_toml(
        "enabled = false\ndry_run = true\nquotas = [{ limit = 1, period = \"1m\" }]",
    )
    .unwrap()
    .validate()
    .unwrap();
    let layer = RateLimitLayer::from_limits(&limits, key()).with_key_stats(10);
    assert!(
        !layer.handle().is_enabled(),
        "with_key_stats switched limiting back on"
    );
    let mut svc = layer.layer(Inner::new());
    for _ in 0..3 {
        send(&mut svc, "a").await.expect("switched off");
    }
}

/// One admitted request through `quotas`, costing 2, with legacy headers:
/// its `X-RateLimit-Limit` and `X-RateLimit-Reset`, which name the quota a
/// client must heed.
async fn tightest(quotas: Vec<Quota>) -> (String, String) {
    let layer = RateLimitLayer::with_quotas(quotas, key())
        .with_cost(|_: &http::Request<()>| 2)
        .with_response_headers(RateLimitHeaders::legacy());
    let mut svc = layer.layer(Inner::new());
    let response = send(&mut svc, "k").await.expect("admitted");
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
    (header("x-ratelimit-limit"), header("x-ratelimit-reset"))
}

#[tokio::test(start_paused = true)]
async fn the_headers_speak_for_the_quota_with_least_left_then_the_longest_to_refill() {
    // Equal left (1 each), so the one whole again last: the hour, in
    // either order (sliding windows: whole again a period after the
    // request).
    let minute = Quota::per_minute(2)
        .unwrap()
        .sliding_window()
        .with_unit(Unit::Requests);
    let hour = Quota::per_hour(2)
        .unwrap()
        .sliding_window()
        .with_unit(Unit::Requests);
    assert_eq!(tightest(vec![hour, minute]).await.1, "3600");
    assert_eq!(tightest(vec![minute, hour]).await.1, "3600");
    // Equal left (2 each) and equal reset (fixed windows of one period end
    // together): the first quota listed.
    let three_requests = Quota::per_minute(3)
        .unwrap()
        .fixed_window()
        .with_unit(Unit::Requests);
    let four_units = Quota::per_minute(4).unwrap().fixed_window();
    assert_eq!(tightest(vec![three_requests, four_units]).await.0, "3");
    assert_eq!(tightest(vec![four_units, three_requests]).await.0, "4");
    // Less left wins whatever the reset: none left in the minute (the
    // request's cost, 2) against one in the hour.
    let spent = Quota::per_minute(2).unwrap().sliding_window();
    assert_eq!(tightest(vec![hour, spent]).await.1, "60");
}

#[tokio::test(start_paused = true)]
async fn a_key_moved_between_rules_starts_spent_unless_it_was_idle() {
    let rule = |name: &str| {
        Rule::new(name, KeyPattern::text("k").unwrap()).with_quota(Quota::per_minute(2).unwrap())
    };
    let layer = RateLimitLayer::new(Quota::per_minute(100).unwrap(), key());
    let handle = layer.handle();
    let mut svc = layer.layer(Inner::new());
    handle.set_rules(vec![rule("a")]).unwrap();
    send(&mut svc, "k").await.unwrap();
    // Busy under "a", then moved to "b": it starts "b" spent.
    handle.set_rules(vec![rule("b")]).unwrap();
    assert!(send(&mut svc, "k").await.is_err(), "moving minted a burst");
    // The same rule retuned is no move: the key keeps its state.
    handle
        .set_rules(vec![
            Rule::new("b", KeyPattern::text("k").unwrap())
                .with_quota(Quota::per_minute(3).unwrap()),
        ])
        .unwrap();
    time::advance(Duration::from_secs(20)).await;
    send(&mut svc, "k")
        .await
        .expect("one unit back in 20 s at 3 a minute");
    // Idle for longer than its longest period, it has nothing left to
    // carry over: moved now, it starts "c" whole.
    time::advance(Duration::from_secs(61)).await;
    handle.set_rules(vec![rule("c")]).unwrap();
    send(&mut svc, "k").await.expect("an idle key moved whole");
    send(&mut svc, "k").await.expect("an idle key moved whole");
    assert!(send(&mut svc, "k").await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_handle_shows_its_limits_and_switches_but_no_key() {
    let layer = RateLimitLayer::new(Quota::per_minute(2).unwrap(), key());
    let handle = layer.handle();
    handle
        .set_rules(vec![Rule::new("vip", KeyPattern::text("vip").unwrap())])
        .unwrap();
    handle.set_dry_run(true);
    let mut svc = layer.layer(Inner::new());
    send(&mut svc, "key-seen-once").await.unwrap();
    let shown = format!("{handle:?}");
    for part in [
        "Limiter",
        "default",
        "\"vip\"",
        "enabled: true",
        "dry_run: true",
    ] {
        assert!(shown.contains(part), "{part} not in {shown}");
    }
    assert!(!shown.contains("key-seen-once"), "{shown}");
}
