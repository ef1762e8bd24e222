//! The gateway in front of its built-in simulator, as most of the proxy's
//! end-to-end tests drive it: configs, requests and `/stats` polling.

use std::path::PathBuf;
use std::time::Duration;

use proxy::config::{self, Settings};
use proxy::gateway::{self, Running};
use serde_json::Value;
use testkit::capture::capture_logs;

/// The simulator section most tests use: fast, and two models with the
/// given per-2s limits.
pub fn simulator(small: u32, large: u32) -> String {
    format!(
        r#"
[simulator]
latency = "0ms"
stream_chunks = 4
stream_interval = "10ms"
models = [
    {{ name = "sim-small", limit = {small}, period = "2s" }},
    {{ name = "sim-large", limit = {large}, period = "2s" }},
]

[[providers]]
name = "sim"
base_url = "simulator"
"#
    )
}

pub fn no_env(_: &str) -> Option<String> {
    None
}

pub async fn start_with(toml: &str, env: config::Env<'_>) -> Running {
    capture_logs();
    let settings = Settings::from_toml(toml, env).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

pub async fn start(toml: &str) -> Running {
    start_with(toml, &no_env).await
}

pub fn chat(model: &str, stream: bool) -> String {
    serde_json::json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

pub async fn post(client: &reqwest::Client, url: &str, model: &str) -> reqwest::Response {
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(model, false))
        .send()
        .await
        .unwrap()
}

/// Send `n` requests at once; their statuses, and the responses.
pub async fn burst(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    n: usize,
) -> Vec<reqwest::Response> {
    futures::future::join_all((0..n).map(|_| post(client, url, model))).await
}

pub fn count(responses: &[reqwest::Response], status: u16) -> usize {
    responses.iter().filter(|r| r.status() == status).count()
}

pub async fn stats(client: &reqwest::Client, url: &str) -> Value {
    client
        .get(format!("{url}/stats"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap()
}

pub fn route<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == name)
        .unwrap_or_else(|| panic!("no route {name} in {stats}"))
}

/// Poll `/stats` until `check` holds (bounded: 10 s).
pub async fn until(
    client: &reqwest::Client,
    url: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    for _ in 0..500 {
        let s = stats(client, url).await;
        if check(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gave up waiting for {what}: {}", stats(client, url).await);
}

pub async fn body_json(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

pub fn temp_path(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("proxy-test-{}-{nanos}-{name}", std::process::id()))
}
