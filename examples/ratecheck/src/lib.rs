//! ratecheck: measure and diagnose the rate limiter in front of an HTTP
//! endpoint.
//!
//! ```text
//! cargo run -p ratecheck -- \
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

pub mod app;
pub mod cli;
#[cfg(test)]
mod fixtures;
pub mod inference;
#[cfg(test)]
mod inference_tests;
pub mod models;
pub mod probe;
pub mod report;
pub mod schedule;
#[cfg(test)]
mod tests;
pub mod timeline;
pub mod tls;

// Stopping on Ctrl-C or SIGTERM, shared with the other programs.
pub use serving::signal;
