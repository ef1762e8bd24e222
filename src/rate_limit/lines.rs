//! The order in which waiters of one key reach the inner service.
//!
//! Each waiter sleeps until its own instant, but several waiters can be due
//! at one instant (a fixed window opening, or turns closer together than the
//! timer's millisecond), and tokio does not promise in which order timers
//! due together wake their tasks. So a waiter joins its key's line when its
//! capacity is booked, under the key's lock, which makes the line's order
//! the booking order; once its instant has come, it lets the waiters booked
//! ahead of it go first, and whoever leaves wakes the next. A request that
//! could go at once while waiters of its key are due (their tasks have not
//! run yet) joins the line too, rather than pass them.
//!
//! A waiter gives way to one ahead (due no later than itself) for [`GRACE`]
//! after that one's instant: long enough for the runtime to run a task it
//! has woken, and a bound on what a response future that is kept but never
//! polled can cost the key's later requests. Past its grace, the one ahead
//! still goes first if it is being polled (it left its waker when it found
//! others ahead of it): it is woken and given [`HANDOVER`] to go. One that
//! does not poll again in that time is treated as gone.
//!
//! A retune can leave a key's line holding waiters booked under the old
//! quotas while its states now say something else (a faster rate, a quota
//! gone, a table replaced). So a retune gives each key with waiters a
//! *floor*, the last waiter's instant: no request booked after the retune
//! is booked before it (waiting requests only: the others are refused or
//! admitted by the states, which already count the waiters). A reset lifts
//! the floor, as it takes effect at once, and a later retune sets none for
//! the waiters booked before the reset; a new turn lifts it when the
//! limiter has nothing but turn budgets. The floor goes with the line once
//! the line empties.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{Nanos, Timeline};
use crate::key::KeyHash;
use crate::store::PassThrough;
use crate::sync::{AtomicU64, AtomicUsize, Mutex};

/// How long a due waiter gives way to one booked ahead of it.
pub(crate) const GRACE: Duration = Duration::from_millis(20);

/// How long a waiter past its grace, but still polled, gets to go once
/// woken by one behind it.
pub(crate) const HANDOVER: Duration = Duration::from_millis(1);

const SHARDS: usize = 16;

/// The lines of every key that has waiters, in shards by key.
pub(crate) struct Lines {
    shards: Box<[Shard]>,
    /// The latest floor a retune set: from then on, no floor matters and an
    /// admission does not look for one.
    floors_until: AtomicU64,
}

/// One shard, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Shard {
    queues: Mutex<Queues>,
    /// How many are in this shard's lines: while none are, a request that
    /// can go at once does not look for its key's line.
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Queues {
    /// Handed out in booking order (turns are compared within a key only).
    next_turn: u64,
    /// Per key, the waiters in line.
    keys: HashMap<u64, Line, BuildHasherDefault<PassThrough>>,
}

/// One key's waiters, by turn, and its floor.
#[derive(Default)]
struct Line {
    places: BTreeMap<u64, Place>,
    /// Set by a retune: nothing booked after it goes before this instant.
    floor: Option<Nanos>,
    /// Waiters with turns before this were booked before a reset or a new
    /// turn: a retune after it sets no floor for them.
    since: u64,
}

impl Line {
    /// Raise the floor to the last waiter's instant (waiters booked since
    /// the last reset), if that is after `now`: whether it rose.
    fn hold_back(&mut self, now: Nanos) -> bool {
        let last = self
            .places
            .range(self.since..)
            .map(|(_, p)| p.at)
            .max()
            .unwrap_or(0);
        if last <= now || self.floor.is_some_and(|f| f >= last) {
            return false;
        }
        self.floor = Some(last);
        true
    }
}

/// One waiter's place: its instant (as booked, and as a tokio instant),
/// and its waker once it waits for others.
struct Place {
    at: Nanos,
    due: Instant,
    waker: Option<Waker>,
}

impl Default for Lines {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            floors_until: AtomicU64::new(0),
        }
    }
}

/// The turn in `key`'s line for a booking at `at`, decided at `now`, when
/// there is a line to join (`line`): a waiter joins; a request that could go
/// at once joins only behind due waiters. The caller holds the key's state,
/// so that turns follow bookings.
#[inline]
pub(crate) fn turn_for(
    line: Option<&Lines>,
    key: KeyHash,
    at: Nanos,
    now: Nanos,
    timeline: &Timeline,
) -> Option<u64> {
    let line = line?;
    if at > now {
        Some(line.join(key, at, timeline.instant(at)))
    } else {
        line.join_if_due(key, now, timeline.instant(now))
    }
}

