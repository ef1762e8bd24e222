//! Helpers the proxy's tests share; those shared with the library's and
//! ratecheck's tests are in `testkit`.
#![allow(dead_code, unreachable_pub)]

pub mod fake_upstream;
pub mod prometheus;
pub mod sim;

/// The proxy as `main` runs it, with the arguments in `PROXY_ARGS` (split
/// on spaces): what a test's child process runs. Exits with the proxy's
/// exit code.
#[cfg(unix)] // testkit's child processes are Unix only.
pub fn run_proxy_main_from_env() -> ! {
    use clap::Parser as _;
    use proxy::{app, cli, signal};
    let args = std::env::var("PROXY_ARGS").unwrap_or_default();
    testkit::child::run_and_exit(async {
        app::init_logs(Some("info")).unwrap();
        let signals = signal::StopSignals::listen().unwrap();
        let cli = cli::Cli::try_parse_from(
            std::iter::once("proxy").chain(args.split(' ').filter(|a| !a.is_empty())),
        )
        .unwrap();
        app::run(cli, signals.stopped("shutting down"), None).await
    })
}
