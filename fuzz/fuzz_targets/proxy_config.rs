//! Fuzzes the proxy example's config TOML; the checks are in
//! `checks/proxy_config.rs`. The example's modules are compiled in, as the
//! main crate's tests do (`tests/support/proxy_modules.rs`).
//!
//! Run with `cargo +nightly fuzz run proxy_config` from the crate root.

#![no_main]

#[allow(dead_code)]
#[path = "../../examples/proxy/app.rs"]
mod app;
#[allow(dead_code)]
#[path = "../../examples/proxy/bench.rs"]
mod bench;
#[allow(dead_code)]
#[path = "../../examples/proxy/bench_tls.rs"]
mod bench_tls;
#[allow(dead_code)]
#[path = "../../examples/proxy/cli.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../../examples/proxy/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../examples/proxy/demo.rs"]
mod demo;
#[allow(dead_code)]
#[path = "../../examples/proxy/edge.rs"]
mod edge;
#[allow(dead_code)]
#[path = "../../examples/proxy/gateway.rs"]
mod gateway;
#[allow(dead_code)]
#[path = "../../examples/proxy/learn.rs"]
mod learn;
#[allow(dead_code)]
#[path = "../../examples/proxy/live.rs"]
mod live;
#[allow(dead_code)]
#[path = "../../examples/proxy/operator.rs"]
mod operator;
#[allow(dead_code)]
#[path = "../../examples/proxy/preset.rs"]
mod preset;
#[allow(dead_code)]
#[path = "../../examples/proxy/reload.rs"]
mod reload;
#[allow(dead_code)]
#[path = "../../examples/proxy/serve.rs"]
mod serve;
#[allow(dead_code)]
#[path = "../../examples/proxy/signal.rs"]
mod signal;
#[allow(dead_code)]
#[path = "../../examples/proxy/simulator.rs"]
mod simulator;
#[allow(dead_code)]
#[path = "../../examples/proxy/stats.rs"]
mod stats;
#[allow(dead_code)]
#[path = "../../examples/proxy/tls.rs"]
mod tls;
#[allow(dead_code)]
#[path = "../../examples/proxy/usage.rs"]
mod usage;

#[path = "../checks/proxy_config.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
