//! Serving an axum `Router` over HTTP/1 on a TCP listener, with the limits
//! an edge facing the internet needs:
//!
//! - at most `max_connections` open at once: the accept loop takes a
//!   permit before it accepts, so further connections wait in the kernel's
//!   listen backlog and the process never runs out of file descriptors;
//! - a complete request head within `header_read_timeout` of a connection
//!   opening or of its previous response (hyper's timer starts whenever the
//!   connection is ready for a request, so it is also the idle keep-alive
//!   timeout), else the connection is closed;
//! - request heads of at most `max_header_bytes` (hyper answers 431), and
//!   at most [`MAX_BUF`] buffered per connection, so a client that does
//!   not read what it is sent holds a bounded amount of memory;
//! - a shutdown that stops accepting at once, lets requests in progress
//!   finish, and closes connections without one (idle, or a head never
//!   completed) after [`CLOSE_LINGER`] instead of waiting for them.
//!
//! hyper does the per-connection work (`header_read_timeout`,
//! `max_header_size`, `max_buf_size`, `graceful_shutdown`); this module adds
//! what `axum::serve` has no hook for: the cap on accepted connections, the
//! builder settings, and counting requests in progress, which is how
//! shutdown tells a request in flight from a connection that never sent
//! one (hyper keeps a connection whose head is half read open until the
//! head completes or times out).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::write_timeout::WriteTimeout;

/// Default `header_read_timeout`.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `body_write_timeout`.
pub const BODY_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `max_header_bytes`: generous for API clients (a bearer token and
/// a few cookies are a few KiB), small enough that holding one per
/// connection is cheap.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// What one connection may buffer, each way (hyper's default is about
/// 400 KiB). A reader that stops reading holds at most this, plus one
/// frame.
pub const MAX_BUF: usize = 64 << 10;

/// On shutdown, how long a connection with no request in progress may take
/// to flush what it was writing before it is closed.
pub const CLOSE_LINGER: Duration = Duration::from_millis(200);

/// The most requests one HTTP/2 connection may have in progress at once.
pub const MAX_STREAMS: u32 = 100;

/// File descriptors kept for everything but client connections: the
/// listeners, the config file, logs, the runtime's own.
const FD_HEADROOM: u64 = 64;

/// File descriptors one client connection can cost: its socket, the
/// upstream connection its request goes out on (which the pool may keep),
/// and that connection's other end when the upstream is the built-in
/// simulator.
const FDS_PER_CONNECTION: u64 = 3;

/// The largest default `max_connections`, however high the fd limit.
const MAX_DEFAULT_CONNECTIONS: u64 = 10_000;

/// Where the fd limit cannot be read: safe under the common soft limit of
/// 1024.
const FALLBACK_CONNECTIONS: usize = 256;

/// The limits a server runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// From a connection opening, or its previous response, to a complete
    /// request head.
    pub header_read_timeout: Duration,
    /// The request line and headers, in bytes; beyond it, 431.
    pub max_header_bytes: usize,
    /// How long a response may make no progress (a client that stops
    /// reading) before its connection is closed and the response dropped,
    /// with what it held.
    pub body_write_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(),
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_header_bytes: MAX_HEADER_BYTES,
            body_write_timeout: BODY_WRITE_TIMEOUT,
        }
    }
}

/// The process's soft limit on open files, where it can be read.
pub fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use nix::sys::resource::{Resource, getrlimit};
        getrlimit(Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// `max_connections` when none is configured: what the soft fd limit
/// leaves after [`FD_HEADROOM`], at [`FDS_PER_CONNECTION`] each, at most
/// 10,000 (1024 gives 320); 256 where the limit cannot be read.
pub fn default_max_connections() -> usize {
    match fd_limit() {
        Some(soft) => {
            let n = soft.saturating_sub(FD_HEADROOM) / FDS_PER_CONNECTION;
            usize::try_from(n.clamp(1, MAX_DEFAULT_CONNECTIONS)).unwrap_or(FALLBACK_CONNECTIONS)
        }
        None => FALLBACK_CONNECTIONS,
    }
}

/// The most connections `fd_limit` open files can carry, to warn about a
/// configured `max_connections` above it.
pub fn connections_within(fd_limit: u64) -> u64 {
    fd_limit.saturating_sub(FD_HEADROOM) / FDS_PER_CONNECTION
}

#[derive(Debug, Default)]
struct Counts {
    open: AtomicUsize,
    peak: AtomicUsize,
    requests: AtomicUsize,
    write_timeouts: Arc<AtomicU64>,
}

/// Live counts of a server's connections and requests; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Connections {
    counts: Arc<Counts>,
}

