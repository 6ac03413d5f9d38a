//! Wiring for `edra run`: start-up order, task supervision and shutdown.
//!
//! Start: credentials (offline; a malformed kubeconfig stops here) → discover devices →
//! open and recover the state → serve the DRA socket, then the registration socket →
//! publish slices; the metrics address is bound first and served once the plugin runs (an
//! address another process holds is bound later, when free; the kubelet is served
//! regardless). The API server is needed only for publishing and for first-time prepares:
//! when it is unreachable the kubelet is still served, so claims prepared before keep
//! working and can be released. SIGTERM/SIGINT: stop publishing (slices stay), let
//! in-flight kubelet calls finish within the grace period, remove our sockets.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tracing::{error, info, warn};

use crate::config::Config;
use crate::health::view::Rules;
use crate::health::{DeviceState, HealthMonitor, HealthSettings, HealthSnapshot};
use crate::inventory::{self, DeviceBackend, Inventory};
use crate::kube::backoff::Backoff;
use crate::kube::{self, Client, Cluster};
use crate::plugin::{DeviceHealth, Health, HealthList, PluginOptions, PluginServer, RegistrationState};
use crate::prepare::prefetch::Prefetcher;
use crate::prepare::{ClaimSource, PrepareSettings, Preparer};
use crate::publish::desired::NodeIdentity;
use crate::publish::reconcile::{PublishStatus, Publisher};
use crate::state::Store;
use crate::telemetry::http::{Endpoints, MetricsPort, Readiness};
use crate::telemetry::metrics::{CallMetrics, Metrics, StateSources};
use crate::telemetry::sdnotify::Notifier;
use crate::util::{error_chain, stopped, until_stopped};

