//! The program: load the configuration, start the simulator and the
//! gateway, print where they are, reload on edits, and shut down on a
//! signal. Exit codes: 0 after a shutdown; 2 for a bad command line or
//! configuration; 1 when a socket cannot be opened.

use std::future::Future;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

use crate::cli::Cli;
use crate::config::{self, DEFAULT_CONFIG, DEFAULT_LISTEN, DEFAULT_PATH, Settings};
use crate::gateway::{self, Running, StartError};
use crate::{bench, bench_tls, demo, reload};

/// Logs to stderr, filtered by `--log`, else `RUST_LOG`, else `info`.
pub fn init_logs(filter: Option<&str>) -> Result<(), String> {
    let text = filter
        .map(str::to_owned)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    let targets: Targets = text
        .parse()
        .map_err(|e| format!("invalid log filter `{text}`: {e}"))?;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false),
        )
        .with(targets)
        .try_init()
        .map_err(|e| e.to_string())
}

/// Exit code for a mistake in the command line or the configuration.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the proxy cannot start for another reason.
pub const EXIT_FAILURE: u8 = 1;

/// A load test stopped by Ctrl-C or SIGTERM (as a shell reports SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// A configuration, where it came from, and its bytes (for the watcher).
pub struct Loaded {
    /// Checked.
    pub settings: Settings,
    /// The file's path, or what the embedded copy is.
    pub source: String,
    /// The file's contents.
    pub bytes: Vec<u8>,
    /// The file to watch for edits; none for the embedded copy, which
    /// cannot change.
    pub watch: Option<PathBuf>,
}

/// Read and check the configuration: `path` (`--config`); else
/// `default_path` when that file exists (the example config, found from
/// the repository's root), else the embedded copy of it. The error is one
/// line naming the file and the field.
pub fn load(
    path: Option<&Path>,
    default_path: &Path,
    env: config::Env<'_>,
) -> Result<Loaded, String> {
    let path = match path {
        Some(path) => path,
        // A file that exists but cannot be read or checked is an error, as
        // with --config: running the embedded copy instead would hide it.
        None if default_path.exists() => default_path,
        None => {
            let settings = Settings::from_toml(DEFAULT_CONFIG, env)
                .map_err(|e| format!("the embedded default configuration: {e}"))?;
            return Ok(Loaded {
                settings,
                source: format!(
                    "embedded copy of {DEFAULT_PATH}; no such file here, so edits need --config"
                ),
                bytes: DEFAULT_CONFIG.as_bytes().to_vec(),
                watch: None,
            });
        }
    };
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| format!("{}: the file is not UTF-8", path.display()))?;
    let settings =
        Settings::from_toml(text, env).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Loaded {
        settings,
        source: path.display().to_string(),
        bytes,
        watch: Some(path.to_owned()),
    })
}

/// Run the proxy until `stop` completes; returns the exit code. `ready`
/// gets the gateway's URL once it serves.
pub async fn run(
    cli: Cli,
    stop: impl Future<Output = ()>,
    ready: Option<oneshot::Sender<String>>,
) -> u8 {
    let loaded = match load(
        cli.config.as_deref(),
        Path::new(DEFAULT_PATH),
        &config::process_env,
    ) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("proxy: {e}");
            return EXIT_USAGE;
        }
    };
    if cli.bench {
        if cli.requests == 0 || cli.connections.is_empty() || cli.connections.contains(&0) {
            eprintln!("proxy: --requests and every --connections must be at least 1");
            return EXIT_USAGE;
        }
        // Ctrl-C and SIGTERM stop a load test too.
        return tokio::select! {
            result = async {
                if cli.tls {
                    bench_tls::run(cli.requests, &cli.connections).await
                } else {
                    match cli.path {
                        Some(path) => bench::run_one(path, cli.requests, &cli.connections).await,
                        None => bench::run(cli.requests, &cli.connections).await,
                    }
                }
            } => match result {
                Ok(report) => {
                    print!("{report}");
                    0
                }
                Err(e) => {
                    eprintln!("proxy: load test failed: {e}");
                    EXIT_FAILURE
                }
            },
            () = stop => {
                eprintln!("proxy: load test stopped");
                EXIT_INTERRUPTED
            }
        };
    }
    if cli.simulator_only {
        return simulator_only(loaded.settings, cli.listen, stop).await;
    }
    let mut loaded = loaded;
    loaded.settings.allow_insecure = cli.allow_insecure;
    if let Some(url) = &cli.redis {
        loaded.settings = match loaded.settings.with_redis(url) {
            Ok(settings) => settings,
            Err(e) => {
                eprintln!("proxy: {e}");
                return EXIT_USAGE;
            }
        };
    }
    let listen = match cli.listen.or(loaded.settings.gateway.listen) {
        Some(addr) => addr,
        None => DEFAULT_LISTEN
            .parse::<SocketAddr>()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
    };
    let running = match gateway::start(loaded.settings, listen, loaded.source.clone()).await {
        Ok(running) => running,
        Err(e @ StartError::Config(_)) => {
            eprintln!("proxy: {e}");
            return EXIT_USAGE;
        }
        Err(e @ StartError::Io(_)) => {
            eprintln!("proxy: {e}");
            return EXIT_FAILURE;
        }
    };
    print!("{}", banner(&running, loaded.watch.is_some()));
    let watcher = loaded.watch.map(|path| {
        reload::spawn(
            path,
            loaded.bytes,
            reload::Timing::DEFAULT,
            running.gateway.clone(),
            Arc::new(config::process_env),
        )
    });
    if let Some(ready) = ready {
        let _ = ready.send(running.url());
    }
    let demo = cli.demo.then(|| {
        let url = running.url();
        let gateway = running.gateway.clone();
        let counts = running.simulator.as_ref().map(|s| s.handle());
        tokio::spawn(async move {
            match demo::run(&url, &gateway, counts).await {
                Ok(report) => println!("{report}\ndemo done; still serving (Ctrl-C to stop)"),
                Err(e) => eprintln!("demo failed: {e}"),
            }
        })
    });
    stop.await;
    tracing::info!("shutting down");
    if let Some(demo) = demo {
        demo.abort();
    }
    let clean = running.shutdown().await;
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    tracing::info!(clean, "stopped");
    0
}

