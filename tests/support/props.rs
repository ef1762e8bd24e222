//! The proptest settings of the property tests: the case count, from
//! `TT_PROPTEST_CASES` (for long runs) or each property's default (sized
//! for CI), and shrinking that runs to the end.

use proptest::prelude::ProptestConfig;

/// `default` cases per property, or `TT_PROPTEST_CASES`.
pub fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("TT_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        // Enough to shrink a 40-step history all the way (the default stops
        // at four times the case count).
        max_shrink_iters: 100_000,
        ..ProptestConfig::default()
    }
}
