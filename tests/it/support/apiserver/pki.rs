//! Test-time PKI of the test API server: a serving CA and server certificate (SANs
//! `127.0.0.1`, `localhost`), a client CA that signs client certificates the way Kubernetes
//! reads them (CN = user, one O per group), and the rustls server configuration.
//!
//! Like kube-apiserver (Go's `RequestClientCert`), the TLS handshake accepts any client
//! certificate whose handshake signature is valid; whether it chains to the client CA is decided
//! per request by [`Pki::identify`], so an unknown certificate ends in `401 Unauthorized`, not
//! in a failed handshake.

use std::fmt;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};

use super::UserInfo;

/// Failures while generating certificates or building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating the test certificate {what} failed: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("building the test TLS configuration failed: {0}")]
    Tls(String),
}

/// A certificate authority that can sign leaf certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(common_name: &str) -> Result<Self, PkiError> {
        let generate = |source| PkiError::Generate { what: "CA", source };
        let key = KeyPair::generate().map_err(generate)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(generate)?;
        Ok(Self { issuer })
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Signs a leaf; returns (certificate PEM, certificate DER, PKCS#8 key DER, key PEM).
    fn sign(&self, params: CertificateParams) -> Result<Leaf, PkiError> {
        let generate = |source| PkiError::Generate { what: "leaf", source };
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate)?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
            key_pem: key.serialize_pem(),
        })
    }
}

struct Leaf {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
    key_pem: String,
}

/// The server's certificates; `Debug` never prints key material.
pub(crate) struct Pki {
    serving_ca: Ca,
    client_ca: Ca,
    foreign_ca: Ca,
    server: Leaf,
    client_verifier: Arc<dyn ClientCertVerifier>,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

impl Pki {
    pub(crate) fn generate() -> Result<Self, PkiError> {
        let serving_ca = Ca::new("edra-test-apiserver-serving-ca")?;
        let client_ca = Ca::new("edra-test-apiserver-client-ca")?;
        let foreign_ca = Ca::new("edra-test-unrelated-ca")?;
        let generate = |source| PkiError::Generate { what: "server", source };
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(generate)?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = serving_ca.sign(params)?;
        let mut roots = RootCertStore::empty();
        roots.add(client_ca.der()).map_err(|e| PkiError::Tls(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client_verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| PkiError::Tls(e.to_string()))?;
        Ok(Self { serving_ca, client_ca, foreign_ca, server, client_verifier })
    }

    pub(crate) fn ca_pem(&self) -> String {
        self.serving_ca.pem()
    }

    pub(crate) fn client_ca_pem(&self) -> String {
        self.client_ca.pem()
    }

    /// A client certificate (CN = user, O = groups) signed by the client CA.
    pub(crate) fn issue_client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), PkiError> {
        let leaf = self.client_ca.sign(client_params(user, groups)?)?;
        Ok((leaf.cert_pem, leaf.key_pem))
    }

    /// A well-formed client certificate signed by a CA the server does not trust.
    pub(crate) fn issue_foreign_client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), PkiError> {
        let leaf = self.foreign_ca.sign(client_params(user, groups)?)?;
        Ok((leaf.cert_pem, leaf.key_pem))
    }

    /// rustls server configuration: TLS 1.2/1.3, ALPN `h2` then `http/1.1`, optional client certs.
    pub(crate) fn server_config(&self) -> Result<Arc<ServerConfig>, PkiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server.key_der.clone()));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PkiError::Tls(e.to_string()))?
            .with_client_cert_verifier(Arc::new(DeferredClientAuth { inner: self.client_verifier.clone() }))
            .with_single_cert(vec![self.server.cert_der.clone()], key)
            .map_err(|e| PkiError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The identity of a presented client certificate chain, if it chains to the client CA.
    pub(crate) fn identify(&self, chain: &[CertificateDer<'static>]) -> Option<UserInfo> {
        let (end_entity, intermediates) = chain.split_first()?;
        self.client_verifier.verify_client_cert(end_entity, intermediates, UnixTime::now()).ok()?;
        let (_, cert) = x509_parser::parse_x509_certificate(end_entity.as_ref()).ok()?;
        let subject = cert.subject();
        let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
        Some(UserInfo { user, groups })
    }
}

fn client_params(user: &str, groups: &[&str]) -> Result<CertificateParams, PkiError> {
    let generate = |source| PkiError::Generate { what: "client", source };
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.distinguished_name.push(DnType::CommonName, user);
    // rcgen keeps one value per attribute type; a second group uses the same OID (2.5.4.10)
    // through a custom type, which is exactly how a second O RDN looks on the wire.
    match groups {
        [] => {}
        [one] => params.distinguished_name.push(DnType::OrganizationName, *one),
        [one, two] => {
            params.distinguished_name.push(DnType::OrganizationName, *one);
            params.distinguished_name.push(DnType::CustomDnType(vec![2, 5, 4, 10]), *two);
        }
        _ => return Err(PkiError::Tls("client certificates carry at most two groups (O)".to_owned())),
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

/// Accepts any client certificate at handshake time (signatures still verified); chain
/// validation happens per request.
#[derive(Debug)]
struct DeferredClientAuth {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for DeferredClientAuth {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
