//! The connection to Redis shared by every layer given one [`RedisStore`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::io::tcp::{TcpSettings, socket2};
use ::redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Script, Value};
use arc_swap::ArcSwapOption;

use super::breaker::{Breaker, Failed, Pass, TRIP_AFTER};
use super::names::Namer;
use crate::error::OnError;
use crate::error::{ConfigError, StoreCallFailed};
use crate::redact::{Escaped, Quoted};

/// The default [timeout](RedisStore::with_timeout) of every Redis call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The default [prefix](RedisStore::with_prefix) of every key name.
pub const DEFAULT_PREFIX: &str = "tt:";

/// Where layers keep shared state: a Redis server (or a Redis Cluster),
/// reached through one multiplexed connection that reconnects by itself.
///
/// Cheap to clone; clones share the connection. Give it to
/// [`RateLimitLayer::with_store`](crate::rate_limit::RateLimitLayer::with_store)
/// and [`Backoff429Layer::with_store`](crate::backoff::Backoff429Layer::with_store).
/// Building it connects to nothing: the connection is made on the first
/// request, inside the runtime, and made again (with backoff) whenever it
/// drops.
///
/// Two layers of one kind that share a store and a prefix share their
/// state for equal keys: give each its own prefix
/// ([`with_prefix`](Self::with_prefix)).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::redis::{OnError, RedisStore};
///
/// let store = RedisStore::new("redis://127.0.0.1:6379")?
///     .with_prefix("myapp:chat:")?
///     .with_timeout(Duration::from_millis(30))
///     .with_on_error(OnError::Closed)
///     .with_hash_key("a long random secret, the same in every replica")?;
/// # let _ = store;
/// # Ok::<(), tower_throttle::error::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Arc<Connection>,
    pub(crate) prefix: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) on_error: OnError,
    pub(crate) local_fallback: bool,
    pub(crate) names: Namer,
    /// A clock a test sets, in microseconds since the Unix epoch, read by
    /// the scripts instead of Redis's `TIME`.
    test_clock: Option<Arc<AtomicU64>>,
    /// For tests: every admission through `admit.lua`, none through its
    /// short form for one token bucket or one window counting requests.
    whole_script_only: bool,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: the URL may hold a password, and the hash key
        // is a secret.
        f.debug_struct("RedisStore")
            .field("addr", &self.conn.addr)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("local_fallback", &self.local_fallback)
            .field("hash_key", &self.names.is_keyed().then_some("(set)"))
            .finish()
    }
}

impl RedisStore {
    /// The largest limit of a sliding window counting
    /// [requests](crate::rate_limit::Unit::Requests) this store keeps.
    ///
    /// A sliding window keeps each booking (about 100 bytes each), and Redis
    /// runs one script at a time. Bookings of one unit each are counted by
    /// Redis itself, in O(log n) per call, so a window counting requests
    /// costs about the same at any limit; this bounds its memory, about
    /// 1 MB per key at the limit. A larger window is a [`ConfigError`] when
    /// the quota is bound to the store, never an approximation nobody asked
    /// for.
    pub const MOST_SLIDING_REQUESTS: u32 = 10_000;

    /// The largest limit of a sliding window counting
    /// [cost](crate::rate_limit::Unit::Cost) this store keeps.
    ///
    /// Bookings of several units each have to be read one by one to tell
    /// when enough of them have left, so the slowest call grows with the
    /// limit: at this one it costs Redis well under a millisecond
    /// (`tests/redis_slow_log.rs`). A window counting cost with every
    /// request costing one is cheaper, but still held to this: the store
    /// cannot tell. Count requests with
    /// [`Unit::Requests`](crate::rate_limit::Unit::Requests), or cost with
    /// a token bucket (which Redis keeps in one value).
    pub const MOST_SLIDING_COST: u32 = 150;

