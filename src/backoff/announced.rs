//! The limits a response says its server enforces: [`announced_limits`].
//!
//! Where [`cooldown_from_headers`](super::cooldown_from_headers) reads how
//! long to stay away, this reads what the provider says of its limits on
//! every response (the limit, what is left, when it is whole again), so a
//! client can keep below them instead of meeting 429s. It shares that
//! parser's number, duration and date readers, and its distrust: everything
//! is bounded, garbage is ignored, nothing panics.
//!
//! Over 700 lines on purpose: each provider family's reader (OpenAI,
//! Anthropic, the IETF fields, Retry-After) sits beside the others so that
//! their bounds read as one set.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName};

use super::headers::{
    NANOS_PER_SEC, decimal, go_duration, rfc3339_nanos, split_outside_quotes, text, trimmed, until,
};

/// The window OpenAI's and Anthropic's limit headers count over: they state
/// per-minute limits (RPM, TPM).
pub const PROVIDER_WINDOW: Duration = Duration::from_secs(60);

/// Members of one structured field read at most; more is not a real policy.
const MAX_MEMBERS: usize = 16;

/// What a response says of one of its server's limits.
///
/// Each field is `None` when the response does not say it, or says it in a
/// form that does not parse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Announced {
    /// Units (requests or tokens) allowed per [`window`](Self::window);
    /// never zero (a limit of 0 is not read).
    pub limit: Option<u64>,
    /// Units left now.
    pub remaining: Option<u64>,
    /// How long until the limit is whole again (zero when the reset is
    /// past).
    pub reset: Option<Duration>,
    /// The period the limit counts over: a minute for the OpenAI and
    /// Anthropic headers, the policy's `w` for the IETF fields; `None` when
    /// the response does not say.
    pub window: Option<Duration>,
}

impl Announced {
    /// True when nothing was said.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }
}

/// What a response says of its server's limits, per unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Announcement {
    /// Requests.
    pub requests: Announced,
    /// Tokens (input and output together).
    pub tokens: Announced,
    /// Input tokens (Anthropic's `anthropic-ratelimit-input-tokens-*`).
    pub input_tokens: Announced,
    /// Output tokens (Anthropic's `anthropic-ratelimit-output-tokens-*`).
    pub output_tokens: Announced,
}

impl Announcement {
    /// True when the response states no limit at all.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
            && self.tokens.is_empty()
            && self.input_tokens.is_empty()
            && self.output_tokens.is_empty()
    }
}

/// The limits `headers` announce, read against the wall-clock `now`.
///
/// Every family is read; for each unit the first family that says
/// something of it wins, in this order:
///
/// - OpenAI: `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
///   `x-ratelimit-reset-requests` (a Go duration such as `6m0s`) and the
///   `-tokens` variants; per minute.
/// - Anthropic: `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset`
///   (an RFC 3339 time) and the `tokens`, `input-tokens` and
///   `output-tokens` variants; per minute.
/// - IETF (requests only): `RateLimit-Policy: "default";q=100;w=60` with
///   `RateLimit: "default";r=50;t=30` (a member's `r` and `t` go with the
///   policy of the same name; with several request policies, the one with
///   the lowest rate, `q / w`, is taken), or the earlier draft's
///   `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds)
///   with the window from `RateLimit-Policy: 100;w=60`.
///
/// Counts are plain decimal integers (no sign, fraction or exponent) and
/// saturate at `u64::MAX`; anything else is ignored, as are limits and
/// windows of zero (no server can be kept to a limit of 0; what else the
/// response says still counts).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use tower_throttle::backoff::announced_limits;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-limit-requests", "500".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-requests", "499".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "120ms".parse().unwrap());
/// headers.insert("x-ratelimit-limit-tokens", "not a number".parse().unwrap());
/// let said = announced_limits(&headers, SystemTime::now());
/// assert_eq!(said.requests.limit, Some(500));
/// assert_eq!(said.requests.remaining, Some(499));
/// assert_eq!(said.requests.reset, Some(Duration::from_millis(120)));
/// assert_eq!(said.requests.window, Some(Duration::from_secs(60)));
/// assert!(said.tokens.is_empty(), "garbage is ignored");
/// ```
pub fn announced_limits(headers: &HeaderMap, now: SystemTime) -> Announcement {
    let requests = first([
        &|| openai(headers, &OPENAI_REQUESTS),
        &|| anthropic(headers, &ANTHROPIC_REQUESTS, now),
        &|| ietf(headers),
        &|| ietf_draft(headers),
    ]);
    Announcement {
        requests,
        tokens: first([&|| openai(headers, &OPENAI_TOKENS), &|| {
            anthropic(headers, &ANTHROPIC_TOKENS, now)
        }]),
        input_tokens: anthropic(headers, &ANTHROPIC_INPUT_TOKENS, now),
        output_tokens: anthropic(headers, &ANTHROPIC_OUTPUT_TOKENS, now),
    }
}

