//! TLS for the API client: the rustls configuration (ring provider, the cluster CA, ALPN for
//! HTTP/2 with HTTP/1.1 fallback), client certificates that are re-read from their files
//! when they change (k3s re-signs the kubelet's certificate at each start), and the
//! explicitly requested "skip verification" mode.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::Error;
use super::auth::{Auth, Credentials, Pem, PemKind};

/// The crypto provider edra uses everywhere: ring, explicitly.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Check that PEM data holds at least one certificate (or a private key).
pub fn check_pem(data: &[u8], kind: PemKind) -> Result<(), String> {
    match kind {
        PemKind::Cert => parse_certs(data).map(|_| ()),
        PemKind::Key => parse_key(data).map(|_| ()),
    }
}

fn parse_certs(data: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> =
        CertificateDer::pem_slice_iter(data).collect::<Result<_, _>>().map_err(|e| format!("not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("contains no PEM CERTIFICATE block".into());
    }
    Ok(certs)
}

fn parse_key(data: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(data).map_err(|e| format!("contains no usable PEM private key: {e}"))
}

fn read_pem(pem: &Pem) -> Result<Vec<u8>, Error> {
    match pem {
        Pem::Data(d) => Ok(d.clone()),
        Pem::File(p) => super::files::read_regular(p, super::files::MAX_CREDENTIAL_FILE)
            .map_err(|problem| Error::CredentialFile { path: p.clone(), problem: format!("cannot read: {problem}") }),
    }
}

fn pem_err(pem: &Pem, what: &str, problem: String) -> Error {
    match pem {
        Pem::File(p) => Error::CredentialFile { path: p.clone(), problem: format!("{what}: {problem}") },
        Pem::Data(_) => Error::TlsConfig { problem: format!("{what} data: {problem}") },
    }
}

/// Build the rustls client configuration for these credentials.
pub fn client_config(creds: &Credentials) -> Result<rustls::ClientConfig, Error> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::TlsConfig { problem: e.to_string() })?;
    let builder = if creds.insecure_skip_tls_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify(provider.clone())))
    } else {
        let ca = creds.ca.as_ref().ok_or_else(|| Error::TlsConfig {
            problem: "no certificate authority for the API server; add certificate-authority(-data) to the kubeconfig"
                .into(),
        })?;
        let pem = read_pem(ca)?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in parse_certs(&pem).map_err(|p| pem_err(ca, "certificate authority", p))? {
            roots.add(cert).map_err(|e| pem_err(ca, "certificate authority", e.to_string()))?;
        }
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| Error::TlsConfig { problem: e.to_string() })?;
        builder.with_webpki_verifier(verifier)
    };
    // ALPN (h2, then http/1.1) is set by the connector builder (`enable_all_versions`).
    let config = match &creds.auth {
        Auth::ClientCert { cert, key } => {
            let resolver = ReloadingCert::new(cert.clone(), key.clone(), provider)?;
            builder.with_client_cert_resolver(Arc::new(resolver))
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}

/// A client certificate whose files are re-read when their modification time changes,
/// checked at each TLS handshake. If a reload fails the last good pair stays in use.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: Pem,
    key: Pem,
    provider: Arc<CryptoProvider>,
    current: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<(Option<SystemTime>, Option<SystemTime>)>,
    key: Arc<CertifiedKey>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ReloadingCert {
    /// Load the pair now; errors here surface at start-up.
    pub fn new(cert: Pem, key: Pem, provider: Arc<CryptoProvider>) -> Result<Self, Error> {
        let stamp = Self::stamp_of(&cert, &key);
        let loaded = load_pair(&cert, &key, &provider)?;
        Ok(ReloadingCert { cert, key, provider, current: Mutex::new(Loaded { stamp, key: Arc::new(loaded) }) })
    }

    fn stamp_of(cert: &Pem, key: &Pem) -> Option<(Option<SystemTime>, Option<SystemTime>)> {
        let file = |p: &Pem| match p {
            Pem::File(path) => Some(mtime(path)),
            Pem::Data(_) => None,
        };
        match (file(cert), file(key)) {
            (None, None) => None,
            (c, k) => Some((c.flatten(), k.flatten())),
        }
    }

    /// The current pair, reloaded first if a file changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut cur = match self.current.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if cur.stamp.is_some() {
            let now = Self::stamp_of(&self.cert, &self.key);
            if now != cur.stamp {
                match load_pair(&self.cert, &self.key, &self.provider) {
                    Ok(k) => {
                        tracing::info!(cert = ?self.cert, "client certificate changed on disk; reloaded");
                        cur.key = Arc::new(k);
                        cur.stamp = now;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "client certificate changed on disk but cannot be loaded; keeping the previous one")
                    }
                }
            }
        }
        cur.key.clone()
    }
}

fn load_pair(cert: &Pem, key: &Pem, provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let certs = parse_certs(&read_pem(cert)?).map_err(|p| pem_err(cert, "client certificate", p))?;
    let der = parse_key(&read_pem(key)?).map_err(|p| pem_err(key, "client key", p))?;
    CertifiedKey::from_der(certs, der, provider).map_err(|e| {
        pem_err(key, "client key", format!("does not match the client certificate or is unsupported: {e}"))
    })
}

impl ResolvesClientCert for ReloadingCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// Accepts any server certificate (still checks handshake signatures). Used only with an
/// explicit `insecure-skip-tls-verify`.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
