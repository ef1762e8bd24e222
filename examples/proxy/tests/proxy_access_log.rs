//! The gateway's access log, end to end: a run with waits, refusals by a
//! named limit, an upstream 429 and the cooldown after it, a stream, an
//! edge refusal and a local page, every line parsed, none holding a key, a
//! prompt or a query.

mod support;

use std::collections::BTreeSet;

use proxy::config::Settings;
use serde_json::Value;
use support::sim::{chat, simulator, start_with, temp_path};

const GATEWAY_KEY: &str = "sk-gateway-secret-4417";
const CLIENT_KEY: &str = "sk-client-secret-9083";
const PROMPT: &str = "prompt-text-never-logged-5521";
const QUERY: &str = "query-secret-7730";

fn env(name: &str) -> Option<String> {
    (name == "SIM_KEY").then(|| GATEWAY_KEY.to_owned())
}

fn config(log: &std::path::Path, extra: &str) -> String {
    // The simulator's sim-large answers 429 beyond one request per 2s.
    let sim = simulator(100, 1).replace(
        "base_url = \"simulator\"",
        "base_url = \"simulator\"\napi_key_env = \"SIM_KEY\"",
    );
    format!(
        r#"{sim}
[backoff]
mode = "reject"

[rate_limit]
mode = "wait"
max_wait = "600ms"
quotas = [{{ limit = 100, period = "1m" }}]

[[rate_limit.rules]]
name = "small-per-second"
provider = "sim"
model = "sim-small"
quotas = [{{ limit = 3, period = "1s" }}]
"#
    )
    .replace(
        "[simulator]",
        &format!(
            "[gateway]\naccess_log = {:?}\n{extra}\n[simulator]",
            log.display().to_string()
        ),
    )
}

async fn send(client: &reqwest::Client, url: &str, path: &str, body: String) -> reqwest::Response {
    client
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {CLIENT_KEY}"))
        .header("x-api-key", CLIENT_KEY)
        .body(body)
        .send()
        .await
        .unwrap()
}

