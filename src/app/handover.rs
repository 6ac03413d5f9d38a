//! The handover between two agents on one node ([`crate::handover`]), as `edra run` does it.
//!
//! A newer agent started with `plugin.take_over = true` (the DaemonSet sets it) that finds
//! the node locked by a running one that offers a handover does
//! everything that needs no lock first (credentials, devices), then asks for the kubelet's
//! sockets, waits for the node lock the running one releases by exiting, and serves the
//! sockets handed over; the kubelet's calls in the gap wait in their backlog. The running
//! agent, asked, stops accepting calls and lets those in flight finish for four fifths of
//! `plugin.handover_timeout`; then it hands the sockets over and stops (its slices stay,
//! its state is flushed). When calls are still running by then, or the asker stopped
//! waiting, it serves the same sockets again and refuses, and the asker exits with the
//! reason.
//!
//! Under a DaemonSet the older pod's container is restarted by the kubelet after it hands
//! over, until the pod is deleted: the agent that took over refuses it (the same `POD_UID`)
//! as replaced, and the restarted one waits quietly to be stopped instead of taking the
//! node back.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, info, warn};

use super::AppError;
use crate::config::Config;
use crate::handover::{self, Handed, HandoverError, Offer, Party, Request};
use crate::node_lock::{InstanceError, InstanceLock};
use crate::plugin::{HealthList, PluginOptions, PluginServer};
use crate::prepare::Preparer;
use crate::telemetry::metrics::CallMetrics;
use crate::util::error_chain;
use crate::util::fdstore::Inherited;

/// The reason a replaced agent is refused with starts with this word.
const REPLACED: &str = "replaced:";
/// How often a newer agent tries the node lock while the older one exits.
const LOCK_POLL: Duration = Duration::from_millis(5);

/// How this agent stands with the node lock before it takes the node.
pub(super) enum NodeClaim {
    /// It holds the lock.
    Locked(InstanceLock),
    /// Another agent holds it and offers a handover.
    Running(InstanceError),
}

/// Takes the node lock, or (with `plugin.take_over`) finds an agent that holds it and
/// offers a handover.
pub(super) fn claim_node(config: &Config) -> Result<NodeClaim, AppError> {
    match InstanceLock::acquire(&lock_paths(config)) {
        Ok(lock) => Ok(NodeClaim::Locked(lock)),
        Err(held @ InstanceError::Held { .. })
            if config.take_over && handover::socket_path(&config.paths.runtime_dir).exists() =>
        {
            Ok(NodeClaim::Running(held))
        }
        Err(e) => Err(anyhow::Error::new(e).into()),
    }
}

fn lock_paths(config: &Config) -> Vec<std::path::PathBuf> {
    crate::node_lock::lock_paths(
        &config.paths.plugin_dir(&config.driver_name),
        &config.paths.cdi_dynamic_dir,
        &crate::prepare::cdi::vendor(&config.driver_name),
    )
}

/// What taking the node gave: its lock and the sockets handed over, if any.
pub(super) struct Taken {
    pub(super) lock: InstanceLock,
    pub(super) handed: Option<Handed>,
}

