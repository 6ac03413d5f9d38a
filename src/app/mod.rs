//! Wiring for `edra run`: start-up order, task supervision and shutdown.
//!
//! Start: credentials (offline; a malformed kubeconfig stops here) → discover devices →
//! open and recover the state → serve the DRA socket, then the registration socket →
//! `READY=1` to systemd (serving from the local state, whatever the kubelet and the API
//! server do) → publish slices; the metrics address is bound first and served once the plugin runs (an
//! address another process holds is bound later, when free; the kubelet is served
//! regardless). The API server is needed only for publishing and for first-time prepares:
//! when it is unreachable the kubelet is still served, so claims prepared before keep
//! working and can be released. SIGTERM/SIGINT: stop publishing (slices stay), let
//! in-flight kubelet calls finish within the grace period, remove our sockets.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::Config;
use crate::health::view::Rules;
use crate::health::{HealthMonitor, HealthSettings, HealthSnapshot};
use crate::inventory::{self, DeviceBackend, Inventory};
use crate::kube::{self, Client, Cluster};
use crate::plugin::{HealthList, PluginOptions, PluginServer};
use crate::prepare::prefetch::Prefetcher;
use crate::prepare::{ClaimSource, PrepareSettings, Preparer};
use crate::publish::status::PublishStatus;
use crate::state::Store;
use crate::telemetry::http::{Endpoints, MetricsPort, Readiness};
use crate::telemetry::metrics::{CallMetrics, Metrics, StateSources};
use crate::telemetry::sdnotify::Notifier;
use crate::util::{error_chain, stopped};

mod handover;
mod kept_sockets;
mod memory_limit;
mod tasks;
use tasks::*;

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Configuration that only shows itself as wrong at start (e.g. a malformed kubeconfig).
    #[error("{0}")]
    Config(String),
    /// Several problems found at start, each on its own (e.g. credentials and the GPUs).
    #[error("{}", .0.join("; "))]
    Problems(Vec<String>),
    /// Anything else.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Runs the agent on a new Tokio runtime until SIGTERM/SIGINT.
pub fn run_blocking(config: Config) -> Result<(), AppError> {
    // Before the runtime starts its threads, so they all share the one arena.
    match crate::malloc::limit_arenas() {
        crate::malloc::ArenaLimit::Applied(n) => tracing::debug!(arenas = n, "malloc arenas limited"),
        crate::malloc::ArenaLimit::FromEnvironment => {
            info!("malloc arenas as MALLOC_ARENA_MAX or GLIBC_TUNABLES set them")
        }
        crate::malloc::ArenaLimit::Unavailable => {}
    }
    // One worker thread: every blocking step (disk, CDI specs, GPU tools, NVML) runs on the
    // blocking pool, so the async side only decodes, plans and answers. With one worker a
    // kubelet call never hops between workers (no wake-up of a parked thread mid-call),
    // which took 0.05–0.1 ms off every answered call (docs/benchmarks.md).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(anyhow::anyhow!("cannot start the async runtime: {e}")))?;
    rt.block_on(async {
        let shutdown = shutdown_signal()?;
        run(config, shutdown).await
    })
}

/// A receiver that turns true on SIGTERM or SIGINT.
fn shutdown_signal() -> Result<watch::Receiver<bool>, AppError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| anyhow::anyhow!("cannot handle SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| anyhow::anyhow!("cannot handle SIGINT: {e}"))?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = which, "shutting down");
        let _ = tx.send(true);
    });
    Ok(rx)
}

fn is_credential_problem(e: &kube::Error) -> bool {
    matches!(
        e,
        kube::Error::Kubeconfig { .. }
            | kube::Error::InCluster { .. }
            | kube::Error::CredentialFile { .. }
            | kube::Error::NoCredentials { .. }
            | kube::Error::TlsConfig { .. }
    )
}

/// What a started agent serves, sent once both kubelet sockets are in place: from then on
/// the kubelet (or a test) can register and call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// The DRAPlugin socket.
    pub dra_socket: PathBuf,
    /// The registration socket the kubelet watches for.
    pub registration_socket: PathBuf,
}

