//! Fuzzes key patterns and rule globs; the checks are in `checks/key_patterns.rs`.
//!
//! Run with `cargo +nightly fuzz run key_patterns` from the crate root.

#![no_main]

#[path = "../checks/key_patterns.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
