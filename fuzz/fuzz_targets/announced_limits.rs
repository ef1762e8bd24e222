//! Fuzzes the announced-limits reader; the checks are in
//! `checks/announced_limits.rs`.
//!
//! Run with `cargo +nightly fuzz run announced_limits` from the crate root.

#![no_main]

#[path = "../checks/announced_limits.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
