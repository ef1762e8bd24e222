//! Changing the limit of running permits, and switching them off and on:
//! every key's limit is set under its lock, and waiters granted what a
//! larger limit frees, oldest first.

use std::sync::atomic::Ordering;

use super::{KeyState, MAX_PERMITS, OUT, Permits, QUEUED};

impl KeyState {
    /// Let at most `max` permits out from now on. Fewer than before: the
    /// requests in flight keep theirs, and waiters wait until fewer than
    /// `max` are out. More: waiters get the new permits at once, oldest
    /// first.
    pub(super) fn set_max(&self, max: u64) {
        let mut woken = Vec::new();
        let mut queue = self.queue.lock();
        self.max.store(max, Ordering::Relaxed);
        // While requests wait the word changes only under this lock: taking
        // and giving back permits both go the locked way.
        let mut word = self.carry(&mut queue);
        while word & QUEUED != 0 && word & OUT < max {
            let Some(next) = queue.waiters.pop_next() else {
                break;
            };
            self.last_lane.store(next.lane, Ordering::Relaxed);
            if self.counts_itself() {
                queue.granted += 1;
            }
            word = self.word.fetch_add(1, Ordering::AcqRel) + 1;
            if queue.waiters.is_empty() {
                word = self.word.fetch_and(!QUEUED, Ordering::Release) & !QUEUED;
            }
            woken.extend(next.waker);
        }
        drop(queue);
        for waker in woken {
            waker.wake();
        }
    }
}

impl Permits {
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// What each key may have out: the configured number, or, switched
    /// off, as many as the word counts. Switching off is a limit no
    /// request reaches rather than a check on every request: the request
    /// path stays as it is, requests in flight stay counted, and back on
    /// every key continues from what it has out.
    pub(super) fn limit(&self) -> u64 {
        if self.is_enabled() {
            self.max() as u64
        } else {
            MAX_PERMITS as u64
        }
    }

    /// Let `max` requests per key in flight (at least 1, at most
    /// `u32::MAX`).
    pub(crate) fn set_max(&self, max: usize) {
        let _one_at_a_time = self.changing.lock();
        self.max.store(max.clamp(1, MAX_PERMITS), Ordering::Release);
        self.apply();
    }

    /// Switch the limit on or off.
    pub(crate) fn set_enabled(&self, enabled: bool) {
        let _one_at_a_time = self.changing.lock();
        self.enabled.store(enabled, Ordering::Release);
        self.apply();
    }

    /// Give every key the limit now in force. A key made meanwhile reads
    /// it when made, under its shard's lock, which this takes after it:
    /// it is made with the new limit, or before this reaches its shard.
    fn apply(&self) {
        let limit = self.limit();
        self.single.set_max(limit);
        self.store.for_each(|slot| {
            if let Some(state) = &slot.0 {
                state.set_max(limit);
            }
        });
        tracing::debug!(
            max_in_flight = self.max(),
            enabled = self.is_enabled(),
            "concurrency retuned"
        );
    }
}
