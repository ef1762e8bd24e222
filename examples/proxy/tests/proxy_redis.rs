//! Two gateways sharing one Redis, in front of one upstream: the proxy
//! example run as three processes (the simulator alone, and two gateways
//! with `--redis`), as a fleet runs it. A burst split over both gateways
//! reaches the upstream no more often than the route's limit, and a 429
//! through one gateway cools the route on the other.

// Signals are sent with `nix`, on Unix.
#![cfg(unix)]

mod support;

use testkit::child;
use testkit::redis as redis_server;

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use redis_server::{RedisServer, free_port};
use support::sim::{body_json, post_body};

/// Hang guard for anything awaited.
const BOUND: Duration = Duration::from_secs(20);

/// The child's side: the proxy as `main` runs it, with the arguments in
/// `PROXY_ARGS` (split on spaces).
#[test]
#[ignore = "run by the tests below in a child process"]
fn proxy_redis_child() {
    if child::role().as_deref() != Some("proxy-redis") {
        return;
    }
    support::run_proxy_main_from_env();
}

/// A file removed when dropped (a failing test too).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One upstream on `sim_port` with an unlimited model `m` and a model
/// `tight` that takes one request per 10 s (429 with `Retry-After`
/// beyond); gateways refusing beyond 3 per minute per route.
fn config(sim_port: u16) -> Scratch {
    config_with(
        sim_port,
        r#"quotas = [{ limit = 3, period = "1m", algorithm = "sliding_window" }]"#,
    )
}

