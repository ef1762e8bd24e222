//! The `proxy` example: every setting live (an edit to the file resizes a
//! route's permits, changes backoff lengths and identity rules, and the
//! master switch turns every layer off and on), and the operator endpoints
//! (`GET /stats?route=`, `POST /stats/reset`). Over real sockets, each test
//! on its own ephemeral loopback ports, in front of a small upstream of its
//! own that answers as each model asks.

mod support;

use proxy::reload;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::routing::post;
use bytes::Bytes;
use serde_json::Value;

use proxy::gateway::Running;
use support::sim::{small_model, start, temp_path, watched};

/// The upstream: `POST /v1/chat/completions` answers by the body's model.
/// `echo`: the `User-Agent` it got; `limited*`: 429 without saying how
/// long; `slow`: a first chunk, then nothing until the client goes away;
/// others: `{}`.
async fn upstream() -> (String, tokio::sync::oneshot::Sender<()>) {
    async fn answer(headers: HeaderMap, body: Bytes) -> axum::response::Response {
        let json: Value = serde_json::from_slice(&body).unwrap_or_default();
        let model = json["model"].as_str().unwrap_or_default();
        let ua = headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let response = axum::http::Response::builder().header("content-type", "application/json");
        let response = match model {
            "echo" => response.body(Body::from(
                serde_json::json!({ "user_agent": ua }).to_string(),
            )),
            m if m.starts_with("limited") => response.status(429).body(Body::from("{}")),
            "slow" => {
                let first =
                    futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("{")) });
                let never = futures::stream::pending();
                response.body(Body::from_stream(futures::StreamExt::chain(first, never)))
            }
            _ => response.body(Body::from("{}")),
        };
        response.unwrap_or_default()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new().route("/v1/chat/completions", post(answer));
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (format!("http://{addr}"), stop)
}

/// What the tests change between edits.
#[derive(Clone)]
struct Knobs {
    enabled: bool,
    max_in_flight: u32,
    initial_backoff: &'static str,
    user_agent: &'static str,
}

fn config(upstream: &str, k: &Knobs) -> String {
    format!(
        r#"
enabled = {enabled}

[[providers]]
name = "up"
base_url = "{upstream}"

[rate_limit]
quotas = [{{ limit = 1000, period = "1m" }}]

[[rate_limit.rules]]
provider = "up"
model = "rated"
quotas = [{{ limit = 1, period = "1m" }}]

# Named, so that their stats are kept (they never get a 2xx).
[[rate_limit.rules]]
provider = "up"
model = "limited"
quotas = [{{ limit = 1000, period = "1m" }}]

[[rate_limit.rules]]
provider = "up"
model = "limited2"
quotas = [{{ limit = 1000, period = "1m" }}]

[concurrency]
max_in_flight = {max_in_flight}
max_queue = 0

[backoff]
initial_backoff = "{initial_backoff}"
max_backoff = "0s"

[[identity.rules]]
host = "127.0.0.1"
user_agent = "{user_agent}"
"#,
        enabled = k.enabled,
        max_in_flight = k.max_in_flight,
        initial_backoff = k.initial_backoff,
        user_agent = k.user_agent,
    )
}

struct Proxy {
    gw: Running,
    client: reqwest::Client,
    url: String,
}