    /// A store on the Redis server at `url` (`redis://[user:password@]host:port[/db]`,
    /// `rediss://` for TLS where the `redis` crate was built with it,
    /// `unix://` or `redis+unix://` for a socket). A URL that cannot be
    /// parsed is an error; nothing is connected yet.
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        let info = url.into_connection_info().map_err(not_a_url)?;
        let client = Client::open(info.set_tcp_settings(tcp_settings())).map_err(not_a_url)?;
        let addr = client.get_connection_info().addr().to_string();
        Ok(Self {
            conn: Arc::new(Connection {
                target: Target::Single(client),
                conn: ArcSwapOption::empty(),
                making: tokio::sync::Mutex::new(()),
                addr,
                breaker: Breaker::default(),
                erring: AtomicBool::new(false),
            }),
            prefix: Arc::from(DEFAULT_PREFIX),
            timeout: DEFAULT_TIMEOUT,
            on_error: OnError::default(),
            local_fallback: true,
            names: Namer::new(None),
            test_clock: None,
            whole_script_only: false,
        })
    }

    /// A store on a Redis Cluster, found from the nodes at `urls` (one is
    /// enough; more help when one is down). Every state of one key carries
    /// the same hash tag, so each script touches one slot, and the client
    /// routes it to that slot's master, following the cluster as it
    /// changes. A list with no URL, or one that cannot be parsed, is an
    /// error; nothing is connected yet.
    pub fn cluster<S: AsRef<str>>(urls: &[S]) -> Result<Self, ConfigError> {
        let urls: Vec<&str> = urls.iter().map(AsRef::as_ref).collect();
        let Some(&first) = urls.first() else {
            return Err(ConfigError::new(
                "redis_url",
                "a cluster needs a node's URL",
            ));
        };
        let addr = Client::open(first)
            .map(|c| c.get_connection_info().addr().to_string())
            .map_err(not_a_url)?;
        let client = ClusterClientBuilder::new(urls)
            .connection_timeout(Duration::from_secs(1))
            .tcp_settings(tcp_settings())
            .build()
            .map_err(not_a_url)?;
        let mut store = Self::new(first)?;
        store.conn = Arc::new(Connection {
            target: Target::Cluster(client),
            conn: ArcSwapOption::empty(),
            making: tokio::sync::Mutex::new(()),
            addr: format!("cluster at {addr}"),
            breaker: Breaker::default(),
            erring: AtomicBool::new(false),
        });
        Ok(store)
    }

    /// Put `prefix` before every key name (default [`DEFAULT_PREFIX`],
    /// `tt:`). The returned store shares this one's connection.
    ///
    /// A prefix holding a brace is an error: Redis Cluster takes the first
    /// `{...}` of a key name as its hash tag, which must be the one this
    /// store writes after the prefix. A brace in the prefix would send one
    /// key's states to different slots (every call failing with
    /// `CROSSSLOT`) or every key to one slot (one hot shard).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        if prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                "prefix",
                format!(
                    "{} holds a brace, which would move Redis Cluster's hash tag (the first \
                     {{...}} of a key name) off the one this store writes: use a prefix \
                     without braces",
                    Quoted(&prefix)
                ),
            ));
        }
        self.prefix = Arc::from(prefix);
        Ok(self)
    }

    /// Give up on a Redis call after `timeout` (default
    /// [`DEFAULT_TIMEOUT`], 50 ms) and do what [`with_on_error`](Self::with_on_error)
    /// says. At least a millisecond.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// What to do while Redis is unreachable or slow (default
    /// [`OnError::Open`]).
    pub fn with_on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Renamed [`with_on_error`](Self::with_on_error): every setting of the
    /// store is a `with_*`.
    #[deprecated(since = "0.1.0", note = "renamed `with_on_error`")]
    #[doc(hidden)]
    pub fn on_error(self, on_error: OnError) -> Self {
        self.with_on_error(on_error)
    }

    /// When failing open, hold requests to an in-process limiter with the
    /// same quotas (`true`, the default), or admit them all (`false`).
    pub fn with_local_fallback(mut self, local_fallback: bool) -> Self {
        self.local_fallback = local_fallback;
        self
    }

    /// Key the hash that names keys in Redis with `secret` (any length;
    /// use 16 random bytes or more, the same in every replica).
    ///
    /// Key names never hold key text, only a 128-bit hash of it. Without a
    /// secret the hash is keyed with a fixed, public key: names stay
    /// stable and opaque, but someone who can read Redis can test guesses
    /// of key text that has few possible values (a client's IPv4 address)
    /// against them. With a secret, they cannot. An empty secret is an
    /// error.
    pub fn with_hash_key(mut self, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(ConfigError::new("hash_key", "must not be empty"));
        }
        self.names = Namer::new(Some(secret));
        Ok(self)
    }

    /// For tests: the scripts read the time from `micros` (microseconds
    /// since the Unix epoch), which the test sets, instead of from Redis's
    /// clock. Waits still run on tokio's clock.
    #[doc(hidden)]
    pub fn with_test_clock(mut self, micros: Arc<AtomicU64>) -> Self {
        self.test_clock = Some(micros);
        self
    }

    /// For tests: every admission runs the whole admission script, none
    /// of its short forms (one token bucket, or one window counting
    /// requests), so that a test can run each case through both.
    #[doc(hidden)]
    pub fn with_whole_admit_script(mut self) -> Self {
        self.whole_script_only = true;
        self
    }

    /// Whether every admission runs the whole script.
    pub(crate) fn whole_script_only(&self) -> bool {
        self.whole_script_only
    }

    /// Microseconds on this replica's clock, for its cache of refused keys:
    /// the test clock when there is one.
    pub(crate) fn local_micros(&self) -> u64 {
        static ORIGIN: std::sync::LazyLock<std::time::Instant> =
            std::sync::LazyLock::new(std::time::Instant::now);
        match &self.test_clock {
            Some(clock) => clock.load(Ordering::SeqCst),
            None => u64::try_from(ORIGIN.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The scripts' `now` argument: empty for Redis's own clock.
    pub(crate) fn now_arg(&self) -> String {
        self.test_clock
            .as_ref()
            .map(|c| c.load(Ordering::SeqCst).to_string())
            .unwrap_or_default()
    }

    /// For benchmarks: one `PING` on the store's own connection, the
    /// floor under any call it makes.
    #[doc(hidden)]
    pub async fn ping(&self) -> bool {
        match self.conn.get().await {
            Ok(mut conn) => ::redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_ok(),
            Err(_) => false,
        }
    }

    /// Whether Redis answers now: one `PING` under the store's timeout,
    /// outside the circuit breaker (a readiness probe asks even while
    /// requests are decided without Redis). For a health check; the
    /// layers never call it.
    pub async fn check(&self) -> Result<(), StoreCallFailed> {
        let call = async {
            let mut conn = self.conn.get().await?;
            ::redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StoreCallFailed::new(
                "check",
                StoreError::Redis(e).to_string(),
            )),
            Err(_) => Err(StoreCallFailed::new(
                "check",
                StoreError::Timeout(self.timeout).to_string(),
            )),
        }
    }

    /// The prefix of every key name.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The timeout of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What a layer does while Redis is unreachable.
    pub fn error_mode(&self) -> OnError {
        self.on_error
    }

    /// Run `script` on the keys and arguments, under the timeout. Logs the
    /// first failure of an outage and the first success after one.
    pub(crate) async fn run<T: ::redis::FromRedisValue>(
        &self,
        what: &'static str,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, StoreError> {
        let pass = self.conn.breaker.pass(breaker_clock());
        if pass == Pass::Refuse {
            return Err(StoreError::NotAsked);
        }
        // A probe whose request is dropped mid-call (its client gone) must
        // not leave the breaker waiting for it for good.
        let mut probe = ProbeGuard {
            breaker: &self.conn.breaker,
            pending: pass == Pass::Probe,
        };
        let call = async {
            let mut conn = self.conn.get().await?;
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key);
            }
            for arg in args {
                invocation.arg(arg);
            }
            invocation.invoke_async::<T>(&mut conn).await
        };
        let outcome = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        let was_probe = std::mem::take(&mut probe.pending);
        match &outcome {
            Ok(_) => self.conn.answered(what, None),
            Err(e) if e.is_answer() => self.conn.answered(what, Some(e)),
            Err(e) => self
                .conn
                .unanswered(what, self.on_error, self.local_fallback, e, was_probe),
        }
        outcome
    }

    /// A call was answered with a reply no script of ours gives (found by
    /// the caller, which reads it): logged once, as an error reply is.
    pub(crate) fn bad_reply(&self, what: &str) {
        self.conn.answered_wrong(what, &StoreError::Reply);
    }
}

