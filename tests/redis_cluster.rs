//! The rate limiter on a Redis Cluster of three masters, made by the test
//! (`redis-cli --cluster create`): every state of one key shares its hash
//! tag, so each script touches one slot, while different keys spread over
//! the masters.

#![cfg(feature = "redis")]

use testkit::redis as redis_server;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use redis_server::RedisCluster;
use support::{Inner, request};
use tower::{Layer, ServiceExt};
use tower_throttle::error::RateLimited;
use tower_throttle::key::HeaderKey;
use tower_throttle::rate_limit::{Quota, RateLimitLayer};
use tower_throttle::redis::{OnError, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_quota_of_a_key_lives_in_one_slot_and_keys_spread_over_the_masters() {
    let Some(cluster) = RedisCluster::start("every_quota_of_a_key_lives_in_one_slot", 3) else {
        return;
    };
    let store = RedisStore::cluster(&cluster.urls())
        .expect("valid URLs")
        .with_prefix("cl:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_secs(2))
        // A script the cluster refused (CROSSSLOT, MOVED) shows as an error.
        .with_on_error(OnError::Closed);
    // Three quotas, three Redis keys per key (one each):
    // one script touches them all.
    let quotas = vec![
        Quota::per_minute(2).expect("valid"),
        Quota::per_minute(2).expect("valid").sliding_window(),
        Quota::per_hour(100).expect("valid").fixed_window(),
    ];
    let svc = RateLimitLayer::with_quotas(quotas, HeaderKey::new("x-key").expect("valid"))
        .with_store(store)
        .expect("quotas Redis keeps")
        .layer(Inner::new());
    for key in 0..30 {
        let key = format!("client-{key}");
        for seq in 0..2 {
            svc.clone()
                .oneshot(request(&key, seq))
                .await
                .unwrap_or_else(|e| panic!("{key} #{seq}: {e}"));
        }
        let err = svc
            .clone()
            .oneshot(request(&key, 2))
            .await
            .expect_err("the third in a minute");
        assert!(err.is::<RateLimited>(), "{key}: {err}");
    }
    // Where each key's states landed: each hash tag on one master only,
    // with all three of its keys; the tags spread over every master.
    let mut tags: HashMap<String, (usize, usize)> = HashMap::new();
    let mut used = 0;
    for (n, node) in cluster.nodes.iter().enumerate() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("cl:*")
            .query(&mut node.connection())
            .expect("KEYS");
        used += usize::from(!keys.is_empty());
        for key in keys {
            let tag = key
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(tag, _)| tag.to_owned())
                .expect("a hash tag");
            let entry = tags.entry(tag).or_insert((n, 0));
            assert_eq!(entry.0, n, "a key's states on two masters: {key}");
            entry.1 += 1;
        }
    }
    assert_eq!(tags.len(), 30);
    assert!(tags.values().all(|&(_, keys)| keys == 3), "{tags:?}");
    assert_eq!(used, 3, "30 keys all on fewer than 3 masters");
}

/// A relay to `to` that waits `delay` before it connects each connection
/// through: a slow network, for the handshake.
async fn slow_relay(to: String, delay: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut server) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

/// A Cluster whose first connection takes longer than one call's timeout
/// is still reached: the handshake runs in a task of its own, which a
/// call's timeout does not cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_slower_to_greet_than_one_calls_timeout_is_still_reached() {
    let Some(cluster) = RedisCluster::start("slow_cluster_handshake", 3) else {
        return;
    };
    let first = cluster.urls()[0].trim_start_matches("redis://").to_owned();
    let relay = slow_relay(first, Duration::from_millis(300)).await;
    let store = RedisStore::cluster(&[format!("redis://{relay}")])
        .expect("valid URL")
        .with_prefix("slow:")
        .expect("a prefix without braces")
        .with_timeout(Duration::from_millis(50))
        .with_on_error(OnError::Closed);
    let svc = RateLimitLayer::new(
        Quota::per_minute(1_000).expect("valid"),
        HeaderKey::new("x-key").expect("valid"),
    )
    .with_store(store)
    .expect("a quota Redis keeps")
    .layer(Inner::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seq = 0;
    while svc.clone().oneshot(request("k", seq)).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never connected");
        seq += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
