//! ratecheck: measure and diagnose the rate limiter in front of an HTTP
//! endpoint.
//!
//! ```text
//! cargo run --release --example ratecheck -- \
//!     --url http://127.0.0.1:8080/v1/chat/completions --method POST \
//!     --header 'Authorization: Bearer $TOKEN' --header 'Content-Type: application/json' \
//!     --body-file request.json --mode diagnose --rpm 60 --out report.json
//! ```
//!
//! Six modes: `sustained`, `burst`, `token-bucket`, `sliding-window`,
//! `window-boundary` and `diagnose` (see `--help`). The JSON report holds
//! counts, latency percentiles and status codes, never a request body, a
//! header value or a token.
//!
//! Exit codes: 0 when the run finished and the report was written; 2 for a
//! mistake in the command line (bad URL, header, body file, output path,
//! zero rpm/burst/concurrency); 1 when the report could not be written.

mod cli;
mod inference;
mod probe;
mod report;
mod schedule;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Config, Out};

/// Where the report is written, opened before the run so that a bad path
/// fails at once.
enum Sink {
    Summary,
    Stdout,
    File(std::path::PathBuf, File),
}

fn open(out: &Out) -> Result<Sink, String> {
    Ok(match out {
        Out::Summary => Sink::Summary,
        Out::Stdout => Sink::Stdout,
        Out::File(path) => {
            let file = File::create(path)
                .map_err(|e| format!("cannot write --out {}: {e}", path.display()))?;
            Sink::File(path.clone(), file)
        }
    })
}

fn write_json(w: impl Write, report: &report::Report) -> io::Result<()> {
    let mut w = BufWriter::new(w);
    serde_json::to_writer_pretty(&mut w, report)?;
    writeln!(w)?;
    w.flush()
}

fn finish(sink: Sink, report: &report::Report) -> Result<(), String> {
    match sink {
        Sink::Summary => print!("{}", report::summary_text(report)),
        Sink::Stdout => write_json(io::stdout().lock(), report)
            .map_err(|e| format!("cannot write the report to stdout: {e}"))?,
        Sink::File(path, file) => {
            write_json(file, report)
                .map_err(|e| format!("cannot write the report to {}: {e}", path.display()))?;
            print!("{}", report::summary_text(report));
            println!("  report: {}", path.display());
        }
    }
    Ok(())
}

/// Completes on Ctrl-C; never, where signals cannot be listened to.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors exit with code 2 (clap's own, and ours below).
    let cli = Cli::parse();
    let config = match Config::from_cli(cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    let sink = match open(&config.out) {
        Ok(sink) => sink,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let run = match probe::run(&config, true, interrupted()).await {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = report::build(&config, &run);
    match finish(sink, &report) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
