//! The JSON error every refusal of the gateway's own is answered with.

use axum::body::Body;
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;

/// The code of an error the gateway answered itself, in the response's
/// extensions (for the access log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// An error in the same shape as the layers' refusals.
pub fn json_error(status: StatusCode, code: &'static str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    response.extensions_mut().insert(ErrorCode(code));
    response
}
