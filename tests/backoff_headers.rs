//! The cooldown parser: a table of every header form and hostile value, and
//! a bounded property test over random bytes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tower_throttle::backoff::{Reason, cooldown_from_headers};

/// 2024-05-01T00:00:00Z, a Wednesday.
const NOW: u64 = 1_714_521_600;
const MAX: Duration = Duration::from_secs(3_600);

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("test header name");
        let value = HeaderValue::from_bytes(value).expect("test header value");
        map.append(name, value);
    }
    map
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

const TOO_MANY: u16 = 429;

struct Case {
    name: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static [u8])],
    want: Option<(Duration, Reason)>,
}

fn case(
    name: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static [u8])],
    want: Option<(Duration, Reason)>,
) -> Case {
    Case {
        name,
        status,
        headers,
        want,
    }
}

#[test]
fn every_header_form_and_hostile_value_parses_as_the_table_says() {
    use Reason::*;
    let ms = Duration::from_millis;
    let s = Duration::from_secs;
    let cases = [
        // retry-after-ms
        case(
            "ms integer",
            TOO_MANY,
            &[("retry-after-ms", b"1500")],
            Some((ms(1500), RetryAfterMs)),
        ),
        case(
            "ms fractional",
            TOO_MANY,
            &[("retry-after-ms", b"2.5")],
            Some((Duration::from_micros(2500), RetryAfterMs)),
        ),
        case(
            "ms whitespace",
            TOO_MANY,
            &[("retry-after-ms", b"  100\t")],
            Some((ms(100), RetryAfterMs)),
        ),
        case(
            "ms mixed-case name",
            TOO_MANY,
            &[("Retry-After-MS", b"40")],
            Some((ms(40), RetryAfterMs)),
        ),
        case(
            "ms beats retry-after",
            TOO_MANY,
            &[("retry-after", b"9"), ("retry-after-ms", b"250")],
            Some((ms(250), RetryAfterMs)),
        ),
        case(
            "malformed ms falls to retry-after",
            TOO_MANY,
            &[("retry-after-ms", b"nan"), ("retry-after", b"4")],
            Some((s(4), RetryAfter)),
        ),
        case(
            "ms 35 digits clamped",
            TOO_MANY,
            &[("retry-after-ms", b"12345678901234567890123456789012345")],
            Some((MAX, RetryAfterMs)),
        ),
        // Retry-After: delta-seconds
        case(
            "delta seconds",
            TOO_MANY,
            &[("retry-after", b"120")],
            Some((s(120), RetryAfter)),
        ),
        case(
            "fractional seconds",
            TOO_MANY,
            &[("retry-after", b"1.5")],
            Some((ms(1500), RetryAfter)),
        ),
        case(
            "upper-case name",
            TOO_MANY,
            &[("RETRY-AFTER", b"7")],
            Some((s(7), RetryAfter)),
        ),
        case(
            "tabs and spaces",
            TOO_MANY,
            &[("retry-after", b"\t 7 \t")],
            Some((s(7), RetryAfter)),
        ),
        case(
            "zero",
            TOO_MANY,
            &[("retry-after", b"0")],
            Some((Duration::ZERO, RetryAfter)),
        ),
        case(
            "leading zeros",
            TOO_MANY,
            &[("retry-after", b"0005")],
            Some((s(5), RetryAfter)),
        ),
        case("inf", TOO_MANY, &[("retry-after", b"inf")], None),
        case("nan", TOO_MANY, &[("retry-after", b"NaN")], None),
        case("Infinity", TOO_MANY, &[("retry-after", b"Infinity")], None),
        case("negative", TOO_MANY, &[("retry-after", b"-10")], None),
        case("plus sign", TOO_MANY, &[("retry-after", b"+10")], None),
        case("exponent", TOO_MANY, &[("retry-after", b"1e3")], None),
        case("lone dot", TOO_MANY, &[("retry-after", b".")], None),
        case("trailing dot", TOO_MANY, &[("retry-after", b"5.")], None),
        case("two numbers", TOO_MANY, &[("retry-after", b"5, 6")], None),
        case(
            "35-digit number clamped",
            TOO_MANY,
            &[("retry-after", b"12345678901234567890123456789012345")],
            Some((MAX, RetryAfter)),
        ),
        case(
            "hostile 999999999 clamped",
            TOO_MANY,
            &[("retry-after", b"999999999")],
            Some((MAX, RetryAfter)),
        ),
        case(
            "garbage",
            TOO_MANY,
            &[("retry-after", b"soon, please")],
            None,
        ),
        case("empty", TOO_MANY, &[("retry-after", b"")], None),
        case("not UTF-8", TOO_MANY, &[("retry-after", b"\xff\xfe")], None),
        case(
            "first of two values",
            TOO_MANY,
            &[("retry-after", b"3"), ("retry-after", b"300")],
            Some((s(3), RetryAfter)),
        ),
        // Retry-After: HTTP-date
        case(
            "IMF-fixdate in the future",
            TOO_MANY,
            &[("retry-after", b"Wed, 01 May 2024 00:00:30 GMT")],
            Some((s(30), RetryAfter)),
        ),
        case(
            "IMF-fixdate in the past",
            TOO_MANY,
            &[("retry-after", b"Tue, 30 Apr 2024 23:59:00 GMT")],
            Some((Duration::ZERO, RetryAfter)),
        ),
        case(
            "RFC 850 date",
            TOO_MANY,
            &[("retry-after", b"Wednesday, 01-May-24 00:01:00 GMT")],
            Some((s(60), RetryAfter)),
        ),
        case(
            "asctime date",
            TOO_MANY,
            &[("retry-after", b"Wed May  1 00:00:10 2024")],
            Some((s(10), RetryAfter)),
        ),
        case(
            "far-future date clamped",
            TOO_MANY,
            &[("retry-after", b"Fri, 31 Dec 9999 23:59:59 GMT")],
            Some((MAX, RetryAfter)),
        ),
        case(
            "wrong weekday",
            TOO_MANY,
            &[("retry-after", b"Thu, 01 May 2024 00:00:30 GMT")],
            None,
        ),
        case(
            "year 100000",
            TOO_MANY,
            &[("retry-after", b"Mon, 01 May 100000 00:00:30 GMT")],
            None,
        ),
        case(
            "31 February",
            TOO_MANY,
            &[("retry-after", b"Sat, 31 Feb 2024 00:00:30 GMT")],
            None,
        ),
        case(
            "malformed retry-after falls to reset headers",
            TOO_MANY,
            &[
                ("retry-after", b"tomorrow"),
                ("x-ratelimit-reset-requests", b"2s"),
            ],
            Some((s(2), ResetDuration)),
        ),
        // x-ratelimit-reset-requests / -tokens (Go durations)
        case(
            "go 6m0s",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"6m0s")],
            Some((MAX.min(s(360)), ResetDuration)),
        ),
        case(
            "go 1m30.5s",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"1m30.5s")],
            Some((ms(90_500), ResetDuration)),
        ),
        case(
            "go 12ms",
            TOO_MANY,
            &[("x-ratelimit-reset-tokens", b"12ms")],
            Some((ms(12), ResetDuration)),
        ),
        case(
            "go hours clamped",
            TOO_MANY,
            &[("x-ratelimit-reset-tokens", b"26h")],
            Some((MAX, ResetDuration)),
        ),
        case(
            "go exhausted limit preferred",
            TOO_MANY,
            &[
                ("x-ratelimit-reset-requests", b"20s"),
                ("x-ratelimit-reset-tokens", b"1s"),
                ("x-ratelimit-remaining-tokens", b"0"),
                ("x-ratelimit-remaining-requests", b"12"),
            ],
            Some((s(1), ResetDuration)),
        ),
        case(
            "go longest without remaining",
            TOO_MANY,
            &[
                ("x-ratelimit-reset-requests", b"20s"),
                ("x-ratelimit-reset-tokens", b"1s"),
            ],
            Some((s(20), ResetDuration)),
        ),
        case(
            "go negative",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"-1s")],
            None,
        ),
        case(
            "go missing unit",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"20")],
            None,
        ),
        case(
            "go unknown unit",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"2d")],
            None,
        ),
        case(
            "go inf",
            TOO_MANY,
            &[("x-ratelimit-reset-requests", b"infs")],
            None,
        ),
        case(
            "go 35 digits clamped",
            TOO_MANY,
            &[(
                "x-ratelimit-reset-requests",
                b"12345678901234567890123456789012345s",
            )],
            Some((MAX, ResetDuration)),
        ),
        // anthropic-ratelimit-*-reset (RFC 3339)
        case(
            "rfc3339 Z",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-requests-reset",
                b"2024-05-01T00:00:45Z",
            )],
            Some((s(45), ResetTime)),
        ),
        case(
            "rfc3339 offset",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-tokens-reset",
                b"2024-05-01T02:00:45+02:00",
            )],
            Some((s(45), ResetTime)),
        ),
        case(
            "rfc3339 fraction",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-input-tokens-reset",
                b"2024-05-01T00:00:01.25Z",
            )],
            Some((ms(1250), ResetTime)),
        ),
        case(
            "rfc3339 past",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-requests-reset",
                b"2024-04-30T23:00:00Z",
            )],
            Some((Duration::ZERO, ResetTime)),
        ),
        case(
            "rfc3339 year 100000",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-requests-reset",
                b"100000-01-01T00:00:00Z",
            )],
            None,
        ),
        case(
            "rfc3339 date only",
            TOO_MANY,
            &[("anthropic-ratelimit-requests-reset", b"2024-05-01")],
            None,
        ),
        case(
            "rfc3339 year 9999 clamped",
            TOO_MANY,
            &[(
                "anthropic-ratelimit-requests-reset",
                b"9999-12-31T23:59:59Z",
            )],
            Some((MAX, ResetTime)),
        ),
        case(
            "rfc3339 exhausted limit preferred",
            TOO_MANY,
            &[
                (
                    "anthropic-ratelimit-requests-reset",
                    b"2024-05-01T00:00:50Z",
                ),
                ("anthropic-ratelimit-requests-remaining", b"7"),
                (
                    "anthropic-ratelimit-output-tokens-reset",
                    b"2024-05-01T00:00:05Z",
                ),
                ("anthropic-ratelimit-output-tokens-remaining", b"0"),
            ],
            Some((s(5), ResetTime)),
        ),
        // X-RateLimit-Reset (Unix time)
        case(
            "epoch seconds",
            TOO_MANY,
            &[("x-ratelimit-reset", b"1714521690")],
            Some((s(90), ResetEpoch)),
        ),
        case(
            "epoch fractional",
            TOO_MANY,
            &[("X-RateLimit-Reset", b"1714521600.5")],
            Some((ms(500), ResetEpoch)),
        ),
        case(
            "epoch in the past",
            TOO_MANY,
            &[("x-ratelimit-reset", b"1714520000")],
            Some((Duration::ZERO, ResetEpoch)),
        ),
        case(
            "epoch milliseconds",
            TOO_MANY,
            &[("x-ratelimit-reset", b"1714521605000")],
            Some((s(5), ResetEpoch)),
        ),
        case(
            "small value read as delta",
            TOO_MANY,
            &[("x-ratelimit-reset", b"30")],
            Some((s(30), ResetEpoch)),
        ),
        case(
            "epoch 35 digits clamped",
            TOO_MANY,
            &[("x-ratelimit-reset", b"12345678901234567890123456789012345")],
            Some((MAX, ResetEpoch)),
        ),
        case(
            "epoch negative",
            TOO_MANY,
            &[("x-ratelimit-reset", b"-1714521690")],
            None,
        ),
        // IETF RateLimit field
        case(
            "ratelimit t",
            TOO_MANY,
            &[("ratelimit", b"\"default\";r=0;t=30")],
            Some((s(30), RateLimitField)),
        ),
        case(
            "ratelimit exhausted member preferred",
            TOO_MANY,
            &[("ratelimit", b"\"burst\";r=5;t=60, \"day\";r=0;t=40")],
            Some((s(40), RateLimitField)),
        ),
        case(
            "ratelimit quoted comma",
            TOO_MANY,
            &[("ratelimit", b"\"a,b\";r=0;t=12")],
            Some((s(12), RateLimitField)),
        ),
        case(
            "ratelimit quoted parameters stay the name's",
            200,
            &[("ratelimit", b"\"x;r=0;t=99,y\";r=5;t=12")],
            None,
        ),
        case(
            "ratelimit spaces around parameters, read proactively",
            200,
            &[("ratelimit", b"\"default\"; r=0 ; t=30")],
            Some((s(30), RateLimitField)),
        ),
        case(
            "ratelimit on a 500 says nothing",
            500,
            &[("ratelimit", b"\"default\";r=0;t=30")],
            None,
        ),
        case(
            "ratelimit t inf",
            TOO_MANY,
            &[("ratelimit", b"\"default\";r=0;t=inf")],
            None,
        ),
        case(
            "ratelimit no t",
            TOO_MANY,
            &[("ratelimit", b"\"default\";r=0")],
            None,
        ),
        // precedence between kinds
        case(
            "go durations before rfc3339 and epoch",
            TOO_MANY,
            &[
                ("x-ratelimit-reset", b"1714521690"),
                (
                    "anthropic-ratelimit-requests-reset",
                    b"2024-05-01T00:00:45Z",
                ),
                ("x-ratelimit-reset-requests", b"3s"),
            ],
            Some((s(3), ResetDuration)),
        ),
        case(
            "rfc3339 before epoch",
            TOO_MANY,
            &[
                ("x-ratelimit-reset", b"1714521690"),
                (
                    "anthropic-ratelimit-requests-reset",
                    b"2024-05-01T00:00:45Z",
                ),
            ],
            Some((s(45), ResetTime)),
        ),
        case(
            "epoch before ratelimit field",
            TOO_MANY,
            &[
                ("ratelimit", b"\"d\";r=0;t=9"),
                ("x-ratelimit-reset", b"1714521690"),
            ],
            Some((s(90), ResetEpoch)),
        ),
        case("no header at all", TOO_MANY, &[], None),
        // other statuses
        case(
            "503 with retry-after",
            503,
            &[("retry-after", b"5")],
            Some((s(5), RetryAfter)),
        ),
        case(
            "503 ignores reset headers",
            503,
            &[("x-ratelimit-reset-requests", b"5s")],
            None,
        ),
        case(
            "500 ignores retry-after",
            500,
            &[("retry-after", b"5")],
            None,
        ),
        case(
            "success ignores retry-after",
            200,
            &[("retry-after", b"5")],
            None,
        ),
        case(
            "success exhausted (openai)",
            200,
            &[
                ("x-ratelimit-remaining-requests", b"0"),
                ("x-ratelimit-reset-requests", b"2s"),
            ],
            Some((s(2), ResetDuration)),
        ),
        case(
            "success not exhausted",
            200,
            &[
                ("x-ratelimit-remaining-requests", b"3"),
                ("x-ratelimit-reset-requests", b"2s"),
            ],
            None,
        ),
        case(
            "success exhausted (anthropic)",
            200,
            &[
                ("anthropic-ratelimit-tokens-remaining", b"0"),
                ("anthropic-ratelimit-tokens-reset", b"2024-05-01T00:00:08Z"),
            ],
            Some((s(8), ResetTime)),
        ),
        case(
            "success exhausted (x-ratelimit)",
            200,
            &[
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", b"1714521610"),
            ],
            Some((s(10), ResetEpoch)),
        ),
        case(
            "success exhausted (ratelimit field)",
            204,
            &[("ratelimit", b"\"d\";r=0;t=6")],
            Some((s(6), RateLimitField)),
        ),
    ];
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let status = StatusCode::from_u16(c.status).expect("test status");
        let got = cooldown_from_headers(status, &headers(c.headers), now(), MAX);
        if got != c.want {
            failures.push(format!("{}: got {:?}, want {:?}", c.name, got, c.want));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_value_is_clamped_to_max_cooldown_even_zero() {
    let h = headers(&[("retry-after", b"30")]);
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, now(), Duration::ZERO);
    assert_eq!(got, Some((Duration::ZERO, Reason::RetryAfter)));
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, now(), secs(10.5));
    assert_eq!(got, Some((secs(10.5), Reason::RetryAfter)));
}

