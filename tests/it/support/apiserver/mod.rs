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
//! - `GET /api/v1/nodes/{name}`; ResourceSlice list (with `spec.nodeName`/`spec.driver`/
//!   `metadata.name` field selectors), get, create (generateName), update and merge patch
//!   (optimistic concurrency), delete (preconditions) and watch (bookmarks, timeouts,
//!   streaming lists with `sendInitialEvents`, `410` for compacted resourceVersions);
//!   ResourceClaim get; v1beta1 shape conversion in both directions;
//! - a global integer resourceVersion shared by all kinds; what storage does to objects
//!   (canonical quantities, taint `timeAdded`, no write for an identical update, `500` for a
//!   create carrying a resourceVersion); validation of the ResourceSlice limits edra can hit
//!   (`422` with causes); Status bodies on every failure;
//! - optional node-authorizer + NodeRestriction emulation and test-forbidden combinations;
//! - fault injection, connection control, a request log, gauges and
//!   [`TestApiServer::wait_for`].
//!
//! It does NOT emulate: JSON patch and server-side apply (`415`; merge and strategic merge
//! patches of slices are applied as RFC 7386 merge patches), managedFields, `dryRun`,
//! `limit`/`continue` pagination (lists are always complete), label selectors, list
//! `resourceVersion`/`resourceVersionMatch` semantics (lists always read the latest state),
//! DeleteCollection, finalizers and graceful deletion, the `/status` subresources, list or
//! watch of claims and nodes, writes of claims and nodes by clients, DeviceClasses and other
//! kinds, protobuf and CBOR encodings, aggregated discovery (`apidiscovery.k8s.io/v2`),
//! OpenAPI, RBAC objects, admission webhooks and ValidatingAdmissionPolicies, API priority
//! and fairness (429 only when injected), full validation (only the limits in
//! `validate.rs`), watch events that move objects in or out of a field selector (events are
//! filtered on the new object), request body size limits, and client certificates with more
//! than two groups. Writes made through the handle (`create_slice`, `edit_slice`) bypass
//! validation and canonicalization. Error reasons follow the real server: an expired watch
//! is reason `Expired` with code 410.

mod authz;
mod claims;
mod convert;
mod discovery;
mod faults;
mod handler;
mod kubeconfig;
mod pki;
mod quantity;
mod query;
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

use serde_json::Value;
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;

