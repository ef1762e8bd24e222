//! A `redis-server` of the test's own, on a free port of 127.0.0.1, with
//! persistence off, stopped when dropped.
//!
//! Without the `redis-server` binary a test prints a notice and passes,
//! except under `CI=true`, where it fails: CI installs it (`.ci/run`).

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

    /// Start the server on its port, or, when `may_move`, on another one
    /// if that port was taken meanwhile: a port found free can be bound by
    /// another test before the server binds it, and the server then exits.
    fn launch_on(&mut self, may_move: bool) {
        for _ in 0..5 {
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
            if self.wait_ready() {
                return;
            }
            assert!(may_move, "redis-server did not start again on its port");
            self.port = free_port();
            // A cluster node's bus port is a free port of its own too.
            if let Some(i) = self.extra.iter().position(|a| a == "--cluster-port") {
                self.extra[i + 1] = free_port().to_string();
            }
        }
        panic!("redis-server did not come up on any of 5 ports");
    }

    fn launch(&mut self) {
        self.launch_on(true);
    }

    /// Wait until the server answers PING (true), or has exited (false);
    /// a hang guard of 30 s, for a loaded machine.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ping() {
                return true;
            }
            if let Some(child) = &mut self.child {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
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

    /// `field` (`calls`, `usec_per_call`, ...) of command `name`
    /// (`evalsha`) in `INFO commandstats`: since the server started, or
    /// since the last `CONFIG RESETSTAT`. Zero before the first call.
    pub fn command_stat(conn: &mut redis::Connection, name: &str, field: &str) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .expect("INFO commandstats");
        let line = format!("cmdstat_{name}:");
        let field = format!("{field}=");
        info.lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix(field.as_str())))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// `CONFIG SET name value`.
    pub fn config_set(conn: &mut redis::Connection, name: &str, value: impl ToString) {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value.to_string())
            .query::<()>(conn)
            .expect("CONFIG SET");
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
        self.launch_on(false);
    }
}

/// A runtime for a synchronous test (a property's case) that drives the
/// layers, on the test's own thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(file) = self.nodes_file() {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl RedisServer {
    /// The cluster configuration file a cluster node writes, if it is one.
    fn nodes_file(&self) -> Option<std::path::PathBuf> {
        let i = self
            .extra
            .iter()
            .position(|a| a == "--cluster-config-file")?;
        Some(std::env::temp_dir().join(self.extra.get(i + 1)?))
    }
}

/// A Redis Cluster of `redis-server`s of the test's own, one master each,
/// no replicas, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start `masters` nodes and make a cluster of them; `None` (with a
    /// notice) when `redis-server` or `redis-cli` is missing outside CI.
    pub fn start(test: &str, masters: usize) -> Option<Self> {
        if !required("redis-server", test) || !required("redis-cli", test) {
            return None;
        }
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                let port = free_port();
                let mut node = RedisServer {
                    child: None,
                    port,
                    extra: [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("tower-throttle-nodes-{}-{port}.conf", std::process::id()),
                        "--cluster-node-timeout",
                        "5000",
                        // By default the bus is the port + 10000, which
                        // fails for the ephemeral ports above 55535.
                        "--cluster-port",
                        &free_port().to_string(),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                };
                node.launch();
                node
            })
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Self { nodes };
        cluster.wait_ok();
        Some(cluster)
    }

    /// Block until every node says the cluster is ok (a hang guard of 20 s).
    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &self.nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster never became ok");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
