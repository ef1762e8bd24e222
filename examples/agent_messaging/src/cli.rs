//! The command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tower_throttle::rate_limit::MAX_PERIOD;

use crate::auth::Secret;
use crate::flow::Settings;
use crate::projects::Directory;
use tower_throttle::redact::Escaped;

/// Flow control between AI agents: at most one message per (sender,
/// receiver) pair per interval, at most N per sender per turn, and never
/// across projects. Without --projects it serves an embedded demo: alice,
/// bob and carol in project `demo`, mallory in project `other`.
#[derive(Debug, Parser)]
#[command(name = "agent_messaging")]
pub struct Cli {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,

    /// The projects and their nodes, as JSON:
    /// {"projects":[{"id":"p1","nodes":[{"id":"a"},{"id":"b","inbox_capacity":10}]}]}
    /// [default: an embedded demo].
    #[arg(long, value_name = "FILE")]
    pub projects: Option<PathBuf>,

    /// At most one delivered message per (sender, receiver) pair this often
    /// (10s, 1m, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = period)]
    pub pair_interval: Duration,

    /// At most this many delivered messages per sender per turn.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub fan_out: u32,

    /// The environment variable holding the operator's key, which `POST
    /// /reset` and `GET /stats` then need (`Authorization: Bearer KEY`).
    /// Where nodes have keys and this is not set, those two are off.
    #[arg(long, value_name = "NAME")]
    pub admin_key_env: Option<String>,

    /// A turn whose sender never starts a new one ends by itself this long
    /// after it started.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = period)]
    pub turn_stale: Duration,
}

impl Cli {
    /// `directory` with the operator's key (from `--admin-key-env`, looked
    /// up in `env`), once the rule holds that a service whose nodes have no
    /// keys (anyone can act as any node) listens on a loopback address only.
    pub fn access(
        &self,
        mut directory: Directory,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Directory, String> {
        if let Some(name) = &self.admin_key_env {
            let shown = Escaped(name);
            let value = env(name).ok_or_else(|| format!("--admin-key-env: ${shown} is not set"))?;
            let key = Secret::new(&value, &format!("--admin-key-env: ${shown}"))?;
            directory.access.set_operator(key)?;
        }
        if !directory.access.has_node_keys() && !self.listen.ip().is_loopback() {
            return Err(format!(
                "the projects file gives the nodes no keys, so any client could act as any \
                 node; without keys it listens only on a loopback address, not {} (give each \
                 node key_env or key_file)",
                self.listen
            ));
        }
        Ok(directory)
    }

    /// The flow-control settings the command line gives.
    pub fn settings(&self) -> Settings {
        Settings {
            pair_interval: self.pair_interval,
            fan_out: self.fan_out,
            turn_stale: self.turn_stale,
        }
    }
}

/// A duration as humans write it (`10s`, `5m`, `1h 30m`), longer than zero
/// and no longer than a quota's longest period.
pub fn period(text: &str) -> Result<Duration, String> {
    let d = tower_throttle::config::parse_duration("", text).map_err(|e| e.message)?;
    if d.is_zero() {
        return Err("must be longer than zero".to_owned());
    }
    if d > MAX_PERIOD {
        return Err(format!(
            "must be at most {} days",
            MAX_PERIOD.as_secs() / 86_400
        ));
    }
    Ok(d)
}