#[test]
fn a_wall_clock_before_1970_or_far_ahead_does_not_break_dates() {
    let h = headers(&[("retry-after", b"Wed, 01 May 2024 00:00:30 GMT")]);
    let before_epoch = UNIX_EPOCH - Duration::from_secs(10);
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, before_epoch, MAX);
    assert_eq!(got, Some((MAX, Reason::RetryAfter)));
    // A date after the epoch, from a clock before it: the whole distance.
    let h = headers(&[("retry-after", b"Thu, 01 Jan 1970 00:00:05 GMT")]);
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, before_epoch, MAX);
    assert_eq!(got, Some((Duration::from_secs(15), Reason::RetryAfter)));
    let h = headers(&[("retry-after", b"Wed, 01 May 2024 00:00:30 GMT")]);
    let far = UNIX_EPOCH + Duration::from_secs(1 << 40);
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, far, MAX);
    assert_eq!(got, Some((Duration::ZERO, Reason::RetryAfter)));
}

/// A small deterministic generator, so the property test replays exactly.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const NAMES: [&str; 14] = [
    "retry-after-ms",
    "retry-after",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-reset",
    "x-ratelimit-reset",
    "x-ratelimit-remaining",
    "ratelimit",
    "x-other",
    "anthropic-ratelimit--reset",
];

