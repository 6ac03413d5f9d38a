//! The mock backend: GPUs described in the `[mock]` configuration section, for running
//! edra without hardware (demos, tests, CI).
//!
//! Everything is deterministic: UUIDs are derived from the node name and the GPU (and MIG
//! instance), PCI bus IDs are `0000:<10 + index>:00.0`, minors equal indexes. Device
//! nodes are the paths a real node would have under `paths.dev_root`; creating them is
//! not this backend's job. DRM nodes are added only where a fake `paths.sys_root` lists
//! them for the mock bus IDs and they exist under `paths.dev_root`. MIG profiles (`mock.mig`) replace their parent GPU; their
//! memory and multiprocessors are derived from the profile name. MIG capability device
//! minors follow the NVIDIA driver's numbering (`/proc/driver/nvidia-caps/mig-minors`).
//! With `mock.mig_mode = true` the GPUs are in MIG mode instead and their MIG instances are
//! created and destroyed on demand ([`mig_state`]); the instances that exist are listed as MIG
//! devices, as `mock.mig` ones are.

pub mod mig_state;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use super::attributes::{GpuFacts, MigFacts, gpu_device, mig_device, normalize_version};
use super::{DeviceBackend, Inventory, InventoryError};
use crate::config::{Config, MockSettings};
use crate::gpu::{ComputeMode, ComputeModes, GpuError};

/// MIG slices (GPU instance granularity) of a whole GPU.
const MIG_SLICES: u32 = 7;

/// GPUs from configuration.
#[derive(Debug, Clone)]
pub struct MockBackend {
    node: String,
    settings: MockSettings,
    dev_root: PathBuf,
    sys_root: PathBuf,
    /// Compute modes set so far, by GPU UUID (unset: Default, as after a boot).
    modes: Arc<Mutex<BTreeMap<String, ComputeMode>>>,
    /// Dynamic MIG, with `mock.mig_mode` on a model with a known profile table.
    mig: Option<Arc<mig_state::MockMigControl>>,
}

impl MockBackend {
    /// A backend serving `cfg.mock` for node `cfg.node_name`.
    pub fn new(cfg: &Config) -> Self {
        let mut backend = Self {
            node: cfg.node_name.clone(),
            settings: cfg.mock.clone(),
            dev_root: cfg.paths.dev_root.clone(),
            sys_root: cfg.paths.sys_root.clone(),
            modes: Arc::default(),
            mig: None,
        };
        let s = &backend.settings;
        if s.mig_mode
            && let Some(capability) = crate::gpu::mig_control::profiles::for_model(&s.product_name, s.memory)
        {
            let gpus = (0..s.gpus)
                .map(|index| mig_state::MigModeGpu {
                    uuid: gpu_uuid(&backend.node, index),
                    index,
                    capability: capability.clone(),
                })
                .collect();
            let control = mig_state::MockMigControl::new(&backend.node, &cfg.paths.runtime_dir, gpus);
            backend.mig = Some(Arc::new(control));
        }
        backend
    }

    /// The dynamic MIG control, when the GPUs are in MIG mode (for tests and tools that
    /// look at the mock's instances).
    pub fn mig_control(&self) -> Option<&mig_state::MockMigControl> {
        self.mig.as_deref()
    }

    /// The whole-GPU device of GPU `gpu`, with its DRM nodes.
    fn whole_gpu(&self, gpu: &GpuFacts) -> super::Device {
        let mut device = gpu_device(gpu, &self.dev_root);
        if let Some(bus_id) = &gpu.pci_bus_id {
            device.device_nodes.extend(super::host::drm_nodes(&self.sys_root, &self.dev_root, bus_id));
        }
        device
    }

