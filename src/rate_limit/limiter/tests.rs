//! The limiter's unit tests: policies, retunes and the switches, on a
//! manual clock.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::clock::ManualClock;

fn limiter(quotas: Vec<Quota>) -> Limiter {
    Limiter::new(
        quotas,
        Vec::new(),
        ClockSource::of(ManualClock::new()),
        KeyTracking::default(),
    )
}

/// One request of cost 1 on key `k`.
fn ask(limiter: &Limiter, max_wait: Nanos, want: Want) -> Decision {
    let policy = limiter.policy();
    let key = limiter.seed().hash_parts(&["k"]);
    limiter.acquire(&policy, key, 1, max_wait, &KeyTexts::default, want)
}

fn per_second(n: u32) -> Quota {
    Quota::per_second(n).expect("a valid quota")
}

// `call` handles `Go` inline and everything else out of line: a plain
// admission must come back as `Go`, whatever the path.
#[test]
fn plain_admissions_are_go() {
    let plain = Want::default();
    for quotas in [
        vec![],
        vec![per_second(10)],
        vec![per_second(10), per_second(20)],
    ] {
        let limiter = limiter(quotas.clone());
        let decision = ask(&limiter, 0, plain);
        assert!(matches!(decision, Decision::Go), "{quotas:?}: {decision:?}");
    }
}

#[test]
fn a_dry_run_that_would_refuse_is_go() {
    for quotas in [vec![per_second(1)], vec![per_second(1), per_second(5)]] {
        let limiter = limiter(quotas.clone());
        assert!(matches!(ask(&limiter, 0, Want::default()), Decision::Go));
        let refused = ask(&limiter, 0, Want::default());
        assert!(matches!(refused, Decision::Denied(_)), "{refused:?}");
        limiter.set_dry_run(true);
        let decision = ask(&limiter, 0, Want::default());
        assert!(matches!(decision, Decision::Go), "{quotas:?}: {decision:?}");
    }
}

#[test]
fn what_was_asked_for_comes_back() {
    for quotas in [vec![per_second(10)], vec![per_second(10), per_second(20)]] {
        let limiter = limiter(quotas.clone());
        for (ticket, info) in [(true, false), (false, true), (true, true)] {
            let decision = ask(&limiter, 0, Want { ticket, info });
            let Decision::Now {
                ticket: given,
                info: told,
            } = &decision
            else {
                panic!("{quotas:?}: {decision:?}");
            };
            assert_eq!(
                (given.is_some(), told.is_some()),
                (ticket, info),
                "{quotas:?}"
            );
        }
    }
}

#[test]
fn a_request_that_must_wait_is_later() {
    let limiter = limiter(vec![per_second(1)]);
    let second = 1_000_000_000;
    assert!(matches!(
        ask(&limiter, second, Want::default()),
        Decision::Go
    ));
    let decision = ask(&limiter, second, Want::default());
    assert!(
        matches!(decision, Decision::Later { due: false, .. }),
        "{decision:?}"
    );
}

/// Where a decision books its request.
fn booked_at(decision: &Decision) -> Nanos {
    match decision {
        Decision::Now {
            ticket: Some(ticket),
            ..
        }
        | Decision::Later { ticket, .. } => ticket.grants[0].at,
        other => panic!("not booked: {other:?}"),
    }
}

// Eight threads book on one key in wait mode while a ninth retunes it
// between two rates as fast as it can, and the clock moves on. Exact
// instants, so no timer is involved: every booking keeps its thread's
// order, and none comes sooner after the one before than the faster
// rate allows (burst 1), which a retune landing between waiters breaks.
#[test]
fn threads_booking_through_retunes_keep_their_order_and_the_faster_rate() {
    let slow = || vec![per_second(200).with_burst(1).expect("valid")];
    let fast = || vec![per_second(400).with_burst(1).expect("valid")];
    let fast_emission = 1_000_000_000 / 400;
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::new(
        slow(),
        Vec::new(),
        ClockSource::of(clock.clone()),
        KeyTracking::default(),
    ));
    let key = limiter.seed().hash_parts(&["k"]);
    let done = Arc::new(AtomicBool::new(false));
    let retuner = {
        let (limiter, done) = (limiter.clone(), done.clone());
        std::thread::spawn(move || {
            for retune in 0..200 {
                let quotas = if retune % 2 == 0 { fast() } else { slow() };
                limiter.retune(quotas, Vec::new()).expect("valid");
                std::thread::yield_now();
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    let want = Want {
        ticket: true,
        info: false,
    };
    let submitters: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, clock, done) = (limiter.clone(), clock.clone(), done.clone());
            std::thread::spawn(move || {
                let mut policy = limiter.policy();
                let mut booked = Vec::new();
                // Until the retunes are over, and a while on its own.
                for i in 0..20_000 {
                    if done.load(Ordering::Relaxed) && i >= 400 {
                        break;
                    }
                    limiter.refresh(&mut policy);
                    let wait = 1_000_000_000_000;
                    let decision = limiter.acquire(&policy, key, 1, wait, &KeyTexts::default, want);
                    booked.push(booked_at(&decision));
                    if i % 40 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    std::thread::yield_now();
                }
                booked
            })
        })
        .collect();
    retuner.join().expect("no panic");
    let mut all = Vec::new();
    for submitter in submitters {
        let booked = submitter.join().expect("no panic");
        assert!(
            booked.windows(2).all(|w| w[0] <= w[1]),
            "a thread's later request was booked before its earlier one"
        );
        all.extend(booked);
    }
    all.sort_unstable();
    for pair in all.windows(2) {
        assert!(
            pair[1] - pair[0] >= fast_emission,
            "bookings {} ns apart at {}; the faster rate allows {fast_emission}",
            pair[1] - pair[0],
            pair[0]
        );
    }
}
