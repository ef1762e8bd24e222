//! The layers around real HTTP clients (`reqwest::Client`, hyper-util's
//! client), against a local server.
#![cfg(feature = "reqwest")]

mod support;

use std::time::Duration;

use tower::{Layer, Service, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::{HostKey, JsonFieldKey, key_text};
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

/// Start an axum server on an ephemeral loopback port; it stops with the
/// returned sender.
async fn start_server() -> (String, tokio::sync::oneshot::Sender<()>) {
    let app = axum::Router::new().route("/v1/chat", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (format!("http://{addr}/v1/chat"), stop)
}

#[tokio::test]
async fn reqwest_client_is_limited_per_model_from_its_json_body() {
    let (url, stop) = start_server().await;
    let client = reqwest::Client::new();
    let mut svc = RateLimitLayer::new(
        Quota::per_minute(2).unwrap(),
        (HostKey, JsonFieldKey::new("model")),
    )
    .layer(client.clone());
    let chat = |model: &str| {
        client
            .post(&url)
            .body(format!(r#"{{"model":"{model}","messages":[]}}"#))
            .build()
            .unwrap()
    };
    assert_eq!(
        key_text(&JsonFieldKey::new("model"), &chat("m")).unwrap(),
        "m"
    );
    for _ in 0..2 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(chat("small"))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.text().await.unwrap(), "ok");
    }
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(chat("small"))
        .await
        .unwrap_err();
    let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
    assert_eq!(limited.key, "127.0.0.1/small");
    assert!(limited.retry_after <= Duration::from_secs(30));
    // Another model on the same host has its own budget.
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(chat("large"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let _ = stop.send(());
}

#[tokio::test]
async fn hyper_util_client_is_limited_and_its_errors_are_typed() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_throttle::key::GlobalKey;
    use tower_throttle::respond::Rejection;

    let (url, stop) = start_server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut svc = RateLimitLayer::new(Quota::per_minute(1).unwrap(), GlobalKey).layer(client);
    let chat = || {
        http::Request::post(&url)
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap()
    };
    let res = svc.ready().await.unwrap().call(chat()).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    let err = svc.ready().await.unwrap().call(chat()).await.unwrap_err();
    // Matched without knowing which layer refused.
    let rejection = Rejection::of(&err).expect("one of the crate's refusals");
    assert_eq!(rejection.code(), "rate_limited");
    assert_eq!(
        rejection.retry_after(),
        err.downcast_ref::<RateLimited>().map(|e| e.retry_after)
    );
    let _ = stop.send(());
}
