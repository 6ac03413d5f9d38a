//! Where edra's Kubernetes credentials come from (what they are is [`super::auth`]).
//! Resolution order (first found wins): the configured kubeconfig, `KUBECONFIG`, the
//! in-cluster service account, the k3s kubelet's kubeconfig, the k3s server's kubeconfig.
//! Resolution takes the environment as a map so it is testable without touching the
//! process environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Error;
pub use super::auth::{Auth, Credentials, Pem, Secret};
pub use super::error::NO_CREDENTIALS_FIX;
use super::kubeconfig;

/// Inputs of credential resolution (from `config.kube` plus the environment).
#[derive(Debug, Clone)]
pub struct Sources {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub insecure_skip_tls_verify: bool,
    pub service_account_dir: PathBuf,
    pub k3s_kubelet_kubeconfig: PathBuf,
    pub k3s_server_kubeconfig: PathBuf,
    /// The environment (`KUBECONFIG`, `HOME`, `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`).
    pub env: BTreeMap<String, String>,
}

impl Sources {
    /// Sources from edra's configuration and the given environment.
    pub fn from_settings(k: &crate::config::KubeSettings, env: impl IntoIterator<Item = (String, String)>) -> Self {
        Sources {
            kubeconfig: k.kubeconfig.clone(),
            context: k.context.clone(),
            insecure_skip_tls_verify: k.insecure_skip_tls_verify,
            service_account_dir: k.service_account_dir.clone(),
            k3s_kubelet_kubeconfig: k.k3s_kubelet_kubeconfig.clone(),
            k3s_server_kubeconfig: k.k3s_server_kubeconfig.clone(),
            env: env.into_iter().collect(),
        }
    }
}

/// Where credentials are looked for when `kubernetes.kubeconfig` (`--kubeconfig`) is not
/// set: the first of these found is used. The one wording used in `--help`, the
/// documentation and the example configuration (a test holds them to it).
pub const SEARCH_ORDER: &str = "KUBECONFIG, ~/.kube/config, in-cluster (service account), \
     the k3s kubelet kubeconfig, the k3s server kubeconfig";

/// Find credentials in [`SEARCH_ORDER`]: the first source present wins; a present but broken source is an
/// error (it is not skipped), so a typo never silently selects another cluster.
pub fn resolve(src: &Sources) -> Result<Credentials, Error> {
    let mut creds = resolve_inner(src)?;
    if src.insecure_skip_tls_verify {
        creds.insecure_skip_tls_verify = true;
    }
    if creds.insecure_skip_tls_verify {
        tracing::warn!(
            server = %creds.server,
            "TLS verification of the API server is DISABLED (insecure-skip-tls-verify); anyone on the path can impersonate it"
        );
    }
    Ok(creds)
}

fn resolve_inner(src: &Sources) -> Result<Credentials, Error> {
    let ctx = src.context.as_deref();
    if let Some(path) = &src.kubeconfig {
        return kubeconfig::load(std::slice::from_ref(path), ctx);
    }
    let mut tried = vec!["kubernetes.kubeconfig / --kubeconfig: not set".to_string()];
    match src.env.get("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => {
            let files: Vec<PathBuf> = list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect();
            let existing: Vec<PathBuf> = files.iter().filter(|p| p.exists()).cloned().collect();
            if !existing.is_empty() {
                return kubeconfig::load(&existing, ctx);
            }
            tried.push(format!("KUBECONFIG={list}: none of its files exist"));
        }
        None => tried.push("KUBECONFIG: not set".to_string()),
    }
    // kubectl's default, for running edra by hand as the user who runs kubectl.
    match src.env.get("HOME").filter(|h| !h.is_empty()) {
        Some(home) => {
            let path = Path::new(home).join(".kube/config");
            if path.exists() {
                return kubeconfig::load(std::slice::from_ref(&path), ctx);
            }
            tried.push(format!("{}: does not exist", path.display()));
        }
        None => tried.push("~/.kube/config: HOME not set".to_string()),
    }
    match in_cluster(src)? {
        Ok(creds) => return Ok(creds),
        Err(why) => tried.push(why),
    }
    for (label, path) in [("k3s kubelet", &src.k3s_kubelet_kubeconfig), ("k3s server", &src.k3s_server_kubeconfig)] {
        if path.exists() {
            return kubeconfig::load(std::slice::from_ref(path), ctx);
        }
        tried.push(format!("{label} kubeconfig {}: does not exist", path.display()));
    }
    Err(Error::NoCredentials { tried })
}

/// In-cluster credentials; `Ok(Err(reason))` when not running in a pod.
fn in_cluster(src: &Sources) -> Result<Result<Credentials, String>, Error> {
    let dir = &src.service_account_dir;
    let (host, port) = match (src.env.get("KUBERNETES_SERVICE_HOST"), src.env.get("KUBERNETES_SERVICE_PORT")) {
        (Some(h), Some(p)) if !h.is_empty() && !p.is_empty() => (h, p),
        _ => return Ok(Err("in-cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT not set".to_string())),
    };
    let token = dir.join("token");
    if !token.exists() {
        return Ok(Err(format!("in-cluster: service account token {} does not exist", token.display())));
    }
    let bad = |problem: String| Error::InCluster { dir: dir.clone(), problem };
    if port.parse::<u16>().is_err() {
        return Err(bad(format!("KUBERNETES_SERVICE_PORT={port:?} is not a port number")));
    }
    let host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
    let ca = dir.join("ca.crt");
    if !ca.exists() {
        return Err(bad(format!("the service account CA {} does not exist", ca.display())));
    }
    read_token(&token).map_err(|e| bad(e.to_string()))?;
    Ok(Ok(Credentials {
        server: format!("https://{host}:{port}"),
        ca: Some(Pem::File(ca)),
        insecure_skip_tls_verify: false,
        tls_server_name: None,
        auth: Auth::TokenFile(token.clone()),
        identity: format!("service account token from {}", token.display()),
    }))
}

/// Read a token file (a regular file of at most [`super::files::MAX_CREDENTIAL_FILE`]):
/// trimmed, and not empty.
pub fn read_token(path: &Path) -> Result<Secret, Error> {
    let bad = |problem: String| Error::CredentialFile { path: path.to_path_buf(), problem };
    let text = super::files::read_regular_text(path, super::files::MAX_CREDENTIAL_FILE)
        .map_err(|problem| bad(format!("cannot read the token: {problem}")))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(bad("the token file is empty".into()));
    }
    Ok(Secret::new(token))
}