/// TCP keepalive probes (and, on Linux, a bound on unacknowledged data):
/// a connection whose peer vanished without a word (a failover, a
/// partition) is found dead by the kernel too, not only by the breaker.
fn tcp_settings() -> TcpSettings {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5));
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(Duration::from_secs(10));
    settings
}

/// A URL the `redis` crate refused. Its message can quote part of the URL
/// (a query's value), escaped where shown (`ConfigError`'s `Display`); it
/// never quotes a password.
fn not_a_url(e: RedisError) -> ConfigError {
    ConfigError::new("redis_url", format!("not a Redis URL: {e}"))
}

/// Why a Redis call gave no answer.
#[derive(Debug)]
pub(crate) enum StoreError {
    Redis(RedisError),
    Timeout(Duration),
    /// A script answered something it never answers: another program
    /// wrote the keys, or a script of another version is loaded.
    Reply,
    /// Not asked: the breaker is open (calls in a row got no answer).
    NotAsked,
}

impl StoreError {
    /// Whether Redis answered (with an error): it is there, and the breaker
    /// does not count it.
    fn is_answer(&self) -> bool {
        match self {
            Self::Redis(e) => {
                e.code().is_some()
                    || !(e.is_io_error()
                        || e.is_connection_dropped()
                        || e.is_connection_refusal()
                        || e.is_timeout())
            }
            Self::Reply => true,
            Self::Timeout(_) | Self::NotAsked => false,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis(e) => write!(f, "{e}"),
            Self::Timeout(after) => write!(f, "no answer within {after:?}"),
            Self::Reply => f.write_str("an unexpected reply"),
            Self::NotAsked => f.write_str("not asked: Redis gave no answer to the last calls"),
        }
    }
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        Self::Redis(e)
    }
}

