//! Fuzzes the proxy example's config TOML; the checks are in
//! `checks/proxy_config.rs`, which use the `proxy` crate
//! (`examples/proxy`).
//!
//! Run with `cargo +nightly fuzz run proxy_config` from the crate root.

#![no_main]

#[path = "../checks/proxy_config.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
