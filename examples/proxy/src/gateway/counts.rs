//! What upstreams answered, per route and in all, and the wake-up the stats
//! hub waits on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::http::StatusCode;
use foldhash::HashMap;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Notify;

use super::Route;
use crate::stats::{OTHER, TrackedRoutes};

/// What upstreams answered, per route and in all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamCounts {
    /// Responses received (any status).
    pub responses: u64,
    /// 2xx and 3xx.
    pub ok: u64,
    /// 429.
    pub rate_limited: u64,
    /// Other 4xx.
    pub client_errors: u64,
    /// 5xx.
    pub server_errors: u64,
    /// No response: unreachable, reset, or too slow.
    pub failed: u64,
    /// The tokens of the answers' requests, where a quota counts tokens.
    pub tokens: TokenCounts,
}

/// Tokens of token quotas: what requests were charged at admission (their
/// estimates), and what their answers settled it to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TokenCounts {
    /// Tokens charged at admission: the requests' estimates.
    pub charged: u64,
    /// Tokens the answers reported used (those that reported usage).
    pub used: u64,
    /// Estimates above the usage, handed back to the limiter (a token
    /// bucket takes back only what it has not refilled since).
    pub given_back: u64,
    /// Usage above the estimate, charged after the answer.
    pub charged_after: u64,
    /// Answers that reported no usage, or ended early: their estimate
    /// stands.
    pub kept: u64,
}

impl TokenCounts {
    fn add(&mut self, charged: u32, used: Option<u32>) {
        self.charged += u64::from(charged);
        match used {
            Some(used) => {
                self.used += u64::from(used);
                self.given_back += u64::from(charged.saturating_sub(used));
                self.charged_after += u64::from(used.saturating_sub(charged));
            }
            None => self.kept += 1,
        }
    }
}

impl UpstreamCounts {
    fn add(&mut self, status: Option<StatusCode>) {
        let Some(status) = status else {
            self.failed += 1;
            return;
        };
        self.responses += 1;
        match status.as_u16() {
            429 => self.rate_limited += 1,
            400..=499 => self.client_errors += 1,
            500..=599 => self.server_errors += 1,
            _ => self.ok += 1,
        }
    }
}

/// Wakes the stats hub when something not counted by the layers moves; a
/// burst of changes wakes it once (the first change after it looked).
#[derive(Debug, Default)]
pub struct Changed {
    dirty: AtomicBool,
    epoch: AtomicU64,
    notify: Notify,
}

impl Changed {
    /// Something moved.
    pub fn touch(&self) {
        // In a burst the flag is already set: one load, nothing else.
        if !self.dirty.load(Ordering::Relaxed) && !self.dirty.swap(true, Ordering::AcqRel) {
            self.epoch.fetch_add(1, Ordering::Release);
            self.notify.notify_waiters();
        }
    }

    /// Wait until something moved since `seen`.
    pub async fn wait(&self, seen: &mut u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch != *seen {
                *seen = epoch;
                self.dirty.store(false, Ordering::Release);
                return;
            }
            notified.await;
        }
    }
}

/// Upstream answers by route: the [tracked](TrackedRoutes) ones by name,
/// the rest added up as [`OTHER`].
#[derive(Debug)]
pub struct UpstreamCounters {
    tracked: Arc<TrackedRoutes>,
    table: Mutex<(UpstreamCounts, HashMap<String, UpstreamCounts>)>,
    /// Touched on every answer.
    pub changed: Changed,
}

impl UpstreamCounters {
    pub(super) fn new(tracked: Arc<TrackedRoutes>) -> Self {
        Self {
            tracked,
            table: Mutex::new(Default::default()),
            changed: Changed::default(),
        }
    }

    /// The name `route` is counted under: its own, or [`OTHER`].
    fn name(&self, route: &Route) -> String {
        let name = route.to_string();
        if self.tracked.contains(&name) {
            name
        } else {
            OTHER.to_owned()
        }
    }

    pub(super) fn record(&self, route: Option<&Route>, status: Option<StatusCode>) {
        let name = route.map(|route| {
            let name = route.to_string();
            // A route the upstream serves is real: counted by name from now.
            if status.is_some_and(|s| s.is_success()) {
                self.tracked.answered(&name);
            }
            if self.tracked.contains(&name) {
                name
            } else {
                OTHER.to_owned()
            }
        });
        {
            let mut table = self.table.lock();
            table.0.add(status);
            if let Some(name) = name {
                table.1.entry(name).or_default().add(status);
            }
        }
        self.changed.touch();
    }

    /// An answer on `route` whose request was charged `charged` tokens
    /// settled it to `used` (`None`: it reported none; the charge stands).
    pub fn settled(&self, route: &Route, charged: u32, used: Option<u32>) {
        let name = self.name(route);
        {
            let mut table = self.table.lock();
            table.0.tokens.add(charged, used);
            table.1.entry(name).or_default().tokens.add(charged, used);
        }
        self.changed.touch();
    }

    /// Zero every count.
    pub fn reset(&self) {
        *self.table.lock() = Default::default();
        self.changed.touch();
    }

    /// The totals and the routes (`provider/model`), sorted.
    pub fn snapshot(&self) -> (UpstreamCounts, Vec<(String, UpstreamCounts)>) {
        let table = self.table.lock();
        let mut routes: Vec<_> = table
            .1
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        routes.sort_by(|a, b| a.0.cmp(&b.0));
        (table.0.clone(), routes)
    }
}
