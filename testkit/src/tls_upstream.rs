//! A local HTTPS upstream: a CA and a certificate for `127.0.0.1` and
//! `localhost` made with rcgen at run time, served with tokio-rustls and
//! hyper on 127.0.0.1:0, speaking HTTP/1.1 or HTTP/2 as ALPN settles. It
//! counts TLS connections and notes the protocol of every request.
//!
//! `POST` with `"stream":true` in the body answers a server-sent-event
//! stream of [`STREAM_CHUNKS`]; any other request a JSON object naming the
//! protocol it came over (`{"protocol":"HTTP/2.0"}`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// The chunks of a streamed answer, in order.
pub const STREAM_CHUNKS: [&str; 4] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"llo\"}}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"total_tokens\":7}}\n\n",
    "data: [DONE]\n\n",
];

/// A CA made for one test, and a certificate it signed (by default for
/// `127.0.0.1` and `localhost`, valid now).
pub struct TestCa {
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    /// The certificate it signed, PEM (a server's `tls_cert`).
    pub leaf_pem: String,
    /// That certificate's private key, PEM (a server's `tls_key`).
    pub key_pem: String,
    leaf: CertificateDer<'static>,
    leaf_key: Vec<u8>,
}

impl TestCa {
    pub fn new() -> TestCa {
        Self::make(&["127.0.0.1", "localhost"], false)
    }

    /// A CA whose certificate for `127.0.0.1` and `localhost` expired in 2021.
    pub fn expired() -> TestCa {
        Self::make(&["127.0.0.1", "localhost"], true)
    }

    /// A CA whose certificate names only `names`.
    pub fn for_names(names: &[&str]) -> TestCa {
        Self::make(names, false)
    }

    fn make(names: &[&str], expired: bool) -> TestCa {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tower-throttle test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let leaf = params
            .signed_by(&leaf_key, &issuer)
            .expect("leaf certificate");
        TestCa {
            ca_pem: ca_cert.pem(),
            leaf_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
            leaf: leaf.der().clone(),
            leaf_key: leaf_key.serialize_der(),
        }
    }

    /// The CA's certificate in a file of its own, removed when dropped.
    pub fn ca_file(&self) -> TempFile {
        TempFile::with(self.ca_pem.as_bytes())
    }

    fn server_config(&self, alpn: Alpn) -> ServerConfig {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.clone()));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf.clone()], key)
            .expect("server certificate");
        config.alpn_protocols = match alpn {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::Http2 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        config
    }
}

/// A file in the temporary directory, removed when dropped.
pub struct TempFile {
    pub path: PathBuf,
}

impl TempFile {
    pub fn with(contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "tower-throttle-test-{}-{}.pem",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents).expect("write a temporary file");
        TempFile { path }
    }

    /// The path, as TOML wants it (a basic string).
    pub fn toml(&self) -> String {
        format!("{:?}", self.path.display().to_string())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the upstream offers by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/2, or HTTP/1.1 for a client without it.
    Http2,
}

/// A running HTTPS upstream; stopped when dropped.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    versions: Arc<Mutex<Vec<http::Version>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    task: JoinHandle<()>,
}

type Answer = http::Response<BoxBody<Bytes, Infallible>>;

async fn answer(
    req: http::Request<Incoming>,
    versions: Arc<Mutex<Vec<http::Version>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
) -> Result<Answer, Infallible> {
    let version = req.version();
    versions.lock().push(version);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // Parsed, not searched: clients space their JSON differently.
    let streamed = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream")?.as_bool())
        == Some(true);
    bodies.lock().push(body.clone());
    let response = if streamed {
        let frames = STREAM_CHUNKS
            .iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c.as_bytes()))));
        http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(StreamBody::new(futures::stream::iter(frames)).boxed())
    } else {
        let json = serde_json::json!({"protocol": format!("{version:?}")}).to_string();
        http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)).boxed())
    };
    Ok(response.expect("a valid response"))
}

impl TlsUpstream {
    /// Serve on 127.0.0.1:0 with `ca`'s certificate, offering `alpn`.
    pub async fn start(ca: &TestCa, alpn: Alpn) -> TlsUpstream {
        let acceptor = TlsAcceptor::from(Arc::new(ca.server_config(alpn)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("local address");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let versions = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (h, v, b) = (handshakes.clone(), versions.clone(), bodies.clone());
        let task = tokio::spawn(async move {
            // Dropped with the accept loop: every connection ends with it.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, h, v, b) = (acceptor.clone(), h.clone(), v.clone(), b.clone());
                connections.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    h.fetch_add(1, Ordering::SeqCst);
                    let service = service_fn(move |req| answer(req, v.clone(), b.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsUpstream {
            addr,
            handshakes,
            versions,
            bodies,
            task,
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// TLS connections accepted (handshakes completed).
    pub fn connections(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// The protocol of every request seen, in order.
    pub fn versions(&self) -> Vec<http::Version> {
        self.versions.lock().clone()
    }

    /// The body of each request, in order.
    pub fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().clone()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
