//! The `proxy` example's health endpoints, end to end over real sockets:
//! `/healthz` and `/readyz` answer outside every limit, and `/readyz` is
//! 503 while a fail-closed Redis store does not answer.

mod support;

use proxy::config::Settings;
use serde_json::Value;
use support::sim::{no_env, post, simulator, start};

async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client.get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_answered_outside_every_limit() {
    let toml = format!(
        "{}\n[rate_limit]\nmode = \"reject\"\nquotas = [{{ limit = 1, period = \"1m\" }}]\n",
        simulator(100, 100)
    );
    let gw = start(&toml).await;
    let client = reqwest::Client::new();
    let url = gw.url();
    assert_eq!(post(&client, &url, "sim-small").await.status(), 200);
    assert_eq!(post(&client, &url, "sim-small").await.status(), 429);
    // The operator endpoints' own limit (bursts of 100) spent too.
    let mut refused = 0;
    for _ in 0..120 {
        refused += u32::from(get(&client, &format!("{url}/stats")).await.0 == 429);
    }
    assert!(refused > 0, "the operator limit was never reached");

    for _ in 0..200 {
        assert_eq!(
            get(&client, &format!("{url}/healthz")).await,
            (200, "ok\n".to_owned())
        );
    }
    let (status, body) = get(&client, &format!("{url}/readyz")).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        serde_json::json!({"ready": true})
    );
}

#[test]
fn a_provider_may_not_be_named_for_a_health_endpoint() {
    for name in ["healthz", "readyz"] {
        let toml = format!("[[providers]]\nname = \"{name}\"\nbase_url = \"http://127.0.0.1:9\"\n");
        let e = Settings::from_toml(&toml, &no_env).unwrap_err().to_string();
        assert!(e.contains(name), "{e}");
    }
}

#[cfg(feature = "redis")]
mod with_redis {
    use super::*;

    use std::time::{Duration, Instant};
    use testkit::redis::RedisServer;

    /// Poll `url` until it answers `status` (real time: Redis's outage is
    /// the subject), at most 10 s.
    async fn until(client: &reqwest::Client, url: &str, status: u16) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (now, body) = get(client, url).await;
            if now == status {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{url} never answered {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readyz_follows_a_fail_closed_redis_and_ignores_a_fail_open_one() {
        let Some(mut redis) = RedisServer::start("readyz_follows_redis") else {
            return;
        };
        let store = |on_error: &str| {
            format!(
                "{}\n[store]\nredis_url = \"{}\"\non_error = \"{on_error}\"\n",
                simulator(100, 100),
                redis.url()
            )
        };
        let closed = start(&store("closed")).await;
        let open = start(&store("open")).await;
        let client = reqwest::Client::new();
        let ready = |gw: &proxy::gateway::Running| format!("{}/readyz", gw.url());
        until(&client, &ready(&closed), 200).await;

        redis.kill();
        let body = until(&client, &ready(&closed), 503).await;
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["ready"], false);
        let reason = body["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("the Redis store does not answer"),
            "{reason}"
        );
        assert!(!reason.contains(&redis.url()), "{reason}");
        assert_eq!(
            get(&client, &ready(&open)).await.0,
            200,
            "fail open: still serving"
        );
        assert_eq!(
            get(&client, &format!("{}/healthz", closed.url())).await.0,
            200
        );

        redis.restart();
        until(&client, &ready(&closed), 200).await;
    }
}
