//! The health monitor task: the event thread feeds it, a periodic probe checks every GPU
//! is still there, the quiet period clears conditions, and every change is persisted and
//! published as a new [`HealthSnapshot`] for the publisher (taints), the kubelet's health
//! stream and the metrics.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::source::HealthBackend;
use super::view::{Change, ConditionKind, Event, HealthView, Rules};
use super::{HealthSnapshot, gpu_of, store};
use crate::inventory::Inventory;
use crate::util::{error_chain, stopped};

/// How the monitor judges and how often it probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    /// Ignore list and quiet period.
    pub rules: Rules,
    /// How often every GPU is probed (and the quiet period checked).
    pub probe_interval: Duration,
}

/// The running monitor: its snapshots, and the task to await at shutdown.
#[derive(Debug)]
pub struct HealthMonitor {
    /// The newest snapshot; changes whenever a condition or an XID count does.
    pub snapshot: watch::Receiver<Arc<HealthSnapshot>>,
    /// Ends after shutdown, once the event thread stopped.
    pub task: JoinHandle<()>,
}

fn gpus_in(inv: &Inventory) -> BTreeSet<String> {
    inv.devices.iter().map(|d| gpu_of(d).to_string()).collect()
}

impl HealthMonitor {
    /// Loads the persisted conditions from `state_dir`, starts the event thread on
    /// `backend` for the GPUs of `inventory`, and runs until `shutdown`.
    pub async fn start(
        backend: Arc<dyn HealthBackend>,
        mut inventory: watch::Receiver<Arc<Inventory>>,
        settings: HealthSettings,
        state_dir: PathBuf,
        mut shutdown: watch::Receiver<bool>,
    ) -> HealthMonitor {
        let dir = state_dir.clone();
        let persisted = match tokio::task::spawn_blocking(move || store::load(&dir)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                warn!(error = %error_chain(&e), "cannot read the persisted GPU health; starting without it (rewritten at the next change)");
                Default::default()
            }
            Err(e) => {
                warn!(error = %e, "reading the persisted GPU health failed; starting without it");
                Default::default()
            }
        };
        let mut view = HealthView::from_persisted(persisted);
        for (gpu, g) in &view.gpus {
            for c in g.conditions.values() {
                warn!(gpu = %gpu, condition = c.kind.key(), value = c.value.as_deref().unwrap_or(""), since = c.since, "GPU condition kept from before the restart: {}", c.message);
            }
        }
        let gpus = gpus_in(&inventory.borrow_and_update());
        view.saw(gpus.iter().cloned(), SystemTime::now());
        let (tx, rx) = watch::channel(Arc::new(HealthSnapshot::of(&view)));

        let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
        let mut watch = Watch::start(backend.clone(), gpus, events_tx.clone());

