//! The `proxy` example's `learn_limits`: a route is held to the limits its
//! provider's responses state, never looser than the configuration; a
//! provider saying its limit is spent cools the route before any 429; the
//! learned values show in `/stats` and `/metrics`. Over real sockets, in
//! front of a fake upstream on an ephemeral loopback port that announces
//! limits by model and counts what reaches it.

mod support;

use testkit::local_server;

use proxy::learn::RELEASE_AFTER_SILENT;
use proxy::{config, gateway};

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::post;
use parking_lot::Mutex;
use serde_json::Value;

use crate::config::Settings;
use crate::gateway::Running;
use crate::local_server::Server;

fn no_env(_: &str) -> Option<String> {
    None
}

/// What reached the fake upstream, per model, and how often it said 429.
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<HashMap<String, u32>>>,
    refused: Arc<Mutex<u32>>,
}

impl Seen {
    fn of(&self, model: &str) -> u32 {
        self.requests.lock().get(model).copied().unwrap_or(0)
    }
}

/// The rate-limit headers the fake upstream sends for `model`, the `n`th
/// request of it.
fn announced(model: &str, n: u32) -> Vec<(&'static str, String)> {
    let h = |name: &'static str, value: &str| (name, value.to_owned());
    match model {
        // 8 a minute, said on the first two answers only.
        "quiet-later" if n <= 2 => vec![h("x-ratelimit-limit-requests", "8")],
        // 5 per minute (OpenAI); it says nothing of what is left, so only
        // the learned limit can keep the gateway below it.
        "five" | "star*" => vec![
            h("x-ratelimit-limit-requests", "5"),
            h("x-ratelimit-reset-requests", "12s"),
            h("x-ratelimit-limit-tokens", "40000"),
            h("x-ratelimit-remaining-tokens", "39000"),
        ],
        // 5 per minute, in Anthropic's headers and in the IETF fields.
        "five-anthropic" => vec![h("anthropic-ratelimit-requests-limit", "5")],
        "five-ietf" => vec![h("ratelimit-policy", "\"default\";q=5;w=60")],
        "generous" => vec![h("x-ratelimit-limit-requests", "1000")],
        "generous-ietf" => vec![
            h("ratelimit-policy", "\"default\";q=1000;w=60"),
            h("ratelimit", "\"default\";r=999;t=60"),
        ],
        // Anthropic: the requests are spent until 30 s from now.
        "spent" => {
            let reset = humantime::format_rfc3339(
                std::time::SystemTime::now() + std::time::Duration::from_secs(30),
            )
            .to_string();
            vec![
                h("anthropic-ratelimit-requests-limit", "50"),
                h("anthropic-ratelimit-requests-remaining", "0"),
                h("anthropic-ratelimit-requests-reset", &reset),
            ]
        }
        "garbage" => vec![
            h("x-ratelimit-limit-requests", "-1"),
            h("x-ratelimit-remaining-requests", "0x0"),
            h("x-ratelimit-reset-requests", "soon"),
            h("anthropic-ratelimit-requests-limit", "1e9"),
            h("ratelimit-policy", "\"p\";q=0;w=60, \"q\";q=1;w=0"),
            h("ratelimit", "\"p\";r=0;t=-5"),
            h("ratelimit-limit", "+1"),
            h("x-ratelimit-limit-tokens", "NaN"),
        ],
        _ => Vec::new(),
    }
}

/// An upstream that keeps the limit it announces for `five` and `star*`
/// (5 per minute, then 429), and counts every request by model.
async fn upstream() -> (Server, Seen) {
    async fn answer(State(seen): State<Seen>, body: Bytes) -> axum::response::Response {
        let json: Value = serde_json::from_slice(&body).unwrap_or_default();
        let model = json["model"].as_str().unwrap_or_default().to_owned();
        let n = {
            let mut requests = seen.requests.lock();
            let n = requests.entry(model.clone()).or_default();
            *n += 1;
            *n
        };
        let mut response =
            axum::http::Response::builder().header("content-type", "application/json");
        for (name, value) in announced(&model, n) {
            response = response.header(name, value);
        }
        if matches!(model.as_str(), "five" | "star*") && n > 5 {
            *seen.refused.lock() += 1;
            response = response.status(429);
        }
        response.body(Body::from("{}")).unwrap()
    }
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(seen.clone());
    (Server::start(app).await, seen)
}

