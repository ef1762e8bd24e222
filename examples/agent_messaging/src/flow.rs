//! The flow control, built from the crate's layers: two `RateLimitLayer`s
//! judged as one by a `JointRateLimitLayer`, with the turn budget's handle
//! for `POST /nodes/{id}/turn` and both handles for `POST /reset` and the
//! stats.
//!
//! - `fan_out`: a turn budget keyed by the sender, at most `fan_out`
//!   delivered messages per turn; the turn ends on the sender's own
//!   `new_turn`, or by itself `turn_stale` after it started. Its refusals
//!   say to retry in no less than the pair interval (a turn can end at any
//!   moment, so the real wait is unknown; never 0).
//! - `pair`: one delivered message per `(sender, receiver)` every
//!   `pair_interval`, a token bucket of one keyed by the two ids as two
//!   parts (hashed with their lengths: `("ab","c")` is not `("a","bc")`).
//!
//! Fan-out is judged first, so its refusal is the one reported when both
//! refuse. Only a delivered message counts: a refusal takes nothing, and
//! a message answered busy gives back what it took from both.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tower::Layer;
use tower_throttle::clock::ManualClock;
use tower_throttle::error::ConfigError;
use tower_throttle::rate_limit::{
    JointRateLimit, JointRateLimitLayer, Quota, RateLimitHandle, RateLimitLayer,
};

use crate::inbox::{Deliver, Delivery, Message};

/// The name of the per-turn limit, as `429` bodies give it.
pub const FAN_OUT: &str = "fan_out";

/// The name of the per-pair limit, as `429` bodies give it.
pub const PAIR: &str = "pair";

/// How tight the flow control is.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub pair_interval: Duration,
    pub fan_out: u32,
    pub turn_stale: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            pair_interval: Duration::from_secs(10),
            fan_out: 4,
            turn_stale: Duration::from_secs(300),
        }
    }
}

/// Whether an outcome used the limits: only a delivery does.
pub type Counted = fn(&Result<Delivery, Infallible>) -> bool;

/// The delivery service behind both limits.
pub type FlowService = JointRateLimit<Deliver, Message, Counted>;

/// The limits, ready to deliver, and their handles.
#[derive(Clone, Debug)]
pub struct Flow {
    pub service: FlowService,
    /// The fan-out limit's: new turns, reset, stats.
    pub turns: RateLimitHandle,
    /// The pair limit's: reset, stats.
    pub pairs: RateLimitHandle,
}

type KeyFn = fn(&Message) -> Option<Arc<str>>;

fn sender(m: &Message) -> Option<Arc<str>> {
    Some(m.from.clone())
}

fn receiver(m: &Message) -> Option<Arc<str>> {
    Some(m.to.clone())
}

fn delivered(outcome: &Result<Delivery, Infallible>) -> bool {
    matches!(outcome, Ok(Delivery::Delivered(_)))
}

/// Build the limits around `deliver`; `clock` replaces the default clock
/// (tests step it backwards).
pub fn build(
    settings: &Settings,
    deliver: Deliver,
    clock: Option<ManualClock>,
) -> Result<Flow, ConfigError> {
    let turn = Quota::per_turn(settings.fan_out)?.with_stale_after(settings.turn_stale)?;
    let mut fan_out = RateLimitLayer::new(turn, sender as KeyFn)
        .with_name(FAN_OUT)
        .with_retry_floor(settings.pair_interval);
    let mut pair = RateLimitLayer::new(
        Quota::new(1, settings.pair_interval)?,
        (sender as KeyFn, receiver as KeyFn),
    )
    .with_name(PAIR);
    if let Some(clock) = clock {
        fan_out = fan_out.with_clock(clock.clone());
        pair = pair.with_clock(clock);
    }
    let (turns, pairs) = (fan_out.handle(), pair.handle());
    let joint = JointRateLimitLayer::new(fan_out)?
        .and(pair)?
        .count_only(delivered as Counted);
    Ok(Flow {
        service: joint.layer(deliver),
        turns,
        pairs,
    })
}