impl Serving {
    fn of(plugin: &PluginServer) -> Self {
        Serving {
            dra_socket: plugin.dra_socket().to_path_buf(),
            registration_socket: plugin.registration_socket().to_path_buf(),
        }
    }
}

/// Runs the agent until `shutdown` turns true.
pub async fn run(config: Config, shutdown: watch::Receiver<bool>) -> Result<(), AppError> {
    run_signalling(config, shutdown, None).await
}

/// [`run`], sending `ready` what it serves as soon as the kubelet sockets are in place; if
/// start-up fails first, `ready` is dropped and the error is returned.
pub async fn run_signalling(
    config: Config,
    outside: watch::Receiver<bool>,
    ready: Option<oneshot::Sender<Serving>>,
) -> Result<(), AppError> {
    let client = client_from_config(&config).map_err(|e| with_backend_problem(&config, e))?;
    info!(server = client.server_url(), identity = client.identity(), node = %config.node_name, "starting edra {}", crate::util::VERSION);
    // One agent per node: the lock is taken (or a running agent found that hands over)
    // before anything touches the sockets, the CDI specs or the state.
    let claim = handover::claim_node(&config)?;
    let (stop, mut shutdown) = follow(outside);
    let metrics_listener = bind_metrics(&config)?;
    let (backend, inventory_tx, inventory_rx) = discover_devices(&config).await?;
    let Some(taken) = handover::take_node(&config, claim, &mut shutdown).await? else { return Ok(()) };
    let _instance = taken.lock;

    let cluster = Arc::new(Cluster::new(client.clone()));
    let (prefetcher, claims) = claim_source(&config, &cluster);
    let memory_limits = memory_limit::from_config(&config)?;
    let preparer =
        open_and_recover(&config, inventory_rx.clone(), claims, backend.clone(), memory_limits.clone()).await?;
    let serving_limits = serve_memory_limits(memory_limits, &preparer, &shutdown)?;
    let store = preparer.store().clone();
    let claims_changed = preparer.claims_changed();
    let store_health = preparer.store().health();
    let held_shares = preparer.shared_gpus();
    let owned_mig = preparer.owned_mig();
    let mig_changes = preparer.mig_changes();

    let healing = tokio::spawn(heal_state(preparer.clone(), shutdown.clone()));
    let (monitor, health_list_rx, listing_health) =
        start_health(&config, backend.name(), &inventory_rx, &shutdown).await;
    let health_snapshot = monitor.snapshot.clone();
    let calls = CallMetrics::new();
    let (options, relaunch, inherited) = handover::plugin_options(taken.handed, &preparer, &calls, health_list_rx);
    let gpu_changes = preparer.gpu_change_counts();
    let mps_stats = preparer.mps_stats();
    let supervising = tokio::spawn(supervise_mps(preparer.clone(), config.mps.check_interval, shutdown.clone()));
    let (releasing, prefetching, pods_in_use) =
        watch_claims(&config, &preparer, &cluster, prefetcher, &client, &shutdown);
    let mut plugin = serve_kubelet(&config, preparer, options, ready)?;
    let status_socket = kept_sockets::StatusSocket::take(&inherited);
    let (notifier, storing) = started_for_systemd(&mut plugin, &inherited, &shutdown);

    let views = Views {
        inventory: inventory_rx.clone(),
        health: health_snapshot.clone(),
        store: store.clone(),
        owned_mig: owned_mig.clone(),
    };
    let (publishing, status_rx) = start_publishing(&config, &cluster, held_shares, &views, &shutdown);
    let kept_status = (status_socket, notifier.as_ref());
    let serving_status =
        serve_status(&config, backend.clone(), &views, (&plugin, &status_rx), pods_in_use, kept_status, &shutdown);
    let writing_status = keep_claim_status(&config, &cluster, &views, claims_changed, &shutdown);
    let rediscovering =
        tokio::spawn(rediscover(backend, inventory_tx, (config.rediscovery_interval, mig_changes), shutdown.clone()));
    let serving_metrics = metrics_listener.map(|listener| {
        let readiness =
            Readiness { registration: plugin.registration(), publish: status_rx.clone(), state: store_health };
        let metrics = metrics(&client, &plugin, &status_rx, &calls, (gpu_changes, mps_stats), &views);
        listener.serve(Endpoints { metrics, readiness }, shutdown.clone())
    });
    let watchdog = notifier.clone().map(|n| tokio::spawn(ping_watchdog(n, shutdown.clone())));
    let readiness = tokio::spawn(report_readiness(
        plugin.registration(),
        status_rx,
        (notifier.clone(), config.paths.registry_dir.clone()),
        shutdown.clone(),
    ));

    let ending = handover::serve(&config, plugin, relaunch, &mut shutdown).await;
    stop.send_replace(true);
    let tasks = [
        publishing,
        rediscovering,
        readiness,
        healing,
        supervising,
        releasing,
        listing_health,
        monitor.task,
        writing_status,
    ];
    let optional = [watchdog, serving_metrics, prefetching, serving_status, serving_limits, storing];
    let tasks = tasks.into_iter().chain(optional.into_iter().flatten());
    drain(notifier, ending, tasks, store, config.shutdown_grace).await
}

