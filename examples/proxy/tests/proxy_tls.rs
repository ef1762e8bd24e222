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
    support::sim::settings_with(toml, &env)
}

async fn start(toml: &str) -> Running {
    support::sim::start_with(toml, &env).await
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

/// Provider `name` at `upstream`, trusting the CA in `ca_file`.
fn trusting(name: &str, upstream: &TlsUpstream, ca_file: &TempFile) -> String {
    config(
        name,
        &upstream.url(),
        &format!("ca_file = {}", ca_file.toml()),
    )
}

/// An HTTPS upstream speaking `alpn`, and the gateway trusting its CA; the
/// CA's file is returned to live as long as the test.
async fn trusted_upstream(alpn: Alpn) -> (TlsUpstream, Running, TempFile) {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, alpn).await;
    let ca_file = ca.ca_file();
    let running = start(&trusting("secure", &upstream, &ca_file)).await;
    (upstream, running, ca_file)
}

const CHAT: &str = r#"{"model":"m","messages":[]}"#;
const STREAM: &str = r#"{"model":"m","stream":true,"messages":[]}"#;

async fn forwards_plain_and_streamed_answers(alpn: Alpn, expected: http::Version) {
    let (upstream, running, _ca_file) = trusted_upstream(alpn).await;

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
    let (upstream, running, _ca_file) = trusted_upstream(alpn).await;
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
    assert!(lines[0].contains("unknown issuer"), "{}", lines[0]);
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
    let with = trusting("secure", &upstream, &ca_file);
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

#[tokio::test]
async fn insecure_skip_verify_on_a_remote_host_is_refused_unless_the_command_line_allows_it() {
    let remote = config(
        "remote",
        "https://api.example.com",
        "insecure_skip_verify = true",
    );
    // At start: refused, naming the field and the way out.
    let error = match gateway::start(settings(&remote), ([127, 0, 0, 1], 0).into(), "test").await {
        Ok(_) => panic!("started"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("providers[0].insecure_skip_verify")
            && error.contains("api.example.com")
            && error.contains("--allow-insecure"),
        "{error}"
    );
    // On reload: refused, and the running configuration stays.
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let local = config("local", &upstream.url(), "insecure_skip_verify = true");
    let running = start(&local).await;
    let error = running.gateway.apply(settings(&remote)).unwrap_err();
    assert!(error.to_string().contains("--allow-insecure"), "{error}");
    assert_eq!(post(&running, "/v1/chat/completions", CHAT).await.0, 200);
    running.shutdown().await;

    // With --allow-insecure: taken at start, and still on a reload.
    let mut allowed = settings(&remote);
    allowed.allow_insecure = true;
    let running = gateway::start(allowed, ([127, 0, 0, 1], 0).into(), "test")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    running
        .gateway
        .apply(settings(&remote))
        .expect("the command line's allowance outlives a reload");
    running.shutdown().await;
}

#[tokio::test]
async fn stats_show_a_provider_whose_certificate_is_not_checked() {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let ca_file = ca.ca_file();
    let toml = format!(
        "{}{}",
        config("unchecked", &upstream.url(), "insecure_skip_verify = true"),
        trusting("checked", &upstream, &ca_file),
    );
    let running = start(&toml).await;
    let text = reqwest::get(format!("{}/stats", running.url()))
        .await
        .expect("stats answer")
        .text()
        .await
        .expect("a whole body");
    let stats: Value = serde_json::from_str(&text).expect("stats are JSON");
    let flag = |name: &str| {
        stats["providers"]
            .as_array()
            .expect("providers")
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["insecure_skip_verify"].clone())
    };
    assert_eq!(flag("unchecked"), Some(Value::Bool(true)));
    assert_eq!(flag("checked"), Some(Value::Bool(false)));
    running.shutdown().await;
}

#[test]
fn loopback_hosts_are_named_or_numeric_loopback_only() {
    use proxy::config::is_loopback_host;
    for host in ["127.0.0.1", "127.8.9.10", "[::1]", "localhost", "LOCALHOST"] {
        assert!(is_loopback_host(host), "{host}");
    }
    for host in [
        "api.openai.com",
        "10.0.0.1",
        "[::2]",
        "localhost.example.com",
        "127.0.0.1.nip.io",
        "0.0.0.0",
        "[::ffff:127.0.0.1]",
    ] {
        assert!(!is_loopback_host(host), "{host}");
    }
}

/// A 502 `upstream_tls` for `ca`'s upstream, trusted through its CA, and
/// the one log line naming the provider, which must say `reason`.
async fn refused_with_reason(ca: TestCa, provider: &str, reason: &str) {
    capture_logs();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let ca_file = ca.ca_file();
    let running = start(&config(
        provider,
        &upstream.url(),
        &format!("ca_file = {}", ca_file.toml()),
    ))
    .await;
    let (status, body) = post(&running, "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 502, "{body}");
    let json: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["error"]["code"], "upstream_tls", "{body}");
    assert!(upstream.versions().is_empty(), "nothing was sent");
    let logs = log_text();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(provider) && l.contains("WARN"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains(reason), "{}", lines[0]);
    running.shutdown().await;
}

#[tokio::test]
async fn an_expired_certificate_is_a_502_upstream_tls_saying_it_expired() {
    refused_with_reason(TestCa::expired(), "expired-upstream", "expired").await;
}

#[tokio::test]
async fn a_certificate_for_another_name_is_a_502_upstream_tls_saying_name_mismatch() {
    refused_with_reason(
        TestCa::for_names(&["other.example"]),
        "misnamed-upstream",
        "name mismatch",
    )
    .await;
}
