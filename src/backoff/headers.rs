//! How long a response asks us to stay away: the cooldown parser.
//!
//! One pure function, [`cooldown_from_headers`], reads the status and the
//! headers of a response against a given wall-clock `now`. Everything a server
//! sends is untrusted: numbers are parsed by hand (no `inf`, `nan`, exponents
//! or signs), arithmetic saturates, and every result is clamped to
//! `[0, max_cooldown]`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use http::header::{HeaderMap, HeaderName, RETRY_AFTER};
use serde::Serialize;

/// Where a cooldown's length came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// `retry-after-ms`: milliseconds, fractional allowed.
    RetryAfterMs,
    /// `Retry-After`: delta-seconds (fractional allowed) or an HTTP-date.
    RetryAfter,
    /// `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`: Go-style
    /// durations such as `6m0s` (OpenAI and compatible gateways).
    ResetDuration,
    /// `anthropic-ratelimit-*-reset`: an RFC 3339 time.
    ResetTime,
    /// `X-RateLimit-Reset`: a Unix time.
    ResetEpoch,
    /// The `t` parameter of the IETF `RateLimit` field.
    RateLimitField,
    /// A gRPC answer's `google.rpc.RetryInfo` detail
    /// (`grpc-status-details-bin`; with the `tonic` feature).
    GrpcRetryInfo,
    /// A gRPC answer's `grpc-retry-pushback-ms`.
    GrpcPushback,
    /// No usable header: the exponential rule, after this many consecutive
    /// 429 responses. Never returned by [`cooldown_from_headers`].
    Exponential {
        /// Consecutive 429 responses without a success in between.
        streak: u32,
    },
    /// Started by another replica sharing the route's cooldown through a
    /// store (Redis), for a reason that replica knows.
    Shared,
}

impl Reason {
    /// True when the length came from a response header.
    pub fn is_header(&self) -> bool {
        !matches!(self, Self::Exponential { .. } | Self::Shared)
    }

    /// The header the length came from, as it is usually spelled; `None` for
    /// the exponential rule.
    pub fn header(&self) -> Option<&'static str> {
        Some(match self {
            Self::RetryAfterMs => "retry-after-ms",
            Self::RetryAfter => "retry-after",
            Self::ResetDuration => "x-ratelimit-reset-*",
            Self::ResetTime => "anthropic-ratelimit-*-reset",
            Self::ResetEpoch => "x-ratelimit-reset",
            Self::RateLimitField => "ratelimit",
            Self::GrpcRetryInfo => "grpc-status-details-bin",
            Self::GrpcPushback => "grpc-retry-pushback-ms",
            Self::Exponential { .. } | Self::Shared => return None,
        })
    }
}

