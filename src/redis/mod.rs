//! Shared state in Redis (feature `redis`): one limit across every replica.
//!
//! With state in the process, N replicas of a server or gateway admit N
//! times the limit, and a 429 one replica receives does not slow the others.
//! A [`RedisStore`] keeps the state in Redis instead:
//!
//! - [`RateLimitLayer::with_store`](crate::rate_limit::RateLimitLayer::with_store):
//!   every quota of a key is judged by one Lua script, atomically, in one
//!   round trip (`EVALSHA`, loaded again by itself after `NOSCRIPT`), on
//!   Redis's clock (`TIME`), so replicas with skewed clocks agree. Every
//!   algorithm works as in process, with the same arithmetic, in
//!   microseconds: exact `retry_after`, several quotas with nothing taken
//!   when one refuses, costs above one, rules, dry run, retune, the
//!   switch. Waiters book their instant in Redis, so admissions across
//!   replicas never pass the limit; each replica lets its own waiters go in
//!   the order of their instants.
//! - [`Backoff429Layer::with_store`](crate::backoff::Backoff429Layer::with_store):
//!   a 429 (or 503) one replica sees starts the route's cooldown for all.
//! - [`RedisStore::put_note`] and [`RedisStore::notes`]: short notes on a
//!   board every replica reads, for what one replica learned that the
//!   others should act on (the example gateway shares the limits its
//!   providers state this way).
//!
//! # Key names
//!
//! `prefix{hash}:…`: a keyed 128-bit hash of the key's parts, never its
//! text (see [`RedisStore::with_hash_key`]), between braces so that every
//! state of one key lands in one Redis Cluster slot. Every Redis key gets a
//! TTL a second past the moment its state says nothing a fresh one would
//! not (a sliding window's, one to two seconds: it is set ahead, so that a
//! busy key sets it about once a second), so memory stays bounded with no
//! sweeper.
//!
//! # When Redis is away
//!
//! Every call has a timeout (default 50 ms). Until Redis answers again, a
//! layer fails open (the default: each replica applies the same quotas in
//! process, or admits everything) or closed (refuses with
//! [`StoreUnavailable`](crate::error::StoreUnavailable), a 503); see
//! [`OnError`]. After 3 calls in a row get no answer, a circuit breaker
//! stops asking: every request is decided by the fail mode at once instead
//! of waiting for the timeout, and one call probes Redis after a quarter
//! second (then after twice as long, at most a second) until it answers.
//! A breaker opened by timeouts also drops the connection, since one whose
//! peer vanished (a failover, a partition) may never fail by itself; TCP
//! keepalive finds such peers too. One log line says an outage began and
//! one that it ended (an intermittent timeout logs nothing); Redis
//! answering with an error (`OOM`, `WRONGTYPE`, ...) or with a reply no
//! script of this version gives is logged as that, once until it answers
//! normally. The stats count failed calls and the decisions made without
//! Redis ([`StoreStats`](crate::stats::StoreStats)). The connection
//! reconnects by itself, with backoff. A key Redis refused is refused
//! locally for at most a second, so a flood of refused requests costs one
//! round trip a second. A call that timed out may still have booked in
//! Redis: that capacity stays spent, the safe side.
//!
//! # What the Redis server must be
//!
//! - **Version:** 6.0 or later (the scripts use `SET ... KEEPTTL`); the
//!   tests run Redis 7.0. A Cluster works too
//!   ([`RedisStore::cluster`]): every state of one key shares a hash tag.
//! - **ACL:** a user of its own needs the scripts' calls and the commands
//!   inside them, on the store's prefix only:
//!   `+evalsha +script|load +get +set +del +unlink +exists +hmget +hset
//!   +hexists +hlen +hgetall +hdel +pttl +pexpire +time +zadd +zcount +zrange +zrangebyscore +zrevrange
//!   +zrevrangebyscore +zrem +zremrangebyrank +zscore ~PREFIX*`
//!   (`+cluster|slots` as well on a Cluster).
//! - **Memory:** `maxmemory-policy noeviction`, or a Redis (or database)
//!   the store has to itself. Every state has a TTL, so a `volatile-*`
//!   policy may evict them: an evicted state is a key that spent nothing,
//!   a quota handed out again. The scripts never make that worse: every
//!   state is one key (a sliding window's bookings and their sums in one
//!   sorted set), evicted whole or not at all, and none is left without a
//!   TTL. Under `noeviction` a
//!   full Redis answers writes with `OOM`: logged as such, and decided by
//!   the fail mode.
//!
//! # What differs from in process
//!
//! - A sliding window is kept exactly, booking by booking, up to a limit:
//!   [`RedisStore::MOST_SLIDING_REQUESTS`] (10,000) for one counting
//!   requests, whose bookings Redis counts by itself in O(log n) per call,
//!   and [`RedisStore::MOST_SLIDING_COST`] (150) for one counting cost,
//!   whose bookings are read one by one. Redis runs one script at a time,
//!   so this keeps every call of every key well under a millisecond of
//!   Redis time (`tests/redis_slow_log.rs`). A larger window is a
//!   [`ConfigError`](crate::error::ConfigError) naming both and offering
//!   the [sliding window counter](crate::rate_limit::Algorithm::SlidingWindowCounter)
//!   by name, never an approximation nobody asked for; a token bucket and
//!   a sliding window counter keep any limit in one value.
//! - Stats count per replica: each replica's handle sees its own requests.
//! - A token bucket whose arrival time is more than a burst ahead (waiters
//!   booked, or a debt a [`Settlement`](crate::rate_limit::Settlement)
//!   charged) keeps a give-back spent: Redis cannot tell that debt from
//!   waiters booked ahead on another replica, whom a give-back could let a
//!   newcomer overtake. In process only waiters do.
//! - A waiter that is dropped, and an admission whose outcome does not
//!   count ([`count_only`](crate::rate_limit::RateLimitLayer::count_only)),
//!   give their capacity back by a call of their own, after the fact; if
//!   that call fails, the capacity stays spent.
//! - A retune converts a quota's state at the key's next request (on every
//!   replica, whichever asks first), without minting capacity, as in
//!   process; a quota that changes algorithm carries what the key had in
//!   use under the old one; a key whose rule changes starts the new rule
//!   spent. Waiters
//!   already booked keep their instants.
//! - [`RateLimitHandle::reset`](crate::rate_limit::RateLimitHandle::reset)
//!   and [`new_turn`](crate::rate_limit::RateLimitHandle::new_turn) delete
//!   the key's state in Redis in a task of their own (they return before
//!   Redis has it). Each replica answers a refused key from its own cache
//!   for at most a second (then asks Redis again), so a reset, a new turn
//!   or a give-back made on another replica is seen everywhere within a
//!   second. [`peek_wait`](crate::rate_limit::RateLimitHandle::peek_wait)
//!   says what this replica's cache of refused keys says (zero otherwise),
//!   and [`key_count`](crate::rate_limit::RateLimitHandle::key_count) and
//!   [`evict_idle`](crate::rate_limit::RateLimitHandle::evict_idle) see
//!   only its in-process fallback's state. A request admitted before a
//!   reset whose outcome then does not count can give a token bucket or a
//!   fixed window back what it had not yet refilled (at most its own
//!   cost), which the state after the reset may have handed out since.
//!
//! ```no_run
//! use tower::ServiceBuilder;
//! use tower_throttle::key::HeaderKey;
//! use tower_throttle::rate_limit::{Quota, RateLimitLayer};
//! use tower_throttle::redis::RedisStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::new("redis://127.0.0.1:6379")?
//!     .with_prefix("myapp:")?
//!     .with_hash_key(std::env::var("RATE_LIMIT_HASH_KEY")?)?;
//! let layer = RateLimitLayer::new(Quota::per_minute(60)?, HeaderKey::new("x-api-key")?)
//!     .with_store(store)?;
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(()))
//!     });
//! # let _ = svc;
//! # Ok(())
//! # }
//! ```

mod breaker;
mod names;
mod notes;
mod store;

pub use notes::Note;

pub use crate::error::OnError;
pub(crate) use store::StoreError;
pub use store::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStore};