    /// The MIG device of MIG instance `m` on `gpu`, with its capability nodes.
    fn static_mig(&self, gpu: &GpuFacts, m: &MigFacts) -> super::Device {
        let caps = vec![
            self.dev_root.join(format!("nvidia-caps/nvidia-cap{}", gi_cap_minor(gpu.minor, m.gi))),
            self.dev_root.join(format!("nvidia-caps/nvidia-cap{}", ci_cap_minor(gpu.minor, m.gi, m.ci))),
        ];
        mig_device(gpu, m, &self.dev_root, caps)
    }

    /// Whether `uuid` is one of this backend's full GPUs.
    fn has_gpu(&self, uuid: &str) -> bool {
        (0..self.settings.gpus).any(|i| self.gpu_facts(i).uuid == uuid)
    }

    fn gpu_facts(&self, index: u32) -> GpuFacts {
        let s = &self.settings;
        GpuFacts {
            index,
            minor: index,
            uuid: gpu_uuid(&self.node, index),
            product_name: s.product_name.clone(),
            brand: Some("Nvidia".into()),
            architecture: Some(s.architecture.clone()),
            cuda_compute_capability: Some(s.cuda_compute_capability.clone()),
            driver_version: Some(s.driver_version.clone()),
            cuda_driver_version: Some(s.cuda_driver_version.clone()),
            pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x10 + index)),
            pcie_root: Some("pci0000:00".into()),
            numa_node: None,
            memory: s.memory,
            multiprocessors: Some(s.multiprocessors),
        }
    }
}

impl DeviceBackend for MockBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let mut devices = Vec::new();
        let mut mig_gpus = Vec::new();
        for index in 0..self.settings.gpus {
            let gpu = self.gpu_facts(index);
            if let Some(control) = &self.mig {
                let Some(mode) = control.gpus().iter().find(|g| g.index == index) else { continue };
                let instances = control.instances_of(&mode.uuid).map_err(|e| InventoryError::Mock(e.to_string()))?;
                for i in &instances {
                    let (Some(ci), Some(uuid), Some(profile)) = (i.ci, &i.uuid, mode.capability.profile(i.profile_id))
                    else {
                        continue;
                    };
                    let facts = MigFacts {
                        gi: i.gi,
                        ci,
                        uuid: uuid.clone(),
                        profile: profile.name.clone(),
                        memory: profile.memory,
                        multiprocessors: profile.multiprocessors,
                    };
                    devices.push(self.static_mig(&gpu, &facts));
                }
                mig_gpus.push(crate::inventory::MigGpu {
                    uuid: mode.uuid.clone(),
                    device: self.whole_gpu(&gpu),
                    capability: mode.capability.clone(),
                    instances,
                });
                continue;
            }
            match self.settings.mig.iter().find(|m| m.gpu == index) {
                None => devices.push(self.whole_gpu(&gpu)),
                Some(layout) => {
                    for m in mig_layout(&gpu, &layout.profiles, &self.node)? {
                        devices.push(self.static_mig(&gpu, &m));
                    }
                }
            }
        }
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Inventory {
            devices,
            driver_version: Some(self.settings.driver_version.clone()),
            cuda_driver_version: Some(
                normalize_version(&self.settings.cuda_driver_version)
                    .unwrap_or_else(|| self.settings.cuda_driver_version.clone()),
            ),
            mig_gpus,
            counter_sets: Vec::new(),
        })
    }

    fn mig(&self) -> Option<&dyn crate::gpu::mig_control::MigControl> {
        self.mig.as_deref().map(|m| m as &dyn crate::gpu::mig_control::MigControl)
    }
}

impl ComputeModes for MockBackend {
    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        if !self.has_gpu(uuid) {
            return Err(GpuError::UnknownGpu { uuid: uuid.to_string() });
        }
        let modes = self.modes.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(modes.get(uuid).copied().unwrap_or(ComputeMode::Default))
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        if !self.has_gpu(uuid) {
            return Err(GpuError::UnknownGpu { uuid: uuid.to_string() });
        }
        tracing::info!(gpu = uuid, ?mode, "mock GPU compute mode set");
        self.modes.lock().unwrap_or_else(PoisonError::into_inner).insert(uuid.to_string(), mode);
        Ok(())
    }
}

