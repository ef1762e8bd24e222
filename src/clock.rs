//! Time as the limiters see it.
//!
//! Every decision is made against one reading of a [`Clock`]. Which clock a
//! limiter reads by default depends on the `test-util` feature:
//!
//! - Without it (production), [`FastClock`]: the CPU's time-stamp counter,
//!   read through `quanta` in about 10 ns. The operating system's monotonic
//!   clock, which `std` and tokio read, costs about 24 ns on a virtual
//!   machine, as much as the rest of an admission.
//! - With it, [`TokioClock`]: [`tokio::time::Instant`], so a test that pauses
//!   tokio's time (`#[tokio::test(start_paused = true)]`,
//!   `tokio::time::advance`) drives every limiter, and the sleeps of waiting
//!   requests, with no wall-clock waits. Enable it in your dev-dependencies,
//!   next to tokio's own `test-util`:
//!
//!   ```toml
//!   [dev-dependencies]
//!   tower-throttle = { version = "0.1", features = ["test-util"] }
//!   ```
//!
//! A limiter that reads [`FastClock`] while tokio's time is paused and
//! advanced cannot see that time; it logs a warning once when it notices.
//! [`ManualClock`] can also be moved backwards, to test what a limiter does
//! when time appears to run the wrong way.
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
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
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

    /// The wall-clock time now, since the Unix epoch, read once when a
    /// limiter is made to line its fixed windows (and sliding window
    /// counters) up with wall-clock multiples of their length. `None`
    /// (the default): the system's clock. A test clock that says it makes
    /// those boundaries fall where the test chooses.
    fn unix_time(&self) -> Option<Duration> {
        None
    }
}

/// [`tokio::time::Instant::now`]: follows paused tokio time. The default
/// clock with the `test-util` feature.
///
/// Outside a paused test runtime this is the operating system's monotonic
/// clock (a vDSO call, about 24 ns on a virtual machine).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The CPU's time-stamp counter, scaled to nanoseconds by `quanta` (the clock
/// governor reads): about 10 ns a reading, at nanosecond resolution. The
/// default clock without the `test-util` feature. It does not follow paused
/// tokio time. Where the counter is not usable, `quanta` falls back to the
/// monotonic clock.
///
/// The counter's rate is calibrated once, and a calibration is off by a few
/// parts per million (17.5 ppm, 1.5 s a day, on the machine the benchmarks
/// ran on), while the operating system's clock, which tokio's timers and
/// sleeps use, is kept on time. So once a second a reading is anchored
/// again to the operating system's clock: the two never drift more than a
/// few microseconds apart, waiters wake when they were booked, and fixed
/// windows stay on wall-clock boundaries. An anchoring moves readings by
/// that much, which the limiters absorb.
///
/// [`FastClock::new`] calibrates the counter the first time one is made in
/// a process, spinning for 1–200 ms: make the first one (or the first
/// layer) before serving, not inside a latency-critical task. Clones share
/// one origin and one anchoring.
#[derive(Clone, Debug)]
pub struct FastClock {
    // Read on every request: kept inline, not behind the shared pointer.
    clock: quanta::Clock,
    origin_raw: u64,
    anchor: Arc<Anchor>,
}

/// What clones of a [`FastClock`] share: the origin and the anchoring.
#[derive(Debug)]
struct Anchor {
    /// The same instant as `origin_raw`, as tokio and the OS read it.
    origin: Instant,
    os_origin: std::time::Instant,
    /// Nanoseconds to add to the counter's reading since the origin to get
    /// the operating system's (may be negative).
    correction: AtomicI64,
    /// The counter's reading, in nanoseconds since the origin, at which to
    /// anchor again.
    next: AtomicU64,
}

/// How often a counter reading is anchored to the operating system's clock.
const ANCHOR_EVERY: Nanos = 1_000_000_000;

