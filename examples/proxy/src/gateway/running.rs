//! Starting a gateway: the simulator, the listener, the stats hub and the
//! server; and stopping it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serving::tls::CertFiles;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_throttle::error::ConfigError;
use tower_throttle::redact::Escaped;

use super::{Gateway, router};
use crate::config::{GatewaySettings, Settings};
use crate::learn::SYNC_EVERY;
use crate::simulator::Simulator;
use crate::{serve, stats};

/// Why the proxy could not start.
#[derive(Debug)]
pub enum StartError {
    /// The configuration cannot run (exit code 2).
    Config(ConfigError),
    /// A socket could not be opened (exit code 1).
    Io(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "{e}"),
            Self::Io(e) => f.write_str(e),
        }
    }
}

/// A gateway serving, with its simulator if it has one.
pub struct Running {
    /// The gateway's state.
    pub gateway: Gateway,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The built-in upstream, if configured.
    pub simulator: Option<Simulator>,
    /// Client connections and requests in progress.
    pub connections: serve::Connections,
    /// Whether it serves HTTPS (`tls_cert`).
    https: bool,
    server: JoinHandle<()>,
    hub: JoinHandle<()>,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Start the simulator (if configured), then the gateway on `listen`.
pub async fn start(
    settings: Settings,
    listen: SocketAddr,
    source: impl Into<String>,
) -> Result<Running, StartError> {
    let simulator = match &settings.simulator {
        Some(sim) => Some(Simulator::start(sim.clone()).await.map_err(|e| {
            StartError::Io(format!("cannot start the simulator on {}: {e}", sim.listen))
        })?),
        None => None,
    };
    let gateway = Gateway::new(settings, simulator.as_ref().map(Simulator::addr), source)
        .map_err(StartError::Config)?;
    // What other gateways on the same Redis learned, applied before the
    // first request is served here; then read again every SYNC_EVERY.
    let learner = gateway.handles().learned.clone();
    if learner.shares() {
        learner.sync().await;
        let mut stop = gateway.shutdown_signal();
        tokio::spawn(async move {
            loop {
                let stopped = tokio::select! {
                    () = tokio::time::sleep(SYNC_EVERY) => false,
                    _ = stop.wait_for(|s| *s) => true,
                };
                if stopped {
                    return;
                }
                learner.sync().await;
            }
        });
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| StartError::Io(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Io(format!("cannot listen on {listen}: {e}")))?;
    let _ = gateway.inner.listen.set(addr);
    let tls = match &gateway.current().settings.gateway.tls {
        Some(files) => Some(Arc::new(
            CertFiles::load(&files.cert, &files.key)
                .map_err(|e| StartError::Config(ConfigError::new("gateway.tls_cert", e)))?,
        )),
        None => None,
    };
    if tls.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "serving plain HTTP beyond loopback: callers' keys and prompts cross the network \
             in clear; set [gateway] tls_cert and tls_key"
        );
    }
    if addr.ip().is_unspecified() {
        tracing::warn!(
            %addr,
            "listening on every interface: requests are answered for localhost and IP \
             addresses on this port; other host names need gateway.allowed_hosts"
        );
    }
    let limits = serve_limits(&gateway.current().settings.gateway);
    let hub = tokio::spawn(stats::run_hub(gateway.clone()));
    let app = router(gateway.clone()).map_err(StartError::Config)?;
    let mut stop = gateway.shutdown_signal();
    let connections = serve::Connections::default();
    let _ = gateway.inner.connections.set(connections.clone());
    if let Some(files) = &tls {
        tokio::spawn(reload_certificate(files.clone(), gateway.shutdown_signal()));
    }
    let server = tokio::spawn(serve::serve_with(
        listener,
        app,
        limits,
        connections.clone(),
        tls.as_ref().map(CertFiles::acceptor),
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ));
    Ok(Running {
        gateway,
        addr,
        https: tls.is_some(),
        simulator,
        connections,
        server,
        hub,
    })
}

/// How often the certificate files are looked at.
pub const CERTIFICATE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Read `tls_cert` and `tls_key` again whenever they change, until
/// shutdown: new connections get a new pair that loads; one that does not
/// is refused with one line and the old pair keeps serving.
async fn reload_certificate(files: Arc<CertFiles>, mut stop: watch::Receiver<bool>) {
    loop {
        let stopped = tokio::select! {
            () = tokio::time::sleep(CERTIFICATE_CHECK_EVERY) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if stopped {
            return;
        }
        match files.reload_if_changed() {
            None => {}
            Some(Ok(())) => {
                tracing::info!("gateway.tls_cert: new connections get the new certificate")
            }
            Some(Err(e)) => tracing::warn!(
                error = %Escaped(&e),
                "gateway.tls_cert: the changed certificate or key was refused; the old pair keeps serving"
            ),
        }
    }
}

/// The server's limits from `[gateway]`; a `max_connections` the fd limit
/// cannot carry is logged, since the process would run out of descriptors
/// before it reached it.
fn serve_limits(settings: &GatewaySettings) -> serve::ServeLimits {
    let max_connections = settings
        .max_connections
        .unwrap_or_else(serve::default_max_connections);
    let fd_limit = serve::fd_limit();
    if let Some(fds) = fd_limit {
        if max_connections as u64 > serve::connections_within(fds) {
            tracing::warn!(
                max_connections,
                fd_limit = fds,
                "max_connections is above what the open-file limit can carry; raise `ulimit -n` or lower it"
            );
        }
    }
    tracing::debug!(max_connections, ?fd_limit, "connection limit");
    serve::ServeLimits {
        max_connections,
        header_read_timeout: settings.header_read_timeout,
        max_header_bytes: settings.max_header_bytes,
        body_write_timeout: settings.body_write_timeout,
    }
}

impl Running {
    /// `http://addr`, or `https://addr` with `tls_cert`.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stop accepting, end `/events` streams, let in-flight requests finish
    /// for at most `shutdown_grace`, then stop the simulator. Connections
    /// with no request in progress (idle, or a request head never
    /// completed) are closed at once. True when everything finished in
    /// time.
    pub async fn shutdown(mut self) -> bool {
        let grace = self.gateway.current().settings.gateway.shutdown_grace;
        self.gateway.begin_shutdown();
        let in_flight = self.connections.requests();
        if in_flight > 0 {
            tracing::info!(in_flight, ?grace, "waiting for requests in flight");
        }
        let clean = tokio::time::timeout(grace, &mut self.server).await.is_ok();
        if !clean {
            tracing::warn!(
                in_flight = self.connections.requests(),
                ?grace,
                "requests still in flight after shutdown_grace; closing them"
            );
            self.server.abort();
        }
        if let Some(log) = self.gateway.access_log() {
            // Connections just closed drop their answers (and write their
            // lines) as their tasks end: give them a moment.
            tokio::time::sleep(crate::access_log::FLUSH_EVERY).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), log.flush()).await;
        }
        if let Some(simulator) = self.simulator.take() {
            simulator.stop(Duration::from_secs(1)).await;
        }
        self.hub.abort();
        clean
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.server.abort();
        self.hub.abort();
    }
}
