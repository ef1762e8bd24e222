//! The rate limiter on a Redis Cluster of three masters, made by the test
//! (`redis-cli --cluster create`): every state of one key shares its hash
//! tag, so each script touches one slot, while different keys spread over
//! the masters.

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
        .on_error(OnError::Closed);
    // Three quotas, four Redis keys per key (a sliding window has two):
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
    // with all four of its keys; the tags spread over every master.
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
    assert!(tags.values().all(|&(_, keys)| keys == 4), "{tags:?}");
    assert_eq!(used, 3, "30 keys all on fewer than 3 masters");
}
