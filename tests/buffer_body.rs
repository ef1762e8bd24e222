//! BufferBodyLayer: request bodies read into memory up to a limit, so that
//! a layer keyed by a JSON field works on a server; over real sockets with
//! axum, and at the service with bodies that count what is read of them.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_throttle::BoxError;
use tower_throttle::buffer::{BufferBodyLayer, BufferedBody};
use tower_throttle::error::{BodyTooLarge, BodyUnreadable};
use tower_throttle::key::JsonFieldKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::respond::ThrottleResponseLayer;

/// A chunked body of `frames` frames of `size` bytes each (`usize::MAX`:
/// without end), counting the frames read; with `fail_after`, an error
/// instead of that frame.
struct Counting {
    frames: usize,
    size: usize,
    read: Arc<AtomicUsize>,
    fail_after: Option<usize>,
}

impl Body for Counting {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let n = self.read.fetch_add(1, Ordering::SeqCst);
        if self.fail_after == Some(n) {
            return Poll::Ready(Some(Err(std::io::Error::other("connection reset"))));
        }
        if n >= self.frames {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b' '; self.size])))))
    }

    fn size_hint(&self) -> SizeHint {
        // Chunked: nothing known up front.
        SizeHint::default()
    }
}

fn counting(frames: usize, size: usize) -> (Counting, Arc<AtomicUsize>) {
    let read = Arc::new(AtomicUsize::new(0));
    let body = Counting {
        frames,
        size,
        read: read.clone(),
        fail_after: None,
    };
    (body, read)
}

/// An inner service that counts its calls and echoes the body's length.
fn inner(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    http::Request<BufferedBody>,
    Response = http::Response<String>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone {
    tower::service_fn(move |req: http::Request<BufferedBody>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok(http::Response::new(req.body().bytes().len().to_string())) }
    })
}

#[tokio::test]
async fn a_chunked_body_that_grows_past_the_limit_is_cut_off_without_reading_it_all() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BufferBodyLayer::new(4096).layer(inner(calls.clone()));
    // 1 KiB frames without end: refused once the fifth passes 4 KiB. (As a
    // hang guard the body breaks off at the 64th, which a cut-off never
    // reaches.)
    let (mut body, read) = counting(usize::MAX, 1024);
    body.fail_after = Some(64);
    let error = svc
        .clone()
        .oneshot(http::Request::new(body))
        .await
        .unwrap_err();
    assert_eq!(
        error.downcast_ref::<BodyTooLarge>().map(|e| e.limit),
        Some(4096)
    );
    assert_eq!(read.load(Ordering::SeqCst), 5, "frames read");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the inner service was not called"
    );
    // Exactly the limit is fine.
    let (body, _) = counting(4, 1024);
    let answer = svc.oneshot(http::Request::new(body)).await.unwrap();
    assert_eq!(answer.body(), "4096");
}

#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_a_byte_is_read() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BufferBodyLayer::new(100).layer(inner(calls.clone()));
    let (body, read) = counting(1, 50);
    let mut req = http::Request::new(body);
    req.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(101));
    let error = svc.clone().oneshot(req).await.unwrap_err();
    assert!(error.is::<BodyTooLarge>());
    assert_eq!(read.load(Ordering::SeqCst), 0);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // A body whose own size says so, too.
    let big = http_body_util::Full::new(Bytes::from(vec![b' '; 101]));
    let error = svc.oneshot(http::Request::new(big)).await.unwrap_err();
    assert!(error.is::<BodyTooLarge>());
}

#[tokio::test]
async fn a_body_that_breaks_off_is_refused_as_unreadable() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = BufferBodyLayer::new(4096).layer(inner(calls.clone()));
    let (mut body, _) = counting(10, 10);
    body.fail_after = Some(2);
    let error: BoxError = svc.oneshot(http::Request::new(body)).await.unwrap_err();
    assert!(error.is::<BodyUnreadable>());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Serve `app` on an ephemeral loopback port until the sender is dropped.
async fn serve(app: Router) -> (String, tokio::sync::oneshot::Sender<()>) {
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
    (format!("http://{addr}"), stop)
}

#[tokio::test]
async fn an_axum_server_limits_per_model_once_bodies_are_buffered() {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(BufferBodyLayer::new(1024))
                .layer(RateLimitLayer::new(
                    Quota::per_minute(2).unwrap(),
                    JsonFieldKey::new("model"),
                )),
        );
    let (base, stop) = serve(app).await;
    let url = format!("{base}/v1/chat/completions");
    let client = reqwest::Client::new();
    let chat = |model: &str| {
        let body = serde_json::json!({"model": model, "messages": []}).to_string();
        client.post(&url).body(body).send()
    };
    let first = chat("small").await.unwrap();
    assert_eq!(first.status(), 200);
    // The handler still gets the whole body.
    let expected = serde_json::json!({"model": "small", "messages": []})
        .to_string()
        .len();
    assert_eq!(first.text().await.unwrap(), format!("{expected} bytes"));
    assert_eq!(chat("small").await.unwrap().status(), 200);
    let refused = chat("small").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""(default)";q=2;w=60"#
    );
    // Another model has its own limit.
    assert_eq!(chat("large").await.unwrap().status(), 200);

    // Over the limit: 413 in the layers' JSON shape, declared...
    let big = client
        .post(&url)
        .body(vec![b' '; 2048])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let json: serde_json::Value = serde_json::from_str(&big.text().await.unwrap()).unwrap();
    assert_eq!(json["error"]["code"], "body_too_large");
    // ...or chunked, without a length.
    let chunks = futures::stream::iter(
        (0..3).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 512]))),
    );
    let chunked = client
        .post(&url)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(chunked.status(), 413);
    drop(stop);
}

#[test]
fn a_buffered_body_shows_its_length_not_its_bytes() {
    let body = BufferedBody::new(r#"{"api_key":"sk-secret"}"#);
    let shown = format!("{body:?}");
    assert!(!shown.contains("sk-secret"), "{shown}");
    assert!(shown.contains("23"), "{shown}");
}