pub use authz::ForbidRule;
pub use claims::{AllocatedDevice, ClaimBuilder};
pub use convert::ApiVersion;
pub use faults::{Fault, FaultAction};
pub use kubeconfig::Identity;
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
        self.shared.mutate(|s| s.tokens.insert(token.to_owned(), info));
    }

    /// Writes `dir/kubeconfig-{user}.yaml` for `identity` (a token identity is registered too).
    pub fn write_kubeconfig(&self, dir: &Path, identity: &Identity) -> Result<PathBuf, ApiServerError> {
        kubeconfig::write(self, dir, identity)
    }

    /// Adds a Node (idempotent); returns its uid.
    pub fn add_node(&self, name: &str) -> String {
        self.shared.mutate(|s| s.add_node(name))
    }

    /// Creates or replaces a ResourceClaim given in v1 shape (see [`ClaimBuilder`]); returns
    /// the stored object (uid kept across replacements unless the claim sets one).
    pub fn put_claim(&self, claim: Value) -> Value {
        self.shared.mutate(|s| s.put_claim(claim))
    }

    /// Replaces `status` of a stored claim; `None` if it does not exist.
    pub fn set_claim_status(&self, namespace: &str, name: &str, status: Value) -> Option<Value> {
        self.shared.mutate(|s| {
            let mut claim = s.claim(namespace, name)?;
            claim["status"] = status;
            Some(s.put_claim(claim))
        })
    }

    pub fn delete_claim(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.mutate(|s| s.delete_claim(namespace, name))
    }

    /// Records that a pod on `node` uses the claim, so the node authorizer lets `node` get it.
    pub fn mark_claim_on_node(&self, namespace: &str, name: &str, node: &str) {
        self.shared.mutate(|s| {
            s.claim_nodes.entry((namespace.to_owned(), name.to_owned())).or_default().insert(node.to_owned())
        });
    }

    /// All stored slices (v1 shape with kind/apiVersion), ordered by name.
    pub fn slices(&self) -> Vec<Value> {
        self.shared.lock().slices()
    }

    pub fn slice(&self, name: &str) -> Option<Value> {
        self.shared.lock().slice(name)
    }

    /// Creates a slice as another writer would (no validation); returns the stored object.
    pub fn create_slice(&self, slice: Value) -> Value {
        let name = slice["metadata"]["name"].as_str().map_or_else(store::random_suffix, str::to_owned);
        self.shared.mutate(|s| s.create_slice(&name, slice))
    }

    /// A foreign edit: applies `f` to the stored slice, bumps its resourceVersion and emits
    /// MODIFIED. `None` if the slice does not exist.
    pub fn edit_slice(&self, name: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        self.shared.mutate(|s| {
            let mut slice = s.slices.get(name)?.clone();
            f(&mut slice);
            s.replace_slice(name, slice)
        })
    }

    /// Deletes one slice as the kubelet would; `true` if it existed.
    pub fn delete_slice_as_kubelet(&self, name: &str) -> bool {
        self.shared.mutate(|s| s.delete_slice(name).is_some())
    }

    /// Kubelet-style wipe: deletes every slice of `node` (and of `driver`, if given).
    /// Returns how many were deleted.
    pub fn delete_slices_where(&self, node: &str, driver: Option<&str>) -> usize {
        self.shared.mutate(|s| {
            let names: Vec<String> = s
                .slices
                .iter()
                .filter(|(_, v)| v["spec"]["nodeName"].as_str() == Some(node))
                .filter(|(_, v)| driver.is_none_or(|d| v["spec"]["driver"].as_str() == Some(d)))
                .map(|(k, _)| k.clone())
                .collect();
            names.iter().filter(|n| s.delete_slice(n).is_some()).count()
        })
    }

    /// Adds a fault (see [`Fault::next`]).
    pub fn inject(&self, fault: Fault) {
        self.shared.mutate(|s| s.faults.push(fault));
    }

    /// Forbids `verb` on `resource` (plural, e.g. `resourceslices`) for `user`.
    pub fn forbid(&self, user: &str, verb: &str, resource: &str) {
        let rule = ForbidRule { user: user.to_owned(), verb: verb.to_owned(), resource: resource.to_owned() };
        self.shared.mutate(|s| s.forbid.push(rule));
    }

    pub fn set_node_authorizer(&self, enabled: bool) {
        self.shared.mutate(|s| s.node_authorizer = enabled);
    }

    pub fn set_gone_as_http_status(&self, enabled: bool) {
        self.shared.mutate(|s| s.gone_as_http_status = enabled);
    }

    /// Drops the event history: watches from any older resourceVersion get 410.
    pub fn compact(&self) {
        self.shared.mutate(State::compact);
    }

    /// Ends every open watch stream cleanly (as an API server restart or timeout would).
    pub fn close_watches(&self) {
        self.shared.close_watches.send_modify(|g| *g += 1);
    }

    /// Stops accepting connections: once this returns, new connects are refused (the
    /// listening socket is closed); open connections stay.
    pub async fn refuse_connections(&self) {
        let task = self.accept.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(task) = task {
            task.abort();
            // The listener is dropped with the task; wait for that.
            let _ = task.await;
        }
    }

    /// Accepts connections again on the same port (after refuse/stop).
    pub fn accept_connections(&self) -> Result<(), ApiServerError> {
        let mut accept = self.accept.lock().unwrap_or_else(PoisonError::into_inner);
        if accept.is_some() {
            return Ok(());
        }
        let listener = server::bind(self.addr).map_err(|source| ApiServerError::Bind { addr: self.addr, source })?;
        *accept = Some(server::spawn_accept(listener, self.shared.clone(), self.tls.clone(), self.kill.subscribe()));
        Ok(())
    }

    /// Stops serving (state is kept): once this returns, new connects are refused and every
    /// open connection, watches included, has been closed.
    pub async fn stop(&self) {
        self.refuse_connections().await;
        self.shut_down_connections(false).await;
    }

    /// Stops serving like an API server that shuts down cleanly: refuses new connections,
    /// ends watches, sends HTTP/2 GOAWAY (HTTP/1.1 `Connection: close`) and lets in-flight
    /// requests finish; returns when every connection is closed. State is kept.
    pub async fn stop_gracefully(&self) {
        self.refuse_connections().await;
        self.close_watches();
        self.shut_down_connections(true).await;
    }

    async fn shut_down_connections(&self, graceful: bool) {
        self.kill.send_modify(|k| {
            k.generation += 1;
            k.graceful = graceful;
        });
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if self.shared.lock().open_connections == 0 || changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Serves again on the same port with the same state and certificates.
    pub fn restart(&self) -> Result<(), ApiServerError> {
        self.accept_connections()
    }

    /// Current end of the request log (see [`Self::writes_since`]).
    pub fn request_mark(&self) -> usize {
        self.shared.lock().request_mark()
    }

    /// Write requests (create/update/patch/delete) logged at or after `mark`.
    pub fn writes_since(&self, mark: usize) -> usize {
        self.shared.lock().writes_since(mark)
    }

    /// A snapshot of the request log.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests().to_vec()
    }

    /// Runs `f` on the current state (read-only).
    pub fn with_state<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.shared.lock())
    }

    /// Waits until `f(state)` holds, re-checking after every change; fails after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&State) -> bool,
    ) -> Result<(), ApiServerError> {
        let mut changed = self.shared.changed.subscribe();
        let check = async {
            loop {
                changed.borrow_and_update();
                if f(&self.shared.lock()) {
                    return;
                }
                if changed.changed().await.is_err() {
                    // The sender lives in `shared`, which we hold: unreachable, but never spin.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, check)
            .await
            .map_err(|_| ApiServerError::Timeout { what: what.to_owned(), timeout })
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
