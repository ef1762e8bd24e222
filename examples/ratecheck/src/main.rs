//! The `ratecheck` program; see the crate docs (`src/lib.rs`).

use ratecheck::{app, cli, signal};
use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors exit with code 2 (clap's own, and app's).
    let cli = cli::Cli::parse();
    // Installed before the run starts, so that an early SIGTERM stops it
    // gracefully too.
    let signals = match signal::StopSignals::listen() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("error: cannot listen for signals: {e}");
            return ExitCode::from(app::EXIT_FAILURE);
        }
    };
    let stop = signals.stopped("stopping; writing the partial report");
    ExitCode::from(app::run(cli, true, stop).await)
}
