//! The gateway's callers (`[[clients]]`), end to end: keys from the
//! environment and from a file, 401s when a key is required, a caller's
//! key never forwarded, logged or shown, rotation, and requests counted
//! per client.
//!
//! Over 700 lines: one test per rule of the callers' keys, each with the
//! file it runs; the shared setup is in `support`.

mod support;

use std::time::{Duration, Instant};

use proxy::config::Settings;
use proxy::gateway::Running;
use serde_json::Value;
use support::fake_upstream::FakeUpstream;
use support::sim::temp_path;

const ALICE: &str = "alice-key-0123456789abcdef";
const ALICE_NEXT: &str = "alice-next-key-fedcba9876543210";
const BOB: &str = "bob-key-00112233445566778899";
const PROVIDER_KEY: &str = "sk-provider-key-5566";
const ADMIN: &str = "operator-key-aabbccddeeff0011";

fn env(name: &str) -> Option<String> {
    match name {
        "ALICE_KEY" => Some(ALICE.to_owned()),
        "BOB_KEY" => Some(BOB.to_owned()),
        "PROVIDER_KEY" => Some(PROVIDER_KEY.to_owned()),
        "SHORT_KEY" => Some("short".to_owned()),
        "ADMIN_KEY" => Some(ADMIN.to_owned()),
        _ => None,
    }
}

/// A file holding Alice's second key, for the config's `file` key source;
/// `name` keeps each test's file apart.
fn alice_next_file(name: &str) -> std::path::PathBuf {
    let next = temp_path(name);
    std::fs::write(&next, ALICE_NEXT).unwrap();
    next
}

fn config(upstream: &FakeUpstream, alice_next: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
[gateway]
{extra}

[[providers]]
name = "keyed"
base_url = "{url}"
api_key_env = "PROVIDER_KEY"

[[providers]]
name = "open"
base_url = "{url}"

[[clients]]
name = "alice"
keys = [{{ env = "ALICE_KEY" }}, {{ file = {next:?} }}]

[[clients]]
name = "bob"
keys = [{{ env = "BOB_KEY" }}]
"#,
        url = upstream.base_url(),
        next = alice_next.display().to_string(),
    )
}

async fn start(toml: &str) -> Running {
    support::sim::start_with(toml, &env).await
}

