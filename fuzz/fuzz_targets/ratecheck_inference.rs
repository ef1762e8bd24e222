//! Fuzzes ratecheck's inference over arbitrary response timelines; the
//! checks are in `checks/ratecheck_inference.rs`. The example's modules are
//! compiled in, as the main crate's tests do
//! (`tests/support/ratecheck_modules.rs`).
//!
//! Run with `cargo +nightly fuzz run ratecheck_inference` from the crate root.

#![no_main]

#[allow(dead_code)]
#[path = "../../examples/ratecheck/cli.rs"]
mod cli;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/inference.rs"]
mod inference;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/models.rs"]
mod models;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/probe.rs"]
mod probe;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/schedule.rs"]
mod schedule;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/timeline.rs"]
mod timeline;
#[allow(dead_code)]
#[path = "../../examples/ratecheck/tls.rs"]
mod tls;

#[path = "../checks/ratecheck_inference.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
