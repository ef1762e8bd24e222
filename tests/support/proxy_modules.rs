//! The `proxy` example's modules, compiled into a test crate that drives
//! the gateway directly: `proxy_modules!();` at the test crate's root. One
//! list, so a module added to the example is added to every proxy test.

macro_rules! proxy_modules {
    () => {
        #[allow(dead_code)]
        #[path = "../examples/proxy/app.rs"]
        mod app;
        #[allow(dead_code)]
        #[path = "../examples/proxy/bench.rs"]
        mod bench;
        #[allow(dead_code)]
        #[path = "../examples/proxy/bench_tls.rs"]
        mod bench_tls;
        #[allow(dead_code)]
        #[path = "../examples/proxy/cli.rs"]
        mod cli;
        #[allow(dead_code)]
        #[path = "../examples/proxy/config.rs"]
        mod config;
        #[allow(dead_code)]
        #[path = "../examples/proxy/demo.rs"]
        mod demo;
        #[allow(dead_code)]
        #[path = "../examples/proxy/edge.rs"]
        mod edge;
        #[allow(dead_code)]
        #[path = "../examples/proxy/gateway.rs"]
        mod gateway;
        #[allow(dead_code)]
        #[path = "../examples/proxy/learn.rs"]
        mod learn;
        #[allow(dead_code)]
        #[path = "../examples/proxy/live.rs"]
        mod live;
        #[allow(dead_code)]
        #[path = "../examples/proxy/operator.rs"]
        mod operator;
        #[allow(dead_code)]
        #[path = "../examples/proxy/preset.rs"]
        mod preset;
        #[allow(dead_code)]
        #[path = "../examples/proxy/reload.rs"]
        mod reload;
        #[allow(dead_code)]
        #[path = "../examples/proxy/serve.rs"]
        mod serve;
        #[allow(dead_code)]
        #[path = "../examples/proxy/signal.rs"]
        mod signal;
        #[allow(dead_code)]
        #[path = "../examples/proxy/simulator.rs"]
        mod simulator;
        #[allow(dead_code)]
        #[path = "../examples/proxy/stats.rs"]
        mod stats;
        #[allow(dead_code)]
        #[path = "../examples/proxy/tls.rs"]
        mod tls;
        #[allow(dead_code)]
        #[path = "../examples/proxy/usage.rs"]
        mod usage;

        /// The proxy as `main` runs it, with the arguments in `PROXY_ARGS`
        /// (split on spaces): what a test's child process runs. Exits with
        /// the proxy's exit code.
        #[allow(dead_code)]
        fn run_proxy_main_from_env() -> ! {
            use clap::Parser as _;
            let args = std::env::var("PROXY_ARGS").unwrap_or_default();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let code = runtime.block_on(async {
                app::init_logs(Some("info")).unwrap();
                let signals = signal::StopSignals::listen().unwrap();
                let cli = cli::Cli::try_parse_from(
                    std::iter::once("proxy").chain(args.split(' ').filter(|a| !a.is_empty())),
                )
                .unwrap();
                app::run(cli, signals.stopped("shutting down"), None).await
            });
            std::process::exit(i32::from(code));
        }
    };
}
