//! Loom models of the concurrency permits (src/concurrency/permits.rs):
//! the permit word taken and given back by compare-and-swap, the QUEUED flag
//! set and cleared under the key's lock, a permit handed to the oldest
//! waiter, a waiter leaving as a permit comes back, and the single key's
//! admissions moved out of its word (every two admissions under
//! `cfg(loom)`). Each model holds a permit and queues waiters first, then
//! races threads over them, and checks:
//!
//! - never more than the limit out: the one permit guards a loom
//!   `UnsafeCell`, which loom reports if two threads touch it without the
//!   permit ordering them (so also a permit taken without synchronizing
//!   with the one given back);
//! - no permit lost, and every waiter granted or gone: a waiter that is
//!   never woken is a deadlock, which loom reports, and at the end the key
//!   is at rest (nothing out, no flag, no waiter) and a permit is free;
//! - no permit to a newcomer ahead of a waiter;
//! - the stats' gauges (queued, in flight) back at zero, and the totals
//!   exact.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test 'loom_*'`.
#![cfg(loom)]

#[path = "support/loom.rs"]
mod support;

use std::sync::atomic::Ordering::Relaxed;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::AtomicBool;
use loom::thread;
use tower_throttle::concurrency::Permit;
use tower_throttle::loom_api::{Acquired, Handed, Key, Rest, Waiting};

use support::{block_until, model};

fn granted(acquired: Acquired) -> Permit {
    match acquired {
        Acquired::Granted(permit) => permit,
        _ => panic!("expected a permit"),
    }
}

fn queued(acquired: Acquired) -> Waiting {
    match acquired {
        Acquired::Queued(waiting) => waiting,
        _ => panic!("expected a place in the queue"),
    }
}

/// Wait until the permit is handed over.
fn wait(waiting: Waiting) -> Handed {
    block_until(|waker| {
        waiting
            .poll_granted(&mut std::task::Context::from_waker(waker))
            .is_ready()
    });
    waiting.into_granted()
}

/// Take a permit, waiting in the queue if need be, and send the request.
fn take(key: &Key) -> Permit {
    match key.acquire(8) {
        Acquired::Granted(permit) => permit,
        Acquired::Queued(waiting) => wait(waiting).enter(),
        Acquired::Full => panic!("the queue is never full here"),
    }
}

/// What one permit guards: touched only by the holder of the permit.
#[derive(Clone)]
struct Guarded(Arc<UnsafeCell<u64>>);

impl Guarded {
    fn new() -> Self {
        Self(Arc::new(UnsafeCell::new(0)))
    }

    /// Use what the permit guards; loom panics if another thread does so
    /// at the same time, or without having synchronized with the last user.
    fn touch(&self, _permit: &Permit) {
        // SAFETY: the permit (a limit of one) makes this access exclusive;
        // that is what the model checks.
        self.0.with_mut(|n| unsafe { *n += 1 });
    }

    fn uses(&self) -> u64 {
        // SAFETY: every thread has been joined.
        self.0.with(|n| unsafe { *n })
    }
}

fn assert_at_rest(key: &Key) {
    let rest = key.rest();
    assert_eq!(
        (rest.out, rest.queued_flag, rest.waiters, rest.granted),
        (0, false, 0, 0),
        "{rest:?}"
    );
    // No permit lost: one is free, at once.
    drop(granted(key.acquire(0)));
}

/// The single key's `admitted` admissions are all counted, moved out of
/// its word in twos (its `CARRY` under loom), and the word never holds more
/// than one past that: a locked taker moves them out before it adds one,
/// but may add one more when a lock-free taker raced it to the last below
/// `CARRY`; far from the flag either way.
fn assert_carried_in_twos(rest: Rest, admitted: u64) {
    assert_eq!(rest.carried + rest.in_word, admitted, "{rest:?}");
    assert_eq!(rest.carried % 2, 0, "{rest:?}");
    assert!(rest.in_word <= 3, "{rest:?}");
}

fn assert_gauges_at_zero(key: &Key) {
    let stats = key.stats();
    assert_eq!(stats.aggregate.in_flight, Some(0), "{stats:?}");
    assert_eq!(stats.aggregate.queued_now, 0, "{stats:?}");
    for tally in &stats.keys {
        assert_eq!(
            (tally.in_flight, tally.queued_now),
            (Some(0), 0),
            "{tally:?}"
        );
    }
}