fn config(upstream: &str, learn: bool) -> String {
    format!(
        r#"
[[providers]]
name = "up"
base_url = "{upstream}"
learn_limits = {learn}
default = true

# The same upstream, read for the IETF fields only.
[[providers]]
name = "ietf"
base_url = "{upstream}"
learn_limits = {learn}
limit_headers = "ietf"

# The same upstream, read for Anthropic's headers only.
[[providers]]
name = "anthropic"
base_url = "{upstream}"
learn_limits = {learn}
limit_headers = "anthropic"

[rate_limit]
quotas = [{{ limit = 60, period = "1m", algorithm = "sliding_window" }}]

[[rate_limit.rules]]
provider = "*"
model = "generous*"
quotas = [{{ limit = 3, period = "1m", algorithm = "sliding_window" }}]

[[rate_limit.rules]]
provider = "up"
model = "garbage"
quotas = [{{ limit = 3, period = "1m" }}]
"#
    )
}

struct Proxy {
    gw: Running,
    client: reqwest::Client,
    seen: Seen,
    _upstream: Server,
}

impl Proxy {
    async fn start(learn: bool) -> Proxy {
        Self::start_with(learn, "").await
    }

    /// With `gateway` as the file's `[gateway]` section.
    async fn start_with(learn: bool, gateway: &str) -> Proxy {
        let (upstream, seen) = upstream().await;
        let toml = format!("[gateway]\n{gateway}\n{}", config(&upstream.url(""), learn));
        let settings = Settings::from_toml(&toml, &no_env).unwrap();
        let gw = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
            .await
            .unwrap();
        Proxy {
            gw,
            client: reqwest::Client::new(),
            seen,
            _upstream: upstream,
        }
    }

    async fn post(&self, model: &str) -> reqwest::Response {
        self.post_to("", model).await
    }

