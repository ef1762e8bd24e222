//! Which routes are counted by name: [`TrackedRoutes`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use foldhash::{HashMap, HashSet};
use parking_lot::RwLock;

use crate::config::{Settings, Upstream};
use crate::gateway::Route;

/// The routes counted by name: those the configuration names (a rate-limit
/// rule for one provider and one model, a simulator model), always, and
/// those the upstream answered with a 2xx, in the room the configured ones
/// leave of `max_routes - 1` (the last entry being [`OTHER`]). An answered
/// name keeps its place while it is answered; one not answered for
/// `route_idle` gives it to the next new name, so made-up names an upstream
/// happens to answer cannot crowd out a real model for good. A configured
/// route added by a reload makes room by dropping answered ones.
///
/// [`OTHER`]: super::OTHER
#[derive(Debug)]
pub struct TrackedRoutes {
    room: usize,
    idle: Duration,
    /// What `seen` instants count from.
    origin: tokio::time::Instant,
    names: RwLock<Names>,
    /// When a full table was last searched for an idle name (seconds from
    /// `origin`): at most once a second, so a flood of new names costs a
    /// search a second, not one each.
    searched: AtomicU64,
}

#[derive(Debug, Default)]
struct Names {
    configured: HashSet<String>,
    /// Each with when it was last answered, in seconds from `origin`.
    answered: HashMap<String, AtomicU64>,
}

impl TrackedRoutes {
    /// Room for `max_routes` entries in all, [`OTHER`] included; an
    /// answered name idle for `idle` can be replaced.
    ///
    /// [`OTHER`]: super::OTHER
    pub fn new(max_routes: usize, idle: Duration) -> Self {
        Self {
            room: max_routes.saturating_sub(1),
            idle,
            origin: tokio::time::Instant::now(),
            names: RwLock::new(Names::default()),
            searched: AtomicU64::new(u64::MAX),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_secs()
    }

    /// How many routes the layers count by name: the room, and as many
    /// again for names dropped by a reload, whose counts stay behind.
    pub fn room(&self) -> usize {
        self.room.saturating_mul(2)
    }

    /// Whether the route shown as `name` is counted by name.
    pub fn contains(&self, name: &str) -> bool {
        let names = self.names.read();
        names.configured.contains(name) || names.answered.contains_key(name)
    }

    /// Track `name`, which the configuration names.
    fn add_named(&self, name: String) {
        let mut names = self.names.write();
        names.answered.remove(&name);
        names.configured.insert(name);
        while names.configured.len() + names.answered.len() > self.room {
            let Some(dropped) = names.answered.keys().next().cloned() else {
                break;
            };
            names.answered.remove(&dropped);
        }
    }

    /// Track the routes `settings` names.
    pub fn add_configured(&self, settings: &Settings) {
        let rules = settings.file.stack.rate_limit.iter().flat_map(|r| &r.rules);
        for rule in rules {
            if let (Some(provider), Some(model)) = (&rule.provider, &rule.model) {
                if !provider.contains(['*', '?']) && !model.contains(['*', '?']) {
                    self.add_named(route_name(provider, model));
                }
            }
        }
        // An alias leads to a model the configuration names.
        for provider in &settings.providers {
            for model in provider.aliases.targets() {
                self.add_named(route_name(&provider.name, model));
            }
        }
        let simulated = settings
            .providers
            .iter()
            .filter(|p| p.upstream == Upstream::Simulator);
        for provider in simulated {
            for model in settings.simulator.iter().flat_map(|s| &s.models) {
                self.add_named(route_name(&provider.name, &model.name));
            }
        }
    }

    /// The upstream answered the route named `name` with a 2xx: it is real. Tracked if
    /// the configured routes leave room, or an answered name idle for
    /// `route_idle` gives its place.
    pub fn answered(&self, name: &str) {
        let now = self.now();
        {
            let names = self.names.read();
            if names.configured.contains(name) {
                return;
            }
            if let Some(seen) = names.answered.get(name) {
                seen.store(now, Ordering::Relaxed);
                return;
            }
        }
        let mut names = self.names.write();
        if names.configured.len() + names.answered.len() >= self.room {
            if self.searched.swap(now, Ordering::Relaxed) == now {
                return;
            }
            let idle = self.idle.as_secs();
            let oldest = names
                .answered
                .iter()
                .map(|(name, seen)| (seen.load(Ordering::Relaxed), name))
                .min();
            match oldest {
                Some((seen, oldest)) if now.saturating_sub(seen) >= idle => {
                    let oldest = oldest.clone();
                    names.answered.remove(&oldest);
                }
                _ => return,
            }
        }
        names
            .answered
            .entry(name.to_owned())
            .or_insert_with(|| AtomicU64::new(now));
    }
}

/// A route's name as the layers show it (see [`Route`]'s `Display`).
fn route_name(provider: &str, model: &str) -> String {
    Route {
        provider: provider.into(),
        model: model.into(),
    }
    .to_string()
}