/// Near-valid values (`#` stands for a run of random digits, `@` for one),
/// so random
/// input reaches deep into each parser rather than failing on the first byte.
const TEMPLATES: [&str; 12] = [
    "#",
    "#.#",
    "#m#s",
    "#ms",
    "#h#m#.#s",
    "Wed, 01 May 2024 00:00:30 GMT",
    "Sun, 06 Nov 1994 08:49:37 GMT",
    "2024-05-01T00:0@:@@Z",
    "2@@@-0@-1@T@@:@@:@@.#+0@:@@",
    "\"d\";r=#;t=#",
    "\"a\";r=#;t=#, \"b\";r=0;t=#",
    "0",
];

fn random_value(rng: &mut Lcg) -> Vec<u8> {
    let mut value = Vec::new();
    for c in TEMPLATES[rng.below(TEMPLATES.len())].bytes() {
        if c == b'@' {
            value.push(b'0' + rng.below(10) as u8);
        } else if c == b'#' {
            let longest = if rng.below(8) == 0 { 40 } else { 3 };
            let digits = 1 + rng.below(longest);
            value.extend((0..digits).map(|_| b'0' + rng.below(10) as u8));
        } else {
            value.push(c);
        }
    }
    // A few random edits: replace, insert or delete a byte.
    for _ in 0..rng.below(4).saturating_sub(1) {
        let at = rng.below(value.len() + 1);
        let byte = match rng.below(3) {
            0 => rng.next() as u8,
            1 => b"-+.e \t;,=\"sZT:"[rng.below(14)],
            _ => b'0' + rng.below(10) as u8,
        };
        match rng.below(3) {
            0 if at < value.len() => value[at] = byte,
            1 if at < value.len() => {
                value.remove(at);
            }
            _ => value.insert(at, byte),
        }
    }
    value
}

