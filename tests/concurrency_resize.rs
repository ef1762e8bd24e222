//! ConcurrencyLayer resized and switched while it runs, through its handle:
//! requests in flight are never dropped, waiters keep their order, on the
//! single-key fast path and with keyed permits alike.

mod support;

use std::future::Future;

use support::{Inner, request};
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::BoxError;
use tower_throttle::concurrency::{ConcurrencyBody, ConcurrencyLayer};
use tower_throttle::key::{GlobalKey, HeaderKey};

type Answer = http::Response<ConcurrencyBody<()>>;

type Sent = task::Spawn<tower::util::Oneshot<Layered, http::Request<()>>>;

/// Send request `seq` on key `k`: the response future, not yet polled.
fn send(svc: &Layered, seq: usize) -> Sent {
    task::spawn(svc.clone().oneshot(request("k", seq)))
}

/// Each test runs on the single-key fast path (`GlobalKey`) and on keyed
/// permits (a header key); the layer for `max` permits, and its inner
/// service's record.
fn each_layer(max: usize, test: impl Fn(&str, Layered, ConcurrencyLayerHandle, support::Record)) {
    let global = ConcurrencyLayer::new(max, GlobalKey).expect("valid");
    let inner = Inner::new();
    let record = inner.record.clone();
    let handle = global.handle();
    test(
        "GlobalKey",
        Layered::Global(global.layer(inner)),
        handle,
        record,
    );
    let keyed = ConcurrencyLayer::new(max, HeaderKey::new("x-key").expect("valid")).expect("valid");
    let inner = Inner::new();
    let record = inner.record.clone();
    let handle = keyed.handle();
    test(
        "header key",
        Layered::Keyed(keyed.layer(inner)),
        handle,
        record,
    );
}

type ConcurrencyLayerHandle = tower_throttle::concurrency::ConcurrencyHandle;

/// The service under test, on either kind of key.
#[derive(Clone)]
enum Layered {
    Global(tower_throttle::concurrency::Concurrency<Inner, GlobalKey>),
    Keyed(tower_throttle::concurrency::Concurrency<Inner, HeaderKey>),
}

impl Service<http::Request<()>> for Layered {
    type Response = Answer;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Answer, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        match self {
            Self::Global(s) => s.poll_ready(cx),
            Self::Keyed(s) => s.poll_ready(cx),
        }
    }

    fn call(&mut self, req: http::Request<()>) -> Self::Future {
        match self {
            Self::Global(s) => Box::pin(s.call(req)),
            Self::Keyed(s) => Box::pin(s.call(req)),
        }
    }
}

fn in_flight(handle: &ConcurrencyLayerHandle) -> u64 {
    handle.stats().aggregate.in_flight.unwrap_or(u64::MAX)
}

#[test]
fn max_in_flight_resized_down_keeps_requests_in_flight_and_new_ones_wait_below_the_new_limit() {
    each_layer(3, |kind, svc, handle, record| {
        // Three in flight (their responses held), two waiting.
        let mut held: Vec<Answer> = (0..3)
            .map(|seq| {
                let mut sent = send(&svc, seq);
                assert_ready_ok!(sent.poll(), "{kind}")
            })
            .collect();
        let mut waiting: Vec<_> = (3..5).map(|seq| send(&svc, seq)).collect();
        for w in &mut waiting {
            assert_pending!(w.poll(), "{kind}");
        }
        handle.set_max_in_flight(1).expect("valid");
        assert_eq!(handle.max_in_flight(), 1);
        // Nothing in flight is dropped.
        assert_eq!(in_flight(&handle), 3, "{kind}");
        assert_eq!(record.calls(), 3, "{kind}");
        // Two finish: still not below the new limit, nobody goes.
        held.pop();
        held.pop();
        for w in &mut waiting {
            assert_pending!(
                w.poll(),
                "{kind}: a waiter went while the limit was reached"
            );
        }
        // A newcomer waits too, behind them.
        let mut late = send(&svc, 5);
        assert_pending!(late.poll(), "{kind}");
        // The last of the three finishes: the oldest waiter goes, alone.
        held.pop();
        let first = assert_ready_ok!(waiting[0].poll(), "{kind}");
        assert_pending!(waiting[1].poll(), "{kind}");
        assert_pending!(late.poll(), "{kind}");
        assert_eq!(in_flight(&handle), 1, "{kind}");
        drop(first);
        let second = assert_ready_ok!(waiting[1].poll(), "{kind}");
        assert_pending!(late.poll(), "{kind}");
        drop(second);
        let _last = assert_ready_ok!(late.poll(), "{kind}");
        assert_eq!(record.order(), vec![0, 1, 2, 3, 4, 5], "{kind}");
        assert_eq!(
            handle.stats().aggregate.rejected,
            0,
            "{kind}: nothing refused"
        );
    });
}