/// `--simulator-only`: the file's `[simulator]` alone, on `listen`, until
/// `stop`, so that several gateways can share one upstream.
async fn simulator_only(
    settings: Settings,
    listen: Option<SocketAddr>,
    stop: impl Future<Output = ()>,
) -> u8 {
    let (Some(sim), Some(listen)) = (settings.simulator, listen) else {
        eprintln!("proxy: --simulator-only needs --listen and a [simulator] section");
        return EXIT_USAGE;
    };
    let sim = config::SimSettings { listen, ..sim };
    let simulator = match crate::simulator::Simulator::start(sim).await {
        Ok(simulator) => simulator,
        Err(e) => {
            eprintln!("proxy: cannot start the simulator on {listen}: {e}");
            return EXIT_FAILURE;
        }
    };
    println!("tower-throttle proxy: the simulator alone");
    println!("  simulator  {}", simulator.url());
    stop.await;
    tracing::info!("shutting down");
    simulator.stop(std::time::Duration::from_secs(5)).await;
    tracing::info!(clean = true, "stopped");
    0
}

/// Where everything is, and a request to try.
pub fn banner(running: &Running, watching: bool) -> String {
    let url = running.url();
    let current = running.gateway.current();
    let mut out = String::new();
    out.push_str("tower-throttle proxy\n");
    out.push_str(&format!(
        "  gateway    {url}   (config: {}",
        running.gateway.source()
    ));
    out.push_str(if watching {
        ", reloaded on edit)\n"
    } else {
        ")\n"
    });
    for p in running.gateway.providers() {
        let unprefixed = if p.default {
            "  and unprefixed paths"
        } else {
            ""
        };
        out.push_str(&format!(
            "  provider   {url}/{}/...  -> {}{unprefixed}\n",
            p.name, p.upstream
        ));
    }
    if let Some(sim) = &running.simulator {
        out.push_str(&format!("  simulator  {}   (models: ", sim.url()));
        let models: Vec<String> = current
            .settings
            .simulator
            .iter()
            .flat_map(|s| s.models.iter())
            .map(|m| m.name.clone())
            .collect();
        out.push_str(&models.join(", "));
        out.push_str(")\n");
    }
    out.push_str(&format!("  live page  {url}/\n"));
    out.push_str(&format!(
        "  stats      {url}/stats   events: {url}/events   metrics: {url}/metrics\n"
    ));
    let model = current
        .settings
        .simulator
        .as_ref()
        .and_then(|s| s.models.first())
        .map(|m| m.name.clone())
        .unwrap_or_else(|| "MODEL".to_owned());
    let path = match current.settings.default_provider() {
        Some(_) => "/v1/chat/completions".to_owned(),
        None => format!(
            "/{}/v1/chat/completions",
            current
                .settings
                .providers
                .first()
                .map_or("PROVIDER", |p| &*p.name)
        ),
    };
    out.push_str(&format!(
        "try:\n  curl -s {url}{path} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'\n"
    ));
    out.push_str(&format!(
        "  for i in $(seq 30); do curl -s -o /dev/null -w '%{{http_code}} ' {url}{path} -d '{{\"model\":\"{model}\"}}' & done; wait; echo\n"
    ));
    out
}
