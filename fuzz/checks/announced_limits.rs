//! The announced-limits reader's checks: any wall clock (before the Unix
//! epoch and past year 9999 too), any header values, repeated headers, over
//! every header name `announced_limits` reads and one it must not.
//!
//! For `announced_limits` and for `announced_limits_in` with each family:
//! it never panics; a limit is never zero; a window is never zero, and is
//! given only with something said; a reset is within the bound its family's
//! reader applies; the answer is deterministic. Besides: each family reads
//! only its own headers, `announced_limits` is per unit the first family
//! that says something (OpenAI, Anthropic, IETF), and so equals
//! `announced_limits_in` when only that family's headers are present; the
//! OpenAI and Anthropic counts are the first value's digits, against a
//! reference written here.
//!
//! Shared by the fuzz target and `tests/fuzz_corpora.rs` (by `#[path]`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use tower_throttle::backoff::{
    Announced, Announcement, HeaderFamily, PROVIDER_WINDOW, announced_limits, announced_limits_in,
};

const NAMES: [&str; 24] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    // Read by none of them (the cooldown parser's epoch family).
    "x-ratelimit-limit",
];

const FAMILIES: [HeaderFamily; 3] = [
    HeaderFamily::OpenAi,
    HeaderFamily::Anthropic,
    HeaderFamily::Ietf,
];

/// The family a header name belongs to; `None` for the unrelated one.
fn family_of(name: &str) -> Option<HeaderFamily> {
    if name.starts_with("anthropic-ratelimit-") {
        Some(HeaderFamily::Anthropic)
    } else if name.starts_with("ratelimit") {
        Some(HeaderFamily::Ietf)
    } else if name.ends_with("-requests") || name.ends_with("-tokens") {
        Some(HeaderFamily::OpenAi)
    } else {
        None
    }
}

/// The latest instant an RFC 3339 reset can name:
/// `9999-12-31T23:59:60.999999999-23:59` (the reader takes years up to
/// 9999, a leap second and offsets up to 23:59), in Unix nanoseconds.
const LATEST_RFC3339_NANOS: i128 = (253_402_300_799 + 1 + 86_340) * 1_000_000_000 + 999_999_999;

/// The longest IETF reset: `t` in seconds, whose integer part saturates at
/// 10¹⁸ (the shared `decimal` reader's cap), plus a fraction below a second.
const LONGEST_IETF_RESET: Duration = Duration::new(1_000_000_000_000_000_000, 999_999_999);

/// Decode `data` into a clock and headers, and check the reader's promises
/// on them.
pub fn check(data: &[u8]) {
    if data.len() < 12 {
        return;
    }
    // Whole seconds from a signed 64-bit number (about ±17,000 years around
    // the epoch), nanoseconds from the next four bytes.
    let secs = i64::from_le_bytes(data[0..8].try_into().unwrap()) >> 24;
    let nanos = u32::from_le_bytes(data[8..12].try_into().unwrap()) % 1_000_000_000;
    let now = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(secs.unsigned_abs(), nanos))
    } else {
        UNIX_EPOCH.checked_sub(Duration::new(secs.unsigned_abs(), nanos))
    };
    let Some(now) = now else { return };

    // Records: a name byte, then the value up to the next newline; a name
    // may come again.
    let mut headers = HeaderMap::new();
    for record in data[12..].split(|&b| b == b'\n') {
        let Some((&name, value)) = record.split_first() else {
            continue;
        };
        let name = HeaderName::from_static(NAMES[name as usize % NAMES.len()]);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }

    let all = announced_limits(&headers, now);
    assert_eq!(all, announced_limits(&headers, now), "deterministic");
    sane(&all);

    let mut by_family = Vec::new();
    for family in FAMILIES {
        let said = announced_limits_in(&headers, now, family);
        assert_eq!(said, announced_limits_in(&headers, now, family));
        sane(&said);
        within_bounds(&said, family, now);

        // A family reads only its own headers; alone, it is what
        // `announced_limits` reads.
        let own = only(&headers, family);
        assert_eq!(said, announced_limits_in(&own, now, family), "{family:?}");
        assert_eq!(said, announced_limits(&own, now), "{family:?} alone");
        by_family.push(said);
    }
    let units = |a: &Announcement| [a.requests, a.tokens, a.input_tokens, a.output_tokens];
    for (unit, got) in units(&all).into_iter().enumerate() {
        let first = by_family
            .iter()
            .map(|a| units(a)[unit])
            .find(|a| !a.is_empty())
            .unwrap_or_default();
        assert_eq!(got, first, "unit {unit}: the first family that says it");
    }

    // The counts of the OpenAI and Anthropic headers, by a reference.
    let openai = &by_family[0];
    for (unit, said) in [("requests", openai.requests), ("tokens", openai.tokens)] {
        let limit = first_count(&headers, &format!("x-ratelimit-limit-{unit}"));
        let remaining = first_count(&headers, &format!("x-ratelimit-remaining-{unit}"));
        assert_eq!(said.limit, limit.filter(|n| *n > 0), "openai {unit}");
        assert_eq!(said.remaining, remaining, "openai {unit}");
    }
    let anthropic = &by_family[1];
    for (unit, said) in ["requests", "tokens", "input-tokens", "output-tokens"]
        .into_iter()
        .zip(units(anthropic))
    {
        let limit = first_count(&headers, &format!("anthropic-ratelimit-{unit}-limit"));
        let remaining = first_count(&headers, &format!("anthropic-ratelimit-{unit}-remaining"));
        assert_eq!(said.limit, limit.filter(|n| *n > 0), "anthropic {unit}");
        assert_eq!(said.remaining, remaining, "anthropic {unit}");
    }
}