#[test]
fn max_in_flight_resized_up_grants_waiters_at_once_in_arrival_order() {
    each_layer(1, |kind, svc, handle, record| {
        let mut sent = send(&svc, 0);
        let _held = assert_ready_ok!(sent.poll(), "{kind}");
        let mut waiting: Vec<_> = (1..5).map(|seq| send(&svc, seq)).collect();
        for w in &mut waiting {
            assert_pending!(w.poll(), "{kind}");
        }
        // Two more permits: the two oldest waiters go, the others wait.
        handle.set_max_in_flight(3).expect("valid");
        assert!(
            waiting[0].is_woken() && waiting[1].is_woken(),
            "{kind}: not woken"
        );
        assert!(!waiting[2].is_woken(), "{kind}");
        let a = assert_ready_ok!(waiting[0].poll(), "{kind}");
        let _b = assert_ready_ok!(waiting[1].poll(), "{kind}");
        assert_pending!(waiting[2].poll(), "{kind}");
        assert_pending!(waiting[3].poll(), "{kind}");
        assert_eq!(in_flight(&handle), 3, "{kind}");
        // One finishes: the next in line, not a newcomer.
        let mut late = send(&svc, 5);
        assert_pending!(late.poll(), "{kind}");
        drop(a);
        let _c = assert_ready_ok!(waiting[2].poll(), "{kind}");
        assert_pending!(waiting[3].poll(), "{kind}");
        assert_pending!(late.poll(), "{kind}");
        assert_eq!(record.order(), vec![0, 1, 2, 3], "{kind}");
    });
}

#[test]
fn max_in_flight_of_zero_is_refused_and_changes_nothing() {
    each_layer(2, |kind, _svc, handle, _record| {
        let error = handle.set_max_in_flight(0).unwrap_err();
        assert_eq!(error.field, "max_in_flight", "{kind}");
        assert_eq!(handle.max_in_flight(), 2, "{kind}");
    });
}

#[test]
fn concurrency_switched_off_passes_everything_and_back_on_counts_what_is_in_flight() {
    each_layer(1, |kind, svc, handle, record| {
        let mut sent = send(&svc, 0);
        let first = assert_ready_ok!(sent.poll(), "{kind}");
        let mut waiting = send(&svc, 1);
        assert_pending!(waiting.poll(), "{kind}");
        handle.set_enabled(false);
        assert!(!handle.is_enabled());
        // The waiter goes at once, and so does every newcomer.
        let second = assert_ready_ok!(waiting.poll(), "{kind}");
        let others: Vec<Answer> = (2..5)
            .map(|seq| {
                let mut sent = send(&svc, seq);
                assert_ready_ok!(sent.poll(), "{kind}")
            })
            .collect();
        assert_eq!(record.calls(), 5, "{kind}");
        // Back on: what is in flight counts against the limit again.
        handle.set_enabled(true);
        let mut late = send(&svc, 5);
        assert_pending!(late.poll(), "{kind}");
        drop(others);
        drop(second);
        assert_pending!(late.poll(), "{kind}: four were still in flight");
        drop(first);
        let _late = assert_ready_ok!(late.poll(), "{kind}");
    });
}

#[tokio::test]
async fn a_request_without_a_key_passes_while_concurrency_is_off() {
    let layer = ConcurrencyLayer::new(1, HeaderKey::new("x-key").expect("valid")).expect("valid");
    let handle = layer.handle();
    let svc = layer.layer(Inner::new());
    let keyless = || http::Request::new(());
    assert!(svc.clone().oneshot(keyless()).await.is_err());
    handle.set_enabled(false);
    assert!(svc.clone().oneshot(keyless()).await.is_ok());
}
