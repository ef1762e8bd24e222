//! The JSON error every refusal of the gateway's own is answered with.

use axum::body::Body;
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;

/// An error in the same shape as the layers' refusals.
pub fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