/// What the store connects to.
pub(crate) enum Target {
    Single(Client),
    Cluster(ClusterClient),
}

/// A connected target: cheap to clone, multiplexed.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection of one store, and whether it is down.
pub(crate) struct Connection {
    target: Target,
    /// Made on first use; dropped (to be made anew) when the breaker opens
    /// on timeouts: a socket whose peer vanished may never fail by itself.
    conn: ArcSwapOption<Conn>,
    /// One connection is made at a time.
    making: tokio::sync::Mutex<()>,
    /// `host:port` (or the socket's path), for logs: never the URL, which
    /// may hold a password.
    pub(crate) addr: String,
    breaker: Breaker,
    /// Redis answers with errors (or replies no script gives): logged once
    /// until it answers normally again.
    erring: AtomicBool,
}

impl Connection {
    /// The connection, made on first use. The manager is made lazily and
    /// connects (and reconnects, with backoff) by itself; made here because
    /// it needs the runtime, which building a layer may not have.
    ///
    /// Made in a task of its own: a caller's timeout cancels its wait, never
    /// the handshake. A Cluster's first connection reads the slots from its
    /// nodes, which a slow network can take longer for than one call's
    /// timeout: cancelled with each call, it would never complete.
    pub(crate) async fn get(self: &Arc<Self>) -> Result<Conn, RedisError> {
        if let Some(conn) = self.conn.load_full() {
            return Ok((*conn).clone());
        }
        let this = self.clone();
        let made = tokio::spawn(async move {
            let _one = this.making.lock().await;
            if let Some(conn) = this.conn.load_full() {
                return Ok((*conn).clone());
            }
            let conn = this.connect().await?;
            this.conn.store(Some(Arc::new(conn.clone())));
            Ok(conn)
        });
        made.await.unwrap_or_else(|_| {
            Err(RedisError::from((
                ::redis::ErrorKind::Io,
                "the task connecting to Redis failed",
            )))
        })
    }

