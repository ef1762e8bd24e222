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
//! nothing; a second of delay is nothing for a config edit. A change is
//! applied once two reads agree (see [`Settling`]), never half-written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tower_throttle::redact::Escaped;

use crate::config::Settings;
use crate::gateway::Gateway;

/// Environment lookup shared with the watcher task.
pub type SharedEnv = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// How often the file is read, and how long a change must stay put.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Between reads of an unchanged file.
    pub every: Duration,
    /// A changed file is read again this much later, and applied only if
    /// it reads the same.
    pub settle: Duration,
}

impl Timing {
    /// Once a second; a change applies once it stayed put for 200 ms.
    pub const DEFAULT: Self = Self {
        every: Duration::from_secs(1),
        settle: Duration::from_millis(200),
    };
}

/// What to do with the file's contents just read.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Unchanged: read again after `every`.
    Nothing,
    /// Changed, and not yet seen twice: read again after `settle`.
    Recheck,
    /// Changed, and the same on two reads: apply these contents.
    Apply(Vec<u8>),
}

/// Applies a changed file only once it reads the same twice in a row: an
/// editor that writes in place can leave a valid prefix of the file (every
/// section before `[rate_limit]`, say) for a moment, and applying that
/// would turn limits off.
#[derive(Debug)]
pub struct Settling {
    applied: Vec<u8>,
    seen: Option<Vec<u8>>,
}

impl Settling {
    /// Starting from `applied`, the contents the running configuration
    /// came from.
    pub fn new(applied: Vec<u8>) -> Self {
        Self {
            applied,
            seen: None,
        }
    }

    /// The file read `bytes`.
    pub fn read(&mut self, bytes: Vec<u8>) -> Step {
        if bytes == self.applied {
            self.seen = None;
            Step::Nothing
        } else if self.seen.as_ref() == Some(&bytes) {
            self.seen = None;
            self.applied = bytes.clone();
            Step::Apply(bytes)
        } else {
            self.seen = Some(bytes);
            Step::Recheck
        }
    }
}

/// Watch `path` with `timing`, starting from `loaded` (the contents the
/// running configuration came from), until the gateway shuts down.
pub fn spawn(
    path: PathBuf,
    loaded: Vec<u8>,
    timing: Timing,
    gateway: Gateway,
    env: SharedEnv,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut settling = Settling::new(loaded);
        let mut wait = timing.every;
        let mut unreadable = false;
        let mut shutdown = gateway.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            wait = timing.every;
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
            match settling.read(bytes) {
                Step::Nothing => {}
                Step::Recheck => wait = timing.settle,
                Step::Apply(bytes) => {
                    apply(&gateway, &path, &bytes, &*env);
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_applies_only_once_two_reads_agree() {
        let mut settling = Settling::new(b"full".to_vec());
        assert_eq!(settling.read(b"full".to_vec()), Step::Nothing);
        // Half-written, then whole again before the second read: the
        // prefix is never applied, and the whole file is what ran.
        assert_eq!(settling.read(b"fu".to_vec()), Step::Recheck);
        assert_eq!(settling.read(b"full".to_vec()), Step::Nothing);
        // A real edit, written in two steps: applied once it stays put.
        assert_eq!(settling.read(b"ne".to_vec()), Step::Recheck);
        assert_eq!(settling.read(b"new".to_vec()), Step::Recheck);
        assert_eq!(settling.read(b"new".to_vec()), Step::Apply(b"new".to_vec()));
        assert_eq!(settling.read(b"new".to_vec()), Step::Nothing);
    }
}
