//! The `ratecheck` example stopping and reporting: its sent rate, a stop
//! (Ctrl-C, SIGTERM) that cancels requests in flight and still writes the
//! partial report, and exit code 3 when no request got an HTTP answer. The
//! signals are sent to ratecheck running in a child process.

// Signals are sent with `nix`, on Unix.
#![cfg(unix)]

use testkit::child;

use ratecheck::{app, cli, probe, report, schedule, signal};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::routing::any;
use clap::Parser as _;
use nix::sys::signal::Signal;
use tokio::sync::Notify;

use crate::cli::Config;
use crate::probe::{Class, Outcome, Run};
use crate::schedule::Params;

/// Hang guard for anything awaited.
const BOUND: Duration = Duration::from_secs(10);

/// A server that takes requests and never answers; counts them.
struct Silent {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
}

impl Silent {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(Notify::new());
        let (count, notify) = (seen.clone(), arrived.clone());
        let app = Router::new().route(
            "/",
            any(move || {
                count.fetch_add(1, Ordering::SeqCst);
                notify.notify_waiters();
                std::future::pending::<&'static str>()
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            seen,
            arrived,
        }
    }

    /// Wait until `n` requests have arrived (bounded).
    async fn until_seen(&self, n: usize) {
        let wait = async {
            loop {
                let arrived = self.arrived.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                if self.seen.load(Ordering::SeqCst) >= n {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(BOUND, wait)
            .await
            .unwrap_or_else(|_| panic!("{n} requests never arrived"));
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tower-throttle-ratecheck-{}-{name}",
        std::process::id()
    ))
}

/// A burst of `rpm` requests at `url`, reported to `out`, with `more` flags.
fn burst_cli(url: &str, rpm: &str, out: &Path, more: &[&str]) -> cli::Cli {
    let out = out.to_str().unwrap();
    let args = [
        "ratecheck",
        "--url",
        url,
        "--mode",
        "burst",
        "--rpm",
        rpm,
        "--out",
        out,
    ];
    cli::Cli::try_parse_from(args.iter().chain(more)).unwrap()
}

fn report_json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A config aimed at a port nothing listens on, with `args` after the URL:
/// for the tests that only plan and report.
fn offline_config(args: &[&str]) -> Config {
    let url = ["ratecheck", "--url", "http://127.0.0.1:9/"];
    Config::from_args(url.iter().chain(args).copied()).unwrap()
}

/// A run of `config`'s plan in which every request was answered 200 in
/// 5 ms, each sent `late(event)` after its planned time: the rate alone is
/// what the report has to work out.
fn answered_run(config: &Config, late: impl Fn(usize) -> Duration) -> Run {
    let plan = schedule::plan(&Params::of(config), Duration::from_secs(1_700_000_000)).unwrap();
    let outcomes = plan
        .events
        .iter()
        .enumerate()
        .map(|(event, e)| Outcome {
            event,
            sent: e.at + late(event),
            latency: Duration::from_millis(5),
            class: Class::Status(200),
        })
        .collect();
    Run {
        started_at: SystemTime::UNIX_EPOCH,
        elapsed: plan.last_at() + Duration::from_millis(5),
        plan,
        outcomes,
        interrupted: false,
    }
}

#[test]
fn the_sent_rate_counts_the_intervals_between_requests() {
    // The case: 3 requests a second apart are 60 a minute, not 90.
    let config = offline_config(&["--rpm", "60", "--duration", "3s"]);
    let mut run = answered_run(&config, |_| Duration::ZERO);
    assert_eq!(run.outcomes.len(), 3);
    let r = report::build(&config, &run).run;
    assert_eq!((r.actual_rpm, r.admitted_rpm), (60.0, 60.0));
    assert!(report::summary_text(&report::build(&config, &run)).contains("rate: 60 sent"));

    run.outcomes[1].class = Class::Status(429);
    let r = report::build(&config, &run).run;
    assert_eq!((r.actual_rpm, r.admitted_rpm), (60.0, 40.0));

    // One request, or a burst at one instant, has no rate.
    run.outcomes.truncate(1);
    assert_eq!(report::build(&config, &run).run.actual_rpm, 0.0);

    // A burst's requests leave microseconds apart only because they cannot
    // all leave at once: still no rate (it read 299,550 a minute).
    let burst = offline_config(&["--mode", "burst", "--rpm", "10"]);
    let run = answered_run(&burst, |event| Duration::from_micros(2 * event as u64));
    assert!(run.outcomes.len() > 1);
    assert_eq!(report::build(&burst, &run).run.actual_rpm, 0.0);
}

#[tokio::test]
async fn a_run_stopped_before_its_first_request_exits_0() {
    let out = temp("stopped-early.json");
    // The batches wait for a window boundary up to an hour away.
    let cli = cli::Cli::try_parse_from([
        "ratecheck",
        "--url",
        "http://127.0.0.1:9/",
        "--rpm",
        "10",
        "--mode",
        "window-boundary",
        "--window",
        "1h",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    let run = app::run(cli, false, std::future::ready(()));
    let code = tokio::time::timeout(BOUND, run).await.unwrap();
    assert_eq!(code, 0);
    let report = report_json(&out);
    assert_eq!(report["run"]["interrupted"], true);
    assert_eq!(report["summary"]["actual_requests"], 0);
    let _ = std::fs::remove_file(out);
}

// On the test's thread, so that the summary it prints is captured.
#[tokio::test]
async fn a_stop_cancels_requests_in_flight_writes_the_partial_report_and_exits_3() {
    let server = Silent::start().await;
    let out = temp("stop.json");
    let url = format!("http://{}/", server.addr);
    let cli = burst_cli(&url, "3", &out, &["--timeout", "60s"]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(app::run(cli, false, async {
        let _ = stopped.await;
    }));
    server.until_seen(3).await;
    stop.send(()).unwrap();
    // Not the 60 s timeout: the requests in flight are cancelled.
    let code = tokio::time::timeout(BOUND, run).await.unwrap().unwrap();
    assert_eq!(code, app::EXIT_NO_ANSWER);
    let report = report_json(&out);
    assert_eq!(report["run"]["interrupted"], true);
    assert_eq!(report["summary"]["actual_requests"], 3);
    assert_eq!(report["errors"]["transport"]["cancelled"], 3);
    let _ = std::fs::remove_file(out);
}

#[tokio::test]
async fn no_http_answer_exits_3_and_any_answer_exits_0() {
    // Nothing listens on a port just released.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let out = temp("answers.json");
    let run = |url: String| {
        let out = out.clone();
        async move {
            let cli = burst_cli(&url, "2", &out, &[]);
            app::run(cli, false, std::future::pending()).await
        }
    };
    assert_eq!(run(format!("http://{closed}/")).await, app::EXIT_NO_ANSWER);

    // A 500 is an HTTP answer too: the endpoint was measured.
    let app = Router::new().route(
        "/",
        any(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
    );
    let addr = testkit::local_server::serve_detached(app).await;
    assert_eq!(run(format!("http://{addr}/")).await, 0);
    let _ = std::fs::remove_file(out);
}

/// The child's side: ratecheck as `main` runs it, with real signal
/// handlers, on the arguments in `RATECHECK_ARGS` (one per line).
#[test]
#[ignore = "run by the signal test in a child process"]
fn ratecheck_child() {
    let Some(args) = child::input("ratecheck", "RATECHECK_ARGS") else {
        return;
    };
    child::run_and_exit(async {
        let signals = signal::StopSignals::listen().unwrap();
        let cli = cli::Cli::try_parse_from(args.lines()).unwrap();
        app::run(cli, false, signals.stopped("stopping")).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_and_sigterm_stop_a_run_at_once_with_the_partial_report() {
    for (signal, name) in [(Signal::SIGINT, "sigint"), (Signal::SIGTERM, "sigterm")] {
        let server = Silent::start().await;
        let out = temp(&format!("{name}.json"));
        let args = [
            "ratecheck".to_owned(),
            "--url".to_owned(),
            format!("http://{}/", server.addr),
            "--rpm".to_owned(),
            "600".to_owned(),
            "--duration".to_owned(),
            "60s".to_owned(),
            "--timeout".to_owned(),
            "60s".to_owned(),
            "--out".to_owned(),
            out.to_str().unwrap().to_owned(),
        ]
        .join("\n");
        let mut ratecheck =
            child::spawn("ratecheck_child", "ratecheck", &[("RATECHECK_ARGS", &args)]);
        server.until_seen(2).await;
        ratecheck.signal(signal);
        // Long before the 60 s run or the 60 s timeout.
        let code = ratecheck.exit_code(BOUND).await;
        assert_eq!(code, Some(3), "{name}: {}", ratecheck.stderr());
        let report = report_json(&out);
        assert_eq!(report["run"]["interrupted"], true, "{name}");
        let sent = report["summary"]["actual_requests"].as_u64().unwrap();
        assert!((2..600).contains(&sent), "{name}: {sent} sent");
        assert_eq!(
            report["errors"]["transport"]["cancelled"].as_u64(),
            Some(sent),
            "{name}"
        );
        let _ = std::fs::remove_file(out);
    }
}
