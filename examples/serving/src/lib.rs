//! How the example programs serve (the `proxy` gateway, the
//! `agent_messaging` service, the `axum_server` example) and stop
//! (`ratecheck` too): one copy of the edge's connection limits and of the
//! signal handling, used by each program.

pub mod edge;
pub mod serve;
pub mod signal;
pub mod tls;
pub mod write_timeout;
