//! TLS for https:// targets: rustls (never OpenSSL), trusting the public web
//! roots plus the certificates of `--ca-file` (a private CA, a test's).

use std::error::Error as StdError;
use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// The largest `--ca-file` read: a bundle of every public root is ~250 KiB.
const MAX_CA_FILE: u64 = 4 << 20;

/// The certificates of the PEM file at `path`, each usable as a trust
/// anchor, or why not.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read --ca-file {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_CA_FILE {
        return Err(format!(
            "--ca-file {shown} is larger than {MAX_CA_FILE} bytes; is it a PEM file?"
        ));
    }
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--ca-file {shown} is not a PEM file of certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "--ca-file {shown} holds no `BEGIN CERTIFICATE` block"
        ));
    }
    roots(&certs).map_err(|e| format!("--ca-file {shown}: {e}"))?;
    Ok(certs)
}

/// The public web roots and `extra`.
fn roots(extra: &[CertificateDer<'static>]) -> Result<RootCertStore, rustls::Error> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra {
        roots.add(cert.clone())?;
    }
    Ok(roots)
}

/// The rustls configuration of a run's client: HTTP/1.1 only, as the
/// client speaks.
pub fn client_config(extra: &[CertificateDer<'static>]) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| Ok(b.with_root_certificates(roots(extra)?)))
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Whether `e` failed in a TLS handshake (an untrusted or expired
/// certificate, a name mismatch, no common protocol).
pub fn is_tls_failure(e: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        // rustls's error travels inside an io::Error (or two), whose
        // `source()` skips the error it wraps: look inside it instead.
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|i| i as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    false
}
