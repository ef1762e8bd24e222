//! How much a key may do: a quota and the algorithm that enforces it.

use std::time::Duration;

use crate::error::ConfigError;

/// The longest period a quota may have. Longer ones are almost surely a unit
/// mistake, and would keep a key's state alive for that long.
pub const MAX_PERIOD: Duration = Duration::from_secs(400 * 86_400);

/// How long a turn nobody ends lasts, unless set with
/// [`Quota::with_stale_after`].
pub const DEFAULT_STALE_TURN: Duration = Duration::from_secs(300);

/// How a quota is enforced. Configuration files name it as
/// [`as_str`](Self::as_str) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket, as GCRA: refills smoothly at `limit / period`, holds up
    /// to `burst`; an idle key recovers its whole burst.
    TokenBucket,
    /// Exact sliding window: never more than `limit` admissions in any
    /// rolling `period`. Keeps one entry per admission in the window, so its
    /// state grows with `limit`.
    SlidingWindow,
    /// Fixed window: at most `limit` per window; windows are aligned to
    /// wall-clock multiples of `period` (a per-minute window turns over at
    /// each whole minute).
    FixedWindow,
    /// Budget per turn: at most `limit` per turn of the key. A turn ends when
    /// the [handle](super::RateLimitHandle::new_turn) says so for that key,
    /// or by itself `period` after it started, so a caller that never
    /// signals cannot silence a key for good.
    TurnBudget,
    /// Approximate sliding window: two fixed windows of `period`, aligned as
    /// [`FixedWindow`](Self::FixedWindow)'s, the previous one counted by
    /// the share of it the rolling window still covers, as if its
    /// admissions were spread evenly over it. A few numbers per key at any
    /// limit, where [`SlidingWindow`](Self::SlidingWindow) keeps every
    /// admission. Never more than `limit` in an aligned window; in a rolling
    /// one, about `limit` when traffic is steady and at worst twice it (the
    /// previous window's admissions all at its end). A refusal's wait can
    /// be up to two periods, as the previous window weighs until a whole
    /// period after it ended. A retune to another period counts, as a fixed
    /// window's does, what the windows the state forgot may have held (at
    /// the old limit), in the new window and the one before it: a busy key
    /// can stay refused up to two new periods. Chosen by name only:
    /// nothing turns an exact window into this one.
    SlidingWindowCounter,
}

impl Algorithm {
    /// The name configuration files use: `token_bucket`, `sliding_window`,
    /// `fixed_window`, `turn_budget`, `sliding_window_counter`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::SlidingWindow => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::TurnBudget => "turn_budget",
            Self::SlidingWindowCounter => "sliding_window_counter",
        }
    }
}

/// What a quota counts.
///
/// A layer has one [cost](super::Cost) per request (one unit unless set with
/// [`with_cost`](super::RateLimitLayer::with_cost)); each quota counts either
/// that cost or the request itself, so one key can be held to requests per
/// second and tokens per minute at once, judged together (nothing is taken
/// when either refuses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// The request's cost (the default): one per request unless the layer
    /// has a cost function.
    #[default]
    Cost,
    /// One per request, whatever its cost.
    Requests,
}

impl Unit {
    /// The name configuration files use: `cost` or `requests`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Cost => "cost",
            Self::Requests => "requests",
        }
    }
}

/// A limit: `limit` units per `period`, enforced by an [`Algorithm`].
///
/// The constructors read as they count: `Quota::per_minute(60)` admits 60 per
/// minute (with a burst of 60 for the token bucket).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::rate_limit::{Algorithm, Quota};
///
/// let q = Quota::per_minute(60)?.with_burst(10)?;
/// assert_eq!(q.limit(), 60);
/// assert_eq!(q.burst(), 10);
/// assert_eq!(q.period(), Duration::from_secs(60));
///
/// let rolling = Quota::per_minute(500)?.sliding_window();
/// assert_eq!(rolling.algorithm(), Algorithm::SlidingWindow);
///
/// assert!(Quota::per_minute(0).is_err());
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    limit: u32,
    period: Duration,
    burst: u32,
    algorithm: Algorithm,
    unit: Unit,
}

