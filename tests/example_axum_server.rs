//! The `axum_server` example, served on an ephemeral loopback port.

#[path = "../examples/axum_server.rs"]
mod axum_server;

use std::net::SocketAddr;

#[tokio::test]
async fn the_example_limits_the_expensive_path_per_api_key() {
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
