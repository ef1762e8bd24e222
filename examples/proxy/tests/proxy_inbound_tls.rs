//! The `proxy` example serving HTTPS (`[gateway] tls_cert`, `tls_key`):
//! HTTP/2 or HTTP/1.1 as ALPN settles, a certificate rotated on disk
//! served to new connections, a broken pair refused while the old one keeps
//! serving, and a pair that does not load refused at start. The client is
//! tokio-rustls and hyper, so the test sees the protocol and the
//! certificate each connection got.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy::config::Settings;
use proxy::gateway::Running;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::sim::{no_env, simulator, start};
use testkit::capture::log_text;
use testkit::tls_upstream::{TempFile, TestCa};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The gateway's config with the simulator, serving `cert` and `key`.
fn config(cert: &TempFile, key: &TempFile) -> String {
    format!(
        "[gateway]\ntls_cert = {}\ntls_key = {}\n{}",
        cert.toml(),
        key.toml(),
        simulator(100, 100)
    )
}

/// A TLS connection to `addr` trusting `ca` only, offering `alpn`.
async fn connect(
    addr: SocketAddr,
    ca: &TestCa,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// `GET path` on `stream`, over HTTP/2 when ALPN chose it: the status and
/// the protocol the answer came in.
async fn get(stream: TlsStream<TcpStream>, path: &str) -> (u16, http::Version) {
    send(stream, http::Method::GET, path, "").await
}

/// `method path` with `body` on `stream`.
async fn send(
    stream: TlsStream<TcpStream>,
    method: http::Method,
    path: &str,
    body: &'static str,
) -> (u16, http::Version) {
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let port = stream.get_ref().0.peer_addr().unwrap().port();
    // HTTP/2 sends the URI's authority; HTTP/1.1 an origin-form target and
    // a Host.
    let request = if h2 {
        http::Request::builder().uri(format!("https://localhost:{port}{path}"))
    } else {
        http::Request::builder()
            .uri(path)
            .header("host", format!("localhost:{port}"))
    };
    let request = request
        .method(method)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        send.send_request(request).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(request).await.unwrap()
    };
    let status = response.status().as_u16();
    let version = response.version();
    response.into_body().collect().await.unwrap();
    (status, version)
}

async fn serving(ca: &TestCa) -> (Running, TempFile, TempFile) {
    let cert = TempFile::with(ca.leaf_pem.as_bytes());
    let key = TempFile::with(ca.key_pem.as_bytes());
    let gw = start(&config(&cert, &key)).await;
    (gw, cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_speaks_http2_or_http1_as_alpn_settles() {
    let ca = TestCa::new();
    let (gw, _cert, _key) = serving(&ca).await;
    assert!(gw.url().starts_with("https://"), "{}", gw.url());

    let both = connect(gw.addr, &ca, &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(get(both, "/healthz").await, (200, http::Version::HTTP_2));

    // A chat completion, forwarded to the (plain HTTP) simulator.
    let chat = r#"{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}"#;
    let both = connect(gw.addr, &ca, &[b"h2", b"http/1.1"]).await.unwrap();
    let answer = send(both, http::Method::POST, "/v1/chat/completions", chat).await;
    assert_eq!(answer, (200, http::Version::HTTP_2));

    let http1 = connect(gw.addr, &ca, &[b"http/1.1"]).await.unwrap();
    assert_eq!(get(http1, "/healthz").await, (200, http::Version::HTTP_11));
    let none = connect(gw.addr, &ca, &[]).await.unwrap();
    assert_eq!(get(none, "/stats").await, (200, http::Version::HTTP_11));

    // Trusting another CA: the handshake fails, nothing is served.
    assert!(connect(gw.addr, &TestCa::new(), &[b"h2"]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_connections_and_a_broken_one_is_refused() {
    let old = TestCa::new();
    let (gw, cert, key) = serving(&old).await;
    let open = connect(gw.addr, &old, &[b"http/1.1"]).await.unwrap();

    // Rotation: the new pair, written over the old files.
    let new = TestCa::new();
    std::fs::write(&key.path, &new.key_pem).unwrap();
    std::fs::write(&cert.path, &new.leaf_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while connect(gw.addr, &new, &[b"h2"]).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the new certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        connect(gw.addr, &old, &[b"h2"]).await.is_err(),
        "new connections get the new one"
    );
    assert_eq!(
        get(open, "/healthz").await.0,
        200,
        "an open connection keeps its own"
    );

    // A broken pair (the old key with the new certificate) is refused with
    // one line; the new pair keeps serving.
    std::fs::write(&key.path, &old.key_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log_text().contains("the changed certificate or key was refused") {
        assert!(
            Instant::now() < deadline,
            "the broken pair was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stream = connect(gw.addr, &new, &[b"h2"]).await.unwrap();
    assert_eq!(get(stream, "/healthz").await.0, 200);
    assert!(!log_text().contains("BEGIN"), "no key material in the log");
}

#[test]
fn a_pair_that_does_not_load_is_refused_at_start_naming_the_field() {
    let ca = TestCa::new();
    let other = TestCa::new();
    let cert = TempFile::with(ca.leaf_pem.as_bytes());
    let key = TempFile::with(ca.key_pem.as_bytes());
    let wrong_key = TempFile::with(other.key_pem.as_bytes());
    let not_pem = TempFile::with(b"not a certificate");
    let refused = |toml: String| Settings::from_toml(&toml, &no_env).unwrap_err().to_string();

    let e = refused(config(&cert, &wrong_key));
    assert!(
        e.contains("tls_cert") && e.contains("do not make a pair"),
        "{e}"
    );
    let e = refused(config(&not_pem, &key));
    assert!(
        e.contains("tls_cert") && e.contains("no `BEGIN CERTIFICATE`"),
        "{e}"
    );
    let e = refused(format!("[gateway]\ntls_cert = {}\n", cert.toml()));
    assert!(e.contains("tls_key"), "{e}");
    let e = refused(config(&cert, &TempFile::with(b"")));
    assert!(
        e.contains("no PEM private key") && !e.contains("BEGIN"),
        "{e}"
    );
    assert!(Settings::from_toml(&config(&cert, &key), &no_env).is_ok());
}