/// A profile name's parts: `1g.10gb` → (GPU slices 1, compute slices 1, 10 GB);
/// `1c.3g.40gb` → (3, 1, 40).
pub fn parse_profile(profile: &str) -> Option<(u32, u32, u64)> {
    let num = |s: &str, suffix: &str| s.strip_suffix(suffix).and_then(|n| n.parse::<u64>().ok());
    let parts: Vec<&str> = profile.split('.').collect();
    let (c, g, mem) = match parts.as_slice() {
        [g, mem] => (None, num(g, "g")?, num(mem, "gb")?),
        [c, g, mem] => (Some(num(c, "c")?), num(g, "g")?, num(mem, "gb")?),
        _ => return None,
    };
    let g = u32::try_from(g).ok()?;
    let c = match c {
        Some(c) => u32::try_from(c).ok()?,
        None => g,
    };
    (g > 0 && c > 0 && c <= g).then_some((g, c, mem))
}

/// The MIG devices a layout creates on `gpu`: GPU instance IDs 1, 2, ... in order, compute
/// instance 0 each; memory is the profile's GiB, multiprocessors the compute slices' share
/// of the parent's (a whole GPU has seven slices).
fn mig_layout(gpu: &GpuFacts, profiles: &[String], node: &str) -> Result<Vec<MigFacts>, InventoryError> {
    let mut slices = 0u32;
    let mut memory = 0u64;
    let mut out = Vec::new();
    for (i, profile) in profiles.iter().enumerate() {
        let (g, c, gb) = parse_profile(profile).ok_or_else(|| {
            InventoryError::Mock(format!("GPU {}: {profile:?} is not a MIG profile such as \"1g.10gb\"", gpu.index))
        })?;
        // Profile numbers come from configuration: a sum or a GiB count that overflows is
        // simply more than the GPU has (never a wrapped, small value).
        slices = slices.saturating_add(g);
        let bytes = gb.saturating_mul(1 << 30);
        memory = memory.saturating_add(bytes);
        if slices > MIG_SLICES || memory > gpu.memory {
            return Err(InventoryError::Mock(format!(
                "GPU {}: MIG profiles {profiles:?} need more than the GPU has ({MIG_SLICES} slices, {} GiB); \
                 remove profiles from mock.mig",
                gpu.index,
                gpu.memory >> 30
            )));
        }
        // At most MIG_SLICES profiles get here.
        let gi = u32::try_from(i).map_or(u32::MAX, |i| i.saturating_add(1));
        out.push(MigFacts {
            gi,
            ci: 0,
            uuid: format!("MIG-{}", super::attributes::uuid_text(&format!("{node}/gpu/{}/gi/{gi}/ci/0", gpu.index))),
            profile: profile.clone(),
            memory: bytes,
            multiprocessors: c * (gpu.multiprocessors.unwrap_or(0) / MIG_SLICES),
        });
    }
    Ok(out)
}

/// Device minor of `nvidia-caps/nvidia-cap<N>` for `gpu<minor>/gi<gi>/access`, as the NVIDIA
/// driver numbers them: 1 and 2 are config and monitor, then per GPU 15 instances of 9
/// (the instance's access file and its 8 compute instances).
pub fn gi_cap_minor(gpu_minor: u32, gi: u32) -> u32 {
    3 + gpu_minor * 15 * 9 + gi * 9
}

/// Device minor for `gpu<minor>/gi<gi>/ci<ci>/access`.
pub fn ci_cap_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    gi_cap_minor(gpu_minor, gi) + 1 + ci
}

/// The UUID the mock backend gives GPU `index` of `node` (`GPU-` and a UUID derived from both).
pub fn gpu_uuid(node: &str, index: u32) -> String {
    format!("GPU-{}", super::attributes::uuid_text(&format!("{node}/gpu/{index}")))
}

#[cfg(test)]
mod tests;
