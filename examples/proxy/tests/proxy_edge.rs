//! The `proxy` example's edge, end to end over real sockets: what it
//! refuses before anything is forwarded (ambiguous bodies, paths that leave
//! the provider's base path, foreign `Host` and `Origin`, model names with
//! control characters) and the body limit it shares with its simulator.
//!
//! Requests whose exact bytes matter (dot segments, `Host`, `Origin`) are
//! written to the socket by hand: HTTP clients normalize paths and set
//! `Host` themselves.
//!
//! Over 700 lines: each refusal is its own test with the raw bytes it sends,
//! which would only hide behind helpers.

mod support;

use proxy::{config, gateway};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::Settings;
use crate::gateway::Running;
use support::sim::{body_json, no_env, one_rule, post_body, start};

// ---------------------------------------------------------------- helpers

const SIMULATOR: &str = r#"
[simulator]
latency = "0ms"
models = [
    { name = "sim-small", limit = 0, period = "1s" },
    { name = "sim-large", limit = 0, period = "1s" },
]

[[providers]]
name = "sim"
base_url = "simulator"
"#;

/// A response read off a socket.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// Send `head` (request line and headers, no blank line) and `body` on a
/// fresh connection; read the response to its end (bounded: 10 s). With
/// `head_only`, stop after the response head (for streams).
async fn raw_with(addr: SocketAddr, head: &str, body: &[u8], head_only: bool) -> Raw {
    let exchange = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut request = format!("{head}\r\nconnection: close\r\n");
        if !body.is_empty() {
            request.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        socket.write_all(request.as_bytes()).await.unwrap();
        socket.write_all(body).await.unwrap();
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            bytes.extend_from_slice(&buf[..n]);
            let done = n == 0 || (head_only && bytes.windows(4).any(|w| w == b"\r\n\r\n"));
            if done {
                return bytes;
            }
        }
    };
    let bytes = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("no response within 10 s");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Raw {
        status,
        head: head.to_owned(),
        body: if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> Raw {
    raw_with(addr, head, body, false).await
}

/// `GET path` with `Host: host` and more header lines.
async fn get(addr: SocketAddr, path: &str, host: &str, more: &[&str]) -> Raw {
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: {host}");
    for line in more {
        head.push_str("\r\n");
        head.push_str(line);
    }
    raw(addr, &head, b"").await
}

async fn post_chat(addr: SocketAddr, body: &str) -> Raw {
    raw(
        addr,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json"
        ),
        body.as_bytes(),
    )
    .await
}

fn upstream_responses(gw: &Running) -> u64 {
    let (total, _) = gw.gateway.counters().snapshot();
    total.responses + total.failed
}

