//! Every fuzz target's committed corpus and seeds, replayed through the
//! target's own checks (`fuzz/checks/`, shared by `#[path]`): the inputs
//! the fuzzer found interesting, re-checked on stable by every `cargo
//! test`. The proxy's and ratecheck's targets are replayed by their own
//! crates' tests (`examples/*/tests/fuzz_corpus.rs`). See `fuzz/README.md`.

use testkit::fuzz_replay;

#[path = "../fuzz/checks/announced_limits.rs"]
mod announced_limits;
#[path = "../fuzz/checks/client_ip.rs"]
mod client_ip;
#[path = "../fuzz/checks/cooldown_headers.rs"]
mod cooldown_headers;
#[path = "../fuzz/checks/identity_urls.rs"]
mod identity_urls;
#[path = "../fuzz/checks/json_field.rs"]
mod json_field;
#[path = "../fuzz/checks/key_patterns.rs"]
mod key_patterns;
#[path = "../fuzz/checks/stack_config.rs"]
mod stack_config;

use fuzz_replay::replay;

#[test]
fn cooldown_headers_corpus_passes_its_checks() {
    replay("cooldown_headers", cooldown_headers::check);
}

#[test]
fn announced_limits_corpus_passes_its_checks() {
    replay("announced_limits", announced_limits::check);
}

#[test]
fn stack_config_corpus_passes_its_checks() {
    replay("stack_config", stack_config::check);
}

#[test]
fn key_patterns_corpus_passes_its_checks() {
    replay("key_patterns", key_patterns::check);
}

#[test]
fn identity_urls_corpus_passes_its_checks() {
    replay("identity_urls", identity_urls::check);
}

#[test]
fn json_field_corpus_passes_its_checks() {
    replay("json_field", json_field::check);
}

#[test]
fn client_ip_corpus_passes_its_checks() {
    replay("client_ip", client_ip::check);
}
