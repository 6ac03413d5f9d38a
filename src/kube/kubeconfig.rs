//! Kubeconfig files: parsing, merging a `KUBECONFIG` list, choosing the context, and turning
//! the chosen cluster and user into [`Credentials`]. Every error names the file and the
//! problem. Merging follows kubectl: for each named cluster/user/context the first file that
//! defines it wins, and `current-context` comes from the first file that sets it. Relative
//! paths are resolved against the folder of the file that defined the entry.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use super::Error;
use super::auth::{Auth, Credentials, Pem, PemKind, Secret};

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct File {
    current_context: Option<String>,
    clusters: Vec<Named<Cluster>>,
    users: Vec<NamedUser>,
    contexts: Vec<Named<Context>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context")]
    value: Option<T>,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    user: Option<User>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Context {
    cluster: Option<String>,
    user: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    exec: Option<serde_json::Value>,
    auth_provider: Option<serde_json::Value>,
    username: Option<String>,
}

/// An entry and the file that defined it.
struct Found<T> {
    file: PathBuf,
    value: T,
}

/// Load one kubeconfig, or merge several, and build credentials for `context` (or the
/// current context).
pub fn load(files: &[PathBuf], context: Option<&str>) -> Result<Credentials, Error> {
    let mut parsed = Vec::with_capacity(files.len());
    for path in files {
        let text = super::files::read_regular_text(path, super::files::MAX_CREDENTIAL_FILE)
            .map_err(|problem| err(path, format!("cannot read the file: {problem}")))?;
        parsed.push((path.clone(), parse(path, &text)?));
    }
    select(&parsed, context)
}

/// [`load`] on texts already read: `(path, text)` per file. Relative paths inside resolve
/// against each path's folder.
pub(crate) fn from_texts(files: &[(PathBuf, &str)], context: Option<&str>) -> Result<Credentials, Error> {
    let parsed =
        files.iter().map(|(path, text)| Ok((path.clone(), parse(path, text)?))).collect::<Result<Vec<_>, _>>()?;
    select(&parsed, context)
}

fn parse(path: &Path, text: &str) -> Result<File, Error> {
    if text.trim().is_empty() {
        return Ok(File::default());
    }
    yaml_serde::from_str(text).map_err(|e| err(path, format!("not a valid kubeconfig (YAML): {e}")))
}

fn err(path: &Path, problem: impl Into<String>) -> Error {
    Error::Kubeconfig { path: path.to_path_buf(), problem: problem.into() }
}

fn describe(files: &[(PathBuf, File)]) -> PathBuf {
    let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    PathBuf::from(names.join(":"))
}

fn select(files: &[(PathBuf, File)], context: Option<&str>) -> Result<Credentials, Error> {
    let all = describe(files);
    let ctx_name = match context {
        Some(c) => c.to_string(),
        None => files
            .iter()
            .find_map(|(_, f)| f.current_context.clone().filter(|c| !c.is_empty()))
            .ok_or_else(|| err(&all, "no current-context is set; set one or pass --context (kubernetes.context)"))?,
    };
    let ctx = find(files, |f| &f.contexts, &ctx_name).ok_or_else(|| {
        let known: Vec<&str> = files.iter().flat_map(|(_, f)| f.contexts.iter().map(|c| c.name.as_str())).collect();
        err(&all, format!("context {ctx_name:?} is not defined (defined: {})", known.join(", ")))
    })?;
    let ctx_file = ctx.file.clone();
    let ctx = ctx.value.ok_or_else(|| err(&ctx_file, format!("context {ctx_name:?} has no body")))?;
    let cluster_name = ctx
        .cluster
        .filter(|c| !c.is_empty())
        .ok_or_else(|| err(&ctx_file, format!("context {ctx_name:?} names no cluster")))?;
    let user_name = ctx.user.unwrap_or_default();
    let cluster = find(files, |f| &f.clusters, &cluster_name)
        .and_then(|f| f.value.map(|value| Found { file: f.file, value }))
        .ok_or_else(|| {
            err(&ctx_file, format!("context {ctx_name:?} names cluster {cluster_name:?}, which is not defined"))
        })?;
    let user = if user_name.is_empty() {
        None
    } else {
        let u = files.iter().find_map(|(p, f)| {
            f.users.iter().find(|u| u.name == user_name).map(|u| Found { file: p.clone(), value: u.user.clone() })
        });
        let u = u.ok_or_else(|| {
            err(&ctx_file, format!("context {ctx_name:?} names user {user_name:?}, which is not defined"))
        })?;
        Some(Found { file: u.file, value: u.value.unwrap_or_default() })
    };
    build(&cluster_name, cluster, &user_name, user)
}

fn find<T: Clone>(
    files: &[(PathBuf, File)],
    list: impl Fn(&File) -> &Vec<Named<T>>,
    name: &str,
) -> Option<Found<Option<T>>> {
    files.iter().find_map(|(p, f)| {
        list(f).iter().find(|n| n.name == name).map(|n| Found { file: p.clone(), value: n.value.clone() })
    })
}

fn build(
    cluster_name: &str,
    cluster: Found<Cluster>,
    user_name: &str,
    user: Option<Found<User>>,
) -> Result<Credentials, Error> {
    let cfile = &cluster.file;
    let c = cluster.value;
    let server = c
        .server
        .filter(|s| !s.is_empty())
        .ok_or_else(|| err(cfile, format!("cluster {cluster_name:?} has no server")))?;
    if !server.starts_with("https://") {
        return Err(err(
            cfile,
            format!(
                "cluster {cluster_name:?}: server {server:?} is not an https:// URL; edra only talks TLS to the API server"
            ),
        ));
    }
    if server.parse::<http::Uri>().map(|u| u.authority().is_none()).unwrap_or(true) {
        return Err(err(cfile, format!("cluster {cluster_name:?}: server {server:?} is not a valid URL")));
    }
    let ca = pem_source(
        cfile,
        &format!("cluster {cluster_name:?} certificate-authority"),
        c.certificate_authority_data,
        c.certificate_authority,
        PemKind::Cert,
    )?;
    let insecure = c.insecure_skip_tls_verify == Some(true);
    if ca.is_none() && !insecure {
        return Err(err(
            cfile,
            format!(
                "cluster {cluster_name:?} has no certificate-authority or certificate-authority-data; add the cluster CA"
            ),
        ));
    }
    let (auth, identity) = match user {
        None => (Auth::None, format!("no user (anonymous) from {}", cfile.display())),
        Some(u) => user_auth(user_name, &u.file, u.value)?,
    };
    Ok(Credentials {
        server: server.trim_end_matches('/').to_string(),
        ca,
        insecure_skip_tls_verify: insecure,
        tls_server_name: c.tls_server_name.filter(|s| !s.is_empty()),
        auth,
        identity,
    })
}

fn user_auth(name: &str, file: &Path, u: User) -> Result<(Auth, String), Error> {
    let what = |s: &str| format!("user {name:?} {s}");
    if u.exec.is_some() {
        return Err(err(
            file,
            what(
                "uses an exec credential plugin, which edra does not support; use a client certificate or a token (token/tokenFile)",
            ),
        ));
    }
    if u.auth_provider.is_some() {
        return Err(err(
            file,
            what(
                "uses an auth-provider, which edra does not support; use a client certificate or a token (token/tokenFile)",
            ),
        ));
    }
    let cert =
        pem_source(file, &what("client-certificate"), u.client_certificate_data, u.client_certificate, PemKind::Cert)?;
    let key = pem_source(file, &what("client-key"), u.client_key_data, u.client_key, PemKind::Key)?;
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let identity = match &cert {
                Pem::File(p) => format!("client certificate {} from {}", p.display(), file.display()),
                Pem::Data(_) => format!("client certificate from {}", file.display()),
            };
            return Ok((Auth::ClientCert { cert, key }, identity));
        }
        (Some(_), None) => return Err(err(file, what("has a client certificate but no client-key"))),
        (None, Some(_)) => return Err(err(file, what("has a client-key but no client certificate"))),
        (None, None) => {}
    }
    if let Some(t) = u.token.filter(|t| !t.is_empty()) {
        return Ok((Auth::Token(Secret::new(t)), format!("bearer token of user {name:?} from {}", file.display())));
    }
    if let Some(t) = u.token_file.filter(|t| !t.is_empty()) {
        let path = resolve_path(file, &t);
        if !path.exists() {
            return Err(err(file, what(&format!("tokenFile {} does not exist", path.display()))));
        }
        let identity = format!("bearer token file {} from {}", path.display(), file.display());
        return Ok((Auth::TokenFile(path), identity));
    }
    if u.username.is_some() {
        return Err(err(
            file,
            what(
                "uses basic auth (username/password), which edra does not support; use a client certificate or a token",
            ),
        ));
    }
    Err(err(file, what("has no credentials (client certificate + key, token or tokenFile)")))
}

