//! `ExponentialBackoff`: the doubling rule for cooldowns the upstream does not time.

use std::time::Duration;

use crate::error::ConfigError;

/// The fallback rule when a refusal says nothing about how long to wait: an
/// initial delay that doubles with each consecutive refusal, capped, with
/// optional symmetric jitter.
///
/// The `n`th consecutive refusal (`streak == n`, from 1) waits
/// `initial × 2ⁿ⁻¹`, capped at `max`; a `max` of zero means no doubling, a
/// fixed delay of `initial` (a cap of nothing would mean no cooldown at all,
/// which is what an `initial` of zero says). Jitter then moves it by up to
/// `ratio` of itself either way, uniformly, so that many clients refused at
/// once do not come back at once. Jitter is applied after the cap, so clients
/// at the cap stay spread too.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backoff::ExponentialBackoff;
///
/// let backoff = ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(5));
/// assert_eq!(backoff.base(1), Duration::from_secs(1));
/// assert_eq!(backoff.base(3), Duration::from_secs(4));
/// assert_eq!(backoff.base(4), Duration::from_secs(5));
///
/// let jittered = backoff.with_jitter(0.2)?;
/// let d = jittered.delay(2);
/// assert!(d >= Duration::from_millis(1600) && d <= Duration::from_millis(2400));
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExponentialBackoff {
    initial: Duration,
    max: Duration,
    jitter: f64,
}

impl ExponentialBackoff {
    /// Start at `initial`, double per consecutive refusal, stop at `max`. An
    /// `initial` above `max` is capped to it. A `max` of zero: every delay is
    /// `initial`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::backoff::ExponentialBackoff;
    ///
    /// let fixed = ExponentialBackoff::new(Duration::from_secs(2), Duration::ZERO);
    /// assert_eq!(fixed.base(1), Duration::from_secs(2));
    /// assert_eq!(fixed.base(5), Duration::from_secs(2));
    /// ```
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: 0.0,
        }
    }

    /// Move each delay by up to `ratio` of itself, either way, uniformly.
    /// `ratio` must be within `0..=1`.
    pub fn with_jitter(mut self, ratio: f64) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError::new(
                "jitter",
                format!("must be a ratio within 0..=1, not {ratio}"),
            ));
        }
        self.jitter = ratio;
        Ok(self)
    }

    /// The first delay.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap on the doubled delay, as given (zero: no doubling).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The longest delay before jitter: `max`, or `initial` when `max` is
    /// zero (a fixed delay).
    pub fn cap(&self) -> Duration {
        if self.max.is_zero() {
            self.initial
        } else {
            self.max
        }
    }

    /// The jitter ratio.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    pub(crate) fn set_initial(&mut self, initial: Duration) {
        self.initial = initial;
    }

    pub(crate) fn set_max(&mut self, max: Duration) {
        self.max = max;
    }

    /// The delay after `streak` consecutive refusals, without jitter. A
    /// streak of 0 reads as 1.
    pub fn base(&self, streak: u32) -> Duration {
        let doublings = streak.saturating_sub(1);
        let factor = 1u32.checked_shl(doublings).unwrap_or(0);
        let doubled = match factor {
            0 => None,
            f => self.initial.checked_mul(f),
        };
        doubled.unwrap_or(Duration::MAX).min(self.cap())
    }

    /// The delay after `streak` consecutive refusals, with jitter.
    pub fn delay(&self, streak: u32) -> Duration {
        let base = self.base(streak);
        if self.jitter == 0.0 {
            return base;
        }
        let spread = 2.0 * fastrand::f64() - 1.0; // in [-1, 1)
        jittered(base, self.jitter * spread)
    }
}

/// `base` moved by `shift` of itself (`shift` within `-1..=1`), never below
/// zero and never more than `|shift| × base` away from `base`.
fn jittered(base: Duration, shift: f64) -> Duration {
    let nanos = base.as_nanos();
    // Truncating toward zero keeps the move within `|shift| × base`.
    let moved = (nanos as f64 * shift.abs()) as u128;
    let moved = moved.min(nanos);
    let out = if shift < 0.0 {
        nanos - moved
    } else {
        nanos.saturating_add(moved)
    };
    super::headers::duration(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_streaks_and_durations_saturate_at_the_cap() {
        let b = ExponentialBackoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(b.base(0), Duration::from_secs(1));
        assert_eq!(b.base(33), Duration::MAX);
        assert_eq!(b.base(u32::MAX), Duration::MAX);
        let b = b.with_jitter(1.0).unwrap_or(b);
        let _ = b.delay(u32::MAX); // no overflow panic
        assert_eq!(jittered(Duration::MAX, 1.0), Duration::MAX);
        assert_eq!(jittered(Duration::from_secs(2), -1.0), Duration::ZERO);
    }

    #[test]
    fn bad_ratios_are_refused() {
        let b = ExponentialBackoff::new(Duration::from_secs(1), Duration::from_secs(2));
        for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            assert!(b.with_jitter(bad).is_err(), "{bad}");
        }
    }
}
