//! Hot reload: watch the config file and apply each edit through the
//! gateway (the stateful layers' handles, see `live`, and a swap of the
//! client stack around the same stateful layers).
//!
//! The file is polled: its contents are read once a second and compared
//! with the last seen. Polling needs no dependency and no platform
//! notification API, and it sees every way a file can change: editors that
//! write a new file and rename it over the old one (which silently breaks an
//! inotify watch on the old inode), bind mounts and network file systems
//! that send no events, and edits within one mtime tick (comparing the
//! contents, not the mtime). Reading a small file once a second costs
//! nothing; a second of delay is nothing for a config edit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tower_throttle::redact::Escaped;

use crate::config::Settings;
use crate::gateway::Gateway;

/// How often the file is read.
pub const POLL: Duration = Duration::from_secs(1);

/// Environment lookup shared with the watcher task.
pub type SharedEnv = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Watch `path` every `every`, starting from `loaded` (the contents the
/// running configuration came from), until the gateway shuts down.
pub fn spawn(
    path: PathBuf,
    loaded: Vec<u8>,
    every: Duration,
    gateway: Gateway,
    env: SharedEnv,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = loaded;
        let mut unreadable = false;
        let mut shutdown = gateway.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            let bytes = match tokio::fs::read(&path).await {
                Ok(bytes) => {
                    unreadable = false;
                    bytes
                }
                Err(e) => {
                    if !unreadable {
                        tracing::warn!(
                            "config reload: cannot read {}: {e}; the running configuration stays in force",
                            path.display()
                        );
                        unreadable = true;
                    }
                    continue;
                }
            };
            if bytes == last {
                continue;
            }
            last = bytes;
            apply(&gateway, &path, &last, &*env);
        }
    })
}

/// Check `bytes` and apply them, logging what happened: one line on
/// refusal, naming the field.
pub fn apply(
    gateway: &Gateway,
    path: &Path,
    bytes: &[u8],
    env: &dyn Fn(&str) -> Option<String>,
) -> bool {
    let result = std::str::from_utf8(bytes)
        .map_err(|_| "the file is not UTF-8".to_owned())
        .and_then(|text| {
            Settings::from_toml(text, env)
                .and_then(|settings| gateway.apply(settings))
                .map_err(|e| e.to_string())
        });
    match result {
        Ok(applied) => {
            tracing::info!(
                generation = applied.generation,
                "config reloaded from {}",
                path.display()
            );
            for field in applied.restart_only {
                tracing::warn!("config reload: `{field}` changed; it takes effect on restart");
            }
            true
        }
        Err(e) => {
            // The file's text can be anything: no raw control character
            // reaches the log.
            let e = Escaped(&e);
            tracing::error!("config reload refused: {e}; the running configuration stays in force");
            false
        }
    }
}
