//! Running a program in a child process, to send it real signals: the
//! test binary runs itself again with only one (ignored) test selected,
//! which runs the program when [`ROLE`] is set. The child runs the code
//! as it is now, which a prebuilt example binary might not.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Notify;

/// The variable that tells the child what to run.
pub const ROLE: &str = "TOWER_THROTTLE_TEST_CHILD";

/// The role this process was started for, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// The value of the variable `input` when this process is the child started
/// for `role`; `None` otherwise, so that the ignored test that runs the
/// program does nothing when a developer runs the ignored tests by hand.
pub fn input(role: &str, input: &str) -> Option<String> {
    if self::role().as_deref() != Some(role) {
        return None;
    }
    std::env::var(input).ok()
}

/// Runs `program` on a runtime like the one the programs' `main` builds
/// (two workers), then exits the process with its exit code: how a child
/// ends, so that the parent reads the code the program chose.
pub fn run_and_exit<C: Into<i32>>(program: impl Future<Output = C>) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let code = runtime.block_on(program);
    std::process::exit(code.into());
}

/// A running child and what it has written.
pub struct Running {
    pub child: Child,
    stdout: Lines,
    stderr: Lines,
}

/// Lines a child wrote, gathered as they come.
#[derive(Clone, Default)]
struct Lines {
    text: Arc<Mutex<String>>,
    more: Arc<Notify>,
}

impl Lines {
    fn gather(&self, reader: impl tokio::io::AsyncRead + Unpin + Send + 'static) {
        let lines = self.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(reader).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut text = lines.text.lock();
                text.push_str(&line);
                text.push('\n');
                drop(text);
                lines.more.notify_waiters();
            }
            lines.more.notify_waiters();
        });
    }

    /// The first line containing `needle` (bounded: 20 s).
    async fn wait_for(&self, needle: &str) -> String {
        let found = async {
            loop {
                let more = self.more.notified();
                tokio::pin!(more);
                more.as_mut().enable();
                if let Some(line) = self.text.lock().lines().find(|l| l.contains(needle)) {
                    return line.to_owned();
                }
                more.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), found)
            .await
            .unwrap_or_else(|_| panic!("no line with {needle:?} within 20 s:\n{}", self.all()))
    }

    fn all(&self) -> String {
        self.text.lock().clone()
    }
}

/// Start this test binary again running only the ignored test `test`, with
/// [`ROLE`] set to `role` and `env` added.
pub fn spawn(test: &str, role: &str, env: &[(&str, &str)]) -> Running {
    spawn_in(test, role, env, None)
}

/// [`spawn`], with the child's working directory set to `dir` when given.
pub fn spawn_in(
    test: &str,
    role: &str,
    env: &[(&str, &str)],
    dir: Option<&std::path::Path>,
) -> Running {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    command
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the test binary runs again");
    let (stdout, stderr) = (Lines::default(), Lines::default());
    stdout.gather(child.stdout.take().expect("piped stdout"));
    stderr.gather(child.stderr.take().expect("piped stderr"));
    Running {
        child,
        stdout,
        stderr,
    }
}

impl Running {
    /// The first stdout line containing `needle` (bounded: 20 s).
    pub async fn stdout_line(&self, needle: &str) -> String {
        self.stdout.wait_for(needle).await
    }

    /// The first stderr line containing `needle` (bounded: 20 s).
    pub async fn stderr_line(&self, needle: &str) -> String {
        self.stderr.wait_for(needle).await
    }

    /// Everything written to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.all()
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.all()
    }

    /// Send `signal` (e.g. `nix::sys::signal::Signal::SIGTERM`).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id().expect("the child is running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid fits i32"));
        nix::sys::signal::kill(pid, signal).expect("the signal is sent");
    }

    /// The exit code, waiting at most `bound`; `None` when a signal ended
    /// it. Panics with its stderr when it is still running then.
    pub async fn exit_code(&mut self, bound: Duration) -> Option<i32> {
        match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(status) => status.expect("the child is waited for").code(),
            Err(_) => panic!(
                "the child still runs after {bound:?}; its stderr:\n{}",
                self.stderr()
            ),
        }
    }
}
