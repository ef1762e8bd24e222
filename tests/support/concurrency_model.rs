//! A reference model of `ConcurrencyLayer`, written for clarity, not speed:
//! per key a count of requests in flight and a FIFO list of waiters with the
//! instant each arrived; per request the stage it is in. Time is whole
//! milliseconds since the start of the history.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeSet, VecDeque};

/// Body frames each answer has; its permit goes back after the last one
/// (when the body says it ended) or at the poll after it (when it does not).
pub const FRAMES: u8 = 2;

/// What the layer is built with.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub max: usize,
    /// `None`: unbounded.
    pub max_queue: Option<usize>,
    /// `None`: wait without limit.
    pub timeout_ms: Option<u64>,
}

/// Where a request is, as a caller can see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// In its key's queue.
    Waiting,
    /// Holds a permit; the upstream has not answered yet.
    Calling,
    /// Answered; its body holds the permit, or has given it back.
    Body { holds: bool },
    /// Refused at once: the queue was full.
    Full,
    /// Gave up waiting after this long.
    TimedOut { waited_ms: u64 },
    /// The upstream failed it (the permit went back at once).
    Failed,
    /// The caller dropped it (future or body).
    Dropped,
}

/// One request, as the model sees it.
#[derive(Clone, Debug)]
pub struct Req {
    pub key: usize,
    /// The upstream answers only when told to (else at once).
    pub slow: bool,
    /// The upstream fails it instead of answering.
    pub fails: bool,
    /// Its body says it ended with its last frame.
    pub knows_end: bool,
    pub seen: Seen,
    /// Frames read from its body.
    pub read: u8,
}

#[derive(Clone, Debug, Default)]
pub struct Key {
    pub in_flight: usize,
    /// Oldest first: request id and arrival (ms).
    pub waiters: VecDeque<(usize, u64)>,
    /// More than the limit may be in flight only after the limit was
    /// lowered under them: at most this many (shrinks as they finish).
    pub over: usize,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    pub max: usize,
    pub enabled: bool,
    pub now: u64,
    pub keys: Vec<Key>,
    pub reqs: Vec<Req>,
    /// Keys with state in the layer's store, and the key its one service
    /// remembers (neither is used for a `GlobalKey` layer).
    pub stored: BTreeSet<usize>,
    pub last: Option<usize>,
    pub admitted: u64,
    pub rejected: u64,
    pub waited: u64,
    pub total_wait_ms: u64,
}

impl Model {
    pub fn new(config: Config, keys: usize) -> Self {
        Self {
            config,
            max: config.max,
            enabled: true,
            now: 0,
            keys: vec![Key::default(); keys],
            reqs: Vec::new(),
            stored: BTreeSet::new(),
            last: None,
            admitted: 0,
            rejected: 0,
            waited: 0,
            total_wait_ms: 0,
        }
    }

    /// Permits per key now: switched off, no limit.
    pub fn limit(&self) -> usize {
        if self.enabled { self.max } else { usize::MAX }
    }

    /// A new request on `key`; its id.
    pub fn start(&mut self, key: usize, slow: bool, fails: bool, knows_end: bool) -> usize {
        let id = self.reqs.len();
        self.reqs.push(Req {
            key,
            slow,
            fails,
            knows_end,
            seen: Seen::Waiting,
            read: 0,
        });
        self.stored.insert(key);
        self.last = Some(key);
        let limit = self.limit();
        let k = &self.keys[key];
        if k.waiters.is_empty() && k.in_flight < limit {
            self.grant(id);
        } else if self.config.timeout_ms == Some(0) {
            // A zero timeout: nobody waits; refused as timed out.
            self.rejected += 1;
            self.reqs[id].seen = Seen::TimedOut { waited_ms: 0 };
        } else if self
            .config
            .max_queue
            .is_some_and(|max| k.waiters.len() >= max)
        {
            self.rejected += 1;
            self.reqs[id].seen = Seen::Full;
        } else {
            let now = self.now;
            self.keys[key].waiters.push_back((id, now));
        }
        id
    }