/// Retry delays while the API server cannot be reached at start (see [`Backoff`]).
const CONNECT_RETRY_BASE: Duration = Duration::from_secs(1);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(45);

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Configuration that only shows itself as wrong at start (e.g. a malformed kubeconfig).
    #[error("{0}")]
    Config(String),
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
    mut shutdown: watch::Receiver<bool>,
    ready: Option<oneshot::Sender<Serving>>,
) -> Result<(), AppError> {
    let client = client_from_config(&config)?;
    info!(server = client.server_url(), identity = client.identity(), node = %config.node_name, "starting edra {}", crate::util::VERSION);
    // One agent per node: before anything touches the sockets, the CDI specs, the state or
    // the metrics port (so a second instance is told what really stops it).
    let lock_paths = crate::instance::lock_paths(
        &config.paths.plugin_dir(&config.driver_name),
        &config.paths.cdi_dynamic_dir,
        &crate::prepare::cdi::vendor(&config.driver_name),
    );
    let _instance = crate::instance::InstanceLock::acquire(&lock_paths).map_err(anyhow::Error::new)?;

    // A port another process holds does not stop edra (it is bound once free); one that
    // cannot be bound at all is a configuration error.
    let metrics_listener = match config.metrics.address {
        Some(address) => Some(MetricsPort::bind(address).map_err(|e| AppError::Config(error_chain(&e)))?),
        None => None,
    };

    let backend: Arc<dyn DeviceBackend> =
        Arc::from(inventory::backend_from_config(&config).map_err(anyhow::Error::new)?);
    let first = discover(&backend).await.map_err(anyhow::Error::new)?;
    info!(backend = backend.name(), devices = first.devices.len(), "devices discovered");
    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(first));

    let cluster = Arc::new(Cluster::new(client.clone()));
    // With claims.prefetch, the claims of pods bound to this node are read before the
    // kubelet asks, through the same client and rate limit.
    let prefetcher = config.prefetch_claims.then(|| Arc::new(Prefetcher::new(cluster.clone())));
    let claims: Arc<dyn ClaimSource> = match &prefetcher {
        Some(p) => p.clone(),
        None => cluster.clone(),
    };
    let preparer = open_and_recover(&config, inventory_rx.clone(), claims, backend.clone()).await?;
    let store = preparer.store().clone();
    let claims_changed = preparer.claims_changed();
    let store_health = preparer.store().health();
    let held_shares = preparer.shared_gpus();
    let owned_mig = preparer.owned_mig();

    let healing = tokio::spawn(heal_state(preparer.clone(), shutdown.clone()));
    let monitor = HealthMonitor::start(
        crate::health::backend_for(&config, backend.name()),
        inventory_rx.clone(),
        HealthSettings {
            rules: Rules { ignored_xids: config.health.ignored_xids.clone(), quiet_period: config.health.quiet_period },
            probe_interval: config.health.probe_interval,
        },
        config.paths.state_dir.clone(),
        shutdown.clone(),
    )
    .await;
    let health_snapshot = monitor.snapshot.clone();
    let (health_list_tx, health_list_rx) = watch::channel(HealthList::default());
    let listing_health = tokio::spawn(list_device_health(
        (config.node_name.clone(), health_check_timeout(config.health.probe_interval)),
        inventory_rx.clone(),
        health_snapshot.clone(),
        health_list_tx,
        shutdown.clone(),
    ));
    let calls = CallMetrics::new();
    let options = PluginOptions { observer: Some(calls.clone()), health: Some(health_list_rx) };
    let gpu_changes = preparer.gpu_change_counts();
    let mps_stats = preparer.mps_stats();
    let supervising = tokio::spawn(supervise_mps(preparer.clone(), config.mps.check_interval, shutdown.clone()));
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
    let plugin = PluginServer::start_with(&config.paths, &config.driver_name, Arc::new(preparer), options)
        .map_err(anyhow::Error::new)?;
    info!(dra = %plugin.dra_socket().display(), registration = %plugin.registration_socket().display(), "serving the kubelet");
    // After the state and plugin directories got the modes edra gives them.
    crate::dirmode::warn_open_dirs(&config.paths, &config.driver_name);
    if let Some(ready) = ready {
        let _ = ready.send(Serving::of(&plugin));
    }

    let (status_tx, status_rx) = watch::channel(PublishStatus::default());
    let publishing = tokio::spawn(publish(
        cluster.clone(),
        config.driver_name.clone(),
        config.node_name.clone(),
        Offers { sharing: config.sharing.clone(), held_shares, mig: config.mig.clone(), owned_mig: owned_mig.clone() },
        (inventory_rx.clone(), health_snapshot.clone()),
        status_tx,
        shutdown.clone(),
    ));
    let status = crate::status::collect::StatusSources {
        node: config.node_name.clone(),
        driver: config.driver_name.clone(),
        backend: backend.clone(),
        store: store.clone(),
        inventory: inventory_rx.clone(),
        health: health_snapshot.clone(),
        owned_mig: owned_mig.clone(),
        registration: plugin.registration(),
        publish: status_rx.clone(),
        pods: pods_in_use,
        started_at: started_at(),
    };
    let serving_status = crate::status::server::start(&config.paths.runtime_dir, status, shutdown.clone());
    let claim_status = crate::publish::claim_status::ClaimStatusSettings {
        driver: config.driver_name.clone(),
        mps_pipe_dir: crate::prepare::mps::CONTAINER_PIPE_DIR,
    };
    let writing_status = tokio::spawn(crate::publish::claim_status::keep_claim_status(
        cluster.clone(),
        claim_status,
        store.clone(),
        (inventory_rx.clone(), health_snapshot.clone()),
        claims_changed,
        shutdown.clone(),
    ));
    let rediscovering = tokio::spawn(rediscover(
        backend,
        inventory_tx,
        (config.rediscovery_interval, owned_mig.clone()),
        shutdown.clone(),
    ));
    let serving_metrics = metrics_listener.map(|listener| {
        let api_client = client.clone();
        let sources = StateSources {
            registration: plugin.registration(),
            publish: status_rx.clone(),
            api_stats: Arc::new(move || api_client.stats()),
        };
        let readiness =
            Readiness { registration: plugin.registration(), publish: status_rx.clone(), state: store_health };
        let mut metrics = Metrics::new(&calls, sources);
        metrics.register_gpu_changes(gpu_changes);
        metrics.register_mps(mps_stats);
        metrics.register_health(inventory_rx.clone(), health_snapshot.clone());
        metrics.register_gpu_use(inventory_rx.clone(), store.clone(), owned_mig.clone());
        listener.serve(Endpoints { metrics, readiness }, shutdown.clone())
    });
    let notifier = systemd_notifier();
    let watchdog = notifier.clone().map(|n| tokio::spawn(ping_watchdog(n, shutdown.clone())));
    let readiness =
        tokio::spawn(report_readiness(plugin.registration(), status_rx, notifier.clone(), shutdown.clone()));

    stopped(&mut shutdown).await;
    if let Some(n) = &notifier {
        let _ = n.stopping();
    }
    let aborted = plugin.shutdown(config.shutdown_grace).await;
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
    for task in tasks.into_iter().chain(watchdog).chain(serving_metrics).chain(prefetching).chain(serving_status) {
        let _ = task.await;
    }
    // Releases recorded lazily reach the disk now rather than with sled's next flush.
    match tokio::task::spawn_blocking(move || store.sync()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %error_chain(&e), "cannot make edra's state durable at shutdown"),
        Err(e) => warn!(error = %e, "cannot make edra's state durable at shutdown"),
    }
    if aborted > 0 {
        // The kubelet retries them; the exit status tells systemd the stop was not clean.
        error!(aborted, "stopped; kubelet calls still running after the grace period were aborted");
        return Err(AppError::Other(anyhow::anyhow!(
            "stopped after aborting {aborted} kubelet call{} still running after the {}s grace period \
             (plugin.shutdown_grace); the kubelet retries them",
            if aborted == 1 { "" } else { "s" },
            config.shutdown_grace.as_secs_f64()
        )));
    }
    info!("stopped");
    Ok(())
}

