//! End to end: the `ratecheck` example probing local axum servers guarded by
//! this crate's `RateLimitLayer`, with 2 s windows so the whole file runs in a
//! few seconds (its tests run in parallel; the longest waits up to one window
//! for a boundary). Diagnose's end-to-end tests are in
//! `tests/ratecheck_diagnose.rs`.
//!
//! The example's modules are compiled into this test, and its run function
//! is called directly, with the command line parsed as the binary does.

use testkit::local_server;

use ratecheck::{cli, probe, report};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::error_handling::HandleErrorLayer;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use parking_lot::Mutex;
use tower::ServiceBuilder;
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

use crate::cli::Config;
use crate::local_server::Server;
use crate::report::Report;

const WINDOW: Duration = Duration::from_secs(2);
const LIMIT: u32 = 10;

/// Turns the layer's refusal into `429 Too Many Requests` with
/// `Retry-After` (whole seconds, rounded up); anything else is a 500.
async fn rejection_to_response(err: BoxError) -> Response {
    match err.downcast_ref::<RateLimited>() {
        Some(limited) => {
            let secs =
                limited.retry_after.as_secs() + u64::from(limited.retry_after.subsec_nanos() > 0);
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
            )
                .into_response()
        }
        None => (StatusCode::INTERNAL_SERVER_ERROR, "unexpected error").into_response(),
    }
}

/// A route answering "ok", behind `quota` on one global key.
fn limited(quota: Quota) -> Router {
    Router::new()
        .route("/v1/chat", any(|| async { "ok" }))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(rejection_to_response))
                .layer(RateLimitLayer::new(quota, GlobalKey)),
        )
}

/// Parse `args` as ratecheck's command line, run it, and build the report.
async fn ratecheck(args: &[&str]) -> (Config, Report) {
    let mut all = vec!["ratecheck"];
    all.extend_from_slice(args);
    let config = Config::from_args(all).expect("valid command line");
    let run = probe::run(&config, false, std::future::pending())
        .await
        .expect("the run starts");
    let report = report::build(&config, &run);
    (config, report)
}

