//! Unit tests of the pure parts: command line, schedules, inference, report.
//! They need no network; the end-to-end test is `tests/ratecheck.rs` (in this crate).
//!
//! Over 700 lines: the pure parts' tests in one place, each a short
//! timeline or command line, grouped by the part they check.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::cli::{Config, Mode, Out, UsageError};
use crate::probe::{Class, Outcome, Run, TransportKind};
use crate::report;
use crate::schedule::{
    self, Event, MAX_REQUESTS, Params, Phase, Plan, diagnose_burst, planned_requests,
    until_boundary, until_mid_window,
};

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn params(mode: Mode, rpm: u32, window: Duration) -> Params {
    Params {
        mode,
        rpm,
        burst: rpm,
        window,
        duration: secs(60),
        probe: secs(30),
        offset: ms(500),
        budget: None,
    }
}

/// 1_700_000_012.3 s after the epoch: 32.3 s into a minute.
const NOW: Duration = Duration::from_millis(1_700_000_012_300);

mod schedules {
    use super::*;

    #[test]
    fn sustained_120_rpm_starts_every_500_ms_from_zero() {
        let starts = schedule::sustained(120, secs(60), secs(60));
        assert_eq!(starts.len(), 120);
        assert_eq!(starts[..3], [ms(0), ms(500), ms(1000)]);
        assert_eq!(starts.last(), Some(&ms(59_500)));
    }

    #[test]
    fn sustained_starts_do_not_drift_when_the_interval_is_not_whole() {
        // 7 per minute: every 8.571428571... s; the 7th start is exactly 60 s.
        let starts = schedule::sustained(7, secs(60), secs(120));
        assert_eq!(starts.len(), 14);
        assert_eq!(starts[7], secs(60));
        assert_eq!(starts[1], Duration::from_nanos(8_571_428_571));
    }

    #[test]
    fn sustained_plan_overlaps_nothing_but_follows_the_window() {
        let p = Params {
            duration: secs(2),
            ..params(Mode::Sustained, 10, secs(1))
        };
        let plan = schedule::plan(&p, NOW).unwrap();
        let at: Vec<_> = plan.events.iter().map(|e| e.at).collect();
        assert_eq!(at, (0..20).map(|i| ms(i * 100)).collect::<Vec<_>>());
        assert!(plan.events.iter().all(|e| e.phase == Phase::Sustained));
        assert_eq!(plan.burst_at, None);
    }

    #[test]
    fn burst_of_5_is_five_starts_at_zero() {
        let p = Params {
            burst: 5,
            ..params(Mode::Burst, 100, secs(60))
        };
        let plan = schedule::plan(&p, NOW).unwrap();
        assert_eq!(plan.events.len(), 5);
        assert!(
            plan.events
                .iter()
                .all(|e| e.at.is_zero() && e.phase == Phase::Burst)
        );
        assert_eq!(plan.burst_at, Some(Duration::ZERO));
    }

    #[test]
    fn token_bucket_probes_at_the_refill_rate_after_the_burst() {
        // 120 per minute refills every 500 ms.
        let plan = schedule::plan(&params(Mode::TokenBucket, 120, secs(60)), NOW).unwrap();
        let (burst, probes): (Vec<&Event>, Vec<&Event>) =
            plan.events.iter().partition(|e| e.phase == Phase::Burst);
        assert_eq!(burst.len(), 120);
        assert!(burst.iter().all(|e| e.at.is_zero()));
        assert_eq!(probes.len(), 60);
        assert_eq!(probes[0].at, ms(500));
        assert_eq!(probes[1].at, ms(1000));
        assert_eq!(probes.last().map(|e| e.at), Some(secs(30)));
        assert!(probes.iter().all(|e| e.phase == Phase::RefillProbe));
        assert_eq!(plan.probe_interval, Some(ms(500)));
    }