impl Lines {
    #[inline]
    fn shard(&self, key: KeyHash) -> &Shard {
        &self.shards[(key.0 >> 40) as usize % SHARDS]
    }

    /// Join `key`'s line, booked at `at`, an instant of `due`.
    pub(crate) fn join(&self, key: KeyHash, at: Nanos, due: Instant) -> u64 {
        let shard = self.shard(key);
        let mut queues = shard.queues.lock();
        shard.enqueue(&mut queues, key, at, due)
    }

    /// For a request that could go `now` (on the limiter's clock, `due` as
    /// a tokio instant): join `key`'s line if a waiter in it is due, else
    /// nothing. A waiter of the key joined under the key's lock, which the
    /// caller holds, so it is counted by now.
    #[inline]
    pub(crate) fn join_if_due(&self, key: KeyHash, now: Nanos, due: Instant) -> Option<u64> {
        let shard = self.shard(key);
        if shard.waiting.load(Ordering::Relaxed) == 0 {
            return None;
        }
        shard.join_if_due(key, now, due)
    }

    /// The instant before which nothing may be booked on `key`, as of
    /// `now`: the floor a retune left (see the module docs), else 0. A floor
    /// beyond `horizon` is the mark of a clock that ran backwards, and is
    /// ignored as the algorithms ignore such state.
    #[inline]
    pub(crate) fn floor(&self, key: KeyHash, now: Nanos, horizon: Nanos) -> Nanos {
        if now >= self.floors_until.load(Ordering::Acquire) {
            return 0;
        }
        self.floor_of(key, now, horizon)
    }

    #[cold]
    fn floor_of(&self, key: KeyHash, now: Nanos, horizon: Nanos) -> Nanos {
        let shard = self.shard(key);
        // A floor goes with its line: no waiter in the shard, no floor.
        if shard.waiting.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let queues = shard.queues.lock();
        queues
            .keys
            .get(&key.0)
            .and_then(|line| line.floor)
            .filter(|&floor| floor <= now.saturating_add(horizon))
            .unwrap_or(0)
    }

    /// For a retune: give `key`, if its waiters are booked beyond `now`, a
    /// floor at its last waiter's instant, and return its floor (0: none
    /// beyond `now`). The caller holds the key's state, under which waiters
    /// join, so no waiter is missed.
    pub(crate) fn hold_back_key(&self, key: KeyHash, now: Nanos) -> Nanos {
        let shard = self.shard(key);
        if shard.waiting.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut queues = shard.queues.lock();
        let Some(line) = queues.keys.get_mut(&key.0) else {
            return 0;
        };
        if line.hold_back(now) {
            self.raise_floors(line.floor);
        }
        line.floor.filter(|&floor| floor > now).unwrap_or(0)
    }

    /// For a retune: give every key whose waiters are booked beyond `now`
    /// a floor at its last waiter's instant. Returns every key with a floor
    /// beyond `now`, with the floor and whether this call raised it.
    pub(crate) fn hold_back(&self, now: Nanos) -> Vec<(KeyHash, Nanos, bool)> {
        let mut held = Vec::new();
        for shard in self.shards.iter() {
            if shard.waiting.load(Ordering::Acquire) == 0 {
                continue;
            }
            let mut queues = shard.queues.lock();
            for (&key, line) in &mut queues.keys {
                let raised = line.hold_back(now);
                if raised {
                    self.raise_floors(line.floor);
                }
                if let Some(floor) = line.floor.filter(|&f| f > now) {
                    held.push((KeyHash(key), floor, raised));
                }
            }
        }
        held
    }

    fn raise_floors(&self, floor: Option<Nanos>) {
        if let Some(floor) = floor {
            self.floors_until.fetch_max(floor, Ordering::AcqRel);
        }
    }

    /// A reset or a new turn takes effect at once: lift `key`'s floor, and
    /// set none for the waiters booked so far at a later retune.
    pub(crate) fn lift(&self, key: KeyHash) {
        let mut queues = self.shard(key).queues.lock();
        let next = queues.next_turn;
        if let Some(line) = queues.keys.get_mut(&key.0) {
            line.floor = None;
            line.since = next;
        }
    }

    /// A reset of every key: lift every floor, as [`lift`](Self::lift)
    /// does for one.
    pub(crate) fn lift_all(&self) {
        for shard in self.shards.iter() {
            let mut queues = shard.queues.lock();
            let next = queues.next_turn;
            for line in queues.keys.values_mut() {
                line.floor = None;
                line.since = next;
            }
        }
    }