fn quota() -> Quota {
    Quota::new(LIMIT, WINDOW).expect("valid quota")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_boundary_batches_show_a_fixed_window_admitting_twice_its_limit() {
    for (quota, after) in [
        (quota().fixed_window(), LIMIT),
        (quota().sliding_window(), 0),
    ] {
        let server = Server::start(limited(quota)).await;
        let url = server.url("/v1/chat");
        let (_, report) = ratecheck(&[
            "--url",
            &url,
            "--mode",
            "window-boundary",
            "--rpm",
            "10",
            "--window",
            "2s",
        ])
        .await;
        server.stop().await;
        let b = report
            .mode_detail
            .and_then(|d| d.window_boundary)
            .expect("boundary detail");
        assert_eq!(b.offset_ms, 200);
        assert_eq!(b.boundary_unix_ms % 2000, 0);
        assert_eq!(
            (b.before.sent, b.before.success),
            (10, 10),
            "{:?}",
            quota.algorithm()
        );
        assert_eq!(
            (b.after.sent, b.after.success),
            (10, u64::from(after)),
            "{:?}",
            quota.algorithm()
        );
        assert_eq!(b.after.refused, u64::from(LIMIT - after));
    }
}

/// What the server saw of the secret-carrying requests.
#[derive(Default)]
struct Seen {
    api_keys: Vec<String>,
    authorizations: Vec<String>,
    bodies: Vec<Bytes>,
}

#[tokio::test]
async fn reports_never_contain_bodies_header_values_or_tokens() {
    const SECRETS: [&str; 5] = [
        "sk-header-secret",
        "prompt-body-secret",
        "pw-url-secret",
        "query-token-secret",
        "fragment-secret",
    ];
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    let app = Router::new().route(
        "/v1/chat",
        any(move |headers: HeaderMap, body: Bytes| {
            let record = record.clone();
            async move {
                let mut seen = record.lock();
                let value = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                seen.api_keys.push(value("x-api-key"));
                seen.authorizations.push(value("authorization"));
                seen.bodies.push(body);
                // A body the report must not copy either.
                (
                    StatusCode::BAD_REQUEST,
                    "echo: sk-header-secret prompt-body-secret",
                )
            }
        }),
    );
    let server = Server::start(app).await;
    let dir = std::env::temp_dir().join(format!("ratecheck-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let body_file = dir.join("body.json");
    std::fs::write(
        &body_file,
        r#"{"model":"m","messages":[{"role":"user","content":"prompt-body-secret"}]}"#,
    )
    .expect("write body");
    let url = format!(
        "http://user:pw-url-secret@{}/v1/chat?api_key=query-token-secret#fragment-secret",
        server.addr
    );
    let (config, report) = ratecheck(&[
        "--url",
        &url,
        "--method",
        "POST",
        "--header",
        "X-Api-Key: sk-header-secret",
        "-H",
        "Content-Type: application/json",
        "--body-file",
        body_file.to_str().expect("utf-8 temp path"),
        "--mode",
        "burst",
        "--rpm",
        "3",
    ])
    .await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);

    // The secrets were sent...
    let seen = seen.lock();
    assert_eq!(seen.api_keys, vec!["sk-header-secret"; 3]);
    assert!(
        seen.authorizations.iter().all(|a| a.starts_with("Basic ")),
        "{:?}",
        seen.authorizations
    );
    assert!(
        seen.bodies
            .iter()
            .all(|b| b.windows(18).any(|w| w == b"prompt-body-secret"))
    );

    // ...and appear in nothing ratecheck shows.
    let json = serde_json::to_string_pretty(&report).expect("report serializes");
    let text = report::summary_text(&report);
    let debug = format!("{config:?}");
    for secret in SECRETS {
        assert!(!json.contains(secret), "{secret} in the report:\n{json}");
        assert!(!text.contains(secret), "{secret} in the summary:\n{text}");
        assert!(
            !debug.contains(secret),
            "{secret} in the config's Debug:\n{debug}"
        );
    }
    assert!(!json.contains("Basic "), "{json}");
    assert_eq!(
        report.target,
        format!("http://{}/v1/chat", server_addr(&url))
    );
    assert_eq!(report.request.header_names, ["x-api-key", "content-type"]);
    assert_eq!(report.summary.actual_requests, 3);
    assert_eq!(report.summary.other_failure, 3, "a 400 is a failure...");
    assert_eq!(report.summary.refused, 0, "...but not a refusal");
    assert_eq!(report.errors.status["400"], 3);
}

fn server_addr(url: &str) -> &str {
    let rest = url.split('@').nth(1).unwrap_or_default();
    rest.split('/').next().unwrap_or_default()
}

#[tokio::test]
async fn concurrency_caps_requests_in_flight() {
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (n, m) = (now.clone(), most.clone());
    let app = Router::new().route(
        "/v1/chat",
        any(move || {
            let (now, most) = (n.clone(), m.clone());
            async move {
                let inflight = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(inflight, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                "ok"
            }
        }),
    );
    let server = Server::start(app).await;
    let url = server.url("/v1/chat");
    let (_, report) = ratecheck(&[
        "--url",
        &url,
        "--mode",
        "burst",
        "--rpm",
        "12",
        "--concurrency",
        "3",
    ])
    .await;
    server.stop().await;
    assert_eq!(report.summary.success, 12);
    assert!(
        most.load(Ordering::SeqCst) <= 3,
        "{}",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(report.run.concurrency, 3);
}

#[tokio::test]
async fn sustained_runs_send_what_was_planned() {
    let server = Server::start(limited(Quota::new(1000, WINDOW).expect("quota"))).await;
    let url = server.url("/v1/chat");
    let (_, report) = ratecheck(&[
        "--url",
        &url,
        "--rpm",
        "10",
        "--window",
        "1s",
        "--duration",
        "1500ms",
    ])
    .await;
    server.stop().await;
    assert_eq!(report.run.planned_requests, 15);
    assert_eq!(report.summary.actual_requests, 15);
    assert_eq!(report.summary.success, 15);
    assert!(report.mode_detail.is_none());
    assert!(report.summary.latency_ms.is_some());
}

#[tokio::test]
async fn an_unreachable_target_is_reported_as_transport_failures() {
    // A port that was free a moment ago, and is closed now.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let url = format!("http://{addr}/");
    let (_, report) = ratecheck(&["--url", &url, "--mode", "burst", "--rpm", "3"]).await;
    assert_eq!(report.summary.actual_requests, 3);
    assert_eq!(report.summary.other_failure, 3);
    assert_eq!(report.summary.refused, 0);
    assert_eq!(report.errors.transport["connect"], 3);
    assert!(report.summary.latency_ms.is_none());
}

#[test]
fn a_body_file_past_16_mib_is_refused_without_reading_it_all() {
    let args = |file: &str| {
        [
            "ratecheck",
            "--url",
            "http://127.0.0.1:9/",
            "--mode",
            "burst",
            "--rpm",
            "3",
            "--body-file",
            file,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    // An endless file: refused at the cap, not read until memory runs out.
    #[cfg(unix)]
    {
        let error = Config::from_args(args("/dev/zero")).expect_err("refused");
        assert!(
            error.0.contains("--body-file") && error.0.contains("16 MiB"),
            "{error}"
        );
    }
    let path = std::env::temp_dir().join(format!("ratecheck-big-body-{}", std::process::id()));
    let file = std::fs::File::create(&path).expect("a temporary file");
    file.set_len(cli::MAX_BODY_FILE + 1).expect("a sparse file");
    let error = Config::from_args(args(path.to_str().expect("utf-8"))).expect_err("refused");
    assert!(error.0.contains("larger than"), "{error}");
    file.set_len(cli::MAX_BODY_FILE).expect("a sparse file");
    let config = Config::from_args(args(path.to_str().expect("utf-8")));
    let _ = std::fs::remove_file(&path);
    assert!(config.is_ok(), "exactly the cap is taken");
}
