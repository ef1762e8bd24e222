//! The `agent_messaging` example's modules, compiled into a test crate that
//! drives the service directly: `agent_messaging_modules!();` at the test
//! crate's root. One list, so a module added to the example is added to
//! its tests.

macro_rules! agent_messaging_modules {
    () => {
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/app.rs"]
        mod app;
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/cli.rs"]
        mod cli;
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/flow.rs"]
        mod flow;
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/inbox.rs"]
        mod inbox;
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/projects.rs"]
        mod projects;
        #[allow(dead_code)]
        #[path = "../examples/proxy/serve.rs"]
        mod serve;
        #[allow(dead_code)]
        #[path = "../examples/agent_messaging/stats.rs"]
        mod stats;
    };
}
