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
        let first = granted(single.acquire(usize::MAX, 0, None, &text));
        let second = queued(single.acquire(usize::MAX, 0, None, &text));
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
