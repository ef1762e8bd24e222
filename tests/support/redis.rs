//! A `redis-server` of the test's own, on a free port of 127.0.0.1, with
//! persistence off, stopped when dropped.
//!
//! Without the `redis-server` binary a test prints a notice and passes,
//! except under `CI=true`, where it fails: CI installs it (`.ci/run`).
//!
//! Include with `#[path = "support/redis.rs"] mod redis_server;`.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    extra: Vec<String>,
}

/// Whether `program` can be run.
fn has(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `None` (with a notice) when `program` is missing outside CI; a failure
/// in CI.
pub fn required(program: &str, test: &str) -> bool {
    if has(program) {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{program} is missing; CI must install it (see .ci/run)"
    );
    eprintln!("notice: {program} not found; {test} skipped (it runs in CI)");
    false
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl RedisServer {
    /// Start a server, or `None` when `redis-server` is missing outside CI.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_with(test, &[])
    }

    /// Start a server with `extra` arguments.
    pub fn start_with(test: &str, extra: &[&str]) -> Option<Self> {
        if !required("redis-server", test) {
            return None;
        }
        let mut server = Self {
            child: None,
            port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        Some(server)
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Block until the server answers PING (a hang guard of 10 s).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.ping() {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain connection, to look at or change what the layers keep.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connects to the test's redis-server")
    }

    /// Kill the server (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