/// A family of rate-limit response headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeaderFamily {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (OpenAI and
    /// most OpenAI-compatible services).
    OpenAi,
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`.
    Anthropic,
    /// The IETF `RateLimit-Policy` and `RateLimit` fields, and the older
    /// draft's `RateLimit-Limit`, `-Remaining` and `-Reset`.
    Ietf,
}

/// [`announced_limits`] from one `family` of headers only: for a server
/// known to send that family, whose other headers (a proxy's, a CDN's)
/// must not be taken for its limits.
pub fn announced_limits_in(
    headers: &HeaderMap,
    now: SystemTime,
    family: HeaderFamily,
) -> Announcement {
    match family {
        HeaderFamily::OpenAi => Announcement {
            requests: openai(headers, &OPENAI_REQUESTS),
            tokens: openai(headers, &OPENAI_TOKENS),
            ..Announcement::default()
        },
        HeaderFamily::Anthropic => Announcement {
            requests: anthropic(headers, &ANTHROPIC_REQUESTS, now),
            tokens: anthropic(headers, &ANTHROPIC_TOKENS, now),
            input_tokens: anthropic(headers, &ANTHROPIC_INPUT_TOKENS, now),
            output_tokens: anthropic(headers, &ANTHROPIC_OUTPUT_TOKENS, now),
        },
        HeaderFamily::Ietf => Announcement {
            requests: first([&|| ietf(headers), &|| ietf_draft(headers)]),
            ..Announcement::default()
        },
    }
}

/// The first family that says something, read in order: the later ones
/// are not read at all.
fn first<const N: usize>(families: [&dyn Fn() -> Announced; N]) -> Announced {
    families
        .into_iter()
        .map(|read| read())
        .find(|a| !a.is_empty())
        .unwrap_or_default()
}

/// One unit's three headers in a provider's family. Made once, as
/// constants: a response is read on every request, and building the names
/// there (a `format!` and a check of each) cost more than the reading.
struct Names {
    limit: HeaderName,
    remaining: HeaderName,
    reset: HeaderName,
}

const fn names(limit: &'static str, remaining: &'static str, reset: &'static str) -> Names {
    Names {
        limit: HeaderName::from_static(limit),
        remaining: HeaderName::from_static(remaining),
        reset: HeaderName::from_static(reset),
    }
}

const OPENAI_REQUESTS: Names = names(
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
);
const OPENAI_TOKENS: Names = names(
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
);
const ANTHROPIC_REQUESTS: Names = names(
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
);
const ANTHROPIC_TOKENS: Names = names(
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
);
const ANTHROPIC_INPUT_TOKENS: Names = names(
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
);
const ANTHROPIC_OUTPUT_TOKENS: Names = names(
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
);

/// `x-ratelimit-{limit,remaining,reset}-{unit}`.
fn openai(headers: &HeaderMap, unit: &Names) -> Announced {
    let said = Announced {
        limit: text(headers, &unit.limit).and_then(limit),
        remaining: text(headers, &unit.remaining).and_then(count),
        reset: text(headers, &unit.reset).and_then(go_duration),
        window: None,
    };
    per_minute(said)
}

/// `anthropic-ratelimit-{unit}-{limit,remaining,reset}`.
fn anthropic(headers: &HeaderMap, unit: &Names, now: SystemTime) -> Announced {
    let said = Announced {
        limit: text(headers, &unit.limit).and_then(limit),
        remaining: text(headers, &unit.remaining).and_then(count),
        reset: text(headers, &unit.reset)
            .and_then(rfc3339_nanos)
            .map(|at| until(at, now)),
        window: None,
    };
    per_minute(said)
}

fn per_minute(said: Announced) -> Announced {
    if said.is_empty() {
        return said;
    }
    Announced {
        window: Some(PROVIDER_WINDOW),
        ..said
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// One member of a structured field: its first item and its parameters.
struct Member<'a> {
    item: &'a str,
    params: Vec<(&'a str, &'a str)>,
}

impl<'a> Member<'a> {
    fn parse(member: &'a str) -> Self {
        let mut pieces = split_outside_quotes(member, b';');
        let item = pieces.next().map_or("", sp_trim);
        let params = pieces
            .take(MAX_MEMBERS)
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (sp_trim(k), sp_trim(v)))
            .collect();
        Self { item, params }
    }

    fn param(&self, key: &str) -> Option<&'a str> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// The item as a name: an sf-string's contents, or a token as it is.
    fn name(&self) -> &'a str {
        self.item
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(self.item)
    }
}

/// The members of every line of field `name`, at most [`MAX_MEMBERS`].
fn members<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Vec<Member<'a>> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| trimmed(v.as_bytes()))
        .flat_map(|v| split_outside_quotes(v, b','))
        .take(MAX_MEMBERS)
        .map(Member::parse)
        .collect()
}

/// `RateLimit-Policy` and `RateLimit` as structured fields (the policy's
/// first item is a name, not a number).
fn ietf(headers: &HeaderMap) -> Announced {
    let policies = members(headers, &RATELIMIT_POLICY);
    let mut best: Option<(&str, u64, Duration)> = None;
    for policy in &policies {
        if count(policy.item).is_some() {
            continue; // the earlier draft's form
        }
        if policy
            .param("qu")
            .is_some_and(|u| u.trim_matches('"') != "requests")
        {
            continue;
        }
        // A quota of zero would always be the lowest rate and hide the
        // real ones: not a policy anyone can keep to.
        let (Some(q), Some(w)) = (
            policy.param("q").and_then(limit),
            policy.param("w").and_then(window),
        ) else {
            continue;
        };
        // Lowest rate: q/w below b/v, compared as q*v < b*w.
        let lower = best
            .is_none_or(|(_, b, v)| u128::from(q) * v.as_nanos() < u128::from(b) * w.as_nanos());
        if lower {
            best = Some((policy.name(), q, w));
        }
    }
    let Some((name, limit, w)) = best else {
        return Announced::default();
    };
    let states = members(headers, &RATELIMIT);
    // The state of the same name; with one policy and one state, that one.
    let state = states
        .iter()
        .find(|s| s.name() == name)
        .or_else(|| (policies.len() == 1 && states.len() == 1).then(|| &states[0]));
    Announced {
        limit: Some(limit),
        remaining: state.and_then(|s| s.param("r")).and_then(count),
        reset: state
            .and_then(|s| s.param("t"))
            .and_then(|t| decimal(t, NANOS_PER_SEC)),
        window: Some(w),
    }
}

const DRAFT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
const DRAFT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const DRAFT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// The earlier draft: `RateLimit-Limit` (its first member), `-Remaining`,
/// `-Reset`, and the window from the `RateLimit-Policy` member of the same
/// limit (or its only member).
fn ietf_draft(headers: &HeaderMap) -> Announced {
    let first_count =
        |name: &HeaderName| members(headers, name).first().and_then(|m| count(m.item));
    let limit = first_count(&DRAFT_LIMIT).filter(|n| *n > 0);
    let said = Announced {
        limit,
        remaining: first_count(&DRAFT_REMAINING),
        reset: text(headers, &DRAFT_RESET).and_then(|t| decimal(t, NANOS_PER_SEC)),
        window: None,
    };
    if said.is_empty() {
        return said;
    }
    let policies: Vec<Member<'_>> = members(headers, &RATELIMIT_POLICY)
        .into_iter()
        .filter(|m| count(m.item).is_some())
        .collect();
    let policy = policies
        .iter()
        .find(|m| limit.is_some() && count(m.item) == limit)
        .or_else(|| (policies.len() == 1).then(|| &policies[0]));
    Announced {
        window: policy.and_then(|m| m.param("w")).and_then(window),
        ..said
    }
}

/// A window in whole or fractional seconds, above zero.
fn window(s: &str) -> Option<Duration> {
    decimal(s, NANOS_PER_SEC).filter(|w| !w.is_zero())
}

/// A limit: a [`count`] above zero. A limit of 0 is no policy anyone can
/// keep to (it would always be the lowest, and would silence the route).
fn limit(s: &str) -> Option<u64> {
    count(s).filter(|n| *n > 0)
}

/// A count: ASCII digits only, saturating at `u64::MAX`. Written here for
/// the same reason as the parser's `decimal`: `str::parse` takes a `+`.
fn count(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

fn sp_trim(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn anthropic_reset_is_read_against_now() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_208_000);
        let said = announced_limits(
            &headers(&[
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2024-02-29T12:00:30Z"),
                ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ]),
            now,
        );
        assert_eq!(said.requests.limit, Some(50));
        assert_eq!(said.requests.remaining, Some(0));
        assert_eq!(said.requests.reset, Some(Duration::from_secs(30)));
        assert_eq!(said.requests.window, Some(PROVIDER_WINDOW));
        assert_eq!(said.output_tokens.limit, Some(8000));
        assert!(said.tokens.is_empty());
    }

    #[test]
    fn ietf_takes_the_lowest_rate_and_its_state() {
        let said = announced_limits(
            &headers(&[
                (
                    "ratelimit-policy",
                    "\"burst\";q=100;w=60, \"day\";q=1000;w=86400",
                ),
                ("ratelimit-policy", "\"bytes\";q=1;w=1;qu=\"content-bytes\""),
                ("ratelimit", "\"burst\";r=50;t=30, \"day\";r=7;t=600"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(said.requests.limit, Some(1000));
        assert_eq!(said.requests.window, Some(Duration::from_secs(86_400)));
        assert_eq!(said.requests.remaining, Some(7));
        assert_eq!(said.requests.reset, Some(Duration::from_secs(600)));
    }

    #[test]
    fn ietf_draft_takes_the_window_of_its_limit() {
        let said = announced_limits(
            &headers(&[
                ("ratelimit-limit", "100"),
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "12"),
                ("ratelimit-policy", "10;w=1, 100;w=60"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(said.requests.limit, Some(100));
        assert_eq!(said.requests.remaining, Some(0));
        assert_eq!(said.requests.reset, Some(Duration::from_secs(12)));
        assert_eq!(said.requests.window, Some(Duration::from_secs(60)));
    }

    #[test]
    fn garbage_says_nothing() {
        let huge = "9".repeat(60);
        let said = announced_limits(
            &headers(&[
                ("x-ratelimit-limit-requests", "-5"),
                ("x-ratelimit-remaining-requests", "1e3"),
                ("x-ratelimit-reset-requests", "soon"),
                ("anthropic-ratelimit-requests-limit", "+5"),
                ("anthropic-ratelimit-requests-reset", "yesterday"),
                ("ratelimit-policy", "\"p\";q=10;w=0, \"q\";q=nan;w=60"),
                ("ratelimit", "\"p\";r=0;t=1"),
                ("ratelimit-limit", "five"),
                ("x-ratelimit-limit-tokens", &huge),
            ]),
            SystemTime::now(),
        );
        assert!(said.requests.is_empty(), "{said:?}");
        assert_eq!(said.tokens.limit, Some(u64::MAX), "saturates");
    }

    #[test]
    fn a_limit_of_zero_is_not_read_in_any_family() {
        // No server can be kept to a limit of 0 (the IETF reader already
        // ignored a quota of 0); what else the headers say still counts.
        let said = announced_limits(
            &headers(&[
                ("x-ratelimit-limit-tokens", "0"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("anthropic-ratelimit-input-tokens-limit", "000"),
                ("ratelimit-limit", "0"),
                ("ratelimit-remaining", "0"),
            ]),
            SystemTime::now(),
        );
        assert_eq!(said.tokens.limit, None);
        assert_eq!(said.tokens.remaining, Some(0));
        assert!(said.input_tokens.is_empty(), "{said:?}");
        assert_eq!(said.requests.limit, None);
        assert_eq!(said.requests.remaining, Some(0));
    }

    /// An `Announced` in one line: limit, remaining, reset and window in
    /// seconds.
    fn unit(
        limit: Option<u64>,
        remaining: Option<u64>,
        reset: Option<u64>,
        window: u64,
    ) -> Announced {
        Announced {
            limit,
            remaining,
            reset: reset.map(Duration::from_secs),
            window: Some(Duration::from_secs(window)),
        }
    }

    /// Nothing said of a unit.
    const NOTHING: Announced = Announced {
        limit: None,
        remaining: None,
        reset: None,
        window: None,
    };

    /// Headers, in order.
    type Pairs = Vec<(&'static str, &'static str)>;
    /// Headers as bytes, in order.
    type RawPairs = &'static [(&'static str, &'static [u8])];

    /// 2024-04-01T12:00:00Z, the clock the Anthropic rows are read at.
    fn april_first_noon() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_711_972_800)
    }

    /// The header sets as the providers document them, and what each says.
    #[test]
    fn documented_header_sets_read_as_documented() {
        let rows: [(&str, Pairs, Announcement); 6] = [
            (
                "OpenAI (rate limits guide)",
                vec![
                    ("x-ratelimit-limit-requests", "60"),
                    ("x-ratelimit-limit-tokens", "150000"),
                    ("x-ratelimit-remaining-requests", "59"),
                    ("x-ratelimit-remaining-tokens", "149984"),
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ],
                Announcement {
                    requests: unit(Some(60), Some(59), Some(1), 60),
                    tokens: unit(Some(150_000), Some(149_984), Some(360), 60),
                    ..Announcement::default()
                },
            ),
            (
                "Anthropic (rate limits, response headers)",
                vec![
                    ("anthropic-ratelimit-requests-limit", "4000"),
                    ("anthropic-ratelimit-requests-remaining", "3999"),
                    ("anthropic-ratelimit-requests-reset", "2024-04-01T12:00:01Z"),
                    ("anthropic-ratelimit-tokens-limit", "480000"),
                    ("anthropic-ratelimit-tokens-remaining", "479000"),
                    ("anthropic-ratelimit-tokens-reset", "2024-04-01T12:00:30Z"),
                    ("anthropic-ratelimit-input-tokens-limit", "400000"),
                    ("anthropic-ratelimit-input-tokens-remaining", "399200"),
                    (
                        "anthropic-ratelimit-input-tokens-reset",
                        "2024-04-01T12:00:30Z",
                    ),
                    ("anthropic-ratelimit-output-tokens-limit", "80000"),
                    ("anthropic-ratelimit-output-tokens-remaining", "79800"),
                    (
                        "anthropic-ratelimit-output-tokens-reset",
                        "2024-04-01T12:00:06Z",
                    ),
                ],
                Announcement {
                    requests: unit(Some(4_000), Some(3_999), Some(1), 60),
                    tokens: unit(Some(480_000), Some(479_000), Some(30), 60),
                    input_tokens: unit(Some(400_000), Some(399_200), Some(30), 60),
                    output_tokens: unit(Some(80_000), Some(79_800), Some(6), 60),
                },
            ),
            (
                // The lowest rate is the daily one, whose state is not sent.
                "IETF draft, two policies and the state of one",
                vec![
                    (
                        "ratelimit-policy",
                        "\"burst\";q=100;w=60,\"daily\";q=1000;w=86400",
                    ),
                    ("ratelimit", "\"burst\";r=50;t=30"),
                ],
                Announcement {
                    requests: unit(Some(1_000), None, None, 86_400),
                    ..Announcement::default()
                },
            ),
            (
                "IETF draft, one policy and its state",
                vec![
                    ("ratelimit-policy", "\"default\";q=100;w=10"),
                    ("ratelimit", "\"default\";r=50;t=5"),
                ],
                Announcement {
                    requests: unit(Some(100), Some(50), Some(5), 10),
                    ..Announcement::default()
                },
            ),
            (
                "IETF earlier draft, no policy",
                vec![
                    ("ratelimit-limit", "10"),
                    ("ratelimit-remaining", "9"),
                    ("ratelimit-reset", "3"),
                ],
                Announcement {
                    requests: Announced {
                        window: None,
                        ..unit(Some(10), Some(9), Some(3), 0)
                    },
                    ..Announcement::default()
                },
            ),
            (
                "IETF earlier draft, with its policy",
                vec![
                    ("ratelimit-limit", "10"),
                    ("ratelimit-remaining", "9"),
                    ("ratelimit-reset", "3"),
                    ("ratelimit-policy", "10;w=1, 50;w=60"),
                ],
                Announcement {
                    requests: unit(Some(10), Some(9), Some(3), 1),
                    ..Announcement::default()
                },
            ),
        ];
        for (name, pairs, expected) in rows {
            let said = announced_limits(&headers(&pairs), april_first_noon());
            assert_eq!(said, expected, "{name}");
        }
    }

    /// Hostile and malformed values: nothing panics, no limit or window is
    /// zero, and each reads as the row says (for requests).
    #[test]
    fn hostile_values_are_ignored_or_bounded() {
        const LIMIT: &str = "x-ratelimit-limit-requests";
        const RESET: &str = "x-ratelimit-reset-requests";
        const A_LIMIT: &str = "anthropic-ratelimit-requests-limit";
        const A_RESET: &str = "anthropic-ratelimit-requests-reset";
        const POLICY: &str = "ratelimit-policy";
        const D_LIMIT: &str = "ratelimit-limit";
        const D_RESET: &str = "ratelimit-reset";
        const HUGE: &[u8] = b"99999999999999999999999";
        let limit = |n| unit(Some(n), None, None, 60);
        let reset = |d| Announced {
            reset: Some(d),
            ..unit(None, None, None, 60)
        };
        let secs = Duration::from_secs;
        // One case a row: what it is, the headers (in order), what requests read.
        #[rustfmt::skip]
        let rows: [(&str, RawPairs, Announced); 26] = [
            ("negative",                 &[(LIMIT, b"-1")],                  NOTHING),
            ("plus sign",                &[(LIMIT, b"+5")],                  NOTHING),
            ("exponent",                 &[(A_LIMIT, b"1e3")],               NOTHING),
            ("zero",                     &[(LIMIT, b"0")],                   NOTHING),
            ("zero, Anthropic",          &[(A_LIMIT, b"0")],                 NOTHING),
            ("zero, earlier draft",      &[(D_LIMIT, b"0")],                 NOTHING),
            ("zero quota",               &[(POLICY, b"\"p\";q=0;w=60")],     NOTHING),
            ("zero window",              &[(POLICY, b"\"p\";q=5;w=0")],      NOTHING),
            ("window under 1 ns",        &[(POLICY, b"\"p\";q=5;w=0.0000000001")], NOTHING),
            ("NaN",                      &[(LIMIT, b"NaN")],                 NOTHING),
            ("NaN quota",                &[(POLICY, b"\"p\";q=NaN;w=60")],   NOTHING),
            ("huge",                     &[(LIMIT, HUGE)],                   limit(u64::MAX)),
            ("empty",                    &[(LIMIT, b"")],                    NOTHING),
            ("whitespace",               &[(LIMIT, b" \t ")],                NOTHING),
            ("padded",                   &[(LIMIT, b" 60\t")],               limit(60)),
            ("repeated, the first read", &[(LIMIT, b"60"), (LIMIT, b"0")],   limit(60)),
            ("repeated, a bad first",    &[(LIMIT, b"-1"), (LIMIT, b"60")],  NOTHING),
            ("not UTF-8",                &[(LIMIT, b"6\xff0")],              NOTHING),
            ("not UTF-8, Anthropic",     &[(A_LIMIT, b"\xc3\x28")],          NOTHING),
            ("negative duration",        &[(RESET, b"-1s")],                 NOTHING),
            ("a unit twice",             &[(RESET, b"1h1h")],                reset(secs(7_200))),
            ("NaN duration",             &[(RESET, b"NaNs")],                NOTHING),
            ("huge duration",            &[(RESET, b"99999999999999999999999h")], reset(Duration::MAX)),
            ("reset in the past",        &[(A_RESET, b"2024-04-01T11:59:00Z")],  reset(Duration::ZERO)),
            ("reset past year 9999",     &[(A_RESET, b"10000-01-01T00:00:00Z")], NOTHING),
            ("huge reset, earlier draft", &[(D_RESET, HUGE)],
                Announced { reset: Some(secs(1_000_000_000_000_000_000)), ..NOTHING }),
        ];
        for (name, pairs, expected) in rows {
            let mut map = HeaderMap::new();
            for (header, value) in pairs {
                map.append(*header, HeaderValue::from_bytes(value).unwrap());
            }
            let now = april_first_noon();
            let all = announced_limits(&map, now);
            assert_eq!(all.requests, expected, "{name}");
            let families = [
                HeaderFamily::OpenAi,
                HeaderFamily::Anthropic,
                HeaderFamily::Ietf,
            ];
            for said in
                std::iter::once(all).chain(families.map(|f| announced_limits_in(&map, now, f)))
            {
                for u in [
                    said.requests,
                    said.tokens,
                    said.input_tokens,
                    said.output_tokens,
                ] {
                    assert_ne!(u.limit, Some(0), "{name}: {said:?}");
                    assert_ne!(u.window, Some(Duration::ZERO), "{name}: {said:?}");
                }
            }
        }
    }
}
