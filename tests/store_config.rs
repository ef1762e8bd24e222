//! The `[store]` section of a stack's configuration: checked when the stack
//! is, never showing its secrets, and building layers that keep their
//! state in Redis.

#![cfg(feature = "redis")]

use testkit::redis as redis_server;
mod support;

use redis_server::RedisServer;
use support::{Inner, request};
use tower::{Layer, ServiceExt};
use tower_throttle::config::StackConfig;
use tower_throttle::key::HeaderKey;

fn stack(store: &str) -> Result<tower_throttle::config::Stack, String> {
    StackConfig::from_toml(&format!(
        "[rate_limit]\nquotas = [{{ limit = 2, period = \"1m\" }}]\n[backoff]\n[store]\n{store}"
    ))
    .and_then(|c| c.validate())
    .map_err(|e| e.to_string())
}

#[test]
fn a_bad_store_section_is_an_error_naming_its_field() {
    let cases = [
        ("redis_url = \"\"", "store.redis_url"),
        ("redis_url = \"not a url\"", "store.redis_url"),
        (
            "redis_url = \"redis://h\"\ntimeout = \"0s\"",
            "store.timeout",
        ),
        (
            "redis_url = \"redis://h\"\ntimeout = \"soon\"",
            "store.timeout",
        ),
        (
            "redis_url = \"redis://h\"\non_error = \"sideways\"",
            "store.on_error",
        ),
        (
            "redis_url = \"redis://h\"\nhash_key = \"\"",
            "store.hash_key",
        ),
        (
            "redis_url = \"redis://h\"\nhash_key = \"k\"\nhash_key_env = \"K\"",
            "store.hash_key_env",
        ),
        (
            "redis_url = \"redis://h\"\nhash_key_env = \"TT_TEST_SURELY_UNSET\"",
            "store.hash_key_env",
        ),
    ];
    for (section, field) in cases {
        let err = stack(section).expect_err(section);
        assert!(err.contains(&format!("`{field}`")), "{section}: {err}");
    }
    // A quota finer than Redis keeps time, named where it is.
    let err = StackConfig::from_toml(
        "[rate_limit]\nquotas = [{ limit = 20000, period = \"1s\" }]\n[store]\nredis_url = \"redis://h\"",
    )
    .and_then(|c| c.validate())
    .expect_err("too fine");
    assert!(err.field.starts_with("rate_limit.quotas[0]"), "{err}");
}

#[test]
fn shared_concurrency_permits_are_refused_with_the_reason() {
    let err = StackConfig::from_toml("[concurrency]\nmax_in_flight = 4\nshared = true")
        .and_then(|c| c.validate())
        .expect_err("refused");
    assert_eq!(err.field, "concurrency.shared");
    assert!(err.message.contains("lease"), "{err}");
}

#[test]
fn the_store_section_never_shows_its_url_or_hash_key() {
    let stack =
        stack("redis_url = \"redis://user:hunter2@127.0.0.1:6379\"\nhash_key = \"sesame-open\"")
            .expect("valid");
    let shown = format!("{stack:?} {:?}", stack.redis_store());
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(!shown.contains("sesame"), "{shown}");
    assert!(shown.contains("127.0.0.1:6379"), "{shown}");
}

#[tokio::test]
async fn a_stack_with_a_store_builds_its_layers_on_redis() {
    let Some(server) = RedisServer::start("a_stack_with_a_store") else {
        return;
    };
    let stack = stack(&format!(
        "redis_url = \"{}\"\nprefix = \"stack:\"\non_error = \"closed\"",
        server.url()
    ))
    .expect("valid");
    let key = || HeaderKey::new("x-key").expect("valid header name");
    let rate = stack.rate_limit_layer(key()).expect("configured");
    let backoff = stack
        .backoff_layer(key())
        .expect("valid")
        .expect("configured");
    let svc = backoff.layer(rate.layer(Inner::new()));
    svc.oneshot(request("k", 0)).await.expect("admitted");
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("stack:*")
        .query(&mut conn)
        .expect("KEYS");
    // The rate limit's bucket; the route's cooldown leaves nothing while
    // it has none.
    assert_eq!(keys.len(), 1, "{keys:?}");
}