/// A stop of this agent's own that follows `outside` (SIGTERM) and can also be sent from
/// within (after a handover).
fn follow(mut outside: watch::Receiver<bool>) -> (watch::Sender<bool>, watch::Receiver<bool>) {
    let (stop, inside) = watch::channel(*outside.borrow());
    let forward = stop.clone();
    tokio::spawn(async move {
        stopped(&mut outside).await;
        forward.send_replace(true);
    });
    (stop, inside)
}

/// Tells systemd (when edra runs under it) that edra has started: its listening sockets go
/// to the fd store, then `READY=1`. The kubelet's calls are answered from the local state
/// from now on, whether or not the kubelet has registered edra or the API server answers,
/// so an offline node's agent is never killed by a start timeout; `STATUS=` then says what
/// it waits for. Returns the notifier and the task that marks the stored registration
/// socket registered.
fn started_for_systemd(
    plugin: &mut PluginServer,
    inherited: &std::sync::Mutex<crate::util::fdstore::Inherited>,
    shutdown: &watch::Receiver<bool>,
) -> (Option<Arc<Notifier>>, Option<JoinHandle<()>>) {
    let notifier = systemd_notifier();
    let storing = kept_sockets::store(notifier.as_ref(), plugin, inherited, shutdown.clone());
    if let Some(n) = &notifier
        && let Err(e) = n.ready()
    {
        warn!(error = %e, "cannot send READY=1 to systemd");
    }
    (notifier, storing)
}

/// What the agent's reporting tasks read: the devices, their health, the state and the
/// MIG instances edra owns.
struct Views {
    inventory: watch::Receiver<Arc<Inventory>>,
    health: watch::Receiver<Arc<HealthSnapshot>>,
    store: Store,
    owned_mig: watch::Receiver<Arc<crate::dynamic_mig::OwnedInstances>>,
}

/// The metrics port, bound early. A port another process holds does not stop edra (it is
/// bound once free); one that cannot be bound at all is a configuration error.
fn bind_metrics(config: &Config) -> Result<Option<MetricsPort>, AppError> {
    Ok(match config.metrics.address {
        Some(address) => Some(MetricsPort::bind(address).map_err(|e| AppError::Config(error_chain(&e)))?),
        None => None,
    })
}

/// The device backend `config` names and its first inventory, sent on a new channel.
async fn discover_devices(
    config: &Config,
) -> Result<(Arc<dyn DeviceBackend>, watch::Sender<Arc<Inventory>>, watch::Receiver<Arc<Inventory>>), AppError> {
    let backend: Arc<dyn DeviceBackend> =
        Arc::from(inventory::backend_from_config(config).map_err(anyhow::Error::new)?);
    let first = discover(&backend).await.map_err(anyhow::Error::new)?;
    info!(backend = backend.name(), devices = first.devices.len(), "devices discovered");
    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(first));
    Ok((backend, inventory_tx, inventory_rx))
}

