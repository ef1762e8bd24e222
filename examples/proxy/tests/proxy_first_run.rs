//! The `proxy` example as a newcomer first runs it: `cargo run --example
//! proxy`, no `--config`. What it says at startup (once, in its banner),
//! which configuration it runs and whether edits to it apply, and whether
//! its default limits keep the built-in simulator from ever refusing.
//!
//! The program runs in a child process (this test binary again) with its
//! own working directory, as `main` runs it: logs at `info` on stderr, the
//! banner on stdout, real signal handlers. Every wait is for an event (a
//! line, a response, an exit) with a generous bound as a hang guard.

// Signals are sent with `nix`, on Unix.
#![cfg(unix)]

mod support;

use testkit::child;

use proxy::{config, gateway};

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::RateLimitLayer;

use crate::config::Settings;

/// Hang guard for anything awaited.
const BOUND: Duration = Duration::from_secs(20);

fn no_env(_: &str) -> Option<String> {
    None
}

/// The child's side: the proxy as `main` runs it, with the arguments in
/// `PROXY_ARGS` (split on spaces), in the working directory the test chose.
#[test]
#[ignore = "run by the tests below in a child process"]
fn proxy_main_child() {
    if child::role().as_deref() != Some("proxy-main") {
        return;
    }
    support::run_proxy_main_from_env();
}

/// A fresh empty directory for a child to run in, removed when dropped
/// (a failing test too).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-throttle-first-run-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The proxy started in `dir` with `args`; its banner's gateway line.
async fn proxy_in(dir: &Path, args: &str) -> (child::Running, String) {
    let running = child::spawn_in(
        "proxy_main_child",
        "proxy-main",
        &[("PROXY_ARGS", args)],
        Some(dir),
    );
    // The banner's last line: everything before it is written.
    running.stdout_line("for i in $(seq 30)").await;
    let gateway = running.stdout_line("  gateway ").await;
    (running, gateway)
}

/// The URL on the banner's gateway line.
fn url_of(gateway_line: &str) -> String {
    gateway_line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {gateway_line:?}"))
        .to_owned()
}

