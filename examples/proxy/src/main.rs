//! The `proxy` program; see the crate docs (`src/lib.rs`).

use proxy::{app, cli, signal};
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if let Err(e) = app::init_logs(cli.log.as_deref()) {
        eprintln!("proxy: {e}");
        return ExitCode::from(app::EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("proxy: cannot start the runtime: {e}");
            return ExitCode::from(app::EXIT_FAILURE);
        }
    };
    let code = runtime.block_on(async {
        // Installed before anything starts, so an early SIGTERM is a
        // graceful stop too.
        let signals = match signal::StopSignals::listen() {
            Ok(signals) => signals,
            Err(e) => {
                eprintln!("proxy: cannot listen for signals: {e}");
                return app::EXIT_FAILURE;
            }
        };
        app::run(cli, signals.stopped("shutting down"), None).await
    });
    // Streams still held by clients must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(code)
}