// ---------------------------------------------------------------- item 1

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_naming_its_model_twice_gets_400_ambiguous_body_and_never_reaches_the_simulator() {
    let toml = SIMULATOR.to_owned() + &one_rule("sim-large", 2, "1m");
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap();
    let client = reqwest::Client::new();
    let url = gw.url();
    let mut answers = Vec::new();
    for n in 1..=12 {
        let body = if n % 3 == 0 {
            format!(r#"{{"mod\u0065l":"decoy-{n}","model":"sim-large"}}"#)
        } else {
            format!(r#"{{"model":"decoy-{n}","model":"sim-large"}}"#)
        };
        let response = post_body(&client, &url, body).await;
        let status = response.status().as_u16();
        let json = body_json(response).await;
        assert!(
            !json.to_string().contains("decoy"),
            "no value echoed: {json}"
        );
        answers.push((status, json["error"]["code"].as_str().map(str::to_owned)));
    }
    assert!(
        answers
            .iter()
            .all(|(s, c)| *s == 400 && c.as_deref() == Some("ambiguous_body")),
        "{answers:?}"
    );
    assert_eq!(sim.count("sim-large").received, 0);
    assert_eq!(upstream_responses(&gw), 0, "nothing was forwarded");
    // The same model named once is served (within its limit of 2).
    let once = post_chat(gw.addr, r#"{"model":"sim-large"}"#).await;
    assert_eq!(once.status, 200, "{once:?}");
    assert_eq!(sim.count("sim-large").received, 1);
    gw.shutdown().await;
}

// ---------------------------------------------------------------- item 3

/// A file server that resolves paths as a careless one would (decoding,
/// `\` as `/`, dot segments), serving files under `/base/` and a secret
/// outside it. It records every request target it gets.
async fn file_server() -> (
    SocketAddr,
    Arc<Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let hits = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new()
        .fallback(
            |State(hits): State<Arc<Mutex<Vec<String>>>>, uri: axum::http::Uri| async move {
                hits.lock().unwrap().push(uri.to_string());
                let decoded = percent_encoding::percent_decode_str(uri.path()).decode_utf8_lossy();
                let mut resolved: Vec<&str> = Vec::new();
                for segment in decoded.split(['/', '\\']) {
                    match segment {
                        "" | "." => {}
                        ".." => {
                            resolved.pop();
                        }
                        s => resolved.push(s.split(';').next().unwrap_or(s)),
                    }
                }
                match resolved.as_slice() {
                    ["secret.txt"] => (axum::http::StatusCode::OK, "THE SECRET".to_owned()),
                    ["base", rest @ ..] => (
                        axum::http::StatusCode::OK,
                        format!("file {}", rest.join("/")),
                    ),
                    _ => (axum::http::StatusCode::NOT_FOUND, String::new()),
                }
            },
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits, task)
}

/// The gateway with one provider, `echo`, at the [`file_server`] at
/// `files`, under its `/base`.
async fn before_files(files: SocketAddr) -> Running {
    let toml = format!(
        r#"
[[providers]]
name = "echo"
base_url = "http://{files}/base"
"#
    );
    start(&toml).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_could_leave_the_base_path_get_400_and_the_secret_is_never_served() {
    let (files, hits, server) = file_server().await;
    let gw = before_files(files).await;
    let host = gw.addr.to_string();

    // The setup works: a plain path is served from under the base.
    let plain = get(gw.addr, "/echo/hello.txt?x=1", &host, &[]).await;
    assert_eq!((plain.status, plain.body.as_str()), (200, "file hello.txt"));
    assert_eq!(*hits.lock().unwrap(), ["/base/hello.txt?x=1"]);
    hits.lock().unwrap().clear();

    for path in [
        "/echo/../secret.txt",
        "/echo/./../secret.txt",
        "/echo/%2e%2e/secret.txt",
        "/echo/%2E%2e/secret.txt",
        "/echo/.%2e/secret.txt",
        "/echo/%2e./secret.txt",
        "/echo/%252e%252e/secret.txt",
        "/echo/..;/secret.txt",
        "/echo/..%5csecret.txt",
        "/echo/..%5Csecret.txt",
        "/echo/..\\secret.txt",
        "/echo/..%2fsecret.txt",
        "/echo/..%2Fsecret.txt",
        "/echo/x/..%2f..%2fsecret.txt",
        "/echo//../secret.txt",
        "/echo/%c0%ae%c0%ae/secret.txt",
        "/../secret.txt",
        "/echo/..",
    ] {
        let answer = get(gw.addr, path, &host, &[]).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert!(!answer.body.contains("SECRET"), "{path}: {answer:?}");
        assert_eq!(answer.code(), "bad_path", "{path}");
    }
    assert!(
        hits.lock().unwrap().is_empty(),
        "forwarded: {:?}",
        hits.lock().unwrap()
    );
    gw.shutdown().await;
    server.abort();
}

// ---------------------------------------------------------------- item 4

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_gets_421_and_a_foreign_origin_403_before_anything_is_forwarded() {
    let gw = start(SIMULATOR).await;
    let sim = gw.simulator.as_ref().unwrap();
    let port = gw.addr.port();
    let chat = r#"{"model":"sim-small"}"#;
    let post = |host: String, more: String| {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json{more}"
        );
        async move { raw(gw.addr, &head, chat.as_bytes()).await }
    };

    // The listen address's names.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
    ] {
        assert_eq!(
            post(host.clone(), String::new()).await.status,
            200,
            "{host}"
        );
    }
    assert_eq!(sim.count("sim-small").received, 4);

    // DNS rebinding, another port, junk: 421, on every route.
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        format!("user@127.0.0.1:{port}"),
        "<script>alert(1)</script>".to_owned(),
    ] {
        let answer = post(host.clone(), String::new()).await;
        assert_eq!(answer.status, 421, "{host}");
        assert_eq!(answer.code(), "unknown_host");
        assert!(
            !answer.body.contains("evil") && !answer.body.contains("script"),
            "{answer:?}"
        );
        for path in ["/stats", "/metrics", "/", "/events"] {
            assert_eq!(get(gw.addr, path, &host, &[]).await.status, 421, "{path}");
        }
    }
    let no_host = raw(gw.addr, "GET /stats HTTP/1.0", b"").await;
    assert_eq!(no_host.status, 421);
    let two = get(
        gw.addr,
        "/stats",
        &gw.addr.to_string(),
        &["host: evil.example"],
    )
    .await;
    assert_eq!(two.status, 421);

    // A foreign browser origin: 403; the gateway's own: served.
    let host = gw.addr.to_string();
    for origin in [
        "https://evil.example",
        "http://localhost:3000",
        "null",
        "http://evil.example/page",
    ] {
        let answer = post(host.clone(), format!("\r\norigin: {origin}")).await;
        assert_eq!(answer.status, 403, "{origin}");
        assert_eq!(answer.code(), "forbidden_origin");
        assert!(!answer.body.contains("evil"), "{answer:?}");
    }
    assert_eq!(
        sim.count("sim-small").received,
        4,
        "nothing refused was forwarded"
    );
    let own = format!("origin: http://{host}");
    assert_eq!(post(host.clone(), format!("\r\n{own}")).await.status, 200);
    // The live page and its event stream keep working.
    assert_eq!(get(gw.addr, "/", &host, &[&own]).await.status, 200);
    let events = raw_with(
        gw.addr,
        &format!("GET /events HTTP/1.1\r\nhost: {host}\r\n{own}"),
        b"",
        true,
    )
    .await;
    assert_eq!(events.status, 200);
    assert!(events.head.contains("text/event-stream"), "{events:?}");

    // Both lists apply on reload.
    let toml = SIMULATOR.to_owned()
        + r#"
[gateway]
allowed_hosts = ["gateway.example", "other.example:8443"]
allowed_origins = ["https://dashboard.example"]
"#;
    let settings = Settings::from_toml(&toml, &no_env).unwrap();
    gw.gateway.apply(settings).unwrap();
    assert_eq!(
        post("Gateway.Example:1234".into(), String::new())
            .await
            .status,
        200
    );
    assert_eq!(
        post("other.example:8443".into(), String::new())
            .await
            .status,
        200
    );
    assert_eq!(
        post("other.example:8444".into(), String::new())
            .await
            .status,
        421
    );
    let dashboard = "\r\norigin: https://dashboard.example".to_owned();
    assert_eq!(post(host.clone(), dashboard).await.status, 200);
    let evil = "\r\norigin: https://evil.example".to_owned();
    assert_eq!(post(host, evil).await.status, 403);
    gw.shutdown().await;
}

#[test]
fn allowed_hosts_and_origins_are_checked_and_a_bad_entry_is_named() {
    let bad = [
        (
            "gateway.allowed_hosts[1]",
            r#"allowed_hosts = ["ok.example", "http://x/"]"#,
        ),
        (
            "gateway.allowed_hosts[0]",
            r#"allowed_hosts = ["user@host"]"#,
        ),
        (
            "gateway.allowed_origins[0]",
            r#"allowed_origins = ["dashboard.example"]"#,
        ),
        (
            "gateway.allowed_origins[1]",
            r#"allowed_origins = ["https://a.example", "https://b.example/page"]"#,
        ),
        (
            "gateway.allowed_origins[0]",
            r#"allowed_origins = ["ftp://a.example"]"#,
        ),
        (
            "gateway.allowed_origins",
            r#"allowed_origins = "https://a.example""#,
        ),
    ];
    for (field, line) in bad {
        let toml = format!("[gateway]\n{line}\n{SIMULATOR}");
        let error = Settings::from_toml(&toml, &no_env)
            .expect_err(line)
            .to_string();
        assert!(error.contains(&format!("`{field}`")), "{field}: {error}");
    }
    let toml = format!(
        "[gateway]\nallowed_hosts = [\"[::1]:80\", \"a.example\"]\nallowed_origins = [\"http://127.0.0.1:8080\"]\n{SIMULATOR}"
    );
    let settings = Settings::from_toml(&toml, &no_env).unwrap();
    assert_eq!(settings.gateway.allowed_hosts.len(), 2);
    assert_eq!(settings.gateway.allowed_origins.len(), 1);
}

// ---------------------------------------------------------------- item 6

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_control_characters_gets_400_before_routing() {
    let gw = start(SIMULATOR).await;
    for model in [
        "x\n2026-12-01T00:00:00Z ERROR admin password reset\u{1b}[2J",
        "sim-small\r",
        "sim-small\u{0}",
        "sim-small\u{7f}",
        "sim-small\u{85}",
        "sim\u{202e}llams-",
        "sim-small\u{2028}",
        "sim-small\u{200b}",
    ] {
        let body = serde_json::json!({ "model": model }).to_string();
        let answer = post_chat(gw.addr, &body).await;
        assert_eq!(answer.status, 400, "{model:?}: {answer:?}");
        assert_eq!(answer.code(), "bad_model", "{model:?}");
        assert!(!answer.body.contains("ERROR admin"), "{answer:?}");
    }
    assert_eq!(upstream_responses(&gw), 0, "nothing was forwarded");
    let (_, routes) = gw.gateway.counters().snapshot();
    assert!(routes.is_empty(), "{routes:?}");
    gw.shutdown().await;
}

// ---------------------------------------------------------------- item 11

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_between_2_and_4_mib_is_served_and_a_larger_one_gets_the_gateways_413() {
    let gw = start(SIMULATOR).await;
    let sim = gw.simulator.as_ref().unwrap();
    let padded = |size: usize| {
        let body = format!(r#"{{"model":"sim-small","pad":"{}"}}"#, "x".repeat(size));
        assert!(body.len() > size);
        body
    };
    let three_mib = padded(3 << 20);
    let served = post_chat(gw.addr, &three_mib).await;
    assert_eq!(served.status, 200, "{:?}", served.head);
    assert_eq!(sim.count("sim-small").received, 1);

    // Above the limit: refused on its declared length, before any of it is
    // read (so the test sends none of it).
    let limit = config::DEFAULT_MAX_BODY;
    let head = |addr: SocketAddr| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}",
            limit + 1
        )
    };
    let refused = raw(gw.addr, &head(gw.addr), b"").await;
    assert_eq!(refused.status, 413);
    assert_eq!(refused.code(), "body_too_large");
    assert_eq!(sim.count("sim-small").received, 1, "not forwarded");

    // The simulator, asked directly, says the same in the same shape.
    let direct = raw(sim.addr(), &head(sim.addr()), b"").await;
    assert_eq!(direct.status, 413);
    assert_eq!(direct.code(), "body_too_large");
    assert_eq!(
        direct.json()["error"]["message"],
        refused.json()["error"]["message"]
    );
    gw.shutdown().await;
}