/// [`config`] with `quotas` (a `[rate_limit]` line) instead.
fn config_with(sim_port: u16, quotas: &str) -> Scratch {
    let text = format!(
        r#"
[simulator]
latency = "0ms"
models = [
    {{ name = "m", limit = 0, period = "1s" }},
    {{ name = "tight", limit = 1, period = "10s" }},
]

[[providers]]
name = "sim"
base_url = "http://127.0.0.1:{sim_port}"

[rate_limit]
mode = "reject"
{quotas}

[backoff]
mode = "reject"
"#
    );
    let path = std::env::temp_dir().join(format!(
        "tower-throttle-proxy-redis-{}-{sim_port}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    Scratch(path)
}

fn start(args: &str) -> child::Running {
    child::spawn("proxy_redis_child", "proxy-redis", &[("PROXY_ARGS", args)])
}

/// The URL on the first stdout line containing `needle`.
async fn url_after(child: &child::Running, needle: &str) -> String {
    let line = child.stdout_line(needle).await;
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned()
}

async fn chat(client: &reqwest::Client, gateway: &str, model: &str) -> u16 {
    let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
    post_body(client, gateway, body).await.status().as_u16()
}

async fn stop(child: &mut child::Running) {
    child.signal(Signal::SIGTERM);
    child.stderr_line("stopped").await;
    child.exit_code(BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_hold_one_limit_and_share_a_cooldown() {
    let Some(redis) = RedisServer::start("two_gateways_on_one_redis") else {
        return;
    };
    let sim_port = free_port();
    let file = config(sim_port);
    let config = file.0.display().to_string();
    let mut sim = start(&format!(
        "--config {config} --simulator-only --listen 127.0.0.1:{sim_port}"
    ));
    url_after(&sim, "  simulator ").await;
    let gateway = |_: usize| {
        start(&format!(
            "--config {config} --listen 127.0.0.1:0 --redis {}",
            redis.url()
        ))
    };
    let (mut a, mut b) = (gateway(0), gateway(1));
    let urls = [
        url_after(&a, "  gateway ").await,
        url_after(&b, "  gateway ").await,
    ];
    let client = reqwest::Client::new();

    // Ten at once, five through each gateway: the route's 3 per minute
    // hold across both.
    let burst: Vec<_> = (0..10)
        .map(|i| {
            let (client, url) = (client.clone(), urls[i % 2].clone());
            tokio::spawn(async move { chat(&client, &url, "m").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in burst {
        statuses.push(call.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);

    // The upstream takes one `tight` request per 10 s: the second, through
    // gateway a, draws its 429; gateway b then refuses the route itself
    // (503, cooling down) without asking the upstream.
    assert_eq!(chat(&client, &urls[0], "tight").await, 200);
    assert_eq!(chat(&client, &urls[0], "tight").await, 429);
    let res = client
        .post(format!("{}/v1/chat/completions", urls[1]))
        .header("content-type", "application/json")
        .body(r#"{"model":"tight","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 503);
    let body = res.text().await.unwrap();
    assert!(body.contains("cooling_down"), "{body}");

    stop(&mut a).await;
    stop(&mut b).await;
    stop(&mut sim).await;
}

/// A token quota held by two gateways on one Redis: each request is
/// admitted on its estimate and settled to the usage the upstream reports,
/// in Redis, so the 150 tokens a minute hold across both gateways as they
/// would on one (a sliding window counting cost, which a Redis store keeps
/// to 150).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_hold_one_token_quota() {
    let Some(redis) = RedisServer::start("two_gateways_one_token_quota") else {
        return;
    };
    let quotas = r#"quotas = [{ limit = 150, period = "1m", unit = "tokens", algorithm = "sliding_window" }]"#;
    let admitted = token_quota_on_two_gateways(&redis, quotas, 150).await;
    assert_eq!(admitted.0, admitted.1, "estimate and usage: {admitted:?}");
}

/// The same with a provider's rolling tokens a minute past what Redis keeps
/// of an exact window: a sliding window counter, one value per key. Within
/// one minute it counts as a fixed window does; a run that crosses a
/// minute's boundary may let one more through (the minute before weighs a
/// little less than whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_hold_one_rolling_token_counter() {
    let Some(redis) = RedisServer::start("two_gateways_one_token_counter") else {
        return;
    };
    let quotas = r#"quotas = [{ limit = 1500, period = "1m", unit = "tokens", algorithm = "sliding_window_counter" }]"#;
    let (admitted, expected) = token_quota_on_two_gateways(&redis, quotas, 1_500).await;
    assert!(
        admitted == expected || admitted == expected + 1,
        "{admitted} admitted, {expected} expected"
    );
}

/// Requests through two gateways on `redis`, alternately, with `quotas`
/// holding `limit` tokens a minute, until one is refused: how many were
/// admitted, and how many the estimates and the usage reported allow.
async fn token_quota_on_two_gateways(redis: &RedisServer, quotas: &str, limit: u64) -> (u64, u64) {
    let sim_port = free_port();
    let file = config_with(sim_port, quotas);
    let config = file.0.display().to_string();
    let mut sim = start(&format!(
        "--config {config} --simulator-only --listen 127.0.0.1:{sim_port}"
    ));
    let sim_url = url_after(&sim, "  simulator ").await;
    let gateway = || {
        start(&format!(
            "--config {config} --listen 127.0.0.1:0 --redis {}",
            redis.url()
        ))
    };
    let (mut a, mut b) = (gateway(), gateway());
    let urls = [
        url_after(&a, "  gateway ").await,
        url_after(&b, "  gateway ").await,
    ];
    let client = reqwest::Client::new();
    let body = r#"{"model":"m","max_tokens":20,"messages":[]}"#;
    let estimate = u64::from(proxy::usage::estimate(body.as_bytes()).0);
    // What the upstream reports each such request used, asked directly.
    let direct = body_json(post_body(&client, &sim_url, body).await).await;
    let used = direct["usage"]["total_tokens"].as_u64().expect("usage");
    assert!(used < estimate, "{used} {estimate}");
    // Each is admitted while its estimate fits on top of what the ones
    // before really used: one quota, wherever they come through.
    let expected = (limit - estimate) / used + 1;
    assert!(expected > 2, "estimate {estimate}, used {used}");
    let mut admitted = 0;
    for i in 0..400 {
        let response = post_body(&client, &urls[i % 2], body).await;
        let status = response.status().as_u16();
        // Read to its end: the answer settles its charge there.
        let _ = response.bytes().await;
        if status == 429 {
            break;
        }
        assert_eq!(status, 200);
        admitted += 1;
    }
    stop(&mut a).await;
    stop(&mut b).await;
    stop(&mut sim).await;
    (admitted, expected)
}
