//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

pub use crate::bench::BenchPath;

/// An LLM API gateway: per-(provider, model) rate limits, concurrency caps
/// and upstream-429 cooldowns in front of OpenAI-compatible upstreams, with
/// live stats. Without --config it runs examples/proxy/proxy.toml from the
/// working directory, applying edits to it, or, where there is no such file,
/// a copy of it built into the program: a built-in upstream simulator behind
/// limits tighter than its own.
#[derive(Debug, Parser)]
#[command(name = "proxy")]
pub struct Cli {
    /// Configuration file (TOML; see examples/proxy/proxy.toml). Edits are
    /// applied while running [default: examples/proxy/proxy.toml if it is
    /// in the working directory, else a built-in copy of it].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address the gateway listens on [default: `[gateway] listen`, else
    /// 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Also drive a short load through the gateway and print what each
    /// layer did; then keep serving.
    #[arg(long, conflicts_with = "bench")]
    pub demo: bool,

    /// Load test on loopback: the gateway in front of the simulator against
    /// the simulator alone, no limit hit; print throughput and latency, exit.
    #[arg(long)]
    pub bench: bool,

    /// Load-test with an HTTPS upstream (a local one, its certificate made
    /// at start): the gateway against direct TLS requests.
    #[arg(long, requires = "bench")]
    pub tls: bool,

    /// Requests per load-test run.
    #[arg(long, value_name = "N", default_value_t = 20_000, requires = "bench")]
    pub requests: u64,

    /// Connections of the load-test runs, comma-separated.
    #[arg(
        long,
        value_name = "C,...",
        default_value = "1,32",
        value_delimiter = ',',
        requires = "bench"
    )]
    pub connections: Vec<usize>,

    /// Load-test one path alone (warmed up, then --requests over each
    /// --connections): to count a path's instructions per request under
    /// callgrind, as the difference of two runs of different sizes.
    #[arg(long, value_enum, requires = "bench", conflicts_with = "tls")]
    pub path: Option<BenchPath>,

    /// Keep the rate limits and the cooldowns in Redis at URL, shared by
    /// every gateway given the same URL (as `[store] redis_url`; needs the
    /// `redis` feature).
    #[arg(long, value_name = "URL", conflicts_with_all = ["bench", "simulator_only"])]
    pub redis: Option<String>,

    /// Let `insecure_skip_verify = true` apply to a provider that is not on
    /// a loopback address (without it, such a provider is refused at start
    /// and on reload). Its certificate is then not checked: for tests only.
    #[arg(long)]
    pub allow_insecure: bool,

    /// Run the built-in simulator alone (the file's `[simulator]`) on
    /// --listen, so that several gateways can share one upstream.
    #[arg(long, requires = "listen", conflicts_with_all = ["bench", "demo"])]
    pub simulator_only: bool,

    /// Log filter: a level (`info`, `debug`) or `target=level` pairs
    /// [default: $RUST_LOG, else info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
}
