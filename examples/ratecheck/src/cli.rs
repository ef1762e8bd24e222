//! The command line, and the checked configuration made from it.
//!
//! Numbers are checked by clap's value parsers, so `--rpm 0` fails with a
//! clear message and exit code 2 before anything runs. Values that may hold a
//! secret (the URL, headers) are taken as plain text by clap and checked
//! afterwards by [`Config::from_cli`], whose messages never repeat them.

use std::fmt;
use std::io::Read as _;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use rustls::pki_types::CertificateDer;
use serde::Serialize;

use crate::schedule::{MAX_REQUESTS, Params, TooManyRequests, planned_requests};

/// The largest `--body-file` read: 16 MiB.
pub const MAX_BODY_FILE: u64 = 16 << 20;

/// Longest `--window`, `--duration` or probe span accepted.
const MAX_SPAN: Duration = Duration::from_secs(86_400);

/// Stopping and exit codes, after the options in `--help`.
const AFTER_HELP: &str = "\
Ctrl-C or SIGTERM stops a run at once: nothing more is sent, requests in
flight are cancelled (reported as `cancelled`), and the partial report is
written. A second Ctrl-C or SIGTERM quits without a report (exit code 130).

Exit codes:
  0  the run finished (or was stopped) and the report was written
  1  the run could not start, or the report could not be written
  2  a mistake in the command line
  3  no request got an HTTP answer (the report is written; see its errors)";

/// Measure and diagnose the rate limiter in front of an HTTP endpoint.
///
/// `--rpm` is the limit to probe, in requests per `--window` (60 s unless
/// set, so requests per minute). Requests answered 429 count as refusals by
/// the limiter; every other failure is reported apart.
#[derive(Parser)]
#[command(name = "ratecheck", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// The endpoint to probe (http:// or https://). Credentials and the
    /// query string are sent but never written to the report.
    #[arg(long, value_name = "URL")]
    pub url: String,

    /// HTTP method.
    #[arg(long, value_name = "METHOD", default_value = "GET")]
    pub method: String,

    /// A request header, 'Name: value'; repeat for more. Values are sent but
    /// never written to the report or to error messages.
    #[arg(long = "header", short = 'H', value_name = "'K: V'")]
    pub headers: Vec<String>,

    /// Send the contents of this file as the request body (at most 16 MiB).
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,

    /// PEM file of CA certificates to trust for an https:// --url, in
    /// addition to the public web roots (a private CA, a test's).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,

    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Sustained)]
    pub mode: Mode,

    /// The limit to probe: requests per --window (for diagnose, a hint: it
    /// measures the limit and window actually enforced).
    #[arg(long, value_name = "N", value_parser = parse_rpm)]
    pub rpm: NonZeroU32,

    /// Size of a burst or of a boundary batch [default: --rpm].
    #[arg(long, value_name = "N", value_parser = parse_burst)]
    pub burst: Option<NonZeroU32>,

    /// How long a sustained run lasts [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub duration: Option<Duration>,

    /// How long to probe after the burst, in seconds [default: 30 for
    /// token-bucket; 1.5 x --window (90 for a 60 s window) for
    /// sliding-window]. For diagnose, the whole run's length (its wait for
    /// the middle of a window included), and what it has no time for is
    /// left out and named in the report [default: the whole design, up to
    /// 3.25 x --window].
    #[arg(long, value_name = "N", value_parser = parse_probe_seconds)]
    pub probe_seconds: Option<NonZeroU32>,

    /// How far before and after the window boundary the two batches go
    /// (window-boundary and diagnose) [default: 500, at most a tenth of the
    /// window when --window is shorter than 10 s].
    #[arg(long, value_name = "MS", value_parser = parse_offset)]
    pub window_offset_ms: Option<u64>,

    /// Length of the limiter's window (or the period --rpm refills over).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_span)]
    pub window: Duration,

    /// Most requests in flight at once.
    #[arg(long, value_name = "N", default_value = "100", value_parser = parse_concurrency)]
    pub concurrency: NonZeroU32,

    /// Give up on a request after this long (counted as a timeout failure).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_span)]
    pub timeout: Duration,

    /// Write the JSON report to this file; `-` prints only the report on
    /// stdout. Without it a short summary is printed instead.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Shows no value that may hold a secret (URL, headers, body path).
