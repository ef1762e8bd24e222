//! HTTPS upstreams: rustls (never OpenSSL) with the public web roots built
//! in (`webpki-roots`, so a container without a CA bundle still reaches the
//! public APIs), plus the certificates of a provider's `ca_file`. HTTP/2
//! when the upstream offers it by ALPN, HTTP/1.1 otherwise.
//!
//! One pooled client per distinct TLS setting, shared by every provider
//! with that setting and kept across reloads while some provider still
//! uses it, so connections (and TLS sessions) are reused request after
//! request. Plain-HTTP providers keep the gateway's plain client.

use std::error::Error as StdError;
use std::fmt;
use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::{HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tower::timeout::Timeout;
use tower::util::BoxCloneSyncService;
use tower_throttle::error::BoxError;

/// The largest `ca_file` read: a bundle of every public root is ~250 KiB.
const MAX_CA_FILE: u64 = 4 << 20;

/// A provider's TLS settings, checked.
#[derive(Clone, PartialEq)]
pub struct TlsSettings {
    /// The `ca_file` as written, for messages.
    pub ca_file: Option<String>,
    /// Its certificates, trusted in addition to the public web roots.
    pub extra_roots: Arc<[CertificateDer<'static>]>,
    /// Accept any certificate: tests only, logged loudly.
    pub insecure_skip_verify: bool,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca_file", &self.ca_file)
            .field("extra_roots", &self.extra_roots.len())
            .field("insecure_skip_verify", &self.insecure_skip_verify)
            .finish()
    }
}

/// The certificates of the PEM file at `path`, each usable as a trust
/// anchor, or why not.
pub fn read_ca_file(path: &str) -> Result<Arc<[CertificateDer<'static>]>, String> {
    if path.trim().is_empty() {
        return Err("name a PEM file of CA certificates".to_owned());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read `{path}`: {e}"))?;
    if bytes.len() as u64 > MAX_CA_FILE {
        return Err(format!(
            "`{path}` is larger than {MAX_CA_FILE} bytes; is it a PEM file?"
        ));
    }
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{path}` is not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "`{path}` holds no `BEGIN CERTIFICATE` block; give the CA's certificate in PEM"
        ));
    }
    // Checked now, so that a bad file is a config error and not a 502 later.
    let mut store = RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store
            .add(cert.clone())
            .map_err(|e| format!("`{path}`: certificate {} cannot be trusted: {e}", i + 1))?;
    }
    Ok(certs.into())
}

/// The longest a new connection may take, TCP connect and TLS handshake
/// together: an upstream that accepts and then says nothing is a 502, not a
/// wait as long as `upstream_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connector with [`CONNECT_TIMEOUT`], boxed (hyper's client wants
/// a connector future it can move, which the timeout's is not).
type Connector = BoxCloneSyncService<Uri, MaybeHttpsStream<TokioIo<TcpStream>>, BoxError>;

/// The client for HTTPS upstreams.
pub type HttpsClient = Client<Connector, Full<Bytes>>;

/// A request's HTTPS client, put in its extensions by the handler: the
/// innermost service sends it through this one instead of the plain one.
#[derive(Clone)]
pub struct Via(pub HttpsClient);

/// The HTTPS clients, one per distinct [`TlsSettings`].
#[derive(Default)]
pub struct TlsClients {
    clients: Mutex<Vec<(TlsSettings, HttpsClient)>>,
}

impl fmt::Debug for TlsClients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClients")
            .field("clients", &self.clients.lock().len())
            .finish()
    }
}

impl TlsClients {
    /// A client for each of `wanted` (in order): the pooled one of an earlier
    /// call where the setting is the same, a new one otherwise. Clients no
    /// longer wanted are forgotten here (requests and configurations still
    /// holding one keep it until they end).
    pub fn clients_for(&self, wanted: &[&TlsSettings]) -> Result<Vec<HttpsClient>, String> {
        let mut clients = self.clients.lock();
        let mut kept: Vec<(TlsSettings, HttpsClient)> = Vec::new();
        let mut out = Vec::with_capacity(wanted.len());
        for &tls in wanted {
            let same = |(s, _): &(TlsSettings, HttpsClient)| same_trust(s, tls);
            let client = match kept
                .iter()
                .find(|c| same(c))
                .or(clients.iter().find(|c| same(c)))
            {
                Some((_, client)) => client.clone(),
                None => https_client(tls)?,
            };
            if !kept.iter().any(same) {
                kept.push((tls.clone(), client.clone()));
            }
            out.push(client);
        }
        *clients = kept;
        Ok(out)
    }
}

/// Whether two settings trust the same certificates (the file's name may
/// differ).
fn same_trust(a: &TlsSettings, b: &TlsSettings) -> bool {
    a.insecure_skip_verify == b.insecure_skip_verify && a.extra_roots == b.extra_roots
}

/// A pooled HTTPS client for `tls`.
fn https_client(tls: &TlsSettings) -> Result<HttpsClient, String> {
    let config = client_config(tls).map_err(|e| format!("cannot set up TLS: {e}"))?;
    let mut http = HttpConnector::new();
    // The scheme is https; the TLS connector sees to it.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(BoxCloneSyncService::new(Timeout::new(
            https,
            CONNECT_TIMEOUT,
        ))))
}

/// The rustls configuration for `tls` (ALPN is set by the connector).
fn client_config(tls: &TlsSettings) -> Result<ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    if tls.insecure_skip_verify {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth());
    }
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in tls.extra_roots.iter() {
        roots.add(cert.clone())?;
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `insecure_skip_verify = true`: any certificate, for any name, is taken
/// (signatures are still checked, so the handshake itself is sound).
/// Hand-written because rustls, by design, ships no such verifier.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A request that failed in the TLS handshake with its upstream (an
/// untrusted or expired certificate, a name mismatch, no common protocol).
#[derive(Debug)]
pub struct UpstreamTls {
    detail: String,
}

impl fmt::Display for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS with the upstream failed: {}", self.detail)
    }
}

impl StdError for UpstreamTls {}

impl UpstreamTls {
    /// The TLS failure somewhere in `e`'s sources, if there is one.
    pub fn find(e: &(dyn StdError + 'static)) -> Option<Self> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Some(Self {
                    detail: format!("{} ({tls})", reason(tls)),
                });
            }
            next = inner(e);
        }
        None
    }
}

/// What an operator needs to hear of a TLS failure, in plain words; rustls's
/// own text follows it in the message.
fn reason(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::Expired | C::ExpiredContext { .. } => "the certificate has expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "the certificate is not valid yet",
            C::UnknownIssuer => {
                "unknown issuer: no trusted CA signed the certificate (a private CA needs ca_file)"
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "name mismatch: the certificate is not for this host"
            }
            C::Revoked => "the certificate is revoked",
            _ => "the certificate is not accepted",
        },
        rustls::Error::NoApplicationProtocol | rustls::Error::PeerIncompatible(_) => {
            "no protocol or cipher in common with the upstream"
        }
        _ => "the TLS handshake failed",
    }
}

/// The error under `e`. rustls's error reaches hyper inside an io::Error
/// (inside another, from hyper-rustls), whose `source()` skips the error it
/// wraps: look inside it instead.
fn inner<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    match e.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|i| i as &(dyn StdError + 'static)),
        None => e.source(),
    }
}