    async fn connect(&self) -> Result<Conn, RedisError> {
        match &self.target {
            Target::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    // Our own timeout bounds every call; reconnect attempts
                    // get a little longer, and keep going.
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_max_delay(Duration::from_secs(1));
                ConnectionManager::new_lazy_with_config(client.clone(), config).map(Conn::Single)
            }
            // Connects to the nodes and reads the slots now; a failure
            // leaves no connection, to be tried again on the next call.
            Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }

    /// A call was answered (an error reply included: Redis is there).
    fn answered(&self, what: &str, error: Option<&StoreError>) {
        if self.breaker.answered() {
            tracing::info!(store = %Escaped(&self.addr), "{what}: Redis reachable again");
        }
        match error {
            None => {
                if self.erring.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %Escaped(&self.addr), "{what}: Redis answers normally again");
                }
            }
            Some(error) => self.answered_wrong(what, error),
        }
    }

    /// Redis answered an error, or a reply no script of ours gives: logged
    /// once until it answers normally again.
    fn answered_wrong(&self, what: &str, error: &StoreError) {
        if !self.erring.swap(true, Ordering::Relaxed) {
            // The error can quote the server: outside input.
            tracing::warn!(
                store = %Escaped(&self.addr),
                error = %Escaped(&error.to_string()),
                "{what}: Redis answered {}; the request is decided by the fail mode",
                match error {
                    StoreError::Reply => "a reply no script of this version gives",
                    _ => "with an error",
                }
            );
        }
    }

    /// A call at `now` got no answer: counted by the breaker, and logged
    /// when it opens it (not per call: an intermittent timeout does not
    /// flap the log).
    fn unanswered(
        &self,
        what: &str,
        on_error: OnError,
        fallback: bool,
        error: &StoreError,
        probe: bool,
    ) {
        if self.breaker.failed(breaker_clock(), probe) != Failed::Tripped {
            tracing::debug!(store = %Escaped(&self.addr), error = %Escaped(&error.to_string()), "{what}: no answer");
            return;
        }
        let mode = match (on_error, fallback) {
            (OnError::Closed, _) => "failing closed: refusing requests",
            (OnError::Open, true) => "failing open: in-process limits per replica",
            (OnError::Open, false) => "failing open: admitting requests",
        };
        let kind = match error {
            StoreError::Timeout(_) => "not answering",
            _ => "unreachable",
        };
        // The error can quote the server: outside input.
        tracing::warn!(
            store = %Escaped(&self.addr),
            error = %Escaped(&error.to_string()),
            "{what}: Redis {kind}; {mode} ({TRIP_AFTER} calls in a row got no answer; \
             asked again within a second)"
        );
        if matches!(error, StoreError::Timeout(_)) {
            // A connection whose peer vanished (a failover, a partition)
            // may never fail by itself: the next call makes a new one.
            self.conn.store(None);
        }
    }
}

/// Marks a probe that has not ended: dropped so, it lets the next call
/// probe (see [`Breaker::probe_abandoned`]).
struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    pending: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.breaker.probe_abandoned();
        }
    }
}

/// Microseconds on a monotonic clock, for the breaker.
fn breaker_clock() -> u64 {
    static ORIGIN: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);
    u64::try_from(ORIGIN.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