    #[test]
    fn token_bucket_probes_at_least_once_a_second() {
        // 6 per minute refills every 10 s, but probes go every second.
        let plan = schedule::plan(&params(Mode::TokenBucket, 6, secs(60)), NOW).unwrap();
        let probes: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.phase == Phase::RefillProbe)
            .map(|e| e.at)
            .collect();
        assert_eq!(probes, (1..=30).map(secs).collect::<Vec<_>>());
        assert_eq!(plan.probe_interval, Some(secs(1)));
    }

    #[test]
    fn sliding_window_probes_once_a_second_after_the_burst() {
        let p = Params {
            probe: secs(90),
            burst: 3,
            ..params(Mode::SlidingWindow, 60, secs(60))
        };
        let plan = schedule::plan(&p, NOW).unwrap();
        assert_eq!(plan.events.len(), 3 + 90);
        assert!(
            plan.events[..3]
                .iter()
                .all(|e| e.at.is_zero() && e.phase == Phase::Burst)
        );
        let probes: Vec<_> = plan.events[3..].iter().map(|e| e.at).collect();
        assert_eq!(probes, (1..=90).map(secs).collect::<Vec<_>>());
    }

    #[test]
    fn until_boundary_is_strictly_in_the_future() {
        assert_eq!(until_boundary(secs(120), secs(60)), secs(60));
        assert_eq!(until_boundary(ms(120_001), secs(60)), ms(59_999));
        assert_eq!(until_boundary(NOW, secs(60)), ms(27_700));
        assert_eq!(until_mid_window(NOW, secs(60)), ms(57_700));
        assert_eq!(until_mid_window(secs(90), secs(60)), Duration::ZERO);
    }

    #[test]
    fn boundary_batches_straddle_the_next_boundary() {
        let p = Params {
            burst: 4,
            ..params(Mode::WindowBoundary, 10, secs(60))
        };
        let plan = schedule::plan(&p, NOW).unwrap();
        let b = plan.boundary.unwrap();
        assert_eq!(b.at, ms(27_700));
        assert_eq!(b.unix.as_nanos() % secs(60).as_nanos(), 0);
        let before: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.phase == Phase::BoundaryBefore)
            .collect();
        let after: Vec<_> = plan
            .events
            .iter()
            .filter(|e| e.phase == Phase::BoundaryAfter)
            .collect();
        assert_eq!(before.len(), 4);
        assert_eq!(after.len(), 4);
        assert!(before.iter().all(|e| e.at == ms(27_200)));
        assert!(after.iter().all(|e| e.at == ms(28_200)));
        // On the wall clock: 59.5 s into one minute, 0.5 s into the next.
        assert_eq!((NOW + before[0].at).as_millis() % 60_000, 59_500);
        assert_eq!((NOW + after[0].at).as_millis() % 60_000, 500);
    }

    #[test]
    fn boundary_too_close_to_catch_moves_to_the_next_one() {
        // 59.8 s into the minute: the boundary is 200 ms away, closer than
        // the 500 ms offset.
        let now = ms(1_700_000_039_800);
        let plan = schedule::plan(&params(Mode::WindowBoundary, 2, secs(60)), now).unwrap();
        let b = plan.boundary.unwrap();
        assert_eq!(b.at, ms(60_200));
        assert_eq!(plan.events[0].at, ms(59_700));
        assert_eq!((now + plan.events[0].at).as_millis() % 60_000, 59_500);
    }

    #[test]
    fn diagnose_bursts_half_a_window_before_a_boundary_then_probes_and_straddles_it() {
        let p = Params {
            probe: secs(3),
            offset: ms(200),
            budget: None,
            ..params(Mode::Diagnose, 10, secs(2))
        };
        let now = ms(1_700_000_000_700); // 0.7 s into a 2 s window
        let plan = schedule::plan(&p, now).unwrap();
        let t0 = plan.burst_at.unwrap();
        assert_eq!(t0, ms(300));
        assert_eq!((now + t0).as_millis() % 2000, 1000);
        let of = |phase| -> Vec<Duration> {
            plan.events
                .iter()
                .filter(|e| e.phase == phase)
                .map(|e| e.at)
                .collect()
        };
        assert_eq!(of(Phase::Burst), vec![t0; 15]);
        let b = plan.boundary.unwrap();
        assert_eq!(b.at, t0 + secs(1));
        assert_eq!(b.unix.as_millis() % 2000, 0);
        assert_eq!(of(Phase::BoundaryBefore), vec![b.at - ms(200); 10]);
        assert_eq!(of(Phase::BoundaryAfter), vec![b.at + ms(200); 10]);
        // Twice the expected rate (10 per 2 s), so a window is timed to a
        // twentieth of it.
        let probes = of(Phase::RefillProbe);
        assert_eq!(probes.len(), 30);
        assert_eq!(probes[0], t0 + ms(50));
        assert_eq!(probes.last(), Some(&(t0 + ms(2950))));
        // The end batch, a quarter window after the probes.
        assert_eq!(of(Phase::LateBatch), vec![t0 + secs(3) + ms(500); 10]);
        assert!(plan.events.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn diagnose_burst_oversends_by_half() {
        assert_eq!(diagnose_burst(1), 3);
        assert_eq!(diagnose_burst(10), 15);
        assert_eq!(diagnose_burst(60), 90);
        assert_eq!(diagnose_burst(u32::MAX), u32::MAX);
    }

    #[test]
    fn planned_requests_counts_what_the_plan_holds() {
        for mode in [
            Mode::Sustained,
            Mode::Burst,
            Mode::TokenBucket,
            Mode::SlidingWindow,
            Mode::WindowBoundary,
            Mode::Diagnose,
        ] {
            for (rpm, window) in [(1, secs(60)), (7, secs(60)), (120, secs(60)), (10, secs(2))] {
                let p = Params {
                    probe: window.mul_f64(1.5),
                    offset: window / 10,
                    budget: None,
                    ..params(mode, rpm, window)
                };
                let plan = schedule::plan(&p, NOW).unwrap();
                assert_eq!(
                    planned_requests(&p),
                    plan.events.len() as u128,
                    "{mode:?} {rpm}"
                );
            }
        }
    }

    #[test]
    fn huge_plans_are_refused_before_anything_is_allocated() {
        let p = params(Mode::Sustained, u32::MAX, secs(1));
        let err = schedule::plan(&p, NOW).unwrap_err();
        assert!(err.0 > u128::from(MAX_REQUESTS));
        assert!(err.to_string().contains("lower --rpm"));
    }
}

mod command_line {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, UsageError> {
        let mut all = vec!["ratecheck"];
        all.extend_from_slice(args);
        Config::from_args(all)
    }

    fn base(extra: &[&str]) -> Result<Config, UsageError> {
        let mut args = vec!["--url", "http://127.0.0.1:9/v1", "--rpm", "10"];
        args.extend_from_slice(extra);
        parse(&args)
    }

    #[test]
    fn zero_rpm_burst_and_concurrency_are_refused_with_exit_code_2() {
        use clap::Parser;
        for (flag, words) in [
            ("--rpm", "limit to probe"),
            ("--burst", "a burst sends"),
            ("--concurrency", "in flight"),
        ] {
            let mut args = vec!["ratecheck", "--url", "http://h/"];
            if flag != "--rpm" {
                args.extend(["--rpm", "5"]);
            }
            args.extend([flag, "0"]);
            let err = crate::cli::Cli::try_parse_from(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flag}");
            let msg = err.to_string();
            assert!(msg.contains(flag), "{msg}");
            assert!(msg.contains("must be at least 1"), "{msg}");
            assert!(msg.contains(words), "{msg}");
        }
    }

    #[test]
    fn durations_are_humantime_and_never_zero() {
        let c = base(&["--duration", "1m30s", "--window", "2s"]).unwrap();
        assert_eq!(c.duration, secs(90));
        assert_eq!(c.window, secs(2));
        assert!(
            base(&["--window", "0s"])
                .unwrap_err()
                .0
                .contains("longer than zero")
        );
        assert!(
            base(&["--duration", "soon"])
                .unwrap_err()
                .0
                .contains("duration")
        );
        assert!(
            base(&["--window", "48h"])
                .unwrap_err()
                .0
                .contains("at most 24h")
        );
    }

    #[test]
    fn defaults() {
        let c = base(&[]).unwrap();
        assert_eq!(c.mode, Mode::Sustained);
        assert_eq!(c.method, reqwest::Method::GET);
        assert_eq!(c.burst, 10, "--burst defaults to --rpm");
        assert_eq!(c.window, secs(60));
        assert_eq!(c.duration, secs(60));
        assert_eq!(c.offset, ms(500));
        assert_eq!(c.concurrency, 100);
        assert_eq!(c.out, Out::Summary);
        assert!(c.warnings.is_empty());
        let c = base(&["--mode", "sliding-window"]).unwrap();
        assert_eq!(c.probe, secs(90));
        let c = base(&["--mode", "sliding-window", "--window", "2s"]).unwrap();
        assert_eq!(c.probe, secs(3));
        let c = base(&["--mode", "token-bucket", "--window", "2s"]).unwrap();
        assert_eq!(c.probe, secs(30));
        assert_eq!(c.offset, ms(200), "short windows get a tenth as offset");
        let c = base(&["--mode", "diagnose", "--window", "2s", "--out", "-"]).unwrap();
        assert_eq!(c.probe, secs(4), "diagnose probes two windows");
        assert_eq!(c.out, Out::Stdout);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn diagnose_honours_probe_seconds_and_warns_when_they_are_too_few() {
        let c = base(&[
            "--mode",
            "diagnose",
            "--window",
            "2s",
            "--probe-seconds",
            "9",
        ])
        .unwrap();
        assert_eq!(c.probe, secs(9));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let c = base(&[
            "--mode",
            "diagnose",
            "--window",
            "2s",
            "--probe-seconds",
            "3",
        ])
        .unwrap();
        assert_eq!(c.probe, secs(3));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("shorter than two windows"));
        // The whole run within the 3 s: what did not fit is named.
        let plan = schedule::plan(&Params::of(&c), NOW).unwrap();
        assert!(plan.last_at() <= secs(3), "{:?}", plan.last_at());
        assert!(!plan.left_out.is_empty());
    }

    #[test]
    fn a_diagnose_budget_bounds_the_whole_run_at_any_time_of_the_window() {
        for budget in [1, 3, 5, 7, 9, 20] {
            for tenth in 0..20 {
                let now = NOW + ms(tenth * 100);
                let c = base(&[
                    "--mode",
                    "diagnose",
                    "--window",
                    "2s",
                    "--probe-seconds",
                    &budget.to_string(),
                ])
                .unwrap();
                assert_eq!(c.budget, Some(secs(budget)));
                let plan = schedule::plan(&Params::of(&c), now).unwrap();
                assert!(
                    plan.last_at() <= secs(budget),
                    "{budget} s at +{tenth}: {plan:?}"
                );
                let t0 = plan.burst_at.unwrap();
                if budget >= 7 {
                    // Time for everything: the wait for the middle of a
                    // window, two windows of probes, both batches.
                    assert!(plan.left_out.is_empty(), "{budget}: {:?}", plan.left_out);
                    assert_eq!(plan.boundary.unwrap().at, t0 + secs(1));
                } else if budget <= 3 {
                    assert!(!plan.left_out.is_empty(), "{budget}");
                }
                if let Some(b) = plan.boundary {
                    // The batches straddle a real clock boundary.
                    assert_eq!((now + b.at).as_millis() % 2000, 0);
                    assert!(b.at >= t0 + 2 * b.offset);
                }
            }
        }
    }

    #[test]
    fn flags_a_mode_does_not_use_are_warned_about() {
        let c = base(&[
            "--mode",
            "burst",
            "--duration",
            "5s",
            "--window-offset-ms",
            "100",
        ])
        .unwrap();
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("--duration"));
        assert!(c.warnings[1].contains("--window-offset-ms"));
    }

    #[test]
    fn offset_must_leave_room_on_both_sides_of_the_boundary() {
        let err = base(&[
            "--mode",
            "window-boundary",
            "--window",
            "2s",
            "--window-offset-ms",
            "1000",
        ])
        .unwrap_err();
        assert!(err.0.contains("less than half of --window"), "{err}");
        assert!(
            base(&[
                "--mode",
                "window-boundary",
                "--window",
                "2s",
                "--window-offset-ms",
                "999"
            ])
            .is_ok()
        );
    }

    #[test]
    fn bad_urls_are_refused_without_repeating_them() {
        let err = parse(&["--url", "not a url sk-secret", "--rpm", "1"]).unwrap_err();
        assert!(err.0.starts_with("invalid --url"), "{err}");
        assert!(!err.0.contains("sk-secret"));
        let err = parse(&[
            "--url",
            "http://api.example.com/",
            "--rpm",
            "1",
            "--ca-file",
            "x",
        ])
        .unwrap_err();
        assert!(err.0.contains("--ca-file is for an https://"), "{err}");
        let err = parse(&["--url", "ftp://example.com/", "--rpm", "1"]).unwrap_err();
        assert!(err.0.contains("ftp"), "{err}");
    }

    #[test]
    fn the_target_drops_credentials_query_and_fragment() {
        let c = parse(&[
            "--url",
            "http://user:pw-secret@127.0.0.1:8080/v1/chat?api_key=q-secret#frag",
            "--rpm",
            "1",
        ])
        .unwrap();
        assert_eq!(c.target, "http://127.0.0.1:8080/v1/chat");
        // The request still goes to the URL as given.
        assert_eq!(c.url.query(), Some("api_key=q-secret"));
    }

    #[test]
    fn bad_headers_are_refused_without_their_values() {
        let err = base(&["--header", "Bearer sk-secret"]).unwrap_err();
        assert!(err.0.contains("expected 'Name: value'"), "{err}");
        assert!(!err.0.contains("sk-secret"));
        let err = base(&["--header", "Bad Name: sk-secret"]).unwrap_err();
        assert!(err.0.contains("not a valid header name"), "{err}");
        assert!(!err.0.contains("sk-secret"));
        let err = base(&["--header", "Authorization: sk-\u{1}secret"]).unwrap_err();
        assert!(err.0.contains("authorization"), "{err}");
        assert!(!err.0.contains("secret"), "{err}");
        let err = base(&["--header", ": v"]).unwrap_err();
        assert!(err.0.contains("empty"), "{err}");
    }

    #[test]
    fn headers_keep_their_order_and_repeats() {
        let c = base(&[
            "-H",
            "X-A: 1",
            "--header",
            "x-a:2",
            "-H",
            "Authorization: Bearer t",
        ])
        .unwrap();
        let a: Vec<_> = c.headers.get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert!(c.headers["authorization"].is_sensitive());
    }

    #[test]
    fn bad_methods_and_unreadable_body_files_are_usage_errors() {
        let err = base(&["--method", "PO ST"]).unwrap_err();
        assert!(err.0.contains("--method"), "{err}");
        let err = base(&["--body-file", "/nonexistent/ratecheck/body.json"]).unwrap_err();
        assert!(
            err.0
                .contains("cannot read --body-file /nonexistent/ratecheck/body.json"),
            "{err}"
        );
        let c = base(&["--method", "post"]).unwrap();
        assert_eq!(
            c.method.as_str(),
            "post",
            "methods are case-sensitive tokens"
        );
    }

    #[test]
    fn huge_runs_are_usage_errors() {
        let err = parse(&[
            "--url",
            "http://h/",
            "--rpm",
            "4000000000",
            "--duration",
            "24h",
            "--window",
            "1s",
        ])
        .unwrap_err();
        assert!(err.0.contains("more than the 1000000 allowed"), "{err}");
    }

    #[test]
    fn debug_shows_no_secret() {
        let dir = std::env::temp_dir().join(format!("ratecheck-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body = dir.join("body.json");
        std::fs::write(&body, r#"{"prompt":"body-secret"}"#).unwrap();
        let c = parse(&[
            "--url",
            "http://u:pw-secret@127.0.0.1:9/?token=q-secret",
            "--rpm",
            "3",
            "-H",
            "Authorization: Bearer header-secret",
            "--body-file",
            body.to_str().unwrap(),
        ])
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["pw-secret", "q-secret", "header-secret", "body-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("authorization"));
        assert!(shown.contains("24 bytes"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Limiters simulated over a plan, to give the reports synthetic results
/// (the inference's fixtures are in `fixtures.rs`).
mod synthetic {
    use super::*;

    /// How long a request takes to reach the simulated server.
    const ARRIVAL: Duration = Duration::from_millis(2);

    pub(super) enum Model {
        SlidingWindow,
        /// No limit at all.
        Unlimited,
    }

    /// Outcomes of `plan` against `model` enforcing `limit` per `window`.
    pub(super) fn simulate(
        plan: &Plan,
        model: &Model,
        limit: u32,
        window: Duration,
        _now_unix: Duration,
    ) -> Vec<Outcome> {
        let mut log: VecDeque<u128> = VecDeque::new();
        plan.events
            .iter()
            .enumerate()
            .map(|(event, e)| {
                let admit = match model {
                    Model::SlidingWindow => {
                        // In whole nanoseconds: a slot frees exactly one
                        // window after its admission.
                        let t = (e.at + ARRIVAL).as_nanos();
                        while log.front().is_some_and(|&a| a + window.as_nanos() <= t) {
                            log.pop_front();
                        }
                        let ok = log.len() < limit as usize;
                        if ok {
                            log.push_back(t);
                        }
                        ok
                    }
                    Model::Unlimited => true,
                };
                Outcome {
                    event,
                    sent: e.at,
                    latency: ARRIVAL * 2,
                    class: Class::Status(if admit { 200 } else { 429 }),
                }
            })
            .collect()
    }
}

mod reports {
    use super::synthetic::{Model, simulate};
    use super::*;

    fn config(mode: &str) -> Config {
        Config::from_args([
            "ratecheck",
            "--url",
            "http://u:pw-secret@127.0.0.1:9/v1?key=q-secret",
            "--rpm",
            "10",
            "--window",
            "2s",
            "--mode",
            mode,
            "-H",
            "Authorization: Bearer header-secret",
        ])
        .unwrap()
    }

    fn run_of(config: &Config, model: Model) -> Run {
        let plan = schedule::plan(&Params::of(config), NOW).unwrap();
        let outcomes = simulate(&plan, &model, config.rpm, config.window, NOW);
        Run {
            started_at: SystemTime::UNIX_EPOCH + NOW,
            elapsed: plan.last_at() + ms(4),
            plan,
            outcomes,
            interrupted: false,
        }
    }

    #[test]
    fn counts_refusals_apart_from_other_failures() {
        let config = config("burst");
        let mut run = run_of(&config, Model::Unlimited);
        run.outcomes[0].class = Class::Status(429);
        run.outcomes[1].class = Class::Status(429);
        run.outcomes[2].class = Class::Status(503);
        run.outcomes[3].class = Class::Transport(TransportKind::Timeout);
        let r = report::build(&config, &run);
        assert_eq!(r.summary.actual_requests, 10);
        assert_eq!(r.summary.success, 6);
        assert_eq!(r.summary.failure, 4);
        assert_eq!(r.summary.refused, 2);
        assert_eq!(r.summary.other_failure, 2);
        assert_eq!(r.errors.status["429"], 2);
        assert_eq!(r.errors.status["503"], 1);
        assert_eq!(r.errors.transport["timeout"], 1);
        let burst = r.mode_detail.unwrap().burst.unwrap();
        assert_eq!(
            (
                burst.sent,
                burst.success,
                burst.refused,
                burst.other_failure
            ),
            (10, 6, 2, 2)
        );
    }

    #[test]
    fn latency_percentiles_come_from_the_responses() {
        let config = config("burst");
        let mut run = run_of(&config, Model::Unlimited);
        for (i, o) in run.outcomes.iter_mut().enumerate() {
            o.latency = ms(10 * (i as u64 + 1));
        }
        run.outcomes[9].class = Class::Transport(TransportKind::Connect);
        let l = report::build(&config, &run).summary.latency_ms.unwrap();
        // HdrHistogram keeps 3 significant digits.
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001;
        assert!(near(l.p50, 50.0), "{l:?}");
        assert!(near(l.p95, 90.0), "{l:?}");
        assert!(near(l.p99, 90.0), "{l:?}");
        assert!(near(l.max, 90.0), "{l:?}");
    }

    #[test]
    fn sustained_reports_have_no_mode_detail() {
        let config = Config::from_args([
            "ratecheck",
            "--url",
            "http://127.0.0.1:9/",
            "--rpm",
            "10",
            "--window",
            "1s",
            "--duration",
            "2s",
        ])
        .unwrap();
        let run = run_of(&config, Model::Unlimited);
        let r = report::build(&config, &run);
        assert_eq!(r.summary.actual_requests, 20);
        let json = serde_json::to_value(&r).unwrap();
        assert!(json.get("mode_detail").is_none());
        assert_eq!(json["mode"], "sustained");
        // 20 requests 100 ms apart: 19 intervals in 1.9 s, 10 per 1 s window.
        assert_eq!(json["run"]["actual_rpm"], 10.0);
    }

    #[test]
    fn diagnose_reports_carry_every_part_and_no_secret() {
        let config = config("diagnose");
        let run = run_of(&config, Model::SlidingWindow);
        let r = report::build(&config, &run);
        let json = serde_json::to_string_pretty(&r).unwrap();
        for secret in ["pw-secret", "q-secret", "header-secret", "Bearer"] {
            assert!(!json.contains(secret), "{secret} in {json}");
        }
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["mode"], "diagnose");
        assert_eq!(v["target"], "http://127.0.0.1:9/v1");
        assert_eq!(v["request"]["header_names"][0], "authorization");
        assert_eq!(v["run"]["target_rpm"], 10);
        assert_eq!(v["run"]["window_ms"], 2000);
        let d = &v["mode_detail"];
        assert_eq!(d["burst"]["sent"], 15);
        assert_eq!(d["burst"]["success"], 10);
        assert_eq!(d["window_boundary"]["before"]["sent"], 10);
        assert_eq!(d["refill_probe"]["per_second"][0]["second"], 0);
        assert_eq!(d["inference"]["likely_limiter"], "sliding_window");
        assert_eq!(d["inference"]["measured"]["limit"], 10);
        assert_eq!(d["timeline"]["requests"].as_array().unwrap().len(), 85);
        let text = report::summary_text(&r);
        assert!(text.contains("likely limiter: sliding_window"), "{text}");
        assert!(
            text.contains("  enforces: 10 per 2.00 s (limit exact; window "),
            "{text}"
        );
        for secret in ["pw-secret", "q-secret", "header-secret"] {
            assert!(!text.contains(secret));
        }
    }

    #[test]
    fn diagnose_says_why_its_burst_is_larger_than_the_expected_one() {
        let diagnose = Config::from_args([
            "ratecheck",
            "--url",
            "http://127.0.0.1:9/v1",
            "--rpm",
            "10",
            "--window",
            "2s",
            "--burst",
            "5",
            "--mode",
            "diagnose",
        ])
        .unwrap();
        let run = run_of(&diagnose, Model::SlidingWindow);
        let text = report::summary_text(&report::build(&diagnose, &run));
        assert!(text.contains(", burst 5)"), "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("  burst: "))
            .unwrap_or_else(|| panic!("no burst line in:\n{text}"));
        assert!(
            line.starts_with("  burst: 7 sent (the expected burst of 5 and half as many again"),
            "{line}"
        );
        assert!(line.contains("1.5x"), "{line}");
        // Other modes send the burst they were told: nothing to explain.
        let burst = config("burst");
        let text = report::summary_text(&report::build(&burst, &run_of(&burst, Model::Unlimited)));
        assert!(text.contains("  burst: 10 sent, "), "{text}");
    }

    #[test]
    fn sliding_window_mode_reports_recovery() {
        let config = config("sliding-window");
        let run = run_of(&config, Model::SlidingWindow);
        let r = report::build(&config, &run);
        let d = r.mode_detail.unwrap();
        let p = d.sliding_probe.unwrap();
        assert_eq!(p.first_admitted_s, Some(2.0));
        assert_eq!(p.per_second.len(), 3);
        assert_eq!(p.per_second[0].counts.sent, 1);
        assert!(d.refill_probe.is_none() && d.inference.is_none());
    }
}