// ---------------------------------------------------------------- after review

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_echoes_odd_targets_encoded_percents_and_cross_site_requests_are_never_forwarded() {
    let (files, hits, server) = file_server().await;
    let gw = before_files(files).await;
    let host = gw.addr.to_string();
    let refused = [
        (format!("CONNECT {files} HTTP/1.1\r\nhost: {host}"), 405),
        (
            format!("TRACE /echo/hello.txt HTTP/1.1\r\nhost: {host}"),
            405,
        ),
        (format!("OPTIONS * HTTP/1.1\r\nhost: {host}"), 400),
        (
            format!("GET http://{host}/echo/hello.txt HTTP/1.1\r\nhost: {host}"),
            400,
        ),
        (
            format!("GET /echo/%252e%252e/secret.txt HTTP/1.1\r\nhost: {host}"),
            400,
        ),
        (
            format!("GET /echo/%25252e%25252e/secret.txt HTTP/1.1\r\nhost: {host}"),
            400,
        ),
    ];
    for (head, status) in refused {
        let answer = raw(gw.addr, &head, b"").await;
        assert_eq!(answer.status, status, "{head}: {answer:?}");
    }
    // A browser's request made for another site's page, even with no
    // `Origin` (an `<img>`), is refused; its own pages' requests are not.
    for site in ["cross-site", "same-site"] {
        let line = format!("sec-fetch-site: {site}");
        let answer = get(gw.addr, "/echo/hello.txt", &host, &[&line]).await;
        assert_eq!(
            (answer.status, answer.code()),
            (403, "forbidden_origin".to_owned()),
            "{site}"
        );
    }
    assert!(
        hits.lock().unwrap().is_empty(),
        "forwarded: {:?}",
        hits.lock().unwrap()
    );
    for site in ["same-origin", "none"] {
        let line = format!("sec-fetch-site: {site}");
        let answer = get(gw.addr, "/echo/hello.txt", &host, &[&line]).await;
        assert_eq!(answer.status, 200, "{site}: {answer:?}");
    }
    gw.shutdown().await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_body_gets_415_and_is_not_forwarded() {
    let gw = start(SIMULATOR).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-encoding: gzip",
        gw.addr
    );
    let answer = raw(gw.addr, &head, b"\x1f\x8b not really gzip").await;
    assert_eq!(
        (answer.status, answer.code()),
        (415, "bad_encoding".to_owned())
    );
    assert_eq!(upstream_responses(&gw), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_gets_408_and_shutdown_does_not_wait_for_one_still_coming() {
    let toml = SIMULATOR.to_owned()
        + r#"
[gateway]
body_read_timeout = "300ms"
shutdown_grace = "60s"
"#;
    let gw = start(&toml).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"mo",
        gw.addr
    );
    // A body that never completes: 408 once its time is up.
    let mut socket = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = socket.read_to_end(&mut answer);
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    // Another one still coming when the gateway stops: shutdown answers it
    // 503 at once rather than wait for it (the grace is a minute).
    let mut socket = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), gw.shutdown())
        .await
        .expect("shutdown did not wait for the body");
    assert!(stopped, "clean shutdown");
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_on_a_method_without_one_is_refused_and_counts_against_no_route() {
    let rule = one_rule("sim-large", 1, "1m");
    let toml = format!("[gateway]\nmax_routes = 3\n{SIMULATOR}{rule}");
    let gw = start(&toml).await;
    let host = gw.addr.to_string();
    // The upstream would get a body naming a model the limiter never read:
    // refused, whatever the method, before anything is forwarded.
    for (n, method) in ["GET", "DELETE", "OPTIONS", "GET"].into_iter().enumerate() {
        let head = format!(
            "{method} /v1/models HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
        );
        let body = format!(
            r#"{{"model":"{}"}}"#,
            if n == 0 {
                "sim-large".to_owned()
            } else {
                format!("junk-{n}")
            }
        );
        let answer = raw(gw.addr, &head, body.as_bytes()).await;
        assert_eq!(answer.status, 400, "{method}: {answer:?}");
        assert_eq!(answer.code(), "body_not_allowed");
    }
    assert_eq!(
        upstream_responses(&gw),
        0,
        "a refused request was forwarded"
    );
    // Without a body, as every client sends them, they go.
    assert_eq!(get(gw.addr, "/v1/models", &host, &[]).await.status, 200);
    // sim-large's one request a minute is still there: nothing naming it
    // spent it.
    let once = post_chat(gw.addr, r#"{"model":"sim-large"}"#).await;
    assert_eq!(once.status, 200, "{once:?}");
    let stats = get(gw.addr, "/stats", &host, &[]).await.json();
    let names: Vec<&str> = stats["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["route"].as_str())
        .collect();
    assert!(!names.iter().any(|n| n.contains("junk")), "{names:?}");
    assert!(names.contains(&"sim/sim-large"), "{names:?}");
    gw.shutdown().await;
}

/// A `multipart/form-data` body (boundary `B`) with these fields.
fn form(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut text = String::new();
    for (name, value) in fields {
        text.push_str(&format!(
            "--B\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
        ));
    }
    text.push_str("--B--\r\n");
    text.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_counts_under_its_model_field_as_the_upstream_reads_it() {
    let upstream = support::fake_upstream::FakeUpstream::start().await;
    let toml = format!(
        r#"
[[providers]]
name = "up"
base_url = "{}"

[rate_limit]
[[rate_limit.rules]]
provider = "up"
model = "whisper-1"
quotas = [{{ limit = 1, period = "1m" }}]
"#,
        upstream.base_url()
    );
    let gw = start(&toml).await;
    let upload = |fields: &[(&str, &str)]| {
        let head = format!(
            "POST /v1/audio/transcriptions HTTP/1.1\r\nhost: {}\r\ncontent-type: multipart/form-data; boundary=B",
            gw.addr
        );
        let body = form(fields);
        async move { raw(gw.addr, &head, &body).await }
    };
    let audio = ("file", "RIFF....WAVE");
    assert_eq!(upload(&[audio, ("model", "whisper-1")]).await.status, 200);
    // The rule's one request a minute is spent: counted under the form's
    // model, not under "(none)".
    let again = upload(&[("model", "whisper-1"), audio]).await;
    assert_eq!(again.status, 429, "{again:?}");
    // Two model fields: which one the upstream reads is not known.
    let two = upload(&[("model", "tiny"), audio, ("model", "whisper-1")]).await;
    assert_eq!((two.status, two.code()), (400, "ambiguous_body".to_owned()));
    // A form that does not parse is not forwarded for the upstream to read
    // its own way.
    let head = format!(
        "POST /v1/audio/transcriptions HTTP/1.1\r\nhost: {}\r\ncontent-type: multipart/form-data; boundary=B",
        gw.addr
    );
    let cut = raw(
        gw.addr,
        &head,
        b"--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1",
    )
    .await;
    assert_eq!((cut.status, cut.code()), (400, "bad_multipart".to_owned()));
    assert_eq!(upstream.received().len(), 1);
    gw.shutdown().await;
    upstream.stop().await;
}
