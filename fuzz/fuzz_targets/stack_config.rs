//! Fuzzes `StackConfig` TOML; the checks are in `checks/stack_config.rs`.
//!
//! Run with `cargo +nightly fuzz run stack_config` from the crate root.

#![no_main]

#[path = "../checks/stack_config.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
