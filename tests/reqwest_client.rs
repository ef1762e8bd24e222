//! The rate limiter around a real `reqwest::Client`, against a local server.
#![cfg(feature = "reqwest")]

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
