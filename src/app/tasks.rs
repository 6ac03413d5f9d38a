//! The agent's long-running tasks, each until shutdown: systemd's watchdog, healing a
//! poisoned state store, supervising MPS daemons, the kubelet's device health list,
//! rediscovery, publishing, and readiness reporting. [`super::run_signalling`] starts them.
//! They log under the target `edra::app`, as before they had a file of their own, so log
//! filters and what operators grep for stay the same.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::AppError;
use super::handover::Ending;
use crate::health::{DeviceState, HealthSnapshot};
use crate::inventory::{self, DeviceBackend, Inventory};
use crate::kube::backoff::Backoff;
use crate::kube::{self, Cluster};
use crate::plugin::{DeviceHealth, Health, HealthList, RegistrationState};
use crate::prepare::Preparer;
use crate::publish::desired::NodeIdentity;
use crate::publish::reconcile::Publisher;
use crate::publish::status::PublishStatus;
use crate::state::Store;
use crate::telemetry::sdnotify::Notifier;
use crate::util::{error_chain, stopped, until_stopped};

/// Retry delays while the API server cannot be reached at start (see [`Backoff`]).
const CONNECT_RETRY_BASE: Duration = Duration::from_secs(1);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(45);

/// Pings systemd's watchdog (when it asks for that) until shutdown.
pub(super) async fn ping_watchdog(notifier: Arc<Notifier>, mut shutdown: watch::Receiver<bool>) {
    notifier.run_watchdog(async move { stopped(&mut shutdown).await }).await
}

/// Re-opens the state store whenever it is poisoned (a change could not be made durable),
/// retrying with backoff until the disk takes writes again; recovery then runs on what the
/// disk says. Until then every kubelet call fails with the reason.
pub(super) async fn heal_state(preparer: Preparer, mut shutdown: watch::Receiver<bool>) {
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
                info!(target: "edra::app", rolled_back = report.rolled_back.len(), "state store re-opened; serving claims again");
            }
            Ok(Err(e)) => {
                warn!(target: "edra::app", error = %error_chain(&e), "the state store cannot be re-opened yet; retrying")
            }
            Err(e) => warn!(target: "edra::app", error = %e, "re-opening the state store failed; retrying"),
        }
    }
}

/// Checks every `interval` that prepared claims' MPS control daemons run, and starts
/// dead ones again (see [`Preparer::check_mps_daemons`]). Daemons outlive edra: nothing
/// here stops them at shutdown.
pub(super) async fn supervise_mps(preparer: Preparer, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        if until_stopped(tokio::time::sleep(interval), &mut shutdown).await.is_none() {
            return;
        }
        let checking = preparer.clone();
        match tokio::task::spawn_blocking(move || checking.check_mps_daemons()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                warn!(target: "edra::app", error = %error_chain(&e), "cannot check the MPS control daemons; retrying")
            }
            Err(e) => warn!(target: "edra::app", error = %e, "checking the MPS control daemons failed; retrying"),
        }
    }
}

pub(super) async fn discover(backend: &Arc<dyn DeviceBackend>) -> Result<Inventory, inventory::InventoryError> {
    let b = backend.clone();
    match tokio::task::spawn_blocking(move || b.discover()).await {
        Ok(r) => r,
        Err(e) => Err(inventory::InventoryError::Mock(format!("device discovery panicked: {e}"))),
    }
}

/// How long the kubelet may go without a health report before it calls a device's health
/// unknown: three times the longer of the stream's resend period and the probe interval,
/// so one late probe or one lost list does not flip it.
pub(super) fn health_check_timeout(probe_interval: Duration) -> Duration {
    crate::plugin::RESEND_EVERY.max(probe_interval).saturating_mul(3)
}