    /// `model` to the provider under `prefix` (`""`: the default one).
    async fn post_to(&self, prefix: &str, model: &str) -> reqwest::Response {
        self.client
            .post(format!("{}{prefix}/v1/chat/completions", self.gw.url()))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "model": model, "messages": [] }).to_string())
            .send()
            .await
            .unwrap()
    }

    /// The status, and the gateway's error code if it refused.
    async fn send(&self, model: &str) -> (u16, String) {
        let response = self.post(model).await;
        let status = response.status().as_u16();
        let body: Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap_or_default();
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (status, code)
    }

    /// Send `model` until the gateway refuses it (at most 20 times): the
    /// statuses of those it let through, and the refusal.
    async fn until_refused(&self, model: &str) -> (Vec<u16>, (u16, String)) {
        let mut passed = Vec::new();
        for _ in 0..20 {
            let (status, code) = self.send(model).await;
            if !code.is_empty() {
                return (passed, (status, code));
            }
            passed.push(status);
        }
        panic!("the gateway never refused {model}: {passed:?}");
    }

    async fn get(&self, path: &str) -> String {
        let response = self
            .client
            .get(format!("{}{path}", self.gw.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }

    async fn route(&self, route: &str) -> Value {
        let stats: Value = serde_json::from_str(&self.get("/stats").await).unwrap();
        stats["routes"]
            .as_array()
            .and_then(|routes| routes.iter().find(|r| r["route"] == route))
            .cloned()
            .unwrap_or_else(|| panic!("no route {route} in {stats}"))
    }

    fn rule_names(&self) -> Vec<String> {
        let (_, rules) = self.gw.gateway.handles().rate.config();
        rules.iter().map(|r| r.name().to_owned()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_limit_of_five_refuses_the_sixth_at_the_gateway() {
    let proxy = Proxy::start(true).await;
    let (passed, refused) = proxy.until_refused("five").await;
    assert_eq!(passed, vec![200; 5], "the configuration allows 60 a minute");
    assert_eq!(refused, (429, "rate_limited".to_owned()));
    assert_eq!(proxy.seen.of("five"), 5, "the upstream saw exactly five");
    assert_eq!(*proxy.seen.refused.lock(), 0, "the upstream never said 429");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_stated_in_anthropic_headers_or_ietf_fields_is_learned_too() {
    let proxy = Proxy::start(true).await;
    for (prefix, model) in [("/anthropic", "five-anthropic"), ("/ietf", "five-ietf")] {
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(proxy.post_to(prefix, model).await.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{model}");
        assert_eq!(proxy.seen.of(model), 5, "{model}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_learn_limits_the_upstream_meets_the_sixth() {
    let proxy = Proxy::start(false).await;
    for _ in 0..6 {
        proxy.post("five").await;
    }
    assert_eq!(proxy.seen.of("five"), 6);
    assert_eq!(*proxy.seen.refused.lock(), 1);
    assert!(proxy.route("up/five").await["learned"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_provider_stops_stating_is_released() {
    let proxy = Proxy::start(true).await;
    let held = |route: Value| {
        let learned = &route["learned"];
        (
            learned["quotas"][0]["limit"].clone(),
            learned["in_force"].clone(),
        )
    };
    assert_eq!(proxy.send("quiet-later").await, (200, String::new()));
    assert_eq!(
        held(proxy.route("up/quiet-later").await),
        (8.into(), true.into())
    );
    // The 2nd states it again, then five answers in a row state nothing.
    for n in 2..=(2 + RELEASE_AFTER_SILENT) {
        assert_eq!(proxy.send("quiet-later").await, (200, String::new()), "{n}");
    }
    let route = proxy.route("up/quiet-later").await;
    assert_eq!(held(route.clone()), (60.into(), false.into()), "{route}");
    assert_eq!(route["learned"]["configured"][0]["limit"], 60);
    // Held to 8 a minute, the 9th would be refused.
    for n in 8..=12 {
        assert_eq!(proxy.send("quiet-later").await, (200, String::new()), "{n}");
    }
    assert_eq!(proxy.seen.of("quiet-later"), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_announced_limit_never_loosens_the_configured_one() {
    let proxy = Proxy::start(true).await;
    let (passed, refused) = proxy.until_refused("generous").await;
    assert_eq!(passed, vec![200; 3], "the configuration allows 3");
    assert_eq!(refused, (429, "rate_limited".to_owned()));
    assert_eq!(proxy.seen.of("generous"), 3);
    for _ in 0..3 {
        assert_eq!(proxy.post_to("/ietf", "generous-ietf").await.status(), 200);
    }
    let refused = proxy.post_to("/ietf", "generous-ietf").await;
    assert_eq!(refused.status(), 429, "the configuration allows 3");
    assert_eq!(proxy.seen.of("generous-ietf"), 3);
    let learned = &proxy.route("ietf/generous-ietf").await["learned"]["requests"];
    assert_eq!(learned["limit"], 1000, "{learned}");
    assert_eq!(learned["window_seconds"], 60.0, "{learned}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_learns_from_its_own_family_of_headers_only() {
    let proxy = Proxy::start(true).await;
    // The IETF fields, sent to a provider that states its limits in
    // OpenAI's headers (a CDN's, say): not its limits.
    assert_eq!(proxy.post("generous-ietf").await.status(), 200);
    let learned = &proxy.route("up/generous-ietf").await["learned"];
    assert!(learned["requests"].is_null(), "{learned}");
    // OpenAI's headers sent to the IETF provider: not read either.
    assert_eq!(proxy.post_to("/ietf", "five").await.status(), 200);
    let learned = &proxy.route("ietf/five").await["learned"];
    assert!(learned["requests"].is_null(), "{learned}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_limit_cools_the_route_before_any_429() {
    let proxy = Proxy::start(true).await;
    assert_eq!(proxy.send("spent").await, (200, String::new()));
    let response = proxy.post("spent").await;
    assert_eq!(response.status(), 503);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(
        proxy.seen.of("spent"),
        1,
        "the refused one never left the gateway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_headers_change_nothing() {
    let proxy = Proxy::start(true).await;
    let (passed, refused) = proxy.until_refused("garbage").await;
    assert_eq!(passed, vec![200; 3], "the configured 3 a minute, no fewer");
    assert_eq!(refused, (429, "rate_limited".to_owned()));
    let learned = &proxy.route("up/garbage").await["learned"];
    for unit in ["requests", "tokens", "input_tokens", "output_tokens"] {
        assert!(learned[unit].is_null(), "{unit}: {learned}");
    }
    assert!(proxy.route("up/garbage").await["cooldown"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_values_show_in_stats_and_metrics() {
    let proxy = Proxy::start(true).await;
    assert_eq!(proxy.send("five").await, (200, String::new()));
    let learned = proxy.route("up/five").await["learned"].clone();
    assert_eq!(learned["requests"]["limit"], 5, "{learned}");
    assert_eq!(learned["requests"]["reset_seconds"], 12.0, "{learned}");
    assert_eq!(learned["requests"]["window_seconds"], 60.0, "{learned}");
    assert!(learned["requests"]["learned_unix"].as_f64().unwrap() > 1.7e9);
    assert_eq!(learned["tokens"]["limit"], 40000, "{learned}");
    assert_eq!(learned["tokens"]["remaining"], 39000, "{learned}");
    assert!(learned["rule"].as_str().unwrap().starts_with("(learned "));

    let metrics = proxy.get("/metrics").await;
    for line in [
        r#"proxy_learned_limit{provider="up",model="five",unit="requests"} 5"#,
        r#"proxy_learned_limit{provider="up",model="five",unit="tokens"} 40000"#,
        r#"proxy_learned_remaining{provider="up",model="five",unit="tokens"} 39000"#,
        r#"proxy_learned_reset_seconds{provider="up",model="five",unit="requests"} 12"#,
        r#"proxy_learned_in_force{provider="up",model="five"} 1"#,
        r#"proxy_route_quota_configured{provider="up",model="five",period_seconds="60",unit="requests"} 60"#,
        r#"proxy_route_quota_in_force{provider="up",model="five",period_seconds="60",unit="requests"} 5"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_named_with_a_wildcard_learns_for_itself_only() {
    // One route learns; `starry`, beyond max_routes, keeps the default.
    let proxy = Proxy::start_with(true, "max_routes = 1").await;
    let (passed, _) = proxy.until_refused("star*").await;
    assert_eq!(passed.len(), 5);
    // `star*` read as a pattern would hold `starry` to five as well.
    for _ in 0..8 {
        assert_eq!(proxy.send("starry").await, (200, String::new()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_learned_limits_and_turning_learning_off_drops_them() {
    let proxy = Proxy::start(true).await;
    let url = proxy._upstream.url("");
    let (passed, _) = proxy.until_refused("five").await;
    assert_eq!(passed.len(), 5);
    assert!(
        proxy
            .rule_names()
            .iter()
            .any(|n| n.starts_with("(learned "))
    );

    // The same file again, with another rule's quota changed.
    let edited = config(&url, true).replace("limit = 3, period", "limit = 4, period");
    proxy
        .gw
        .gateway
        .apply(Settings::from_toml(&edited, &no_env).unwrap())
        .unwrap();
    let names = proxy.rule_names();
    assert!(
        names.iter().any(|n| n.starts_with("(learned ")),
        "{names:?}"
    );
    assert_eq!(
        proxy.send("five").await.1,
        "rate_limited",
        "still held to five"
    );
    assert_eq!(proxy.seen.of("five"), 5);

    proxy
        .gw
        .gateway
        .apply(Settings::from_toml(&config(&url, false), &no_env).unwrap())
        .unwrap();
    let names = proxy.rule_names();
    assert!(
        !names.iter().any(|n| n.starts_with("(learned ")),
        "{names:?}"
    );
    assert!(proxy.route("up/five").await["learned"].is_null());
}

/// Gateways on one Redis share what any of them learned.
#[cfg(feature = "redis")]
mod shared {
    use super::*;

    use std::time::{Duration, Instant};
    use testkit::redis::RedisServer;

    async fn gateway(upstream: &str, redis: &str) -> Running {
        let settings = Settings::from_toml(&config(upstream, true), &no_env)
            .unwrap()
            .with_redis(redis)
            .unwrap();
        gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
            .await
            .unwrap()
    }

    async fn send(gw: &Running, model: &str) -> u16 {
        reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "model": model, "messages": [] }).to_string())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    fn holds_five(gw: &Running) -> bool {
        let learned = gw.gateway.handles().learned.snapshot();
        learned
            .get("up/five")
            .is_some_and(|l| l.in_force && l.quotas[0].limit == 5)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_one_gateway_learned_the_others_apply_before_their_first_response() {
        let Some(redis) = RedisServer::start("what_one_gateway_learned") else {
            return;
        };
        let (upstream, seen) = upstream().await;
        let a = gateway(&upstream.url(""), &redis.url()).await;
        let running = gateway(&upstream.url(""), &redis.url()).await;
        for _ in 0..5 {
            assert_eq!(send(&a, "five").await, 200);
        }
        assert_eq!(send(&a, "five").await, 429, "a learned five a minute");

        // A gateway started now reads it before it serves.
        let started = gateway(&upstream.url(""), &redis.url()).await;
        assert!(holds_five(&started));
        assert_eq!(send(&started, "five").await, 429);

        // One already running reads it within a second or so (real time:
        // its sync runs on its own clock).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !holds_five(&running) {
            assert!(Instant::now() < deadline, "never applied what a learned");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(send(&running, "five").await, 429);
        assert_eq!(seen.of("five"), 5, "no gateway sent a sixth");
        assert_eq!(*seen.refused.lock(), 0);
    }
}
