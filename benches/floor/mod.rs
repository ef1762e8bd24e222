//! The least a keyed rate-limit layer can do per request, written out by
//! hand as a yardstick for the hot-key bench: extract the key (the header
//! lookup and a seeded hash), read the counter clock once, decide a GCRA
//! step under the cheapest exclusion there is (one atomic compare-and-swap
//! for the single global key; one uncontended lock on a hash map for keyed
//! requests), and wrap the inner future so that errors come out as
//! `BoxError`, as every layer that can refuse must. No sharding, no
//! eviction, no policy, no statistics, no waiting, no retry-after: what a
//! real layer adds over this is what its features cost.
#![allow(dead_code)] // each bench uses its own part

pub mod concurrency;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::{HeaderName, Request};
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tower::{BoxError, Service};

/// Which key the yardstick reads.
#[derive(Clone)]
pub enum FloorKey {
    /// One key for every request.
    Global,
    /// The value of this header.
    Header(HeaderName),
}

/// The keys are already seeded hashes.
#[derive(Default)]
pub struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Limits {
    clock: quanta::Clock,
    origin: u64,
    /// Nanoseconds per unit.
    period: u64,
    /// How far ahead of now a key's theoretical arrival time may be.
    tolerance: u64,
    global: AtomicU64,
    keyed: Mutex<HashMap<u64, u64, BuildHasherDefault<Identity>>>,
    seed: foldhash::fast::RandomState,
}

/// A service limited by the yardstick.
#[derive(Clone)]
pub struct Floor<S> {
    inner: S,
    key: FloorKey,
    limits: Arc<Limits>,
}

impl<S> Floor<S> {
    /// `period` nanoseconds per request, bursts of `burst`.
    pub fn new(inner: S, key: FloorKey, period: u64, burst: u64) -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self {
            inner,
            key,
            limits: Arc::new(Limits {
                clock,
                origin,
                period,
                tolerance: period.saturating_mul(burst.saturating_sub(1)),
                global: AtomicU64::new(0),
                keyed: Mutex::new(HashMap::default()),
                seed: foldhash::fast::RandomState::default(),
            }),
        }
    }
}

impl Limits {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }

    /// One GCRA step: admit when the key's theoretical arrival time is at
    /// most `tolerance` ahead of now.
    #[inline]
    fn step(&self, tat: u64, now: u64) -> Option<u64> {
        let tat = tat.max(now);
        (tat - now <= self.tolerance).then(|| tat.saturating_add(self.period))
    }

    #[inline]
    fn admit_global(&self) -> bool {
        let now = self.now();
        let mut tat = self.global.load(Ordering::Relaxed);
        loop {
            let Some(next) = self.step(tat, now) else {
                return false;
            };
            match self
                .global
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => tat = seen,
            }
        }
    }

    #[inline]
    fn admit_keyed(&self, key: u64) -> bool {
        let mut keyed = self.keyed.lock();
        let now = self.now();
        let tat = keyed.entry(key).or_insert(0);
        match self.step(*tat, now) {
            Some(next) => {
                *tat = next;
                true
            }
            None => false,
        }
    }
}

impl<S, B> Service<Request<B>> for Floor<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let admitted = match &self.key {
            FloorKey::Global => self.limits.admit_global(),
            FloorKey::Header(name) => match req.headers().get(name) {
                Some(value) => {
                    let key = self.limits.seed.hash_one(value.as_bytes());
                    self.limits.admit_keyed(key)
                }
                None => false,
            },
        };
        if admitted {
            FloorFuture::Called {
                future: self.inner.call(req),
            }
        } else {
            FloorFuture::Failed {
                error: Some("rate limited".into()),
            }
        }
    }
}

pin_project! {
    /// The yardstick's response future.
    #[project = FloorFutureProj]
    pub enum FloorFuture<F> {
        Called { #[pin] future: F },
        Failed { error: Option<BoxError> },
    }
}

impl<F, T, E> Future for FloorFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            FloorFutureProj::Called { future } => future.poll(cx).map_err(Into::into),
            FloorFutureProj::Failed { error } => {
                Poll::Ready(Err(error.take().unwrap_or_else(|| "polled again".into())))
            }
        }
    }
}
