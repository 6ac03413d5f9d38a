//! Real kubeconfig files pointing at the test API server: `certificate-authority-data` plus
//! either embedded client certificate/key data or a bearer token.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::{ApiServerError, TestApiServer};

/// The credential a kubeconfig carries. `Debug` never prints the token.
#[derive(Clone, PartialEq, Eq)]
pub enum Identity {
    /// A client certificate issued by the server's client CA (CN = user, O = groups).
    Cert { user: String, groups: Vec<String> },
    /// A bearer token, registered with the server when the kubeconfig is written.
    Token { token: String, user: String, groups: Vec<String> },
}

impl Identity {
    pub fn cert(user: &str, groups: &[&str]) -> Self {
        Self::Cert { user: user.to_owned(), groups: groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    pub fn token(token: &str, user: &str, groups: &[&str]) -> Self {
        Self::Token {
            token: token.to_owned(),
            user: user.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// A `system:node:{node}` identity in group `system:nodes`, by client certificate.
    pub fn node(node: &str) -> Self {
        Self::cert(&format!("system:node:{node}"), &["system:nodes"])
    }

    pub fn user(&self) -> &str {
        match self {
            Self::Cert { user, .. } | Self::Token { user, .. } => user,
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cert { user, groups } => f.debug_struct("Cert").field("user", user).field("groups", groups).finish(),
            Self::Token { user, groups, .. } => f
                .debug_struct("Token")
                .field("token", &"<redacted>")
                .field("user", user)
                .field("groups", groups)
                .finish(),
        }
    }
}

/// How credentials appear in the kubeconfig.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// `certificate-authority-data`, `client-certificate-data`, `client-key-data`.
    Embedded,
    /// `certificate-authority`, `client-certificate`, `client-key` paths to PEM files next
    /// to the kubeconfig, as k3s writes them.
    Files,
}

pub(crate) fn write(
    server: &TestApiServer,
    dir: &Path,
    identity: &Identity,
    style: Style,
) -> Result<PathBuf, ApiServerError> {
    let file_name: String =
        identity.user().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let path = dir.join(format!("kubeconfig-{file_name}.yaml"));
    let credential = |field: &str, pem: String| -> Result<(String, Value), ApiServerError> {
        match style {
            Style::Embedded => Ok((format!("{field}-data"), json!(STANDARD.encode(pem)))),
            Style::Files => {
                let file = dir.join(format!("{file_name}-{field}.pem"));
                write_private(&file, pem.as_bytes())?;
                Ok((field.to_owned(), json!(file.display().to_string())))
            }
        }
    };
    let mut user_entry = serde_json::Map::new();
    match identity {
        Identity::Cert { user, groups } => {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            let (cert, key) = server.issue_client_cert(user, &groups)?;
            for (field, pem) in [("client-certificate", cert), ("client-key", key)] {
                let (k, v) = credential(field, pem)?;
                user_entry.insert(k, v);
            }
        }
        Identity::Token { token, user, groups } => {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            server.add_token(token, user, &groups);
            user_entry.insert("token".to_owned(), json!(token));
        }
    }
    let (ca_key, ca_value) = credential("certificate-authority", server.ca_pem())?;
    let mut cluster = serde_json::Map::new();
    cluster.insert("server".to_owned(), json!(server.url()));
    cluster.insert(ca_key, ca_value);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "edra-test", "cluster": cluster}],
        "users": [{"name": identity.user(), "user": user_entry}],
        "contexts": [{"name": "edra-test", "context": {"cluster": "edra-test", "user": identity.user()}}],
        "current-context": "edra-test",
        "preferences": {},
    });
    let yaml = yaml_serde::to_string(&config)
        .map_err(|e| ApiServerError::Kubeconfig { path: path.clone(), source: std::io::Error::other(e) })?;
    write_private(&path, yaml.as_bytes())?;
    Ok(path)
}

/// Writes a file readable only by its owner (0600), as kubeconfigs and keys should be.
fn write_private(path: &Path, contents: &[u8]) -> Result<(), ApiServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let error = |source| ApiServerError::Kubeconfig { path: path.to_owned(), source };
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(error)?;
    file.write_all(contents).map_err(error)
}
