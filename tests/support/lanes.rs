//! Requests of named callers (`x-client`, numbered by `x-n`), each sent in
//! a task of its own: the fair-share tests' shared pieces.

use tower::{BoxError, Service, ServiceExt};

/// Caller `client`'s request number `n`.
pub fn request(client: &str, n: usize) -> http::Request<()> {
    http::Request::builder()
        .header("x-client", client)
        .header("x-n", n.to_string())
        .body(())
        .expect("valid request")
}

/// Send `req` on a clone of `svc` in a task of its own, and let it reach
/// its place in line before the next. The response (which may hold a
/// permit) is dropped in the task.
pub async fn spawn<S>(
    svc: &S,
    req: http::Request<()>,
) -> tokio::task::JoinHandle<Result<(), BoxError>>
where
    S: Service<http::Request<()>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
{
    let svc = svc.clone();
    let task = tokio::spawn(async move { svc.oneshot(req).await.map(drop) });
    tokio::task::yield_now().await;
    task
}
