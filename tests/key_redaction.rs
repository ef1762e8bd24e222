//! Key text that can be a secret (an API key, a bearer token, a client
//! address) never appears as it is in an error, a response, a stats name or
//! a log line: only its fingerprint does. Keys that are not secret (model
//! names) are shown as they are, and each extractor can be told otherwise.

#![cfg(feature = "test-util")]

use testkit::capture;

#[allow(dead_code)]
// The example needs the `axum` feature (its `required-features`).
#[cfg(feature = "axum")]
#[path = "../examples/axum_server.rs"]
mod axum_server;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use capture::{capture_logs, log_text};
use http::{Request, Response, StatusCode};
use tokio_test::{assert_pending, task};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::{BoxError, CoolingDown, QueueFull, QueueTimeout, RateLimited};
use tower_throttle::key::{
    ClientIpKey, HeaderKey, JsonFieldKey, KeyExtractor, Secret, key_label, key_text,
};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::redact::fingerprint;
use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};

/// Where a request's secret key comes from: how to put it in a request,
/// and the extractor that reads it.
#[derive(Clone, Copy, Debug)]
enum Source {
    ApiKey,
    Bearer,
    ClientIp,
}

impl Source {
    /// A request carrying `secret` there.
    fn request(self, secret: &str) -> Request<String> {
        let mut req = Request::builder().uri("/v1/chat");
        match self {
            Self::ApiKey => req = req.header("x-api-key", secret),
            Self::Bearer => req = req.header("authorization", format!("Bearer {secret}")),
            Self::ClientIp => {}
        }
        let mut req = req.body(String::new()).unwrap();
        if let Self::ClientIp = self {
            let addr: SocketAddr = format!("{secret}:4711").parse().unwrap();
            req.extensions_mut().insert(addr);
        }
        req
    }

    /// The text the key holds.
    fn key_text(self, secret: &str) -> String {
        match self {
            Self::Bearer => format!("Bearer {secret}"),
            _ => secret.to_owned(),
        }
    }
}

/// The extractor for a [`Source`]; the default of each, no opt-in.
#[derive(Clone, Debug)]
enum AnyKey {
    Header(HeaderKey),
    Ip(ClientIpKey),
}

impl AnyKey {
    fn of(source: Source) -> Self {
        match source {
            Source::ApiKey => Self::Header(HeaderKey::new("x-api-key").unwrap()),
            Source::Bearer => Self::Header(HeaderKey::new("authorization").unwrap()),
            Source::ClientIp => Self::Ip(ClientIpKey::new()),
        }
    }
}

impl<B> KeyExtractor<Request<B>> for AnyKey {
    fn extract(
        &self,
        req: &Request<B>,
        key: &mut tower_throttle::key::KeyBuilder<'_>,
    ) -> Result<(), tower_throttle::error::KeyError> {
        match self {
            Self::Header(x) => x.extract(req, key),
            Self::Ip(x) => x.extract(req, key),
        }
    }
}

