//! The `ratecheck_inference` fuzz target's committed corpus and seeds,
//! replayed through its checks (`fuzz/checks/ratecheck_inference.rs`) on
//! stable by every `cargo test`. Apart from `fuzz_corpora.rs` because
//! ratecheck's modules and the proxy's both want the crate root.

#[macro_use]
#[path = "support/ratecheck_modules.rs"]
mod ratecheck_modules;
ratecheck_modules!();

#[path = "support/fuzz_replay.rs"]
mod fuzz_replay;

#[path = "../fuzz/checks/ratecheck_inference.rs"]
mod ratecheck_inference;

#[test]
fn ratecheck_inference_corpus_passes_its_checks() {
    fuzz_replay::replay("ratecheck_inference", ratecheck_inference::check);
}