/// The cooldown a response asks for, and which header said so.
///
/// - **429 Too Many Requests**: the first of these that parses wins:
///   `retry-after-ms` (milliseconds, fractional allowed); `Retry-After` as
///   delta-seconds (fractional allowed) or HTTP-date; the provider reset
///   headers `x-ratelimit-reset-requests` / `-tokens` (Go-style durations:
///   `1s`, `6m0s`, `12ms`, `1m30.5s`), `anthropic-ratelimit-*-reset` (RFC 3339
///   times, any offset), `X-RateLimit-Reset` (Unix time), and the `t`
///   parameter of the IETF `RateLimit` field. Among the reset headers of one
///   kind, those whose matching `remaining` is `0` are preferred, and the
///   longest of them is taken.
/// - **503 Service Unavailable**: `retry-after-ms` and `Retry-After` only.
/// - **A gRPC answer refused at once** (HTTP 200 with `grpc-status` in
///   its headers): `RESOURCE_EXHAUSTED` that says when to retry as a 429
///   (a bare one is no pushback: gRPC says the same of a message over the
///   size limit) and `UNAVAILABLE` as a 503, the wait from its
///   `google.rpc.RetryInfo` detail (with the `tonic` feature) or else
///   `grpc-retry-pushback-ms`; a negative or unreadable pushback is gRPC's
///   "do not retry", and asks for no cooldown.
/// - **2xx**: only a route the response says is exhausted (a reset header
///   whose matching `remaining` is `0`): the proactive cooldown.
/// - Anything else: `None`.
///
/// `None` also when no header parses: the caller falls back to its own rule
/// (the layer's exponential backoff). A time in the past means no wait
/// (`Some(Duration::ZERO)`). Every value is clamped to `max_cooldown`.
///
/// Hostile values are handled, never trusted: `inf`, `nan`, exponents, signs
/// (`-10`) and garbage do not parse; numbers too large for any clock (a
/// 35-digit `Retry-After`) saturate and are clamped; dates outside years
/// 1970–9999 (HTTP-dates) or 0000–9999 (RFC 3339) do not parse.
///
/// `X-RateLimit-Reset` is read as Unix seconds (fractions allowed). Two
/// common deviations are recognised by size: a value of 10¹¹ or more is Unix
/// *milliseconds* (no reset is 3,000 years away; every millisecond timestamp
/// since 1973 is that large), and a value below 10⁹ (before September 2001)
/// is a delta in seconds, as some servers send it.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{HeaderMap, StatusCode};
/// use tower_throttle::backoff::{cooldown_from_headers, Reason};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "999999999".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "6m0s".parse().unwrap());
/// let max = Duration::from_secs(300);
/// let now = SystemTime::now();
/// assert_eq!(
///     cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &headers, now, max),
///     Some((max, Reason::RetryAfter)), // clamped, never trusted
/// );
/// ```
pub fn cooldown_from_headers(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
    max_cooldown: Duration,
) -> Option<(Duration, Reason)> {
    // A gRPC refusal says its wait its own way; any other answer, and a
    // gRPC success read proactively, in the HTTP headers.
    let grpc = super::grpc::is_grpc(status, headers);
    let status = super::grpc::as_http_status(status, headers);
    let (wait, reason) = match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE if grpc => {
            super::grpc::wait(headers)?
        }
        _ => advised(status, headers, now)?,
    };
    Some((wait.min(max_cooldown), reason))
}

/// Whether a reset header must come with `remaining: 0` to count.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Any reset counts; exhausted ones are preferred (a 429).
    Any,
    /// Only an exhausted route counts (a success, read proactively).
    Exhausted,
}