#[test]
fn random_bytes_never_panic_and_never_exceed_max_cooldown() {
    // Fixed seed and count: bounded (about a second in a debug build) and
    // replayable. The fuzz target under fuzz/ runs the same checks unbounded.
    let mut rng = Lcg(0x5eed_cafe);
    let statuses = [429, 503, 200, 204, 500, 404];
    let mut reached = std::collections::HashMap::<Reason, u32>::new();
    for round in 0..100_000 {
        let mut map = HeaderMap::new();
        for _ in 0..rng.below(5) {
            let name = HeaderName::from_static(NAMES[rng.below(NAMES.len())]);
            let Ok(value) = HeaderValue::from_bytes(&random_value(&mut rng)) else {
                continue;
            };
            map.append(name, value);
        }
        let status = StatusCode::from_u16(statuses[rng.below(statuses.len())]).expect("status");
        let now = UNIX_EPOCH + Duration::from_nanos(rng.next() << 30);
        let max = Duration::from_millis(rng.next() % 1_000_000);
        let unclamped = cooldown_from_headers(status, &map, now, Duration::MAX);
        let clamped = cooldown_from_headers(status, &map, now, max);
        assert_eq!(
            clamped,
            unclamped.map(|(d, r)| (d.min(max), r)),
            "round {round}: clamping is not a plain min: {map:?}"
        );
        if let Some((d, reason)) = clamped {
            assert!(d <= max, "round {round}: {d:?} > {max:?} for {map:?}");
            assert!(reason.is_header());
            *reached.entry(reason).or_default() += 1;
        }
    }
    // The generator must reach every parser, not only fail on garbage.
    for reason in [
        Reason::RetryAfterMs,
        Reason::RetryAfter,
        Reason::ResetDuration,
        Reason::ResetTime,
        Reason::ResetEpoch,
        Reason::RateLimitField,
    ] {
        let n = reached.get(&reason).copied().unwrap_or(0);
        assert!(n >= 50, "{reason:?} parsed only {n} times: {reached:?}");
    }
}

