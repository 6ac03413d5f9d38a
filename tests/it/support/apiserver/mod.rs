//! `TestApiServer`: a test double of the Kubernetes API server, started in-process on
//! `127.0.0.1` by integration tests and benchmarks. It speaks real HTTPS (certificates
//! generated at test time, ALPN `h2` and `http/1.1`) and behaves like kube-apiserver for the
//! subset edra uses:
//!
//! - authentication by client certificate (CN = user, O = groups, signed by its client CA)
//!   or registered bearer token; anything else is `401` with a Status body;
//! - discovery (`/version`, `/api`, `/apis`, `/apis/resource.k8s.io[/{v}]`) with a
//!   configurable gitVersion and set of served resource.k8s.io versions (v1, v1beta2,
//!   v1beta1; unserved version paths are `404`);
//! - `GET /api/v1/nodes/{name}`; pod list and watch (`/api/v1/pods`, field selectors on
//!   `spec.nodeName`, `metadata.name`, `metadata.namespace`, `status.phase`; pods are written
//!   through the handle only, as the scheduler and kubelet would); ResourceSlice list (with `spec.nodeName`/`spec.driver`/
//!   `metadata.name` field selectors), get, create (generateName), update and merge patch
//!   (optimistic concurrency), delete (preconditions) and watch (bookmarks, timeouts,
//!   streaming lists with `sendInitialEvents`, `410` for compacted resourceVersions);
//!   ResourceClaim get; v1beta1 shape conversion in both directions;
//! - `SelfSubjectReview` and `SelfSubjectAccessReview` (POST), decided by the same forbid
//!   rules and node authorizer emulation as real requests (admission is not consulted);
//! - a global integer resourceVersion shared by all kinds; what storage does to objects
//!   (canonical quantities, taint `timeAdded` defaulted when absent, device taints dropped
//!   when switched off, no write for an identical update, `500` for a
//!   create carrying a resourceVersion); validation of the ResourceSlice limits edra can hit
//!   (`422` with causes); Status bodies on every failure;
//! - optional node-authorizer + NodeRestriction emulation and test-forbidden combinations
//!   (a node may list/watch only its own pods, and get only claims its pods use);
//! - fault injection, connection control, a request log, gauges and
//!   [`TestApiServer::wait_for`].
//!
//! Claim status (`PATCH .../resourceclaims/<name>/status`) is served as server-side apply
//! of `status.devices` only, with per-manager ownership of its entries ([`claim_status`]).
//!
//! It does NOT emulate: JSON patch and server-side apply of other objects (`415`; merge and strategic merge
//! patches of slices are applied as RFC 7386 merge patches), managedFields, `dryRun`,
//! `limit`/`continue` pagination (lists are always complete), label selectors, list
//! `resourceVersion`/`resourceVersionMatch` semantics (lists always read the latest state),
//! DeleteCollection, finalizers and graceful deletion, `/status` subresources but claims', list or
//! watch of claims and nodes, writes of claims, nodes and pods by clients, pod get, DeviceClasses and other
//! kinds, protobuf and CBOR encodings, aggregated discovery (`apidiscovery.k8s.io/v2`),
//! OpenAPI, RBAC objects, service-account tokens and their node-name extra, admission
//! webhooks and ValidatingAdmissionPolicies, API priority and fairness (429 only when
//! injected), full validation (only the limits in `validate.rs`), watch events that move
//! objects in or out of a field selector (events are filtered on the new object; the
//! selectable slice fields are immutable anyway), and client certificates with more than
//! two groups. Bodies over 3 MiB get `413` like the real default limit. Writes made through
//! the handle (`create_slice`, `edit_slice`) bypass validation and canonicalization. Error
//! reasons follow the real server: an expired watch is reason `Expired` with code 410.
//!
//! Run it on real time: under paused tokio time its timers (bookmarks, watch timeouts,
//! injected delays, `wait_for` deadlines) jump ahead whenever the runtime waits for socket
//! I/O.

mod authz;
mod claim_status;
mod claims;
mod control;
mod convert;
mod discovery;
mod faults;
mod handler;
mod kubeconfig;
mod meta;
mod objects;
mod pki;
mod pods;
mod quantity;
mod query;
mod reviews;
mod server;
mod slices;
mod status;
mod store;
mod validate;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch as notify;
use tokio::task::JoinHandle;

pub use authz::ForbidRule;
pub use claims::{AllocatedDevice, ClaimBuilder};
pub use convert::ApiVersion;
pub use faults::{Fault, FaultAction};
pub use kubeconfig::Identity;
pub use pods::bound_pod;
pub use quantity::canonical as canonical_quantity;
pub use store::{RequestRecord, State};

/// An authenticated user, as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub user: String,
    pub groups: Vec<String>,
}