/// Where prepare reads claims: with claims.prefetch, the claims of pods bound to this node
/// are read before the kubelet asks, through the same client and rate limit (the
/// prefetcher is returned too, for its pod watch); otherwise from `cluster` when asked.
fn claim_source(config: &Config, cluster: &Arc<Cluster>) -> (Option<Arc<Prefetcher>>, Arc<dyn ClaimSource>) {
    let prefetcher = config.prefetch_claims.then(|| Arc::new(Prefetcher::new(cluster.clone())));
    let claims: Arc<dyn ClaimSource> = match &prefetcher {
        Some(p) => p.clone(),
        None => cluster.clone(),
    };
    (prefetcher, claims)
}

/// Serves the memory-limit socket the OCI hook asks, and watches limited containers for
/// their exit, when GPU memory limits are enforced.
fn serve_memory_limits(
    memory_limits: Option<crate::prepare::memory_limit::MemoryLimits>,
    preparer: &Preparer,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<JoinHandle<()>>, AppError> {
    Ok(match memory_limits.filter(|l| l.enforce) {
        Some(l) => {
            let listener = crate::prepare::memory_limit::server::bind(&l.socket).map_err(|e| {
                AppError::Other(anyhow::anyhow!("cannot serve the memory-limit socket {}: {e}", l.socket.display()))
            })?;
            let serving =
                crate::prepare::memory_limit::server::serve(listener, l.socket, preparer.clone(), shutdown.clone());
            let watching = l
                .exits
                .map(|exits| crate::prepare::memory_limit::exits::watch(preparer.clone(), exits, shutdown.clone()))
                .transpose()
                .map_err(|e| AppError::Other(anyhow::anyhow!("cannot watch cgroups for containers' exit: {e}")))?;
            Some(tokio::spawn(async move {
                let _ = serving.await;
                if let Some(w) = watching {
                    let _ = w.await;
                }
            }))
        }
        None => None,
    })
}

/// Starts the health monitor on the backend named `backend`, and the task that turns its
/// snapshots into the kubelet's device health list.
async fn start_health(
    config: &Config,
    backend: &str,
    inventory: &watch::Receiver<Arc<Inventory>>,
    shutdown: &watch::Receiver<bool>,
) -> (HealthMonitor, watch::Receiver<HealthList>, JoinHandle<()>) {
    let monitor = HealthMonitor::start(
        crate::health::backend_for(config, backend),
        inventory.clone(),
        HealthSettings {
            rules: Rules { ignored_xids: config.health.ignored_xids.clone(), quiet_period: config.health.quiet_period },
            probe_interval: config.health.probe_interval,
        },
        config.paths.state_dir.clone(),
        shutdown.clone(),
    )
    .await;
    let (health_list_tx, health_list_rx) = watch::channel(HealthList::default());
    let listing_health = tokio::spawn(list_device_health(
        (config.node_name.clone(), health_check_timeout(config.health.probe_interval)),
        inventory.clone(),
        monitor.snapshot.clone(),
        health_list_tx,
        shutdown.clone(),
    ));
    (monitor, health_list_rx, listing_health)
}

/// Starts the stale-claim check and, with claims.prefetch, the pod watch; returns their
/// tasks and the claims this node's pods use, as the pod watch sees them.
fn watch_claims(
    config: &Config,
    preparer: &Preparer,
    cluster: &Arc<Cluster>,
    prefetcher: Option<Arc<Prefetcher>>,
    client: &Client,
    shutdown: &watch::Receiver<bool>,
) -> (JoinHandle<()>, Option<JoinHandle<()>>, Arc<crate::prepare::in_use::PodsInUse>) {
    // The pod watch (with claims.prefetch) tells the stale-claim check which claims pods
    // of this node still use; without it every prepared claim is read at each check.
    let in_use = Arc::new(crate::prepare::in_use::PodsInUse::default());
    let pods_in_use = in_use.clone();
    let releasing = tokio::spawn(crate::prepare::stale::release_stale_claims(
        preparer.clone(),
        cluster.clone(),
        in_use.clone(),
        config.node_name.clone(),
        config.claims,
        shutdown.clone(),
    ));
    let stager = config.prepare_early.then(|| preparer.clone());
    let prefetching = prefetcher.map(|p| {
        tokio::spawn(crate::prepare::prefetch::watch_pods(
            p,
            stager,
            in_use,
            client.clone(),
            config.node_name.clone(),
            shutdown.clone(),
        ))
    });
    (releasing, prefetching, pods_in_use)
}

/// Serves the kubelet's sockets with `preparer`, and tells `ready` once they are in place.
fn serve_kubelet(
    config: &Config,
    preparer: Preparer,
    options: PluginOptions,
    ready: Option<oneshot::Sender<Serving>>,
) -> Result<PluginServer, AppError> {
    let plugin = PluginServer::start_with(&config.paths, &config.driver_name, Arc::new(preparer), options)
        .map_err(anyhow::Error::new)?;
    info!(dra = %plugin.dra_socket().display(), registration = %plugin.registration_socket().display(), "serving the kubelet");
    // After the state and plugin directories got the modes edra gives them.
    crate::dirmode::warn_open_dirs(&config.paths, &config.driver_name);
    if let Some(ready) = ready {
        let _ = ready.send(Serving::of(&plugin));
    }
    Ok(plugin)
}

/// Starts publishing the devices as ResourceSlices; returns the task and its status.
fn start_publishing(
    config: &Config,
    cluster: &Arc<Cluster>,
    held_shares: watch::Receiver<Arc<std::collections::BTreeSet<String>>>,
    views: &Views,
    shutdown: &watch::Receiver<bool>,
) -> (JoinHandle<()>, watch::Receiver<PublishStatus>) {
    let (status_tx, status_rx) = watch::channel(PublishStatus::default());
    let offers = Offers {
        sharing: config.sharing.clone(),
        held_shares,
        mig: config.mig.clone(),
        owned_mig: views.owned_mig.clone(),
    };
    let publishing = tokio::spawn(publish(
        cluster.clone(),
        config.driver_name.clone(),
        config.node_name.clone(),
        offers,
        (views.inventory.clone(), views.health.clone()),
        status_tx,
        shutdown.clone(),
    ));
    (publishing, status_rx)
}

/// Serves `edra status` on the runtime directory's socket, `kept` in systemd's fd store
/// across restarts under systemd (no task when it cannot be bound).
fn serve_status(
    config: &Config,
    backend: Arc<dyn DeviceBackend>,
    views: &Views,
    (plugin, publish): (&PluginServer, &watch::Receiver<PublishStatus>),
    pods: Arc<crate::prepare::in_use::PodsInUse>,
    (kept, notifier): (kept_sockets::StatusSocket, Option<&Arc<Notifier>>),
    shutdown: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let status = crate::status::collect::StatusSources {
        node: config.node_name.clone(),
        driver: config.driver_name.clone(),
        backend,
        store: views.store.clone(),
        inventory: views.inventory.clone(),
        health: views.health.clone(),
        owned_mig: views.owned_mig.clone(),
        registration: plugin.registration(),
        publish: publish.clone(),
        pods,
        started_at: crate::health::view::unix_secs(std::time::SystemTime::now()),
    };
    let (listener, keep_file) = kept.bind(&config.paths.runtime_dir, notifier)?;
    Some(crate::status::server::serve(listener, &config.paths.runtime_dir, status, (shutdown.clone(), keep_file)))
}

/// Starts the task that writes the prepared claims' device status.
fn keep_claim_status(
    config: &Config,
    cluster: &Arc<Cluster>,
    views: &Views,
    claims_changed: watch::Receiver<u64>,
    shutdown: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let claim_status = crate::publish::claim_status::ClaimStatusSettings {
        driver: config.driver_name.clone(),
        mps_pipe_dir: crate::prepare::mps::CONTAINER_PIPE_DIR,
    };
    tokio::spawn(crate::publish::claim_status::keep_claim_status(
        cluster.clone(),
        claim_status,
        views.store.clone(),
        (views.inventory.clone(), views.health.clone()),
        claims_changed,
        shutdown.clone(),
    ))
}

/// The metrics `/metrics` serves: kubelet calls, the API client, registration and
/// publishing, GPU changes and MPS daemons, GPU health and use.
fn metrics(
    client: &Client,
    plugin: &PluginServer,
    publish: &watch::Receiver<PublishStatus>,
    calls: &CallMetrics,
    (gpu_changes, mps_stats): (Arc<crate::gpu::ChangeCounts>, Arc<crate::gpu::mps::MpsStats>),
    views: &Views,
) -> Metrics {
    let api_client = client.clone();
    let sources = StateSources {
        registration: plugin.registration(),
        publish: publish.clone(),
        api_stats: Arc::new(move || api_client.stats()),
    };
    let mut metrics = Metrics::new(calls, sources);
    metrics.register_gpu_changes(gpu_changes);
    metrics.register_mps(mps_stats);
    metrics.register_health(views.inventory.clone(), views.health.clone());
    metrics.register_gpu_use(views.inventory.clone(), views.store.clone(), views.owned_mig.clone());
    metrics
}

/// The API client; credentials that cannot be used are a configuration error (exit 64).
fn client_from_config(config: &Config) -> Result<Client, AppError> {
    Client::from_config(config).map_err(|e| {
        if is_credential_problem(&e) { AppError::Config(error_chain(&e)) } else { anyhow::Error::new(e).into() }
    })
}

/// `e` (credentials edra cannot use) and, when the device backend cannot start either,
/// its problem too: both are reported at once rather than one per start.
fn with_backend_problem(config: &Config, e: AppError) -> AppError {
    let AppError::Config(credentials) = e else { return e };
    match inventory::backend_from_config(config) {
        Ok(_) => AppError::Config(credentials),
        Err(b) => AppError::Problems(vec![credentials, format!("devices: {}", error_chain(&b))]),
    }
}

/// Opens the state database and recovers it (rolls back unfinished prepares, rewrites
/// missing specs, sweeps orphans) before anything is served.
async fn open_and_recover(
    config: &Config,
    inventory: watch::Receiver<Arc<Inventory>>,
    claims: Arc<dyn ClaimSource>,
    backend: Arc<dyn DeviceBackend>,
    memory_limits: Option<crate::prepare::memory_limit::MemoryLimits>,
) -> Result<Preparer, AppError> {
    let state_dir = config.paths.state_dir.clone();
    let open = if crate::prepare::failpoint::armed() { Store::open_without_flusher } else { Store::open };
    let store = tokio::task::spawn_blocking(move || open(&state_dir))
        .await
        .map_err(|e| anyhow::anyhow!("opening the state database failed: {e}"))?
        .map_err(anyhow::Error::new)?;
    let hook_binary = match &config.paths.cdi_hook_binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/bin/edra")),
    };
    let preparer =
        Preparer::with_backend(store, inventory, claims, PrepareSettings::from_config(config, hook_binary), backend);
    if let Some(limits) = memory_limits {
        preparer.set_memory_limits(limits);
    }
    let recovering = preparer.clone();
    // Recovery logs what it did ("state recovered").
    tokio::task::spawn_blocking(move || recovering.recover())
        .await
        .map_err(|e| anyhow::anyhow!("recovery failed: {e}"))?
        .map_err(anyhow::Error::new)?;
    Ok(preparer)
}

/// systemd's notification socket, when edra runs under it with `Type=notify`.
fn systemd_notifier() -> Option<Arc<Notifier>> {
    match Notifier::from_process_env() {
        Ok(n) => n.map(Arc::new),
        Err(e) => {
            warn!(error = %e, "cannot talk to systemd's notify socket; readiness is not reported to systemd");
            None
        }
    }
}
