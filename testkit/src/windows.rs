//! Counting admissions in windows, for tests that check a limit held.

use std::time::Duration;

use tokio::time::Instant;

/// The most admissions `instants` has inside any window of `window`.
pub fn most_in_any_window(instants: &[Instant], window: Duration) -> usize {
    let mut sorted = instants.to_vec();
    sorted.sort();
    (0..sorted.len())
        .map(|i| {
            sorted[i..]
                .iter()
                .take_while(|&&t| t - sorted[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}
