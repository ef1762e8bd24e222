//! The `proxy` example in front of HTTPS upstreams: a local upstream with a
//! certificate made at test time (`support/tls_upstream.rs`), trusted through the
//! provider's `ca_file`. Plain and streamed answers over HTTP/1.1 and
//! HTTP/2, connections reused, an untrusted certificate refused with `502
//! upstream_tls`, the TLS fields checked and live on reload.

use testkit::capture;
mod support;
use testkit::tls_upstream;

use proxy::{config, gateway};

use std::time::Duration;

use serde_json::Value;

use crate::capture::{capture_logs, log_text};
use crate::config::Settings;
use crate::gateway::Running;
use crate::tls_upstream::{Alpn, STREAM_CHUNKS, TempFile, TestCa, TlsUpstream};

/// The API key the provider is given: never in a log.
const KEY: &str = "sk-tls-test-secret-key";

fn env(name: &str) -> Option<String> {
    (name == "TLS_TEST_KEY").then(|| KEY.to_owned())
}

/// A gateway with one provider `name` at `base_url`, and `extra` lines in
/// its `[[providers]]` entry.
fn config(name: &str, base_url: &str, extra: &str) -> String {
    format!(
        "[[providers]]\nname = \"{name}\"\nbase_url = \"{base_url}\"\napi_key_env = \"TLS_TEST_KEY\"\n{extra}\n"
    )
}

fn settings(toml: &str) -> Settings {
    Settings::from_toml(toml, &env).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

async fn start(toml: &str) -> Running {
    gateway::start(settings(toml), ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// POST `body` to the gateway's `path`; status and body text, bounded so a
/// hang fails the test.
async fn post(running: &Running, path: &str, body: &str) -> (u16, String) {
    let client = reqwest::Client::new();
    let exchange = async {
        let response = client
            .post(format!("{}{path}", running.url()))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("the gateway answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("a whole body"))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer within 10 s")
}

const CHAT: &str = r#"{"model":"m","messages":[]}"#;
const STREAM: &str = r#"{"model":"m","stream":true,"messages":[]}"#;

async fn forwards_plain_and_streamed_answers(alpn: Alpn, expected: http::Version) {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, alpn).await;
    let ca_file = ca.ca_file();
    let running = start(&config(
        "secure",
        &upstream.url(),
        &format!("ca_file = {}", ca_file.toml()),
    ))
    .await;

    let (status, body) = post(&running, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["protocol"], format!("{expected:?}"));

    let (status, body) = post(&running, "/v1/chat/completions", STREAM).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, STREAM_CHUNKS.concat());

    assert_eq!(upstream.versions(), vec![expected, expected]);
    running.shutdown().await;
}

#[tokio::test]
async fn https_upstream_on_http1_gets_plain_and_streamed_answers_through() {
    forwards_plain_and_streamed_answers(Alpn::Http1, http::Version::HTTP_11).await;
}

#[tokio::test]
async fn https_upstream_offering_http2_is_spoken_to_in_http2() {
    forwards_plain_and_streamed_answers(Alpn::Http2, http::Version::HTTP_2).await;
}

async fn five_requests_take_one_connection(alpn: Alpn) {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, alpn).await;
    let ca_file = ca.ca_file();
    let running = start(&config(
        "secure",
        &upstream.url(),
        &format!("ca_file = {}", ca_file.toml()),
    ))
    .await;
    for _ in 0..5 {
        let (status, body) = post(&running, "/v1/chat/completions", CHAT).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(upstream.versions().len(), 5);
    assert_eq!(upstream.connections(), 1, "one TLS connection, reused");
    running.shutdown().await;
}

#[tokio::test]
async fn https_connections_are_reused_across_requests_on_http1() {
    five_requests_take_one_connection(Alpn::Http1).await;
}

#[tokio::test]
async fn https_connections_are_reused_across_requests_on_http2() {
    five_requests_take_one_connection(Alpn::Http2).await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_502_upstream_tls_and_one_log_line_naming_the_provider() {
    capture_logs();
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http2).await;
    // No ca_file: the test CA is not among the web roots.
    let running = start(&config("untrusted-upstream", &upstream.url(), "")).await;

    let (status, body) = post(&running, "/v1/chat/completions?token=query-secret", CHAT).await;
    assert_eq!(status, 502, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["error"]["code"], "upstream_tls", "{body}");
    assert_eq!(upstream.connections(), 0, "no handshake completed");
    assert!(upstream.versions().is_empty(), "nothing was sent");

    let logs = log_text();
    // One line at INFO or above (the handler's DEBUG line of every
    // request is not for the operator).
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("untrusted-upstream"))
        .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("TLS"), "{}", lines[0]);
    assert!(!logs.contains(KEY), "the key is never logged");
    assert!(!logs.contains("query-secret"), "the query is never logged");
    running.shutdown().await;
}

