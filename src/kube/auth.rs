//! What edra's Kubernetes credentials are: the server, its CA and how edra authenticates
//! ([`Credentials`], [`Auth`]), PEM material inline or in a file ([`Pem`], [`PemKind`]) and
//! secret text ([`Secret`]). Secrets (tokens, key material) are redacted in `Debug`. Where
//! they come from is [`super::credentials`] and [`super::kubeconfig`]; [`super::tls`]
//! turns them into a TLS configuration.

use std::path::PathBuf;

/// Secret text (a bearer token); `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// PEM material, inline (from `*-data`) or in a file that is re-read when it changes.
#[derive(Clone, PartialEq, Eq)]
pub enum Pem {
    Data(Vec<u8>),
    File(PathBuf),
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pem::Data(d) => write!(f, "Pem::Data(<{} bytes redacted>)", d.len()),
            Pem::File(p) => f.debug_tuple("Pem::File").field(p).finish(),
        }
    }
}

/// How edra authenticates to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// No client authentication (only useful for tests and anonymous servers).
    None,
    /// A static bearer token.
    Token(Secret),
    /// A bearer token read from a file, re-read when the file changes (rotation).
    TokenFile(PathBuf),
    /// A client certificate and key; files are re-read when they change (k3s re-signs).
    ClientCert { cert: Pem, key: Pem },
}

/// Everything needed to reach and authenticate to one API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `https://host:port`, without a trailing slash.
    pub server: String,
    /// The certificate authority that signs the server certificate.
    pub ca: Option<Pem>,
    /// Skip server certificate verification (only when explicitly asked for).
    pub insecure_skip_tls_verify: bool,
    /// Override of the name checked in the server certificate (`tls-server-name`).
    pub tls_server_name: Option<String>,
    pub auth: Auth,
    /// Human description of where the identity came from.
    pub identity: String,
}

/// What a PEM block must contain.
#[derive(Clone, Copy)]
pub enum PemKind {
    Cert,
    Key,
}