    /// Whether requests wait in `key`'s line now (booked, not yet gone).
    /// Called under the key's state, under which waiters join, to know
    /// whether anything is booked ahead of now.
    pub(crate) fn has_waiters(&self, key: KeyHash) -> bool {
        let shard = self.shard(key);
        if shard.waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let queues = shard.queues.lock();
        queues
            .keys
            .get(&key.0)
            .is_some_and(|line| !line.places.is_empty())
    }

    /// Whether `turn` may go now: `None` when every waiter booked ahead of
    /// it and due no later than it is past its grace and not being polled;
    /// else the instant to look again at, and `waker` is woken sooner if
    /// the waiters ahead leave. Waiters ahead past their grace but still
    /// polled are woken to go first.
    #[inline]
    pub(crate) fn check(&self, key: KeyHash, turn: u64, waker: &Waker) -> Option<Instant> {
        self.check_at(key, turn, waker, Instant::now)
    }

    /// [`check`](Self::check), reading the time from `now` (under the
    /// lock, as `check` reads tokio's clock): the loom models, which cannot
    /// run tokio's clock, pass the time in as a value.
    #[inline]
    pub(crate) fn check_at(
        &self,
        key: KeyHash,
        turn: u64,
        waker: &Waker,
        now: impl FnOnce() -> Instant,
    ) -> Option<Instant> {
        let mut handed_over = Vec::new();
        let mut replaced = None;
        let blocked = {
            let mut queues = self.shard(key).queues.lock();
            let line = &mut queues.keys.get_mut(&key.0)?.places;
            let due = line.get(&turn)?.due;
            let now = now();
            let mut blocked: Option<Instant> = None;
            for (_, ahead) in line.range_mut(..turn) {
                let until = if ahead.due > due {
                    // Due after this one (bookings after a reset): not ahead.
                    continue;
                } else if now < ahead.due + GRACE {
                    ahead.due + GRACE
                } else if let Some(its) = ahead.waker.take() {
                    handed_over.push(its);
                    now + HANDOVER
                } else {
                    // Past its grace and not polled since: gone.
                    continue;
                };
                blocked = Some(blocked.map_or(until, |b| b.max(until)));
            }
            if blocked.is_some() {
                if let Some(place) = line.get_mut(&turn) {
                    if !place.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        replaced = place.waker.replace(waker.clone());
                    }
                }
            }
            blocked
        };
        // Wakers are woken and dropped outside the lock: either may run
        // code that comes back here.
        drop(replaced);
        for its in handed_over {
            its.wake();
        }
        blocked
    }

    /// Leave `key`'s line (gone to the inner service, or given up), and wake
    /// the first waiter behind that waits for others.
    pub(crate) fn leave(&self, key: KeyHash, turn: u64) {
        let shard = self.shard(key);
        let (next, _removed) = {
            let mut queues = shard.queues.lock();
            let Some(line) = queues.keys.get_mut(&key.0) else {
                return;
            };
            let removed = line.places.remove(&turn);
            if removed.is_some() {
                shard.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            let next = line
                .places
                .range_mut(turn..)
                .find_map(|(_, place)| place.waker.take());
            if line.places.is_empty() {
                // The floor goes with the line: every waiter it held back
                // newcomers for has gone.
                queues.keys.remove(&key.0);
                // Memory back after a flood of waiting keys.
                let len = queues.keys.len();
                if queues.keys.capacity() > 4 * len.max(16) {
                    queues.keys.shrink_to(2 * len);
                }
            }
            (next, removed)
        };
        // Woken, and the removed place dropped, outside the lock.
        if let Some(next) = next {
            next.wake();
        }
    }

    /// How many keys have a line now.
    #[cfg(any(test, loom))]
    pub(crate) fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.queues.lock().keys.len()).sum()
    }

    /// How many wait, as the shards count them.
    #[cfg(any(test, loom))]
    pub(crate) fn waiting(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.waiting.load(Ordering::SeqCst))
            .sum()
    }
}

impl Shard {
    fn enqueue(&self, queues: &mut Queues, key: KeyHash, at: Nanos, due: Instant) -> u64 {
        let turn = queues.next_turn;
        queues.next_turn += 1;
        let place = Place {
            at,
            due,
            waker: None,
        };
        queues
            .keys
            .entry(key.0)
            .or_default()
            .places
            .insert(turn, place);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        turn
    }