#[tokio::test]
async fn insecure_skip_verify_takes_any_certificate_and_warns_naming_the_provider() {
    capture_logs();
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let running = start(&config(
        "insecure-upstream",
        &upstream.url(),
        "insecure_skip_verify = true",
    ))
    .await;
    let (status, body) = post(&running, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200, "{body}");
    let logs = log_text();
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("insecure-upstream")
            && l.contains("insecure_skip_verify")),
        "{logs}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_reload_that_adds_or_removes_the_ca_file_takes_effect() {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http2).await;
    let ca_file = ca.ca_file();
    let without = config("secure", &upstream.url(), "");
    let with = config(
        "secure",
        &upstream.url(),
        &format!("ca_file = {}", ca_file.toml()),
    );
    let running = start(&without).await;
    assert_eq!(post(&running, "/v1/chat/completions", CHAT).await.0, 502);

    running.gateway.apply(settings(&with)).expect("reload");
    let (status, body) = post(&running, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200, "{body}");

    running.gateway.apply(settings(&without)).expect("reload");
    assert_eq!(post(&running, "/v1/chat/completions", CHAT).await.0, 502);
    running.shutdown().await;
}

#[tokio::test]
async fn a_reload_to_another_https_upstream_with_its_own_ca_takes_effect() {
    let (ca_a, ca_b) = (TestCa::new(), TestCa::new());
    let a = TlsUpstream::start(&ca_a, Alpn::Http1).await;
    let b = TlsUpstream::start(&ca_b, Alpn::Http1).await;
    let (file_a, file_b) = (ca_a.ca_file(), ca_b.ca_file());
    let running = start(&config(
        "secure",
        &a.url(),
        &format!("ca_file = {}", file_a.toml()),
    ))
    .await;
    assert_eq!(post(&running, "/v1/chat/completions", CHAT).await.0, 200);
    let to_b = config("secure", &b.url(), &format!("ca_file = {}", file_b.toml()));
    running.gateway.apply(settings(&to_b)).expect("reload");
    assert_eq!(post(&running, "/v1/chat/completions", CHAT).await.0, 200);
    assert_eq!((a.versions().len(), b.versions().len()), (1, 1));
    running.shutdown().await;
}

/// The field a config error names, or a panic showing the config.
fn config_error(toml: &str) -> String {
    match Settings::from_toml(toml, &env) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tls_field_problems_are_config_errors_naming_the_field() {
    let https = "https://127.0.0.1:9";
    let missing = std::env::temp_dir().join("tower-throttle-no-such-ca.pem");
    let missing = format!("ca_file = {:?}", missing.display().to_string());
    let not_pem = TempFile::with(b"not a certificate");
    let bad_der = TempFile::with(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    let ca_file = TestCa::new().ca_file();
    for (base_url, extra, field, says) in [
        (
            https,
            missing.as_str(),
            "providers[0].ca_file",
            "cannot read",
        ),
        (
            https,
            &format!("ca_file = {}", not_pem.toml()),
            "providers[0].ca_file",
            "BEGIN CERTIFICATE",
        ),
        (
            https,
            &format!("ca_file = {}", bad_der.toml()),
            "providers[0].ca_file",
            "cannot be trusted",
        ),
        (
            "http://127.0.0.1:9",
            &format!("ca_file = {}", ca_file.toml()),
            "providers[0].ca_file",
            "https://",
        ),
        (
            "http://127.0.0.1:9",
            "insecure_skip_verify = true",
            "providers[0].insecure_skip_verify",
            "https://",
        ),
        (
            https,
            &format!("insecure_skip_verify = true\nca_file = {}", ca_file.toml()),
            "providers[0].insecure_skip_verify",
            "ca_file",
        ),
        ("ftp://127.0.0.1:9", "", "providers[0].base_url", "https://"),
    ] {
        let error = config_error(&config("p", base_url, extra));
        assert!(error.contains(field), "{field}: {error}");
        assert!(error.contains(says), "{says}: {error}");
    }
    // And the good ones pass.
    settings(&config(
        "p",
        https,
        &format!("ca_file = {}", ca_file.toml()),
    ));
    settings(&config("p", https, ""));
}