fn advised(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Option<(Duration, Reason)> {
    match status {
        StatusCode::TOO_MANY_REQUESTS => {
            retry_after(headers, now).or_else(|| provider_reset(headers, now, Need::Any))
        }
        StatusCode::SERVICE_UNAVAILABLE => retry_after(headers, now),
        s if s.is_success() => provider_reset(headers, now, Need::Exhausted),
        _ => None,
    }
}

const NANOS_PER_MS: u128 = 1_000_000;
/// Nanoseconds in a second: the unit [`decimal`] reads seconds in.
pub(crate) const NANOS_PER_SEC: u128 = 1_000_000_000;

const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
/// OpenAI-style reset headers and the `remaining` header each goes with.
const GO_RESETS: [(HeaderName, HeaderName); 2] = [
    (
        HeaderName::from_static("x-ratelimit-reset-requests"),
        HeaderName::from_static("x-ratelimit-remaining-requests"),
    ),
    (
        HeaderName::from_static("x-ratelimit-reset-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-tokens"),
    ),
];
const EPOCH_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const EPOCH_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const ANTHROPIC: &str = "anthropic-ratelimit-";

fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<(Duration, Reason)> {
    if let Some(wait) = text(headers, &RETRY_AFTER_MS).and_then(|v| decimal(v, NANOS_PER_MS)) {
        return Some((wait, Reason::RetryAfterMs));
    }
    let value = text(headers, &RETRY_AFTER)?;
    let wait = match decimal(value, NANOS_PER_SEC) {
        Some(wait) => wait,
        None => {
            let date = httpdate::parse_http_date(value).ok()?;
            until(system_nanos(date), now)
        }
    };
    Some((wait, Reason::RetryAfter))
}

fn provider_reset(headers: &HeaderMap, now: SystemTime, need: Need) -> Option<(Duration, Reason)> {
    let mut pick = Pick::default();
    for (reset, remaining) in &GO_RESETS {
        let wait = text(headers, reset).and_then(go_duration);
        pick.offer(wait, exhausted(headers, remaining));
    }
    if let Some(wait) = pick.take(need) {
        return Some((wait, Reason::ResetDuration));
    }

    for (name, value) in headers {
        let Some(limit) = name
            .as_str()
            .strip_prefix(ANTHROPIC)
            .and_then(|rest| rest.strip_suffix("-reset"))
        else {
            continue;
        };
        let wait = trimmed(value.as_bytes())
            .and_then(rfc3339_nanos)
            .map(|at| until(at, now));
        pick.offer(wait, anthropic_exhausted(headers, limit));
    }
    if let Some(wait) = pick.take(need) {
        return Some((wait, Reason::ResetTime));
    }

    let wait = text(headers, &EPOCH_RESET).and_then(|v| epoch_reset(v, now));
    pick.offer(wait, exhausted(headers, &EPOCH_REMAINING));
    if let Some(wait) = pick.take(need) {
        return Some((wait, Reason::ResetEpoch));
    }

    for value in headers.get_all(&RATELIMIT) {
        if let Some(value) = trimmed(value.as_bytes()) {
            for member in split_outside_quotes(value, b',') {
                let (wait, exhausted) = ratelimit_member(member);
                pick.offer(wait, exhausted);
            }
        }
    }
    pick.take(need).map(|wait| (wait, Reason::RateLimitField))
}

/// The longest candidate, preferring those from an exhausted limit.
#[derive(Default)]
struct Pick {
    exhausted: Option<Duration>,
    any: Option<Duration>,
}

impl Pick {
    fn offer(&mut self, wait: Option<Duration>, exhausted: bool) {
        let Some(wait) = wait else { return };
        if exhausted {
            self.exhausted = self.exhausted.max(Some(wait));
        }
        self.any = self.any.max(Some(wait));
    }

    fn take(&mut self, need: Need) -> Option<Duration> {
        let picked = match need {
            Need::Any => self.exhausted.or(self.any),
            Need::Exhausted => self.exhausted,
        };
        *self = Self::default();
        picked
    }
}

/// Whether header `name` says nothing is left (`0`).
fn exhausted(headers: &HeaderMap, name: &HeaderName) -> bool {
    text(headers, name).is_some_and(is_zero)
}

/// Whether `anthropic-ratelimit-{limit}-remaining` is `0`.
fn anthropic_exhausted(headers: &HeaderMap, limit: &str) -> bool {
    headers.iter().any(|(name, value)| {
        name.as_str()
            .strip_prefix(ANTHROPIC)
            .and_then(|rest| rest.strip_suffix("-remaining"))
            == Some(limit)
            && trimmed(value.as_bytes()).is_some_and(is_zero)
    })
}

fn is_zero(value: &str) -> bool {
    decimal(value, NANOS_PER_SEC) == Some(Duration::ZERO)
}

/// One member of a `RateLimit` field (`"default";r=0;t=30`): its `t` as a
/// wait, and whether its `r` is zero.
fn ratelimit_member(member: &str) -> (Option<Duration>, bool) {
    let mut wait = None;
    let mut exhausted = false;
    // The first piece is the policy name; the rest are parameters.
    for param in split_outside_quotes(member, b';').skip(1) {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        let value = value.trim_matches(|c| c == ' ' || c == '\t');
        match key.trim_matches(|c| c == ' ' || c == '\t') {
            "t" => wait = decimal(value, NANOS_PER_SEC),
            "r" => exhausted = is_zero(value),
            _ => {}
        }
    }
    (wait, exhausted)
}

/// Pieces of `s` split at `sep`, except inside double quotes (the members
/// and parameters of a structured field such as `RateLimit`).
pub(crate) fn split_outside_quotes(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (i, &b) in s.as_bytes().iter().enumerate() {
            if escaped {
                escaped = false;
            } else if quoted && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = !quoted;
            } else if b == sep && !quoted {
                rest = Some(&s[i + 1..]);
                return Some(&s[..i]);
            }
        }
        rest = None;
        Some(s)
    })
}

/// Header `name`'s first value, trimmed of spaces and tabs; `None` when
/// absent, empty or not UTF-8.
pub(crate) fn text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    trimmed(headers.get(name)?.as_bytes())
}

/// `bytes` as text trimmed of spaces and tabs; `None` when empty or not
/// UTF-8.
pub(crate) fn trimmed(bytes: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(bytes).ok()?;
    let s = s.trim_matches(|c| c == ' ' || c == '\t');
    (!s.is_empty()).then_some(s)
}