/// What holds of any answer, whichever family gave it.
fn sane(said: &Announcement) {
    for unit in [
        said.requests,
        said.tokens,
        said.input_tokens,
        said.output_tokens,
    ] {
        assert_ne!(unit.limit, Some(0), "a zero limit: {said:?}");
        assert_ne!(unit.window, Some(Duration::ZERO), "a zero window: {said:?}");
        if unit.is_empty() {
            assert_eq!(unit, Announced::default(), "a window with nothing said");
        }
    }
}

/// The bounds each family's reader applies to what it reads.
fn within_bounds(said: &Announcement, family: HeaderFamily, now: SystemTime) {
    let units = [
        said.requests,
        said.tokens,
        said.input_tokens,
        said.output_tokens,
    ];
    match family {
        HeaderFamily::OpenAi => {
            // Go durations saturate at `Duration::MAX`: no bound to check
            // beyond the type's.
            for unit in &units[..2] {
                assert_eq!(unit.window, (!unit.is_empty()).then_some(PROVIDER_WINDOW));
            }
            assert!(units[2].is_empty() && units[3].is_empty());
        }
        HeaderFamily::Anthropic => {
            let latest = LATEST_RFC3339_NANOS.saturating_sub(unix_nanos(now)).max(0);
            for unit in units {
                assert_eq!(unit.window, (!unit.is_empty()).then_some(PROVIDER_WINDOW));
                if let Some(reset) = unit.reset {
                    assert!(reset.as_nanos() <= latest as u128, "{reset:?} at {now:?}");
                }
            }
        }
        HeaderFamily::Ietf => {
            if let Some(reset) = units[0].reset {
                assert!(reset <= LONGEST_IETF_RESET, "{reset:?}");
            }
            assert!(units[1..].iter().all(Announced::is_empty));
        }
        _ => unreachable!("a family this check does not know"),
    }
}

/// `headers` without those of other families (the unrelated one kept).
fn only(headers: &HeaderMap, family: HeaderFamily) -> HeaderMap {
    let mut own = HeaderMap::new();
    for (name, value) in headers {
        if family_of(name.as_str()).is_none_or(|f| f == family) {
            own.append(name.clone(), value.clone());
        }
    }
    own
}

/// Header `name`'s first value as a count: trimmed of spaces and tabs, ASCII
/// digits only, at most `u64::MAX`.
fn first_count(headers: &HeaderMap, name: &str) -> Option<u64> {
    let value = std::str::from_utf8(headers.get(name)?.as_bytes()).ok()?;
    let digits = value.trim_matches([' ', '\t']);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    if significant.len() > 20 {
        return Some(u64::MAX);
    }
    let n: u128 = significant.parse().unwrap_or(0);
    Some(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Nanoseconds since the Unix epoch, negative before it.
fn unix_nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}
