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

#[test]
fn the_permits_show_what_is_out_and_whether_requests_wait() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = permits.single();
    let text = || String::from("(global)");
    assert_eq!(
        format!("{key:?}"),
        "KeyState { in_flight: 0, queued: false, .. }"
    );
    let permit = granted(key.acquire(usize::MAX, Lane::ONE, None, &text));
    assert_eq!(
        format!("{key:?}"),
        "KeyState { in_flight: 1, queued: false, .. }"
    );
    let waiter = queued(key.acquire(usize::MAX, Lane::ONE, None, &text));
    assert_eq!(
        format!("{key:?}"),
        "KeyState { in_flight: 1, queued: true, .. }"
    );
    assert_eq!(format!("{permit:?}"), "Permit { .. }");
    assert_eq!(format!("{waiter:?}"), "QueueTicket { ticket: 0, .. }");
    let shown = format!("{permits:?}");
    assert!(
        shown.starts_with("Permits { max_in_flight: 1, enabled: true, stats: "),
        "{shown}"
    );
    drop(waiter);
    drop(permit);
}

/// While nobody waits, taking a permit and giving it back take no lock:
/// with the key's lock held on another thread, both still complete (the
/// locked path would wait for it). For the single key, which counts its
/// own admissions, and for a key in the store.
#[test]
fn taking_and_giving_back_a_permit_while_nobody_waits_takes_no_lock() {
    let permits = Permits::new(2, KeyTracking::default());
    let stored = permits.key_state(permits.seed().hash_parts(&["k"]));
    for state in [permits.single(), &stored] {
        let held = state.queue.lock();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(move || {
                let text = || String::from("k");
                drop(granted(state.acquire(usize::MAX, Lane::ONE, None, &text)));
                let _ = done.send(());
            });
            // A deadlock guard only: the lock-free path finishes at once.
            let finished = finished.recv_timeout(Duration::from_secs(60));
            drop(held);
            assert!(
                finished.is_ok(),
                "the lock-free path waited for the key's lock"
            );
        });
    }
}

/// The store keeps at most `LINGER` idle states per shard (64 shards): a
/// key whose last permit goes back, and one a service remembered when the
/// service goes, are dropped past that; a key with a permit out never is.
#[test]
fn idle_keys_are_forgotten_past_linger_and_a_busy_one_never() {
    let text = || String::from("k");
    let most = 64 * LINGER;
    let key = |permits: &Permits, i: usize| permits.seed().hash_parts(&[i.to_string()]);
    let permits = Permits::new(1, KeyTracking::default());
    let busy = permits.key_state(key(&permits, usize::MAX));
    let held = granted(busy.acquire(usize::MAX, Lane::ONE, None, &text));
    for i in 0..3 * most {
        let state = permits.key_state(key(&permits, i));
        let permit = granted(state.acquire(usize::MAX, Lane::ONE, None, &text));
        drop(state);
        drop(permit);
    }
    assert!(permits.key_count() <= most, "{} keys", permits.key_count());
    // The busy key kept its state: its one permit is still out.
    assert!(matches!(
        permits
            .key_state(key(&permits, usize::MAX))
            .acquire(0, Lane::ONE, None, &text),
        Acquire::Full
    ));
    drop(held);

    let permits = Permits::new(1, KeyTracking::default());
    for i in 0..3 * most {
        let mut last = LastKey::default();
        last.state(key(&permits, i), &permits);
        drop(last);
    }
    assert!(permits.key_count() <= most, "{} keys", permits.key_count());
}

struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A waiter polled again from another task (a new waker) is woken there
/// when its permit comes, not where it was first polled.
#[test]
fn a_waiter_polled_with_a_new_waker_is_woken_through_it() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = permits.single();
    let text = || String::from("(global)");
    let permit = granted(key.acquire(usize::MAX, Lane::ONE, None, &text));
    let ticket = queued(key.acquire(usize::MAX, Lane::ONE, None, &text));
    let wakes = [0, 1].map(|_| Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0))));
    for w in &wakes {
        let waker = std::task::Waker::from(w.clone());
        assert!(
            ticket
                .poll_granted(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    drop(permit);
    let woken = wakes.map(|w| w.0.load(Ordering::Relaxed));
    assert_eq!(woken, [0, 1]);
    drop(ticket);
}

/// A permit taken under the key's lock (here: the admissions count is due
/// to move out of the word) records its lane as the last served, as the
/// lock-free path does.
#[test]
fn a_permit_taken_under_the_lock_records_its_lane() {
    let permits = Permits::new(1, KeyTracking::default());
    let single = permits.single();
    let text = || String::from("(global)");
    single.word.store(FREE_BELOW, Ordering::Relaxed);
    let permit = granted(single.acquire(usize::MAX, Lane::of(7), None, &text));
    assert_eq!(single.last_lane.load(Ordering::Relaxed), 7);
    drop(permit);
}

/// At the line's pace, a wait exactly as long as `max_wait` joins the line;
/// a longer one is refused and leaves the key as it found it: its permit
/// out, no flag saying requests wait.
#[test]
fn a_wait_of_exactly_max_wait_joins_the_line_and_a_longer_one_changes_nothing() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = permits.single();
    let text = || String::from("(global)");
    let permit = granted(key.acquire(usize::MAX, Lane::ONE, None, &text));
    let pace = Duration::from_secs(10);
    key.queue.lock().pace = Some(pace);
    // Nobody waits: one turn, the permit out.
    let shorter = Some(pace - Duration::from_nanos(1));
    assert!(matches!(
        key.acquire(usize::MAX, Lane::ONE, shorter, &text),
        Acquire::TooLong(longest) if longest == pace
    ));
    let word = key.word.load(Ordering::Relaxed);
    assert_eq!((word & OUT, word & QUEUED), (1, 0));
    let ticket = queued(key.acquire(usize::MAX, Lane::ONE, Some(pace), &text));
    drop(ticket);
    drop(permit);
}

/// Dropping an idle state from the store checks, under the shard's lock,
/// that nobody else holds it: a request that took the state from the store
/// after its last holder looked must find it still there (else a second
/// state for the key would let twice the limit in).
#[test]
fn a_state_someone_else_holds_is_kept_in_the_store() {
    let permits = Permits::new(1, KeyTracking::default());
    let key = |i: usize| permits.seed().hash_parts(&[i.to_string()]);
    // Every shard past LINGER, so that idle states may go.
    for i in 0..3 * 64 * LINGER {
        drop(permits.key_state(key(i)));
    }
    let state = permits.key_state(key(0));
    // Its last holder saw only itself and the store; since, a request on
    // the key took the state too.
    let other = permits.key_state(key(0));
    permits.forget_if_idle(&state);
    assert!(Arc::ptr_eq(&permits.key_state(key(0)), &other));
    drop(other);
    permits.forget_if_idle(&state);
    assert!(
        !Arc::ptr_eq(&permits.key_state(key(0)), &state),
        "idle: dropped"
    );
}