/// Integer parts above this saturate: far beyond any clock, and small enough
/// that no product below overflows a `u128`.
const INT_CAP: u128 = 1_000_000_000_000_000_000;

/// A plain decimal number of `unit_nanos` units: digits, optionally a dot and
/// more digits. No sign, exponent, `inf` or `nan`. Digits past nanosecond
/// precision are dropped; huge values saturate.
pub(crate) fn decimal(s: &str, unit_nanos: u128) -> Option<Duration> {
    let (int, frac) = match s.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (s, None),
    };
    if int.is_empty() || frac.is_some_and(str::is_empty) {
        return None;
    }
    let nanos = number_nanos(int, frac.unwrap_or(""), unit_nanos)?;
    Some(duration(nanos))
}

/// `int.frac` units of `unit_nanos`, in nanoseconds; `None` unless both are
/// ASCII digits only.
fn number_nanos(int: &str, frac: &str, unit_nanos: u128) -> Option<u128> {
    let mut whole: u128 = 0;
    for b in int.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        whole = (whole * 10 + u128::from(b - b'0')).min(INT_CAP);
    }
    // The fraction, as billionths of a unit.
    let mut billionths: u128 = 0;
    let mut scale: u128 = NANOS_PER_SEC;
    for b in frac.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        if scale > 1 {
            scale /= 10;
            billionths += u128::from(b - b'0') * scale;
        }
    }
    Some(whole * unit_nanos + billionths * unit_nanos / NANOS_PER_SEC)
}

/// A Go `time.Duration` string: `1s`, `6m0s`, `12ms`, `1m30.5s`, `1h`,
/// `500us`. A sign, a missing unit (except a bare `0`) or an unknown unit is
/// malformed.
pub(crate) fn go_duration(s: &str) -> Option<Duration> {
    if s.is_empty() {
        return None;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .bytes()
            .position(|b| b.is_ascii_digit() || b == b'.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => NANOS_PER_MS,
            "s" => NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "h" => 3_600 * NANOS_PER_SEC,
            _ => return None,
        };
        // Go accepts `1.5s`, `.5s` and `1.s`, but not a lone `.`.
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        total = total.saturating_add(number_nanos(int, frac, unit_nanos)?);
        rest = tail;
    }
    Some(duration(total))
}

/// `X-RateLimit-Reset`: Unix seconds, Unix milliseconds (10¹¹ and above) or
/// delta-seconds (below 10⁹).
fn epoch_reset(s: &str, now: SystemTime) -> Option<Duration> {
    let value = decimal(s, NANOS_PER_SEC)?;
    if value < Duration::from_secs(1_000_000_000) {
        return Some(value);
    }
    let nanos = if value >= Duration::from_secs(100_000_000_000) {
        // Milliseconds: the same digits, a thousandth of the value.
        value.as_nanos() / 1_000
    } else {
        value.as_nanos()
    };
    Some(until(i128::try_from(nanos).unwrap_or(i128::MAX), now))
}

/// Nanoseconds since the Unix epoch (negative before it).
fn system_nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => i128::try_from(before.duration().as_nanos()).map_or(i128::MIN, |n| -n),
    }
}

/// The wait from `now` until `at` (Unix nanoseconds); zero when `at` is past.
pub(crate) fn until(at: i128, now: SystemTime) -> Duration {
    let wait = at.saturating_sub(system_nanos(now));
    duration(u128::try_from(wait).unwrap_or(0))
}

/// Nanoseconds as a `Duration`, saturating at `Duration::MAX`.
pub(super) fn duration(nanos: u128) -> Duration {
    let nanos = nanos.min(Duration::MAX.as_nanos());
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10⁹, so it always fits.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, sub)
}

