//! ratecheck: measure and diagnose the rate limiter in front of an HTTP
//! endpoint.
//!
//! ```text
//! cargo run --example ratecheck -- \
//!     --url http://127.0.0.1:8080/v1/chat/completions --method POST \
//!     --header 'Authorization: Bearer $TOKEN' --header 'Content-Type: application/json' \
//!     --body-file examples/ratecheck/request.json --mode diagnose --rpm 60 --out report.json
//! ```
//!
//! `diagnose` sends a burst of 1.5 × `--burst` (at least 2 more), so that
//! the limit's edge shows as 429s; the summary says so on its burst line.
//!
//! Six modes: `sustained`, `burst`, `token-bucket`, `sliding-window`,
//! `window-boundary` and `diagnose` (see `--help`). The JSON report holds
//! counts, latency percentiles and status codes, never a request body, a
//! header value or a token.
//!
//! Ctrl-C or SIGTERM stops a run at once: nothing more is sent, requests in
//! flight are cancelled (counted as `cancelled`), and the partial report is
//! written; a second one quits without a report.
//!
//! Exit codes: 0 when the run finished and the report was written; 1 when
//! the report could not be written; 2 for a mistake in the command line
//! (bad URL, header, body file, CA file, output path, zero
//! rpm/burst/concurrency); 3 when no request got an HTTP answer (the report
//! is written: its `errors` say why, e.g. `connect`, `tls` or `timeout`);
//! 130 when a second Ctrl-C or SIGTERM cut the stop short.

mod app;
mod cli;
#[cfg(test)]
mod fixtures;
mod inference;
#[cfg(test)]
mod inference_tests;
mod models;
mod probe;
mod report;
mod schedule;
#[path = "../proxy/signal.rs"]
mod signal;
#[cfg(test)]
mod tests;
mod timeline;
mod tls;

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
