//! An axum server with inbound limits: per client IP, and per API key with a
//! stricter limit on one expensive path. Refusals are 429s with
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
use tower_throttle::error::{BoxError, ConfigError};
use tower_throttle::key::{ClientIpKey, HeaderKey, PathPrefixKey};
use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};

#[allow(dead_code)] // the proxy's; not every item is used here
#[path = "proxy/serve.rs"]
pub mod serve;
#[path = "proxy/signal.rs"]
mod signal;

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

/// The application with its limits: 120 requests a minute per client IP;
/// 60 a minute per API key and path, and 5 a minute on `/expensive`.
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
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/expensive", post(|| async { "computed\n" }))
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
        "limits: 120/min per client IP; 60/min per API key and path; 5/min on POST /expensive; {} connections",
        limits.max_connections
    );
    println!(
        "try:    for i in $(seq 7); do curl -si -X POST -H 'x-api-key: demo' http://{addr}/expensive | head -1; done"
    );
    println!("        curl -si -H 'x-api-key: demo' http://{addr}/   # see the RateLimit headers");
    run(listener, limits, signals.stopped("stopping")).await?;
    Ok(())
}
