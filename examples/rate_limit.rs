//! A keyed rate limit in front of a service, in both modes.
//!
//! ```text
//! cargo run --example rate_limit
//! ```
//!
//! Two API keys share one upstream. In reject mode each key gets 3 requests
//! per second and the rest are refused at once with the exact time to retry;
//! in wait mode the extra requests queue in arrival order and go through at
//! the limit's pace.

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::error::{BoxError, RateLimited};
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};

fn request(api_key: &str) -> http::Request<String> {
    http::Request::builder()
        .uri("/v1/chat/completions")
        .header("x-api-key", api_key)
        .body(String::new())
        .expect("static request parts are valid")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let upstream = tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new("ok".to_owned()))
    });
    let per_key = Quota::per_second(3)?;
    let key = HeaderKey::new("x-api-key")?;

    println!("reject mode: 3 per second per API key");
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(per_key, key.clone()))
        .service(upstream);
    for i in 0..5 {
        for api_key in ["alice", "bob"] {
            match svc.ready().await?.call(request(api_key)).await {
                Ok(_) => println!("  #{i} {api_key:<5} admitted"),
                Err(err) => match err.downcast_ref::<RateLimited>() {
                    Some(limited) => println!(
                        "  #{i} {api_key:<5} refused, retry after {:?}",
                        limited.retry_after
                    ),
                    None => return Err(err),
                },
            }
        }
    }

    println!("wait mode: the same limit, waiting up to 2 s in arrival order");
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(per_key, key).with_max_wait(Duration::from_secs(2)))
        .service(upstream);
    let start = Instant::now();
    let mut calls = Vec::new();
    for i in 0..8 {
        let svc = svc.clone();
        calls.push(tokio::spawn(async move {
            let outcome = svc.oneshot(request("alice")).await;
            (i, start.elapsed(), outcome.map(|_| ()))
        }));
    }
    for call in calls {
        let (i, at, outcome) = call.await?;
        match outcome {
            Ok(()) => println!("  #{i} alice admitted at {:>4} ms", at.as_millis()),
            Err(err) => println!("  #{i} alice refused at {:>4} ms: {err}", at.as_millis()),
        }
    }
    Ok(())
}
