//! The `ratecheck_inference` fuzz target's committed corpus and seeds,
//! replayed through its checks (`fuzz/checks/ratecheck_inference.rs`, the
//! file the fuzz target compiles) on stable by every `cargo test`.

#[path = "../../../fuzz/checks/ratecheck_inference.rs"]
mod ratecheck_inference;

#[test]
fn ratecheck_inference_corpus_passes_its_checks() {
    testkit::fuzz_replay::replay("ratecheck_inference", ratecheck_inference::check);
}