impl fmt::Debug for Cli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cli")
            .field("mode", &self.mode)
            .field("rpm", &self.rpm)
            .field("headers", &self.headers.len())
            .finish_non_exhaustive()
    }
}

/// The six things ratecheck can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One request every window/rpm for --duration (requests may overlap).
    Sustained,
    /// --burst requests at once.
    Burst,
    /// A burst, then probes at the expected refill rate (at least one per
    /// second) for --probe-seconds.
    TokenBucket,
    /// A burst, then one probe per second for --probe-seconds.
    SlidingWindow,
    /// One batch --window-offset-ms before the next window boundary and one
    /// as long after it.
    WindowBoundary,
    /// A burst of 1.5 × --burst (at least 2 more, so the limit's edge shows
    /// as 429s), probes for --probe-seconds and three batches, then the
    /// limiter's design and the limit and window it enforces, each with how
    /// sure the probe is.
    Diagnose,
}

impl Mode {
    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sustained => "sustained",
            Mode::Burst => "burst",
            Mode::TokenBucket => "token-bucket",
            Mode::SlidingWindow => "sliding-window",
            Mode::WindowBoundary => "window-boundary",
            Mode::Diagnose => "diagnose",
        }
    }
}

fn parse_nonzero(s: &str, what: &str) -> Result<NonZeroU32, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a whole number from 1 to {}", u32::MAX))?;
    NonZeroU32::new(n).ok_or_else(|| format!("must be at least 1: {what}"))
}

fn parse_rpm(s: &str) -> Result<NonZeroU32, String> {
    parse_nonzero(s, "it is the limit to probe, in requests per --window")
}

fn parse_burst(s: &str) -> Result<NonZeroU32, String> {
    parse_nonzero(
        s,
        "it is how many requests a burst sends (leave it out to use --rpm)",
    )
}

fn parse_concurrency(s: &str) -> Result<NonZeroU32, String> {
    parse_nonzero(
        s,
        "it caps the requests in flight, and with 0 none could be sent",
    )
}

fn parse_probe_seconds(s: &str) -> Result<NonZeroU32, String> {
    let n = parse_nonzero(s, "it is how many seconds to probe after the burst")?;
    if u64::from(n.get()) > MAX_SPAN.as_secs() {
        return Err(format!("must be at most {} (one day)", MAX_SPAN.as_secs()));
    }
    Ok(n)
}

fn parse_offset(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a whole number of milliseconds".to_string())?;
    if n == 0 {
        return Err(
            "must be at least 1 ms: the batches go this far either side of the boundary".into(),
        );
    }
    Ok(n)
}

/// A duration such as `60s`, `1m30s` or `500ms`: longer than zero, at most a
/// day.
fn parse_span(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (expected a duration such as 60s, 2m or 500ms)"))?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    if d > MAX_SPAN {
        return Err("must be at most 24h".into());
    }
    Ok(d)
}

/// A mistake in what the user asked for; ratecheck exits with code 2.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Where the report goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    /// No report file: print a short summary on stdout.
    Summary,
    /// The report alone on stdout (`--out -`).
    Stdout,
    /// The report to a file, a summary on stdout.
    File(PathBuf),
}

/// A request body; its `Debug` shows only the length.
#[derive(Clone, PartialEq, Eq)]
pub struct Body(pub Bytes);

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Body({} bytes)", self.0.len())
    }
}