async fn post(url: &str, path: &str, header: Option<(&str, String)>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","messages":[]}"#);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

fn bearer(key: &str) -> Option<(&'static str, String)> {
    Some(("authorization", format!("Bearer {key}")))
}

#[tokio::test]
async fn with_keys_required_only_clients_pass_and_their_keys_never_go_upstream() {
    let upstream = FakeUpstream::start().await;
    let next = temp_path("alice-next");
    std::fs::write(&next, format!("{ALICE_NEXT}\n")).unwrap();
    let log = temp_path("clients.log");
    let extra = format!(
        "require_client_key = true\naccess_log = {:?}",
        log.display().to_string()
    );
    let gw = start(&config(&upstream, &next, &extra)).await;
    let url = gw.url();

    let missing = post(&url, "/keyed/v1/chat", None).await;
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.headers()["www-authenticate"], "Bearer");
    let body = support::sim::body_json(missing).await;
    assert_eq!(body["error"]["code"], "missing_key");
    let unknown = post(&url, "/keyed/v1/chat", bearer("not-a-client-key-at-all")).await;
    assert_eq!(unknown.status(), 401);
    let body = support::sim::body_json(unknown).await;
    assert_eq!(body["error"]["code"], "unknown_key");
    assert!(
        upstream.received().is_empty(),
        "a refused request went upstream"
    );

    // Both of alice's keys (rotation), in either header; bob's.
    assert_eq!(
        post(&url, "/keyed/v1/chat", bearer(ALICE)).await.status(),
        200
    );
    let x_api_key = Some(("x-api-key", ALICE_NEXT.to_owned()));
    assert_eq!(post(&url, "/keyed/v1/chat", x_api_key).await.status(), 200);
    assert_eq!(post(&url, "/open/v1/chat", bearer(BOB)).await.status(), 200);
    let received = upstream.received();
    assert_eq!(received.len(), 3);
    assert_eq!(
        received[0].values("authorization"),
        [format!("Bearer {PROVIDER_KEY}")]
    );
    assert_eq!(
        received[1].values("authorization"),
        [format!("Bearer {PROVIDER_KEY}")]
    );
    assert!(received[1].values("x-api-key").is_empty());
    // A provider without a key of its own gets no caller's key either.
    assert!(received[2].values("authorization").is_empty());

    let stats: Value = support::sim::stats(&reqwest::Client::new(), &url).await;
    let clients: Vec<(String, u64)> = stats["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["requests"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        clients,
        [
            ("alice".to_owned(), 2),
            ("bob".to_owned(), 1),
            ("anonymous".to_owned(), 0)
        ]
    );
    let metrics = support::sim::metrics(&reqwest::Client::new(), &url).await;
    gw.shutdown().await;
    let logged = std::fs::read_to_string(&log).unwrap();
    let _ = (std::fs::remove_file(&log), std::fs::remove_file(&next));
    assert!(logged.contains(r#""client":"alice""#), "{logged}");
    assert!(logged.contains(r#""code":"missing_key""#), "{logged}");
    for key in [ALICE, ALICE_NEXT, BOB] {
        for (what, text) in [
            ("/stats", &stats.to_string()),
            ("/metrics", &metrics),
            ("the log", &logged),
        ] {
            assert!(!text.contains(key), "a client key in {what}");
        }
    }
}

#[tokio::test]
async fn without_keys_required_others_are_anonymous_and_their_headers_pass() {
    let upstream = FakeUpstream::start().await;
    let next = alice_next_file("alice-next-open");
    let gw = start(&config(&upstream, &next, "")).await;
    let url = gw.url();
    assert_eq!(post(&url, "/open/v1/chat", None).await.status(), 200);
    // Not a client's key: the provider's own, passed through as before.
    assert_eq!(
        post(&url, "/open/v1/chat", bearer("sk-their-own-provider-key"))
            .await
            .status(),
        200
    );
    assert_eq!(
        post(&url, "/open/v1/chat", bearer(ALICE)).await.status(),
        200
    );
    // A key sent both ways: neither header goes on.
    let both = reqwest::Client::new()
        .post(format!("{url}/open/v1/chat"))
        .header("content-type", "application/json")
        .bearer_auth(ALICE)
        .header("x-api-key", ALICE_NEXT)
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), 200);
    let received = upstream.received();
    assert_eq!(
        received[1].values("authorization"),
        ["Bearer sk-their-own-provider-key"]
    );
    assert!(received[2].values("authorization").is_empty());
    assert!(received[3].values("authorization").is_empty());
    assert!(received[3].values("x-api-key").is_empty());
    let stats: Value = support::sim::stats(&reqwest::Client::new(), &url).await;
    assert_eq!(stats["clients"][0]["requests"], 2);
    assert_eq!(stats["clients"][2]["name"], "anonymous");
    assert_eq!(stats["clients"][2]["requests"], 2);
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
}

#[test]
fn client_keys_are_checked_and_never_named_in_errors() {
    let upstream_url = "http://127.0.0.1:9";
    let base = |clients: &str, extra: &str| {
        format!(
            "[gateway]\n{extra}\n[[providers]]\nname = \"p\"\nbase_url = \"{upstream_url}\"\n{clients}"
        )
    };
    for (clients, extra, field) in [
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ env = \"SHORT_KEY\" }]",
            "",
            "clients[0].keys[0].env",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ env = \"UNSET\" }]",
            "",
            "clients[0].keys[0].env",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = []",
            "",
            "clients[0].keys",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ env = \"ALICE_KEY\", file = \"/x\" }]",
            "",
            "clients[0].keys[0]",
        ),
        (
            "[[clients]]\nname = \"a b\"\nkeys = [{ env = \"ALICE_KEY\" }]",
            "",
            "clients[0].name",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ env = \"ALICE_KEY\" }]\n[[clients]]\nname = \"a\"\nkeys = [{ env = \"BOB_KEY\" }]",
            "",
            "clients[1].name",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ env = \"ALICE_KEY\" }]\n[[clients]]\nname = \"b\"\nkeys = [{ env = \"ALICE_KEY\" }]",
            "",
            "clients[1].keys[0]",
        ),
        (
            "",
            "require_client_key = true",
            "gateway.require_client_key",
        ),
        (
            "[[clients]]\nname = \"a\"\nkeys = [{ file = \"/no/such/file\" }]",
            "",
            "clients[0].keys[0].file",
        ),
    ] {
        let toml = base(clients, extra);
        let e = Settings::from_toml(&toml, &env).unwrap_err().to_string();
        assert!(e.contains(field), "{clients} {extra}: {e}");
        assert!(!e.contains(ALICE) && !e.contains("short\""), "{e}");
    }
}

#[tokio::test]
async fn with_clients_the_operator_endpoints_need_the_operator_key() {
    let upstream = FakeUpstream::start().await;
    let next = alice_next_file("alice-next-admin");
    let extra = "admin_key_env = \"ADMIN_KEY\"\nadmin_from_loopback = false";
    let gw = start(&config(&upstream, &next, extra)).await;
    let url = gw.url();
    let client = reqwest::Client::new();
    let get = |path: &str, key: Option<&str>| {
        let mut request = client.get(format!("{url}{path}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for path in ["/stats", "/metrics", "/", "/events"] {
        assert_eq!(get(path, None).await, 401, "{path}");
        // A client's key opens none of them.
        assert_eq!(get(path, Some(ALICE)).await, 401, "{path}");
    }
    for path in ["/stats", "/metrics", "/", "/events"] {
        assert_eq!(get(path, Some(ADMIN)).await, 200, "{path}");
    }
    let reset = |key: Option<&str>| {
        let mut request = client.post(format!("{url}/stats/reset"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(reset(None).await, 401);
    assert_eq!(reset(Some(ALICE)).await, 401);
    assert_eq!(reset(Some(ADMIN)).await, 200);
    // Health stays open: a load balancer has no key.
    assert_eq!(get("/healthz", None).await, 200);
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);

    // The operator key may not be a client's.
    let toml = config(&upstream, &next, "admin_key_env = \"ALICE_KEY\"");
    std::fs::write(&next, ALICE_NEXT).unwrap();
    let e = Settings::from_toml(&toml, &env).unwrap_err().to_string();
    let _ = std::fs::remove_file(&next);
    assert!(
        e.contains("gateway.admin_key_env") && !e.contains(ALICE),
        "{e}"
    );
}

#[tokio::test]
async fn a_clients_quota_is_judged_with_the_routes_all_or_nothing() {
    let upstream = FakeUpstream::start().await;
    let next = alice_next_file("alice-next-quota");
    let toml = config(&upstream, &next, "").replace(
        "keys = [{ env = \"ALICE_KEY\" }, {",
        "quotas = [{ limit = 2, period = \"1m\" }]\nkeys = [{ env = \"ALICE_KEY\" }, {",
    ) + r#"
[rate_limit]
mode = "reject"

[[rate_limit.rules]]
name = "keyed-m"
provider = "keyed"
model = "m"
quotas = [{ limit = 1, period = "1m" }]
"#;
    let gw = start(&toml).await;
    let url = gw.url();
    let limit_of = |r: reqwest::Response| async move {
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = support::sim::body_json(r).await;
        (body["error"]["limit"].as_str().map(str::to_owned), retry)
    };
    assert_eq!(
        post(&url, "/keyed/v1/chat", bearer(ALICE)).await.status(),
        200
    );
    // The route refuses: alice's quota gets back what it took.
    let refused = post(&url, "/keyed/v1/chat", bearer(ALICE)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(limit_of(refused).await.0.as_deref(), Some("route"));
    assert_eq!(
        post(&url, "/open/v1/chat", bearer(ALICE)).await.status(),
        200
    );
    // Two of alice's: her own quota refuses, naming it, with its wait.
    let refused = post(&url, "/open/v1/chat", bearer(ALICE)).await;
    assert_eq!(refused.status(), 429);
    let (limit, retry) = limit_of(refused).await;
    assert_eq!(limit.as_deref(), Some("client"));
    assert!(matches!(retry.as_deref(), Some("30" | "29")), "{retry:?}");
    // Bob has no quota of his own; the route's are his only limits.
    for _ in 0..3 {
        assert_eq!(post(&url, "/open/v1/chat", bearer(BOB)).await.status(), 200);
    }
    assert_eq!(upstream.received().len(), 5);
    let stats = support::sim::stats(&reqwest::Client::new(), &url).await;
    assert_eq!(
        stats["clients"][0],
        serde_json::json!({"name": "alice", "requests": 4, "admitted": 2,
            "refused_client": 1, "refused_route": 1, "waiting": 0, "tokens": 0})
    );
    assert_eq!(stats["clients"][1]["admitted"], 3);
    let metrics = support::sim::metrics(&reqwest::Client::new(), &url).await;
    for line in [
        r#"proxy_client_requests_total{client="alice"} 4"#,
        r#"proxy_client_admitted_total{client="bob"} 3"#,
        r#"proxy_client_refused_total{client="alice",limit="client"} 1"#,
        r#"proxy_client_refused_total{client="alice",limit="route"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
}

#[tokio::test]
async fn an_operator_key_without_clients_closes_the_operator_endpoints_too() {
    let upstream = FakeUpstream::start().await;
    let toml = format!(
        "[gateway]\nadmin_key_env = \"ADMIN_KEY\"\nadmin_from_loopback = false\n\n[[providers]]\nname = \"p\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    );
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let stats = |key: Option<&str>| {
        let mut request = client.get(format!("{}/stats", gw.url()));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(stats(None).await, 401);
    assert_eq!(stats(Some(ADMIN)).await, 200);
    gw.shutdown().await;
}

/// A chat request to the `open` provider with `key`.
fn chat(
    client: &reqwest::Client,
    url: &str,
    key: &str,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> + use<> {
    client
        .post(format!("{url}/open/v1/chat"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(r#"{"model":"m","messages":[]}"#)
        .send()
}

/// Alice floods the gateway at `url` with `flood` requests at once; once
/// they have queued (`settle`), Bob sends ten, one after another, spaced
/// out of step with the route's `interval`: Bob's round trips, and the
/// flood's tasks (to abort).
async fn flood_then_probe(
    url: &str,
    flood: usize,
    settle: Duration,
    interval: Duration,
) -> (
    Vec<Duration>,
    Vec<tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>>,
) {
    let alice = reqwest::Client::new();
    let tasks = (0..flood)
        .map(|_| tokio::spawn(chat(&alice, url, ALICE)))
        .collect();
    tokio::time::sleep(settle).await;
    let bob = reqwest::Client::new();
    let mut round_trips = Vec::new();
    for n in 0..10u32 {
        let sent = Instant::now();
        let answer = chat(&bob, url, BOB).await.unwrap();
        assert_eq!(answer.status(), 200);
        round_trips.push(sent.elapsed());
        tokio::time::sleep(interval * 2 + Duration::from_millis(7 * u64::from(n))).await;
    }
    (round_trips, tasks)
}

/// A route saturated by one client's flood (200 at once, one in flight
/// allowed, each answered in `INTERVAL`) still serves another client's
/// requests within one turn: each waits for what is left of the request
/// in flight and at most one of the flood's, under two intervals (and
/// the HTTP hops), where arrival order would put it behind the whole
/// flood; and the upstream never has more than the route allows.
#[tokio::test]
async fn a_flooding_client_delays_another_by_at_most_one_turn() {
    const INTERVAL: Duration = Duration::from_millis(200);
    // Two local HTTP hops each way, on a loaded machine.
    const HOPS: Duration = Duration::from_millis(80);
    let upstream = FakeUpstream::start().await;
    upstream.answer_after(INTERVAL);
    let next = alice_next_file("alice-next-flood");
    let toml =
        config(&upstream, &next, "") + "\n[concurrency]\nmax_in_flight = 1\nmax_queue = 1000\n";
    let gw = start(&toml).await;
    let url = gw.url();
    let (round_trips, flood) = flood_then_probe(&url, 200, INTERVAL * 2, INTERVAL).await;
    // Less its own answer's time: what it waited for the route.
    let mut waits: Vec<Duration> = round_trips
        .iter()
        .map(|t| t.saturating_sub(INTERVAL))
        .collect();
    // Bob's ten went up too.
    let alice_admitted = upstream.received().len() - 10;
    // The flood waits, counted per client; bob has nothing waiting.
    let http = reqwest::Client::new();
    let stats = support::sim::stats(&http, &url).await;
    let waiting = |stats: &Value, n: usize| stats["clients"][n]["waiting"].as_u64().unwrap();
    assert!(waiting(&stats, 0) >= 100, "{}", stats["clients"]);
    assert_eq!(waiting(&stats, 1), 0);
    let metrics = support::sim::metrics(&http, &url).await;
    assert!(
        metrics.contains(r#"proxy_client_waiting{client="bob"} 0"#),
        "{metrics}"
    );
    for task in &flood {
        task.abort();
    }
    // Its callers gone, nothing of it waits.
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting(&support::sim::stats(&http, &url).await, 0) > 0 {
        assert!(
            Instant::now() < deadline,
            "the flood's requests still counted waiting"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
    waits.sort();
    let longest = *waits.last().unwrap();
    assert!(
        longest < INTERVAL * 2 + HOPS,
        "bob waited up to {longest:?} (all: {waits:?}); alice had {alice_admitted} admitted"
    );
    // The flood was still waiting: the route was saturated throughout.
    assert!(alice_admitted < 150, "{alice_admitted}");
    assert_eq!(upstream.most_in_flight(), 1);
}

/// The same for a route saturated by its rate (ten a second, waited for):
/// the clients' requests waiting for it take turns, so another client's
/// waits stay under two of the route's intervals, and the route's pace
/// holds (never more than its burst and one a tenth of a second).
#[tokio::test]
async fn a_flooding_client_delays_another_by_at_most_one_turn_of_a_routes_rate() {
    rate_flood("rate-flood", "").await;
}

/// The same with the route's rate kept in Redis (a `[store]`).
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_flooding_client_delays_another_by_at_most_one_turn_of_a_rate_in_redis() {
    let Some(redis) = testkit::redis::RedisServer::start("proxy_clients_rate_flood") else {
        return;
    };
    let store = format!("\n[store]\nredis_url = \"{}\"\n", redis.url());
    rate_flood("rate-flood-redis", &store).await;
}

/// [`flood_then_probe`] on a route of ten a second in wait mode, with
/// `extra` configuration.
async fn rate_flood(name: &str, extra: &str) {
    const INTERVAL: Duration = Duration::from_millis(100);
    const HOPS: Duration = Duration::from_millis(80);
    let upstream = FakeUpstream::start().await;
    let next = alice_next_file(&format!("alice-next-{name}"));
    let toml = config(&upstream, &next, "")
        + r#"
[rate_limit]
mode = "wait"
max_wait = "60s"
quotas = [{ limit = 10, period = "1s" }]
"# + extra;
    let gw = start(&toml).await;
    let url = gw.url();
    // The burst goes; the rest wait.
    let (mut waits, flood) = flood_then_probe(&url, 100, INTERVAL * 3, INTERVAL).await;
    let received = upstream.received().len();
    for task in &flood {
        task.abort();
    }
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
    waits.sort();
    let longest = *waits.last().unwrap();
    eprintln!("bob's waits: {waits:?}");
    assert!(
        longest < INTERVAL * 2 + HOPS,
        "bob waited up to {longest:?} (all: {waits:?}); {received} went up"
    );
    // The flood was still waiting, and the route kept its pace: its burst
    // of ten, then one a tenth of a second.
    assert!(received < 90, "{received}");
}

/// A client's quotas per model pattern (`[[clients.models]]`) hold it on
/// each model the pattern matches, judged with its other limits: over
/// them, refused as the client's; other models, and other clients, pass.
#[tokio::test]
async fn a_clients_quota_on_a_model_pattern_holds_it_on_those_models_only() {
    let upstream = FakeUpstream::start().await;
    let next = alice_next_file("alice-next-models");
    let toml = config(&upstream, &next, "").replace(
        "[[clients]]\nname = \"bob\"",
        "[[clients.models]]\npattern = \"big-*\"\nquotas = [{ limit = 1, period = \"1m\" }]\n\n[[clients]]\nname = \"bob\"",
    );
    assert!(toml.contains("[[clients.models]]"), "{toml}");
    let gw = start(&toml).await;
    let url = gw.url();
    let http = reqwest::Client::new();
    let ask = |key: &'static str, model: &'static str| {
        http.post(format!("{url}/open/v1/chat"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(format!(r#"{{"model":"{model}","messages":[]}}"#))
            .send()
    };
    assert_eq!(ask(ALICE, "big-1").await.unwrap().status(), 200);
    // Her one a minute on big-1 is spent; each model big-* matches has
    // its own.
    let refused = ask(ALICE, "big-1").await.unwrap();
    assert_eq!(refused.status(), 429);
    let body = support::sim::body_json(refused).await;
    assert_eq!(body["error"]["limit"], "client", "{body}");
    // Other models, and bob on big-*, are not held by it.
    assert_eq!(ask(ALICE, "big-2").await.unwrap().status(), 200);
    assert_eq!(ask(ALICE, "small").await.unwrap().status(), 200);
    assert_eq!(ask(ALICE, "small").await.unwrap().status(), 200);
    assert_eq!(ask(BOB, "big-1").await.unwrap().status(), 200);
    let stats = support::sim::stats(&http, &url).await;
    assert_eq!(
        stats["clients"][0]["refused_client"], 1,
        "{}",
        stats["clients"]
    );
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
}

/// The error of a configuration with one provider and the client alice,
/// her entry ending with `alice` (TOML).
fn alice_refused(alice: &str) -> String {
    let toml = format!(
        r#"
[[providers]]
name = "open"
base_url = "http://127.0.0.1:9"

[[clients]]
name = "alice"
keys = [{{ env = "ALICE_KEY" }}]
{alice}"#
    );
    Settings::from_toml(&toml, &env).unwrap_err().to_string()
}

#[test]
fn a_model_pattern_without_quotas_is_refused() {
    let err = alice_refused(
        r#"
[[clients.models]]
pattern = "big-*"
quotas = []
"#,
    );
    assert!(err.contains("clients[0].models[0].quotas"), "{err}");
}

#[test]
fn a_model_pattern_given_twice_is_refused() {
    let err = alice_refused(
        r#"
[[clients.models]]
pattern = "big-*"
quotas = [{ limit = 1, period = "1m" }]

[[clients.models]]
pattern = "big-*"
quotas = [{ limit = 2, period = "1m" }]
"#,
    );
    assert!(err.contains("clients[0].models[1].pattern"), "{err}");
}

/// A client of `weight = 3` takes three turns of a saturated route to
/// another client's one, while both have requests waiting.
#[tokio::test]
async fn a_client_of_weight_three_gets_three_turns_of_a_busy_route() {
    const ANSWER: Duration = Duration::from_millis(150);
    let upstream = FakeUpstream::start().await;
    upstream.answer_after(ANSWER);
    let next = alice_next_file("alice-next-weight");
    let toml = config(&upstream, &next, "")
        .replace("name = \"alice\"\n", "name = \"alice\"\nweight = 3\n")
        + "\n[concurrency]\nmax_in_flight = 1\nmax_queue = 1000\n";
    let gw = start(&toml).await;
    let url = gw.url();
    let http = reqwest::Client::new();
    let send = |key: &str, who: &str| {
        http.post(format!("{url}/open/v1/chat"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(format!(r#"{{"model":"m","messages":[],"user":"{who}"}}"#))
            .send()
    };
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(send(ALICE, "alice")));
        tasks.push(tokio::spawn(send(BOB, "bob")));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), 200);
    }
    gw.shutdown().await;
    let _ = std::fs::remove_file(&next);
    let order: String = upstream
        .received()
        .iter()
        .map(|r| {
            if String::from_utf8_lossy(&r.body).contains("alice") {
                'A'
            } else {
                'b'
            }
        })
        .collect();
    // Once both have queued (all 40 are sent at once; eight answers take
    // 1.2 s), and while both wait: three of alice's to one of bob's (ten
    // and ten without weights).
    let alice = order[8..28].chars().filter(|&c| c == 'A').count();
    assert!((14..=16).contains(&alice), "{order}");
    assert_eq!(upstream.most_in_flight(), 1);
}

#[test]
fn a_client_weight_out_of_range_is_refused() {
    for weight in ["0", "101"] {
        let err = alice_refused(&format!("weight = {weight}\n"));
        assert!(err.contains("clients[0].weight"), "{err}");
    }
}
