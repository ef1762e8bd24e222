//! Fuzzes ratecheck's inference over arbitrary response timelines; the
//! checks are in `checks/ratecheck_inference.rs`, which use the
//! `ratecheck` crate (`examples/ratecheck`).
//!
//! Run with `cargo +nightly fuzz run ratecheck_inference` from the crate root.

#![no_main]

#[path = "../checks/ratecheck_inference.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
