//! Fuzzes the cooldown parser; the checks are in `checks/cooldown_headers.rs`.
//!
//! Run with `cargo +nightly fuzz run cooldown_headers` from the crate root.

#![no_main]

#[path = "../checks/cooldown_headers.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