/// Takes the node: with the lock held, nothing more; else asks the running agent to hand
/// over and waits for its lock. `None`: this agent was refused as replaced and waited for
/// `shutdown`.
pub(super) async fn take_node(
    config: &Config,
    claim: NodeClaim,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Taken>, AppError> {
    let held = match claim {
        NodeClaim::Locked(lock) => return Ok(Some(Taken { lock, handed: None })),
        NodeClaim::Running(held) => held,
    };
    let (runtime, timeout) = (config.paths.runtime_dir.clone(), config.handover_timeout);
    info!(target: "edra::app", "another edra serves this node; asking it to hand the kubelet's sockets over");
    let started = Instant::now();
    let me = Party::this_process();
    let asked = tokio::task::spawn_blocking(move || handover::ask(&runtime, &me, timeout))
        .await
        .map_err(|e| anyhow::anyhow!("asking for a handover failed: {e}"))?;
    let handed = match asked {
        Ok(handed) => handed,
        Err(HandoverError::NotOffered { .. }) => {
            // It stopped in the meantime: the lock may be free now.
            let lock = InstanceLock::acquire(&lock_paths(config)).map_err(anyhow::Error::new)?;
            return Ok(Some(Taken { lock, handed: None }));
        }
        Err(HandoverError::Refused(reason)) if reason.starts_with(REPLACED) => {
            info!(target: "edra::app", reason, "this edra was replaced on this node; waiting to be stopped");
            crate::util::stopped(shutdown).await;
            return Ok(None);
        }
        Err(e) => return Err(AppError::Other(anyhow::anyhow!("{held}; asked it to hand over: {e}"))),
    };
    info!(target: "edra::app", from = handed.from.pid, sockets = handed.sockets.len(), "the running edra handed the kubelet's sockets over; waiting for it to stop");
    let lock = wait_for_lock(config, timeout).await?;
    let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    info!(target: "edra::app", took_ms, "took the node over from the edra that served it");
    Ok(Some(Taken { lock, handed: Some(handed) }))
}

/// The node lock, tried until the agent that handed over has exited (up to `timeout`).
async fn wait_for_lock(config: &Config, timeout: Duration) -> Result<InstanceLock, AppError> {
    let deadline = Instant::now() + timeout;
    loop {
        match InstanceLock::acquire(&lock_paths(config)) {
            Ok(lock) => return Ok(lock),
            Err(InstanceError::Held { .. }) if Instant::now() < deadline => tokio::time::sleep(LOCK_POLL).await,
            Err(e) => {
                return Err(AppError::Other(anyhow::anyhow!(
                    "the running edra handed its sockets over but did not stop within {}s: {e}",
                    timeout.as_secs_f64()
                )));
            }
        }
    }
}

/// How the kubelet is served: on the sockets handed over, else on those systemd kept (both
/// returned, for the fd store), with `calls` observed and the device health `health`; and
/// what serving them again after a refused handover needs.
pub(super) fn plugin_options(
    handed: Option<Handed>,
    preparer: &Preparer,
    calls: &Arc<CallMetrics>,
    health: watch::Receiver<HealthList>,
) -> (PluginOptions, Relaunch, Arc<Mutex<Inherited>>) {
    let replaced = handed.as_ref().and_then(|h| h.from.origin.clone());
    let inherited = match handed {
        Some(h) => Arc::new(Mutex::new(Inherited::from_fds(h.sockets))),
        None => super::kept_sockets::inherited(),
    };
    let options = PluginOptions {
        observer: Some(calls.clone()),
        health: Some(health.clone()),
        inherited: Some(inherited.clone()),
    };
    (options, Relaunch { preparer: preparer.clone(), observer: calls.clone(), health, replaced }, inherited)
}

/// Offers a handover while this agent serves (none when the socket cannot be bound).
fn offer(config: &Config) -> Option<Offer> {
    match Offer::bind(&config.paths.runtime_dir) {
        Ok(offer) => Some(offer),
        Err(e) => {
            warn!(target: "edra::app", error = %e, "cannot offer a handover to a newer edra; a rolling update with a surge waits for this one to stop");
            None
        }
    }
}

/// What serving the kubelet needs to start again on the same sockets.
pub(super) struct Relaunch {
    pub(super) preparer: Preparer,
    pub(super) observer: Arc<CallMetrics>,
    pub(super) health: watch::Receiver<HealthList>,
    /// The origin of the agent this one took over from: refused as replaced.
    pub(super) replaced: Option<String>,
}

/// How serving ended.
pub(super) enum Ending {
    /// Stopped from outside (SIGTERM): the plugin is still to be shut down.
    Stopped(PluginServer),
    /// The sockets went to a newer agent.
    HandedOver,
    /// Serving could not start again after a handover that did not happen.
    Lost(AppError),
}

/// Serves the kubelet with `plugin` until `shutdown`, answering handover requests on the
/// handover socket meanwhile.
pub(super) async fn serve(
    config: &Config,
    mut plugin: PluginServer,
    relaunch: Relaunch,
    shutdown: &mut watch::Receiver<bool>,
) -> Ending {
    let relaunch = &relaunch;
    let Some(offer) = offer(config) else {
        crate::util::stopped(shutdown).await;
        return Ending::Stopped(plugin);
    };
    loop {
        let request = tokio::select! {
            () = crate::util::stopped(shutdown) => return Ending::Stopped(plugin),
            r = offer.next() => r,
        };
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                warn!(target: "edra::app", error = %e, "cannot accept on the handover socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(origin) = &relaunch.replaced
            && request.from.origin.as_ref() == Some(origin)
        {
            info!(target: "edra::app", pid = request.from.pid, origin, "refusing a handover to the edra this one replaced");
            request.refuse(&format!(
                "{REPLACED} the edra of {origin} was replaced by this one (pid {})",
                std::process::id()
            ));
            continue;
        }
        match hand_over(config, plugin, request, relaunch).await {
            Ok(()) => return Ending::HandedOver,
            Err(Some(resumed)) => plugin = resumed,
            Err(None) => {
                return Ending::Lost(AppError::Other(anyhow::anyhow!(
                    "cannot serve the kubelet's sockets again after a handover that did not happen"
                )));
            }
        }
    }
}

/// Lets calls in flight finish and hands the sockets over; when that cannot be done in
/// time, serves them again (`Err(Some)`; `Err(None)` when even that fails).
async fn hand_over(
    config: &Config,
    mut plugin: PluginServer,
    request: Request,
    relaunch: &Relaunch,
) -> Result<(), Option<PluginServer>> {
    let limit = config.handover_timeout * 4 / 5;
    let asker = request.from.pid;
    info!(target: "edra::app", pid = asker, version = %request.from.version, "a newer edra asks for the kubelet's sockets; letting calls in flight finish");
    let started = Instant::now();
    let kept: Vec<(String, OwnedFd)> = plugin
        .listening_sockets()
        .into_iter()
        .filter_map(|(name, fd)| fd.try_clone_to_owned().ok().map(|fd| (name, fd)))
        .collect();
    let keeps_files = plugin.keeps_socket_files();
    plugin.keep_socket_files();
    // After a refusal, calls still running get the usual grace on the old connections.
    let mut stopping = tokio::spawn(plugin.shutdown(limit + config.shutdown_grace));
    let drained = matches!(tokio::time::timeout(limit, &mut stopping).await, Ok(Ok(0)));
    let why = if !drained {
        format!("kubelet calls were still running after {}s", limit.as_secs_f64())
    } else if !request.still_waiting() {
        "the newer edra stopped waiting".to_string()
    } else {
        let me = Party::this_process();
        let (sent, kept) = tokio::task::spawn_blocking(move || {
            let sockets: Vec<(String, BorrowedFd<'_>)> = kept.iter().map(|(n, fd)| (n.clone(), fd.as_fd())).collect();
            let sent = request.hand_over(&me, &sockets);
            (sent, kept)
        })
        .await
        .map_err(|_| None)?;
        match sent {
            Ok(()) => {
                let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                info!(target: "edra::app", pid = asker, took_ms, "handed the kubelet's sockets to the newer edra; stopping");
                return Ok(());
            }
            Err(e) => {
                warn!(target: "edra::app", error = %e, "cannot hand the sockets over; serving them again");
                return Err(resume(config, kept, keeps_files, relaunch));
            }
        }
    };
    warn!(target: "edra::app", pid = asker, reason = %why, "not handing over; serving the kubelet's sockets again");
    request.refuse(&why);
    Err(resume(config, kept, keeps_files, relaunch))
}

/// Serves the kubelet again on the listening sockets `kept`.
fn resume(
    config: &Config,
    kept: Vec<(String, OwnedFd)>,
    keep_files: bool,
    relaunch: &Relaunch,
) -> Option<PluginServer> {
    let options = PluginOptions {
        observer: Some(relaunch.observer.clone()),
        health: Some(relaunch.health.clone()),
        inherited: Some(Arc::new(Mutex::new(Inherited::from_fds(kept)))),
    };
    match PluginServer::start_with(&config.paths, &config.driver_name, Arc::new(relaunch.preparer.clone()), options) {
        Ok(mut plugin) => {
            if keep_files {
                plugin.keep_socket_files();
            }
            Some(plugin)
        }
        Err(e) => {
            error!(target: "edra::app", error = %error_chain(&e), "cannot serve the kubelet again");
            None
        }
    }
}