/// An RFC 3339 date-time (`2024-05-01T12:00:30.5Z`, `...+02:00`), as Unix
/// nanoseconds.
///
/// Written here rather than taken from a crate: `humantime` (already a
/// dependency) reads only UTC and would refuse `+02:00`, `httpdate` reads
/// only HTTP-dates, and a date crate would be a large dependency for forty
/// lines. The grammar is RFC 3339 §5.6 with its note that a space may stand
/// for `T`; day-of-month and leap years are checked; a leap second (`:60`)
/// reads as the next second.
pub(crate) fn rfc3339_nanos(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter().try_fold(0i64, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let sep = |at: usize, allowed: &[u8]| b.get(at).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos: i64 = 0;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        let mut scale = 1_000_000_000;
        while let Some(d) = b.get(at).filter(|d| d.is_ascii_digit()) {
            if scale > 1 {
                scale /= 10;
                nanos += i64::from(d - b'0') * scale;
            }
            at += 1;
        }
        if at == start {
            return None;
        }
    }
    let offset_secs = match b.get(at..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let two = |a: u8, b: u8| -> Option<i64> {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| i64::from(a - b'0') * 10 + i64::from(b - b'0'))
            };
            let (oh, om) = (two(*h1, *h2)?, two(*m1, *m2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let offset = oh * 3_600 + om * 60;
            if *sign == b'+' { offset } else { -offset }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_secs;
    Some(i128::from(secs) * 1_000_000_000 + i128::from(nanos))
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(0, 1, 1), -719_528);
    }

    #[test]
    fn rfc3339_reads_offsets_fractions_and_leap_seconds() {
        let base = rfc3339_nanos("2024-02-29T12:00:00Z");
        assert_eq!(base, Some(1_709_208_000 * 1_000_000_000));
        assert_eq!(rfc3339_nanos("2024-02-29T14:00:00+02:00"), base);
        assert_eq!(rfc3339_nanos("2024-02-29 11:30:00-00:30"), base);
        assert_eq!(
            rfc3339_nanos("2024-02-29T12:00:00.25z"),
            base.map(|n| n + 250_000_000)
        );
        assert_eq!(
            rfc3339_nanos("2024-02-29T11:59:60Z"),
            base,
            "a leap second reads as the next second"
        );
        for bad in [
            "2023-02-29T12:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+2:00",
            "2024-01-01T00:00:00+24:00",
            "100000-01-01T00:00:00Z",
            "2024-01-01T00:00:00Zjunk",
            "+024-01-01T00:00:00Z",
        ] {
            assert_eq!(rfc3339_nanos(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_knows_the_calendar_and_the_offsets_bounds() {
        // Leap years: every fourth, but not a century unless every fourth.
        assert!(rfc3339_nanos("2000-02-29T00:00:00Z").is_some());
        assert!(rfc3339_nanos("1900-02-29T00:00:00Z").is_none());
        assert!(rfc3339_nanos("2100-02-29T00:00:00Z").is_none());
        assert!(rfc3339_nanos("2024-04-31T00:00:00Z").is_none());
        assert!(rfc3339_nanos("2024-04-30T00:00:00Z").is_some());
        // Offsets up to 23:59, not beyond.
        let base = rfc3339_nanos("2024-05-01T00:00:00Z").map(|n| n - 3_600 * 1_000_000_000);
        assert_eq!(rfc3339_nanos("2024-05-01T00:00:00+01:00"), base);
        assert!(rfc3339_nanos("2024-05-01T00:00:00+23:00").is_some());
        assert!(rfc3339_nanos("2024-05-01T00:00:00-00:59").is_some());
        assert!(rfc3339_nanos("2024-05-01T00:00:00+00:60").is_none());
    }

    #[test]
    fn go_durations_sum_their_parts() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration("1m30.5s"), Some(ms(90_500)));
        assert_eq!(go_duration("6m0s"), Some(ms(360_000)));
        assert_eq!(
            go_duration("1h2m3s4ms5us6ns"),
            Some(Duration::new(3_723, 4_005_006))
        );
        assert_eq!(go_duration(".5s"), Some(ms(500)));
        assert_eq!(go_duration("500\u{b5}s"), Some(Duration::from_micros(500)));
        for bad in [
            "", "1", "-1s", "+1s", "1x", "s", ".s", "1.5.5s", "1 s", "infs",
        ] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decimals_saturate_instead_of_overflowing() {
        let huge = "9".repeat(60);
        assert!(decimal(&huge, NANOS_PER_SEC).is_some_and(|d| d > Duration::from_secs(1 << 40)));
        assert_eq!(
            decimal("1.0000000019", NANOS_PER_SEC),
            Some(Duration::new(1, 1))
        );
        assert_eq!(
            decimal("0.5", NANOS_PER_MS),
            Some(Duration::from_micros(500))
        );
    }
}
