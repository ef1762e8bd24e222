//! `shared.rs` in a build without the `redis` feature: no route is shared,
//! so nothing is read before a request and nothing reported after it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use super::State;
use crate::backoff::cooldown::Watch;

/// Without a store there is no shared route.
pub(crate) type SharedRoute = Infallible;

/// Nor a read of one.
pub(super) type Read = Infallible;

/// Nothing to report: there is no shared route.
pub(super) fn report<T>(
    _said: Option<T>,
    _watch: &Watch,
    _route: Option<SharedRoute>,
) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
    None
}

/// Never called: there is no read to be done with.
pub(super) fn read_done<Fut, S, R>(
    _reading: &mut super::Reading<S, R>,
    read: Read,
) -> State<Fut, S, R>
where
    Fut: Future,
{
    match read {}
}
