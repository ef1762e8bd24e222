//! `ratecheck` probing an HTTPS endpoint: a local upstream with a
//! certificate made at test time (`support/tls_upstream.rs`), trusted through
//! `--ca-file`; without it, every request is a `tls` failure, not a hang.

use testkit::tls_upstream;

use ratecheck::{cli, probe, report};

use std::time::Duration;

use crate::cli::Config;
use crate::report::Report;
use crate::tls_upstream::{Alpn, TestCa, TlsUpstream};

/// Run ratecheck with `args`; the report (bounded: 20 s).
async fn ratecheck(args: &[String]) -> Report {
    let mut all = vec!["ratecheck".to_owned()];
    all.extend_from_slice(args);
    let config = Config::from_args(all).expect("valid command line");
    let run = tokio::time::timeout(
        Duration::from_secs(20),
        probe::run(&config, false, std::future::pending()),
    )
    .await
    .expect("the run ends within 20 s")
    .expect("the run starts");
    report::build(&config, &run)
}

fn burst(url: &str) -> Vec<String> {
    [
        "--url",
        url,
        "--mode",
        "burst",
        "--rpm",
        "3",
        "--timeout",
        "5s",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[tokio::test]
async fn ratecheck_probes_an_https_endpoint_trusted_through_ca_file() {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http2).await;
    let ca_file = ca.ca_file();
    let url = format!("{}/v1/chat", upstream.url());
    let mut args = burst(&url);
    args.extend(["--ca-file".to_owned(), ca_file.path.display().to_string()]);
    let report = ratecheck(&args).await;
    assert_eq!(report.summary.success, 3, "{:?}", report.errors);
    assert_eq!(upstream.versions(), vec![http::Version::HTTP_11; 3]);
}

#[tokio::test]
async fn ratecheck_without_the_ca_file_reports_tls_failures() {
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let url = format!("{}/v1/chat", upstream.url());
    let report = ratecheck(&burst(&url)).await;
    assert_eq!(
        report.errors.transport.get("tls"),
        Some(&3),
        "{:?}",
        report.errors
    );
    assert_eq!(upstream.connections(), 0);
}

#[test]
fn ratecheck_refuses_a_ca_file_that_is_not_pem() {
    let not_pem = crate::tls_upstream::TempFile::with(b"hello");
    let mut args = vec!["ratecheck".to_owned()];
    args.extend(burst("https://127.0.0.1:9/"));
    args.extend(["--ca-file".to_owned(), not_pem.path.display().to_string()]);
    let error = Config::from_args(args).expect_err("refused");
    assert!(error.0.contains("--ca-file"), "{error}");
}

#[tokio::test]
async fn an_untrusted_certificate_exits_3_with_a_one_line_reason() {
    use clap::Parser as _;
    let ca = TestCa::new();
    let upstream = TlsUpstream::start(&ca, Alpn::Http1).await;
    let url = format!("{}/v1/chat", upstream.url());
    let out = std::env::temp_dir().join(format!("ratecheck-tls-{}.json", std::process::id()));
    let mut args = vec!["ratecheck".to_owned()];
    args.extend(burst(&url));
    args.extend(["--out".to_owned(), out.display().to_string()]);
    let cli = ratecheck::cli::Cli::try_parse_from(args).expect("valid command line");
    let code = tokio::time::timeout(
        Duration::from_secs(20),
        ratecheck::app::run(cli, false, std::future::pending()),
    )
    .await
    .expect("the run ends within 20 s");
    let _ = std::fs::remove_file(&out);
    assert_eq!(code, ratecheck::app::EXIT_NO_ANSWER);

    // The line it prints says why, for these outcomes.
    let run = probe::run(
        &Config::from_args({
            let mut a = vec!["ratecheck".to_owned()];
            a.extend(burst(&url));
            a
        })
        .expect("valid command line"),
        false,
        std::future::pending(),
    )
    .await
    .expect("the run starts");
    let line = ratecheck::app::no_answer(&run.outcomes);
    assert!(!line.contains('\n'), "{line}");
    assert!(line.contains("3 failed with `tls`"), "{line}");
    assert!(line.contains("--ca-file"), "{line}");
}