fn resolve_path(file: &Path, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() { p } else { file.parent().map(|d| d.join(&p)).unwrap_or(p) }
}

/// `*-data` (base64) wins over the file form, as in kubectl. Both forms are checked for
/// PEM content now, so a broken file is reported at start-up against this kubeconfig;
/// files are read again when connecting (they may be rotated).
fn pem_source(
    file: &Path,
    what: &str,
    data: Option<String>,
    path: Option<String>,
    kind: PemKind,
) -> Result<Option<Pem>, Error> {
    if let Some(d) = data.filter(|d| !d.is_empty()) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map_err(|e| err(file, format!("{what}-data is not valid base64: {e}")))?;
        check_pem(file, &format!("{what}-data"), &bytes, kind)?;
        return Ok(Some(Pem::Data(bytes)));
    }
    match path.filter(|p| !p.is_empty()) {
        None => Ok(None),
        Some(p) => {
            let path = resolve_path(file, &p);
            if !path.exists() {
                return Err(err(file, format!("{what} file {} does not exist", path.display())));
            }
            let bytes = super::files::read_regular(&path, super::files::MAX_CREDENTIAL_FILE)
                .map_err(|problem| err(file, format!("{what} file {} cannot be read: {problem}", path.display())))?;
            check_pem(file, &format!("{what} file {}", path.display()), &bytes, kind)?;
            Ok(Some(Pem::File(path)))
        }
    }
}

fn check_pem(file: &Path, what: &str, data: &[u8], kind: PemKind) -> Result<(), Error> {
    super::tls::check_pem(data, kind).map_err(|problem| err(file, format!("{what}: {problem}")))
}
