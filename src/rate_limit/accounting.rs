//! What a request costs, and whether its outcome counts.

use http::StatusCode;

use super::limiter::RateLimitInfo;
use super::settlement::Settlement;
use crate::parts::{RequestParts, ResponseParts};

/// What one request costs against its key's quota.
///
/// Implemented for closures `Fn(&R) -> u32`, e.g. the estimated tokens of an
/// LLM request for a tokens-per-minute limit. A cost of 0 is counted as 1, so
/// that nothing slips past a key that is full; a cost above the key's burst is
/// refused with [`CostTooHigh`](crate::error::CostTooHigh).
pub trait Cost<R>: Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &R) -> u32;

    /// Where `req`'s cost is settled once its real cost is known, if it is
    /// to be (see [`Estimated`]). None by default: the cost stands.
    #[inline]
    fn settlement(&self, _req: &R) -> Option<Settlement> {
        None
    }
}

/// A cost that is an estimate, settled once the real cost is known: a
/// request carrying a [`Settlement`] in its extensions gets it armed when it
/// is sent (see [`Settlement`] for what settling does).
///
/// For request types with extensions (`http::Request`; `reqwest::Request`
/// has none, so its estimate stands); a request without a settlement is
/// charged its estimate for good.
#[derive(Clone, Copy, Debug, Default)]
pub struct Estimated<F>(pub F);

impl<R, F> Cost<R> for Estimated<F>
where
    R: RequestParts,
    F: Cost<R>,
{
    #[inline]
    fn cost(&self, req: &R) -> u32 {
        self.0.cost(req)
    }

    fn settlement(&self, req: &R) -> Option<Settlement> {
        req.extensions()?.get::<Settlement>().cloned()
    }
}

/// Every request costs one unit (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct OneUnit;

impl<R> Cost<R> for OneUnit {
    #[inline]
    fn cost(&self, _req: &R) -> u32 {
        1
    }
}

impl<R, F> Cost<R> for F
where
    F: Fn(&R) -> u32 + Send + Sync + 'static,
{
    fn cost(&self, req: &R) -> u32 {
        self(req)
    }
}

/// Whether an admitted request's outcome counts against the quota.
///
/// Implemented for closures `Fn(&Result<Res, E>) -> bool`. When it answers
/// `false` the request gives back what it took, also when later requests
/// were admitted on the key meanwhile, as far as that never lets more
/// through than the quota:
///
/// - a token bucket gets back only what has not refilled since the request
///   went (an answer slower than the refill gives back less, or nothing:
///   those units came back by themselves, and later requests took them);
/// - a window gets back the request's slot in the window it was counted
///   in, a turn budget its unit in the turn it was taken from (a later
///   window or turn has its own);
/// - nothing comes back across a [reset](super::RateLimitHandle::reset) or
///   a retune, which already start the key afresh.
///
/// With requests waiting on the key (wait mode), a sliding window's slot is
/// given back exactly (newcomers still go after the waiters); a token
/// bucket's stays spent, since its one number cannot tell how much of it
/// the waiters' bookings already absorbed (with a burst of 1, a waiter
/// booked at the instant the unit comes back has taken it whole), and a
/// newcomer may not go before them.
pub trait Counts<Res, E>: Clone + Send + Sync + 'static {
    /// True when this outcome used up quota.
    fn counts(&self, outcome: &Result<Res, E>) -> bool;

    /// True when every outcome counts, so no refund needs tracking.
    #[doc(hidden)]
    fn always(&self) -> bool {
        false
    }
}

/// Every admitted request counts, even when the inner service fails: a failed
/// provider call was still counted upstream (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct CountAll;

impl<Res, E> Counts<Res, E> for CountAll {
    #[inline]
    fn counts(&self, _outcome: &Result<Res, E>) -> bool {
        true
    }

    #[inline]
    fn always(&self) -> bool {
        true
    }
}

/// Counts everything but a response that refuses the request so that the
/// caller may retry it: `429 Too Many Requests` and `503 Service Unavailable`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountUnlessRefused;

impl<Res: ResponseParts, E> Counts<Res, E> for CountUnlessRefused {
    fn counts(&self, outcome: &Result<Res, E>) -> bool {
        !matches!(
            outcome,
            Ok(res) if matches!(
                res.status(),
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            )
        )
    }
}

impl<Res, E, F> Counts<Res, E> for F
where
    F: Fn(&Result<Res, E>) -> bool + Clone + Send + Sync + 'static,
{
    fn counts(&self, outcome: &Result<Res, E>) -> bool {
        self(outcome)
    }
}

/// Writes what remains of a key's quota onto an admitted response, for
/// servers that tell their clients (the `RateLimit` headers).
///
/// [`NoAnnotation`] (the default) writes nothing and costs nothing;
/// [`RateLimitHeaders`](crate::respond::RateLimitHeaders) writes the
/// headers.
pub trait Annotate<Res>: Clone + Send + Sync + 'static {
    /// Annotate `response` with `info`.
    fn annotate(&self, response: &mut Res, info: &RateLimitInfo);

    /// False when nothing is ever written, so nothing need be computed.
    #[doc(hidden)]
    fn wanted(&self) -> bool {
        true
    }
}

/// Writes nothing on admitted responses (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoAnnotation;

impl<Res> Annotate<Res> for NoAnnotation {
    #[inline]
    fn annotate(&self, _response: &mut Res, _info: &RateLimitInfo) {}

    #[inline]
    fn wanted(&self) -> bool {
        false
    }
}