// Some are read by the example's tests only.
#[allow(dead_code)]
impl Connections {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::Relaxed)
    }

    /// The most connections that were ever open at once.
    pub fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::Relaxed)
    }

    /// Requests in progress now: a complete head was read and the response
    /// has not ended.
    pub fn requests(&self) -> usize {
        self.counts.requests.load(Ordering::Relaxed)
    }

    /// Connections closed because their client stopped reading a response
    /// for `body_write_timeout`.
    pub fn write_timeouts(&self) -> u64 {
        self.counts.write_timeouts.load(Ordering::Relaxed)
    }
}

/// Counts a connection open while it lives.
struct OpenGuard {
    counts: Arc<Counts>,
    _permit: OwnedSemaphorePermit,
}

impl OpenGuard {
    fn new(counts: Arc<Counts>, permit: OwnedSemaphorePermit) -> Self {
        let open = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
        counts.peak.fetch_max(open, Ordering::Relaxed);
        Self {
            counts,
            _permit: permit,
        }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.counts.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request in progress, on its connection and in all, from its
/// head to the end (or drop) of its response body.
struct RequestGuard {
    counts: Arc<Counts>,
    connection: Arc<AtomicUsize>,
}

impl RequestGuard {
    fn new(counts: Arc<Counts>, connection: Arc<AtomicUsize>) -> Self {
        counts.requests.fetch_add(1, Ordering::Relaxed);
        connection.fetch_add(1, Ordering::Relaxed);
        Self { counts, connection }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.counts.requests.fetch_sub(1, Ordering::Relaxed);
        self.connection.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted until it ends or is
/// dropped. axum's `Body` is `Unpin`, so no projection is needed.
struct Counted {
    body: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// How each connection is served.
struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    tls: Option<TlsAcceptor>,
    /// A TLS handshake must end within this (the head's timeout: a client
    /// that opens connections and never completes them holds one each).
    handshake_timeout: Duration,
}

fn http2_builder(limits: &ServeLimits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_send_buf_size(MAX_BUF)
        .max_concurrent_streams(MAX_STREAMS);
    builder
}

fn builder(limits: &ServeLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(MAX_BUF.max(limits.max_header_bytes));
    builder
}

/// Serve `app` on `listener` within `limits` until `shutdown` completes;
/// then stop accepting and return once every connection has closed (a
/// caller bounds that wait by dropping this future, which closes them all).
/// Each request carries axum's `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    connections: Connections,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, app, limits, connections, None, shutdown).await;
}

/// [`serve`], over TLS when `tls` is given (see [`crate::tls`]): HTTP/2
/// where the client offers it by ALPN, HTTP/1.1 otherwise.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    connections: Connections,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let builder = Arc::new(Builders {
        http1: builder(&limits),
        http2: http2_builder(&limits),
        tls,
        handshake_timeout: limits.header_read_timeout,
    });
    let (stop, stopping) = watch::channel(false);
    // Owned here, so dropping this future aborts every connection.
    let mut tasks = JoinSet::new();
    let mut permit: Option<OwnedSemaphorePermit> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = tasks.join_next() => {}
            acquired = permits.clone().acquire_owned(), if permit.is_none() => {
                // The semaphore is never closed.
                permit = acquired.ok();
            }
            accepted = listener.accept(), if permit.is_some() => match accepted {
                Ok((stream, remote)) => {
                    let Some(permit) = permit.take() else { continue };
                    let open = OpenGuard::new(connections.counts.clone(), permit);
                    let stream = WriteTimeout::new(
                        stream,
                        limits.body_write_timeout,
                        connections.counts.write_timeouts.clone(),
                    );
                    tasks.spawn(connection(
                        stream,
                        remote,
                        app.clone(),
                        builder.clone(),
                        stopping.clone(),
                        open,
                    ));
                }
                Err(e) => accept_failed(e).await,
            },
        }
    }
    drop(listener);
    stop.send_replace(true);
    while tasks.join_next().await.is_some() {}
}

