//! The health monitor task: the event thread feeds it, a periodic probe checks every GPU
//! is still there, the quiet period clears conditions, and every change is persisted and
//! published as a new [`HealthSnapshot`] for the publisher (taints), the kubelet's health
//! stream and the metrics.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::probe::{Answer, Probes};
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
        shutdown: watch::Receiver<bool>,
    ) -> HealthMonitor {
        let mut view = load_view(&state_dir).await;
        let gpus = gpus_in(&inventory.borrow_and_update());
        view.saw(gpus.iter().cloned(), SystemTime::now());
        let (tx, rx) = watch::channel(Arc::new(HealthSnapshot::of(&view)));

        let (events_tx, events) = mpsc::unbounded_channel::<Event>();
        let watch = Watch::start(backend.clone(), gpus, events_tx.clone());
        let probes = Probes::new(backend.clone(), settings.probe_interval);

        let running =
            Running { backend, inventory, settings, state_dir, view, snapshot: tx, events, events_tx, watch, probes };
        let task = tokio::spawn(running.run(shutdown));
        HealthMonitor { snapshot: rx, task }
    }
}

/// The view as persisted in `state_dir` (empty when it cannot be read); the conditions it
/// keeps from before the restart are logged.
async fn load_view(state_dir: &Path) -> HealthView {
    let dir = state_dir.to_path_buf();
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
    let view = HealthView::from_persisted(persisted);
    for (gpu, g) in &view.gpus {
        for c in g.conditions.values() {
            warn!(gpu = %gpu, condition = c.kind.key(), value = c.value.as_deref().unwrap_or(""), since = c.since, "GPU condition kept from before the restart: {}", c.message);
        }
    }
    view
}

/// The monitor task: what it judges, where it persists and publishes, and the event thread.
struct Running {
    backend: Arc<dyn HealthBackend>,
    inventory: watch::Receiver<Arc<Inventory>>,
    settings: HealthSettings,
    state_dir: PathBuf,
    view: HealthView,
    /// Where the snapshots go.
    snapshot: watch::Sender<Arc<HealthSnapshot>>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Given to each new event thread.
    events_tx: mpsc::UnboundedSender<Event>,
    watch: Watch,
    probes: Probes,
}

impl Running {
    /// Applies events, inventory changes and probes until `shutdown` (or the inventory's
    /// sender is gone), then stops the event thread.
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut probe = tokio::time::interval(self.settings.probe_interval);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let (changes, counted) = tokio::select! {
                () = stopped(&mut shutdown) => break,
                Some(event) = self.events.recv() => self.on_events(event),
                changed = self.inventory.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    (Vec::new(), self.on_inventory().await)
                }
                _ = probe.tick() => (self.probe(), false),
                Some(answer) = self.probes.answers.recv() => (self.on_answer(answer), false),
            };
            self.settle(changes, counted).await;
        }
        self.watch.stop().await;
    }

    /// Applies `first` and every event already queued behind it; also says whether one
    /// of them was counted (an XID or a double-bit ECC error).
    fn on_events(&mut self, first: Event) -> (Vec<Change>, bool) {
        let (mut changes, mut counted) = (Vec::new(), false);
        let mut next = Some(first);
        while let Some(e) = next {
            counted |= matches!(e, Event::Xid { .. } | Event::DoubleBitEcc { .. });
            changes.extend(self.view.apply(e, SystemTime::now(), &self.settings.rules));
            next = self.events.try_recv().ok();
        }
        (changes, counted)
    }

    /// Takes the inventory's new GPUs into the view, and watches their events again when
    /// the set changed; says whether the view changed.
    async fn on_inventory(&mut self) -> bool {
        let gpus = gpus_in(&self.inventory.borrow_and_update());
        let counted = self.view.saw(gpus.iter().cloned(), SystemTime::now());
        if gpus != self.watch.gpus {
            // A GPU came or went: register the new set on a new event set.
            info!(gpus = gpus.len(), "the GPUs changed; watching their events again");
            self.watch.stop().await;
            self.watch = Watch::start(self.backend.clone(), gpus, self.events_tx.clone());
        }
        counted
    }

    /// Starts a probe of every GPU without one outstanding (its answer comes to
    /// [`Running::on_answer`]), marks the GPUs whose probe hangs, then clears what the
    /// quiet period allows.
    fn probe(&mut self) -> Vec<Change> {
        // (GPU, whether it has an XID condition): only those need the recovery action.
        let gpus: Vec<(String, bool)> =
            self.view.gpus.iter().map(|(g, h)| (g.clone(), h.conditions.contains_key(&ConditionKind::Xid))).collect();
        let hung = self.probes.start(gpus);
        let now = SystemTime::now();
        let mut changes = Vec::new();
        for (gpu, waited) in hung {
            if self.view.gpus.contains_key(&gpu) {
                changes.extend(self.view.apply(Event::ProbeHung { gpu, waited }, now, &self.settings.rules));
            }
        }
        changes.extend(self.view.recover(now, &self.settings.rules));
        changes
    }

    /// Applies one probe's answer (unless its GPU was forgotten meanwhile).
    fn on_answer(&mut self, Answer { gpu, ok, none_needed }: Answer) -> Vec<Change> {
        self.probes.answered(&gpu);
        if !self.view.gpus.contains_key(&gpu) {
            return Vec::new();
        }
        let now = SystemTime::now();
        let mut changes = self.view.apply(Event::Probe { gpu: gpu.clone(), ok }, now, &self.settings.rules);
        if none_needed {
            changes.extend(self.view.apply(Event::NoRecoveryNeeded { gpu }, now, &self.settings.rules));
        }
        changes
    }

    /// Logs `changes`, persists the view when a condition changed, and publishes a new
    /// snapshot when anything did (`counted`: an XID or ECC count).
    async fn settle(&mut self, changes: Vec<Change>, counted: bool) {
        let persist = changes.iter().any(|c| !matches!(c, Change::Ignored { .. }));
        for c in &changes {
            log_change(c);
        }
        if persist {
            let (dir, gpus) = (self.state_dir.clone(), self.view.gpus.clone());
            match tokio::task::spawn_blocking(move || store::save(&dir, &gpus)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(error = %error_chain(&e), "cannot persist the GPU health; a restart may forget a taint")
                }
                Err(e) => warn!(error = %e, "persisting the GPU health failed"),
            }
        }
        if persist || counted || !changes.is_empty() {
            self.snapshot.send_replace(Arc::new(HealthSnapshot::of(&self.view)));
        }
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
        Change::Forgotten { gpu, absent } => info!(
            gpu = %gpu,
            absent_seconds = absent.as_secs(),
            "GPU gone from discovery for the quiet period; its health record is forgotten"
        ),
        Change::Cleared { gpu, kind: ConditionKind::Unresponsive, .. } => {
            info!(gpu = %gpu, "GPU answers the health probe again")
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

#[cfg(test)]
mod tests;
