//! What a plain `cargo test` (no features) leaves out, said where it is
//! seen: each integration test file is compiled only with the features it
//! needs (`test-util` for paused tokio time, `redis` for the store), so
//! without them they build empty and this test is listed as ignored with
//! the command that runs them all.

#[cfg(not(all(feature = "test-util", feature = "redis")))]
#[test]
#[ignore = "most integration tests need features: run `cargo test --all-features`"]
fn integration_tests_need_their_features() {}
