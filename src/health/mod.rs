//! GPU health: what edra observes about its GPUs' health, and what it means for their
//! devices.
//!
//! A dedicated thread waits on NVML's events (critical XIDs, double-bit ECC errors, lost
//! GPUs; [`nvml`]) or reads the mock backend's events file ([`source`]); a periodic light
//! probe notices a GPU that disappeared or came back, each GPU's on a thread of its own so
//! a hung NVML call leaves only that GPU's health unknown ([`probe`]). The pure [`view`] turns events and
//! the clock into conditions per GPU (an XID on the ignore list is only counted; a fatal
//! condition is never downgraded by a lesser event; it clears once the GPU answers and no
//! critical event came for the quiet period). The [`monitor`] task persists the conditions
//! ([`store`], so a restart keeps taints and their times) and publishes a
//! [`HealthSnapshot`] that the publisher turns into device taints, the plugin into the
//! kubelet's health stream, and the metrics into gauges. This module knows no claims and
//! no API server.

pub mod monitor;
pub mod nvml;
pub mod probe;
pub mod source;
pub mod store;
pub mod view;

use std::collections::BTreeMap;

use crate::inventory::Device;
pub use monitor::{HealthMonitor, HealthSettings};
pub use source::{HealthBackend, MockHealth};
pub use view::{Condition, ConditionKind, GpuHealth};

/// Why a Jetson's integrated GPU other than Thor's is not watched.
pub const NO_TEGRA_EVENTS: &str = "a Jetson's integrated GPU (Orin and older) has no XID event source: \
     its health is not monitored";

/// Where health events come from for the device backend called `backend`: the mock's
/// events file, or NVML's event API on an instance of its own (the library is
/// reference-counted by the driver); when NVML cannot be loaded, nothing is watched and
/// every GPU is reported as not monitored, with the reason. On a Jetson (`tegra`) NVML's
/// events are used only on Thor, whose open kernel driver has them; Orin has none, so
/// its GPU is reported as not monitored ([`NO_TEGRA_EVENTS`]), never as healthy.
pub fn backend_for(config: &crate::config::Config, backend: &str) -> std::sync::Arc<dyn HealthBackend> {
    use std::sync::Arc;
    if backend == "mock" {
        return Arc::new(MockHealth::new(&config.node_name, config.mock.gpus, config.mock.events_file.clone()));
    }
    let loaded = crate::inventory::nvml::NvmlBackend::load(config);
    if backend == "tegra" {
        return match loaded {
            Ok(nvml) if names_thor(&nvml) => Arc::new(nvml::NvmlHealth::new(nvml)),
            _ => Arc::new(source::Unwatched { reason: NO_TEGRA_EVENTS.into() }),
        };
    }
    match loaded {
        Ok(nvml) => Arc::new(nvml::NvmlHealth::new(nvml)),
        Err(e) => {
            let reason = format!("NVML could not be loaded for events: {}", crate::util::error_chain(&e));
            Arc::new(source::Unwatched { reason })
        }
    }
}

/// Whether NVML lists a Thor GPU.
fn names_thor(nvml: &crate::inventory::nvml::NvmlBackend) -> bool {
    let n = nvml.nvml();
    (0..n.device_count().unwrap_or(0).min(16))
        .filter_map(|i| n.device_by_index(i).ok()?.name().ok())
        .any(|name| name.contains("NVIDIA Thor"))
}

/// The GPUs' health as the monitor last published it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// Conditions per GPU UUID.
    pub gpus: BTreeMap<String, GpuHealth>,
    /// XIDs seen since start, by (GPU UUID, XID), ignored ones included.
    pub xids_seen: BTreeMap<(String, u64), u64>,
}

impl HealthSnapshot {
    fn of(view: &view::HealthView) -> Self {
        HealthSnapshot { gpus: view.gpus.clone(), xids_seen: view.xids_seen.clone() }
    }

    /// The conditions that apply to `device` (its GPU's, or its parent GPU's for MIG).
    pub fn conditions_of(&self, device: &Device) -> impl Iterator<Item = &Condition> {
        self.gpus.get(gpu_of(device)).into_iter().flat_map(|g| g.conditions.values())
    }

    /// `device`'s health state and a message saying why.
    pub fn device_state(&self, device: &Device) -> (DeviceState, String) {
        let conditions: Vec<&Condition> = self.conditions_of(device).collect();
        let fatal: Vec<&&Condition> = conditions.iter().filter(|c| c.fatal).collect();
        if !fatal.is_empty() {
            let why: Vec<&str> = fatal.iter().map(|c| c.message.as_str()).collect();
            return (DeviceState::Unhealthy, why.join("; "));
        }
        match conditions.first() {
            Some(c) => (DeviceState::Unknown, c.message.clone()),
            None => (DeviceState::Healthy, String::new()),
        }
    }
}

/// A device's health as the kubelet and the metrics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceState {
    /// Not known (its GPU is not monitored).
    Unknown,
    /// No condition.
    Healthy,
    /// A fatal condition: tainted NoSchedule.
    Unhealthy,
}

impl DeviceState {
    /// `unknown`, `healthy`, `unhealthy`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceState::Unknown => "unknown",
            DeviceState::Healthy => "healthy",
            DeviceState::Unhealthy => "unhealthy",
        }
    }
}

pub use crate::inventory::gpu_of;
