//! What a route whose cooldown is shared through Redis adds to the
//! response future: the read before the request, folded into the table,
//! and the report of what the response said. `no_store.rs` stands in for
//! it in a build without the `redis` feature.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tower_service::Service;

use super::{Reading, State, Waiter, polled_after_completion};
use crate::backoff::cooldown::{Admit, Said, Watch};

/// A route whose cooldown is shared: the store, the route's Redis key, and
/// how long the response may be held for its report (what is left of the
/// store's timeout after the read: a request spends at most one timeout on
/// Redis).
pub(crate) type SharedRoute = Box<(crate::redis::RedisStore, String, Duration)>;

/// What reading a shared route gives.
pub(super) type Read = Result<crate::backoff::redis::SharedCooldown, crate::redis::StoreError>;

/// What a response said, sent to its shared route; `None` when there is
/// nothing to send (no store, or nothing said).
pub(super) fn report(
    said: Option<Said>,
    watch: &Watch,
    route: Option<SharedRoute>,
) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
    let (said, route) = (said?, route?);
    let engine = watch.engine().clone();
    let (key, generation, text) = (watch.key(), watch.shared_generation, watch.text());
    let lengths = engine.lengths();
    let hold = route.2;
    let report = async move {
        let (store, name, _) = *route;
        let reported = crate::backoff::redis::report(
            &store,
            &name,
            generation,
            said,
            &lengths.backoff,
            lengths.max_cooldown,
        )
        .await;
        match reported {
            Ok(shared) => engine.merge_shared(key, shared, &text),
            Err(_) => crate::stats::StoreCounters::add(&engine.store_counters.errors),
        }
    };
    // In a task of its own, so that a caller who drops the response future
    // meanwhile does not keep the other replicas from hearing of it. The
    // response waits for it only as long as the read left of the timeout:
    // with Redis stalled, a read and a report would take two.
    Some(match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(report);
            Box::pin(async move {
                let _ = tokio::time::timeout(hold, task).await;
            })
        }
        Err(_) => Box::pin(report),
    })
}

/// The state after the route's shared cooldown was read: as in process,
/// with what Redis said folded in first.
pub(super) fn read_done<Fut, S, R>(reading: &mut Reading<S, R>, read: Read) -> State<Fut, S, R>
where
    Fut: Future,
    S: Service<R, Future = Fut>,
{
    use crate::stats::StoreCounters;

    let engine = reading.engine.clone();
    match read {
        Ok(shared) => engine.merge_shared(reading.key, shared, &reading.text),
        Err(_) => {
            StoreCounters::add(&engine.store_counters.errors);
            let closed = engine
                .store
                .as_ref()
                .is_some_and(|s| s.error_mode() == crate::redis::OnError::Closed);
            if closed {
                let error = crate::error::StoreUnavailable::new(reading.text.to_string());
                return State::Failed {
                    error: Some(Box::new(error)),
                };
            }
            // Open: this replica's own cooldowns.
            StoreCounters::add(&engine.store_counters.fallbacks);
        }
    }
    let (Some(mut inner), Some(req)) = (reading.inner.take(), reading.req.take()) else {
        return State::Failed {
            error: Some(polled_after_completion()),
        };
    };
    let text = reading.text.clone();
    let spent = reading.started.elapsed();
    let route = reading.route.take().map(|mut route| {
        route.2 = route.0.timeout().saturating_sub(spent);
        route
    });
    match engine.admit(reading.key, reading.max_wait, &|| text.clone()) {
        Admit::Go(watch) => State::Called {
            future: inner.call(req),
            watch: Some(watch),
            route,
        },
        Admit::Wait(slot, head) => State::Waiting {
            waiter: Box::new(Waiter {
                inner,
                req: Some(req),
                slot,
                route,
                head,
                sleep: None,
            }),
        },
        Admit::Refused(error) => State::Failed {
            error: Some(Box::new(error)),
        },
    }
}
