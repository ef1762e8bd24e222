//! End to end: the `proxy` example's gateway in front of its simulator, each
//! test on its own ephemeral loopback ports, over real sockets. Windows are
//! short (1–2 s) and only counts, statuses and headers are asserted, never
//! elapsed times.
//!
//! The example's modules are compiled into this test and driven directly.
//!
//! Over 700 lines: one test per gateway rule, each with the file it runs
//! whose fields are the point of the test; the shared setup is in `support`.

mod support;

use testkit::capture;

use proxy::{app, bench, cli, config, demo, gateway, simulator, stats};

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser as _;
use serde_json::Value;

use crate::config::Settings;
use capture::log_text;
use support::sim::*;

// Helpers: `support::sim`.

/// Reads server-sent events off a response.
struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

/// One event: its id, data and comment lines.
#[derive(Debug, Default)]
struct SseEvent {
    id: Option<String>,
    data: String,
    comments: Vec<String>,
}

impl SseReader {
    async fn connect(client: &reqwest::Client, url: &str) -> Self {
        let response = client.get(format!("{url}/events")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (bounded: 10 s); `None` when the stream ended.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = SseEvent::default();
                for line in block.lines() {
                    if let Some(c) = line.strip_prefix(':') {
                        event.comments.push(c.trim().to_owned());
                    } else if let Some(id) = line.strip_prefix("id:") {
                        event.id = Some(id.trim().to_owned());
                    } else if let Some(data) = line.strip_prefix("data:") {
                        event.data.push_str(data.trim_start());
                    }
                }
                return Some(event);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("no event within 10 s")
                .unwrap()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next event carrying data, as JSON.
    async fn next_snapshot(&mut self) -> Option<Value> {
        loop {
            let event = self.next().await?;
            if !event.data.is_empty() {
                return Some(serde_json::from_str(&event.data).unwrap());
            }
        }
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_above_the_route_limit_reaches_the_simulator_exactly_limit_times_per_window() {
    let toml = simulator(100, 100)
        + r#"
[rate_limit]
[[rate_limit.rules]]
provider = "sim"
model = "sim-small"
quotas = [{ limit = 3, period = "2s", algorithm = "sliding_window" }]
"#;
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();

    let first = burst(&client, &url, "sim-small", 10).await;
    assert_eq!(count(&first, 200), 3);
    assert_eq!(count(&first, 429), 7);
    assert_eq!(sim.count("sim-small").received, 3);
    let refused = first.iter().find(|r| r.status() == 429).unwrap();
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""sim/sim-small";q=3;w=2"#
    );
    // Other routes are not affected (no rule: unlimited here).
    assert_eq!(count(&burst(&client, &url, "sim-large", 5).await, 200), 5);

    // The next window (every admission above was made before the burst
    // ended, so all have left the window 2 s later): again exactly 3.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let second = burst(&client, &url, "sim-small", 10).await;
    assert_eq!(count(&second, 200), 3);
    assert_eq!(count(&second, 429), 7);
    assert_eq!(sim.count("sim-small").received, 6);
    assert_eq!(sim.count("sim-small").refused, 0);

    let s = stats(&client, &url).await;
    let r = route(&s, "sim/sim-small");
    assert_eq!(r["rate_limit"]["admitted"], 6);
    assert_eq!(r["rate_limit"]["rejected"], 14);
    assert_eq!(r["upstream"]["ok"], 6);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_delays_requests_instead_of_refusing_them() {
    let toml = simulator(100, 100)
        + r#"
[rate_limit]
mode = "wait"
max_wait = "3s"
[[rate_limit.rules]]
provider = "sim"
model = "sim-small"
quotas = [{ limit = 2, period = "1s" }]
"#;
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let responses = burst(&client, &url, "sim-small", 4).await;
    assert_eq!(
        count(&responses, 200),
        4,
        "{:?}",
        responses.iter().map(|r| r.status()).collect::<Vec<_>>()
    );
    let s = stats(&client, &url).await;
    let r = route(&s, "sim/sim-small");
    assert_eq!(r["rate_limit"]["admitted"], 4);
    assert_eq!(r["rate_limit"]["waited"], 2);
    assert_eq!(r["rate_limit"]["rejected"], 0);
    assert_eq!(
        gw.simulator.as_ref().unwrap().count("sim-small").received,
        4
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_429_cools_its_route_down_and_other_routes_keep_flowing() {
    let toml = simulator(100, 1)
        + r#"
[backoff]
mode = "reject"
"#;
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();

    assert_eq!(post(&client, &url, "sim-large").await.status(), 200);
    // Over the simulator's own limit: its 429 comes back as it is...
    let upstream = post(&client, &url, "sim-large").await;
    assert_eq!(upstream.status(), 429);
    assert_eq!(upstream.headers()["retry-after"], "2");
    assert_eq!(
        body_json(upstream).await["error"]["code"],
        "rate_limit_exceeded"
    );
    // ...and the route cools down: refused by the gateway, never sent.
    let cooling = post(&client, &url, "sim-large").await;
    assert_eq!(cooling.status(), 503);
    let retry_after: u64 = cooling.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(body_json(cooling).await["error"]["code"], "cooling_down");
    assert_eq!(sim.count("sim-large").received, 2);
    // Another route is not affected.
    assert_eq!(count(&burst(&client, &url, "sim-small", 3).await, 200), 3);

    let s = stats(&client, &url).await;
    let large = route(&s, "sim/sim-large");
    assert_eq!(large["cooldown"]["status"], 429);
    assert!(large["cooldown"]["remaining_ms"].as_f64().unwrap() <= 2000.0);
    assert_eq!(large["backoff"]["rejected"], 1);
    assert_eq!(large["upstream"]["rate_limited"], 1);
    assert_eq!(s["aggregate"]["cooldowns_started"], 1);
    assert!(route(&s, "sim/sim-small")["cooldown"].is_null());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_holds_its_permit_until_the_stream_ends() {
    let toml = simulator(100, 100)
        + r#"
[concurrency]
max_in_flight = 1
max_queue = 0
"#;
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();

    let hold = sim.hold_streams();
    let mut stream = post_stream(&client, &url, "sim-small").await;
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    // Chunks arrive one by one while the answer is still being made.
    let mut text = String::new();
    while text.matches("data:").count() < 2 {
        let chunk = stream.chunk().await.unwrap().expect("stream ended early");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!text.contains("[DONE]"));

    // The route's one permit is taken by the open stream.
    let refused = post(&client, &url, "sim-small").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(body_json(refused).await["error"]["code"], "queue_full");
    let s = stats(&client, &url).await;
    assert_eq!(route(&s, "sim/sim-small")["concurrency"]["in_flight"], 1);
    // Permits are per route.
    assert_eq!(post(&client, &url, "sim-large").await.status(), 200);

    drop(hold);
    while let Some(chunk) = stream.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.matches("data:").count() >= 6);
    until(&client, &url, "the permit back", |s| {
        route(s, "sim/sim-small")["concurrency"]["in_flight"] == 0
    })
    .await;
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_send_a_snapshot_on_connect_an_update_after_a_request_and_heartbeats() {
    let toml = simulator(100, 100)
        + r#"
[gateway]
events_heartbeat = "200ms"
"#;
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();

    let mut events = SseReader::connect(&client, &url).await;
    let first = events.next().await.unwrap();
    assert!(first.id.is_some());
    let first: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(first["routes"].as_array().unwrap().len(), 0);
    assert_eq!(first["event_clients"], 1);

    // Nothing happens: a heartbeat comment, no data.
    let idle = events.next().await.unwrap();
    assert_eq!(idle.comments, ["heartbeat"]);
    assert!(idle.data.is_empty());

    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    let mut seen = None;
    while let Some(snapshot) = events.next_snapshot().await {
        let done = snapshot["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["route"] == "sim/sim-small" && r["upstream"]["ok"] == 1);
        if done {
            seen = Some(snapshot);
            break;
        }
    }
    let seen = seen.unwrap();
    assert_eq!(route(&seen, "sim/sim-small")["rate_limit"]["admitted"], 1);
    assert!(seen["seq"].as_u64().unwrap() > first["seq"].as_u64().unwrap());

    // Shutting down ends the stream.
    let stop = tokio::spawn(gw.shutdown());
    while events.next().await.is_some() {}
    assert!(stop.await.unwrap());
}

/// Check Prometheus text format (0.0.4) strictly: every sample belongs to
/// the family declared just before it with HELP and TYPE, names and labels
/// are well formed, label values are properly escaped, values are numbers,
/// no series repeats. Returns series → value.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut series = BTreeMap::new();
    let mut families = HashSet::new();
    let mut family: Option<(String, String)> = None;
    let mut help: Option<String> = None;
    for (no, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", no + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').unwrap_or_else(|| panic!("{}", at()));
            assert!(name_ok(name), "{}", at());
            help = Some(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{}", at()));
            assert_eq!(help.as_deref(), Some(name), "TYPE without HELP: {}", at());
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{}",
                at()
            );
            assert!(
                families.insert(name.to_owned()),
                "family declared twice: {}",
                at()
            );
            family = Some((name.to_owned(), kind.to_owned()));
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{}", at());
            let (name, after) = match line.find(['{', ' ']) {
                Some(i) => line.split_at(i),
                None => panic!("{}", at()),
            };
            let (fam, kind) = family
                .clone()
                .unwrap_or_else(|| panic!("sample before TYPE: {}", at()));
            assert_eq!(name, fam, "sample outside its family: {}", at());
            let mut labels = Vec::new();
            let value = if let Some(rest) = after.strip_prefix('{') {
                let mut chars = rest.char_indices().peekable();
                let end;
                loop {
                    let mut label = String::new();
                    for (_, c) in chars.by_ref() {
                        if c == '=' {
                            break;
                        }
                        label.push(c);
                    }
                    assert!(name_ok(&label), "bad label name {label:?}: {}", at());
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{}", at());
                    let mut value = String::new();
                    loop {
                        match chars.next().map(|(_, c)| c) {
                            Some('\\') => match chars.next().map(|(_, c)| c) {
                                Some('\\') => value.push('\\'),
                                Some('"') => value.push('"'),
                                Some('n') => value.push('\n'),
                                other => panic!("bad escape {other:?}: {}", at()),
                            },
                            Some('"') => break,
                            Some('\n') | None => panic!("unterminated label value: {}", at()),
                            Some(c) => value.push(c),
                        }
                    }
                    labels.push((label, value));
                    match chars.next() {
                        Some((_, ',')) => continue,
                        Some((i, '}')) => {
                            end = i;
                            break;
                        }
                        other => panic!("bad label list {other:?}: {}", at()),
                    }
                }
                &rest[end + 1..]
            } else {
                after
            };
            let value = value
                .strip_prefix(' ')
                .unwrap_or_else(|| panic!("{}", at()));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                "NaN" => f64::NAN,
                v => v.parse().unwrap_or_else(|_| panic!("bad value: {}", at())),
            };
            if kind == "counter" {
                assert!(value >= 0.0, "negative counter: {}", at());
            }
            let key = format!(
                "{name}{{{}}}",
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            assert!(
                series.insert(key, value).is_none(),
                "series repeated: {}",
                at()
            );
        }
    }
    series
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_prometheus_text_with_every_layer_per_route() {
    let toml = simulator(100, 1) + &one_rule("sim-small", 2, "2s");
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    assert_eq!(count(&burst(&client, &url, "sim-small", 3).await, 429), 1);
    assert_eq!(post(&client, &url, "sim-large").await.status(), 200);
    assert_eq!(post(&client, &url, "sim-large").await.status(), 429);
    assert_eq!(post(&client, &url, "sim-large").await.status(), 503);
    // A model name a client chose: quotes and a backslash (a newline is
    // refused before routing).
    let odd = "we\"ird\\name";
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .body(serde_json::json!({"model": odd}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);

    let response = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.unwrap();
    let m = parse_prometheus(&text);
    let get = |name: &str, model: &str| {
        *m.get(&format!(r#"{name}{{provider="sim",model={model:?}}}"#))
            .unwrap_or_else(|| panic!("no {name} for {model} in\n{text}"))
    };
    assert_eq!(get("proxy_rate_limit_admitted_total", "sim-small"), 2.0);
    assert_eq!(get("proxy_rate_limit_rejected_total", "sim-small"), 1.0);
    assert_eq!(get("proxy_concurrency_in_flight", "sim-small"), 0.0);
    assert_eq!(get("proxy_backoff_rejected_total", "sim-large"), 1.0);
    assert!(get("proxy_backoff_cooldown_seconds", "sim-large") > 0.0);
    // The upstream does not serve that model: it is counted with the
    // others, not under its own name.
    let other = r#"provider="(other)",model="(other)""#;
    assert_eq!(m[&format!("proxy_upstream_failures_total{{{other}}}")], 0.0);
    assert_eq!(
        m[&format!(r#"proxy_upstream_responses_total{{{other},class="4xx"}}"#)],
        1.0
    );
    assert!(!text.contains("we\\\"ird"), "{text}");
    assert_eq!(
        m[r#"proxy_upstream_responses_total{provider="sim",model="sim-large",class="429"}"#],
        1.0
    );
    assert_eq!(m["proxy_backoff_cooldowns_started_total{}"], 1.0);
    assert_eq!(m["proxy_config_generation{}"], 1.0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_stats_events_metrics_or_logs() {
    const SECRET: &str = "sk-test-Zq8vT3pLm0Xw9rYb";
    let env = |name: &str| (name == "SIM_KEY").then(|| SECRET.to_owned());
    let toml = r#"
[simulator]
latency = "0ms"
api_key_env = "SIM_KEY"
models = [{ name = "sim-small", limit = 2, period = "2s" }]

[[providers]]
name = "sim"
base_url = "simulator"
api_key_env = "SIM_KEY"
"#;
    let gw = start_with(toml, &env).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();
    let mut events = SseReader::connect(&client, &url).await;

    // The key is sent (the simulator demands it), replacing the client's own.
    let sent = client
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer the-clients-own-token")
        .body(chat("sim-small", false))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    // An upstream 429 and a cooldown refusal log too.
    assert_eq!(post(&client, &url, "sim-small").await.status(), 429);
    assert_eq!(post(&client, &url, "sim-small").await.status(), 503);
    assert_eq!(sim.handle().unauthorized(), 0);
    assert_eq!(sim.count("sim-small").received, 3);

    let mut seen = Vec::new();
    seen.push(stats(&client, &url).await.to_string());
    seen.push(metrics(&client, &url).await);
    seen.push(get_text(&client, &format!("{url}/")).await);
    let mut last = events.next_snapshot().await.unwrap();
    while last["aggregate"]["upstream"]["responses"] != 3 {
        last = events.next_snapshot().await.unwrap();
    }
    seen.push(last.to_string());
    let settings = Settings::from_toml(toml, &env).unwrap();
    seen.push(format!(
        "{settings:?} {:?} {:?}",
        gw.gateway,
        gw.gateway.providers()
    ));
    seen.push(app::banner(&gw, false));
    assert!(stats(&client, &url).await["providers"][0]["authenticated"] == true);
    gw.shutdown().await;
    seen.push(log_text());
    assert!(
        log_text().contains("rate limit"),
        "the layers' logs are captured"
    );
    for text in &seen {
        assert!(!text.contains(SECRET), "the key leaked into:\n{text}");
        assert!(!text.contains("Zq8vT3pLm0Xw9rYb"));
    }
}

#[test]
fn a_bad_configuration_is_one_error_naming_the_field() {
    let env = |name: &str| (name == "SET").then(|| "value".to_owned());
    let sim = "[simulator]\n[[providers]]\nname = \"sim\"\nbase_url = \"simulator\"\n";
    let cases: &[(&str, String)] = &[
        ("providers", String::new()),
        ("providers[0].base_url", "[[providers]]\nname = \"openai\"\nbase_url = \"ftp://api.openai.com\"\n".into()),
        ("providers[0].base_url", "[[providers]]\nname = \"x\"\nbase_url = \"http://user:pw@host\"\n".into()),
        ("providers[0].base_url", "[[providers]]\nname = \"x\"\nbase_url = \"simulator\"\n".into()),
        ("providers[0].name", "[[providers]]\nname = \"stats\"\nbase_url = \"http://h\"\n".into()),
        ("providers[1].name", format!("{sim}[[providers]]\nname = \"sim\"\nbase_url = \"http://h\"\n")),
        ("providers[0].api_key_env", "[[providers]]\nname = \"x\"\nbase_url = \"http://h\"\napi_key_env = \"UNSET\"\n".into()),
        ("providers[0].api_key_header", "[[providers]]\nname = \"x\"\nbase_url = \"http://h\"\napi_key_env = \"SET\"\napi_key_header = \"bad header\"\n".into()),
        ("gateway.listen_addr", format!("[gateway]\nlisten_addr = \"x\"\n{sim}")),
        ("gateway.max_routes", format!("[gateway]\nmax_routes = \"many\"\n{sim}")),
        ("gateway.upstream_timeout", format!("[gateway]\nupstream_timeout = \"soon\"\n{sim}")),
        ("gateway.listen", format!("[gateway]\nlisten = \"localhost\"\n{sim}")),
        ("simulator.models[0].period", "[simulator]\nmodels = [{ name = \"m\", limit = 1, period = \"0s\" }]\n".into()),
        ("rate_limit.quotas[0].limit", format!("{sim}[rate_limit]\nquotas = [{{ limit = -5, period = \"1m\" }}]\n")),
        ("rate_limit.rules[0].provider", format!("{sim}[[rate_limit.rules]]\nprovider = \"simm\"\nquotas = [{{ limit = 5, period = \"1m\" }}]\n")),
        ("rate_limit.max_wait", format!("{sim}[rate_limit]\nmode = \"wait\"\n")),
        ("concurrency.max_in_flight", format!("{sim}[concurrency]\nmax_in_flight = 0\n")),
        ("backoff.max_wait", format!("{sim}[backoff]\nmode = \"wait\"\n")),
        ("backoff.jitter", format!("{sim}[backoff]\njitter = 2.0\n")),
    ];
    for (field, toml) in cases {
        let error = Settings::from_toml(toml, &env).expect_err(toml);
        let text = error.to_string();
        assert!(
            text.contains(&format!("`{field}`")),
            "wanted `{field}` in: {text}\n{toml}"
        );
        assert!(!text.contains('\n'), "one line: {text}");
        assert!(!text.contains("value"), "no secret in: {text}");
    }
}

#[test]
fn an_unknown_table_is_named_itself_not_the_table_before_it() {
    let toml = "[simulator]\n[[providers]]\nname = \"sim\"\nbase_url = \"simulator\"\n\
                [concurrency]\nmax_in_flight = 1\n\n[nonsense]\nx = 1\n";
    let error = Settings::from_toml(toml, &|_: &str| None).expect_err(toml);
    assert!(
        error.to_string().starts_with("invalid `nonsense`:"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_exits_2_on_a_bad_config_and_0_after_a_graceful_stop() {
    let bad = temp_path("bad.toml");
    std::fs::write(
        &bad,
        "[[providers]]\nname = \"x\"\nbase_url = \"ftp://h\"\n",
    )
    .unwrap();
    let cli = cli::Cli::try_parse_from(["proxy", "--config", bad.to_str().unwrap()]).unwrap();
    assert_eq!(app::run(cli, std::future::pending(), None).await, 2);
    let error = app::load(
        Some(&bad),
        std::path::Path::new(config::DEFAULT_PATH),
        &no_env,
    )
    .err()
    .unwrap();
    assert!(error.contains("`providers[0].base_url`"), "{error}");
    let missing =
        cli::Cli::try_parse_from(["proxy", "--config", "/nonexistent/proxy.toml"]).unwrap();
    assert_eq!(app::run(missing, std::future::pending(), None).await, 2);
    let _ = std::fs::remove_file(&bad);

    let good = temp_path("good.toml");
    std::fs::write(&good, simulator(10, 10)).unwrap();
    let cli = cli::Cli::try_parse_from([
        "proxy",
        "--config",
        good.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ])
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready, url) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(app::run(
        cli,
        async move {
            let _ = stopped.await;
        },
        Some(ready),
    ));
    let url = url.await.unwrap();
    let client = reqwest::Client::new();
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    stop.send(()).unwrap();
    assert_eq!(run.await.unwrap(), 0);
    assert!(
        client.get(format!("{url}/stats")).send().await.is_err(),
        "still listening"
    );
    let _ = std::fs::remove_file(&good);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_stream_finish_and_is_bounded() {
    let toml = simulator(100, 100)
        + r#"
[gateway]
shutdown_grace = "10s"
"#;
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();
    let hold = sim.hold_streams();
    let mut stream = post_stream(&client, &url, "sim-small").await;
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data:"));
    let stopping = tokio::spawn(gw.shutdown());
    // No new connections once shutdown has begun.
    let mut refused = false;
    for _ in 0..200 {
        if reqwest::Client::new()
            .get(format!("{url}/stats"))
            .send()
            .await
            .is_err()
        {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "still accepting after shutdown began");
    drop(hold);
    let mut text = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(
        stopping.await.unwrap(),
        "the stream finished within the grace"
    );

    // A stream that never ends does not keep the gateway up past the grace.
    let toml = simulator(100, 100)
        + r#"
[gateway]
shutdown_grace = "300ms"
"#;
    let gw = start(&toml).await;
    let _hold = gw.simulator.as_ref().unwrap().hold_streams();
    let mut stream = post_stream(&client, &gw.url(), "sim-small").await;
    stream.chunk().await.unwrap().unwrap();
    assert!(!gw.shutdown().await, "reported as cut short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_routed_by_path_prefix_and_refused_cleanly_when_they_cannot_be() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let toml = format!(
        r#"
[gateway]
max_body_bytes = 1000

[simulator]
latency = "0ms"

[[providers]]
name = "sim"
base_url = "simulator"

[[providers]]
name = "down"
base_url = "http://{closed}/api"
"#
    );
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let send = |path: &str, body: String| client.post(format!("{url}{path}")).body(body).send();

    // Two providers, none the default: the prefix is needed.
    let unrouted = send("/v1/chat/completions", chat("sim-small", false))
        .await
        .unwrap();
    assert_eq!(unrouted.status(), 404);
    assert_eq!(body_json(unrouted).await["error"]["code"], "no_provider");
    assert_eq!(
        send("/sim/v1/chat/completions", chat("sim-small", false))
            .await
            .unwrap()
            .status(),
        200
    );
    let models = client
        .get(format!("{url}/sim/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    let large = send(
        "/sim/v1/chat/completions",
        format!(
            "{{\"model\":\"sim-small\",\"pad\":\"{}\"}}",
            "x".repeat(2000)
        ),
    )
    .await
    .unwrap();
    assert_eq!(large.status(), 413);
    let down = send("/down/v1/chat/completions", chat("m", false))
        .await
        .unwrap();
    assert_eq!(down.status(), 502);
    assert_eq!(
        body_json(down).await["error"]["code"],
        "upstream_unreachable"
    );

    let s = stats(&client, &url).await;
    assert_eq!(route(&s, "sim/(none)")["upstream"]["ok"], 1);
    assert_eq!(route(&s, "sim/sim-small")["upstream"]["ok"], 1);
    // Never answered, so not known to be real: counted with the others.
    assert_eq!(route(&s, "(other)")["upstream"]["failed"], 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_config_is_the_default_and_the_demo_shows_every_layer_acting() {
    // Without the file in the working directory: the embedded copy.
    let loaded = app::load(
        None,
        std::path::Path::new("/nonexistent/proxy.toml"),
        &no_env,
    )
    .unwrap();
    assert!(loaded.watch.is_none());
    assert_eq!(
        loaded.bytes,
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/proxy.toml")).unwrap()
    );
    let gw = gateway::start(loaded.settings, ([127, 0, 0, 1], 0).into(), loaded.source)
        .await
        .unwrap();
    let sim = gw.simulator.as_ref().unwrap().handle();
    let report = demo::run(&gw.url(), &gw.gateway, Some(sim.clone()))
        .await
        .unwrap();
    let batch = |label: &str, model: &str| report.batch(label, model).unwrap().clone();
    // sim-small: a burst of 5 at once, then 10 a second waiting up to
    // 500 ms, 4 in flight and 16 queued: what is not answered found the
    // queue full or waited too long.
    let small = batch("burst", "sim-small");
    assert!(small.count(200) >= 10, "{report}");
    assert_eq!(
        small.count(200) + small.count(429) + small.count(503),
        30,
        "{report}"
    );
    let snapshot = stats::snapshot(&gw.gateway, 0);
    let small_stats = snapshot
        .routes
        .iter()
        .find(|r| r.route == "sim/sim-small")
        .unwrap();
    assert!(small_stats.rate_limit.waited >= 1, "{report}");
    assert!(small_stats.concurrency.waited >= 1, "{report}");
    // sim-large: 2 a rolling second; the rest would wait too long.
    let large = batch("burst", "sim-large");
    assert_eq!(large.count(200), 2, "{report}");
    assert_eq!(large.count(429), 6, "{report}");
    // The gateway's limits are tighter than the simulator's.
    let after_burst = &report.simulator[0].1;
    assert!(after_burst.iter().all(|m| m.refused == 0), "{report}");
    assert!(report.stream_chunks >= 8, "{report}");
    assert!(report.in_flight_while_streaming >= 1, "{report}");
    assert!(
        batch("rate limit off", "sim-large").count(429) >= 1,
        "{report}"
    );
    assert_eq!(
        batch("while cooling", "sim-large").count(503),
        3,
        "{report}"
    );
    assert_eq!(
        batch("while cooling", "sim-small").count(200),
        3,
        "{report}"
    );
    assert!(report.table.contains("sim/sim-large"));
    let text = report.to_string();
    assert!(text.contains("while cooling"));
    gw.shutdown().await;
}

/// A `chromium` on the PATH.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|p| p.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_a_request_in_a_real_browser() {
    let Some(browser) = chromium() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("chromium is not installed; CI must install it (apt-get install chromium)");
        }
        eprintln!(
            "skipping the browser test: chromium is not installed (apt-get install chromium)"
        );
        return;
    };
    // Learning the simulator's stated limit (100 a minute) shows too.
    let learning = simulator(100, 100).replace(
        r#"base_url = "simulator""#,
        "base_url = \"simulator\"\nlearn_limits = true",
    ) + "\n[[clients]]\nname = \"tester\"\nkeys = [{ env = \"TESTER_KEY\" }]\n";
    // And the clients: the request below is the anonymous client's.
    let env = |name: &str| (name == "TESTER_KEY").then(|| "tester-key-0123456789abcdef".to_owned());
    let gw = support::sim::start_with(&learning, &env).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let profile = temp_path("chromium-profile");
    // `--dump-dom` prints the page once virtual time has run out; virtual
    // time stands still while a request (the page's /events stream) is
    // open, so the DOM is dumped after the gateway ends that stream.
    let mut command = tokio::process::Command::new(&browser);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("{url}/"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let browser = command.spawn().unwrap();
    let output = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(60), browser.wait_with_output()).await
    });

    // The page is loaded and listening.
    until(&client, &url, "the page's /events stream", |s| {
        s["event_clients"].as_u64() >= Some(1)
    })
    .await;
    let before = stats(&client, &url).await;
    assert!(before["routes"].as_array().unwrap().is_empty());
    // A request goes through the gateway.
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    // Shutting down sends every /events client the final snapshot, then
    // ends the stream, which lets the browser's virtual time run out.
    gw.shutdown().await;
    let output = output
        .await
        .unwrap()
        .expect("chromium did not finish within 60 s")
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = dom
        .split("<tr ")
        .find(|r| r.contains(r#"data-route="sim/sim-small""#))
        .unwrap_or_else(|| panic!("no row for the route in the page:\n{dom}"));
    // route, then rate limit admitted = 1.
    assert!(row.contains("<td>sim/sim-small</td><td>1</td>"), "{row}");
    assert!(row.contains(">100/1m learned</td>"), "{row}");
    let client = dom
        .split("<tr ")
        .find(|r| r.contains(r#"data-client="anonymous""#))
        .unwrap_or_else(|| panic!("no row for the anonymous client in the page:\n{dom}"));
    assert!(
        client.contains("<td>anonymous</td><td>1</td><td>1</td>"),
        "{client}"
    );
    assert!(!dom.contains(r#"<tr class="empty">"#), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_refuses_over_its_limit_and_streams_openai_chunks() {
    let settings = config::SimSettings {
        models: vec![config::SimModel {
            name: "m".into(),
            limit: 2,
            period: Duration::from_secs(2),
        }],
        latency: Duration::ZERO,
        stream_interval: Duration::from_millis(5),
        ..config::SimSettings::local()
    };
    let sim = simulator::Simulator::start(settings).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", sim.url());
    let send = |body: String| client.post(&url).body(body).send();
    let ok = send(chat("m", false)).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-ratelimit-remaining-requests"], "1");
    let answer = body_json(ok).await;
    assert_eq!(answer["object"], "chat.completion");
    let streamed = send(chat("m", true)).await.unwrap().text().await.unwrap();
    let data: Vec<&str> = streamed
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let chunk: Value = serde_json::from_str(data[0]).unwrap();
    assert_eq!(chunk["object"], "chat.completion.chunk");
    let refused = send(chat("m", false)).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "2");
    assert_eq!(send(chat("nope", false)).await.unwrap().status(), 404);
    assert_eq!(send("{".into()).await.unwrap().status(), 400);
    let counts = sim.count("m");
    assert_eq!(
        (
            counts.received,
            counts.answered,
            counts.refused,
            counts.streamed
        ),
        (3, 2, 1, 1)
    );
    sim.stop(Duration::from_secs(1)).await;
}

#[test]
fn the_load_test_config_is_valid() {
    Settings::from_toml(bench::BENCH_CONFIG, &no_env).unwrap();
}

/// `--bench --path`: one path alone, each request answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_test_runs_one_path_alone() {
    for path in [bench::BenchPath::Plain, bench::BenchPath::Gateway] {
        let report = bench::run_one(path, 20, &[1, 2]).await.unwrap();
        let rows: Vec<&str> = report.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 3, "{report}");
        for row in &rows[1..] {
            assert!(row.ends_with("| 0 |"), "errors in {row}");
        }
        assert!(
            rows[1..].iter().all(|r| r.contains(match path {
                bench::BenchPath::Plain => "plain proxy",
                _ => "the gateway, four layers",
            })),
            "{report}"
        );
    }
}
