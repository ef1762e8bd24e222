//! Loom models of the rate limiter's wait lines (src/rate_limit/lines.rs):
//! a waiter gives way to those booked ahead of it for their grace, whoever
//! leaves wakes the next, and past its grace one still polled is woken to
//! go first. Tokio's clock cannot run under loom, so the models pass the
//! time in as a value (`Lines::check_at`): each waiter's clock moves only
//! when it sleeps until the instant the line gave it.
//!
//! Each model checks the order in which waiters go, that every waiter goes
//! or leaves (a wake that never comes is a deadlock, which loom reports),
//! and that the line is gone, its count at zero, once all have left.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release --test 'loom_*'`.
#![cfg(loom)]

#[path = "support/loom.rs"]
mod support;

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::task::Waker;
use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64};
use loom::thread;
use tokio::time::Instant;
use tower_throttle::loom_api::{GRACE, HANDOVER, Line};

use support::{block_until, model};

/// Wait, at `now`, until nothing ahead holds `turn` back: only a wake (by
/// one ahead leaving) makes it look again, as the clock does not move (all
/// within the grace of those ahead).
fn go_when_woken(line: &Line, turn: u64, now: Instant) {
    block_until(|waker| line.check(turn, waker, || now).is_none());
}

/// Two waiters due together and one between them that gives up: the
/// first goes, then the last, woken in turn by those that leave; none goes
/// while one ahead of it is within its grace.
#[test]
fn waiters_due_together_go_in_turn_woken_by_those_that_leave() {
    model(|| {
        let line = Arc::new(Line::default());
        let due = Instant::now();
        let first = line.join(due);
        let quitter = line.join(due);
        let last = line.join(due);
        let first_gone = Arc::new(AtomicBool::new(false));

        let a = thread::spawn({
            let (line, gone) = (line.clone(), first_gone.clone());
            move || {
                go_when_woken(&line, first, due);
                // Relaxed: only the line's own synchronization orders this
                // before the next one's going.
                gone.store(true, Relaxed);
                line.leave(first);
            }
        });
        let q = thread::spawn({
            let line = line.clone();
            move || {
                // Polled once (it waits for the first), then dropped.
                let _ = line.check(quitter, Waker::noop(), || due);
                line.leave(quitter);
            }
        });
        let b = thread::spawn({
            let (line, gone) = (line.clone(), first_gone.clone());
            move || {
                go_when_woken(&line, last, due);
                assert!(gone.load(Relaxed), "went ahead of a waiter in its grace");
                line.leave(last);
            }
        });
        for thread in [a, q, b] {
            thread.join().unwrap();
        }
        assert!(line.is_empty());
    });
}

/// One booked ahead that is never polled holds the line for its grace
/// only; past it, a waiter that was polled goes before the one behind it,
/// unless it fails to go within the handover.
#[test]
fn past_its_grace_a_stuck_waiter_is_passed_and_one_still_polled_goes_first() {
    model(|| {
        let line = Arc::new(Line::default());
        let due = Instant::now();
        // The time, as nanoseconds after `due`: one clock for all, which a
        // waiter moves on when it sleeps until the instant the line gave it
        // (the timer fires; a wake would only make it look sooner).
        let clock = Arc::new(AtomicU64::new(0));
        let stuck = line.join(due);
        let first = line.join(due);
        let last = line.join(due);
        let first_gone = Arc::new(AtomicBool::new(false));
        // `first` was polled, and found the stuck one ahead (a waiter
        // never polled by then is treated as gone once its grace is over).
        assert_eq!(line.check(first, Waker::noop(), || due), Some(due + GRACE));

        // Waits for `turn`'s going; each instant the line gives it is
        // passed to `given`; returns the time it went.
        let wait = move |line: &Line, clock: &AtomicU64, turn: u64, given: &dyn Fn(Instant)| {
            let now = || due + Duration::from_nanos(clock.load(SeqCst));
            loop {
                let mut went_at = due;
                let blocked = line.check(turn, Waker::noop(), || {
                    went_at = now();
                    went_at
                });
                let Some(until) = blocked else {
                    return went_at;
                };
                given(until);
                assert!(until > went_at, "a line that gives no time spins");
                clock.fetch_max((until - due).as_nanos() as u64, SeqCst);
            }
        };
        let a = thread::spawn({
            let (line, clock, gone) = (line.clone(), clock.clone(), first_gone.clone());
            move || {
                wait(&line, &clock, first, &|until| {
                    assert_eq!(until, due + GRACE, "held beyond the stuck one's grace");
                });
                gone.store(true, Relaxed);
                line.leave(first);
            }
        });
        let b = thread::spawn({
            let (line, clock, gone) = (line.clone(), clock.clone(), first_gone.clone());
            move || {
                let went = wait(&line, &clock, last, &|_| {});
                assert!(went <= due + GRACE + HANDOVER, "held too long");
                assert!(
                    gone.load(Relaxed) || went == due + GRACE + HANDOVER,
                    "passed one ahead that was polled, before its handover"
                );
                line.leave(last);
            }
        });
        a.join().unwrap();
        b.join().unwrap();
        line.leave(stuck);
        assert!(line.is_empty());
    });
}

/// A request that could go at once while a waiter is due lines up behind
/// it (or goes, once the waiter has left), and is woken when it leaves.
#[test]
fn a_request_that_could_go_lines_up_behind_a_due_waiter_as_it_leaves() {
    model(|| {
        let line = Arc::new(Line::default());
        let due = Instant::now();
        let waiter = line.join(due);
        let waiter_gone = Arc::new(AtomicBool::new(false));

        let a = thread::spawn({
            let (line, gone) = (line.clone(), waiter_gone.clone());
            move || {
                go_when_woken(&line, waiter, due);
                gone.store(true, Relaxed);
                line.leave(waiter);
            }
        });
        let newcomer = thread::spawn({
            let (line, gone) = (line.clone(), waiter_gone.clone());
            move || {
                if let Some(turn) = line.join_if_due(due) {
                    go_when_woken(&line, turn, due);
                    assert!(gone.load(Relaxed), "went ahead of a due waiter");
                    line.leave(turn);
                }
            }
        });
        a.join().unwrap();
        newcomer.join().unwrap();
        assert!(line.is_empty());
    });
}
