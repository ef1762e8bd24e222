//! Fallback between deployments (`[[routes]]`), end to end: two fake
//! deployments of one model, each with its own limit; one answering 429,
//! one unreachable.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use proxy::config::Settings;
use serde_json::Value;
use support::sim::{chat, no_env, stats, until};
use testkit::local_server::Server;

/// A deployment: counts what it is sent, answers with `status`.
struct Deployment {
    server: Server,
    status: Arc<AtomicU16>,
    received: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Shared {
    status: Arc<AtomicU16>,
    received: Arc<AtomicUsize>,
}

impl Deployment {
    async fn start() -> Self {
        let shared = Shared {
            status: Arc::new(AtomicU16::new(200)),
            received: Arc::default(),
        };
        let app = Router::new()
            .fallback(|State(s): State<Shared>| async move {
                s.received.fetch_add(1, Ordering::Relaxed);
                let status = StatusCode::from_u16(s.status.load(Ordering::Relaxed)).unwrap();
                (
                    status,
                    [("content-type", "application/json")],
                    "{\"ok\":true}",
                )
            })
            .with_state(shared.clone());
        Self {
            server: Server::start(app).await,
            status: shared.status,
            received: shared.received,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    fn received(&self) -> usize {
        self.received.load(Ordering::Relaxed)
    }
}

fn config(a: &str, b: &str, extra: &str) -> String {
    format!(
        r#"
[[providers]]
name = "deploy-a"
base_url = "{a}"

[[providers]]
name = "deploy-b"
base_url = "{b}"

[[routes]]
model = "gpt-4o"
deployments = ["deploy-a", "deploy-b"]
{extra}

[rate_limit]
mode = "reject"
quotas = [{{ limit = 2, period = "1m" }}]   # each deployment's route its own

[backoff]
mode = "reject"
initial_backoff = "300ms"
"#
    )
}

async fn start(toml: &str) -> proxy::gateway::Running {
    let settings = Settings::from_toml(toml, &no_env).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    proxy::gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap()
}

/// POST a chat for `model` to the unprefixed path; status and deployment.
async fn ask(client: &reqwest::Client, url: &str, model: &str) -> (u16, String, Option<u64>) {
    let r = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(model, false))
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let deployment = header("x-gateway-deployment").unwrap_or_default();
    let retry = header("retry-after").map(|v| v.parse().unwrap());
    (r.status().as_u16(), deployment, retry)
}

fn shares(s: &Value) -> Vec<(String, u64)> {
    s["deployments"][0]["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_owned(),
                d["served"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_requests_fill_two_deployments_and_the_fifth_gets_the_earliest_retry() {
    let (a, b) = (Deployment::start().await, Deployment::start().await);
    let gw = start(&config(&a.url(), &b.url(), "")).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let mut served = Vec::new();
    for _ in 0..4 {
        let (status, deployment, _) = ask(&client, &url, "gpt-4o").await;
        assert_eq!(status, 200);
        served.push(deployment);
    }
    served.sort();
    assert_eq!(served, ["deploy-a", "deploy-a", "deploy-b", "deploy-b"]);
    assert_eq!((a.received(), b.received()), (2, 2));
    let (status, deployment, retry) = ask(&client, &url, "gpt-4o").await;
    assert_eq!(status, 429);
    // Each has its next turn 30 s after its first request: a's is first.
    assert_eq!(deployment, "deploy-a");
    assert!(matches!(retry, Some(29 | 30)), "{retry:?}");
    assert_eq!((a.received(), b.received()), (2, 2));
    let s = stats(&client, &url).await;
    assert_eq!(s["deployments"][0]["model"], "gpt-4o");
    assert_eq!(s["deployments"][0]["order"], "soonest");
    assert_eq!(
        shares(&s),
        [("deploy-a".to_owned(), 2), ("deploy-b".to_owned(), 2)]
    );
    assert_eq!(s["deployments"][0]["deployments"][0]["share"], 0.5);
    // A model without a route, on an unprefixed path: no provider.
    assert_eq!(ask(&client, &url, "other").await.0, 404);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_answering_429_is_passed_over_until_its_cooldown_ends() {
    let (a, b) = (Deployment::start().await, Deployment::start().await);
    let toml = config(&a.url(), &b.url(), "order = \"in_order\"")
        .replace("limit = 2, period = \"1m\"", "limit = 100, period = \"1m\"");
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    assert_eq!(ask(&client, &url, "gpt-4o").await.1, "deploy-a");
    a.status.store(429, Ordering::Relaxed);
    // a's 429 goes back as it is; a cools down and b takes the rest.
    assert_eq!(
        ask(&client, &url, "gpt-4o").await,
        (429, "deploy-a".into(), None)
    );
    a.status.store(200, Ordering::Relaxed);
    for _ in 0..3 {
        assert_eq!(ask(&client, &url, "gpt-4o").await.1, "deploy-b");
    }
    assert_eq!((a.received(), b.received()), (2, 3));
    until(&client, &url, "deploy-a's cooldown to end", |s| {
        s["aggregate"]["cooldowns"]
            .as_array()
            .is_some_and(Vec::is_empty)
            || s["routes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["cooldown"].is_null())
    })
    .await;
    assert_eq!(
        ask(&client, &url, "gpt-4o").await,
        (200, "deploy-a".into(), None)
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_deployment_down_every_request_goes_to_the_other() {
    let b = Deployment::start().await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let toml = config(&down, &b.url(), "order = \"in_order\"")
        .replace("limit = 2, period = \"1m\"", "limit = 100, period = \"1m\"");
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    for _ in 0..5 {
        assert_eq!(
            ask(&client, &url, "gpt-4o").await,
            (200, "deploy-b".into(), None)
        );
    }
    assert_eq!(b.received(), 5);
    let s = stats(&client, &url).await;
    assert_eq!(s["deployments"][0]["deployments"][0]["down"], true);
    assert_eq!(
        shares(&s),
        [("deploy-a".to_owned(), 0), ("deploy-b".to_owned(), 5)]
    );
    gw.shutdown().await;
}

#[test]
fn routes_are_checked_against_the_providers() {
    let base = config("http://127.0.0.1:9", "http://127.0.0.1:9", "");
    for (from, to, field) in [
        ("\"deploy-b\"]", "\"nobody\"]", "routes[0].deployments[1]"),
        ("\"deploy-b\"]", "\"deploy-a\"]", "routes[0].deployments[1]"),
        (
            "deployments = [\"deploy-a\", \"deploy-b\"]",
            "deployments = []",
            "routes[0].deployments",
        ),
        ("model = \"gpt-4o\"", "model = \"\"", "routes[0].model"),
        (
            "[rate_limit]",
            "order = \"random\"\n[rate_limit]",
            "routes[0].order",
        ),
        (
            "[rate_limit]",
            "weights = [1, 2]\n[rate_limit]",
            "routes[0].weights",
        ),
        (
            "[rate_limit]",
            "order = \"weighted\"\n[rate_limit]",
            "routes[0].weights",
        ),
        (
            "[rate_limit]",
            "order = \"weighted\"\nweights = [1, 0]\n[rate_limit]",
            "routes[0].weights",
        ),
        (
            "name = \"deploy-b\"",
            "name = \"deploy-b\"\nkind = \"anthropic\"",
            "routes[0].deployments[1]",
        ),
    ] {
        let toml = base.replacen(from, to, 1);
        assert_ne!(toml, base, "{from}");
        let e = Settings::from_toml(&toml, &no_env).unwrap_err().to_string();
        assert!(e.contains(field), "{to}: {e}");
    }
    let twice = format!("{base}\n[[routes]]\nmodel = \"gpt-4o\"\ndeployments = [\"deploy-a\"]\n");
    let e = Settings::from_toml(&twice, &no_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("routes[1].model"), "{e}");
    let weighted = base.replacen(
        "[rate_limit]",
        "order = \"weighted\"\nweights = [3, 1]\n[rate_limit]",
        1,
    );
    Settings::from_toml(&weighted, &no_env).unwrap();
}

/// A deployment that takes the request and closes the connection before
/// answering: the request may have been acted on, so it is not sent to
/// the other (a second billed call); the deployment is passed over next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_may_have_been_sent_is_not_sent_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hangs_up = format!("http://{}", listener.local_addr().unwrap());
    let taken = Arc::new(AtomicUsize::new(0));
    let counted = taken.clone();
    let closer = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            counted.fetch_add(1, Ordering::Relaxed);
            drop(socket);
        }
    });
    let b = Deployment::start().await;
    let toml = config(&hangs_up, &b.url(), "order = \"in_order\"")
        .replace("limit = 2, period = \"1m\"", "limit = 100, period = \"1m\"");
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    let (status, deployment, _) = ask(&client, &url, "gpt-4o").await;
    assert_eq!((status, deployment.as_str()), (502, "deploy-a"));
    assert_eq!((taken.load(Ordering::Relaxed), b.received()), (1, 0));
    // Failing now: the next goes to b.
    assert_eq!(
        ask(&client, &url, "gpt-4o").await,
        (200, "deploy-b".into(), None)
    );
    gw.shutdown().await;
    closer.abort();
}

/// A client's own quota is charged once for a request that fell back from
/// an unreachable deployment to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_falls_back_is_charged_to_its_client_once() {
    let b = Deployment::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let toml = config(&down, &b.url(), "order = \"in_order\"")
        .replace("limit = 2, period = \"1m\"", "limit = 100, period = \"1m\"")
        + "\n[[clients]]\nname = \"alice\"\nkeys = [{ env = \"ALICE\" }]\nquotas = [{ limit = 2, period = \"1m\" }]\n";
    let env = |name: &str| (name == "ALICE").then(|| "alice-key-0123456789abcdef".to_owned());
    let settings = Settings::from_toml(&toml, &env).unwrap();
    let gw = proxy::gateway::start(settings, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let ask_as_alice = || {
        client
            .post(format!("{}/v1/chat/completions", gw.url()))
            .bearer_auth("alice-key-0123456789abcdef")
            .header("content-type", "application/json")
            .body(chat("gpt-4o", false))
            .send()
    };
    // The first tries a (unreachable) then b: one of alice's two.
    assert_eq!(ask_as_alice().await.unwrap().status(), 200);
    assert_eq!(ask_as_alice().await.unwrap().status(), 200);
    assert_eq!(ask_as_alice().await.unwrap().status(), 429);
    assert_eq!(b.received(), 2);
    gw.shutdown().await;
}
