//! What the `proxy` example writes about its routes: `/stats`, `/metrics`
//! and `/events` that made-up model names cannot take over, and no raw
//! control character from a client in any of them or in the log. Each test
//! runs the gateway and its simulator on ephemeral loopback ports.

use support::prometheus;
use testkit::capture;

mod support;

use proxy::{gateway, learn, stats};

use std::collections::BTreeSet;
use std::time::Duration;

use capture::{forged_lines, log_text, stray_controls};
use serde_json::Value;
use tower_throttle::stats::KeyStats;

use crate::gateway::UpstreamCounts;
use support::sim::{post_body, route, route_names, simulator, small_model, start};

/// A model name that forges a log line and clears the screen.
const INJECTED: &str = "x\n2026-12-01T00:00:00Z ERROR admin password reset\u{1b}[2J";

/// The simulator behind a limit of one request a minute: a test's second
/// request is refused, its first forwarded.
fn one_a_minute() -> String {
    small_model(100, "2s") + "\n[rate_limit]\nquotas = [{ limit = 1, period = \"1m\" }]\n"
}

/// A chat request for `model` with no messages, the model name as given.
async fn post(client: &reqwest::Client, url: &str, model: &str) -> reqwest::Response {
    let body = serde_json::json!({ "model": model, "messages": [] }).to_string();
    post_body(client, url, body).await
}

async fn get_text(client: &reqwest::Client, url: &str) -> String {
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), 200, "{url}");
    response.text().await.unwrap()
}

