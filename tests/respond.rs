//! Server side: refusals become 429/503 responses with `Retry-After`, the
//! rate-limit headers and a JSON body, checked over real sockets.

#![cfg(feature = "test-util")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tower::ServiceBuilder;
#[cfg(feature = "axum")]
use tower_throttle::key::ClientIpKey;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::redact::fingerprint;
use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};

/// Serve `app` on an ephemeral loopback port, with connect info; it stops
/// when the returned sender is dropped or fired.
async fn serve(app: Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (format!("http://{addr}"), stop)
}

fn header(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_refusal_is_a_429_with_retry_after_headers_and_json() {
    let limit = RateLimitLayer::new(
        Quota::per_minute(2).unwrap(),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .with_rule(
        Rule::new("strict", KeyPattern::text("trial").unwrap())
            .with_quota(Quota::per_hour(1).unwrap()),
    )
    .unwrap()
    .with_response_headers(RateLimitHeaders::both());
    let app = Router::new().route("/", get(|| async { "hello" })).layer(
        ServiceBuilder::new()
            .layer(ThrottleResponseLayer::new().with_headers(RateLimitHeaders::both()))
            .layer(limit),
    );
    let (base, stop) = serve(app).await;
    let client = reqwest::Client::new();
    let get = |key: &'static str| client.get(&base).header("x-api-key", key).send();

    let first = get("alice").await.unwrap();
    assert_eq!(first.status(), 200);
    // Admitted responses say what remains.
    assert_eq!(
        header(&first, "ratelimit-policy"),
        r#""(default)";q=2;w=60"#
    );
    assert_eq!(header(&first, "ratelimit"), r#""(default)";r=1;t=30"#);
    assert_eq!(header(&first, "x-ratelimit-remaining"), "1");
    assert_eq!(first.text().await.unwrap(), "hello");
    assert_eq!(get("alice").await.unwrap().status(), 200);

    let refused = get("alice").await.unwrap();
    assert_eq!(refused.status(), 429);
    // One unit per 30 s: the next is 30 s away, rounded up to whole seconds.
    assert_eq!(header(&refused, "retry-after"), "30");
    assert_eq!(header(&refused, "ratelimit"), r#""(default)";r=0;t=30"#);
    assert_eq!(header(&refused, "x-ratelimit-limit"), "2");
    assert_eq!(header(&refused, "x-ratelimit-reset"), "30");
    assert_eq!(header(&refused, "content-type"), "application/json");
    let body: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    let retry = body["error"]["retry_after"].as_f64().unwrap();
    assert!(retry > 29.0 && retry <= 30.0, "{retry}");
    // The API key is a secret: the message names its fingerprint.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("`{}`", fingerprint("alice"))),
        "{message}"
    );
    assert!(!message.contains("alice"), "{message}");

    // The stricter rule's policy and window.
    assert_eq!(get("trial").await.unwrap().status(), 200);
    let refused = get("trial").await.unwrap();
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        r#""strict";q=1;w=3600"#
    );
    assert_eq!(header(&refused, "retry-after"), "3600");

    // No key: 400, saying what is missing.
    let missing = client.get(&base).send().await.unwrap();
    assert_eq!(missing.status(), 400);
    let body: serde_json::Value = serde_json::from_str(&missing.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "missing_key");
    let _ = stop.send(());
}

#[tokio::test]
async fn a_closure_can_build_the_whole_response() {
    let app = Router::new().route("/", get(|| async { "hello" })).layer(
        ServiceBuilder::new()
            .layer(ThrottleResponseLayer::new().with_response(
                |rejection: &tower_throttle::respond::Rejection<'_>| {
                    http::Response::builder()
                        .status(rejection.status())
                        .header("content-type", "text/plain")
                        .body(axum::body::Body::from(format!(
                            "slow down ({})",
                            rejection.code()
                        )))
                        .unwrap()
                },
            ))
            .layer(RateLimitLayer::new(
                Quota::per_minute(1).unwrap(),
                tower_throttle::key::GlobalKey,
            )),
    );
    let (base, stop) = serve(app).await;
    let client = reqwest::Client::new();
    assert_eq!(client.get(&base).send().await.unwrap().status(), 200);
    let refused = client.get(&base).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after"), "60");
    assert_eq!(refused.text().await.unwrap(), "slow down (rate_limited)");
    let _ = stop.send(());
}

// The peer address comes from axum's `ConnectInfo` (feature `axum`).
#[cfg(feature = "axum")]
#[tokio::test]
async fn client_ip_keys_trust_forwarded_headers_only_when_told() {
    let app = |trust: usize| {
        Router::new().route("/", get(|| async { "hello" })).layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(RateLimitLayer::new(
                    Quota::per_minute(1).unwrap(),
                    ClientIpKey::new().trust_proxies(trust),
                )),
        )
    };
    let client = reqwest::Client::new();
    // Not trusted: a client cannot spread itself over made-up addresses.
    let (base, stop) = serve(app(0)).await;
    let from = |ip: &str| {
        client
            .get(&base)
            .header("x-forwarded-for", ip.to_owned())
            .send()
    };
    assert_eq!(from("203.0.113.1").await.unwrap().status(), 200);
    assert_eq!(from("203.0.113.2").await.unwrap().status(), 429);
    let _ = stop.send(());
    // Behind one trusted proxy: the address it appended is the client.
    let (base, stop) = serve(app(1)).await;
    let from = |ip: &str| {
        client
            .get(&base)
            .header("x-forwarded-for", ip.to_owned())
            .send()
    };
    assert_eq!(
        from("198.51.100.9, 203.0.113.1").await.unwrap().status(),
        200
    );
    assert_eq!(
        from("198.51.100.9, 203.0.113.2").await.unwrap().status(),
        200
    );
    let refused = from("10.9.9.9, 203.0.113.1").await.unwrap();
    assert_eq!(
        refused.status(),
        429,
        "a spoofed first entry changes nothing"
    );
    let body: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    // An address is shown as its fingerprint, never as it is.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&fingerprint("203.0.113.1").to_string()),
        "{message}"
    );
    assert!(!message.contains("203.0.113"), "{message}");
    let _ = stop.send(());
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// One name for the default quotas everywhere: the header of a refusal that
/// names no rule (a `RateLimited` made by hand, or by another layer) says
/// what admitted responses and the docs say, `(default)`.
#[tokio::test]
async fn a_refusal_without_a_policy_names_the_default_policy_like_every_other_header() {
    use tower_throttle::error::RateLimited;

    let svc = ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .service_fn(|_req: http::Request<()>| async {
            // A quota, but no rule named: made by another layer.
            let mut refused = RateLimited::new("k".into(), Duration::from_secs(2));
            refused.quota = Some(Quota::per_minute(30).unwrap());
            Err::<http::Response<String>, _>(tower_throttle::BoxError::from(refused))
        });
    let refused = tower::ServiceExt::oneshot(svc, http::Request::new(()))
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["ratelimit"], r#""(default)";r=0;t=2"#);
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""(default)";q=30;w=60"#
    );
}

