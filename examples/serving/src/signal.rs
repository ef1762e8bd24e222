//! Stopping on a signal: Ctrl-C (SIGINT) or SIGTERM, the signal systemd,
//! Docker and Kubernetes send, both mean "stop gracefully"; a second one
//! means "quit now" (exit code 130). Shared by the `proxy`, `ratecheck`
//! and `axum_server` examples.
//!
//! The handlers are installed by [`StopSignals::listen`], before anything
//! else starts: a signal that arrives while the program is starting is
//! then a graceful stop too, not the default action (which kills the
//! process).

use std::io;

/// Exit code when a second signal cuts a graceful stop short.
pub const EXIT_INTERRUPTED: i32 = 130;

/// The installed handlers for the signals that stop the program.
#[derive(Debug)]
pub struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Install the handlers. Needs a tokio runtime with its I/O driver.
    pub fn listen() -> io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// The next stop signal's name.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => "Ctrl-C",
                _ = self.terminate.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            "Ctrl-C"
        }
    }

    /// Completes on the first stop signal, after printing `doing` (what the
    /// program does now) to stderr; from then on a second signal exits the
    /// process at once with [`EXIT_INTERRUPTED`].
    pub async fn stopped(mut self, doing: &'static str) {
        let name = self.recv().await;
        eprintln!("{name}: {doing}; Ctrl-C again to quit at once");
        tokio::spawn(async move {
            self.recv().await;
            std::process::exit(EXIT_INTERRUPTED);
        });
    }
}
