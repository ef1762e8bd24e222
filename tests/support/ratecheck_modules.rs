//! The `ratecheck` example's modules, compiled into a test crate that calls
//! its run function directly: `ratecheck_modules!();` at the test crate's
//! root. One list, so a module added to the example is added to every
//! ratecheck test.

macro_rules! ratecheck_modules {
    () => {
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/cli.rs"]
        mod cli;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/inference.rs"]
        mod inference;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/models.rs"]
        mod models;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/probe.rs"]
        mod probe;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/report.rs"]
        mod report;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/schedule.rs"]
        mod schedule;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/timeline.rs"]
        mod timeline;
        #[allow(dead_code)]
        #[path = "../examples/ratecheck/tls.rs"]
        mod tls;
    };
}
