//! `JointRateLimitLayer`: several rate-limit layers judged as one, all or nothing.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::part::Part;
use super::service::JointRateLimit;
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::rate_limit::RateLimitLayer;
use crate::rate_limit::accounting::{Cost, CountAll};

/// Several rate limits, each on its own key, judged as one: a request is
/// admitted only when every limit admits it, and then it is counted in
/// each; when any refuses, nothing is taken from any of them.
///
/// Each limit is a [`RateLimitLayer`] with its own key extractor, quotas,
/// rules, cost, fallback key, [name](RateLimitLayer::with_name),
/// [retry floor](RateLimitLayer::with_retry_floor), switch and dry run, and
/// its own [handle](RateLimitLayer::handle) (take it before handing the
/// layer over): a per-sender turn budget and a per-(sender, receiver)
/// interval, say. Stacking two `RateLimitLayer`s instead would let the
/// outer one count a request the inner one then refuses.
///
/// - **Which refusal is reported.** The limits are judged in the order
///   they were given, and the first that refuses is the one the
///   [`RateLimited`](crate::error::RateLimited) error names (its key, quota,
///   rule and [`limit`](crate::error::RateLimited::limit)). Its
///   `retry_after` is the longest wait of all the limits that refused,
///   each raised to its retry floor: the time until every one of them
///   would admit. A request whose cost exceeds a limit's capacity is
///   refused with [`CostTooHigh`](crate::error::CostTooHigh) before any
///   is judged.
/// - **All or nothing.** The keys' states are held together while the
///   request is judged, locked in a fixed order (by the limiters' places
///   in memory, then their quotas' order), so two joint layers over the same
///   limits in any order cannot deadlock, and no request books in
///   between.
/// - **Reject mode only.** A joint limit refuses at once: waiting in
///   several keys' lines at once is not offered, and a part built
///   [`with_max_wait`](RateLimitLayer::with_max_wait) is an error. The
///   parts' own [`count_only`](RateLimitLayer::count_only) classifiers and
///   response headers are not used: the joint layer settles by its own
///   [`count_only`](Self::count_only), in every limit at once.
/// - **Settling.** With `count_only`, a request whose outcome does not
///   count gives back what it took in every limit (see
///   [`Counts`](crate::rate_limit::Counts)), also when later requests were
///   admitted on the same keys meanwhile.
/// - A limit switched off takes no part (its key is not even read); one in
///   a dry run counts what it would have refused and refuses nothing.
///
/// ```
/// use std::time::Duration;
/// use tower::{Layer, Service, ServiceExt};
/// use tower_throttle::error::RateLimited;
/// use tower_throttle::rate_limit::{JointRateLimitLayer, Quota, RateLimitLayer};
///
/// struct Message { from: String, to: String }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_throttle::error::BoxError> {
/// let sender = |m: &Message| Some(m.from.clone());
/// let receiver = |m: &Message| Some(m.to.clone());
/// // At most 2 messages per sender per turn, and one per (sender,
/// // receiver) pair every 10 s.
/// let fan_out = RateLimitLayer::new(Quota::per_turn(2)?, sender).with_name("fan_out");
/// let pair = RateLimitLayer::new(Quota::new(1, Duration::from_secs(10))?, (sender, receiver))
///     .with_name("pair");
/// let turns = fan_out.handle();
/// let joint = JointRateLimitLayer::new(fan_out)?.and(pair)?;
/// let mut svc = joint.layer(tower::service_fn(|m: Message| async move {
///     Ok::<_, std::convert::Infallible>(m.to)
/// }));
/// let send = |to: &str| Message { from: "a".into(), to: to.into() };
///
/// svc.ready().await?.call(send("b")).await?;
/// // Refused by the pair: nothing is taken from a's turn.
/// let refused = svc.ready().await?.call(send("b")).await.unwrap_err();
/// assert_eq!(refused.downcast_ref::<RateLimited>().unwrap().limit.as_deref(), Some("pair"));
/// svc.ready().await?.call(send("c")).await?;
/// // a's turn is used up: fan-out is judged first, so it is the refusal.
/// let refused = svc.ready().await?.call(send("b")).await.unwrap_err();
/// assert_eq!(refused.downcast_ref::<RateLimited>().unwrap().limit.as_deref(), Some("fan_out"));
/// turns.new_turn(&["a"]);
/// svc.ready().await?.call(send("d")).await?;
/// # Ok(())
/// # }
/// ```
pub struct JointRateLimitLayer<R, A = CountAll> {
    parts: Vec<Arc<dyn Part<R>>>,
    counts: A,
}