        let task = tokio::spawn(async move {
            let mut probe = tokio::time::interval(settings.probe_interval);
            probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let mut changes = Vec::new();
                let mut counted = false;
                tokio::select! {
                    () = stopped(&mut shutdown) => break,
                    Some(event) = events.recv() => {
                        let mut next = Some(event);
                        while let Some(e) = next {
                            counted |= matches!(e, Event::Xid { .. } | Event::DoubleBitEcc { .. });
                            changes.extend(view.apply(e, SystemTime::now(), &settings.rules));
                            next = events.try_recv().ok();
                        }
                    }
                    changed = inventory.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let gpus = gpus_in(&inventory.borrow_and_update());
                        counted |= view.saw(gpus.iter().cloned(), SystemTime::now());
                        if gpus != watch.gpus {
                            // A GPU came or went: register the new set on a new event set.
                            info!(gpus = gpus.len(), "the GPUs changed; watching their events again");
                            watch.stop().await;
                            watch = Watch::start(backend.clone(), gpus, events_tx.clone());
                        }
                    }
                    _ = probe.tick() => {
                        // (GPU, whether it has an XID condition): only those need the recovery action.
                        let gpus: Vec<(String, bool)> = view
                            .gpus
                            .iter()
                            .map(|(g, h)| (g.clone(), h.conditions.contains_key(&ConditionKind::Xid)))
                            .collect();
                        let prober = backend.clone();
                        let results = tokio::task::spawn_blocking(move || {
                            gpus.into_iter()
                                .map(|(g, xid)| {
                                    let ok = prober.probe(&g);
                                    let none_needed = ok && xid && prober.recovery_action(&g) == Some(0);
                                    (g, ok, none_needed)
                                })
                                .collect::<Vec<_>>()
                        })
                        .await
                        .unwrap_or_default();
                        let now = SystemTime::now();
                        for (gpu, ok, none_needed) in results {
                            changes.extend(view.apply(Event::Probe { gpu: gpu.clone(), ok }, now, &settings.rules));
                            if none_needed {
                                changes.extend(view.apply(Event::NoRecoveryNeeded { gpu }, now, &settings.rules));
                            }
                        }
                        changes.extend(view.recover(now, &settings.rules));
                    }
                }
                let persist = changes.iter().any(|c| !matches!(c, Change::Ignored { .. }));
                for c in &changes {
                    log_change(c);
                }
                if persist {
                    let (dir, gpus) = (state_dir.clone(), view.gpus.clone());
                    match tokio::task::spawn_blocking(move || store::save(&dir, &gpus)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            warn!(error = %error_chain(&e), "cannot persist the GPU health; a restart may forget a taint")
                        }
                        Err(e) => warn!(error = %e, "persisting the GPU health failed"),
                    }
                }
                if persist || counted || !changes.is_empty() {
                    tx.send_replace(Arc::new(HealthSnapshot::of(&view)));
                }
            }
            watch.stop().await;
        });
        HealthMonitor { snapshot: rx, task }
    }
}

/// The event thread watching one set of GPUs.
struct Watch {
    gpus: BTreeSet<String>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(backend: Arc<dyn HealthBackend>, gpus: BTreeSet<String>, events: mpsc::UnboundedSender<Event>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let watched: Vec<String> = gpus.iter().cloned().collect();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("edra-health".into()).spawn(move || {
            let sink = move |e: Event| {
                let _ = events.send(e);
            };
            backend.watch(&watched, &sink, &stopping);
        });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                warn!(error = %e, "cannot start the GPU event thread; GPUs are probed but not watched for XIDs");
                None
            }
        };
        Watch { gpus, stop, thread }
    }

    /// Stops the thread and waits for it (its waits are bounded by `source::WAIT`).
    async fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

fn log_change(c: &Change) {
    match c {
        Change::Raised { gpu, condition } if condition.fatal => warn!(
            gpu = %gpu,
            condition = condition.kind.key(),
            value = condition.value.as_deref().unwrap_or(""),
            "GPU unhealthy, its devices are tainted NoSchedule: {}",
            condition.message
        ),
        Change::Raised { gpu, condition } => {
            warn!(gpu = %gpu, condition = condition.kind.key(), "GPU {}", condition.message)
        }
        Change::Ignored { gpu, xid } => {
            info!(gpu = %gpu, xid, "XID {xid} is an application error (health.ignored_xids); the GPU stays healthy")
        }
        Change::Cleared { gpu, kind: ConditionKind::Unmonitored, .. } => {
            info!(gpu = %gpu, "GPU is monitored for XID events again")
        }
        Change::ClearedByNvml { gpu, lasted } => info!(
            gpu = %gpu,
            condition = ConditionKind::Xid.key(),
            tainted_seconds = lasted.as_secs(),
            "GPU recovered (NVML says it needs no recovery action); taint removed after {}",
            crate::config::bounds::show(Duration::from_secs(lasted.as_secs()))
        ),
        Change::Cleared { gpu, kind, lasted } => info!(
            gpu = %gpu,
            condition = kind.key(),
            tainted_seconds = lasted.as_secs(),
            "GPU recovered (it answers and no critical event came for the quiet period); taint removed after {}",
            crate::config::bounds::show(Duration::from_secs(lasted.as_secs()))
        ),
    }
}
