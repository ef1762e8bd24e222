//! `StackConfig` TOML: any text parses to a configuration or an error, the
//! same each time; an error names its field and shows no hidden character
//! (control, bidi, zero-width: a config error lands in logs and terminals);
//! `[rate_limit]` written back as TOML reads back equal;
//! a configuration that validates builds every layer it describes; and
//! tightening validated limits with themselves changes nothing and ignores
//! nothing.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

use tower_throttle::config::StackConfig;
use tower_throttle::error::ConfigError;
use tower_throttle::key::GlobalKey;
use tower_throttle::rate_limit::RateLimitConfig;
use tower_throttle::redact::is_hidden;

/// Parse `data` (when UTF-8) as a stack configuration and check it.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = StackConfig::from_toml(text);
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", StackConfig::from_toml(text)),
        "parsing is deterministic"
    );
    let config = match parsed {
        Ok(config) => config,
        Err(e) => return check_error(&e),
    };
    // `[rate_limit]` has a writer: what it writes reads back the same.
    if let Some(rate_limit) = &config.rate_limit {
        let written = toml::to_string(rate_limit).expect("a rate limit config writes");
        let back: RateLimitConfig = toml::from_str(&written)
            .unwrap_or_else(|e| panic!("{written:?} does not read back: {e}"));
        assert_eq!(&back, rate_limit, "round trip through {written:?}");
    }
    let stack = match config.validate() {
        Ok(stack) => stack,
        Err(e) => return check_error(&e),
    };
    // What validates builds.
    let _ = stack.rate_limit_layer(GlobalKey);
    if let Err(e) = stack.concurrency_layer(GlobalKey) {
        panic!("validated [concurrency] does not build: {e}");
    }
    if let Err(e) = stack.backoff_layer(GlobalKey) {
        panic!("validated [backoff] does not build: {e}");
    }
    if let Err(e) = stack.identity_layer() {
        panic!("validated [identity] does not build: {e}");
    }
    if let Some(limits) = &stack.rate_limit {
        let (merged, ignored) = limits.tighten_with(limits);
        assert!(ignored.is_empty(), "a self-merge ignored {ignored:?}");
        assert_eq!(&merged, limits, "a self-merge changed the limits");
    }
    let (merged, _) = stack.tighten_with(&stack);
    if let Err(e) = merged.concurrency_layer(GlobalKey) {
        panic!("a self-merged [concurrency] does not build: {e}");
    }
    if let Err(e) = merged.backoff_layer(GlobalKey) {
        panic!("a self-merged [backoff] does not build: {e}");
    }
}

/// An error names its field and shows the input escaped.
pub fn check_error(e: &ConfigError) {
    assert!(!e.field.is_empty(), "an error without a field: {e:?}");
    let shown = e.to_string();
    assert!(
        !shown.chars().any(is_hidden),
        "an error shows a hidden character: {shown:?}"
    );
}