/// An accept that failed. A connection reset before it was accepted is
/// nothing; anything else (no file descriptor, no memory) is logged and
/// retried after a pause, as hyper 0.14's server did.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept error");
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn connection(
    stream: WriteTimeout<TcpStream>,
    remote: SocketAddr,
    app: Router,
    builders: Arc<Builders>,
    stopping: watch::Receiver<bool>,
    open: OpenGuard,
) {
    let in_progress = Arc::new(AtomicUsize::new(0));
    let counts = open.counts.clone();
    let active = in_progress.clone();
    let service = hyper::service::service_fn(move |mut req: http::Request<_>| {
        let guard = RequestGuard::new(counts.clone(), active.clone());
        req.extensions_mut().insert(ConnectInfo(remote));
        let response = app.clone().oneshot(req);
        async move {
            let response = response.await?;
            Ok::<_, std::convert::Infallible>(response.map(|body| Counted {
                body,
                _guard: guard,
            }))
        }
    });
    let Some(acceptor) = &builders.tls else {
        let conn = builders
            .http1
            .serve_connection(TokioIo::new(stream), service);
        return drive(conn, &in_progress, stopping, remote).await;
    };
    let stream = match tokio::time::timeout(builders.handshake_timeout, acceptor.accept(stream))
        .await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "closed a connection that did not complete its TLS handshake in time");
            return;
        }
    };
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        let conn = builders
            .http2
            .serve_connection(TokioIo::new(stream), service);
        drive(conn, &in_progress, stopping, remote).await;
    } else {
        let conn = builders
            .http1
            .serve_connection(TokioIo::new(stream), service);
        drive(conn, &in_progress, stopping, remote).await;
    }
    drop(open);
}

/// A hyper connection that can be asked to finish.
trait Graceful: Future<Output = Result<(), hyper::Error>> {
    fn finish(self: Pin<&mut Self>);
}

impl<I, S> Graceful for http1::Connection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, E> Graceful for http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: http_body::Body + 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Run `conn` until it ends, or until shutdown: then idle connections
/// close at once and one with a request finishes it and then closes.
async fn drive<C: Graceful>(
    conn: C,
    in_progress: &AtomicUsize,
    mut stopping: watch::Receiver<bool>,
    remote: SocketAddr,
) {
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            finished(result, remote);
            return;
        }
        _ = stopping.wait_for(|s| *s) => {}
    }
    conn.as_mut().finish();
    loop {
        if in_progress.load(Ordering::Relaxed) > 0 {
            finished(conn.as_mut().await, remote);
            return;
        }
        match tokio::time::timeout(CLOSE_LINGER, conn.as_mut()).await {
            Ok(result) => {
                finished(result, remote);
                return;
            }
            // No request came in the meantime: nothing is lost by closing.
            Err(_) if in_progress.load(Ordering::Relaxed) == 0 => {
                tracing::debug!(%remote, "closed a connection with no request in progress");
                return;
            }
            Err(_) => {}
        }
    }
}

/// Whether hyper gave up on a write that [`WriteTimeout`] failed.
fn is_write_timeout(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = s.source();
    }
    false
}

fn finished(result: Result<(), hyper::Error>, remote: SocketAddr) {
    match result {
        Ok(()) => {}
        Err(e) if e.is_timeout() => {
            tracing::debug!(%remote, "closed a connection that sent no complete request in time");
        }
        // At info, so without the client's address (an IP is personal
        // data); the count is on the server's `Connections`.
        Err(e) if is_write_timeout(&e) => {
            tracing::info!("closed a connection whose client stopped reading its response");
        }
        Err(e) => tracing::debug!(%remote, error = %e, "connection ended with an error"),
    }
}