/// The data of the first event on `/events` (bounded: 10 s).
async fn first_event(client: &reqwest::Client, url: &str) -> String {
    let mut response = client.get(format!("{url}/events")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("no event within 10 s")
            .unwrap()
            .expect("the stream ended before its first event");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

fn event_json(event: &str) -> Value {
    let data: String = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    serde_json::from_str(&data).unwrap()
}

/// The (provider, model) pairs `/metrics` has series for.
fn metric_routes(samples: &[prometheus::Sample]) -> BTreeSet<(String, String)> {
    samples
        .iter()
        .filter_map(|s| {
            Some((
                s.label("provider")?.to_owned(),
                s.label("model")?.to_owned(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_models_never_push_real_routes_out_of_stats_metrics_or_events() {
    const MAX_ROUTES: usize = 4;
    let toml = simulator(100, 100)
        + &format!(
            r#"
[gateway]
max_routes = {MAX_ROUTES}

[rate_limit]
quotas = [{{ limit = 1000, period = "1m" }}]
[[rate_limit.rules]]
provider = "sim"
model = "sim-small"
quotas = [{{ limit = 100, period = "2s" }}]
"#
        );
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    // Three times max_routes of models the upstream does not serve, first.
    let models: Vec<String> = (0..3 * MAX_ROUTES).map(|i| format!("junk-{i}")).collect();
    let junk = futures::future::join_all(models.iter().map(|m| post(&client, &url, m))).await;
    assert!(junk.iter().all(|r| r.status() == 404));
    // A route the configuration names, and one the upstream answers (the
    // model list: a route the configuration does not name).
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    for _ in 0..2 {
        let models = client.get(format!("{url}/v1/models")).send().await.unwrap();
        assert_eq!(models.status(), 200);
    }

    let stats: Value =
        serde_json::from_str(&get_text(&client, &format!("{url}/stats")).await).unwrap();
    let names = route_names(&stats);
    assert!(names.len() <= MAX_ROUTES, "{names:?}");
    assert_eq!(names, ["(other)", "sim/(none)", "sim/sim-small"]);
    let small = route(&stats, "sim/sim-small");
    assert_eq!(small["rate_limit"]["admitted"], 1);
    assert_eq!(small["concurrency"]["admitted"], 1);
    assert_eq!(small["upstream"]["ok"], 1);
    // The model list became real with its first answer: from then on by
    // name in every layer.
    let listed = route(&stats, "sim/(none)");
    assert_eq!(listed["upstream"]["ok"], 2);
    assert_eq!(listed["rate_limit"]["admitted"], 1);
    let other = route(&stats, "(other)");
    assert_eq!(other["upstream"]["client_errors"], 3 * MAX_ROUTES);
    assert_eq!(other["rate_limit"]["admitted"], 3 * MAX_ROUTES + 1);

    let metrics = get_text(&client, &format!("{url}/metrics")).await;
    let samples = prometheus::parse(&metrics);
    let routes = metric_routes(&samples);
    assert!(routes.len() <= MAX_ROUTES, "{routes:?}");
    assert!(
        routes.contains(&("sim".to_owned(), "sim-small".to_owned())),
        "{metrics}"
    );
    assert!(!metrics.contains("junk-"), "{metrics}");
    let series = prometheus::by_series(&samples);
    assert_eq!(
        series[r#"proxy_rate_limit_admitted_total{provider="sim",model="sim-small"}"#],
        1.0
    );

    let event = event_json(&first_event(&client, &url).await);
    let names = route_names(&event);
    assert!(names.len() <= MAX_ROUTES, "{names:?}");
    assert!(names.iter().any(|n| n == "sim/sim-small"), "{names:?}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_text_reaches_no_log_line_metric_stat_or_event_raw() {
    let gw = start(&one_a_minute()).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    for _ in 0..2 {
        // Whatever the answer (refused, not served, rate limited)...
        let _ = post(&client, &url, INJECTED).await;
    }
    // ...and text in a path and a header value, which the gateway forwards.
    let _ = client
        .post(format!("{url}/sim/v1/chat/%0A%1B%5B2J%00completions"))
        .header("x-title", "caf\u{e9} \u{2028} title")
        .body(serde_json::json!({ "model": "sim-small" }).to_string())
        .send()
        .await
        .unwrap();

    let stats = get_text(&client, &format!("{url}/stats")).await;
    let metrics = get_text(&client, &format!("{url}/metrics")).await;
    prometheus::parse(&metrics);
    let event = first_event(&client, &url).await;
    gw.shutdown().await;
    let logs = log_text();
    for (what, text) in [
        ("/stats", &stats),
        ("/metrics", &metrics),
        ("/events", &event),
        ("the log", &logs),
    ] {
        assert_eq!(stray_controls(text), [], "{what}: {text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\0'),
            "{what}: {text}"
        );
        assert_eq!(
            forged_lines(text, "2026-12-01T00:00:00Z ERROR admin"),
            Vec::<&str>::new(),
            "{what}"
        );
    }
}

#[test]
fn prometheus_label_values_escape_quotes_backslashes_line_feeds_and_control_characters() {
    let model = "we\"ird\\name\nwith\r\u{1b}[2J\0\u{7f}·é";
    // As the layers name it: escaped (backslashes doubled, hidden
    // characters as their escapes' text).
    let label = tower_throttle::redact::Escaped(model).to_string();
    let mut rate = KeyStats::default();
    rate.admitted = 3;
    let route = stats::RouteStats {
        route: format!("sim/{label}"),
        provider: "sim".to_owned(),
        model: label.clone(),
        rate_limit: rate.clone(),
        concurrency: KeyStats::default(),
        backoff: KeyStats::default(),
        cooldown: None,
        upstream: UpstreamCounts::default(),
        learned: Some(learn::LearnedInfo {
            requests: Some(learn::UnitInfo {
                limit: Some(5),
                remaining: None,
                reset_seconds: None,
                window_seconds: Some(60.0),
                learned_unix: 0.0,
            }),
            ..Default::default()
        }),
    };
    let snapshot = stats::Snapshot {
        seq: 1,
        started_unix: 0,
        config: stats::ConfigInfo {
            source: "test".to_owned(),
            generation: 1,
        },
        providers: Vec::new(),
        aggregate: stats::Aggregate {
            rate_limit: rate,
            concurrency: KeyStats::default(),
            backoff: KeyStats::default(),
            cooldowns_started: 0,
            upstream: UpstreamCounts::default(),
        },
        routes: vec![route],
        untracked_routes: 0,
        event_clients: 0,
        write_timeouts: 0,
        access_log_dropped: None,
        deployments: Vec::new(),
        clients: Vec::new(),
    };
    let text = stats::prometheus(&snapshot);
    assert_eq!(stray_controls(&text), [], "{text:?}");
    let samples = prometheus::parse(&text);
    let admitted = samples
        .iter()
        .find(|s| s.name == "proxy_rate_limit_admitted_total")
        .unwrap();
    // `"`, `\` and the line feed come back as they were; every other
    // control character as the text of its escape.
    assert_eq!(
        admitted.label("model"),
        Some("we\"ird\\name\nwith\\r\\u{1b}[2J\\0\\u{7f}·é")
    );
    assert_eq!(admitted.value, 3.0);
    let learned = samples
        .iter()
        .find(|s| s.name == "proxy_learned_limit")
        .unwrap();
    assert_eq!(learned.label("model"), admitted.label("model"));
    assert_eq!(learned.label("unit"), Some("requests"));
    assert_eq!(learned.value, 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_name_cannot_forge_a_log_field() {
    let gw = start(&one_a_minute()).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let forged = "forged method=DELETE status=500 route=sim/sim-small";
    for _ in 0..2 {
        // Forwarded (404 from the simulator), then refused by the limit.
        post(&client, &url, forged).await;
    }
    gw.shutdown().await;
    let logs = log_text();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("forged")).collect();
    assert!(lines.len() >= 2, "{logs}");
    for line in lines {
        // Every field holding the name is quoted whole.
        assert!(
            !line.contains("=sim/forged method=") && !line.contains("=forged method="),
            "a field was forged: {line}"
        );
    }
}

/// `promtool check metrics` (Debian's `prometheus` package) on `text`:
/// `None` when promtool is not installed (a failure under `CI=true`).
fn promtool_check(text: &str) -> Option<std::process::Output> {
    use std::io::Write as _;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("promtool is needed under CI=true (apt-get install prometheus): {e}")
        }
        Err(e) => {
            eprintln!("skipped: promtool not found ({e}); apt-get install prometheus");
            return None;
        }
    };
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(text.as_bytes())
        .expect("promtool reads its input");
    Some(child.wait_with_output().expect("promtool ran"))
}

/// After traffic (admitted, refused, a model name holding a quote and a
/// backslash, a learned limit), `/metrics` passes `promtool check
/// metrics`: the format, and Prometheus's naming conventions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_check_after_traffic() {
    let toml = r#"
[simulator]
latency = "0ms"
models = [
    { name = "sim-small", limit = 2, period = "10s" },
    { name = 'we"ird\name', limit = 100, period = "1s" },
]

[[providers]]
name = "sim"
base_url = "simulator"

[rate_limit]
quotas = [{ limit = 3, period = "1m" }]
"#;
    let gw = start(toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    for model in [
        "sim-small",
        "sim-small",
        "sim-small",
        "sim-small",
        "we\"ird\\name",
    ] {
        let _ = post(&client, &url, model).await;
    }
    let metrics = get_text(&client, &format!("{url}/metrics")).await;
    gw.shutdown().await;
    assert!(
        metrics.contains(r#"model="we\"ird\\name""#),
        "the odd model is a series: {metrics}"
    );
    let Some(checked) = promtool_check(&metrics) else {
        return;
    };
    assert!(
        checked.status.success(),
        "promtool: {}{}\n{metrics}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}
