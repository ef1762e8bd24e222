//! The permits' unit tests.

use super::*;

fn granted(acquire: Acquire) -> Permit {
    match acquire {
        Acquire::Granted(permit) => permit,
        _ => panic!("expected a permit"),
    }
}

fn queued(acquire: Acquire) -> QueueTicket {
    match acquire {
        Acquire::Queued(ticket) => ticket,
        _ => panic!("expected a place in the queue"),
    }
}

#[test]
fn the_single_key_moves_its_admissions_out_of_its_word_and_loses_none() {
    let permits = Permits::new(1, KeyTracking::default());
    let single = permits.single();
    let text = || String::from("(global)");
    // As if CARRY - 1 requests had come and gone.
    single.word.store((CARRY - 1) * ADMITTED, Ordering::Relaxed);
    let mut admitted = CARRY - 1;
    for _ in 0..3 {
        // Lock-free while the count is short of CARRY, then under the
        // lock; the second request waits and is handed the permit.
        let first = granted(single.acquire(usize::MAX, Lane::of(0), None, &text));
        let second = queued(single.acquire(usize::MAX, Lane::of(0), None, &text));
        drop(first);
        let second = second.into_granted().enter();
        admitted += 2;
        assert_eq!(single.own_counts(), (admitted, admitted - 1));
        drop(second);
        assert_eq!(single.own_counts(), (admitted, admitted));
    }
    assert_eq!(single.queue.lock().carried, CARRY);
    assert!(single.word.load(Ordering::Relaxed) < FREE_BELOW);
    let stats = permits.stats.snapshot().aggregate;
    assert_eq!(
        (stats.admitted, stats.waited, stats.in_flight),
        (admitted, 3, Some(0))
    );
}

/// A pace learned in a slow spell does not refuse every wait after it: a
/// permit nobody waited for lowers it; a higher one nobody waited for
/// leaves it; one waited for sets it.
#[test]
fn the_pace_is_set_by_waited_for_permits_and_lowered_by_any() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = permits.single();
    let text = || String::from("(global)");
    let secs = Duration::from_secs;
    let pace = || key.queue.lock().pace;
    // Nobody waits: no pace yet, whatever it took.
    granted(key.acquire(usize::MAX, Lane::of(0), None, &text)).held_for(secs(40));
    assert_eq!(pace(), None);
    // Waited for: 40 s a turn.
    let holder = granted(key.acquire(usize::MAX, Lane::of(0), None, &text));
    let waiting = queued(key.acquire(usize::MAX, Lane::of(0), None, &text));
    holder.held_for(secs(40));
    drop(holder);
    assert_eq!(pace(), Some(secs(40)));
    // With that pace, a second waiter behind the first would be too long
    // for a minute.
    let holder = waiting.into_granted().enter();
    let first = queued(key.acquire(usize::MAX, Lane::of(7), Some(secs(60)), &text));
    let too_long = key.acquire(usize::MAX, Lane::of(7), Some(secs(60)), &text);
    assert!(matches!(too_long, Acquire::TooLong(w) if w == secs(80)));
    drop(first);
    // Quick turns nobody waited for bring it down; a slow one does not
    // raise it.
    holder.held_for(secs(80));
    drop(holder);
    assert_eq!(pace(), Some(secs(40)));
    for _ in 0..8 {
        granted(key.acquire(usize::MAX, Lane::of(0), None, &text)).held_for(Duration::ZERO);
    }
    assert!(pace().is_some_and(|p| p < secs(5)), "{:?}", pace());
}

/// A request that may not wait makes no room in a full line: it is
/// refused, and nobody is pushed out.
#[test]
fn a_request_that_may_not_wait_pushes_nobody_out() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = permits.single();
    let text = || String::from("(global)");
    let _holder = granted(key.acquire(usize::MAX, Lane::of(1), None, &text));
    let _first = queued(key.acquire(usize::MAX, Lane::of(1), None, &text));
    let _second = queued(key.acquire(usize::MAX, Lane::of(1), None, &text));
    assert!(matches!(
        key.acquire(0, Lane::of(2), None, &text),
        Acquire::Full
    ));
    assert_eq!(key.queue.lock().waiters.len(), 2);
    assert!(key.queue.lock().pushed_out.is_empty());
}
