//! The gateway in front of its built-in simulator, as most of the proxy's
//! end-to-end tests drive it: configs, requests and `/stats` polling.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proxy::config::{self, Settings};
use proxy::gateway::{self, Running};
use proxy::{app, reload};
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

/// The simulator answering at once with one model, `sim-small`, allowed
/// `limit` requests a `period` (0: unlimited), and its provider.
pub fn small_model(limit: u32, period: &str) -> String {
    format!(
        r#"
[simulator]
latency = "0ms"
models = [{{ name = "sim-small", limit = {limit}, period = "{period}" }}]

[[providers]]
name = "sim"
base_url = "simulator"
"#
    )
}

/// A `[rate_limit]` section whose one rule holds the simulator's `model`
/// to `limit` requests a `period`: the limit most tests put on one route.
pub fn one_rule(model: &str, limit: u32, period: &str) -> String {
    format!(
        r#"
[rate_limit]
[[rate_limit.rules]]
provider = "sim"
model = "{model}"
quotas = [{{ limit = {limit}, period = "{period}" }}]
"#
    )
}

pub fn no_env(_: &str) -> Option<String> {
    None
}

/// The settings `toml` makes with `env`; a config a test got wrong panics
/// with the error and the text.
pub fn settings_with(toml: &str, env: config::Env<'_>) -> Settings {
    Settings::from_toml(toml, env).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

/// The gateway on `toml` and `env`, on an ephemeral loopback port, its log
/// captured.
pub async fn start_with(toml: &str, env: config::Env<'_>) -> Running {
    capture_logs();
    gateway::start(settings_with(toml, env), ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The gateway on the config file at `path`, as `main` loads it, with a
/// watcher reading the file with `timing`: what the reload tests edit.
pub async fn watched(path: &Path, timing: reload::Timing) -> (Running, reqwest::Client) {
    let loaded = app::load(Some(path), Path::new(config::DEFAULT_PATH), &no_env).unwrap();
    let gw = gateway::start(loaded.settings, ([127, 0, 0, 1], 0).into(), loaded.source)
        .await
        .unwrap();
    // Stopped with the gateway (it watches the shutdown signal).
    let _watcher = reload::spawn(
        path.to_owned(),
        loaded.bytes,
        timing,
        gw.gateway.clone(),
        Arc::new(no_env),
    );
    (gw, reqwest::Client::new())
}

pub async fn start(toml: &str) -> Running {
    start_with(toml, &no_env).await
}

pub fn chat(model: &str, stream: bool) -> String {
    serde_json::json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

pub async fn post(client: &reqwest::Client, url: &str, model: &str) -> reqwest::Response {
    post_body(client, url, chat(model, false)).await
}

/// POST `body` as JSON to the gateway at `url`: the request most tests
/// send, whatever body (odd, made up, large) they test it with.
pub async fn post_body(
    client: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Ask the gateway at `url` for a streamed answer from `model`, sent as
/// the streaming tests always have (no content type).
pub async fn post_stream(client: &reqwest::Client, url: &str, model: &str) -> reqwest::Response {
    client
        .post(format!("{url}/v1/chat/completions"))
        .body(chat(model, true))
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
    serde_json::from_str(&get_text(client, &format!("{url}/stats")).await).unwrap()
}

/// The gateway's `/metrics` page at `url`, as text.
pub async fn metrics(client: &reqwest::Client, url: &str) -> String {
    get_text(client, &format!("{url}/metrics")).await
}

/// The body of a GET of `url`, as text, whatever its status: the pages'
/// own tests assert on the status where it matters.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

pub fn route<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == name)
        .unwrap_or_else(|| panic!("no route {name} in {stats}"))
}

/// The names of the routes in a `/stats` snapshot (or an event's), in order.
pub fn route_names(stats: &Value) -> Vec<String> {
    stats["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["route"].as_str().unwrap().to_owned())
        .collect()
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
