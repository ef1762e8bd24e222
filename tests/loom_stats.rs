//! Loom models of the stats gauges (src/stats/): requests on one key
//! counted in and out on racing threads (on stripes they share, and in the
//! per-key table), with a snapshot taken meanwhile. The gauges (queued now, in flight) never read
//! below zero nor above what is there, and are back at zero, with the
//! totals exact, once every request has left.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test 'loom_*'`.
#![cfg(loom)]

#[path = "support/loom.rs"]
mod support;

use loom::sync::Arc;
use loom::thread;
use tower_throttle::loom_api::Counters;

use support::model;

/// A request in flight and a request waiting, counted in and out on racing
/// threads (sharing a stripe with the main thread or not) while a third
/// takes a snapshot: the gauges read within bounds meanwhile, and at zero
/// after.
#[test]
fn gauges_stay_in_bounds_and_return_to_zero_under_racing_requests() {
    model(|| {
        let stats = Arc::new(Counters::new(0));
        let flight = thread::spawn({
            let stats = stats.clone();
            move || {
                stats.entered(1);
                stats.left(1);
            }
        });
        let queue = thread::spawn({
            let stats = stats.clone();
            move || {
                stats.queued(1);
                stats.dequeued(1, false);
            }
        });
        let reader = thread::spawn({
            let stats = stats.clone();
            move || {
                let all = stats.snapshot().aggregate;
                // Read stripe by stripe, a request may be seen leaving and
                // not arriving: never below zero, never above one.
                assert!(all.queued_now <= 1, "{all:?}");
                assert!(all.in_flight.is_some_and(|n| n <= 1), "{all:?}");
            }
        });
        for thread in [flight, queue, reader] {
            thread.join().unwrap();
        }

        let all = stats.snapshot().aggregate;
        assert_eq!(
            (all.admitted, all.waited, all.queued_now, all.in_flight),
            (1, 0, 0, Some(0)),
            "{all:?}"
        );
    });
}

/// The same requests counted apart per key, the table behind its lock:
/// the key's gauges back at zero, nothing counted among the others.
#[test]
fn a_keys_gauges_return_to_zero_under_racing_requests() {
    model(|| {
        let stats = Arc::new(Counters::new(4));
        let requests: Vec<_> = (0..2)
            .map(|_| {
                let stats = stats.clone();
                thread::spawn(move || {
                    stats.queued(1);
                    stats.dequeued(1, true);
                    stats.entered(1);
                    stats.left(1);
                })
            })
            .collect();
        for thread in requests {
            thread.join().unwrap();
        }

        let snapshot = stats.snapshot();
        assert_eq!(snapshot.keys.len(), 1, "{:?}", snapshot.keys);
        let key = &snapshot.keys[0];
        assert_eq!(
            (
                key.key.as_str(),
                key.admitted,
                key.waited,
                key.queued_now,
                key.in_flight
            ),
            ("k1", 2, 2, 0, Some(0)),
            "{key:?}"
        );
        let all = &snapshot.aggregate;
        assert_eq!((all.queued_now, all.in_flight), (0, Some(0)), "{all:?}");
    });
}