    #[cold]
    fn join_if_due(&self, key: KeyHash, now: Nanos, due: Instant) -> Option<u64> {
        let mut queues = self.queues.lock();
        let ahead =
            queues.keys.get(&key.0)?.places.values().any(|place| {
                place.due <= due && (due < place.due + GRACE || place.waker.is_some())
            });
        ahead.then(|| self.enqueue(&mut queues, key, now, due))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_way_to_those_ahead_and_leaving_wakes_it() {
        let lines = Lines::default();
        let (a, b) = (KeyHash(1), KeyHash(2 << 40));
        let now = Instant::now();
        let first = lines.join(a, 0, now);
        let second = lines.join(a, 0, now);
        let other = lines.join(b, 0, now);
        let woken = Arc::new(Count::default());
        let waker = Waker::from(woken.clone());
        // Another key's line is its own.
        assert_eq!(lines.check(b, other, &waker), None);
        assert_eq!(lines.check(a, second, &waker), Some(now + GRACE));
        assert_eq!(lines.check(a, first, &waker), None);
        lines.leave(a, first);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert_eq!(lines.check(a, second, &waker), None);
        lines.leave(a, second);
        lines.leave(b, other);
        assert_eq!(lines.keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_ahead_that_never_goes_holds_the_line_for_its_grace_only() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let now = Instant::now();
        let _stuck = lines.join(key, 0, now);
        let later = lines.join(key, 0, now + Duration::from_millis(5));
        let waker = Waker::from(Arc::new(Count::default()));
        assert_eq!(lines.check(key, later, &waker), Some(now + GRACE));
        tokio::time::advance(GRACE).await;
        assert_eq!(lines.check(key, later, &waker), None);
    }

    #[test]
    fn lines_empty_out_when_threads_join_and_leave_at_once() {
        // No runtime: tokio's clock is the operating system's here.
        let lines = Arc::new(Lines::default());
        let due = Instant::now();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    let waker = Waker::from(Arc::new(Count::default()));
                    for i in 0..2_000u64 {
                        // Eight keys shared by all threads, over eight shards.
                        let key = KeyHash(((i + t) % 8) << 40);
                        let turn = lines.join(key, 0, due);
                        let _ = lines.check(key, turn, &waker);
                        lines.leave(key, turn);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        assert_eq!(lines.keys(), 0);
        assert!(
            lines
                .shards
                .iter()
                .all(|s| s.waiting.load(Ordering::SeqCst) == 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_its_grace_one_still_polled_goes_first() {
        // `stuck` is never polled; `first` and `second` are due together
        // after it. Once the stuck one's grace is over, `first` (polled, so
        // it left its waker) still goes before `second`.
        let lines = Lines::default();
        let key = KeyHash(1);
        let now = Instant::now();
        let _stuck = lines.join(key, 0, now);
        let first = lines.join(key, 0, now);
        let second = lines.join(key, 0, now);
        let first_woken = Arc::new(Count::default());
        let first_waker = Waker::from(first_woken.clone());
        let waker = Waker::from(Arc::new(Count::default()));
        assert_eq!(lines.check(key, first, &first_waker), Some(now + GRACE));
        tokio::time::advance(GRACE).await;
        let later = Instant::now();
        assert_eq!(lines.check(key, second, &waker), Some(later + HANDOVER));
        assert_eq!(first_woken.0.load(Ordering::SeqCst), 1, "handed over");
        // `first` goes now; had it not polled again, `second` would go
        // after the handover.
        assert_eq!(lines.check(key, first, &first_waker), None);
        tokio::time::advance(HANDOVER).await;
        assert_eq!(lines.check(key, second, &waker), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_does_not_give_way_to_one_due_after_it() {
        // After a reset, a new booking can come due before older waiters.
        let lines = Lines::default();
        let key = KeyHash(1);
        let now = Instant::now();
        let _old = lines.join(key, 0, now + Duration::from_secs(10));
        let new = lines.join(key, 0, now);
        let waker = Waker::from(Arc::new(Count::default()));
        assert_eq!(lines.check(key, new, &waker), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_can_go_joins_only_behind_due_waiters() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let now = Instant::now();
        let ahead = lines.join(key, 0, now + Duration::from_secs(1));
        // Not yet due: the request goes.
        assert_eq!(lines.join_if_due(key, 0, Instant::now()), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        let behind = lines
            .join_if_due(key, 0, Instant::now())
            .expect("joins behind a due waiter");
        let waker = Waker::from(Arc::new(Count::default()));
        assert!(lines.check(key, behind, &waker).is_some());
        lines.leave(key, ahead);
        assert_eq!(lines.check(key, behind, &waker), None);
        lines.leave(key, behind);
        assert_eq!(lines.keys(), 0);
        assert_eq!(lines.join_if_due(KeyHash(7), 0, Instant::now()), None);
    }

    // Floors, shards and memory: each test below pins what a mutant of
    // `cargo mutants` changed and no test outside this module saw (see
    // TESTING.md).

    const FAR: Nanos = u64::MAX / 2;

    #[test]
    fn a_floor_only_rises_while_its_line_lives() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let due = Instant::now();
        let _first = lines.join(key, 10, due);
        let last = lines.join(key, 20, due);
        assert_eq!(lines.hold_back(0), vec![(key, 20, true)]);
        // The waiter the floor was set for leaves; the line lives on.
        lines.leave(key, last);
        assert_eq!(lines.hold_back(5), vec![(key, 20, false)]);
        assert_eq!(lines.floor(key, 5, FAR), 20);
    }

    #[test]
    fn a_floor_reached_holds_nothing_back() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let _waiter = lines.join(key, 10, Instant::now());
        assert_eq!(lines.hold_back(0), vec![(key, 10, true)]);
        // At its floor's instant the waiter is due, not yet gone: its
        // floor no longer holds anyone back.
        assert_eq!(lines.hold_back(10), vec![]);
    }

    #[test]
    fn a_retuned_key_gets_its_floor() {
        let lines = Lines::default();
        let (key, other) = (KeyHash(1), KeyHash(2));
        let _waiter = lines.join(key, 10, Instant::now());
        lines.hold_back_key(key, 0);
        assert_eq!(lines.floor(key, 5, FAR), 10);
        // A floor beyond the horizon is taken for a clock run backwards.
        assert_eq!(lines.floor(key, 5, 4), 0);
        // A key without waiters gets none, and nothing is set at `now`.
        lines.hold_back_key(other, 0);
        assert_eq!(lines.floor(other, 5, FAR), 0);
        lines.hold_back_key(key, 10);
        assert_eq!(lines.floor(key, 5, FAR), 10);
    }

    #[test]
    fn a_reset_of_every_key_lifts_every_floor() {
        let lines = Lines::default();
        let (a, b) = (KeyHash(1), KeyHash(3 << 40));
        let due = Instant::now();
        let _a = lines.join(a, 10, due);
        let _b = lines.join(b, 30, due);
        assert_eq!(lines.hold_back(0).len(), 2);
        lines.lift_all();
        assert_eq!((lines.floor(a, 5, FAR), lines.floor(b, 5, FAR)), (0, 0));
        // Waiters booked before the reset give a later retune no floor.
        assert_eq!(lines.hold_back(1), vec![]);
        let _late = lines.join(a, 40, due);
        assert_eq!(lines.hold_back(2), vec![(a, 40, true)]);
    }

    #[test]
    fn keys_spread_over_the_shards_by_their_high_bits() {
        let lines = Lines::default();
        let due = Instant::now();
        for shard in 0..SHARDS as u64 {
            let _ = lines.join(KeyHash(shard << 40), 10, due);
        }
        assert_eq!((lines.keys(), lines.waiting()), (SHARDS, SHARDS));
        assert!(
            lines
                .shards
                .iter()
                .all(|s| s.waiting.load(Ordering::SeqCst) == 1)
        );
    }

    #[test]
    fn a_flood_of_keys_gives_its_memory_back_as_lines_empty() {
        let lines = Lines::default();
        let due = Instant::now();
        let key = |i: u64| KeyHash(i << 1);
        let turns: Vec<u64> = (0..4_000).map(|i| lines.join(key(i), 10, due)).collect();
        let capacity = |lines: &Lines| {
            lines
                .shards
                .iter()
                .map(|s| s.queues.lock().keys.capacity())
                .sum::<usize>()
        };
        assert!(capacity(&lines) >= 4_000);
        for (i, turn) in (0..).zip(turns) {
            lines.leave(key(i), turn);
        }
        assert_eq!(lines.keys(), 0);
        // Each shard shrinks as its lines empty, down to a few entries.
        assert!(capacity(&lines) <= SHARDS * 64, "{}", capacity(&lines));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_joins_behind_a_due_waiter_only_within_its_grace() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let due = Instant::now();
        let _waiter = lines.join(key, 0, due);
        assert_eq!(lines.join_if_due(key, 0, due + GRACE), None);
        let just_in = due + GRACE - Duration::from_nanos(1);
        assert!(lines.join_if_due(key, 0, just_in).is_some());
    }
}
