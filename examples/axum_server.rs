//! An axum server with inbound limits: per client IP, per API key with a
//! stricter limit on one expensive path, and per model named in the JSON
//! body of `POST /v1/chat/completions` (the body is read into memory first,
//! up to 64 KiB, by `BufferBodyLayer`: 413 beyond). Refusals are 429s with
//! `Retry-After` and the IETF `RateLimit` headers; no error handler needed.
//!
//! ```text
//! cargo run --example axum_server --features axum -- --listen 127.0.0.1:3000
//! ```
//!
//! It is served like the proxy example's gateway (`proxy/serve.rs`): at most
//! `--max-connections` open at once (the rest wait in the listen backlog),
//! a complete request head within 10 s of a connection opening or of its
//! previous response, heads of at most 64 KiB (431 beyond). Ctrl-C or
//! SIGTERM stops it gracefully; a second one quits at once.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};
use clap::Parser;
use tower::ServiceBuilder;
use tower_throttle::buffer::BufferBodyLayer;
use tower_throttle::error::{BoxError, ConfigError};
use tower_throttle::key::{ClientIpKey, HeaderKey, JsonFieldKey, PathPrefixKey};
use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};

// The programs' serving code (`examples/serving`): capped, timed
// connections and graceful stop.
pub use serving::serve;
use serving::signal;

/// Serve a small API behind per-IP and per-API-key limits.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,

    /// Connections open at once; more wait in the listen backlog [default:
    /// from the open-file limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
}

/// The largest chat request body read.
pub const MAX_CHAT_BODY: usize = 64 * 1024;

/// The application with its limits: 120 requests a minute per client IP;
/// 60 a minute per API key and path, and 5 a minute on `/expensive`; 10 a
/// minute per model on `/v1/chat/completions`.
pub fn app() -> Result<Router, ConfigError> {
    let per_ip = RateLimitLayer::new(Quota::per_minute(120)?, ClientIpKey::new());
    let per_key = RateLimitLayer::new(
        Quota::per_minute(60)?,
        (PathPrefixKey::segments(1)?, HeaderKey::new("x-api-key")?),
    )
    .with_rule(
        Rule::new("expensive", KeyPattern::parts(["/expensive", "*"])?)
            .with_quota(Quota::per_minute(5)?),
    )?
    .with_fallback_key("anonymous")
    .with_response_headers(RateLimitHeaders::ietf());
    // The model is in the JSON body, which arrives as a stream: read it
    // into memory first, so the key extractor can see it. Layered on this
    // route only; other routes keep streaming their bodies.
    let per_model = RateLimitLayer::new(Quota::per_minute(10)?, JsonFieldKey::new("model"))
        .with_response_headers(RateLimitHeaders::ietf());
    let chat = Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { "{\"choices\":[]}\n" }),
        )
        .route_layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(BufferBodyLayer::new(MAX_CHAT_BODY))
                .layer(per_model),
        );
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", post(|| async { "computed\n" }))
        .merge(chat)
        .layer(
            ServiceBuilder::new()
                .layer(ThrottleResponseLayer::new())
                .layer(per_ip)
                .layer(per_key),
        ))
}

/// Serve [`app`] on `listener` within `limits` until `shutdown` completes,
/// then let requests in progress finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    limits: serve::ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ConfigError> {
    serve::serve(
        listener,
        app()?,
        limits,
        serve::Connections::default(),
        shutdown,
    )
    .await;
    Ok(())
}

#[allow(dead_code)] // also compiled into the example's test, which has its own main
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let signals = signal::StopSignals::listen()?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let mut limits = serve::ServeLimits::default();
    if let Some(n) = args.max_connections {
        limits.max_connections = n as usize;
    }
    println!("listening on http://{addr}");
    println!(
        "limits: 120/min per client IP; 60/min per API key and path; 5/min on POST /expensive; \
         10/min per model on POST /v1/chat/completions; {} connections",
        limits.max_connections
    );
    println!(
        "try:    for i in $(seq 7); do curl -si -X POST -H 'x-api-key: demo' http://{addr}/expensive | head -1; done"
    );
    println!("        curl -si -H 'x-api-key: demo' http://{addr}/   # see the RateLimit headers");
    println!(
        "        curl -si http://{addr}/v1/chat/completions -d '{{\"model\":\"small\"}}'   # limited per model"
    );
    run(listener, limits, signals.stopped("stopping")).await?;
    Ok(())
}
