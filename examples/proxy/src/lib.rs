//! proxy: an LLM API gateway in front of upstream providers, with
//! per-(provider, model) limits, live stats and hot reload; all four layers
//! of tower-throttle working together.
//!
//! ```text
//! cargo run -p proxy                      # examples/proxy/proxy.toml: a built-in upstream simulator
//! cargo run -p proxy -- --demo            # ... and a short load showing what each layer does
//! cargo run -p proxy -- --config examples/proxy/proxy.toml --listen 127.0.0.1:8080
//! cargo run --release -p proxy -- --bench # gateway vs simulator alone, on loopback
//! cargo run --release -p proxy -- --bench --tls # gateway vs direct TLS to an HTTPS upstream
//! cargo run --release -p proxy -- --bench --path gateway --requests 2000 --connections 1 # one path alone (for callgrind)
//! ```
//!
//! Requests to `/PROVIDER/...` (or to unprefixed paths, for the default
//! provider) are forwarded upstream through a client stack of
//! `Backoff429Layer`, `ConcurrencyLayer`, `RateLimitLayer` and
//! `IdentityHeaderLayer`, keyed by the route `(provider, model)`, the model
//! read from the JSON body. Streamed answers pass through chunk by chunk and
//! hold their concurrency permit until they end. `GET /stats` (JSON),
//! `GET /events` (server-sent events), `GET /metrics` (Prometheus) and
//! `GET /` (a live page) show what the layers did.
//!
//! Without `--config` it runs `examples/proxy/proxy.toml` from the working
//! directory (so from the repository's root) and applies edits to it; where
//! there is no such file, a copy of it built into the program, which cannot
//! change. The banner says which.
//!
//! The module layout: `cli` (arguments), `config` (the file, its settings and checks),
//! `preset` (what each provider kind expects: auth, usage, limit headers),
//! `app` (start, banner, shutdown), `gateway` (routing, the client stack,
//! forwarding, fallback between deployments and serving; a folder split by
//! role), `access_log` (one line per request, its own writer thread), `tls` (HTTPS upstreams),
//! `usage` (tokens read from answers as they pass), `learn` (limits learned
//! from upstream headers), `multipart` (form bodies' model field), `edge`
//! (what is refused before forwarding: foreign `Host` and `Origin`, paths
//! leaving the base path, bad model names), `reply` (JSON error bodies),
//! `stats` (the four endpoints and the hub behind `/events`, a file each), `operator`
//! (one route's stats, `POST /stats/reset`), `live` (the settings applied to
//! the stateful layers through their handles, and the master switch),
//! `reload` (watching the file), `serve` (connection limits, timeouts and
//! graceful shutdown), `signal` (Ctrl-C and SIGTERM), `simulator` (the
//! built-in upstream), `demo`, `bench` and `bench_tls` (load generators).
//!
//! Exit codes: 0 after Ctrl-C or SIGTERM and a graceful shutdown; 2 for a
//! mistake in the command line or the configuration (one line naming the
//! field); 1 when a socket cannot be opened; 130 when a second Ctrl-C or
//! SIGTERM cuts the shutdown short, or when one stops a `--bench` run.

pub mod access_log;
pub mod admin;
pub mod app;
pub mod bench;
pub mod bench_tls;
pub mod cli;
pub mod config;
pub mod demo;
pub mod edge;
pub mod gateway;
pub mod health;
pub mod learn;
pub mod live;
pub mod multipart;
pub mod operator;
pub mod preset;
pub mod reload;
pub mod reply;
pub mod simulator;
pub mod stats;
pub mod tls;
pub mod usage;

// The programs' shared serving code, under the names the modules use.
pub use serving::{serve, signal};
