//! ConcurrencyLayer with fair share: a key's waiters take turns by lane
//! (here, the caller named by `x-client`), each lane in its own order, and
//! a full line makes room by pushing out the longest lane's newest.

#[path = "support/lanes.rs"]
mod lanes;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::QueueFull;
use tower_throttle::key::{GlobalKey, HeaderKey};

use lanes::{request, spawn};

type Calls = Arc<Mutex<Vec<String>>>;

/// A service taking a second per request, recording each call's
/// `x-client` and `x-n` as `client/n`, in the order they were called.
fn upstream(
    calls: &Calls,
) -> impl Service<
    http::Request<()>,
    Response = http::Response<()>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<()>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    let calls = calls.clone();
    tower::service_fn(move |req: http::Request<()>| {
        let header = |name| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        calls
            .lock()
            .push(format!("{}/{}", header("x-client"), header("x-n")));
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, Infallible>(http::Response::new(()))
        }
    })
}

/// One caller with 500 waiting and a second caller's one request: the
/// second goes next (the first had its turn with the request in flight),
/// and the first's go in their own order. In arrival order it would be
/// last.
#[tokio::test(start_paused = true)]
async fn a_callers_request_goes_within_one_turn_of_another_callers_500() {
    let calls = Calls::default();
    let layer = ConcurrencyLayer::new(1, GlobalKey)
        .expect("valid")
        .with_fair_share(HeaderKey::new("x-client").expect("valid"));
    let svc = layer.layer(upstream(&calls));
    let mut tasks = Vec::new();
    for n in 0..=500 {
        tasks.push(spawn(&svc, request("flood", n)).await);
    }
    tasks.push(spawn(&svc, request("single", 0)).await);
    for task in tasks {
        task.await.expect("no panic").expect("served");
    }
    let calls = calls.lock();
    assert_eq!(calls.len(), 502);
    // The first in flight (the flood's turn), then the single one.
    assert_eq!(calls[..3], ["flood/0", "single/0", "flood/1"]);
    let flood: Vec<&String> = calls.iter().filter(|c| c.starts_with("flood/")).collect();
    let in_order: Vec<String> = (0..=500).map(|n| format!("flood/{n}")).collect();
    assert!(flood.iter().zip(&in_order).all(|(a, b)| *a == b));
}

/// Callers take turns while they have requests waiting; those that
/// start waiting go ahead of the caller that had the last turn.
#[tokio::test(start_paused = true)]
async fn callers_with_requests_waiting_take_turns() {
    let calls = Calls::default();
    let layer = ConcurrencyLayer::new(1, GlobalKey)
        .expect("valid")
        .with_fair_share(HeaderKey::new("x-client").expect("valid"));
    let svc = layer.layer(upstream(&calls));
    let mut tasks = Vec::new();
    for n in 0..4 {
        tasks.push(spawn(&svc, request("a", n)).await);
    }
    for n in 0..2 {
        tasks.push(spawn(&svc, request("b", n)).await);
    }
    tasks.push(spawn(&svc, request("c", 0)).await);
    for task in tasks {
        task.await.expect("no panic").expect("served");
    }
    assert_eq!(
        *calls.lock(),
        ["a/0", "b/0", "c/0", "a/1", "b/1", "a/2", "a/3"]
    );
}

/// A full line: a caller with fewer waiting pushes out the newest of the
/// longest lane, which fails with `QueueFull`; a newcomer of the longest
/// lane is refused itself.
#[tokio::test(start_paused = true)]
async fn a_full_line_pushes_out_the_floods_newest_not_the_newcomer() {
    let calls = Calls::default();
    let layer = ConcurrencyLayer::new(1, GlobalKey)
        .expect("valid")
        .with_max_queue(3)
        .with_fair_share(HeaderKey::new("x-client").expect("valid"));
    let mut svc = layer.layer(upstream(&calls));
    let mut flood = Vec::new();
    for n in 0..4 {
        flood.push(spawn(&svc, request("flood", n)).await);
    }
    let single = spawn(&svc, request("single", 0)).await;
    // The flood's fifth is refused at once: its lane is the longest.
    let refused = svc
        .ready()
        .await
        .expect("ready")
        .call(request("flood", 4))
        .await
        .expect_err("its own lane is the longest");
    assert!(refused.is::<QueueFull>(), "{refused}");
    single.await.expect("no panic").expect("served");
    let mut outcomes = Vec::new();
    for task in flood {
        outcomes.push(task.await.expect("no panic").map(|_| ()));
    }
    let pushed_out = outcomes.pop().expect("four").expect_err("pushed out");
    assert!(pushed_out.is::<QueueFull>(), "{pushed_out}");
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(*calls.lock(), ["flood/0", "single/0", "flood/1", "flood/2"]);
}

/// Without fair share the same line is arrival order (the default).
#[tokio::test(start_paused = true)]
async fn without_fair_share_the_line_is_arrival_order() {
    let calls = Calls::default();
    let layer = ConcurrencyLayer::new(1, GlobalKey).expect("valid");
    let svc = layer.layer(upstream(&calls));
    let mut tasks = Vec::new();
    for n in 0..3 {
        tasks.push(spawn(&svc, request("a", n)).await);
    }
    tasks.push(spawn(&svc, request("b", 0)).await);
    for task in tasks {
        task.await.expect("no panic").expect("served");
    }
    assert_eq!(*calls.lock(), ["a/0", "a/1", "a/2", "b/0"]);
}

/// Lanes by `x-client`, weighted by `x-weight` (a caller's plan, say).
struct WeightedClient;

impl tower_throttle::key::KeyExtractor<http::Request<()>> for WeightedClient {
    fn extract(
        &self,
        req: &http::Request<()>,
        key: &mut tower_throttle::key::KeyBuilder<'_>,
    ) -> Result<(), tower_throttle::error::KeyError> {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        key.push_str(header("x-client").unwrap_or(""));
        key.set_weight(header("x-weight").and_then(|w| w.parse().ok()).unwrap_or(1));
        Ok(())
    }
}

/// Two callers flooding one permit, one of weight 3: while both wait, the
/// heavier takes three permits to the other's one, each in its own order.
#[tokio::test(start_paused = true)]
async fn a_lane_of_weight_three_gets_three_shares() {
    let calls = Calls::default();
    let layer = ConcurrencyLayer::new(1, GlobalKey)
        .expect("valid")
        .with_fair_share(WeightedClient);
    let svc = layer.layer(upstream(&calls));
    let mut tasks = Vec::new();
    for n in 0..12 {
        let mut req = request("gold", n);
        req.headers_mut()
            .insert("x-weight", http::HeaderValue::from_static("3"));
        tasks.push(spawn(&svc, req).await);
        tasks.push(spawn(&svc, request("free", n)).await);
    }
    for task in tasks {
        task.await.expect("no panic").expect("served");
    }
    let calls = calls.lock();
    let lanes: String = calls[..13]
        .iter()
        .map(|c| if c.starts_with("gold") { 'G' } else { 'f' })
        .collect();
    // gold/0 went at once; free's first waiter goes ahead of the lane just
    // served, then gold takes three for each of free's one.
    assert_eq!(lanes, "GfGGGfGGGfGGG");
    for client in ["gold", "free"] {
        let own: Vec<&String> = calls.iter().filter(|c| c.starts_with(client)).collect();
        let in_order: Vec<String> = (0..12).map(|n| format!("{client}/{n}")).collect();
        assert!(
            own.iter().zip(&in_order).all(|(a, b)| *a == b),
            "{client} in order"
        );
    }
}
