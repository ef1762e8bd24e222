//! The `agent_messaging` program; see the crate docs (`src/lib.rs`).

use agent_messaging::{app, auth, cli, flow, projects, serve, signal};
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let directory = match &cli.projects {
        Some(path) => projects::Directory::load(path),
        None => projects::Directory::demo(),
    };
    let directory = match directory
        .map_err(|e| e.to_string())
        .and_then(|d| cli.access(d, &|name| std::env::var(name).ok()))
    {
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

/// The banner's line on who may act as whom.
fn describe_access(access: &auth::Access) -> &'static str {
    match (access.has_node_keys(), access.has_operator_key()) {
        (false, _) => {
            "none: the nodes have no keys, so any local client can act as any node \
             (loopback only)"
        }
        (true, true) => "each node by its key, the operator by --admin-key-env (Bearer)",
        (true, false) => {
            "each node by its key (Bearer); /reset and /stats are off without --admin-key-env"
        }
    }
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
    println!("access:   {}", describe_access(app.access()));
    println!(
        "try:      curl -s http://{addr}/send -d '{{\"from\":\"alice\",\"to\":\"bob\",\"text\":\"hello\"}}'"
    );
    println!("          curl -s http://{addr}/nodes/bob/inbox; curl -s http://{addr}/stats");
    serve::serve(
        listener,
        app.router_on(addr),
        serve::ServeLimits::default(),
        serve::Connections::default(),
        signals.stopped("stopping"),
    )
    .await;
    ExitCode::SUCCESS
}
