//! Inbound TLS: a certificate chain and its private key from PEM files,
//! served with rustls (HTTP/2 or HTTP/1.1 by ALPN, see
//! [`serve_with`](crate::serve::serve_with)) and read again when either
//! file changes, so a certificate is rotated without a restart.
//!
//! [`CertFiles::reload_if_changed`] is called by its owner (once a second,
//! say): it looks at both files' modification times and sizes, and only
//! when one changed reads and checks the pair. A pair that does not load (a
//! half-written file, a key that does not match the certificate) is
//! refused with the reason and the certificate in use keeps serving; new
//! connections get the new one once it loads, connections already open
//! keep theirs.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

/// The largest certificate or key file read: a chain is a few KiB.
pub const MAX_PEM_FILE: u64 = 1 << 20;

/// A file's identity for change detection.
type Stamp = Option<(SystemTime, u64)>;

/// A certificate and key read from two PEM files, and read again when they
/// change.
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files as last read (or last refused): a refused pair is not
    /// read again until a file changes again.
    seen: Mutex<(Stamp, Stamp)>,
}

impl std::fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl CertFiles {
    /// Read the certificate chain at `cert` and the private key at `key`
    /// (PEM); an error says which file and why.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let seen = (stamp(cert), stamp(key));
        let certified = read_pair(cert, key, &provider)?;
        Ok(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: RwLock::new(Arc::new(certified)),
            seen: Mutex::new(seen),
        })
    }

    /// Read the pair again if either file changed since it was last read:
    /// `None` when neither did, `Some(Ok(()))` when the new pair serves
    /// now, `Some(Err(reason))` when it was refused (the old one serves).
    pub fn reload_if_changed(&self) -> Option<Result<(), String>> {
        let now = (stamp(&self.cert), stamp(&self.key));
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == now {
                return None;
            }
            *seen = now;
        }
        Some(
            read_pair(&self.cert, &self.key, &self.provider).map(|certified| {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(certified);
            }),
        )
    }

    /// An acceptor serving the current pair, offering HTTP/2 and HTTP/1.1
    /// by ALPN.
    pub fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the provider supports the default TLS versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PEM_FILE + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(format!(
            "`{}` is larger than {MAX_PEM_FILE} bytes; is it a PEM file?",
            path.display()
        ));
    }
    Ok(bytes)
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "`{}` is not a PEM file of certificates: {e}",
                cert.display()
            )
        })?;
    if chain.is_empty() {
        return Err(format!(
            "`{}` holds no `BEGIN CERTIFICATE` block",
            cert.display()
        ));
    }
    // The key's text never reaches an error: only its file's name.
    let private = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|_| format!("`{}` holds no PEM private key", key.display()))?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        format!(
            "`{}` and `{}` do not make a pair: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(certified)
}
