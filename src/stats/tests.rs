//! The stats' unit tests.

use std::sync::atomic::AtomicBool;

use super::*;

#[test]
fn a_request_that_came_as_other_leaves_as_other_once_its_key_is_counted_apart() {
    let accept = Arc::new(AtomicBool::new(false));
    let filter = {
        let accept = accept.clone();
        move |_: &str| accept.load(Ordering::SeqCst)
    };
    let stats = Stats::new(KeyTracking::filtered(10, filter)).tracking_in_flight();
    let key = KeyHash(1);
    let name = || "route".to_owned();
    // One request comes while the key is not counted apart, a second
    // once it is; both leave.
    stats.record(key, Event::Queued, &name);
    stats.record(key, Event::Entered, &name);
    accept.store(true, Ordering::SeqCst);
    stats.record(key, Event::Queued, &name);
    stats.record(key, Event::Entered, &name);
    for _ in 0..2 {
        stats.record(key, Event::Dequeued(None), &name);
        stats.record(key, Event::Left, &name);
    }
    let snapshot = stats.snapshot();
    for tally in &snapshot.keys {
        assert_eq!(
            (tally.in_flight, tally.queued_now),
            (Some(0), 0),
            "{}: gauges back at rest",
            tally.key
        );
    }
    assert_eq!(snapshot.keys.len(), 2, "{:?}", snapshot.keys);
}
