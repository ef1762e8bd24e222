//! The `proxy` example under denial-of-service attempts and signals: the
//! connection cap, the header read timeout (also the idle keep-alive
//! timeout), the header size cap, `/events` clients that never read, and
//! SIGTERM (sent to the proxy running in a child process). Each test runs
//! on its own ephemeral loopback ports; only events (a socket closed, a
//! response, an exit) are waited for, with generous bounds as hang guards.

// Signals are sent with `nix`, on Unix.
#![cfg(unix)]

mod support;

use testkit::capture;

use testkit::child;

use proxy::{app, cli, config, gateway, serve, signal, stats};

use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser as _;
use nix::sys::signal::Signal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Settings;
use crate::gateway::Running;
use capture::log_text;
use support::sim::{post_body, route_names, start, stats};

/// Hang guard for anything awaited.
const BOUND: Duration = Duration::from_secs(10);

/// A fast simulator and its provider, then `extra`.
fn config(extra: &str) -> String {
    format!(
        r#"
[simulator]
latency = "0ms"

[[providers]]
name = "sim"
base_url = "simulator"
{extra}"#
    )
}

async fn chat(client: &reqwest::Client, url: &str) -> reqwest::Response {
    post_body(client, url, r#"{"model":"sim-small","messages":[]}"#).await
}

/// Everything `stream` receives until the other end closes it (bounded).
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    tokio::time::timeout(BOUND, stream.read_to_end(&mut received))
        .await
        .expect("the server closed the connection")
        .ok();
    String::from_utf8_lossy(&received).into_owned()
}

/// Poll `check` until it holds (bounded).
async fn until(what: &str, check: impl Fn() -> bool) {
    let wait = async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(BOUND, wait)
        .await
        .unwrap_or_else(|_| panic!("gave up waiting for {what}"));
}

fn head(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n")
}

