//! Running the two plugin sockets: start order, registration state, and shutdown.
//!
//! The DRA socket (`<plugins dir>/<driver>/dra.sock`: DRAPlugin v1 and v1beta1, and
//! optionally the DRAResourceHealth stream) is bound
//! and served first, then the registration socket (`<registry dir>/<driver>-reg.sock`),
//! so the endpoint is ready when the kubelet reacts to the registration socket. Shutdown
//! stops accepting on both, lets calls in flight finish within a grace period, aborts
//! what is still running after it, and removes both sockets.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Server;

use super::PluginError;
use super::dra::{DraCalls, DraV1, DraV1beta1};
use super::handler::DraHandler;
use super::health::{HealthList, HealthService};
use super::inflight::InFlight;
use super::observer::{CallObserver, NoObserver};
use super::proto::dra_v1::dra_plugin_server::DraPluginServer as DraV1Server;
use super::proto::dra_v1beta1::dra_plugin_server::DraPluginServer as DraV1beta1Server;
use super::proto::health_v1::dra_resource_health_server::DraResourceHealthServer as HealthV1Server;
use super::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthV1alpha1Server;
use super::proto::health_v1beta1::dra_resource_health_server::DraResourceHealthServer as HealthV1beta1Server;
use super::proto::registration::registration_server::RegistrationServer;
use super::registration::{RegistrationService, RegistrationState};
use super::socket::{self, BoundSocket, Connections, FileId};
use crate::config::Paths;
use crate::util::fdstore::Inherited;

/// The DRA socket's name in systemd's fd store.
const DRA_ROLE: &str = "dra";
/// The registration socket's name in systemd's fd store before the kubelet registered it.
const REGISTRATION_ROLE: &str = "registration";
/// The registration socket's name in systemd's fd store once the kubelet registered it.
const REGISTERED_ROLE: &str = "registered";

/// How long to wait, after the grace period, for aborted calls and connections to end.
const FORCE_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// One served socket.
struct Served {
    name: &'static str,
    path: PathBuf,
    file: FileId,
    /// A copy of the listening socket, for systemd's fd store.
    listening: Option<OwnedFd>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    connections: Arc<Connections>,
}

/// The optional parts of a [`PluginServer`].
#[derive(Default)]
pub struct PluginOptions {
    /// Serve `v1alpha1.DRAResourceHealth` from these complete device lists and advertise it.
    pub health: Option<watch::Receiver<HealthList>>,
    /// Told about every finished DRAPlugin call and every registration status.
    pub observer: Option<Arc<dyn CallObserver>>,
    /// Listening sockets handed back from systemd's fd store: the DRA socket (`dra`) and
    /// the registration socket (`registered` when the kubelet had registered it, else
    /// `registration`) are served on them when they are still edra's.
    pub inherited: Option<Arc<Mutex<Inherited>>>,
}

impl std::fmt::Debug for PluginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginOptions")
            .field("health", &self.health.is_some())
            .field("observer", &self.observer.is_some())
            .field("inherited", &self.inherited.is_some())
            .finish()
    }
}

/// The kubelet plugin: the DRA socket and the registration socket, both being served.
pub struct PluginServer {
    dra_socket: PathBuf,
    registration_socket: PathBuf,
    registration: watch::Receiver<RegistrationState>,
    inflight: Arc<InFlight>,
    /// Set at shutdown: ends the health streams, which would otherwise never finish.
    stopping: watch::Sender<bool>,
    /// Registration first, so shutdown waits on it first.
    served: Vec<Served>,
    /// Leave the socket files at shutdown: systemd's fd store keeps them listening.
    keep_files: bool,
}

impl std::fmt::Debug for PluginServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginServer")
            .field("dra_socket", &self.dra_socket)
            .field("registration_socket", &self.registration_socket)
            .field("registration", &*self.registration.borrow())
            .finish_non_exhaustive()
    }
}

impl PluginServer {
    /// Binds and serves the DRA socket, then the registration socket, for `driver`.
    /// Must be called from within a Tokio runtime. Creates missing directories (0750),
    /// replaces stale sockets of its own names, and refuses to touch anything else at
    /// those paths.
    pub fn start<H: DraHandler>(paths: &Paths, driver: &str, handler: Arc<H>) -> Result<PluginServer, PluginError> {
        Self::start_with(paths, driver, handler, PluginOptions::default())
    }

    /// Like [`PluginServer::start`], and also serves `v1alpha1.DRAResourceHealth` from
    /// `health` (complete device lists) and advertises it to the kubelet.
    pub fn start_with_health<H: DraHandler>(
        paths: &Paths,
        driver: &str,
        handler: Arc<H>,
        health: watch::Receiver<HealthList>,
    ) -> Result<PluginServer, PluginError> {
        Self::start_with(paths, driver, handler, PluginOptions { health: Some(health), ..PluginOptions::default() })
    }