/// A permit given back while one request waits goes to it, not to a
/// request that comes meanwhile: the newcomer gets a permit only after the
/// waiter has had its turn.
#[test]
fn a_permit_given_back_goes_to_the_waiter_not_to_a_newcomer() {
    model(|| {
        let key = Arc::new(Key::keyed(1, true));
        let guarded = Guarded::new();
        let waiter_done = Arc::new(AtomicBool::new(false));
        let held = granted(key.acquire(8));
        let waiting = queued(key.acquire(8));

        let releaser = thread::spawn(move || drop(held));
        let waiter = thread::spawn({
            let (guarded, done) = (guarded.clone(), waiter_done.clone());
            move || {
                let permit = wait(waiting).enter();
                guarded.touch(&permit);
                // Relaxed: only the permit's own synchronization makes this
                // visible to the next holder.
                done.store(true, Relaxed);
            }
        });
        let newcomer = thread::spawn({
            let (key, guarded, done) = (key.clone(), guarded.clone(), waiter_done.clone());
            move || {
                let permit = take(&key);
                assert!(
                    done.load(Relaxed),
                    "a newcomer took the permit ahead of the waiter, or without seeing what the waiter did with it"
                );
                guarded.touch(&permit);
            }
        });
        for thread in [releaser, waiter, newcomer] {
            thread.join().unwrap();
        }

        assert_eq!(guarded.uses(), 2);
        assert!(key.rest().free);
        assert_at_rest(&key);
        assert_gauges_at_zero(&key);
        let stats = key.stats().aggregate;
        // The held one, the waiter, the newcomer, the check's own.
        assert_eq!((stats.admitted, stats.rejected), (4, 0), "{stats:?}");
    });
}

/// A waiter dropped while the permit comes back: it leaves the queue, or
/// passes on the permit it was handed meanwhile; the waiter behind it gets
/// the permit either way.
#[test]
fn a_waiter_dropped_as_the_permit_comes_back_does_not_lose_it() {
    model(|| {
        let key = Arc::new(Key::keyed(1, true));
        let guarded = Guarded::new();
        let held = granted(key.acquire(8));
        let first = queued(key.acquire(8));
        let second = queued(key.acquire(8));

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || drop(first));
        let waiter = thread::spawn({
            let guarded = guarded.clone();
            move || {
                let permit = wait(second).enter();
                guarded.touch(&permit);
            }
        });
        for thread in [releaser, canceller, waiter] {
            thread.join().unwrap();
        }

        assert_eq!(guarded.uses(), 1);
        assert_at_rest(&key);
        assert_gauges_at_zero(&key);
        let stats = key.stats().aggregate;
        assert_eq!((stats.admitted, stats.waited), (3, 1), "{stats:?}");
    });
}

/// The single key counts its admissions in its word and moves them out
/// under its lock every two (under `cfg(loom)`): racing takers, waiters and
/// a release lose none, and the count never reaches the flag.
#[test]
fn the_single_key_moves_its_admissions_out_of_its_word_under_racing_takers() {
    model(|| {
        let key = Arc::new(Key::single(1));
        let guarded = Guarded::new();
        let held = granted(key.acquire(8));

        let releaser = thread::spawn(move || drop(held));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let (key, guarded) = (key.clone(), guarded.clone());
                thread::spawn(move || {
                    let permit = take(&key);
                    guarded.touch(&permit);
                })
            })
            .collect();
        releaser.join().unwrap();
        for taker in takers {
            taker.join().unwrap();
        }

        assert_eq!(guarded.uses(), 2);
        let rest = key.rest();
        assert_eq!(rest.own_counts, (3, 3), "{rest:?}");
        assert_carried_in_twos(rest, 3);
        assert_gauges_at_zero(&key);
        assert_at_rest(&key);
        assert_eq!(key.stats().aggregate.admitted, 4);
    });
}

/// The single key's waiter gives up as the permit comes back: handed the
/// permit meanwhile, it passes it on uncounted; the waiter behind gets it.
#[test]
fn the_single_key_passes_on_a_permit_handed_to_a_waiter_that_gave_up() {
    model(|| {
        let key = Arc::new(Key::single(1));
        let guarded = Guarded::new();
        let held = granted(key.acquire(8));
        let first = queued(key.acquire(8));
        let second = queued(key.acquire(8));

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || {
            if let Err(handed) = first.give_up() {
                drop(handed);
            }
        });
        let waiter = thread::spawn({
            let guarded = guarded.clone();
            move || {
                let permit = wait(second).enter();
                guarded.touch(&permit);
            }
        });
        for thread in [releaser, canceller, waiter] {
            thread.join().unwrap();
        }

        assert_eq!(guarded.uses(), 1);
        let rest = key.rest();
        assert_eq!(rest.own_counts, (2, 2), "{rest:?}");
        assert_carried_in_twos(rest, 2);
        assert_gauges_at_zero(&key);
        assert_at_rest(&key);
    });
}