/// Each reason names the header it came from, and says whether it did.
#[test]
fn a_reason_names_its_header() {
    use Reason::*;
    let named = [
        (RetryAfterMs, "retry-after-ms"),
        (RetryAfter, "retry-after"),
        (ResetDuration, "x-ratelimit-reset-*"),
        (ResetTime, "anthropic-ratelimit-*-reset"),
        (ResetEpoch, "x-ratelimit-reset"),
        (RateLimitField, "ratelimit"),
        (GrpcRetryInfo, "grpc-status-details-bin"),
        (GrpcPushback, "grpc-retry-pushback-ms"),
    ];
    for (reason, header) in named {
        assert!(reason.is_header(), "{reason:?}");
        assert_eq!(reason.header(), Some(header));
    }
    for reason in [Exponential { streak: 2 }, Shared] {
        assert!(!reason.is_header(), "{reason:?}");
        assert_eq!(reason.header(), None);
    }
}

/// `X-RateLimit-Reset` of exactly 10⁹ is a date (2001), long past: no wait,
/// not 10⁹ seconds of one.
#[test]
fn an_epoch_reset_of_exactly_a_billion_is_a_date() {
    let h = headers(&[("x-ratelimit-reset", b"1000000000")]);
    let got = cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, now(), MAX);
    assert_eq!(
        got,
        Some((Duration::ZERO, Reason::ResetEpoch)),
        "a date long past: no wait"
    );
}

/// An RFC 3339 reset with one separator, one field or one offset digit
/// wrong is no date at all; right, it is 30 seconds away.
#[test]
fn an_rfc3339_reset_wrong_in_one_place_says_nothing() {
    let reset = |value: &str| {
        let h = headers(&[("anthropic-ratelimit-requests-reset", value.as_bytes())]);
        cooldown_from_headers(StatusCode::TOO_MANY_REQUESTS, &h, now(), MAX)
    };
    assert_eq!(
        reset("2024-05-01T00:00:30Z"),
        Some((Duration::from_secs(30), Reason::ResetTime))
    );
    for wrong in [
        "2024/05-01T00:00:30Z",
        "2024-05/01T00:00:30Z",
        "2024-05-01X00:00:30Z",
        "2024-05-01T00-00:30Z",
        "2024-05-01T00:00-30Z",
        "2024-05-01T00:00:61Z",
        "2024-05-01T00:00:30+0x:00",
        "2024-05-01T00:00:30+00:x0",
        // `:` is the digit after `9` were it one: still not a digit.
        "2024-05-01T00:00:30+0::00",
    ] {
        assert_eq!(reset(wrong), None, "{wrong}");
    }
}