    /// Like [`PluginServer::start`], with the optional parts in `options`: the device
    /// health stream and an observer of finished calls and registration statuses.
    pub fn start_with<H: DraHandler>(
        paths: &Paths,
        driver: &str,
        handler: Arc<H>,
        options: PluginOptions,
    ) -> Result<PluginServer, PluginError> {
        let PluginOptions { health, observer, inherited } = options;
        let take =
            |role: &str| inherited.as_ref().and_then(|i| i.lock().unwrap_or_else(PoisonError::into_inner).take(role));
        let observer = observer.unwrap_or_else(|| Arc::new(NoObserver));
        crate::config::validate_driver_name(driver)
            .map_err(|reason| PluginError::InvalidDriverName { name: driver.to_string(), reason })?;
        let dra_path = absolute(&paths.dra_socket(driver))?;
        let reg_path = absolute(&paths.registration_socket(driver))?;
        let endpoint =
            dra_path.to_str().ok_or_else(|| PluginError::NonUtf8Path { path: dra_path.clone() })?.to_string();

        socket::prepare_dir(&paths.plugins_dir, false)?;
        socket::prepare_dir(&paths.plugin_dir(driver), true)?;
        // Both sockets are staged in the driver's own directory, which the kubelet does not watch.
        let stage = absolute(&paths.plugin_dir(driver))?;
        let dra_socket = socket::adopt_or_bind(&dra_path, &stage, take(DRA_ROLE))?;
        let inflight = InFlight::new();
        let calls = DraCalls::new(handler, Arc::clone(&inflight), Arc::clone(&observer));
        let (stopping, stopping_rx) = watch::channel(false);
        let serves_health = health.is_some();
        let health = health.map(|source| HealthService::new(source, stopping_rx));
        let dra_router = Server::builder()
            .add_service(DraV1Server::new(DraV1(Arc::clone(&calls))))
            .add_service(DraV1beta1Server::new(DraV1beta1(calls)))
            .add_optional_service(health.clone().map(HealthV1Server::new))
            .add_optional_service(health.clone().map(HealthV1beta1Server::new))
            .add_optional_service(health.map(HealthV1alpha1Server::new));
        let dra = serve(DRA_ROLE, dra_socket, move |incoming, stop| async move {
            dra_router.serve_with_incoming_shutdown(incoming, stop).await
        });
        tracing::info!(path = %dra_path.display(), health = serves_health, "serving DRAPlugin v1 and v1beta1");

        // A registration socket the kubelet had registered before a restart stays registered:
        // the kubelet drops a registration only when the socket file goes.
        let kept = take(REGISTERED_ROLE);
        let first = if kept.is_some() { RegistrationState::Registered } else { RegistrationState::Unknown };
        let inherited_reg = kept.or_else(|| take(REGISTRATION_ROLE));
        let (state_tx, registration) = watch::channel(first);
        let registered = socket::prepare_dir(&paths.registry_dir, false)
            .and_then(|()| socket::adopt_or_bind(&reg_path, &stage, inherited_reg));
        let reg_socket = match registered {
            Ok(bound) => bound,
            Err(e) => {
                drop(PluginServer {
                    dra_socket: dra_path,
                    registration_socket: reg_path,
                    registration,
                    inflight,
                    stopping,
                    served: vec![dra],
                    keep_files: false,
                });
                return Err(e);
            }
        };
        let service = RegistrationService::new(driver.to_string(), endpoint, serves_health, state_tx, observer);
        let reg_router = Server::builder().add_service(RegistrationServer::new(service));
        let reg = serve(REGISTRATION_ROLE, reg_socket, move |incoming, stop| async move {
            reg_router.serve_with_incoming_shutdown(incoming, stop).await
        });
        tracing::info!(path = %reg_path.display(), driver, "serving plugin registration");

        Ok(PluginServer {
            dra_socket: dra_path,
            registration_socket: reg_path,
            registration,
            inflight,
            stopping,
            served: vec![reg, dra],
            keep_files: false,
        })
    }

    /// The listening sockets with the names they are kept under in systemd's fd store:
    /// `dra.<dev>.<ino>`, and `registration.<dev>.<ino>` or, once the kubelet has
    /// registered edra, `registered.<dev>.<ino>`.
    pub fn listening_sockets(&self) -> Vec<(String, BorrowedFd<'_>)> {
        let registered = self.registration.borrow().is_registered();
        self.served
            .iter()
            .filter_map(|s| {
                let role = if s.name == REGISTRATION_ROLE && registered { REGISTERED_ROLE } else { s.name };
                let fd = s.listening.as_ref()?;
                Some((crate::util::fdstore::store_name(role, s.file.dev(), s.file.ino()), fd.as_fd()))
            })
            .collect()
    }