/// The API client; credentials that cannot be used are a configuration error (exit 64).
fn client_from_config(config: &Config) -> Result<Client, AppError> {
    Client::from_config(config).map_err(|e| {
        if is_credential_problem(&e) { AppError::Config(error_chain(&e)) } else { anyhow::Error::new(e).into() }
    })
}

/// Opens the state database and recovers it (rolls back unfinished prepares, rewrites
/// missing specs, sweeps orphans) before anything is served.
async fn open_and_recover(
    config: &Config,
    inventory: watch::Receiver<Arc<Inventory>>,
    claims: Arc<dyn ClaimSource>,
    backend: Arc<dyn DeviceBackend>,
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

/// Pings systemd's watchdog (when it asks for that) until shutdown.
async fn ping_watchdog(notifier: Arc<Notifier>, mut shutdown: watch::Receiver<bool>) {
    notifier.run_watchdog(async move { stopped(&mut shutdown).await }).await
}

/// Re-opens the state store whenever it is poisoned (a change could not be made durable),
/// retrying with backoff until the disk takes writes again; recovery then runs on what the
/// disk says. Until then every kubelet call fails with the reason.
async fn heal_state(preparer: Preparer, mut shutdown: watch::Receiver<bool>) {
    let mut health = preparer.store().health();
    let mut backoff = kube::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        match until_stopped(health.wait_for(Option::is_some), &mut shutdown).await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
        if until_stopped(tokio::time::sleep(backoff.next_delay()), &mut shutdown).await.is_none() {
            return;
        }
        let healing = preparer.clone();
        match tokio::task::spawn_blocking(move || healing.heal()).await {
            Ok(Ok(report)) => {
                backoff.reset();
                info!(rolled_back = report.rolled_back.len(), "state store re-opened; serving claims again");
            }
            Ok(Err(e)) => warn!(error = %error_chain(&e), "the state store cannot be re-opened yet; retrying"),
            Err(e) => warn!(error = %e, "re-opening the state store failed; retrying"),
        }
    }
}

/// Checks every `interval` that prepared claims' MPS control daemons run, and starts
/// dead ones again (see [`Preparer::check_mps_daemons`]). Daemons outlive edra: nothing
/// here stops them at shutdown.
async fn supervise_mps(preparer: Preparer, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        if until_stopped(tokio::time::sleep(interval), &mut shutdown).await.is_none() {
            return;
        }
        let checking = preparer.clone();
        match tokio::task::spawn_blocking(move || checking.check_mps_daemons()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %error_chain(&e), "cannot check the MPS control daemons; retrying"),
            Err(e) => warn!(error = %e, "checking the MPS control daemons failed; retrying"),
        }
    }
}

async fn discover(backend: &Arc<dyn DeviceBackend>) -> Result<Inventory, inventory::InventoryError> {
    let b = backend.clone();
    match tokio::task::spawn_blocking(move || b.discover()).await {
        Ok(r) => r,
        Err(e) => Err(inventory::InventoryError::Mock(format!("device discovery panicked: {e}"))),
    }
}