/// A checked run configuration.
///
/// Its `Debug` never shows header values, the body, URL credentials or the
/// query string.
#[derive(Clone)]
pub struct Config {
    /// The URL requests go to, as given.
    pub url: Url,
    /// The URL without credentials, query or fragment: what reports show.
    pub target: String,
    pub method: Method,
    /// Values are marked sensitive.
    pub headers: HeaderMap,
    pub body: Option<Body>,
    /// `--ca-file`'s certificates (DER), trusted besides the web roots.
    pub ca_certs: Vec<CertificateDer<'static>>,
    pub mode: Mode,
    pub rpm: u32,
    pub burst: u32,
    pub window: Duration,
    pub duration: Duration,
    pub probe: Duration,
    pub offset: Duration,
    /// Diagnose with `--probe-seconds`: the whole run's length at most.
    pub budget: Option<Duration>,
    pub concurrency: usize,
    pub timeout: Duration,
    pub out: Out,
    /// Flags given that this mode does not use, and similar notes for stderr.
    pub warnings: Vec<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("target", &self.target)
            .field("method", &self.method)
            .field("header_names", &header_names(&self.headers))
            .field("body", &self.body)
            .field("ca_certs", &self.ca_certs.len())
            .field("mode", &self.mode)
            .field("rpm", &self.rpm)
            .field("burst", &self.burst)
            .field("window", &self.window)
            .field("duration", &self.duration)
            .field("probe", &self.probe)
            .field("budget", &self.budget)
            .field("offset", &self.offset)
            .field("concurrency", &self.concurrency)
            .field("timeout", &self.timeout)
            .field("out", &self.out)
            .finish()
    }
}

/// The names of `headers`, lower case, in order, without repeats.
pub fn header_names(headers: &HeaderMap) -> Vec<String> {
    headers
        .keys()
        .map(|name| name.as_str().to_owned())
        .collect()
}

/// Parse the `--url` value: http or https with a host. Errors never repeat
/// it.
pub fn parse_url(s: &str) -> Result<Url, UsageError> {
    let url = Url::parse(s.trim()).map_err(|e| {
        usage(format!(
            "invalid --url: {e} (expected http://host[:port]/path)"
        ))
    })?;
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(usage(format!(
                "invalid --url: scheme `{other}` is not supported; use http:// or https://"
            )));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(usage("invalid --url: it has no host"));
    }
    Ok(url)
}

/// The URL as reports show it: no credentials, no query string, no fragment.
pub fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    // Both only fail for URLs that cannot have credentials, which then have none.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// Parse one `--header 'Name: value'`. Errors name the header at most, never
/// its value.
pub fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), UsageError> {
    let Some((name, value)) = s.split_once(':') else {
        return Err(usage(
            "invalid --header: expected 'Name: value' (no `:` found; the value is not shown)",
        ));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(usage("invalid --header: the name before `:` is empty"));
    }
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        usage(format!(
            "invalid --header: `{}` is not a valid header name",
            name.escape_debug()
        ))
    })?;
    let mut value = HeaderValue::from_str(value.trim()).map_err(|_| {
        usage(format!(
            "invalid --header `{header}`: the value has characters a header cannot carry \
             (the value is not shown)"
        ))
    })?;
    value.set_sensitive(true);
    Ok((header, value))
}