impl Proxy {
    async fn post(&self, model: &str) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/chat/completions", self.url))
            .header("content-type", "application/json")
            .body(serde_json::json!({ "model": model, "messages": [] }).to_string())
            .send()
            .await
            .unwrap()
    }

    async fn status(&self, model: &str) -> u16 {
        self.post(model).await.status().as_u16()
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Poll `/stats` until `check` holds (a hang guard of 10 s).
    async fn until(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..1000 {
            let (_, stats) = self.get("/stats").await;
            if check(&stats) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("gave up waiting for {what}: {}", self.get("/stats").await.1);
    }

    /// One route's line in `/stats`.
    async fn route(&self, route: &str) -> Value {
        let (status, body) = self.get(&format!("/stats?route={route}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn user_agent(&self) -> String {
        let response = self.post("echo").await;
        assert_eq!(response.status(), 200);
        let json: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        json["user_agent"].as_str().unwrap_or_default().to_owned()
    }
}

/// Requests in flight, every route added up: only `slow` streams stay in
/// flight. (A route is counted apart once its upstream answered it, so its
/// own line misses its very first request.)
fn in_flight(stats: &Value) -> u64 {
    stats["aggregate"]["concurrency"]["in_flight"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_file_resizes_max_in_flight_and_changes_every_setting_live() {
    let (upstream_url, _upstream) = upstream().await;
    let path = temp_path("live.toml");
    let mut knobs = Knobs {
        enabled: true,
        max_in_flight: 1,
        initial_backoff: "10s",
        user_agent: "ua-one",
    };
    std::fs::write(&path, config(&upstream_url, &knobs)).unwrap();
    let timing = reload::Timing {
        every: Duration::from_millis(20),
        settle: Duration::from_millis(20),
    };
    let (gw, client) = watched(&path, timing).await;
    let proxy = Proxy {
        url: gw.url(),
        gw,
        client,
    };
    let mut generation = 1;
    let edit = |knobs: &Knobs| std::fs::write(&path, config(&upstream_url, knobs)).unwrap();
    macro_rules! reload {
        () => {{
            edit(&knobs);
            generation += 1;
            let g = generation;
            proxy
                .until("the reload", |s| s["config"]["generation"] == g)
                .await;
        }};
    }

    // One in flight per route, nobody waits: a second stream is refused.
    assert_eq!(proxy.user_agent().await, "ua-one");
    let first = proxy.post("slow").await;
    assert_eq!(first.status(), 200);
    assert_eq!(proxy.status("slow").await, 503);

    // max_in_flight 2: the second goes at once.
    knobs.max_in_flight = 2;
    reload!();
    let second = proxy.post("slow").await;
    assert_eq!(second.status(), 200);
    assert_eq!(proxy.status("slow").await, 503);

    // Back to 1 with two in flight: both stay, a third is refused until
    // fewer than one are in flight.
    knobs.max_in_flight = 1;
    reload!();
    let s = proxy.get("/stats").await.1;
    assert_eq!(in_flight(&s), 2, "nothing in flight is dropped");
    assert_eq!(proxy.status("slow").await, 503);
    drop(first);
    proxy
        .until("one stream closed", |s| in_flight(s) == 1)
        .await;
    assert_eq!(
        proxy.status("slow").await,
        503,
        "one in flight is the limit"
    );
    drop(second);
    proxy
        .until("both streams closed", |s| in_flight(s) == 0)
        .await;
    let third = proxy.post("slow").await;
    assert_eq!(third.status(), 200);
    drop(third);
    proxy
        .until("the stream closed", |s| in_flight(s) == 0)
        .await;

    // Backoff lengths: a 429 without a length cools its route for
    // initial_backoff (max_backoff 0: fixed), then for the edited one.
    assert_eq!(proxy.status("limited").await, 429);
    // (Not the gateway's own RateLimit header on that 429, which says when
    // its quota refills: the backoff layer reads the upstream's answer.)
    let cooling = proxy.route("up/limited").await["cooldown"]["remaining_ms"].clone();
    let cooling = cooling.as_f64().unwrap();
    assert!(cooling > 5_000.0 && cooling <= 10_000.0, "{cooling}");
    assert_eq!(proxy.status("limited").await, 503, "refused while cooling");
    knobs.initial_backoff = "40s";
    reload!();
    assert_eq!(proxy.status("limited2").await, 429);
    let cooling = &proxy.route("up/limited2").await["cooldown"]["remaining_ms"];
    assert!(cooling.as_f64().unwrap() > 30_000.0, "{cooling}");

    // Identity rules.
    knobs.user_agent = "ua-two";
    reload!();
    assert_eq!(proxy.user_agent().await, "ua-two");

    // The rate limit, spent on one route.
    assert_eq!(proxy.status("rated").await, 200);
    assert_eq!(proxy.status("rated").await, 429);

    // The master switch off: every layer lets everything through untouched.
    knobs.enabled = false;
    reload!();
    assert_eq!(proxy.status("rated").await, 200, "rate limit off");
    assert_eq!(
        proxy.status("limited").await,
        429,
        "the upstream's own 429: backoff off"
    );
    let held = proxy.post("slow").await;
    assert_eq!(held.status(), 200);
    let also = proxy.post("slow").await;
    assert_eq!(also.status(), 200, "concurrency off");
    assert_ne!(proxy.user_agent().await, "ua-two", "identity off");
    drop((held, also));
    proxy
        .until("the streams closed", |s| in_flight(s) == 0)
        .await;

    // On again: each layer continues from its earlier state.
    knobs.enabled = true;
    reload!();
    assert_eq!(proxy.status("rated").await, 429, "still spent");
    assert_eq!(proxy.status("limited").await, 503, "still cooling");
    assert_eq!(proxy.user_agent().await, "ua-two");
    let _ = std::fs::remove_file(&path);
    proxy.gw.shutdown().await;
}

fn simulated() -> String {
    small_model(0, "1s")
        + r#"
[rate_limit]
[[rate_limit.rules]]
provider = "sim"
model = "sim-small"
quotas = [{ limit = 2, period = "1m", algorithm = "sliding_window" }]
"#
}

async fn start_simulated() -> Proxy {
    let gw = start(&simulated()).await;
    Proxy {
        url: gw.url(),
        gw,
        client: reqwest::Client::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_of_one_route_tell_peek_wait_without_changing_what_requests_get() {
    let proxy = start_simulated().await;
    // Asked again and again before any request: nothing is booked.
    for _ in 0..5 {
        let one = proxy.route("sim/sim-small").await;
        assert_eq!(one["peek_wait_ms"], 0.0);
        assert_eq!(one["route"], "sim/sim-small");
    }
    assert_eq!(proxy.status("sim-small").await, 200);
    assert_eq!(proxy.status("sim-small").await, 200);
    let one = proxy.route("sim/sim-small").await;
    assert_eq!(one["rate_limit"]["admitted"], 2);
    assert_eq!(one["upstream"]["ok"], 2);
    // Spent: the next would wait most of the minute.
    let wait = one["peek_wait_ms"].as_f64().unwrap();
    assert!(wait > 50_000.0 && wait <= 60_000.0, "{wait}");
    let refused = proxy.post("sim-small").await;
    assert_eq!(refused.status(), 429);
    let retry: f64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((retry - wait / 1e3).abs() <= 1.0, "{retry} vs {wait}");
    proxy.gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_of_an_unknown_or_malformed_route_are_refused_in_the_json_error_shape() {
    let proxy = start_simulated().await;
    for (query, status, code) in [
        ("route=sim/never-seen", 404, "unknown_route"),
        ("route=nobody/sim-small", 404, "unknown_route"),
        ("route=sim/%1b%5b31m", 400, "bad_route"),
        ("route=sim/%E2%80%AEevil", 400, "bad_route"),
        ("route=sim%2Fsim-small%FF", 400, "bad_route"),
        ("route=sim-small", 400, "bad_route"),
        ("route=sim/sim-small&route=sim/other", 400, "bad_route"),
        ("route=sim/", 400, "bad_route"),
    ] {
        let (got, body) = proxy.get(&format!("/stats?{query}")).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{query}"
        );
        let text = body.to_string();
        assert!(
            !text.contains('\u{1b}') && !text.contains("evil"),
            "echoed: {text}"
        );
    }
    // A configured route with no traffic yet is known, with zeros.
    let one = proxy.route("sim/sim-small").await;
    assert_eq!(one["rate_limit"]["admitted"], 0);
    // Percent-encoded like any query value.
    assert_eq!(
        proxy.route("sim%2Fsim-small").await["route"],
        "sim/sim-small"
    );
    proxy.gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_reset_zeroes_the_counters_and_leaves_the_limits_as_they_are() {
    let proxy = start_simulated().await;
    for expected in [200, 200, 429] {
        assert_eq!(proxy.status("sim-small").await, expected);
    }
    let (_, before) = proxy.get("/stats").await;
    assert_eq!(before["aggregate"]["rate_limit"]["admitted"], 2);
    assert_eq!(before["aggregate"]["rate_limit"]["rejected"], 1);
    let wait = proxy.route("sim/sim-small").await["peek_wait_ms"]
        .as_f64()
        .unwrap();

    let reset = proxy
        .client
        .post(format!("{}/stats/reset", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    let (_, after) = proxy.get("/stats").await;
    for layer in ["rate_limit", "concurrency", "backoff"] {
        let counters = &after["aggregate"][layer];
        assert_eq!(counters["admitted"], 0, "{layer}: {after}");
        assert_eq!(counters["rejected"], 0, "{layer}: {after}");
    }
    assert_eq!(after["aggregate"]["upstream"]["responses"], 0);
    let one = proxy.route("sim/sim-small").await;
    assert_eq!(one["rate_limit"]["admitted"], 0);
    // The limiter is as spent as before.
    assert!(one["peek_wait_ms"].as_f64().unwrap() <= wait);
    assert!(one["peek_wait_ms"].as_f64().unwrap() > 50_000.0);
    assert_eq!(proxy.status("sim-small").await, 429);
    assert_eq!(
        proxy.get("/stats").await.1["aggregate"]["rate_limit"]["rejected"],
        1
    );
    // Reset is a POST; a GET changes nothing.
    let (status, _) = proxy.get("/stats/reset").await;
    assert_eq!(status, 405);
    proxy.gw.shutdown().await;
}
