//! Fuzzes `JsonFieldKey` over arbitrary bodies (differential against serde_json); the checks are in `checks/json_field.rs`.
//!
//! Run with `cargo +nightly fuzz run json_field` from the crate root.

#![no_main]

#[path = "../checks/json_field.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
