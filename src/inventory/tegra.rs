//! The Tegra backend: the integrated GPU of an NVIDIA Jetson (Orin, Thor), served like a
//! discrete GPU.
//!
//! A Jetson has one GPU inside its SoC, sharing the system's RAM with the CPU. It is found
//! from the platform's own files ([`platform`]: the L4T release, the device tree's model and
//! SoC, the RAM), not from NVML: NVML on Orin (JetPack 6) answers only some queries and on
//! older releases is absent, so it is used where it answers (the GPU's name, compute
//! capability, driver and CUDA versions, and on Thor its UUID) and never required. The one
//! device is `gpu-0` with `type: gpu`, `integrated: true`, `productName`, `model`, `soc`,
//! `architecture`, `cudaComputeCapability`, `l4tRelease`, `jetpackMajor` and a `memory`
//! capacity of the RAM the GPU may use (all of it, shared with the CPU: no claim's memory is
//! kept from the CPU or from another claim). Without a UUID from NVML the device's UUID is
//! derived from the node name, so it stays the same across restarts.
//!
//! The device lists no device nodes of its own: what a container needs (device nodes,
//! libraries, links) is listed by the platform's CSV files and read when a claim is
//! prepared (`prepare::driver_files::csv`). There are no compute modes: the GPU is always
//! time-shared, so a compute-mode change other than to the default is refused.
//! `backend = "auto"` picks this backend when [`platform::detect`] finds a Jetson.

pub mod platform;

use std::collections::BTreeMap;

use super::attributes::{GpuFacts, gpu_device, normalize_version, uuid_text};
use super::nvml::NvmlBackend;
use super::{AttributeValue, Device, DeviceBackend, Inventory, InventoryError};
use crate::config::{Config, Paths};
use crate::gpu::{ComputeMode, ComputeModes, GpuError};

/// The attribute every integrated GPU carries, `true`.
pub const INTEGRATED: &str = "integrated";

/// Whether `device` is a Jetson's integrated GPU (or a replica or share of one).
pub fn is_integrated(device: &Device) -> bool {
    device.attributes.get(INTEGRATED) == Some(&AttributeValue::Bool(true))
}

/// What NVML said about the integrated GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlFacts {
    /// The GPU's name, e.g. `Orin (nvgpu)`.
    pub name: Option<String>,
    /// Its UUID, where NVML gives one.
    pub uuid: Option<String>,
    /// `major.minor`.
    pub compute_capability: Option<String>,
    /// The driver version.
    pub driver_version: Option<String>,
    /// The CUDA driver version, e.g. `12.6.0`.
    pub cuda_driver_version: Option<String>,
}

/// A Jetson's integrated GPU.
pub struct TegraBackend {
    node: String,
    paths: Paths,
    nvml: Option<NvmlBackend>,
}

impl std::fmt::Debug for TegraBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TegraBackend").field("nvml", &self.nvml.is_some()).finish_non_exhaustive()
    }
}

impl TegraBackend {
    /// The backend for this host, when it is a Jetson ([`platform::detect`]); NVML is
    /// loaded if it can be, and left out (with its reason logged) otherwise.
    pub fn load(cfg: &Config) -> Result<Self, InventoryError> {
        let Some(evidence) = platform::detect(&cfg.paths) else {
            return Err(InventoryError::NotTegra {
                release: cfg.paths.driver_root.join(platform::TEGRA_RELEASE).display().to_string(),
                family: cfg.paths.sys_root.join(platform::SOC_FAMILY).display().to_string(),
            });
        };
        tracing::info!(%evidence, "this host is a Jetson");
        let nvml = match NvmlBackend::load(cfg) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::info!(reason = %crate::util::error_chain(&e), "NVML not loaded; the Jetson is described from its files");
                None
            }
        };
        Ok(Self { node: cfg.node_name.clone(), paths: cfg.paths.clone(), nvml })
    }

    /// What NVML answers about the integrated GPU, when it is loaded and lists one.
    pub fn nvml_facts(&self) -> NvmlFacts {
        let Some(backend) = &self.nvml else { return NvmlFacts::default() };
        let nvml = backend.nvml();
        let count = nvml.device_count().unwrap_or(0);
        let found = (0..count.min(16)).filter_map(|i| nvml.device_by_index(i).ok()).find_map(|d| {
            let name = d.name().ok().filter(|n| platform::is_integrated_name(n))?;
            Some((d, name))
        });
        let Some((dev, name)) = found else { return NvmlFacts::default() };
        NvmlFacts {
            name: Some(name),
            uuid: dev.uuid().ok().filter(|u| u.starts_with("GPU-")),
            compute_capability: dev.cuda_compute_capability().ok().map(|c| format!("{}.{}", c.major, c.minor)),
            driver_version: nvml.sys_driver_version().ok(),
            cuda_driver_version: nvml.sys_cuda_driver_version().ok().map(super::attributes::cuda_version_text),
        }
    }

    /// The device of the integrated GPU described by `p` and `n`.
    pub fn device(&self, p: &platform::Platform, n: &NvmlFacts) -> Device {
        integrated_device(&self.node, &self.paths, p, n)
    }
}