/// Keeps the kubelet's device health list (every device, its state and why) up to date
/// with the inventory and the GPUs' health.
/// How long the kubelet may go without a health report before it calls a device's health
/// unknown: three times the longer of the stream's resend period and the probe interval,
/// so one late probe or one lost list does not flip it.
fn health_check_timeout(probe_interval: Duration) -> Duration {
    crate::plugin::RESEND_EVERY.max(probe_interval).saturating_mul(3)
}

fn started_at() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

async fn list_device_health(
    (pool, timeout): (String, Duration),
    mut inventory: watch::Receiver<Arc<Inventory>>,
    mut health: watch::Receiver<Arc<HealthSnapshot>>,
    list: watch::Sender<HealthList>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let inv = inventory.borrow_and_update().clone();
        let snapshot = health.borrow_and_update().clone();
        let now = std::time::SystemTime::now();
        let devices: Vec<DeviceHealth> = inv
            .devices
            .iter()
            .map(|d| {
                let (state, message) = snapshot.device_state(d);
                DeviceHealth {
                    pool_name: pool.clone(),
                    device_name: d.name.clone(),
                    health: match state {
                        DeviceState::Healthy => Health::Healthy,
                        DeviceState::Unhealthy => Health::Unhealthy,
                        DeviceState::Unknown => Health::Unknown,
                    },
                    last_updated: now,
                    timeout: Some(timeout),
                    message,
                }
            })
            .collect();
        // Only real changes go to the kubelet (an ignored XID changes the counts, not this).
        list.send_if_modified(|current| {
            let same = |a: &DeviceHealth, b: &DeviceHealth| {
                (&a.pool_name, &a.device_name, a.health, &a.message)
                    == (&b.pool_name, &b.device_name, b.health, &b.message)
            };
            let unchanged = current.len() == devices.len() && current.iter().zip(&devices).all(|(a, b)| same(a, b));
            if !unchanged {
                *current = Arc::new(devices);
            }
            !unchanged
        });
        tokio::select! {
            r = inventory.changed() => if r.is_err() { return },
            r = health.changed() => if r.is_err() { return },
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// Rediscovers devices periodically and passes changes on.
/// Rediscovers devices every `every`, and at once when the MIG instances edra holds
/// change (`mig`: one was created or destroyed), so the published view of a dynamic-MIG
/// GPU follows its instances without waiting for the interval.
async fn rediscover(
    backend: Arc<dyn DeviceBackend>,
    tx: watch::Sender<Arc<Inventory>>,
    (every, mut mig): (Duration, watch::Receiver<Arc<crate::mig::OwnedInstances>>),
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval_at(kube::backoff::deadline_in(every), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut mig_open = true;
    loop {
        tokio::select! {
            () = stopped(&mut shutdown) => return,
            _ = tick.tick() => {}
            changed = mig.changed(), if mig_open => {
                if changed.is_err() {
                    mig_open = false;
                    continue;
                }
            }
        }
        match discover(&backend).await {
            Ok(inv) => {
                tx.send_if_modified(|cur| {
                    if **cur == inv {
                        false
                    } else {
                        info!(devices = inv.devices.len(), "devices changed");
                        *cur = Arc::new(inv);
                        true
                    }
                });
            }
            Err(e) => warn!(error = %error_chain(&e), "rediscovering devices failed; keeping the last inventory"),
        }
    }
}

/// Reaches the API server (retrying while it is unreachable), then keeps the pool published.
/// How the GPUs are offered, with what the preparer holds of them: the publisher keeps a
/// GPU with shares prepared as it is, and tells edra's MIG instances from foreign ones.
struct Offers {
    sharing: crate::sharing::SharingSettings,
    held_shares: watch::Receiver<Arc<std::collections::BTreeSet<String>>>,
    mig: crate::mig::MigSettings,
    owned_mig: watch::Receiver<Arc<crate::mig::OwnedInstances>>,
}

async fn publish(
    cluster: Arc<Cluster>,
    driver: String,
    node: String,
    Offers { sharing, held_shares, mig, owned_mig }: Offers,
    (inventory, health): (watch::Receiver<Arc<Inventory>>, watch::Receiver<Arc<HealthSnapshot>>),
    status: watch::Sender<PublishStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(CONNECT_RETRY_BASE, CONNECT_RETRY_MAX);
    let (api, uid) = loop {
        let attempt = async {
            let api = cluster.api().await?;
            let node_obj = cluster.client().get_node(&node).await?;
            Ok::<_, kube::Error>((api, node_obj.metadata.uid))
        };
        let Some(outcome) = until_stopped(attempt, &mut shutdown).await else { return };
        match outcome {
            Ok(found) => break found,
            Err(e) => {
                let msg = error_chain(&e);
                if e.is_not_found() {
                    error!(error = %msg, node = %node, "Node {node} does not exist; set node_name to this node's name as `kubectl get nodes` shows it");
                } else if e.is_forbidden() {
                    error!(
                        error = %msg,
                        node = %node,
                        identity = cluster.client().identity(),
                        "the API server refused to let edra read Node {node}; with node credentials node_name must be \
                         the node they belong to (system:node:<name>), otherwise grant the RBAC in config/rbac.yaml"
                    );
                } else {
                    warn!(error = %msg, "cannot reach the API server yet; the kubelet is served meanwhile, retrying");
                }
                status.send_modify(|s| s.last_error = Some(msg));
                if until_stopped(tokio::time::sleep(backoff.next_delay()), &mut shutdown).await.is_none() {
                    return;
                }
            }
        }
    };
    info!(api = api.version(), node = %node, "publishing ResourceSlices");
    let identity = NodeIdentity { name: node, uid };
    // The `None` taint effect needs Kubernetes 1.35; `/version` says which this is.
    let version = match until_stopped(cluster.client().server_version(), &mut shutdown).await {
        None => return,
        Some(v) => v.ok(),
    };
    let none_effect = crate::publish::reconcile::accepts_none_effect(api, version.as_deref());
    let partitions = crate::publish::reconcile::accepts_partitions(api, version.as_deref());
    Publisher::new(cluster.client().clone(), api, driver, identity, inventory, status)
        .with_sharing(sharing)
        .with_held_shares(held_shares)
        .with_mig(mig, partitions, owned_mig)
        .with_health(health, none_effect)
        .run(shutdown)
        .await;
}

/// Logs when the agent becomes ready (registered with the kubelet and slices published) and
/// when it stops being so, and keeps systemd informed (READY=1 once, STATUS= on changes).
async fn report_readiness(
    mut registration: watch::Receiver<RegistrationState>,
    mut publish: watch::Receiver<PublishStatus>,
    notifier: Option<Arc<Notifier>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut told_ready = false;
    let mut was_ready = false;
    let mut last_status = String::new();
    loop {
        let registration_state = registration.borrow().clone();
        let registered = registration_state.is_registered();
        let PublishStatus { in_sync: published, devices, last_error, .. } = publish.borrow().clone();
        let ready = registered && published;
        if ready != was_ready {
            if ready {
                info!(devices, "ready: registered with the kubelet and slices published");
            } else {
                warn!(registered, published, "not ready");
            }
            was_ready = ready;
        }
        let status = match (&registration_state, published, &last_error) {
            (RegistrationState::Refused(reason), _, _) => format!("the kubelet refused the registration: {reason}"),
            (_, true, _) if registered => format!("ready: {devices} devices published"),
            (_, false, Some(e)) => format!("registered with the kubelet: {registered}; not published yet: {e}"),
            _ => format!("registered with the kubelet: {registered}; slices published: {published}"),
        };
        if let Some(n) = &notifier {
            // An edge node may start without its control plane: once the kubelet is served
            // and publishing has been tried, the start is complete for systemd (the status
            // says what is missing) rather than a working agent being killed at the timeout.
            let started = registered && (published || last_error.is_some());
            if started && !told_ready {
                told_ready = true;
                if let Err(e) = n.ready() {
                    warn!(error = %e, "cannot send READY=1 to systemd");
                }
            }
            if status != last_status {
                let _ = n.status(&status);
            }
        }
        last_status = status;
        tokio::select! {
            r = registration.changed() => if r.is_err() { return },
            r = publish.changed() => if r.is_err() { return },
            () = stopped(&mut shutdown) => return,
        }
    }
}