impl FastClock {
    /// A clock whose readings start at the current tokio instant.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = Instant::now();
        let os_origin = std::time::Instant::now();
        let origin_raw = clock.raw();
        Self {
            clock,
            origin_raw,
            anchor: Arc::new(Anchor {
                origin,
                os_origin,
                correction: AtomicI64::new(0),
                next: AtomicU64::new(ANCHOR_EVERY),
            }),
        }
    }

    /// Nanoseconds since this clock was made, anchored to the operating
    /// system's clock.
    #[inline]
    fn elapsed_nanos(&self) -> Nanos {
        let counted = self.clock.delta_as_nanos(self.origin_raw, self.clock.raw());
        let anchor = &*self.anchor;
        if counted >= anchor.next.load(Ordering::Relaxed) {
            self.anchor(counted);
        }
        counted.saturating_add_signed(anchor.correction.load(Ordering::Relaxed))
    }

    /// Set the correction from one paired reading of the counter and the
    /// operating system's clock. One thread does it per period.
    #[cold]
    #[inline(never)]
    fn anchor(&self, counted: Nanos) {
        let anchor = &*self.anchor;
        let due = anchor.next.load(Ordering::Relaxed);
        if counted < due
            || anchor
                .next
                .compare_exchange(
                    due,
                    counted + ANCHOR_EVERY,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let before = self.clock.raw();
        let os = saturating_nanos(anchor.os_origin.elapsed());
        let after = self.clock.raw();
        // A pair torn by a preemption between the reads is not used; the
        // next period tries again.
        if self.clock.delta_as_nanos(before, after) > 20_000 {
            return;
        }
        let counted = self.clock.delta_as_nanos(self.origin_raw, before);
        let correction = i128::from(os) - i128::from(counted);
        let correction = i64::try_from(correction).unwrap_or(0);
        anchor.correction.store(correction, Ordering::Relaxed);
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    fn now(&self) -> Instant {
        let elapsed = Duration::from_nanos(self.elapsed_nanos());
        let origin = self.anchor.origin;
        origin.checked_add(elapsed).unwrap_or(origin)
    }
}

/// A clock moved only by hand; it may be moved backwards.
///
/// Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    origin: Instant,
    offset_nanos: Arc<AtomicI64>,
    /// The wall-clock time at `origin`, when set.
    unix_origin: Option<Duration>,
}

