//! The cooldown parser's checks: any status, any header values, any wall
//! clock, any `max_cooldown`. It never panics, never returns more than
//! `max_cooldown`, clamps by a plain `min`, and is deterministic.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

use std::time::{Duration, UNIX_EPOCH};

use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tower_throttle::backoff::cooldown_from_headers;

const NAMES: [&str; 16] = [
    "retry-after-ms",
    "retry-after",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit--reset",
    "x-ratelimit-reset",
    "x-ratelimit-remaining",
    "ratelimit",
    "ratelimit-policy",
    "x-other",
];

const STATUSES: [u16; 6] = [429, 503, 200, 204, 500, 404];

/// Decode `data` into a status, a clock, a cap and headers, and check the
/// parser's promises on them.
pub fn check(data: &[u8]) {
    if data.len() < 13 {
        return;
    }
    let status = StatusCode::from_u16(STATUSES[data[0] as usize % STATUSES.len()]).unwrap();
    let mut clock = [0u8; 8];
    clock.copy_from_slice(&data[1..9]);
    let now = UNIX_EPOCH + Duration::from_nanos(u64::from_le_bytes(clock) >> 2);
    let mut max = [0u8; 4];
    max.copy_from_slice(&data[9..13]);
    let max = Duration::from_millis(u64::from(u32::from_le_bytes(max)));

    // Records: a name byte, then the value up to the next newline.
    let mut headers = HeaderMap::new();
    for record in data[13..].split(|&b| b == b'\n') {
        let Some((&name, value)) = record.split_first() else {
            continue;
        };
        let name = HeaderName::from_static(NAMES[name as usize % NAMES.len()]);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }

    let clamped = cooldown_from_headers(status, &headers, now, max);
    let unclamped = cooldown_from_headers(status, &headers, now, Duration::MAX);
    assert_eq!(clamped, unclamped.map(|(d, r)| (d.min(max), r)));
    if let Some((wait, reason)) = clamped {
        assert!(wait <= max);
        assert!(reason.is_header());
    }
    assert_eq!(clamped, cooldown_from_headers(status, &headers, now, max));
}
