//! Request bodies read into memory for keys that live in them:
//! [`BufferBodyLayer`].
//!
//! On a client the request body is usually already in memory (`Bytes`, a
//! `String`), and [`JsonFieldKey`](crate::key::JsonFieldKey) reads it as it
//! is. A server receives it as a stream (axum's `Body`, hyper's
//! `Incoming`), which a key extractor cannot read without consuming it.
//! [`BufferBodyLayer`], placed outside the layers keyed by the body, reads
//! it whole first (up to a limit: 413 beyond) and hands on a
//! [`BufferedBody`], which both the extractors and the inner service can
//! read.
//!
//! ```
//! use tower::ServiceExt;
//! use tower_throttle::buffer::{BufferBodyLayer, BufferedBody};
//! use tower_throttle::error::{BodyTooLarge, RateLimited};
//! use tower_throttle::key::JsonFieldKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let svc = tower::ServiceBuilder::new()
//!     .layer(BufferBodyLayer::new(1024))
//!     .layer(RateLimitLayer::new(Quota::per_minute(1)?, JsonFieldKey::new("model")))
//!     .service_fn(|req: http::Request<BufferedBody>| async move {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(req.into_body().into_bytes()))
//!     });
//!
//! // A streamed body, as a server receives it.
//! let chat = |model: &str| {
//!     let json = format!(r#"{{"model":"{model}","messages":[]}}"#);
//!     let chunks = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(json))]);
//!     http::Request::new(axum::body::Body::from_stream(chunks))
//! };
//! let answer = svc.clone().oneshot(chat("small")).await?;
//! assert!(answer.body().starts_with(b"{\"model\":\"small\""));
//! // Limited per model: the second request for `small` is refused...
//! let refused = svc.clone().oneshot(chat("small")).await.unwrap_err();
//! assert!(refused.is::<RateLimited>());
//! // ...and `large` has its own limit.
//! svc.clone().oneshot(chat("large")).await?;
//!
//! let huge = http::Request::new(axum::body::Body::from(vec![b' '; 2048]));
//! let refused = svc.oneshot(huge).await.unwrap_err();
//! assert!(refused.is::<BodyTooLarge>());
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
mod layer;
mod read;

pub use body::BufferedBody;
pub use future::ResponseFuture;
pub use layer::{BufferBody, BufferBodyLayer};