/// A layer outside can tell a refusal from the inner service's own 429:
/// refusals carry `Refused` (code and policy) in their extensions, answers
/// do not.
#[tokio::test]
async fn a_refusal_response_carries_what_refused_in_its_extensions() {
    use tower_throttle::error::RateLimited;
    use tower_throttle::respond::Refused;

    let svc = ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .service_fn(|req: http::Request<()>| async move {
            if req.uri().path() == "/own" {
                let mut own = http::Response::new(String::new());
                *own.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                return Ok(own);
            }
            let mut refused = RateLimited::new("k".into(), Duration::from_secs(2));
            refused.policy = Some("per-user".into());
            Err::<http::Response<String>, _>(tower_throttle::BoxError::from(refused))
        });
    let refused = tower::ServiceExt::oneshot(svc.clone(), http::Request::new(()))
        .await
        .unwrap();
    assert_eq!(
        refused.extensions().get::<Refused>(),
        Some(&Refused::new("rate_limited").with_policy("per-user"))
    );
    let own = http::Request::builder().uri("/own").body(()).unwrap();
    let own = tower::ServiceExt::oneshot(svc, own).await.unwrap();
    assert_eq!(own.status(), 429);
    assert_eq!(own.extensions().get::<Refused>(), None);
}

/// Of several limits, the body names the one that refused (its layer's
/// `with_name`), and says nothing of a layer without a name.
#[tokio::test]
async fn the_body_names_the_limit_that_refused() {
    use tower_throttle::error::RateLimited;

    let svc = ServiceBuilder::new()
        .layer(ThrottleResponseLayer::new())
        .service_fn(|req: http::Request<()>| async move {
            let mut refused = RateLimited::new("k".into(), Duration::from_secs(2));
            if req.uri().path() == "/named" {
                refused.limit = Some("per-client".into());
            }
            Err::<http::Response<String>, _>(tower_throttle::BoxError::from(refused))
        });
    let body = |r: http::Response<String>| -> serde_json::Value {
        serde_json::from_str(r.body()).unwrap()
    };
    let named = http::Request::builder().uri("/named").body(()).unwrap();
    let named = tower::ServiceExt::oneshot(svc.clone(), named)
        .await
        .unwrap();
    assert_eq!(
        named.extensions().get::<tower_throttle::respond::Refused>(),
        Some(&tower_throttle::respond::Refused::new("rate_limited").with_limit("per-client"))
    );
    assert_eq!(body(named)["error"]["limit"], "per-client");
    let plain = tower::ServiceExt::oneshot(svc, http::Request::new(()))
        .await
        .unwrap();
    assert!(body(plain)["error"].get("limit").is_none());
}
