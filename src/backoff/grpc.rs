//! A gRPC server's pushback, read as an HTTP server's 429 and 503.
//!
//! A gRPC call refused at once is a trailers-only answer: HTTP status 200,
//! and the gRPC status in its headers. `RESOURCE_EXHAUSTED` with a wait
//! reads as a 429 (without one it is no pushback: gRPC also says it of a
//! message over the size limit, which must not cool a route for every
//! caller), and `UNAVAILABLE` as a 503; the wait comes from a
//! `google.rpc.RetryInfo` detail (`grpc-status-details-bin`, with the
//! `tonic` feature) or from `grpc-retry-pushback-ms`, whose negative or
//! unreadable value is gRPC's "do not retry" (gRFC A6): such an answer
//! asks for no wait and no retry.
//! A status sent in trailers, after the answer's messages, is not read: the
//! call was served.

use std::time::Duration;

use http::StatusCode;
use http::header::{HeaderMap, HeaderName};

use super::headers::{Reason, text};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The HTTP status a gRPC answer's status stands for: a trailers-only
/// `RESOURCE_EXHAUSTED` that says how long to wait is 429, `UNAVAILABLE`
/// 503, `OK` 200, and any other code, or a pushback saying not to retry,
/// 500 (no wait is asked). Any other answer keeps its status.
pub(crate) fn as_http_status(status: StatusCode, headers: &HeaderMap) -> StatusCode {
    if !is_grpc(status, headers) {
        return status;
    }
    let pushback = match headers.get(&GRPC_STATUS).map(|code| code.as_bytes()) {
        Some(b"0") => return StatusCode::OK,
        Some(b"8") if says_wait(headers) => StatusCode::TOO_MANY_REQUESTS,
        Some(b"14") => StatusCode::SERVICE_UNAVAILABLE,
        _ => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    match headers.get(&PUSHBACK) {
        Some(_) if pushback_ms(headers).is_none() => StatusCode::INTERNAL_SERVER_ERROR,
        _ => pushback,
    }
}

/// Whether an answer of `status` with `headers` is a trailers-only gRPC
/// answer: HTTP 200 with its gRPC status in the headers. (An HTTP refusal
/// that also carries a `grpc-status` is read as the HTTP refusal it is.)
pub(super) fn is_grpc(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::OK && headers.contains_key(&GRPC_STATUS)
}

/// Whether a `RESOURCE_EXHAUSTED` answer says when to retry: a wait that
/// can be read, or, in a build without the `tonic` feature (which cannot
/// read `RetryInfo`), any details at all (the wait then follows the
/// layer's own rule).
fn says_wait(headers: &HeaderMap) -> bool {
    wait(headers).is_some() || (cfg!(not(feature = "tonic")) && headers.contains_key(&DETAILS))
}

/// The wait a gRPC answer asks for: its `RetryInfo` delay (exact), or else
/// its pushback.
pub(super) fn wait(headers: &HeaderMap) -> Option<(Duration, Reason)> {
    #[cfg(feature = "tonic")]
    if let Some(delay) = retry_info(headers) {
        return Some((delay, Reason::GrpcRetryInfo));
    }
    pushback_ms(headers).map(|ms| (Duration::from_millis(ms), Reason::GrpcPushback))
}

/// `grpc-retry-pushback-ms` as whole milliseconds; `None` when it is
/// missing, negative or unreadable.
fn pushback_ms(headers: &HeaderMap) -> Option<u64> {
    let value = text(headers, &PUSHBACK)?;
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The delay of the `RetryInfo` detail in `grpc-status-details-bin` (a
/// base64 `google.rpc.Status`); `None` when there is none, it does not
/// decode, or it is negative (no wait can be read from it: not "now"). Decoded here, down to the delay's
/// seconds and nanoseconds: `tonic::Status::from_header_map` panics on a
/// value that is not base64, and prost-types' conversion of a delay of
/// `i64::MIN` seconds overflows.
#[cfg(feature = "tonic")]
fn retry_info(headers: &HeaderMap) -> Option<Duration> {
    use base64::Engine;
    use prost::Message;

    let value = headers.get(&DETAILS)?.as_bytes();
    // gRPC sends it unpadded; accept it padded too.
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(value).ok()?;
    let status = tonic_types::pb::Status::decode(bytes.as_slice()).ok()?;
    let detail = status
        .details
        .iter()
        .find(|any| any.type_url == "type.googleapis.com/google.rpc.RetryInfo")?;
    let delay = tonic_types::pb::RetryInfo::decode(detail.value.as_slice())
        .ok()?
        .retry_delay?;
    let (Ok(seconds), Ok(nanos)) = (u64::try_from(delay.seconds), u32::try_from(delay.nanos))
    else {
        return None;
    };
    Some(Duration::new(seconds, nanos.min(999_999_999)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().expect("a header value"));
        }
        headers
    }

    #[test]
    fn grpc_codes_read_as_the_http_statuses_they_stand_for() {
        let ok = StatusCode::OK;
        let read = |pairs: &[(&'static str, &str)]| as_http_status(ok, &headers(pairs));
        // Without a wait, RESOURCE_EXHAUSTED may be a message over the
        // size limit: no pushback.
        assert_eq!(
            read(&[("grpc-status", "8")]),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let with_wait = [("grpc-status", "8"), ("grpc-retry-pushback-ms", "10")];
        assert_eq!(read(&with_wait), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            read(&[("grpc-status", "14")]),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(read(&[("grpc-status", "0")]), StatusCode::OK);
        assert_eq!(
            read(&[("grpc-status", "5")]),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(read(&[]), StatusCode::OK);
        // An HTTP refusal stays one, a grpc-status beside it or not.
        let http_429 = as_http_status(StatusCode::TOO_MANY_REQUESTS, &headers(&[]));
        assert_eq!(http_429, StatusCode::TOO_MANY_REQUESTS);
        let both = headers(&[("grpc-status", "5"), ("retry-after", "30")]);
        assert_eq!(
            as_http_status(StatusCode::TOO_MANY_REQUESTS, &both),
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    /// A build that cannot read `RetryInfo` still takes a refusal that
    /// carries details for a pushback (its wait then the layer's own).
    #[cfg(not(feature = "tonic"))]
    #[test]
    fn without_tonic_details_make_a_pushback() {
        let answer = headers(&[("grpc-status", "8"), ("grpc-status-details-bin", "AAAA")]);
        assert_eq!(
            as_http_status(StatusCode::OK, &answer),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(wait(&answer), None);
    }

    #[test]
    fn an_http_refusal_beside_a_grpc_status_keeps_its_retry_after() {
        let answer = headers(&[("grpc-status", "8"), ("retry-after", "30")]);
        let read = super::super::cooldown_from_headers(
            StatusCode::TOO_MANY_REQUESTS,
            &answer,
            std::time::SystemTime::now(),
            Duration::MAX,
        );
        assert_eq!(read, Some((Duration::from_secs(30), Reason::RetryAfter)));
    }

    #[test]
    fn a_negative_or_unreadable_pushback_asks_for_no_retry() {
        for pushback in ["-1", "-250", "soon", "1e3", "", "99999999999999999999"] {
            let answer = headers(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", pushback)]);
            assert_eq!(
                as_http_status(StatusCode::OK, &answer),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{pushback:?}"
            );
        }
        let answer = headers(&[("grpc-status", "8"), ("grpc-retry-pushback-ms", "1500")]);
        assert_eq!(
            as_http_status(StatusCode::OK, &answer),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            wait(&answer),
            Some((Duration::from_millis(1500), Reason::GrpcPushback))
        );
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn retry_info_is_read_exactly_and_garbage_is_not_trusted() {
        use tonic_types::{ErrorDetails, StatusExt};

        let delay = Duration::new(2, 500_000_001);
        let status = tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "slow down",
            ErrorDetails::with_retry_info(Some(delay)),
        );
        let answer: http::Response<()> = status.into_http();
        assert_eq!(wait(answer.headers()), Some((delay, Reason::GrpcRetryInfo)));
        for garbage in ["!!!", "AAAA", "////", ""] {
            let answer = headers(&[("grpc-status", "8"), ("grpc-status-details-bin", garbage)]);
            assert_eq!(wait(&answer), None, "{garbage:?}");
        }
    }

    /// A RetryInfo whose delay is `seconds` and `nanos`, as a header.
    #[cfg(feature = "tonic")]
    fn retry_info_header(seconds: i64, nanos: i32) -> HeaderMap {
        use base64::Engine;
        use prost::Message;

        let info = tonic_types::pb::RetryInfo {
            retry_delay: Some(prost_types::Duration { seconds, nanos }),
        };
        let status = tonic_types::pb::Status {
            code: 8,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".to_owned(),
                value: info.encode_to_vec(),
            }],
        };
        let value = base64::engine::general_purpose::STANDARD_NO_PAD.encode(status.encode_to_vec());
        headers(&[("grpc-status", "8"), ("grpc-status-details-bin", &value)])
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn hostile_retry_delays_never_panic() {
        let read = |seconds, nanos| wait(&retry_info_header(seconds, nanos)).map(|(d, _)| d);
        assert_eq!(read(i64::MIN, 0), None);
        assert_eq!(read(-1, 5), None);
        assert_eq!(read(3, -1), None);
        assert_eq!(
            read(i64::MAX, i32::MAX),
            Some(Duration::new(i64::MAX as u64, 999_999_999))
        );
        assert_eq!(read(2, 5), Some(Duration::new(2, 5)));
    }
}