    /// `id` takes a permit and goes to the upstream.
    fn grant(&mut self, id: usize) {
        let key = self.reqs[id].key;
        self.keys[key].in_flight += 1;
        self.admitted += 1;
        let req = &mut self.reqs[id];
        req.seen = if req.slow {
            Seen::Calling
        } else if req.fails {
            Seen::Failed
        } else {
            Seen::Body { holds: true }
        };
        if req.seen == Seen::Failed {
            self.release(key);
        }
    }

    /// A permit of `key` goes back: to the oldest waiters while the limit
    /// allows.
    fn release(&mut self, key: usize) {
        let k = &mut self.keys[key];
        k.in_flight -= 1;
        k.over = k.over.min(k.in_flight);
        self.pump(key);
    }

    /// Grant waiters of `key`, oldest first, while permits are free.
    fn pump(&mut self, key: usize) {
        while self.keys[key].in_flight < self.limit() {
            let Some((id, at)) = self.keys[key].waiters.pop_front() else {
                break;
            };
            self.waited += 1;
            self.total_wait_ms += self.now - at;
            self.grant(id);
        }
    }

    /// Requests whose stage `want` accepts, by id.
    pub fn ids(&self, want: impl Fn(Seen) -> bool) -> Vec<usize> {
        (0..self.reqs.len())
            .filter(|&id| want(self.reqs[id].seen))
            .collect()
    }

    /// The upstream answers `id` (which is calling): a body, or a failure.
    pub fn respond(&mut self, id: usize, ok: bool) {
        let key = self.reqs[id].key;
        if ok {
            self.reqs[id].seen = Seen::Body { holds: true };
        } else {
            self.reqs[id].seen = Seen::Failed;
            self.release(key);
        }
    }

    /// The caller reads one more frame of `id`'s body.
    pub fn read_frame(&mut self, id: usize) {
        let req = &mut self.reqs[id];
        req.read = req.read.saturating_add(1);
        let ended = (req.knows_end && req.read == FRAMES) || req.read > FRAMES;
        if ended && req.seen == (Seen::Body { holds: true }) {
            req.seen = Seen::Body { holds: false };
            let key = req.key;
            self.release(key);
        }
    }

    /// The caller drops `id`: its place in the queue, its permit, or its
    /// body.
    pub fn drop_req(&mut self, id: usize) {
        let key = self.reqs[id].key;
        let seen = std::mem::replace(&mut self.reqs[id].seen, Seen::Dropped);
        match seen {
            Seen::Waiting => self.keys[key].waiters.retain(|&(w, _)| w != id),
            Seen::Calling | Seen::Body { holds: true } => self.release(key),
            _ => {}
        }
    }

    /// Time passes: waiters whose timeout is reached give up.
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
        let Some(timeout) = self.config.timeout_ms else {
            return;
        };
        let now = self.now;
        for key in 0..self.keys.len() {
            let (gone, kept) = self.keys[key]
                .waiters
                .iter()
                .partition(|&&(_, at)| at + timeout <= now);
            self.keys[key].waiters = kept;
            for (id, at) in gone {
                self.rejected += 1;
                self.reqs[id].seen = Seen::TimedOut {
                    waited_ms: now - at,
                };
            }
        }
    }

    /// A new limit, or the limit switched on or off: waiters get what it
    /// frees, oldest first; requests in flight keep their permits.
    pub fn retune(&mut self, max: usize, enabled: bool) {
        self.max = max;
        self.enabled = enabled;
        let limit = self.limit();
        for key in 0..self.keys.len() {
            let k = &mut self.keys[key];
            if k.in_flight > limit {
                k.over = k.over.max(k.in_flight);
            }
            self.pump(key);
        }
    }

    /// Drop idle keys (nothing in flight or waiting, not remembered by the
    /// service); how many.
    pub fn evict(&mut self) -> usize {
        let idle: Vec<usize> = self
            .stored
            .iter()
            .copied()
            .filter(|&k| Some(k) != self.last && self.is_idle(k))
            .collect();
        for k in &idle {
            self.stored.remove(k);
        }
        idle.len()
    }

    pub fn is_idle(&self, key: usize) -> bool {
        self.keys[key].in_flight == 0 && self.keys[key].waiters.is_empty()
    }

    /// Requests in flight on `key` may not pass the limit, unless it was
    /// lowered under them.
    pub fn bound(&self, key: usize) -> usize {
        self.limit().max(self.keys[key].over)
    }
}
