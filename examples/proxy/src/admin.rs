//! Who may use the operator endpoints (`/`, `/stats`, `/stats/reset`,
//! `/events`, `/metrics`) once the gateway has clients: whoever presents
//! the operator key (`[gateway] admin_key_env`), and, unless
//! `admin_from_loopback = false`, anyone on this machine (behind a reverse
//! proxy on the same machine, every caller is; set it false there). A
//! client's key opens none of them. Without `[[clients]]` or an operator
//! key they stay open as before.

use std::fmt;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::middleware::Next;
use subtle::ConstantTimeEq;

use crate::gateway::{Gateway, bearer_token};
use crate::reply::json_error;

/// The operator key, never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(pub Vec<u8>);

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminKey(<redacted>)")
    }
}

/// Middleware on the operator endpoints.
pub async fn guard(State(gateway): State<Gateway>, req: Request, next: Next) -> Response<Body> {
    let current = gateway.current();
    let settings = &current.settings;
    // Open as before without clients, unless an operator key is set.
    if settings.clients.is_empty() && settings.gateway.admin_key.is_none() {
        return next.run(req).await;
    }
    let gateway_settings = &settings.gateway;
    let from_loopback = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback());
    let presented = bearer_token(req.headers());
    let admitted = match (&gateway_settings.admin_key, presented) {
        (Some(AdminKey(key)), Some(given)) => bool::from(key.as_slice().ct_eq(given)),
        _ => false,
    };
    if admitted || (from_loopback && gateway_settings.admin_from_loopback) {
        drop(current);
        return next.run(req).await;
    }
    let mut refused = json_error(
        StatusCode::UNAUTHORIZED,
        "admin_key_required",
        "the operator endpoints need the operator key (Authorization: Bearer KEY, \
         gateway.admin_key_env)",
    );
    refused
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    refused
}