/// Start-up options; `Options::default()` is a Kubernetes 1.36 server serving only v1.
#[derive(Debug, Clone)]
pub struct Options {
    /// `gitVersion` of `/version`, e.g. `v1.36.2`.
    pub git_version: String,
    /// Served resource.k8s.io versions; the preferred version is the most stable one.
    pub versions: Vec<ApiVersion>,
    /// Emulate the node authorizer and NodeRestriction for `system:node:*` identities.
    pub node_authorizer: bool,
    /// Interval between watch bookmarks (sent only with `allowWatchBookmarks=true`).
    pub bookmark_interval: Duration,
    /// Number of events kept for watches; older resourceVersions get 410.
    pub history_limit: usize,
    /// Answer a watch from a compacted resourceVersion with HTTP 410 instead of the real
    /// server's 200 + ERROR event.
    pub gone_as_http_status: bool,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            git_version: "v1.36.2".to_owned(),
            versions: vec![ApiVersion::V1],
            node_authorizer: false,
            bookmark_interval: Duration::from_millis(200),
            history_limit: 1000,
            gone_as_http_status: false,
            port: 0,
        }
    }
}

/// Failures of the test server's own operations.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("binding the test API server to {addr} failed: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("preparing test certificates failed: {0}")]
    Pki(#[from] pki::PkiError),
    #[error("writing the kubeconfig {path} failed: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
}

/// State shared by the handle, the accept loop and every connection.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Generation bumped after every change of `state` (objects, log, knobs).
    pub(crate) changed: notify::Sender<u64>,
    /// Generation bumped to end all open watches.
    pub(crate) close_watches: notify::Sender<u64>,
    pub(crate) pki: pki::Pki,
    pub(crate) opts: Options,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state and wakes watches and waiters.
    pub(crate) fn mutate<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.send_modify(|g| *g += 1);
        out
    }
}

/// The running test API server. Dropping it stops serving and closes every connection.
pub struct TestApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    accept: Mutex<Option<JoinHandle<()>>>,
    /// Bumped to close every open connection.
    kill: notify::Sender<server::Shutdown>,
}

impl TestApiServer {
    /// Generates certificates, binds `127.0.0.1:{opts.port}` and starts serving.
    pub async fn start(opts: Options) -> Result<Self, ApiServerError> {
        let pki = pki::Pki::generate()?;
        let tls = pki.server_config()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], opts.port));
        let listener = server::bind(addr).map_err(|source| ApiServerError::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| ApiServerError::Bind { addr, source })?;
        let mut state = State::new(opts.history_limit);
        state.node_authorizer = opts.node_authorizer;
        state.gone_as_http_status = opts.gone_as_http_status;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changed: notify::Sender::new(0),
            close_watches: notify::Sender::new(0),
            pki,
            opts,
        });
        let kill = notify::Sender::new(server::Shutdown::default());
        let accept = server::spawn_accept(listener, shared.clone(), tls.clone(), kill.subscribe());
        Ok(Self { shared, addr, tls, accept: Mutex::new(Some(accept)), kill })
    }

    /// `https://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> String {
        self.shared.pki.ca_pem()
    }

    /// PEM of the CA that client certificates must chain to.
    pub fn client_ca_pem(&self) -> String {
        self.shared.pki.client_ca_pem()
    }

    /// A client certificate and PKCS#8 key (PEM) for `user` with up to two `groups`.
    pub fn issue_client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), ApiServerError> {
        Ok(self.shared.pki.issue_client_cert(user, groups)?)
    }

    /// Like [`Self::issue_client_cert`] but signed by a CA the server does not trust.
    pub fn issue_foreign_client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), ApiServerError> {
        Ok(self.shared.pki.issue_foreign_client_cert(user, groups)?)
    }

    /// Accepts `Authorization: Bearer {token}` as `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let info = UserInfo { user: user.to_owned(), groups: groups.iter().map(|g| (*g).to_owned()).collect() };
        self.shared.mutate(|s| s.tokens.0.insert(token.to_owned(), info));
    }

    /// Writes `dir/kubeconfig-{user}.yaml` (mode 0600) for `identity` with embedded
    /// `*-data` credentials; a token identity is registered with the server too.
    pub fn write_kubeconfig(&self, dir: &Path, identity: &Identity) -> Result<PathBuf, ApiServerError> {
        kubeconfig::write(self, dir, identity, kubeconfig::Style::Embedded)
    }

    /// Like [`Self::write_kubeconfig`], but the CA, client certificate and key are PEM files
    /// in `dir` referenced by path (`certificate-authority`, `client-certificate`,
    /// `client-key`), as in k3s-written kubeconfigs.
    pub fn write_kubeconfig_files(&self, dir: &Path, identity: &Identity) -> Result<PathBuf, ApiServerError> {
        kubeconfig::write(self, dir, identity, kubeconfig::Style::Files)
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(task) = self.accept.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        self.kill.send_modify(|k| {
            k.generation += 1;
            k.graceful = false;
        });
    }
}
