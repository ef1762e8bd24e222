//! How a learned limit tightens a route's configured quotas: never
//! raising one, adding one for a period the configuration lacks.

use std::time::Duration;

use tower_throttle::backoff::Announced;
use tower_throttle::rate_limit::{Algorithm, Quota, Unit as QuotaUnit};

/// What a quota counts, and so which learned limits may tighten it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Requests: `x-ratelimit-limit-requests` and the like.
    Requests,
    /// Tokens (a cost): `x-ratelimit-limit-tokens` and the like.
    Tokens,
}

/// One learned limit: `limit` units per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    /// Units per window.
    pub limit: u32,
    /// The window.
    pub window: Duration,
}

impl Learned {
    /// A limit a quota can be lowered to, from what a response said; `None`
    /// for a zero limit (which would silence the route: not trusted), no
    /// window, or a window no quota can have.
    pub fn from_announced(said: &Announced) -> Option<Self> {
        let limit = u32::try_from(said.limit?).unwrap_or(u32::MAX);
        let window = said.window?;
        Quota::new(limit, window).ok()?;
        Some(Self { limit, window })
    }
}

/// `quotas` tightened to `learned`, for the quotas counting `unit`: each of
/// the window's period lowered to the learned limit (never raised), and a
/// quota of the learned limit added when none has that period.
///
/// A token limit only lowers quotas counting tokens: a route with none is
/// charged no estimate, so one added would count a token per request.
pub fn tighten(quotas: &[Quota], unit: Unit, learned: &[Learned]) -> Vec<Quota> {
    let counts = |q: &Quota| match unit {
        Unit::Requests => q.unit() == QuotaUnit::Requests,
        Unit::Tokens => q.unit() == QuotaUnit::Cost,
    };
    let mut out = quotas.to_vec();
    for l in learned {
        let mut found = false;
        for q in out.iter_mut().filter(|q| counts(q)) {
            if q.period() != l.window || q.algorithm() == Algorithm::TurnBudget {
                continue;
            }
            found = true;
            if let Some(lower) = lowered(q, l.limit) {
                *q = lower;
            }
        }
        if !found && unit == Unit::Requests {
            let algorithm = quotas
                .iter()
                .map(Quota::algorithm)
                .find(|a| *a != Algorithm::TurnBudget)
                .unwrap_or(Algorithm::TokenBucket);
            if let Ok(q) = Quota::new(l.limit, l.window) {
                out.push(q.with_algorithm(algorithm).with_unit(QuotaUnit::Requests));
            }
        }
    }
    out
}

/// `q` with its limit (and burst) at most `limit`; `None` when that changes
/// nothing or cannot be built.
fn lowered(q: &Quota, limit: u32) -> Option<Quota> {
    if limit >= q.limit() {
        return None;
    }
    let lower = Quota::new(limit, q.period())
        .ok()?
        .with_algorithm(q.algorithm())
        .with_unit(q.unit());
    if q.algorithm() == Algorithm::TokenBucket {
        lower.with_burst(q.burst().min(limit)).ok()
    } else {
        Some(lower)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_minute(limit: u32) -> Learned {
        Learned {
            limit,
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn tighten_lowers_never_raises_and_adds_a_missing_period() {
        let requests = |q: Quota| q.with_unit(QuotaUnit::Requests);
        let config = [
            requests(Quota::per_minute(60).unwrap().with_burst(10).unwrap()),
            requests(Quota::per_second(5).unwrap().sliding_window()),
        ];
        let lower = tighten(&config, Unit::Requests, &[per_minute(5)]);
        assert_eq!(lower[0].limit(), 5);
        assert_eq!(lower[0].burst(), 5);
        assert_eq!(lower[1], config[1]);

        let higher = tighten(&config, Unit::Requests, &[per_minute(1000)]);
        assert_eq!(higher, config.to_vec());

        let hourly = Learned {
            limit: 100,
            window: Duration::from_secs(3600),
        };
        let added = tighten(&config, Unit::Requests, &[hourly]);
        assert_eq!(added.len(), 3);
        assert_eq!(added[2].limit(), 100);
        assert_eq!(added[2].algorithm(), Algorithm::TokenBucket);

        assert_eq!(added[2].unit(), QuotaUnit::Requests);

        let unlimited = tighten(&[], Unit::Requests, &[per_minute(7)]);
        assert_eq!(unlimited, vec![requests(Quota::per_minute(7).unwrap())]);

        // A token limit lowers only quotas counting tokens, and adds none.
        assert_eq!(
            tighten(&config, Unit::Tokens, &[per_minute(5)]),
            config.to_vec()
        );
        let with_tokens = [config[0], Quota::per_minute(30_000).unwrap()];
        let lower = tighten(&with_tokens, Unit::Tokens, &[per_minute(20_000)]);
        assert_eq!(lower[0], config[0]);
        assert_eq!(lower[1].limit(), 20_000);
        assert_eq!(lower[1].unit(), QuotaUnit::Cost);
    }
}
