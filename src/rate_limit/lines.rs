//! The order in which waiters of one key reach the inner service.
//!
//! Each waiter sleeps until its own instant, but several waiters can be due
//! at one instant (a fixed window opening, or turns closer together than the
//! timer's millisecond), and tokio does not promise in which order timers
//! due together wake their tasks. So a waiter joins its key's line when its
//! capacity is booked, under the key's lock, which makes the line's order
//! the booking order; once its instant has come it goes only from the head
//! of the line, and whoever leaves the head wakes the next. A request that
//! could go at once while its key has waiters (their instant has come, but
//! their tasks have not run yet) joins the line too, rather than pass them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;

use parking_lot::Mutex;

use crate::key::KeyHash;

/// The lines of every key that has waiters. Only the wait path touches it.
#[derive(Default)]
pub(crate) struct Lines {
    inner: Mutex<Queues>,
    /// How many are in any line: while none are, a request that can go at
    /// once does not look for its key's line.
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Queues {
    /// Handed out in booking order.
    next_turn: u64,
    /// Per key, the waiters in line by turn, with the waker of one that
    /// found it was not yet at the head.
    keys: HashMap<u64, BTreeMap<u64, Option<Waker>>>,
}

impl Lines {
    /// Join `key`'s line; the caller holds the key's state, so that turns
    /// follow bookings.
    pub(crate) fn join(&self, key: KeyHash) -> u64 {
        let mut queues = self.inner.lock();
        self.enqueue(&mut queues, key)
    }

    fn enqueue(&self, queues: &mut Queues, key: KeyHash) -> u64 {
        let turn = queues.next_turn;
        queues.next_turn += 1;
        queues.keys.entry(key.0).or_default().insert(turn, None);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        turn
    }

    /// For a request that could go at once: join `key`'s line if it has
    /// one, else nothing. The caller holds the key's state; a waiter of the
    /// key joined under the same lock, so it is counted by now.
    #[inline]
    pub(crate) fn join_if_any(&self, key: KeyHash) -> Option<u64> {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.join_behind(key)
    }

    #[cold]
    fn join_behind(&self, key: KeyHash) -> Option<u64> {
        let mut queues = self.inner.lock();
        if !queues.keys.contains_key(&key.0) {
            return None;
        }
        Some(self.enqueue(&mut queues, key))
    }

    /// Whether `turn` heads `key`'s line; if not, `waker` is woken when the
    /// waiters ahead have left.
    pub(crate) fn is_head(&self, key: KeyHash, turn: u64, waker: &Waker) -> bool {
        let mut queues = self.inner.lock();
        let Some(line) = queues.keys.get_mut(&key.0) else {
            // Not in line (it never joined): nothing to wait for.
            return true;
        };
        if line.keys().next().is_none_or(|&head| head == turn) {
            return true;
        }
        if let Some(slot) = line.get_mut(&turn) {
            match slot {
                Some(kept) if kept.will_wake(waker) => {}
                _ => *slot = Some(waker.clone()),
            }
        }
        false
    }

    /// Leave `key`'s line (gone to the inner service, or given up), and wake
    /// the new head if it was waiting for this.
    pub(crate) fn leave(&self, key: KeyHash, turn: u64) {
        let next = {
            let mut queues = self.inner.lock();
            let Some(line) = queues.keys.get_mut(&key.0) else {
                return;
            };
            let was_head = line.keys().next() == Some(&turn);
            if line.remove(&turn).is_some() {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            let next = if was_head {
                line.values_mut().next().and_then(Option::take)
            } else {
                None
            };
            if line.is_empty() {
                queues.keys.remove(&key.0);
            }
            next
        };
        // Woken outside the lock.
        if let Some(next) = next {
            next.wake();
        }
    }

    /// How many keys have a line now.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.inner.lock().keys.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn only_the_head_goes_and_leaving_wakes_the_next() {
        let lines = Lines::default();
        let (a, b) = (KeyHash(1), KeyHash(2));
        let first = lines.join(a);
        let second = lines.join(a);
        let other = lines.join(b);
        let woken = Arc::new(Count::default());
        let waker = Waker::from(woken.clone());
        // Another key's line is its own.
        assert!(lines.is_head(b, other, &waker));
        assert!(!lines.is_head(a, second, &waker));
        assert!(lines.is_head(a, first, &waker));
        lines.leave(a, first);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(lines.is_head(a, second, &waker));
        lines.leave(a, second);
        lines.leave(b, other);
        assert_eq!(lines.keys(), 0);
    }

    #[test]
    fn a_waiter_giving_up_behind_the_head_wakes_nobody() {
        let lines = Lines::default();
        let key = KeyHash(1);
        let (first, second, third) = (lines.join(key), lines.join(key), lines.join(key));
        let woken = Arc::new(Count::default());
        let waker = Waker::from(woken.clone());
        assert!(!lines.is_head(key, third, &waker));
        lines.leave(key, second);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        lines.leave(key, first);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(lines.is_head(key, third, &waker));
    }
}
