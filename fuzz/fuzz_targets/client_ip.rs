//! Fuzzes `ClientIpKey`'s `Forwarded`/`X-Forwarded-For` parsing; the checks are in `checks/client_ip.rs`.
//!
//! Run with `cargo +nightly fuzz run client_ip` from the crate root.

#![no_main]

#[path = "../checks/client_ip.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::check(data));
