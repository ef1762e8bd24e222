//! agent_messaging: flow control between AI agents (nodes) that send each
//! other messages within projects. No agent can flood another or fan out
//! without bound, and none is ever silenced for good.
//!
//! ```text
//! cargo run --example agent_messaging                       # the embedded demo on 127.0.0.1:8090
//! cargo run --example agent_messaging -- --projects FILE --listen 127.0.0.1:8090 \
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
//! - `GET /nodes/{id}/inbox` drains that node's inbox; `POST
//!   /nodes/{id}/turn` starts the node's new turn (`204`); `POST /reset`
//!   clears all flow state (`204`); `GET /stats` counts deliveries,
//!   refusals by reason, and the pairs and turns held.
//!
//! The rules, and which module keeps each: at most one delivered message
//! per `(sender, receiver)` pair per `--pair-interval`, and at most
//! `--fan-out` per sender per turn, the turn ending on the sender's own
//! `POST /nodes/{id}/turn` or `--turn-stale` after it started (`flow`, two
//! `RateLimitLayer`s judged as one by a `JointRateLimitLayer`); refusals not
//! about rate first (`app`); the projects, read once from the file
//! (`projects`); bounded inboxes (`inbox`); the counters (`stats`). It is
//! served like the proxy example (`proxy/serve.rs`: a connection cap, head
//! timeouts, graceful shutdown). Ctrl-C or SIGTERM stops it (exit 0); a
//! mistake in the command line or the projects file exits 2, a socket that
//! cannot be opened 1.

mod app;
mod cli;
mod flow;
mod inbox;
mod projects;
#[allow(dead_code)] // the proxy's; not every item is used here
#[path = "../proxy/serve.rs"]
mod serve;
#[path = "../proxy/signal.rs"]
mod signal;
mod stats;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let directory = match &cli.projects {
        Some(path) => projects::Directory::load(path),
        None => projects::Directory::demo(),
    };
    let directory = match directory {
        Ok(directory) => directory,
        Err(e) => {
            eprintln!("agent_messaging: {e}");
            return ExitCode::from(2);
        }
    };
    let settings = cli.settings();
    let app = match app::App::new(directory, &settings, None) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("agent_messaging: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agent_messaging: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli, settings, app))
}

async fn run(cli: cli::Cli, settings: flow::Settings, app: app::App) -> ExitCode {
    // Installed before anything starts, so an early SIGTERM is a graceful
    // stop too.
    let signals = match signal::StopSignals::listen() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("agent_messaging: cannot listen for signals: {e}");
            return ExitCode::from(1);
        }
    };
    let listener = match tokio::net::TcpListener::bind(cli.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("agent_messaging: cannot listen on {}: {e}", cli.listen);
            return ExitCode::from(1);
        }
    };
    let addr = listener.local_addr().unwrap_or(cli.listen);
    let projects = match &cli.projects {
        Some(path) => tower_throttle::redact::Escaped(&path.to_string_lossy()).to_string(),
        None => "the embedded demo (alice, bob, carol in `demo`; mallory in `other`)".to_owned(),
    };
    println!("agent_messaging: listening on http://{addr}");
    println!("projects: {projects}");
    println!("limits:   {}", app::describe(&settings));
    println!(
        "try:      curl -s http://{addr}/send -d '{{\"from\":\"alice\",\"to\":\"bob\",\"text\":\"hello\"}}'"
    );
    println!("          curl -s http://{addr}/nodes/bob/inbox; curl -s http://{addr}/stats");
    serve::serve(
        listener,
        app.router(),
        serve::ServeLimits::default(),
        serve::Connections::default(),
        signals.stopped("stopping"),
    )
    .await;
    ExitCode::SUCCESS
}