impl ManualClock {
    /// A clock that starts at the current tokio instant and stands still.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            offset_nanos: Arc::new(AtomicI64::new(0)),
            unix_origin: None,
        }
    }

    /// The same clock, whose wall-clock time (since the Unix epoch) is
    /// `at` where it started, and moves with it (see
    /// [`Clock::unix_time`]): windows aligned to the wall clock then turn
    /// over where a test expects.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::clock::{Clock, ManualClock};
    ///
    /// let clock = ManualClock::new().with_unix_time(Duration::from_secs(1_700_000_000));
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(clock.unix_time(), Some(Duration::from_secs(1_700_000_001)));
    /// ```
    pub fn with_unix_time(mut self, at: Duration) -> Self {
        self.unix_origin = Some(at);
        self
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
    fn unix_time(&self) -> Option<Duration> {
        let origin = self.unix_origin?;
        let offset = self.offset_nanos.load(Ordering::SeqCst);
        let magnitude = Duration::from_nanos(offset.unsigned_abs());
        Some(if offset >= 0 {
            origin.saturating_add(magnitude)
        } else {
            origin.saturating_sub(magnitude)
        })
    }

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

/// The clock a limiter reads: tokio's or the counter, called directly on the
/// hot path, or a custom one behind a pointer.
#[derive(Clone, Debug)]
pub(crate) enum ClockSource {
    Tokio,
    Fast(FastClock),
    Custom(Arc<dyn Clock>),
}

impl Default for ClockSource {
    /// See the module docs: tokio's clock under `test-util`, else the counter.
    fn default() -> Self {
        if cfg!(feature = "test-util") {
            Self::Tokio
        } else {
            Self::Fast(FastClock::new())
        }
    }
}

impl ClockSource {
    /// The source for `clock`, read directly when it is one of ours.
    pub(crate) fn of<C: Clock>(clock: C) -> Self {
        let any: &dyn std::any::Any = &clock;
        if any.is::<TokioClock>() {
            Self::Tokio
        } else if let Some(fast) = any.downcast_ref::<FastClock>() {
            Self::Fast(fast.clone())
        } else {
            Self::Custom(Arc::new(clock))
        }
    }

    #[inline]
    fn now(&self) -> Instant {
        match self {
            Self::Tokio => Instant::now(),
            Self::Fast(clock) => clock.now(),
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
    /// For a counter clock: its reading at `origin`.
    fast_skew: Nanos,
    /// Wall-clock nanoseconds since the Unix epoch at `origin`, so that fixed
    /// windows line up with wall-clock multiples of their length (a per-minute
    /// window turns over at each whole minute).
    epoch_offset: Nanos,
}

impl Timeline {
    pub(crate) fn new(clock: ClockSource) -> Self {
        let origin = clock.now();
        // A counter clock made earlier has run on; this timeline starts at 0.
        let fast_skew = match &clock {
            ClockSource::Fast(fast) => fast.elapsed_nanos(),
            _ => 0,
        };
        let told = match &clock {
            ClockSource::Custom(custom) => custom.unix_time(),
            _ => None,
        };
        let epoch_offset = told
            .map(saturating_nanos)
            .or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .map(saturating_nanos)
            })
            .unwrap_or(0);
        Self {
            clock,
            origin,
            fast_skew,
            epoch_offset,
        }
    }

    /// Now, in nanoseconds since the origin. A clock that reads earlier than
    /// the origin reads as the origin.
    #[inline(always)]
    pub(crate) fn now(&self) -> Nanos {
        match &self.clock {
            // The counter's difference from its origin, without instant
            // arithmetic.
            ClockSource::Fast(clock) => clock.elapsed_nanos().saturating_sub(self.fast_skew),
            other => saturating_nanos(other.now().saturating_duration_since(self.origin)),
        }
    }

    /// Warn, once per process, when tokio's clock has run more than a second
    /// ahead of this timeline's counter clock: tokio's time is paused and
    /// advanced, and a limiter reading the counter cannot see it. Called on
    /// refusals and waits only.
    pub(crate) fn check_paused_time(&self, now: Nanos) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.load(Ordering::Relaxed)
            && self.behind_tokio(now)
            && !WARNED.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                "tokio's time runs ahead of the rate limiter's clock (paused and advanced?); \
                 enable tower-throttle's `test-util` feature so limiters follow tokio's time"
            );
        }
    }

    /// See [`Timeline::check_paused_time`]. The counter is anchored to the
    /// operating system's clock, so in production the two agree to
    /// microseconds; only paused-and-advanced tokio time gets a second ahead.
    fn behind_tokio(&self, now: Nanos) -> bool {
        matches!(self.clock, ClockSource::Fast(_))
            && saturating_nanos(Instant::now().saturating_duration_since(self.origin))
                > now.saturating_add(1_000_000_000)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_moves_forward_from_its_origin() {
        let clock = FastClock::new();
        let timeline = Timeline::new(ClockSource::of(clock.clone()));
        let first = timeline.now();
        // Readings never go back, and the counter moves within a million
        // readings (a stuck counter fails here rather than hanging).
        let mut last = first;
        let mut moved = false;
        for _ in 0..1_000_000 {
            let now = timeline.now();
            assert!(now >= last, "{now} read after {last}");
            last = now;
            if now > first {
                moved = true;
                break;
            }
        }
        assert!(moved, "the counter did not move");
        assert!(clock.now() >= timeline.instant(first));
    }

    #[test]
    fn known_clocks_are_read_directly() {
        assert!(matches!(ClockSource::of(TokioClock), ClockSource::Tokio));
        assert!(matches!(
            ClockSource::of(FastClock::new()),
            ClockSource::Fast(_)
        ));
        assert!(matches!(
            ClockSource::of(ManualClock::new()),
            ClockSource::Custom(_)
        ));
    }

    #[test]
    fn a_counter_clock_is_anchored_to_the_os_clock_again() {
        let clock = FastClock::new();
        // As if the counter's calibration had run 5 s fast: the next
        // anchoring must put it back on the operating system's clock.
        clock
            .anchor
            .correction
            .store(5_000_000_000, Ordering::Relaxed);
        assert!(clock.elapsed_nanos() >= 5_000_000_000);
        clock.anchor.next.store(0, Ordering::Relaxed);
        // A torn pair (a preemption between the reads) skips one anchoring:
        // try a few periods.
        let mut elapsed = clock.elapsed_nanos();
        for _ in 0..100 {
            if elapsed < 5_000_000_000 {
                break;
            }
            clock.anchor.next.store(0, Ordering::Relaxed);
            elapsed = clock.elapsed_nanos();
        }
        let os = saturating_nanos(clock.anchor.os_origin.elapsed());
        // Back on the OS clock (within a millisecond; it was 5 s off).
        assert!(
            elapsed <= os + 1_000_000,
            "{elapsed} ns read, {os} ns on the OS clock"
        );
        assert!(
            clock.anchor.next.load(Ordering::Relaxed) >= ANCHOR_EVERY,
            "the next anchoring is a period away"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_counter_clock_notices_paused_tokio_time_running_ahead() {
        let timeline = Timeline::new(ClockSource::of(FastClock::new()));
        assert!(!timeline.behind_tokio(timeline.now()));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(timeline.behind_tokio(timeline.now()));
        assert!(!Timeline::new(ClockSource::Tokio).behind_tokio(0));
    }
}
