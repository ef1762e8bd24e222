//! Fuzzes identity URL rules; the checks are in `checks/identity_urls.rs`.
//!
//! Run with `cargo +nightly fuzz run identity_urls` from the crate root.

#![no_main]

#[path = "../checks/identity_urls.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
