//! The backoff layer's calls to Redis: a route's shared cooldown and
//! streak, read before each request and updated by each response that
//! starts a cooldown or ends a streak.

use std::sync::LazyLock;
use std::time::Duration;

use ::redis::Script;

use super::ExponentialBackoff;
use super::cooldown::Said;
use crate::redis::{RedisStore, StoreError};

static COOLDOWN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("cooldown.lua")));

/// The most exponential delays sent with a 429: the streak at which any
/// backoff has long reached its cap.
const MAX_DELAYS: u32 = 64;

/// A route's shared cooldown and streak, as Redis last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedCooldown {
    /// Until the cooldown ends, from when Redis answered (zero: none).
    pub(crate) cooling: Duration,
    /// Consecutive 429s without a success between, across replicas.
    pub(crate) streak: u32,
    /// Which cooldown start this is: a response to a request sent under an
    /// earlier one says nothing new about the streak.
    pub(crate) generation: u64,
}

/// The Redis key of the route with `parts`.
pub(crate) fn route_key(store: &RedisStore, parts: &[String]) -> String {
    let mut name = store.names.base(&store.prefix, parts);
    name.push_str(":cd");
    name
}

/// The longest wait sent to the script, in microseconds: 2^53 (285
/// years), which Lua's doubles hold exactly and which, added to now, still
/// fits the 64-bit integers Redis replies with (past them a cooldown came
/// back as none at all).
const MAX_MICROS: u64 = 1 << 53;

fn micros(d: Duration) -> String {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_MICROS)
        .to_string()
}

fn parse(reply: &[i64]) -> Result<SharedCooldown, StoreError> {
    let [now, until, streak, generation] = reply else {
        return Err(StoreError::Reply);
    };
    let cooling = u64::try_from(until.saturating_sub(*now)).unwrap_or(0);
    Ok(SharedCooldown {
        cooling: Duration::from_micros(cooling),
        streak: u32::try_from(*streak).unwrap_or(u32::MAX),
        generation: u64::try_from(*generation).unwrap_or(0),
    })
}

/// Read the route's shared state.
pub(crate) async fn read(store: &RedisStore, key: &str) -> Result<SharedCooldown, StoreError> {
    let keys = [key.to_owned()];
    let args = [
        "read".to_owned(),
        String::new(),
        String::new(),
        String::new(),
        store.now_arg(),
    ];
    let reply: Vec<i64> = store.run("backoff", &COOLDOWN, &keys, &args).await?;
    parse(&reply).inspect_err(|_| store.bad_reply("backoff"))
}

/// Fold what a response to a request sent under `generation` said into
/// the route's shared state: the longer of the cooldown in force and the
/// new one wins; a 429 adds to the streak, a success ends it.
pub(crate) async fn report(
    store: &RedisStore,
    key: &str,
    generation: u64,
    said: Said,
    backoff: &ExponentialBackoff,
    max_cooldown: Duration,
) -> Result<SharedCooldown, StoreError> {
    let (mode, advised) = match said {
        Said::Refused(advised) => ("429", advised),
        Said::Unavailable(advised) => ("503", Some(advised)),
        Said::Succeeded(advised) => ("ok", advised),
    };
    let forget_after = backoff.cap().min(max_cooldown);
    let mut args = vec![
        mode.to_owned(),
        generation.to_string(),
        advised.map(micros).unwrap_or_default(),
        micros(forget_after),
        store.now_arg(),
    ];
    if matches!(said, Said::Refused(None)) {
        // The delay for each streak, jitter drawn here: the script picks
        // the shared streak's.
        for streak in 1..=MAX_DELAYS {
            let delay = backoff.delay(streak).min(max_cooldown);
            args.push(micros(delay));
            if backoff.base(streak) >= backoff.cap() {
                break;
            }
        }
    }
    let keys = [key.to_owned()];
    let reply: Vec<i64> = store.run("backoff", &COOLDOWN, &keys, &args).await?;
    parse(&reply).inspect_err(|_| store.bad_reply("backoff"))
}
