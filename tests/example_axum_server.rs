//! The `axum_server` example, served on an ephemeral loopback port.
// The example requires the feature (Cargo.toml): without it every request
// would be refused for want of the client address.
#![cfg(feature = "axum")]

#[path = "../examples/axum_server.rs"]
mod axum_server;

#[tokio::test]
async fn the_example_limits_the_expensive_path_per_api_key() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(axum_server::run(
        listener,
        axum_server::serve::ServeLimits::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::new();
    let expensive = |key: &'static str| {
        client
            .post(format!("{base}/expensive"))
            .header("x-api-key", key)
            .send()
    };
    for _ in 0..5 {
        assert_eq!(expensive("demo").await.unwrap().status(), 200);
    }
    let refused = expensive("demo").await.unwrap();
    assert_eq!(refused.status(), 429);
    // 5 per minute: one unit every 12 s.
    assert_eq!(refused.headers()["retry-after"], "12");
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""expensive";q=5;w=60"#
    );
    // Another key, and another path of the same key, are not affected.
    assert_eq!(expensive("other").await.unwrap().status(), 200);
    let home = client
        .get(&base)
        .header("x-api-key", "demo")
        .send()
        .await
        .unwrap();
    assert_eq!(home.status(), 200);
    assert_eq!(home.headers()["ratelimit"], r#""(default)";r=59;t=1"#);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_example_caps_connections_and_request_heads() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = axum_server::serve::ServeLimits {
        max_connections: 1,
        header_read_timeout: std::time::Duration::from_millis(200),
        ..axum_server::serve::ServeLimits::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(axum_server::run(listener, limits, async {
        let _ = stopped.await;
    }));
    // The one connection allowed, idle: the next request waits for it to
    // be closed by the header timeout, then is served.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    let client = reqwest::Client::new();
    let home = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(home.status(), 200);
    let mut rest = Vec::new();
    let closed = tokio::io::AsyncReadExt::read_to_end(&mut idle, &mut rest);
    tokio::time::timeout(std::time::Duration::from_secs(10), closed)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(rest.is_empty(), "closed without an answer");
    let big = client
        .get(format!("http://{addr}/"))
        .header("x-padding", "a".repeat(100 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 431);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_example_limits_chat_completions_per_model_read_from_the_body() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(axum_server::run(
        listener,
        axum_server::serve::ServeLimits::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/chat/completions");
    let chat = |model: &str| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(format!(r#"{{"model":"{model}","messages":[]}}"#))
            .send()
    };
    for _ in 0..10 {
        assert_eq!(chat("small").await.unwrap().status(), 200);
    }
    let refused = chat("small").await.unwrap();
    assert_eq!(refused.status(), 429);
    // 10 a minute: one every 6 s.
    assert_eq!(refused.headers()["retry-after"], "6");
    let body = refused.text().await.unwrap();
    assert!(body.contains(r#""code":"rate_limited""#), "{body}");
    assert!(body.contains("`small`"), "the model is named: {body}");
    // Each model has its own limit.
    assert_eq!(chat("large").await.unwrap().status(), 200);
    // A body over the limit is refused before it is read whole.
    let big = client
        .post(&url)
        .body(vec![b' '; axum_server::MAX_CHAT_BODY + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
