//! The `proxy_config` fuzz target's committed corpus and seeds, replayed
//! through its checks (`fuzz/checks/proxy_config.rs`, the file the fuzz
//! target compiles) on stable by every `cargo test`.

#[path = "../../../fuzz/checks/proxy_config.rs"]
mod proxy_config;

#[test]
fn proxy_config_corpus_passes_its_checks() {
    testkit::fuzz_replay::replay("proxy_config", proxy_config::check);
}