fn ok(_req: Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>> {
    std::future::ready(Ok(Response::new("ok".to_owned())))
}

/// Asserts that `shown` names the secret by its fingerprint only.
fn assert_fingerprint_only(what: &str, shown: &str, secret: &str, fp: &str) {
    assert!(
        shown.contains(fp),
        "{what} lacks the fingerprint {fp}: {shown:?}"
    );
    assert!(
        !shown.contains(secret),
        "{what} shows the secret: {shown:?}"
    );
}

/// Every refusal of every layer for a request keyed by `source`: its
/// `Display` and `Debug`, the stats names, the cooldown list, the 429
/// response, and the log lines show the fingerprint, never the key.
async fn secret_never_shown(source: Source, secret: &str) {
    capture_logs();
    let fp = fingerprint(source.key_text(secret)).to_string();
    let check = |what: &str, shown: &str| assert_fingerprint_only(what, shown, secret, &fp);
    check(
        "key_label",
        &key_label(&AnyKey::of(source), &source.request(secret)).unwrap(),
    );

    // Rate limit: the refusal, its stats name, and the 429 response.
    let limit = RateLimitLayer::new(Quota::per_minute(1).unwrap(), AnyKey::of(source))
        .with_key_stats(10)
        .with_response_headers(RateLimitHeaders::both());
    let handle = limit.handle();
    let mut svc = limit.layer(service_fn(ok));
    svc.ready()
        .await
        .unwrap()
        .call(source.request(secret))
        .await
        .unwrap();
    let refused = svc
        .ready()
        .await
        .unwrap()
        .call(source.request(secret))
        .await;
    let refused = refused.unwrap_err();
    let limited = refused.downcast_ref::<RateLimited>().unwrap();
    check("RateLimited::key", &limited.key);
    check("RateLimited Display", &limited.to_string());
    check("RateLimited Debug", &format!("{limited:?}"));
    let names: Vec<String> = handle.stats().keys.into_iter().map(|k| k.key).collect();
    assert_eq!(names, [fp.as_str()], "rate-limit stats names");

    let mut server = ThrottleResponseLayer::new()
        .with_headers(RateLimitHeaders::both())
        .layer(svc);
    let response = server
        .ready()
        .await
        .unwrap()
        .call(source.request(secret))
        .await;
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    for (name, value) in response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains(secret),
            "header {name} shows the secret: {value}"
        );
    }
    check("429 body", response.body());

    // Concurrency: a request that waits and times out, and one refused
    // for a full queue.
    let concurrency = ConcurrencyLayer::new(1, AnyKey::of(source))
        .unwrap()
        .with_max_queue(1)
        .with_queue_timeout(Duration::from_secs(1))
        .with_key_stats(10);
    let handle = concurrency.handle();
    let svc = concurrency.layer(service_fn(ok));
    let held = svc.clone().oneshot(source.request(secret)).await.unwrap();
    let mut waiting = task::spawn(svc.clone().oneshot(source.request(secret)));
    assert_pending!(waiting.poll());
    let full = svc
        .clone()
        .oneshot(source.request(secret))
        .await
        .unwrap_err();
    let full = full.downcast_ref::<QueueFull>().unwrap();
    check("QueueFull Display", &full.to_string());
    check("QueueFull Debug", &format!("{full:?}"));
    let timed_out = waiting.await.unwrap_err();
    let timed_out = timed_out.downcast_ref::<QueueTimeout>().unwrap();
    check("QueueTimeout Display", &timed_out.to_string());
    drop(held);
    let names: Vec<String> = handle.stats().keys.into_iter().map(|k| k.key).collect();
    assert_eq!(names, [fp.as_str()], "concurrency stats names");

    // Backoff: a 429 from upstream cools the key down.
    let backoff = Backoff429Layer::new(AnyKey::of(source)).with_key_stats(10);
    let handle = backoff.handle();
    let mut svc = backoff.layer(service_fn(|_req: Request<String>| async {
        let mut response = Response::new(String::new());
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
            .headers_mut()
            .insert("retry-after", http::HeaderValue::from_static("5"));
        Ok::<_, Infallible>(response)
    }));
    svc.ready()
        .await
        .unwrap()
        .call(source.request(secret))
        .await
        .unwrap();
    let cooling = svc
        .ready()
        .await
        .unwrap()
        .call(source.request(secret))
        .await;
    let cooling = cooling.unwrap_err();
    let cooling = cooling.downcast_ref::<CoolingDown>().unwrap();
    check("CoolingDown Display", &cooling.to_string());
    let cooldowns: Vec<String> = handle.cooldowns().into_iter().map(|c| c.key).collect();
    assert_eq!(cooldowns, [fp.as_str()], "cooldown list");
    let names: Vec<String> = handle
        .stats()
        .requests
        .keys
        .into_iter()
        .map(|k| k.key)
        .collect();
    assert_eq!(names, [fp.as_str()], "backoff stats names");

    // The layers' log lines: the fingerprint, never the key.
    let logs = log_text();
    assert!(!logs.contains(secret), "the log shows the secret:\n{logs}");
    for event in [
        "rate limit: refused",
        "concurrency: waiting for a permit",
        "concurrency: queue full",
        "concurrency: queue timeout",
        "backoff: route cooling down",
        "backoff: refused while cooling down",
    ] {
        assert!(
            logs.lines().any(|l| l.contains(event) && l.contains(&fp)),
            "no `{event}` line naming {fp}:\n{logs}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_api_key_header_is_shown_only_as_its_fingerprint() {
    secret_never_shown(Source::ApiKey, "sk-live-4f9a2c7e1b").await;
}

#[tokio::test(start_paused = true)]
async fn an_authorization_header_is_shown_only_as_its_fingerprint() {
    secret_never_shown(Source::Bearer, "tok-8d1e5b3a90").await;
}

#[tokio::test(start_paused = true)]
async fn a_client_address_is_shown_only_as_its_fingerprint() {
    secret_never_shown(Source::ClientIp, "198.51.100.73").await;
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn the_axum_example_refuses_with_a_fingerprint_never_the_api_key() {
    capture_logs();
    const KEY: &str = "sk-demo-77c0ffee13";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum_server::app().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await
    });
    let client = reqwest::Client::new();
    let expensive = || {
        client
            .post(format!("{base}/expensive"))
            .header("x-api-key", KEY)
            .send()
    };
    for _ in 0..5 {
        assert_eq!(expensive().await.unwrap().status(), 200);
    }
    let refused = expensive().await.unwrap();
    assert_eq!(refused.status(), 429);
    for (name, value) in refused.headers() {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(!value.contains(KEY), "header {name} shows the key: {value}");
    }
    let body = refused.text().await.unwrap();
    let fp = fingerprint(KEY).to_string();
    assert!(
        body.contains(&format!("`/expensive/{fp}`")),
        "the body names the key by its fingerprint: {body}"
    );
    assert!(!body.contains(KEY), "the body shows the key: {body}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    assert!(!log_text().contains(KEY), "the log shows the key");
}

#[test]
fn keys_that_are_not_secret_show_as_they_are_and_each_extractor_can_say_otherwise() {
    let req = Request::builder()
        .header("x-api-key", "team-blue")
        .header("x-user", "ada@example.com")
        .header("x-model", "gpt-4o")
        .body(r#"{"model":"gpt-4o","api_key":"sk-in-body"}"#.to_owned())
        .unwrap();
    // Model names and other plain headers: as they are.
    assert_eq!(
        key_label(&JsonFieldKey::new("model"), &req).unwrap(),
        "gpt-4o"
    );
    assert_eq!(
        key_label(&HeaderKey::new("x-model").unwrap(), &req).unwrap(),
        "gpt-4o"
    );
    // A field or header named like a secret: its fingerprint...
    let fp = |text: &str| fingerprint(text).to_string();
    assert_eq!(
        key_label(&JsonFieldKey::new("api_key"), &req).unwrap(),
        fp("sk-in-body")
    );
    assert_eq!(
        key_label(&HeaderKey::new("x-api-key").unwrap(), &req).unwrap(),
        fp("team-blue")
    );
    // ...unless the user says it is not a secret.
    let shown = HeaderKey::new("x-api-key").unwrap().show_raw();
    assert_eq!(key_label(&shown, &req).unwrap(), "team-blue");
    let shown = JsonFieldKey::new("api_key").show_raw();
    assert_eq!(key_label(&shown, &req).unwrap(), "sk-in-body");
    // And the other way: a plain-looking header that identifies a person.
    let hidden = HeaderKey::new("x-user").unwrap().redact();
    assert_eq!(key_label(&hidden, &req).unwrap(), fp("ada@example.com"));
    let hidden = JsonFieldKey::new("model").redact();
    assert_eq!(key_label(&hidden, &req).unwrap(), fp("gpt-4o"));
    // A closure's part is plain unless wrapped in `Secret`.
    let user = |r: &Request<String>| r.headers().get("x-user").cloned().map(Secret);
    assert_eq!(key_label(&user, &req).unwrap(), fp("ada@example.com"));
    // A tuple mixes both, part by part; rules and `key_text` see the raw text.
    let route = (
        JsonFieldKey::new("model"),
        HeaderKey::new("x-api-key").unwrap(),
    );
    assert_eq!(
        key_label(&route, &req).unwrap(),
        format!("gpt-4o/{}", fp("team-blue"))
    );
    assert_eq!(key_text(&route, &req).unwrap(), "gpt-4o/team-blue");
    // An address: its fingerprint, or as it is when asked.
    let mut req = req;
    req.extensions_mut()
        .insert("203.0.113.5:80".parse::<SocketAddr>().unwrap());
    assert_eq!(
        key_label(&ClientIpKey::new(), &req).unwrap(),
        fp("203.0.113.5")
    );
    assert_eq!(
        key_label(&ClientIpKey::new().show_raw(), &req).unwrap(),
        "203.0.113.5"
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_opt_in_a_refusal_names_the_model_and_the_api_key_as_they_are() {
    let key = (
        JsonFieldKey::new("model"),
        HeaderKey::new("x-api-key").unwrap().show_raw(),
    );
    let mut svc = RateLimitLayer::new(Quota::per_minute(1).unwrap(), key)
        .with_key_stats(10)
        .layer(service_fn(ok));
    let req = || {
        Request::builder()
            .header("x-api-key", "team-blue")
            .body(r#"{"model":"gpt-4o"}"#.to_owned())
            .unwrap()
    };
    svc.ready().await.unwrap().call(req()).await.unwrap();
    let refused: BoxError = svc.ready().await.unwrap().call(req()).await.unwrap_err();
    let limited = refused.downcast_ref::<RateLimited>().unwrap();
    assert_eq!(limited.key, "gpt-4o/team-blue");
    assert!(limited.to_string().contains("`gpt-4o/team-blue`"));
}