// ------------------------------------------------------------ connections

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_keeps_new_connections_waiting_until_an_idle_one_times_out() {
    let gw = start(&config(
        "[gateway]\nmax_connections = 4\nheader_read_timeout = \"300ms\"\n",
    ))
    .await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    until("4 connections accepted", || gw.connections.open() == 4).await;

    // A fifth waits in the backlog: it is served once an idle one is
    // closed for sending nothing within header_read_timeout.
    let client = reqwest::Client::new();
    let url = gw.url();
    let request = tokio::spawn(async move { chat(&client, &url).await.status() });
    for stream in &mut idle {
        assert_eq!(read_to_close(stream).await, "", "closed without an answer");
    }
    let status = tokio::time::timeout(BOUND, request).await.unwrap().unwrap();
    assert_eq!(status, 200);
    assert!(
        gw.connections.peak() <= 4,
        "{} open at once",
        gw.connections.peak()
    );
    assert!(!log_text().contains("accept error"), "{}", log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_head_and_an_idle_keep_alive_connection_are_closed_after_the_header_timeout() {
    let gw = start(&config("[gateway]\nheader_read_timeout = \"300ms\"\n")).await;
    let host = gw.addr.to_string();

    let mut half = TcpStream::connect(gw.addr).await.unwrap();
    half.write_all(format!("GET /stats HTTP/1.1\r\nhost: {host}\r\n").as_bytes())
        .await
        .unwrap();
    assert!(!read_to_close(&mut half).await.contains("200 OK"));

    // A connection that was answered and then says nothing more is closed
    // by the same timer.
    let mut kept = TcpStream::connect(gw.addr).await.unwrap();
    kept.write_all(head(&host, "/stats").as_bytes())
        .await
        .unwrap();
    let answered = read_to_close(&mut kept).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_port_is_capped_and_timed_as_the_gateways() {
    let toml = config("[gateway]\nheader_read_timeout = \"300ms\"\n");
    let settings = Settings::from_toml(&toml, &|_| None).unwrap();
    let sim = settings.simulator.as_ref().unwrap();
    assert!(sim.serve.max_connections <= config::SIM_MAX_CONNECTIONS);
    assert_eq!(sim.serve.header_read_timeout, Duration::from_millis(300));
    let gw = start(&toml).await;
    let sim = gw.simulator.as_ref().unwrap().addr();
    // A half-sent head on the simulator's port (printed in the banner) is
    // closed by the gateway's header timeout, not held for good.
    let mut half = TcpStream::connect(sim).await.unwrap();
    half.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {sim}\r\n").as_bytes())
        .await
        .unwrap();
    assert!(!read_to_close(&mut half).await.contains("200 OK"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_above_max_header_bytes_gets_431() {
    let gw = start(&config("[gateway]\nmax_header_bytes = 16384\n")).await;
    let client = reqwest::Client::new();
    let stats = |size: usize| {
        client
            .get(format!("{}/stats", gw.url()))
            .header("x-padding", "a".repeat(size))
            .send()
    };
    assert_eq!(stats(4 << 10).await.unwrap().status(), 200);
    assert_eq!(stats(32 << 10).await.unwrap().status(), 431);
    // The server is still there for the next one.
    assert_eq!(stats(0).await.unwrap().status(), 200);
}

// ----------------------------------------------------------------- events

/// A client on `/events` that sends its request and never reads, with a
/// small receive buffer so the gateway's writes back up quickly.
async fn silent_event_client(gw: &Running) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(gw.addr).await.unwrap();
    stream
        .write_all(head(&gw.addr.to_string(), "/events").as_bytes())
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_clients_that_never_read_hold_bounded_memory_and_the_one_past_the_cap_gets_503() {
    // Many providers with long base paths: a snapshot of about 300 KB, so
    // that a few unread events fill the sockets' buffers.
    let mut providers = String::new();
    for i in 0..100 {
        let base = "b".repeat(3000);
        providers.push_str(&format!(
            "[[providers]]\nname = \"p{i}\"\nbase_url = \"http://127.0.0.1:9/{base}\"\n"
        ));
    }
    let gw = start(&config(&format!(
        "default = true\n{providers}[gateway]\nmax_event_clients = 4\n"
    )))
    .await;
    let gateway = gw.gateway.clone();
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(silent_event_client(&gw).await);
    }
    until("4 event clients", || {
        gateway.event_clients().load(Ordering::Relaxed) == 4
    })
    .await;

    let client = reqwest::Client::new();
    let refused = client
        .get(format!("{}/events", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let body: serde_json::Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_event_clients");

    // Publish until the gateway holds unsent snapshot bytes (the sockets
    // are full), then many more: what it holds stays bounded.
    let url = gw.url();
    let json_len = serde_json::to_string(&stats::snapshot(&gateway, 0))
        .unwrap()
        .len();
    let bound = 4 * (serve::MAX_BUF + 2 * (json_len + 100));
    let held = || gateway.event_bytes().load(Ordering::Relaxed);
    let mut most = 0;
    let mut after_backlog = 0;
    for _ in 0..300 {
        assert_eq!(chat(&client, &url).await.status(), 200);
        stats::publish(&gateway);
        most = most.max(held());
        if most > json_len {
            after_backlog += 1;
        }
        if after_backlog == 10 {
            break;
        }
    }
    assert_eq!(after_backlog, 10, "the clients' sockets never filled");
    assert!(most <= bound, "held {most} bytes, bound {bound}");

    // Gone: nothing is held for them any more.
    drop(silent);
    until("event clients gone", || {
        gateway.event_clients().load(Ordering::Relaxed) == 0
    })
    .await;
    until("their bytes freed", || held() == 0).await;
    let again = client
        .get(format!("{}/events", gw.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}

// ---------------------------------------------------------------- signals

/// The child's side: the proxy as `main` runs it, on the config file named
/// by `PROXY_CONFIG`, with real signal handlers; prints `READY <url>` and
/// exits with the proxy's exit code.
#[test]
#[ignore = "run by the signal tests in a child process"]
fn proxy_child() {
    let Some(path) = child::input("proxy", "PROXY_CONFIG") else {
        return;
    };
    // A lowered open-file limit, for the file-descriptor test.
    if let Some(n) = std::env::var("PROXY_NOFILE")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        use nix::sys::resource::{Resource, setrlimit};
        setrlimit(Resource::RLIMIT_NOFILE, n, n).unwrap();
    }
    child::run_and_exit(async {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        let signals = signal::StopSignals::listen().unwrap();
        let cli = cli::Cli::try_parse_from(["proxy", "--config", &path, "--listen", "127.0.0.1:0"])
            .unwrap();
        let (ready, url) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            if let Ok(url) = url.await {
                println!("READY {url}");
            }
        });
        app::run(cli, signals.stopped("shutting down"), Some(ready)).await
    })
}

/// Wait until `/stats` counts `n` requests in flight (bounded).
async fn until_in_flight(client: &reqwest::Client, url: &str, n: u64) {
    let in_flight =
        || async { stats(client, url).await["aggregate"]["concurrency"]["in_flight"].as_u64() };
    let wait = async {
        while in_flight().await != Some(n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(BOUND, wait)
        .await
        .unwrap_or_else(|_| panic!("{n} requests never were in flight"));
}

/// The proxy in a child process on `toml`, and its URL once it serves.
async fn proxy_process(name: &str, toml: &str) -> (child::Running, String, std::path::PathBuf) {
    proxy_process_with(name, toml, &[]).await
}

/// [`proxy_process`] with `env` added.
async fn proxy_process_with(
    name: &str,
    toml: &str,
    env: &[(&str, &str)],
) -> (child::Running, String, std::path::PathBuf) {
    let path =
        std::env::temp_dir().join(format!("tower-throttle-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, toml).unwrap();
    let mut vars = vec![("PROXY_CONFIG", path.to_str().unwrap())];
    vars.extend_from_slice(env);
    let running = child::spawn("proxy_child", "proxy", &vars);
    let line = running.stdout_line("READY ").await;
    let url = line.trim_start_matches("READY ").trim().to_owned();
    (running, url, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_requests_in_flight_finish_and_exits_0() {
    let toml = config("[gateway]\nshutdown_grace = \"30s\"\n")
        .replace("latency = \"0ms\"", "latency = \"1s\"");
    let (mut proxy, url, path) = proxy_process("in-flight", &toml).await;
    let client = reqwest::Client::new();
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { chat(&client, &url).await.status() })
        })
        .collect();
    // All 20 are with the simulator (its latency holds them there).
    until_in_flight(&client, &url, 20).await;

    proxy.signal(Signal::SIGTERM);
    for request in requests {
        let status = tokio::time::timeout(BOUND, request).await.unwrap().unwrap();
        assert_eq!(status, 200);
    }
    assert_eq!(proxy.exit_code(BOUND).await, Some(0), "{}", proxy.stderr());
    assert!(
        !proxy.stderr().contains("after shutdown_grace"),
        "{}",
        proxy.stderr()
    );
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_connections_that_never_sent_a_complete_request() {
    // Neither the grace nor the header timeout would end before the bound.
    let toml = config("[gateway]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n");
    let (mut proxy, url, path) = proxy_process("half-sent", &toml).await;
    let host = url.trim_start_matches("http://").to_owned();
    let mut half = TcpStream::connect(&host).await.unwrap();
    half.write_all(format!("GET /stats HTTP/1.1\r\nhost: {host}\r\n").as_bytes())
        .await
        .unwrap();
    let _idle = TcpStream::connect(&host).await.unwrap();
    // Accepted in order: once this is answered, so are those two.
    let client = reqwest::Client::new();
    let stats = client.get(format!("{url}/stats")).send().await.unwrap();
    assert_eq!(stats.status(), 200);

    proxy.signal(Signal::SIGTERM);
    assert_eq!(proxy.exit_code(BOUND).await, Some(0), "{}", proxy.stderr());
    assert!(!read_to_close(&mut half).await.contains("200 OK"));
    assert!(!proxy.stderr().contains("in flight"), "{}", proxy.stderr());
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_quits_at_once_with_130() {
    let toml = config("[gateway]\nshutdown_grace = \"60s\"\n")
        .replace("latency = \"0ms\"", "latency = \"60s\"");
    let (mut proxy, url, path) = proxy_process("second", &toml).await;
    let client = reqwest::Client::new();
    let url2 = url.clone();
    let request = tokio::spawn(async move { chat(&client, &url).await });
    until_in_flight(&reqwest::Client::new(), &url2, 1).await;
    proxy.signal(Signal::SIGTERM);
    proxy.stderr_line("SIGTERM: shutting down").await;
    proxy.signal(Signal::SIGTERM);
    assert_eq!(
        proxy.exit_code(BOUND).await,
        Some(130),
        "{}",
        proxy.stderr()
    );
    request.abort();
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_large_answer_releases_its_permit_after_the_write_timeout() {
    // An upstream whose answers are far larger than the socket buffers.
    let big = axum::body::Bytes::from(vec![b'x'; 24 << 20]);
    let upstream = testkit::local_server::Server::start(axum::Router::new().fallback(move || {
        let big = big.clone();
        async move { big }
    }))
    .await;
    let toml = format!(
        "[gateway]\nbody_write_timeout = \"300ms\"\n\n[[providers]]\nname = \"big\"\n\
         base_url = \"http://{}\"\n\n[concurrency]\nmax_in_flight = 1\nmax_queue = 4\n\
         queue_timeout = \"20s\"\n",
        upstream.addr
    );
    let gw = start(&toml).await;
    let host = gw.addr.to_string();
    let body = r#"{"model":"m","messages":[]}"#;
    // Asks, then never reads: the answer stops at the full socket buffers.
    let mut stalled = TcpStream::connect(gw.addr).await.unwrap();
    stalled
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    until("the stalled answer's connection to be closed", || {
        gw.gateway.write_timeouts() == 1
    })
    .await;
    // Its permit came back: the route's one slot serves the next request.
    let client = reqwest::Client::new();
    let answer = tokio::time::timeout(BOUND, chat(&client, &gw.url()))
        .await
        .expect("the next request is served");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.bytes().await.unwrap().len(), 24 << 20);
    let stats: serde_json::Value = serde_json::from_str(
        &client
            .get(format!("{}/stats", gw.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(stats["write_timeouts"], 1, "{stats}");
    // One line says so, without the client's address.
    let logs = log_text();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("stopped reading"))
        .collect();
    assert!(!lines.is_empty(), "{logs}");
    assert!(lines.iter().all(|l| !l.contains("127.0.0.1")), "{lines:#?}");
    drop(stalled);
    upstream.stop().await;
}

/// Made-up model names an upstream happens to answer fill the routes
/// counted by name, but only until they go idle: a real model answered
/// afterwards takes an idle one's place and is counted by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_models_an_upstream_answers_give_their_places_to_a_real_one_once_idle() {
    let upstream = support::fake_upstream::FakeUpstream::start().await;
    let toml = format!(
        r#"
[gateway]
max_routes = 4
route_idle = "1s"

[[providers]]
name = "up"
base_url = "{}"
"#,
        upstream.base_url()
    );
    let gw = start(&toml).await;
    let url = gw.url();
    let client = reqwest::Client::new();
    let send = |model: String| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
            let response = post_body(&client, &url, body).await;
            assert_eq!(response.status(), 200, "{model}");
        }
    };
    let routes = || {
        let client = client.clone();
        let url = url.clone();
        async move { route_names(&stats(&client, &url).await) }
    };
    for i in 0..20 {
        send(format!("made-up-{i}")).await;
    }
    // Never refused, whatever the table holds: counted under (other).
    send("gpt-real".to_owned()).await;
    assert!(!routes().await.contains(&"up/gpt-real".to_owned()));
    // Once the made-up names have gone unanswered for route_idle, the real
    // model's next answer takes a place (polled: the gateway's clock).
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        send("gpt-real".to_owned()).await;
        if routes().await.contains(&"up/gpt-real".to_owned()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            routes().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Bounded: the tracked names, names the layers still hold until they
    // need the room (at most as many again), and (other).
    let names = routes().await;
    assert!(names.len() <= 2 * 4, "{names:?}");
    // Counted by name from then on, in every layer.
    let before = gw.gateway.handles().concurrency.stats();
    send("gpt-real".to_owned()).await;
    let after = gw.gateway.handles().concurrency.stats();
    let admitted = |s: &tower_throttle::stats::StatsSnapshot| {
        s.keys
            .iter()
            .find(|k| k.key == "up/gpt-real")
            .map_or(0, |k| k.admitted)
    };
    assert_eq!(admitted(&after), admitted(&before) + 1);
    gw.shutdown().await;
    upstream.stop().await;
}

/// The operator endpoints build every view from every route's counters:
/// hammered, they answer 429 beyond their own limit, and forwarded
/// requests are not touched by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_endpoints_have_a_limit_of_their_own() {
    let gw = start(&config("")).await;
    let url = gw.url();
    let client = reqwest::Client::new();
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..150 {
        let status = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert!(statuses.get(&429).is_some_and(|&n| n > 0), "{statuses:?}");
    assert!(
        statuses.get(&200).is_some_and(|&n| n >= 100),
        "{statuses:?}"
    );
    assert_eq!(chat(&client, &url).await.status(), 200);
    gw.shutdown().await;
}

/// Under `ulimit -n 1024`, 1,100 half-sent heads on each of the process's
/// listeners (the gateway's, and the simulator's printed in the banner)
/// never bring it to its file-descriptor limit: each listener takes what
/// its cap allows and leaves the rest in the listen backlog, and the
/// gateway goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_on_every_listener_never_exhaust_the_file_descriptors() {
    let toml = config("[gateway]\nheader_read_timeout = \"1s\"\n");
    let (proxy, url, path) = proxy_process_with("nofile", &toml, &[("PROXY_NOFILE", "1024")]).await;
    let pid = proxy.child.id().expect("running");
    let gateway = url.trim_start_matches("http://").to_owned();
    let banner = proxy.stdout_line("simulator  http://").await;
    let simulator = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .expect("the simulator's address")
        .trim_end_matches('/')
        .to_owned();
    let mut held = Vec::new();
    for addr in [&gateway, &simulator] {
        for _ in 0..1_100 {
            let mut socket = tokio::time::timeout(BOUND, TcpStream::connect(addr))
                .await
                .expect("connects (the backlog takes it)")
                .unwrap();
            let _ = socket
                .write_all(
                    format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\n").as_bytes(),
                )
                .await;
            held.push(socket);
        }
    }
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(open < 1_000, "{open} file descriptors open of 1024");
    // Still answering (once the heads before it have timed out).
    let client = reqwest::Client::new();
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        client.get(format!("{url}/stats")).send(),
    )
    .await
    .expect("answered")
    .unwrap();
    assert_eq!(stats.status(), 200);
    assert!(
        !proxy.stderr().contains("Too many open files"),
        "{}",
        proxy.stderr()
    );
    drop(held);
    let _ = std::fs::remove_file(&path);
}