fn with_prompt(model: &str, stream: bool) -> String {
    chat(model, stream).replace("\"hi\"", &format!("\"{PROMPT}\""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_has_a_line_saying_what_the_layers_did_and_no_secret() {
    let log = temp_path("access.log");
    let gw = start_with(&config(&log, ""), &env).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let chat_path = format!("/sim/v1/chat/completions?key={QUERY}");

    // A stream first, read to its end.
    let stream = send(&client, &url, &chat_path, with_prompt("sim-small", true)).await;
    assert_eq!(stream.status(), 200);
    let streamed = stream.bytes().await.unwrap().len() as u64;
    // sim-small: 3 a second. Three more at once: two pass, one waits its
    // turn (333 ms, within max_wait); a fifth would wait too long.
    let burst = futures::future::join_all(
        (0..4).map(|_| send(&client, &url, &chat_path, with_prompt("sim-small", false))),
    )
    .await;
    let statuses: Vec<u16> = burst.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        1,
        "{statuses:?}"
    );
    // sim-large: the simulator's 429 on the second, then the cooldown.
    for expected in [200, 429, 503] {
        let r = send(&client, &url, &chat_path, with_prompt("sim-large", false)).await;
        assert_eq!(r.status(), expected);
    }
    // The edge's refusal, a local page, and a health check (not logged).
    let bad = send(&client, &url, "/sim/v1//chat", String::new()).await;
    assert_eq!(bad.status(), 400);
    assert_eq!(
        client
            .get(format!("{url}/stats"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    gw.shutdown().await;

    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    for secret in [GATEWAY_KEY, CLIENT_KEY, PROMPT, QUERY] {
        assert!(!text.contains(secret), "{secret} in the log:\n{text}");
    }
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 10, "{text}");
    for line in &lines {
        for field in ["time", "method", "path", "status", "outcome", "latency_ms"] {
            assert!(line.get(field).is_some(), "{field} missing: {line}");
        }
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
        assert_eq!(line["complete"], true, "{line}");
        assert_ne!(line["path"], "/healthz");
    }
    let of = |route: &str, outcome: &str, status: u64| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["route"] == route && l["outcome"] == outcome && l["status"] == status)
            .collect()
    };
    let small = of("sim/sim-small", "forwarded", 200);
    assert_eq!(small.len(), 4, "{text}");
    assert!(small.iter().any(|l| l["response_bytes"] == streamed));
    assert!(
        small.iter().all(|l| l["path"] == "/sim/v1/chat/completions"
            && l["method"] == "POST"
            && l["request_bytes"].as_u64() > Some(40)
            && l["upstream_requests_limit"] == 100),
        "{text}"
    );
    let waited: Vec<f64> = small
        .iter()
        .map(|l| l["waited_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(
        waited.iter().filter(|w| **w >= 200.0).count(),
        1,
        "{waited:?}"
    );
    let refused = of("sim/sim-small", "refused", 429);
    assert_eq!(refused.len(), 1, "{text}");
    assert_eq!(refused[0]["code"], "rate_limited");
    assert_eq!(refused[0]["limit"], "small-per-second");
    assert!(refused[0].get("waited_ms").is_none());
    assert_eq!(of("sim/sim-large", "forwarded", 200).len(), 1);
    let upstream_429 = of("sim/sim-large", "forwarded", 429);
    assert_eq!(upstream_429.len(), 1, "{text}");
    assert_eq!(upstream_429[0]["upstream_requests_remaining"], 0);
    let cooling = of("sim/sim-large", "refused", 503);
    assert_eq!(cooling.len(), 1, "{text}");
    assert_eq!(cooling[0]["code"], "cooling_down");
    let edge: Vec<&Value> = lines.iter().filter(|l| l["outcome"] == "error").collect();
    assert_eq!(edge.len(), 1, "{text}");
    assert_eq!(edge[0]["code"], "bad_path");
    assert!(edge[0].get("route").is_none());
    let local: BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["outcome"] == "local")
        .map(|l| l["path"].as_str().unwrap())
        .collect();
    assert_eq!(local, BTreeSet::from(["/stats"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_is_rotated_and_sampling_keeps_every_refusal_in_logfmt() {
    let log = temp_path("rotated.log");
    let extra =
        "access_log_format = \"logfmt\"\naccess_log_max_bytes = 4096\naccess_log_sample = 0.5";
    let gw = start_with(&config(&log, extra), &env).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    for _ in 0..80 {
        let page = client.get(format!("{url}/stats")).send().await.unwrap();
        assert_eq!(page.status(), 200);
    }
    // Six at once on 3 a second: three pass, one waits, two are refused.
    let burst = futures::future::join_all((0..6).map(|_| {
        send(
            &client,
            &url,
            "/sim/v1/chat/completions",
            chat("sim-small", false),
        )
    }))
    .await;
    assert_eq!(burst.iter().filter(|r| r.status() == 429).count(), 2);
    gw.shutdown().await;

    let rotated = proxy::access_log::rotated(&log);
    let (old, new) = (
        std::fs::read_to_string(&rotated).unwrap(),
        std::fs::read_to_string(&log).unwrap(),
    );
    let _ = (std::fs::remove_file(&log), std::fs::remove_file(&rotated));
    assert!(
        old.len() <= 4096 && new.len() <= 4096,
        "{} {}",
        old.len(),
        new.len()
    );
    let lines: Vec<&str> = old.lines().chain(new.lines()).collect();
    for line in &lines {
        assert!(
            line.starts_with("time=") && line.contains(" outcome="),
            "{line}"
        );
    }
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    // 80 pages and 4 forwarded sampled at one in two (42),
    // and the 2 refusals all; in two files, the first rotated once.
    assert_eq!(
        count("outcome=refused code=rate_limited limit=small-per-second"),
        2
    );
    assert_eq!(lines.len(), 44, "{old}{new}");
}

#[tokio::test]
async fn a_stream_the_client_leaves_is_logged_incomplete() {
    let log = temp_path("left.log");
    let gw = start_with(&config(&log, ""), &env).await;
    let client = reqwest::Client::new();
    let mut left = send(
        &client,
        &gw.url(),
        "/sim/v1/chat/completions",
        chat("sim-small", true),
    )
    .await;
    assert!(left.chunk().await.unwrap().is_some());
    drop(left);
    gw.shutdown().await;
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let line: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["complete"], false, "{text}");
    assert!(line["response_bytes"].as_u64() > Some(0), "{text}");
}

#[test]
fn access_log_settings_are_checked() {
    let log = temp_path("never.log");
    for (extra, field) in [
        ("access_log_sample = 0.0", "access_log_sample"),
        ("access_log_sample = 1.5", "access_log_sample"),
        ("access_log_format = \"xml\"", "access_log_format"),
        ("access_log_max_bytes = 10", "access_log_max_bytes"),
    ] {
        let e = Settings::from_toml(&config(&log, extra), &env).unwrap_err();
        assert!(e.to_string().contains(field), "{extra}: {e}");
    }
    let orphan = "[gateway]\naccess_log_format = \"logfmt\"\n";
    let e = Settings::from_toml(orphan, &env).unwrap_err().to_string();
    assert!(
        e.contains("access_log_format") && e.contains("without access_log"),
        "{e}"
    );
    assert!(!log.exists());
}

#[tokio::test]
async fn a_log_that_cannot_be_written_stops_the_start() {
    let missing = temp_path("no-such-dir").join("access.log");
    let settings = Settings::from_toml(&config(&missing, ""), &env).unwrap();
    let e = proxy::gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("gateway.access_log"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_client_leaves_while_it_waits_is_logged_cancelled() {
    let log = temp_path("cancelled.log");
    let toml = format!(
        "[gateway]\naccess_log = {:?}\nshutdown_grace = \"2s\"\n{}\n[concurrency]\nmax_in_flight = 1\n",
        log.display().to_string(),
        simulator(100, 100).replace("latency = \"0ms\"", "latency = \"600ms\"")
    );
    let gw = start_with(&toml, &env).await;
    let url = gw.url();
    let client = reqwest::Client::new();
    let first = tokio::spawn({
        let client = client.clone();
        let url = url.clone();
        async move {
            send(
                &client,
                &url,
                "/sim/v1/chat/completions",
                chat("sim-small", false),
            )
            .await
        }
    });
    // The second waits for the first's permit; its client gives up.
    support::sim::until(&client, &url, "the first in flight", |s| {
        s["aggregate"]["concurrency"]["in_flight"].as_u64() == Some(1)
    })
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(100))
        .build()
        .unwrap();
    let left = impatient
        .post(format!("{url}/sim/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat("sim-small", false))
        .send()
        .await;
    assert!(left.is_err(), "the second was answered: {left:?}");
    assert_eq!(first.await.unwrap().status(), 200);
    gw.shutdown().await;
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cancelled: Vec<&Value> = lines
        .iter()
        .filter(|l| l["outcome"] == "cancelled")
        .collect();
    assert_eq!(cancelled.len(), 1, "{text}");
    assert_eq!(cancelled[0]["status"], 499);
    assert_eq!(cancelled[0]["complete"], false);
    assert_eq!(cancelled[0]["path"], "/sim/v1/chat/completions");
}
