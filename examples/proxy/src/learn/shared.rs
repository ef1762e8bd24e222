//! Learned limits shared by every gateway on one Redis (`[store]`, the
//! `redis` feature): what one gateway learns, the others apply before
//! their own first response on the route.
//!
//! Each change a gateway makes from a response (a limit learned, changed
//! or released) is put on the store's `learned` board
//! ([`RedisStore::put_note`]) under the route's name, for
//! [`LAPSE_AFTER`](super::LAPSE_AFTER); the newest note of a route is the
//! one kept. Every gateway reads the board when it starts, before it
//! serves, and every [`SYNC_EVERY`] after, and applies each note another
//! gateway put since it last looked, as if that response had come to it.
//! A note that does not parse (another version, another program) is
//! ignored. Without a store this is all a no-op.

use std::time::Duration;

#[cfg(feature = "redis")]
pub(super) use with_store::Share;

/// How often a gateway reads what the others learned.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// The learner's link to the other gateways, if it has a store.
#[derive(Default)]
pub(super) struct Sharing {
    #[cfg(feature = "redis")]
    share: std::sync::OnceLock<Share>,
}

impl Sharing {
    /// Tell the other gateways `route` is now held to `limits`.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(super) fn publish(&self, route: &super::Route, limits: super::Limited) {
        #[cfg(feature = "redis")]
        if let Some(share) = self.share.get() {
            share.publish(route, limits);
        }
    }
}

impl super::Learner {
    /// Share what this gateway learns with every gateway on `store`, and
    /// apply what they learned (read [`sync`](Self::sync)); once.
    #[cfg(feature = "redis")]
    pub fn share_through(&self, store: tower_throttle::redis::RedisStore) {
        let _ = self.sharing.share.set(Share::new(store));
    }

    /// Whether the learner shares through a store.
    pub fn shares(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.sharing.share.get().is_some();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Apply what the other gateways on the store learned since the last
    /// call; nothing without a store, or while Redis does not answer (the
    /// next call tries again).
    pub async fn sync(&self) {
        #[cfg(feature = "redis")]
        if let Some(share) = self.sharing.share.get() {
            share.sync(self).await;
        }
    }
}

#[cfg(feature = "redis")]
mod with_store {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Arc;
    use std::time::{Instant, SystemTime};

    use serde::{Deserialize, Serialize};
    use tower_throttle::redact::{Escaped, Quoted};
    use tower_throttle::redis::RedisStore;

    use super::super::{LAPSE_AFTER, Learned, Learner, Limited, Route};

    /// The board the learned limits are put on.
    const BOARD: &str = "learned";

    /// A note: the route, and what it is held to (`[limit, window_ms]`).
    #[derive(Serialize, Deserialize)]
    struct Said {
        /// The gateway that put it: a gateway skips its own.
        origin: u64,
        provider: String,
        model: String,
        requests: Option<(u32, u64)>,
        tokens: Option<(u32, u64)>,
    }

    fn pair(l: Option<Learned>) -> Option<(u32, u64)> {
        l.map(|l| {
            (
                l.limit,
                u64::try_from(l.window.as_millis()).unwrap_or(u64::MAX),
            )
        })
    }

    /// Hostile notes are refused by the same rule a response's limits are:
    /// a zero limit or a window no quota can have is not a limit.
    fn learned(pair: Option<(u32, u64)>) -> Result<Option<Learned>, ()> {
        let Some((limit, window_ms)) = pair else {
            return Ok(None);
        };
        let window = std::time::Duration::from_millis(window_ms);
        tower_throttle::rate_limit::Quota::new(limit, window).map_err(|_| ())?;
        Ok(Some(Learned { limit, window }))
    }

    pub(in super::super) struct Share {
        store: RedisStore,
        origin: u64,
    }

    impl Share {
        pub(super) fn new(store: RedisStore) -> Self {
            // Distinct per process and per start; no secret.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u128(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            Self {
                store,
                origin: h.finish(),
            }
        }

        pub(super) fn publish(&self, route: &Route, limits: Limited) {
            let said = Said {
                origin: self.origin,
                provider: route.provider.to_string(),
                model: route.model.to_string(),
                requests: pair(limits.requests),
                tokens: pair(limits.tokens),
            };
            let (Ok(text), Ok(runtime)) = (
                serde_json::to_string(&said),
                tokio::runtime::Handle::try_current(),
            ) else {
                return;
            };
            let store = self.store.clone();
            let name = route.to_string();
            runtime.spawn(async move {
                if let Err(e) = store.put_note(BOARD, &name, &text, LAPSE_AFTER).await {
                    tracing::debug!(
                        route = %Quoted(&Escaped(&name).to_string()),
                        error = %Escaped(&e.to_string()),
                        "learn_limits: not shared"
                    );
                }
            });
        }

        pub(super) async fn sync(&self, learner: &Learner) {
            let notes = match self.store.notes(BOARD).await {
                Ok(notes) => notes,
                Err(e) => {
                    tracing::debug!(error = %Escaped(&e.to_string()), "learn_limits: shared limits not read");
                    return;
                }
            };
            let at = Instant::now();
            for note in notes {
                let Ok(said) = serde_json::from_str::<Said>(&note.text) else {
                    continue;
                };
                if said.origin == self.origin {
                    continue;
                }
                let (Ok(requests), Ok(tokens)) = (learned(said.requests), learned(said.tokens))
                else {
                    continue;
                };
                let route = Route {
                    provider: Arc::from(said.provider),
                    model: Arc::from(said.model),
                };
                learner.apply_shared(&route, Limited { requests, tokens }, note.put_micros, at);
            }
        }
    }
}
