//! The program: check the command line, run the probe, write the report,
//! and choose the exit code.

use std::fs::File;
use std::future::Future;
use std::io::{self, BufWriter, Write};

use crate::cli::{Cli, Config, Out};
use crate::probe::{self, Class, TransportKind};
use crate::report;

/// The run could not start, or its report could not be written.
pub const EXIT_FAILURE: u8 = 1;
/// A mistake in the command line.
pub const EXIT_USAGE: u8 = 2;
/// No request got an HTTP answer (the report is still written).
pub const EXIT_NO_ANSWER: u8 = 3;

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

/// Run `cli`'s probe until it ends or `stop` completes, write the report,
/// and return the exit code. `progress` allows a progress bar.
pub async fn run(cli: Cli, progress: bool, stop: impl Future<Output = ()>) -> u8 {
    let config = match Config::from_cli(cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    let sink = match open(&config.out) {
        Ok(sink) => sink,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let run = match probe::run(&config, progress, stop).await {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    let report = report::build(&config, &run);
    if let Err(e) = finish(sink, &report) {
        eprintln!("error: {e}");
        return EXIT_FAILURE;
    }
    let answered = run
        .outcomes
        .iter()
        .any(|o| matches!(o.class, Class::Status(_)));
    // Stopped before the first request: nothing failed to answer.
    let nothing_sent = run.interrupted && run.outcomes.is_empty();
    if !answered && !nothing_sent {
        eprintln!("error: {}", no_answer(&run.outcomes));
        return EXIT_NO_ANSWER;
    }
    0
}

/// The one line said when no request got an HTTP answer: how many were
/// sent and why most failed, so that an untrusted certificate reads as
/// one, not as an endpoint that refused everything.
pub fn no_answer(outcomes: &[probe::Outcome]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for o in outcomes {
        if let Class::Transport(kind) = o.class {
            *counts.entry(kind).or_insert(0usize) += 1;
        }
    }
    let sent = outcomes.len();
    let Some((&kind, &n)) = counts.iter().max_by_key(|&(_, n)| *n) else {
        return format!("none of the {sent} requests sent got an HTTP answer");
    };
    let why = match kind {
        TransportKind::Tls => {
            "the TLS handshake failed: the certificate is not trusted (a private CA \
             needs --ca-file), has expired, or names another host"
        }
        TransportKind::Connect => "no connection could be made",
        TransportKind::Timeout => "no complete answer within --timeout",
        _ => "the request or its answer broke off",
    };
    format!(
        "none of the {sent} requests sent got an HTTP answer; {n} failed with `{}`: {why}",
        kind.name()
    )
}
