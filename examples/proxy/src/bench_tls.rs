//! `--bench --tls`: the same load test with an HTTPS upstream. A local
//! upstream on loopback (a certificate made at start with rcgen, its CA
//! trusted through the provider's `ca_file`, HTTP/2 and HTTP/1.1 offered by
//! ALPN like the public APIs) answers a fixed chat completion at once. The
//! same requests go to it directly over TLS, on the client the gateway
//! itself uses for that provider, and through the gateway (all four layers
//! on, no limit hit); the report says what the gateway adds.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tower_throttle::error::BoxError;

use crate::bench::{Run, load};
use crate::config::{Settings, process_env};
use crate::gateway;
use crate::tls::{TlsClients, TlsSettings, read_ca_file};

/// The gateway for the TLS load test: every layer on, limits far above the
/// load; `{url}` and `{ca_file}` are filled in.
const TLS_BENCH_CONFIG: &str = concat!(
    r#"
[[providers]]
name = "tls"
base_url = "{url}"
ca_file = "{ca_file}"
"#,
    crate::bench::bench_layers!()
);

const ANSWER: &str = r#"{"id":"bench","object":"chat.completion","model":"sim-small","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

/// The upstream: serves until dropped.
struct Upstream {
    addr: SocketAddr,
    /// TLS handshakes completed: pooling shows as a handful.
    handshakes: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The CA file, removed when dropped.
struct CaFile(PathBuf);

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A CA, and a certificate it signed for 127.0.0.1: the CA's PEM, the
/// server's configuration.
fn certificates() -> Result<(String, ServerConfig), BoxError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &issuer)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((ca_pem, config))
}

async fn answer(req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    // Read like a real upstream would before answering.
    let _ = req.into_body().collect().await;
    let mut response = http::Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn upstream(config: ServerConfig) -> Result<Upstream, BoxError> {
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            connections.spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::Relaxed);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service_fn(answer))
                    .await;
            });
        }
    });
    Ok(Upstream {
        addr,
        handshakes,
        task,
    })
}

/// Run the TLS comparison and return the report.
pub async fn run(requests: u64, connections: &[usize]) -> Result<String, BoxError> {
    let (ca_pem, server) = certificates()?;
    let upstream = upstream(server).await?;
    let ca_file = CaFile(std::env::temp_dir().join(format!(
        "tower-throttle-bench-ca-{}.pem",
        std::process::id()
    )));
    std::fs::write(&ca_file.0, &ca_pem)?;
    let path = ca_file.0.display().to_string();
    let url = format!("https://{}", upstream.addr);
    let toml = TLS_BENCH_CONFIG.replace("{url}", &url).replace(
        "{ca_file}",
        &path.replace('\\', "\\\\").replace('"', "\\\""),
    );
    let settings = Settings::from_toml(&toml, &process_env)?;
    let running = gateway::start(settings, ([127, 0, 0, 1], 0).into(), "bench")
        .await
        .map_err(|e| e.to_string())?;
    // Direct requests go out on the same client the gateway uses.
    let tls = TlsSettings {
        ca_file: Some(path.clone()),
        extra_roots: read_ca_file(&path)?,
        insecure_skip_verify: false,
    };
    let https = TlsClients::default()
        .clients_for(&[&tls])?
        .pop()
        .ok_or("no HTTPS client")?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let most = connections.iter().copied().max().unwrap_or(1);
    let plain = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(most * 2)
        .build(connector);
    let direct = format!("{url}/v1/chat/completions");
    let through = format!("{}/v1/chat/completions", running.url());

    let mut out = String::new();
    let _ = writeln!(
        out,
        "load test, HTTPS upstream: {requests} requests per run, loopback, no limit hit"
    );
    let _ = writeln!(
        out,
        "| connections | path | req/s | p50 µs | p99 µs | errors |\n|---:|---|---:|---:|---:|---:|"
    );
    let mut summary = String::new();
    for &c in connections {
        // Warm both paths up: connections, TLS sessions, pools.
        load(&https, &direct, 500.min(requests), c).await?;
        load(&plain, &through, 500.min(requests), c).await?;
        let d = load(&https, &direct, requests, c).await?;
        let g = load(&plain, &through, requests, c).await?;
        for (name, r) in [
            ("HTTPS upstream direct", &d),
            ("the gateway, four layers, HTTPS upstream", &g),
        ] {
            let _ = writeln!(
                out,
                "| {c} | {name} | {:.0} | {} | {} | {} |",
                r.throughput, r.p50, r.p99, r.errors
            );
        }
        let _ = writeln!(
            summary,
            "  {c} connection(s): the gateway adds {} µs at p50 and {} µs at p99 to direct TLS requests and keeps {:.0}% of their throughput",
            g.p50.saturating_sub(d.p50),
            g.p99.saturating_sub(d.p99),
            share(&g, &d),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out.push_str(&summary);
    let _ = writeln!(
        out,
        "  the upstream completed {} TLS handshakes in all",
        upstream.handshakes.load(Ordering::Relaxed)
    );
    running.shutdown().await;
    Ok(out)
}

fn share(a: &Run, b: &Run) -> f64 {
    100.0 * a.throughput / b.throughput.max(f64::MIN_POSITIVE)
}