/// Stop the child with SIGTERM; its exit code, once it has logged its last
/// line.
async fn stop(proxy: &mut child::Running) -> Option<i32> {
    proxy.signal(Signal::SIGTERM);
    proxy.stderr_line("stopped").await;
    proxy.exit_code(BOUND).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_says_the_address_config_source_and_urls_once_and_logs_nothing_else() {
    // No examples/proxy/proxy.toml here: the embedded copy runs.
    let dir = ScratchDir::new("startup");
    let (mut proxy, gateway) = proxy_in(&dir.0, "--listen 127.0.0.1:0").await;
    let url = url_of(&gateway);
    assert_eq!(stop(&mut proxy).await, Some(0), "{}", proxy.stderr());
    let stdout = proxy.stdout();
    let stderr = proxy.stderr();
    let (startup_log, _) = stderr
        .split_once("SIGTERM: shutting down")
        .unwrap_or_else(|| panic!("no shutdown line in:\n{stderr}"));

    // The banner says where it listens, which configuration runs, and what
    // to try, each once.
    assert!(
        gateway.contains(
            "(config: embedded copy of examples/proxy/proxy.toml; no such file here, \
             so edits need --config)"
        ),
        "{stdout}"
    );
    for once in [
        format!("gateway    {url} "),
        "config:".to_owned(),
        format!("live page  {url}/\n"),
        format!("stats      {url}/stats "),
        format!("curl -s {url}/v1/chat/completions"),
    ] {
        assert_eq!(stdout.matches(&once).count(), 1, "{once:?} in:\n{stdout}");
    }
    // Nothing else at startup: no layer announcing its settings, no line
    // twice.
    assert!(
        !startup_log.contains(" INFO "),
        "startup logged:\n{startup_log}"
    );
    let lines: Vec<&str> = stdout.lines().chain(startup_log.lines()).collect();
    for line in &lines {
        assert_eq!(
            lines.iter().filter(|l| *l == line).count(),
            1,
            "{line:?} twice in:\n{stdout}{startup_log}"
        );
    }
}

/// A config with one unlimited simulator model and a rate limit of
/// `limit` per minute, rejecting beyond it.
fn small_config(limit: u32) -> String {
    format!(
        r#"
[simulator]
latency = "0ms"
models = [{{ name = "m", limit = 0, period = "1s" }}]

[[providers]]
name = "sim"
base_url = "simulator"

[rate_limit]
quotas = [{{ limit = {limit}, period = "1m" }}]
"#
    )
}

async fn chat(client: &reqwest::Client, url: &str) -> u16 {
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_config_the_example_file_in_the_working_directory_runs_and_edits_apply() {
    let dir = ScratchDir::new("watched");
    let file = dir.0.join(config::DEFAULT_PATH);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, small_config(1000)).unwrap();
    let (mut proxy, gateway) = proxy_in(&dir.0, "--listen 127.0.0.1:0").await;
    assert!(
        gateway.contains("(config: examples/proxy/proxy.toml, reloaded on edit)"),
        "{gateway}"
    );
    let url = url_of(&gateway);
    let client = reqwest::Client::new();
    assert_eq!(chat(&client, &url).await, 200);
    assert_eq!(chat(&client, &url).await, 200);

    // The file it said it runs is the one it watches.
    std::fs::write(&file, small_config(1)).unwrap();
    proxy
        .stderr_line("config reloaded from examples/proxy/proxy.toml")
        .await;
    // One a minute: of two requests, the second is refused.
    chat(&client, &url).await;
    assert_eq!(chat(&client, &url).await, 429, "{}", proxy.stderr());
    assert_eq!(stop(&mut proxy).await, Some(0), "{}", proxy.stderr());
}

/// How much a request's trip from the gateway's limiter to the simulator
/// may vary (a pooled or a new connection, the scheduler of a loaded
/// machine): admissions that far apart can arrive within one of the
/// simulator's windows.
const JITTER: Duration = Duration::from_millis(500);

#[tokio::test(start_paused = true)]
async fn the_default_gateway_limits_stay_under_the_simulators_in_every_rolling_window() {
    let settings = Settings::from_toml(config::DEFAULT_CONFIG, &no_env).unwrap();
    let limits = settings.stack.rate_limit.clone().unwrap();
    let provider = settings
        .providers
        .iter()
        .find(|p| p.upstream == config::Upstream::Simulator)
        .unwrap()
        .name
        .clone();
    let models = &settings.simulator.as_ref().unwrap().models;
    assert!(!models.is_empty());
    for model in models.iter().filter(|m| m.limit > 0) {
        // The gateway's limiter for the route, in reject mode, driven as
        // hard as it admits: each refused request is sent again the
        // instant it says. From a fresh route, that is the most any
        // rolling window can hold, for every algorithm.
        let route = (
            HeaderKey::new("x-provider").unwrap(),
            HeaderKey::new("x-model").unwrap(),
        );
        let layer = RateLimitLayer::from_limits(&limits, route).with_max_wait(Duration::ZERO);
        let mut service = ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: http::Request<()>| async { Ok::<_, Infallible>(()) });
        let start = tokio::time::Instant::now();
        let mut admitted = Vec::new();
        while start.elapsed() < 4 * model.period + JITTER {
            let request = http::Request::builder()
                .header("x-provider", &*provider)
                .header("x-model", &model.name)
                .body(())
                .unwrap();
            match service.ready().await.unwrap().call(request).await {
                Ok(()) => admitted.push(tokio::time::Instant::now()),
                Err(e) => {
                    let refused = e.downcast_ref::<RateLimited>().unwrap();
                    tokio::time::sleep(refused.retry_after).await;
                }
            }
        }
        let most = testkit::windows::most_in_any_window(&admitted, model.period + JITTER);
        assert!(
            most <= model.limit as usize,
            "{}: the gateway passes {most} in {:?}, the simulator admits {} per {:?}",
            model.name,
            model.period + JITTER,
            model.limit,
            model.period
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_50_on_the_default_config_draws_no_429_from_the_simulator() {
    let settings = Settings::from_toml(config::DEFAULT_CONFIG, &no_env).unwrap();
    let running = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap();
    let url = running.url();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let body = r#"{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}"#;
    let sends = (0..50).map(|_| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    });
    let responses = tokio::time::timeout(BOUND, futures::future::join_all(sends))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for response in responses {
        let response = response.unwrap();
        let status = response.status().as_u16();
        let json: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or_default();
        codes.push((status, json["error"]["code"].as_str().map(str::to_owned)));
    }
    let answered = codes.iter().filter(|(s, _)| *s == 200).count();
    assert!(answered >= 5, "{codes:?}");
    // The simulator refused nothing: every refusal is the gateway's.
    let sim = running.simulator.as_ref().unwrap().handle().counts();
    let small = sim.iter().find(|m| m.model == "sim-small").unwrap();
    assert_eq!(small.refused, 0, "{sim:?}\n{codes:?}");
    assert_eq!(small.answered as usize, answered, "{sim:?}");
    assert!(
        codes
            .iter()
            .all(|(s, code)| *s == 200 || code.as_deref() != Some("rate_limit_exceeded")),
        "{codes:?}"
    );
    running.shutdown().await;
}
