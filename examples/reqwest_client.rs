//! A client stack of all four layers around `reqwest::Client`, calling a
//! local upstream that it starts itself (so it runs offline).
//!
//! ```text
//! cargo run --example reqwest_client --features reqwest
//! ```
//!
//! The upstream admits 4 requests a second per model and answers 429 with
//! `Retry-After: 1` beyond that; for `big` it admits only 1. The client keys
//! everything by the JSON body's `model`: at most 2 in flight and 4 queued
//! per model, 3 a second evenly spaced (waiting up to 400 ms for a turn),
//! and a cooldown for a model the upstream refused. A burst of 8 requests
//! per model, then a second wave of 2, shows each layer act.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use parking_lot::Mutex;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::backoff::Backoff429Layer;
use tower_throttle::concurrency::ConcurrencyLayer;
use tower_throttle::error::BoxError;
use tower_throttle::identity::{IdentityHeaderLayer, Rule as IdentityRule};
use tower_throttle::key::JsonFieldKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::respond::Rejection;

/// What happened to one request of the burst.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered with this status, after this long.
    Answered(u16, Duration),
    /// A layer refused it with this code (`rate_limited`, `cooling_down`, …).
    Refused(&'static str),
}

/// Start the upstream on an ephemeral loopback port: 4 a second per model
/// (1 for `big`), else 429.
pub async fn start_upstream() -> Result<(String, tokio::task::JoinHandle<()>), BoxError> {
    let seen: Arc<Mutex<HashMap<String, Vec<Instant>>>> = Arc::default();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                let model = body["model"].as_str().unwrap_or("").to_owned();
                let limit = if model == "big" { 1 } else { 4 };
                let now = Instant::now();
                let mut seen = seen.lock();
                let times = seen.entry(model).or_default();
                times.retain(|t| now - *t < Duration::from_secs(1));
                if times.len() >= limit {
                    return (
                        StatusCode::TOO_MANY_REQUESTS,
                        [("retry-after", "1")],
                        "slow down",
                    )
                        .into_response();
                }
                times.push(now);
                (StatusCode::OK, "{\"choices\":[]}").into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, server))
}

/// The client stack: identity, upstream cooldown, concurrency, rate limit,
/// around `reqwest::Client`; everything keyed by the body's `model`.
fn stack() -> Result<Stack, BoxError> {
    let model = JsonFieldKey::new("model");
    Ok(ServiceBuilder::new()
        .layer(IdentityHeaderLayer::new([IdentityRule::new()
            .host("127.0.0.1")
            .user_agent("reqwest-client-example/1.0")])?)
        .layer(Backoff429Layer::new(model.clone()))
        .layer(ConcurrencyLayer::new(2, model.clone())?.with_max_queue(4))
        .layer(
            RateLimitLayer::new(Quota::per_second(3)?.with_burst(1)?, model)
                .with_max_wait(Duration::from_millis(400)),
        )
        .service(reqwest::Client::new())
        .boxed_clone())
}

type Stack = BoxCloneService<reqwest::Request, reqwest::Response, BoxError>;

/// Two waves through one stack: `per_model` requests for each model at
/// once, then 2 more each once the first wave is done. Returns each
/// request's wave, model and outcome, in order.
pub async fn run(
    url: &str,
    models: &[&str],
    per_model: usize,
) -> Result<Vec<(u8, String, Outcome)>, BoxError> {
    let stack = stack()?;
    let mut outcomes = Vec::new();
    for (wave, count) in [(1, per_model), (2, 2)] {
        for (model, outcome) in burst(&stack, url, models, count).await? {
            outcomes.push((wave, model, outcome));
        }
    }
    Ok(outcomes)
}

async fn burst(
    stack: &Stack,
    url: &str,
    models: &[&str],
    per_model: usize,
) -> Result<Vec<(String, Outcome)>, BoxError> {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut calls = Vec::new();
    for i in 0..per_model {
        for m in models {
            let request = client
                .post(url)
                .header("content-type", "application/json")
                .body(format!(
                    r##"{{"model":"{m}","messages":[{{"role":"user","content":"#{i}"}}]}}"##
                ))
                .build()?;
            let svc = stack.clone();
            let name = m.to_string();
            calls.push(tokio::spawn(async move {
                let outcome = match svc.oneshot(request).await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        // Reading the body is what gives the permit back.
                        let _ = response.bytes().await;
                        Outcome::Answered(status, start.elapsed())
                    }
                    Err(err) => match Rejection::of(&err) {
                        Some(rejection) => Outcome::Refused(rejection.code()),
                        None => Outcome::Refused("transport"),
                    },
                };
                (name, outcome)
            }));
            // Arrival order is the order of the burst.
            tokio::task::yield_now().await;
        }
    }
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await?);
    }
    Ok(outcomes)
}

#[allow(dead_code)] // also compiled into the example's test, which has its own main
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, server) = start_upstream().await?;
    println!("upstream: {url} (4/s per model, 1/s for `big`, else 429 Retry-After: 1)");
    println!(
        "client:   2 in flight + 4 queued, 3/s per model waiting up to 400 ms, cooldown after a 429\n"
    );
    for (wave, model, outcome) in run(&url, &["small", "big"], 8).await? {
        print!("wave {wave} ");
        match outcome {
            Outcome::Answered(200, at) => println!("{model:>5}: 200 at {:>4} ms", at.as_millis()),
            Outcome::Answered(status, at) => {
                println!(
                    "{model:>5}: {status} at {:>4} ms  (upstream refused: route cools down)",
                    at.as_millis()
                )
            }
            Outcome::Refused(code) => println!("{model:>5}: refused by the client stack: {code}"),
        }
    }
    server.abort();
    Ok(())
}
