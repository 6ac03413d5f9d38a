//! The periodic light probe, one thread per GPU probe: a GPU whose NVML call hangs holds
//! only its own thread, and the monitor goes on with the others and with events. A GPU
//! has at most one probe outstanding — a hung one is not probed again until it answers —
//! so the threads are bounded by the number of GPUs. A probe outstanding for longer than
//! [`hung_after`] is reported, and the monitor marks its GPU's health unknown with the
//! reason until the answer comes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::source::HealthBackend;

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    pub gpu: String,
    /// The GPU answered.
    pub ok: bool,
    /// It has an XID condition and NVML says no recovery action is needed.
    pub none_needed: bool,
}

/// After how long an outstanding probe counts as hung: two probe intervals, and never
/// under 3 s (a busy node may be slow to start a thread).
pub fn hung_after(probe_interval: Duration) -> Duration {
    probe_interval.saturating_mul(2).max(Duration::from_secs(3))
}

/// The probes outstanding, and where their answers come.
pub(super) struct Probes {
    backend: Arc<dyn HealthBackend>,
    /// GPUs with a probe outstanding, and when it started.
    outstanding: BTreeMap<String, Instant>,
    hung_after: Duration,
    tx: mpsc::UnboundedSender<Answer>,
    /// The answers, one per probe started.
    pub answers: mpsc::UnboundedReceiver<Answer>,
}

impl Probes {
    pub fn new(backend: Arc<dyn HealthBackend>, probe_interval: Duration) -> Self {
        let (tx, answers) = mpsc::unbounded_channel();
        Probes { backend, outstanding: BTreeMap::new(), hung_after: hung_after(probe_interval), tx, answers }
    }

    /// Starts a probe of each of `gpus` (with whether it has an XID condition, so needs
    /// NVML's recovery action asked) that has none outstanding; returns the GPUs whose
    /// probe has been outstanding longer than [`hung_after`], with how long.
    pub fn start(&mut self, gpus: Vec<(String, bool)>) -> Vec<(String, Duration)> {
        let now = Instant::now();
        let hung = self
            .outstanding
            .iter()
            .map(|(gpu, started)| (gpu.clone(), now.saturating_duration_since(*started)))
            .filter(|(_, waited)| *waited >= self.hung_after)
            .collect();
        for (gpu, xid) in gpus {
            if self.outstanding.contains_key(&gpu) {
                continue;
            }
            let (backend, tx, name) = (Arc::clone(&self.backend), self.tx.clone(), gpu.clone());
            let spawned = std::thread::Builder::new().name("edra-probe".into()).spawn(move || {
                let ok = backend.probe(&name);
                let none_needed = ok && xid && backend.recovery_action(&name) == Some(0);
                let _ = tx.send(Answer { gpu: name, ok, none_needed });
            });
            match spawned {
                Ok(_) => {
                    self.outstanding.insert(gpu, now);
                }
                Err(e) => {
                    tracing::warn!(gpu = %gpu, error = %e, "cannot start a thread to probe the GPU; trying again at the next probe")
                }
            }
        }
        hung
    }

    /// Notes that `gpu`'s probe answered.
    pub fn answered(&mut self, gpu: &str) {
        self.outstanding.remove(gpu);
    }
}