/// Keeps the kubelet's device health list (every device, its state and why) up to date
/// with the inventory and the GPUs' health.
pub(super) async fn list_device_health(
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

/// Rediscovers devices every `every`, and at once after edra created or destroyed a MIG
/// instance (`mig` ticks), so the published view of a dynamic-MIG GPU follows its
/// instances without waiting for the interval.
pub(super) async fn rediscover(
    backend: Arc<dyn DeviceBackend>,
    tx: watch::Sender<Arc<Inventory>>,
    (every, mut mig): (Duration, watch::Receiver<u64>),
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
                        info!(target: "edra::app", devices = inv.devices.len(), "devices changed");
                        *cur = Arc::new(inv);
                        true
                    }
                });
            }
            Err(e) => {
                warn!(target: "edra::app", error = %error_chain(&e), "rediscovering devices failed; keeping the last inventory")
            }
        }
    }
}

/// How the GPUs are offered, with what the preparer holds of them: the publisher keeps a
/// GPU with shares prepared as it is, and tells edra's MIG instances from foreign ones.
pub(super) struct Offers {
    pub sharing: crate::sharing::SharingSettings,
    pub held_shares: watch::Receiver<Arc<std::collections::BTreeSet<String>>>,
    pub mig: crate::dynamic_mig::MigSettings,
    pub owned_mig: watch::Receiver<Arc<crate::dynamic_mig::OwnedInstances>>,
}

pub(super) async fn publish(
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
                    error!(target: "edra::app", error = %msg, node = %node, "Node {node} does not exist; set node_name to this node's name as `kubectl get nodes` shows it");
                } else if e.is_forbidden() {
                    error!(target: "edra::app",
                        error = %msg,
                        node = %node,
                        identity = cluster.client().identity(),
                        "the API server refused to let edra read Node {node}; with node credentials node_name must be \
                         the node they belong to (system:node:<name>), otherwise grant the RBAC in config/rbac.yaml"
                    );
                } else {
                    warn!(target: "edra::app", error = %msg, "cannot reach the API server yet; the kubelet is served meanwhile, retrying");
                }
                status.send_modify(|s| s.last_error = Some(msg));
                if until_stopped(tokio::time::sleep(backoff.next_delay()), &mut shutdown).await.is_none() {
                    return;
                }
            }
        }
    };
    info!(target: "edra::app", api = api.version(), node = %node, "publishing ResourceSlices");
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

/// How long after start the kubelet may take to register edra before a warning says so.
pub(super) const REGISTRATION_WARNING: Duration = Duration::from_secs(30);

