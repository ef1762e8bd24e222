//! Time as the limiters see it.
//!
//! Every decision is made against one reading of a [`Clock`]. The default,
//! [`TokioClock`], reads [`tokio::time::Instant`], so a test that pauses tokio's
//! time (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`) drives
//! every limiter, and the sleeps of waiting requests, with no wall-clock waits.
//! [`ManualClock`] can also be moved backwards, to test what a limiter does when
//! time appears to run the wrong way.
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new();
//! let start = clock.now();
//! clock.advance(Duration::from_millis(1500));
//! assert_eq!(clock.now() - start, Duration::from_millis(1500));
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A source of the current time.
///
/// Implementations must be cheap: the rate limiter reads the clock once per
/// request. A clock that does not follow tokio's time still limits correctly in
/// reject mode, but the sleeps of wait mode are tokio sleeps.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The default clock: [`tokio::time::Instant::now`].
///
/// Outside a paused test runtime this is the operating system's monotonic
/// clock (a vDSO call, about 20 ns), which is why no faster, coarser clock is
/// used: a coarse clock would make `retry_after` inexact.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock moved only by hand; it may be moved backwards.
///
/// Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    origin: Instant,
    offset_nanos: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock that starts at the current tokio instant and stands still.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            offset_nanos: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        self.add(by);
    }

    /// Move the clock backward, as a misbehaving clock would.
    pub fn rewind(&self, by: Duration) {
        let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        self.add(by.saturating_neg());
    }

    fn add(&self, delta: i64) {
        let _ = self
            .offset_nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |old| {
                Some(old.saturating_add(delta))
            });
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        let offset = self.offset_nanos.load(Ordering::SeqCst);
        let magnitude = Duration::from_nanos(offset.unsigned_abs());
        if offset >= 0 {
            self.origin.checked_add(magnitude).unwrap_or(self.origin)
        } else {
            self.origin.checked_sub(magnitude).unwrap_or(self.origin)
        }
    }
}

/// Nanoseconds since a limiter's origin: a `u64` is compact per key and covers
/// 584 years.
pub(crate) type Nanos = u64;

/// The clock a limiter reads: tokio's, called directly on the hot path, or a
/// custom one behind a pointer.
#[derive(Clone, Debug, Default)]
pub(crate) enum ClockSource {
    #[default]
    Tokio,
    Custom(Arc<dyn Clock>),
}

impl ClockSource {
    #[inline]
    fn now(&self) -> Instant {
        match self {
            Self::Tokio => Instant::now(),
            Self::Custom(clock) => clock.now(),
        }
    }
}

/// A clock plus the instant its limiter was built; turns instants into
/// [`Nanos`] and back.
#[derive(Debug)]
pub(crate) struct Timeline {
    clock: ClockSource,
    origin: Instant,
    /// Wall-clock nanoseconds since the Unix epoch at `origin`, so that fixed
    /// windows line up with wall-clock multiples of their length (a per-minute
    /// window turns over at each whole minute).
    epoch_offset: Nanos,
}

impl Timeline {
    pub(crate) fn new(clock: ClockSource) -> Self {
        let origin = clock.now();
        let epoch_offset = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(saturating_nanos)
            .unwrap_or(0);
        Self {
            clock,
            origin,
            epoch_offset,
        }
    }

    /// Now, in nanoseconds since the origin. A clock that reads earlier than
    /// the origin reads as the origin.
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        saturating_nanos(self.clock.now().saturating_duration_since(self.origin))
    }

    /// The tokio instant of a point on this timeline.
    pub(crate) fn instant(&self, at: Nanos) -> Instant {
        let far = Duration::from_secs(86_400 * 365 * 30);
        self.origin
            .checked_add(Duration::from_nanos(at))
            .or_else(|| self.origin.checked_add(far))
            .unwrap_or(self.origin)
    }

    /// Wall-clock nanoseconds since the Unix epoch at the origin.
    pub(crate) fn epoch_offset(&self) -> Nanos {
        self.epoch_offset
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
#[inline]
pub(crate) fn saturating_nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
