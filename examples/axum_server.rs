//! An axum server with inbound limits: per client IP, and per API key with a
//! stricter limit on one expensive path. Refusals are 429s with
//! `Retry-After` and the IETF `RateLimit` headers; no error handler needed.
//!
//! ```text
//! cargo run --example axum_server -- --listen 127.0.0.1:3000
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::{get, post};
use clap::Parser;
use tower::ServiceBuilder;
use tower_throttle::error::{BoxError, ConfigError};
use tower_throttle::key::{ClientIpKey, HeaderKey, PathPrefixKey};
use tower_throttle::rate_limit::{KeyPattern, Quota, RateLimitLayer, Rule};
use tower_throttle::respond::{RateLimitHeaders, ThrottleResponseLayer};

/// Serve a small API behind per-IP and per-API-key limits.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
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

#[allow(dead_code)] // also compiled into the example's test, which has its own main
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "limits: 120/min per client IP; 60/min per API key and path; 5/min on POST /expensive"
    );
    println!(
        "try:    for i in $(seq 7); do curl -si -X POST -H 'x-api-key: demo' http://{addr}/expensive | head -1; done"
    );
    println!("        curl -si -H 'x-api-key: demo' http://{addr}/   # see the RateLimit headers");
    axum::serve(
        listener,
        app()?.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