/// Logs when the agent becomes ready (registered with the kubelet and slices published) and
/// when it stops being so, and keeps systemd's `STATUS=` saying what it waits for
/// (registration, publishing, with the last error). `READY=1` is not sent here: the agent
/// is started for systemd as soon as it serves the kubelet's sockets from its local state
/// ([`super::run_signalling`]), whether or not the kubelet or the API server answer. When
/// the kubelet has not registered edra [`REGISTRATION_WARNING`] after start, one warning
/// names `registry_dir`, the directory it serves its registration socket in.
pub(super) async fn report_readiness(
    mut registration: watch::Receiver<RegistrationState>,
    mut publish: watch::Receiver<PublishStatus>,
    (notifier, registry_dir): (Option<Arc<Notifier>>, std::path::PathBuf),
    mut shutdown: watch::Receiver<bool>,
) {
    let mut was_ready = false;
    let mut last_status = String::new();
    let registration_deadline = tokio::time::sleep(REGISTRATION_WARNING);
    tokio::pin!(registration_deadline);
    let mut warned = false;
    loop {
        let registration_state = registration.borrow().clone();
        let registered = registration_state.is_registered();
        let PublishStatus { in_sync: published, devices, last_error, .. } = publish.borrow().clone();
        let ready = registered && published;
        if ready != was_ready {
            if ready {
                info!(target: "edra::app", devices, "ready: registered with the kubelet and slices published");
            } else {
                warn!(target: "edra::app", registered, published, "not ready");
            }
            was_ready = ready;
        }
        let status = readiness_status(&registration_state, published, devices, last_error.as_deref());
        if let Some(n) = &notifier
            && status != last_status
        {
            let _ = n.status(&status);
        }
        last_status = status;
        tokio::select! {
            r = registration.changed() => if r.is_err() { return },
            r = publish.changed() => if r.is_err() { return },
            () = &mut registration_deadline, if !warned => {
                warned = true;
                if !registration.borrow().is_registered() {
                    warn!(target: "edra::app", registry_dir = %registry_dir.display(), waited_s = REGISTRATION_WARNING.as_secs(),
                        "the kubelet has not registered edra yet: is the kubelet running, and with this root directory \
                         (its --root-dir; kubelet.root_dir or kubelet.registry_dir in edra's config)? The kubelet's calls \
                         are answered meanwhile");
                }
            }
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// The one-line status systemd shows for edra: what it serves and what it waits for.
fn readiness_status(
    registration: &RegistrationState,
    published: bool,
    devices: usize,
    last_error: Option<&str>,
) -> String {
    let registered = registration.is_registered();
    match (registration, published, last_error) {
        (RegistrationState::Refused(reason), _, _) => format!("the kubelet refused the registration: {reason}"),
        (_, true, _) if registered => format!("ready: {devices} devices published"),
        (_, false, Some(e)) if registered => format!("serving; registered with the kubelet; not published yet: {e}"),
        (_, false, Some(e)) => format!("serving; waiting for the kubelet to register edra; not published yet: {e}"),
        (_, true, _) => format!("serving; waiting for the kubelet to register edra; {devices} devices published"),
        (_, false, None) if registered => "serving; registered with the kubelet; publishing".to_string(),
        (_, false, None) => "serving; waiting for the kubelet to register edra; publishing".to_string(),
    }
}

/// How long an edra that handed the node over waits for its tasks before it exits.
const HANDED_OVER_STOP: Duration = Duration::from_secs(2);

/// The stop after `shutdown` or a handover (`ending`): tells systemd, stops serving the
/// kubelet within the `grace` period (unless the sockets went to a newer agent), waits for
/// the `tasks`, makes lazily recorded releases durable, and fails when kubelet calls were
/// aborted after the grace period.
pub(super) async fn drain(
    notifier: Option<Arc<Notifier>>,
    ending: Ending,
    tasks: impl Iterator<Item = JoinHandle<()>>,
    store: Store,
    grace: std::time::Duration,
) -> Result<(), AppError> {
    if let Some(n) = &notifier {
        let _ = n.stopping();
    }
    let handed_over = matches!(ending, Ending::HandedOver);
    let (aborted, lost) = match ending {
        Ending::Stopped(plugin) => (plugin.shutdown(grace).await, None),
        Ending::HandedOver => (0, None),
        Ending::Lost(e) => (0, Some(e)),
    };
    let waiting = async {
        for task in tasks {
            let _ = task.await;
        }
    };
    // The newer edra waits for this one to exit (the node lock) while the kubelet's calls
    // wait in the backlog: a task still in an API request is left to the exit (what it
    // wrote is recorded before it acted; recovery finishes or undoes it).
    if handed_over {
        if tokio::time::timeout(HANDED_OVER_STOP, waiting).await.is_err() {
            warn!(target: "edra::app", waited_s = HANDED_OVER_STOP.as_secs(), "tasks still running after the handover are left to the exit");
        }
    } else {
        waiting.await;
    }
    // Releases recorded lazily reach the disk now rather than with sled's next flush.
    match tokio::task::spawn_blocking(move || store.sync()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            warn!(target: "edra::app", error = %error_chain(&e), "cannot make edra's state durable at shutdown")
        }
        Err(e) => warn!(target: "edra::app", error = %e, "cannot make edra's state durable at shutdown"),
    }
    if let Some(e) = lost {
        return Err(e);
    }
    if aborted > 0 {
        // The kubelet retries them; the exit status tells systemd the stop was not clean.
        error!(target: "edra::app", aborted, "stopped; kubelet calls still running after the grace period were aborted");
        return Err(AppError::Other(anyhow::anyhow!(
            "stopped after aborting {aborted} kubelet call{} still running after the {}s grace period \
             (plugin.shutdown_grace); the kubelet retries them",
            if aborted == 1 { "" } else { "s" },
            grace.as_secs_f64()
        )));
    }
    info!(target: "edra::app", "stopped");
    Ok(())
}

#[cfg(test)]
mod tests;