impl Quota {
    /// `limit` per `period`, as a token bucket with a burst of `limit`.
    /// A zero limit, a zero period or a period over [`MAX_PERIOD`] is an
    /// error.
    pub fn new(limit: u32, period: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::new(
                "limit",
                "must be at least 1 (leave the limit out to mean unlimited)",
            ));
        }
        if period.is_zero() {
            return Err(ConfigError::new("period", "must be longer than zero"));
        }
        if period > MAX_PERIOD {
            return Err(ConfigError::new(
                "period",
                format!(
                    "{period:?} is longer than the most allowed ({} days)",
                    MAX_PERIOD.as_secs() / 86_400
                ),
            ));
        }
        Ok(Self {
            limit,
            period,
            burst: limit,
            algorithm: Algorithm::TokenBucket,
            unit: Unit::Cost,
        })
    }

    /// `limit` per second.
    pub fn per_second(limit: u32) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` per minute.
    pub fn per_minute(limit: u32) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` per hour.
    pub fn per_hour(limit: u32) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(3_600))
    }

    /// `limit` per day.
    pub fn per_day(limit: u32) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(86_400))
    }

    /// At most `limit` per turn of a key; a turn nobody ends goes stale after
    /// five minutes (see [`Algorithm::TurnBudget`]).
    pub fn per_turn(limit: u32) -> Result<Self, ConfigError> {
        Ok(Self::new(limit, DEFAULT_STALE_TURN)?.with_algorithm(Algorithm::TurnBudget))
    }

    /// A turn budget's stale period: how long after it started a turn that
    /// nobody ended ends by itself.
    pub fn with_stale_after(self, stale_after: Duration) -> Result<Self, ConfigError> {
        if self.algorithm != Algorithm::TurnBudget {
            return Err(ConfigError::new(
                "stale_after",
                "only a turn budget has a stale period",
            ));
        }
        Ok(Self::new(self.limit, stale_after)?
            .with_algorithm(Algorithm::TurnBudget)
            .with_unit(self.unit))
    }

    /// A token bucket holding up to `burst` (the refill rate stays
    /// `limit / period`). Zero is an error, and so is a burst on a window
    /// algorithm, where the window's limit is the burst.
    pub fn with_burst(mut self, burst: u32) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::new("burst", "must be at least 1"));
        }
        if self.algorithm != Algorithm::TokenBucket {
            return Err(ConfigError::new(
                "burst",
                "only a token bucket has a burst; a window's limit is its burst",
            ));
        }
        // A bucket that takes longer than the longest period to refill is a
        // unit mistake, and would overflow the arithmetic.
        let refill = u128::from(burst) * self.period.as_nanos() / u128::from(self.limit);
        if refill > MAX_PERIOD.as_nanos() {
            return Err(ConfigError::new(
                "burst",
                format!(
                    "{burst} takes longer than {} days to refill at {} per {:?}",
                    MAX_PERIOD.as_secs() / 86_400,
                    self.limit,
                    self.period
                ),
            ));
        }
        self.burst = burst;
        Ok(self)
    }

    /// Enforce as a token bucket (the default).
    pub fn token_bucket(self) -> Self {
        self.with_algorithm(Algorithm::TokenBucket)
    }

    /// Enforce as an exact sliding window of `period`; the burst is the limit.
    pub fn sliding_window(self) -> Self {
        self.with_algorithm(Algorithm::SlidingWindow)
    }

    /// Enforce as fixed windows of `period`; the burst is the limit.
    pub fn fixed_window(self) -> Self {
        self.with_algorithm(Algorithm::FixedWindow)
    }

    /// Enforce as an approximate sliding window of `period` (see
    /// [`Algorithm::SlidingWindowCounter`]); the burst is the limit.
    ///
    /// ```
    /// use tower_throttle::rate_limit::{Algorithm, Quota};
    ///
    /// // A provider's 30,000 requests a minute, shared through Redis,
    /// // where an exact window keeps at most 10,000 admissions.
    /// let rpm = Quota::per_minute(30_000)?.sliding_window_counter();
    /// assert_eq!(rpm.algorithm(), Algorithm::SlidingWindowCounter);
    /// assert_eq!(rpm.burst(), 30_000);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn sliding_window_counter(self) -> Self {
        self.with_algorithm(Algorithm::SlidingWindowCounter)
    }

    /// Enforce with `algorithm`. A window or turn algorithm's burst is its
    /// limit.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        if algorithm != Algorithm::TokenBucket {
            self.burst = self.limit;
        }
        self.algorithm = algorithm;
        self
    }

    /// Count `unit`: the request's cost (the default) or the request.
    ///
    /// ```
    /// use tower_throttle::rate_limit::{Quota, Unit};
    ///
    /// // 10 requests a second and 30,000 tokens a minute, with a cost
    /// // function that estimates a request's tokens.
    /// let quotas = vec![
    ///     Quota::per_second(10)?.with_unit(Unit::Requests),
    ///     Quota::per_minute(30_000)?,
    /// ];
    /// assert_eq!(quotas[1].unit(), Unit::Cost);
    /// # Ok::<(), tower_throttle::error::ConfigError>(())
    /// ```
    pub fn with_unit(mut self, unit: Unit) -> Self {
        self.unit = unit;
        self
    }

    /// The tighter of two quotas of the same algorithm and period: the
    /// smaller limit and the smaller burst.
    pub(crate) fn tightened(&self, other: &Quota) -> Quota {
        let limit = self.limit.min(other.limit);
        // Keep the burst refillable within the longest period at the lower
        // rate, as `with_burst` demands.
        let most = MAX_PERIOD.as_nanos() * u128::from(limit) / self.period.as_nanos().max(1);
        let burst = self
            .burst
            .min(other.burst)
            .min(u32::try_from(most).unwrap_or(u32::MAX))
            .max(1);
        Quota {
            limit,
            burst: if self.algorithm == Algorithm::TokenBucket {
                burst
            } else {
                limit
            },
            ..*self
        }
    }

    /// Units per period.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The period (the window, for window algorithms).
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The most that can be admitted at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// What it counts.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// What a request of `cost` counts against this quota.
    #[inline]
    pub(crate) fn cost_of(&self, cost: u32) -> u32 {
        match self.unit {
            Unit::Cost => cost,
            Unit::Requests => 1,
        }
    }
}
