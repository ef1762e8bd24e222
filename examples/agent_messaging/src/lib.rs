//! agent_messaging: flow control between AI agents (nodes) that send each
//! other messages within projects. No agent can flood another or fan out
//! without bound, and none is ever silenced for good.
//!
//! ```text
//! cargo run -p agent_messaging                       # the embedded demo on 127.0.0.1:8090
//! cargo run -p agent_messaging -- --projects FILE --listen 127.0.0.1:8090 \
//!     --pair-interval 10s --fan-out 4 --turn-stale 5m
//! ```
//!
//! - `POST /send` `{"from":"alice","to":"bob","text":"..."}`: `200
//!   {"delivered":true,"id":"<ULID>"}`; `429
//!   {"error":{"code":"rate_limited","limit":"pair"|"fan_out","retry_after_ms":N}}`
//!   with `Retry-After`; `403
//!   {"error":{"code":"not_permitted","reason":"self-send"|"cross-project"|"unaddressable-node-id"}}`;
//!   `409 {"error":{"code":"target_busy"}}` (the receiver's inbox is full;
//!   retry later); `400` for a body that is not a message.
//! - Where the projects file gives nodes keys, a request acts as the node
//!   whose key it presents (`Authorization: Bearer`; `auth`): `401`
//!   without one, `403` `not-the-sender`, `not-your-inbox` or
//!   `not-your-turn` for another node's; `/reset` and `/stats` need
//!   `--admin-key-env`'s key. Without keys, loopback only.
//! - `GET /nodes/{id}/inbox` drains that node's inbox; `POST
//!   /nodes/{id}/turn` starts the node's new turn (`204`); `POST /reset`
//!   clears all flow state (`204`); `GET /stats` counts deliveries,
//!   refusals by reason, and the pairs and turns held.
//!
//! The rules, and which module keeps each: at most one delivered message
//! per `(sender, receiver)` pair per `--pair-interval`, and at most
//! `--fan-out` per sender per turn, the turn ending on the sender's own
//! `POST /nodes/{id}/turn` or `--turn-stale` after it started (`flow`, two
//! `RateLimitLayer`s judged as one by a `JointRateLimitLayer`); who acts
//! as whom (`auth`); refusals not about rate first (`app`); the projects, read once from the file
//! (`projects`); bounded inboxes (`inbox`); the counters (`stats`). It is
//! served like the proxy example (`proxy/serve.rs`: a connection cap, head
//! timeouts, graceful shutdown). Ctrl-C or SIGTERM stops it (exit 0); a
//! mistake in the command line or the projects file exits 2, a socket that
//! cannot be opened 1.

pub mod app;
pub mod auth;
pub mod cli;
pub mod flow;
pub mod inbox;
pub mod projects;
pub mod stats;

// The programs' shared serving code, under the names the modules use.
pub use serving::{serve, signal};
