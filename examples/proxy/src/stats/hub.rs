//! The hub behind `/events`: a snapshot built when the counters move, a
//! burst at a time, and published to every client.

use std::sync::Arc;
use std::time::Duration;

use super::snapshot::{snapshot, to_json};
use crate::gateway::Gateway;

/// How long the hub gathers a burst of changes into one event.
pub const COALESCE: Duration = Duration::from_millis(50);

/// While a route cools down, how often its remaining time is republished
/// (a cooldown running out is a change nobody is told of).
const COOLDOWN_TICK: Duration = Duration::from_secs(1);

/// One snapshot as published to `/events`.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// Rises with every publication; the events' `id`.
    pub seq: u64,
    /// The snapshot's JSON.
    pub json: Arc<str>,
}

/// Publish a snapshot to `/events` clients if it differs from the last one
/// published (a cooldown's remaining time counts as a difference).
pub fn publish(gateway: &Gateway) {
    if gateway.hub().receiver_count() == 0 {
        return;
    }
    let mut last = gateway.last_published().lock();
    let seq = last.0 + 1;
    let json = to_json(&snapshot(gateway, seq));
    // The sequence number differs every time; compare without it.
    let body = json.split_once(',').map_or("", |(_, rest)| rest);
    if body == last.1 {
        return;
    }
    *last = (seq, body.to_owned());
    gateway.hub().send_replace(Published {
        seq,
        json: Arc::from(json),
    });
}

/// Publish a snapshot whenever the counters move, a burst at a time.
pub async fn run_hub(gateway: Gateway) {
    let handles = gateway.handles().clone();
    let mut rate = handles.rate.subscribe();
    let mut concurrency = handles.concurrency.subscribe();
    let mut backoff = handles.backoff.subscribe();
    let mut upstream_seen = 0;
    let mut config_seen = 0;
    let mut shutdown = gateway.shutdown_signal();
    loop {
        let cooling = !handles.backoff.cooldowns().is_empty();
        let tick = async {
            if cooling {
                tokio::time::sleep(COOLDOWN_TICK).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = rate.changed() => {}
            _ = concurrency.changed() => {}
            _ = backoff.changed() => {}
            _ = gateway.counters().changed.wait(&mut upstream_seen) => {}
            _ = gateway.config_changed().wait(&mut config_seen) => {}
            _ = tick => {}
        }
        tokio::time::sleep(COALESCE).await;
        publish(&gateway);
    }
}
