//! A gRPC server's pushback, read as an HTTP server's 429 and 503.
//!
//! A gRPC call refused at once is a trailers-only answer: HTTP status 200,
//! and the gRPC status in its headers. `RESOURCE_EXHAUSTED` reads as a 429
//! and `UNAVAILABLE` as a 503; the wait comes from a `google.rpc.RetryInfo`
//! detail (`grpc-status-details-bin`, with the `tonic` feature) or from
//! `grpc-retry-pushback-ms`, whose negative or unreadable value is gRPC's
//! "do not retry" (gRFC A6): such an answer asks for no wait and no retry.
//! A status sent in trailers, after the answer's messages, is not read: the
//! call was served.

use std::time::Duration;

use http::StatusCode;
use http::header::{HeaderMap, HeaderName};

use super::headers::{Reason, text};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
#[cfg(feature = "tonic")]
const DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The HTTP status a gRPC answer's status stands for: a trailers-only
/// `RESOURCE_EXHAUSTED` is 429, `UNAVAILABLE` 503, `OK` 200, and any other
/// code, or a pushback saying not to retry, 500 (no wait is asked). Any
/// other answer keeps its status.
pub(crate) fn as_http_status(status: StatusCode, headers: &HeaderMap) -> StatusCode {
    if status != StatusCode::OK {
        return status;
    }
    let Some(code) = headers.get(&GRPC_STATUS) else {
        return status;
    };
    let pushback = match code.as_bytes() {
        b"0" => return StatusCode::OK,
        b"8" => StatusCode::TOO_MANY_REQUESTS,
        b"14" => StatusCode::SERVICE_UNAVAILABLE,
        _ => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    match headers.get(&PUSHBACK) {
        Some(_) if pushback_ms(headers).is_none() => StatusCode::INTERNAL_SERVER_ERROR,
        _ => pushback,
    }
}

/// Whether `headers` are a gRPC answer's, with its status.
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.contains_key(&GRPC_STATUS)
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
/// base64 `google.rpc.Status`); `None` when there is none or it does not
/// decode. Decoded here, not by `tonic::Status::from_header_map`, which
/// panics on a value that is not base64.
#[cfg(feature = "tonic")]
fn retry_info(headers: &HeaderMap) -> Option<Duration> {
    use base64::Engine;
    use prost::Message;
    use tonic_types::RpcStatusExt;

    let value = headers.get(&DETAILS)?.as_bytes();
    // gRPC sends it unpadded; accept it padded too.
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine.decode(value).ok()?;
    let status = tonic_types::pb::Status::decode(bytes.as_slice()).ok()?;
    status.get_details_retry_info()?.retry_delay
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
        assert_eq!(read(&[("grpc-status", "8")]), StatusCode::TOO_MANY_REQUESTS);
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
        // An HTTP refusal stays one.
        let http_429 = as_http_status(StatusCode::TOO_MANY_REQUESTS, &headers(&[]));
        assert_eq!(http_429, StatusCode::TOO_MANY_REQUESTS);
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
}