    /// Leaves the socket files in place at shutdown, for sockets systemd's fd store keeps
    /// listening: the next process serves them, and the kubelet never sees them go.
    pub fn keep_socket_files(&mut self) {
        self.keep_files = true;
    }

    /// Whether the socket files stay at shutdown ([`PluginServer::keep_socket_files`]).
    pub fn keeps_socket_files(&self) -> bool {
        self.keep_files
    }

    /// The kubelet's verdict on the registration, updated on every status it sends.
    pub fn registration(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// Whether both sockets are still being served (for readiness): false once a server
    /// stopped unexpectedly.
    pub fn is_serving(&self) -> bool {
        !self.served.is_empty() && self.served.iter().all(|s| !s.task.is_finished())
    }

    /// The absolute path of the DRA socket (the endpoint given to the kubelet).
    pub fn dra_socket(&self) -> &Path {
        &self.dra_socket
    }

    /// The absolute path of the registration socket.
    pub fn registration_socket(&self) -> &Path {
        &self.registration_socket
    }

    /// Stops accepting connections, lets calls in flight finish for up to `grace`, then
    /// aborts the rest and removes both sockets. Returns how many calls were aborted.
    pub async fn shutdown(mut self, grace: Duration) -> usize {
        let mut served = std::mem::take(&mut self.served);
        self.stopping.send_replace(true);
        for s in &mut served {
            if let Some(stop) = s.stop.take() {
                let _ = stop.send(());
            }
        }
        let deadline = crate::kube::backoff::deadline_in(grace);
        let mut graceful = true;
        for s in &mut served {
            if tokio::time::timeout_at(deadline, &mut s.task).await.is_err() {
                graceful = false;
            }
        }
        let mut aborted = 0;
        if !graceful {
            aborted = self.inflight.len();
            tracing::warn!(
                in_flight = aborted,
                grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                "calls still running after the grace period; aborting them"
            );
            self.inflight.abort_all();
            let _ = tokio::time::timeout(FORCE_CLOSE_WAIT, self.inflight.idle()).await;
            for s in &mut served {
                if s.task.is_finished() {
                    continue;
                }
                let closed = s.connections.close_all();
                tracing::warn!(socket = s.name, connections = closed, "closing connections still open");
                if tokio::time::timeout(FORCE_CLOSE_WAIT, &mut s.task).await.is_err() {
                    tracing::warn!(socket = s.name, "the server did not stop; abandoning it");
                    s.task.abort();
                }
            }
        }
        if self.keep_files {
            tracing::info!(graceful, "plugin sockets closed; systemd keeps them listening for the next start");
        } else {
            for s in &served {
                socket::remove_own(&s.path, s.file);
            }
            tracing::info!(graceful, "plugin sockets closed");
        }
        aborted
    }
}

impl Drop for PluginServer {
    /// Without [`PluginServer::shutdown`]: stop at once and remove the sockets.
    fn drop(&mut self) {
        if self.served.is_empty() {
            return;
        }
        self.stopping.send_replace(true);
        self.inflight.abort_all();
        for s in self.served.drain(..) {
            s.task.abort();
            s.connections.close_all();
            if !self.keep_files {
                socket::remove_own(&s.path, s.file);
            }
        }
    }
}

/// Spawns `run` on the bound socket's connections; the returned value stops it.
fn serve<R, Fut>(name: &'static str, bound: BoundSocket, run: R) -> Served
where
    R: FnOnce(
            futures_util::stream::BoxStream<'static, std::io::Result<socket::PluginStream>>,
            futures_util::future::BoxFuture<'static, ()>,
        ) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    use futures_util::{FutureExt, StreamExt};
    use std::os::fd::AsFd;
    let listening = bound.listener.as_fd().try_clone_to_owned().ok();
    let BoundSocket { path, listener, file } = bound;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let connections = Arc::new(Connections::default());
    // The stop ends the stream of connections (after connections accepted just before it have
    // sent their first call), and the end of that stream stops the server gracefully: a
    // signal to the server itself would close connections still in their handshake at once.
    let incoming = socket::incoming(listener, path.clone(), Arc::clone(&connections), stop_rx).boxed();
    let stop = futures_util::future::pending().boxed();
    let task = tokio::spawn(async move {
        if let Err(e) = run(incoming, stop).await {
            tracing::error!(socket = name, error = %e, "serving the plugin socket failed");
        }
    });
    Served { name, path, file, listening, stop: Some(stop_tx), task, connections }
}

fn absolute(path: &Path) -> Result<PathBuf, PluginError> {
    std::path::absolute(path).map_err(|source| PluginError::Endpoint { path: path.to_path_buf(), source })
}