impl<R: 'static> JointRateLimitLayer<R> {
    /// A joint limit of `first` alone; add more with [`and`](Self::and).
    /// An error when `first` is in wait mode or keeps its state in a shared
    /// store.
    pub fn new<X, F, A, H>(first: RateLimitLayer<X, F, A, H>) -> Result<Self, ConfigError>
    where
        X: KeyExtractor<R>,
        F: Cost<R>,
        A: Send + Sync + 'static,
        H: Send + Sync + 'static,
    {
        Self {
            parts: Vec::new(),
            counts: CountAll,
        }
        .and(first)
    }
}

impl<R: 'static, A> JointRateLimitLayer<R, A> {
    /// Also hold every request to `next`, judged after the limits given
    /// before it. An error when `next` is in wait mode, keeps its state in a
    /// shared store, or shares its limiter with a limit already given (a
    /// clone of the same layer).
    pub fn and<X, F, A2, H>(
        mut self,
        next: RateLimitLayer<X, F, A2, H>,
    ) -> Result<Self, ConfigError>
    where
        X: KeyExtractor<R>,
        F: Cost<R>,
        A2: Send + Sync + 'static,
        H: Send + Sync + 'static,
    {
        let shared = next.into_shared();
        if shared.max_wait > 0 {
            return Err(ConfigError::new(
                "max_wait",
                "a joint limit refuses at once; build its parts without with_max_wait",
            ));
        }
        // A joint judgement locks every part's key state in one process;
        // a Redis-backed part is judged by a script elsewhere, so the two
        // could not take "all or nothing" together.
        if shared.limiter.remote().is_some() {
            return Err(ConfigError::new(
                "store",
                "a joint limit is judged in process; build its parts without with_store",
            ));
        }
        if self
            .parts
            .iter()
            .any(|p| Arc::ptr_eq(p.limiter(), &shared.limiter))
        {
            return Err(ConfigError::new(
                "limits",
                "the same limiter is given twice (a clone of one RateLimitLayer); \
                 give each limit its own layer",
            ));
        }
        self.parts.push(Arc::new(shared));
        Ok(self)
    }

    /// Count only the requests whose outcome `counts` accepts; the others
    /// give back what they took in every limit (see
    /// [`Counts`](crate::rate_limit::Counts)).
    pub fn count_only<A2>(self, counts: A2) -> JointRateLimitLayer<R, A2> {
        JointRateLimitLayer {
            parts: self.parts,
            counts,
        }
    }
}

impl<S, R, A: Clone> Layer<S> for JointRateLimitLayer<R, A> {
    type Service = JointRateLimit<S, R, A>;

    fn layer(&self, inner: S) -> Self::Service {
        JointRateLimit::new(
            inner,
            self.parts.iter().cloned().collect(),
            self.counts.clone(),
        )
    }
}

impl<R, A: Clone> Clone for JointRateLimitLayer<R, A> {
    fn clone(&self) -> Self {
        Self {
            parts: self.parts.clone(),
            counts: self.counts.clone(),
        }
    }
}

impl<R, A> fmt::Debug for JointRateLimitLayer<R, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.parts.iter().map(|p| p.describe()).collect();
        f.debug_struct("JointRateLimitLayer")
            .field("parts", &parts)
            .field("counts", &std::any::type_name::<A>())
            .finish()
    }
}
