//! Real kubeconfig files pointing at the test API server: `certificate-authority-data` plus
//! either embedded client certificate/key data or a bearer token.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

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

pub(crate) fn write(server: &TestApiServer, dir: &Path, identity: &Identity) -> Result<PathBuf, ApiServerError> {
    let user_entry = match identity {
        Identity::Cert { user, groups } => {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            let (cert, key) = server.issue_client_cert(user, &groups)?;
            json!({
                "client-certificate-data": STANDARD.encode(cert),
                "client-key-data": STANDARD.encode(key),
            })
        }
        Identity::Token { token, user, groups } => {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            server.add_token(token, user, &groups);
            json!({"token": token})
        }
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "edra-test", "cluster": {
            "server": server.url(),
            "certificate-authority-data": STANDARD.encode(server.ca_pem()),
        }}],
        "users": [{"name": identity.user(), "user": user_entry}],
        "contexts": [{"name": "edra-test", "context": {"cluster": "edra-test", "user": identity.user()}}],
        "current-context": "edra-test",
        "preferences": {},
    });
    let file_name: String =
        identity.user().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let path = dir.join(format!("kubeconfig-{file_name}.yaml"));
    let yaml = yaml_serde::to_string(&config)
        .map_err(|e| ApiServerError::Kubeconfig { path: path.clone(), source: std::io::Error::other(e) })?;
    std::fs::write(&path, yaml).map_err(|source| ApiServerError::Kubeconfig { path: path.clone(), source })?;
    Ok(path)
}
