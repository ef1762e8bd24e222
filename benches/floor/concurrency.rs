//! The least a keyed concurrency layer can do per request, written out by
//! hand as a yardstick for the concurrency bench: extract the key (the
//! header lookup and a seeded hash), count the request in under one
//! uncontended lock on a hash map, and count it out under the same lock
//! when its response future completes (where tower's `ConcurrencyLimit`
//! gives its permit back), with errors as `BoxError`. No queue, no
//! fairness, no eviction, no statistics, no permit held until the body
//! ends: what a real layer adds over this is what its features cost.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, Request};
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tower::{BoxError, Service};

use super::{FloorFuture, Identity};

struct Counts {
    max: usize,
    header: HeaderName,
    seed: foldhash::fast::RandomState,
    in_flight: Mutex<HashMap<u64, usize, BuildHasherDefault<Identity>>>,
}

/// A service whose requests are limited to `max` in flight per value of
/// one header.
#[derive(Clone)]
pub struct KeyedFloor<S> {
    inner: S,
    counts: Arc<Counts>,
}

impl<S> KeyedFloor<S> {
    pub fn new(inner: S, header: HeaderName, max: usize) -> Self {
        Self {
            inner,
            counts: Arc::new(Counts {
                max,
                header,
                seed: foldhash::fast::RandomState::default(),
                in_flight: Mutex::new(HashMap::default()),
            }),
        }
    }
}

/// One request counted in on its key; counted out when dropped.
struct Permit {
    counts: Arc<Counts>,
    key: u64,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(n) = self.counts.in_flight.lock().get_mut(&self.key) {
            *n -= 1;
        }
    }
}

impl<S, B> Service<Request<B>> for KeyedFloor<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = FloorFuture<Holding<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(value) = req.headers().get(&self.counts.header) else {
            return FloorFuture::Failed {
                error: Some("no key".into()),
            };
        };
        let key = self.counts.seed.hash_one(value.as_bytes());
        {
            let mut in_flight = self.counts.in_flight.lock();
            let n = in_flight.entry(key).or_insert(0);
            if *n >= self.counts.max {
                return FloorFuture::Failed {
                    error: Some("too many in flight".into()),
                };
            }
            *n += 1;
        }
        let permit = Permit {
            counts: self.counts.clone(),
            key,
        };
        FloorFuture::Called {
            future: Holding {
                future: self.inner.call(req),
                permit: Some(permit),
            },
        }
    }
}

pin_project! {
    /// The inner future, and the permit it gives back as it completes.
    pub struct Holding<F> {
        #[pin]
        future: F,
        permit: Option<Permit>,
    }
}

impl<F: Future> Future for Holding<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.future.poll(cx));
        drop(this.permit.take());
        Poll::Ready(out)
    }
}