impl Config {
    /// Check everything clap could not, and read the body file.
    pub fn from_cli(cli: Cli) -> Result<Config, UsageError> {
        let url = parse_url(&cli.url)?;
        let method = Method::from_bytes(cli.method.trim().as_bytes()).map_err(|_| {
            usage(format!(
                "invalid --method `{}`: not an HTTP method token",
                cli.method.escape_debug()
            ))
        })?;
        let mut headers = HeaderMap::new();
        for raw in &cli.headers {
            let (name, value) = parse_header(raw)?;
            headers.append(name, value);
        }
        let body = match &cli.body_file {
            None => None,
            Some(path) => {
                // Read at most one byte past the cap: `/dev/zero` or a
                // mistaken multi-gigabyte file is refused, not read into
                // memory until it runs out.
                let mut bytes = Vec::new();
                std::fs::File::open(path)
                    .and_then(|f| f.take(MAX_BODY_FILE + 1).read_to_end(&mut bytes))
                    .map_err(|e| {
                        usage(format!("cannot read --body-file {}: {e}", path.display()))
                    })?;
                if bytes.len() as u64 > MAX_BODY_FILE {
                    return Err(usage(format!(
                        "--body-file {} is larger than {MAX_BODY_FILE} bytes (16 MiB); \
                         a request body that large is not what a rate probe should send",
                        path.display()
                    )));
                }
                Some(Body(Bytes::from(bytes)))
            }
        };
        let ca_certs = match &cli.ca_file {
            None => Vec::new(),
            Some(_) if url.scheme() != "https" => {
                return Err(usage(
                    "--ca-file is for an https:// --url; this one is plain http",
                ));
            }
            Some(path) => crate::tls::read_ca_file(path).map_err(usage)?,
        };

        let mode = cli.mode;
        let rpm = cli.rpm.get();
        let burst = cli.burst.map_or(rpm, NonZeroU32::get);
        let window = cli.window;
        let mut warnings = Vec::new();
        let mut unused = |given: bool, flag: &str, used_by: &str| {
            if given {
                warnings.push(format!(
                    "{flag} is not used by --mode {} (only by {used_by})",
                    mode.name()
                ));
            }
        };
        let uses_burst = !matches!(mode, Mode::Sustained);
        let uses_offset = matches!(mode, Mode::WindowBoundary | Mode::Diagnose);
        let uses_probe = matches!(
            mode,
            Mode::TokenBucket | Mode::SlidingWindow | Mode::Diagnose
        );
        unused(
            cli.burst.is_some() && !uses_burst,
            "--burst",
            "every mode but sustained",
        );
        unused(
            cli.duration.is_some() && mode != Mode::Sustained,
            "--duration",
            "sustained",
        );
        unused(
            cli.probe_seconds.is_some() && !uses_probe,
            "--probe-seconds",
            "token-bucket, sliding-window and diagnose",
        );
        unused(
            cli.window_offset_ms.is_some() && !uses_offset,
            "--window-offset-ms",
            "window-boundary and diagnose",
        );

        let duration = cli.duration.unwrap_or(Duration::from_secs(60));
        let given = cli
            .probe_seconds
            .map(|secs| Duration::from_secs(u64::from(secs.get())));
        let probe = match mode {
            // A sliding log and a window anchored at a request both reopen
            // one window after the burst; they differ one window after the
            // first probes they admitted then: two windows in all.
            Mode::Diagnose => given.unwrap_or_else(|| window.saturating_mul(2)),
            Mode::SlidingWindow => given.unwrap_or_else(|| window.mul_f64(1.5)),
            _ => given.unwrap_or(Duration::from_secs(30)),
        };
        let offset = match cli.window_offset_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_millis(500).min(window / 10),
        };
        if uses_offset && offset.saturating_mul(2) >= window {
            return Err(usage(format!(
                "--window-offset-ms {} must be less than half of --window ({} ms)",
                offset.as_millis(),
                window.as_millis()
            )));
        }
        if uses_offset && offset.is_zero() {
            return Err(usage(
                "--window is too short for a window offset of at least 1 ms",
            ));
        }
        if mode == Mode::Diagnose && probe < window.saturating_mul(2) {
            warnings.push(format!(
                "--probe-seconds {} is shorter than two windows ({} s): diagnose may not tell a \
                 sliding window from a fixed window that starts at the first request, and then \
                 answers `unknown` with both as candidates",
                probe.as_secs(),
                window.saturating_mul(2).as_secs_f64()
            ));
        }

        let out = match cli.out {
            None => Out::Summary,
            Some(path) if path.as_os_str() == "-" => Out::Stdout,
            Some(path) => Out::File(path),
        };
        // Diagnose's --probe-seconds bounds the whole run: a user giving
        // a time budget expects the run, its waits included, to keep it.
        let budget = given.filter(|_| mode == Mode::Diagnose);
        let params = Params {
            mode,
            rpm,
            burst,
            window,
            duration,
            probe,
            offset,
            budget,
        };
        let count = planned_requests(&params);
        if count > u128::from(MAX_REQUESTS) {
            return Err(usage(TooManyRequests(count).to_string()));
        }
        Ok(Config {
            target: redact(&url),
            url,
            method,
            headers,
            body,
            ca_certs,
            mode,
            rpm,
            burst,
            window,
            duration,
            probe,
            offset,
            budget,
            concurrency: usize::try_from(cli.concurrency.get()).unwrap_or(usize::MAX),
            timeout: cli.timeout,
            out,
            warnings,
        })
    }

    /// Parse a full command line (program name first), as a test would.
    #[allow(dead_code)]
    pub fn from_args<I, T>(args: I) -> Result<Config, UsageError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args).map_err(|e| usage(e.to_string()))?;
        Config::from_cli(cli)
    }
}