/// The integrated GPU's device from the platform's facts and NVML's (which win where both
/// say something).
pub fn integrated_device(node: &str, paths: &Paths, p: &platform::Platform, n: &NvmlFacts) -> Device {
    let family = p.soc.map(|s| s.family);
    let facts = GpuFacts {
        index: 0,
        minor: 0,
        uuid: n.uuid.clone().unwrap_or_else(|| format!("GPU-{}", uuid_text(&format!("{node}/tegra/igpu0")))),
        product_name: n.name.clone().or_else(|| family.map(str::to_string)).unwrap_or_else(|| "Tegra".into()),
        brand: Some("Nvidia".into()),
        architecture: p.soc.map(|s| s.architecture.to_string()),
        cuda_compute_capability: n.compute_capability.clone().or_else(|| p.soc.map(|s| s.compute_capability.into())),
        driver_version: n.driver_version.clone(),
        cuda_driver_version: n.cuda_driver_version.clone(),
        memory: p.memory.unwrap_or(0),
        ..GpuFacts::default()
    };
    let mut device = gpu_device(&facts, &paths.dev_root);
    device.device_nodes.clear();
    let mut extra: BTreeMap<String, AttributeValue> = BTreeMap::new();
    extra.insert(INTEGRATED.into(), AttributeValue::Bool(true));
    if let Some(model) = &p.model {
        extra.insert("model".into(), AttributeValue::String(model.clone()));
    }
    if let Some(soc) = &p.soc_name {
        extra.insert("soc".into(), AttributeValue::String(soc.clone()));
    }
    if let Some(l4t) = &p.l4t {
        if let Some(v) = l4t.version() {
            extra.insert("l4tRelease".into(), AttributeValue::Version(v));
        }
        if let Some(jp) = l4t.jetpack_major() {
            extra.insert("jetpackMajor".into(), AttributeValue::Int(i64::from(jp)));
        }
    }
    device.attributes.extend(extra);
    super::attributes::validate_device(&mut device);
    device
}

impl DeviceBackend for TegraBackend {
    fn name(&self) -> &'static str {
        "tegra"
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let p = platform::read(&self.paths);
        if p.memory.is_none() {
            tracing::warn!(meminfo = %self.paths.proc_root.join(platform::MEMINFO).display(), "no MemTotal; memory published as 0");
        }
        let n = self.nvml_facts();
        let device = self.device(&p, &n);
        Ok(Inventory {
            devices: vec![device],
            driver_version: n.driver_version.clone(),
            cuda_driver_version: n.cuda_driver_version.as_deref().and_then(normalize_version),
            mig_gpus: Vec::new(),
            counter_sets: Vec::new(),
        })
    }
}

/// Why a compute mode cannot be changed on a Jetson.
pub const NO_COMPUTE_MODES: &str = "a Jetson's integrated GPU has no compute modes (it is always time-shared)";

impl ComputeModes for TegraBackend {
    fn compute_mode(&self, _uuid: &str) -> Result<ComputeMode, GpuError> {
        Ok(ComputeMode::Default)
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        if mode == ComputeMode::Default {
            return Ok(());
        }
        Err(GpuError::Unsupported {
            uuid: uuid.to_string(),
            what: format!("set the compute mode to {mode:?}"),
            why: NO_COMPUTE_MODES,
        })
    }
}

#[cfg(test)]
mod tests;
