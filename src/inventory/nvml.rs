//! The NVML backend: NVIDIA's management library, loaded at run time with nvml-wrapper.
//!
//! The library is found as `nvml.library` says (see [`host::library_candidates`]) and
//! stays loaded for the backend's life; each [`DeviceBackend::discover`] enumerates the
//! GPUs afresh. A GPU in MIG mode with MIG devices is published as those devices instead
//! of itself (static MIG). Facts NVML lacks come from sysfs and procfs under the
//! configured roots. Every failing call is reported with the NVML function and the device.
//! For a GPU in MIG mode, discovery also reads what it can be carved into and the MIG
//! instances on it ([`super::nvml_mig`], which also creates and destroys them); a GPU whose
//! MIG capability cannot be read is logged and left out of [`Inventory::mig_gpus`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};

use super::attributes::{GpuFacts, MigFacts, cuda_version_text, gpu_device, mig_device, mig_memory_gb};
use super::attributes::{mig_profile_name, normalize_pci_bus_id};
use super::{Device, DeviceBackend, Inventory, InventoryError, host};
use crate::config::{Config, Paths};
use crate::gpu::{ComputeMode, ComputeModes, GpuError};

/// `nvmlDeviceGetMigMode`'s value for "enabled".
const MIG_ENABLED: u32 = 1;

/// Calls a raw NVML getter `fn(nvmlDevice_t, *mut c_uint)` that nvml-wrapper does not
/// wrap (or wraps into an enum that rejects unknown values), checking that it exists.
macro_rules! raw_u32 {
    ($nvml:expr, $sym:ident, $dev:expr) => {
        match nvml_sym($nvml.lib().$sym.as_ref()) {
            Err(e) => Err(e),
            Ok(f) => {
                let mut value: u32 = 0;
                // SAFETY: the handle comes from this NVML instance and outlives the call;
                // `value` is a valid out-pointer for one c_uint, which is all the function writes.
                let rc = unsafe { f($dev.handle(), &mut value) };
                nvml_try(rc).map(|()| value)
            }
        }
    };
}

/// GPUs discovered through NVML.
pub struct NvmlBackend {
    nvml: Nvml,
    library: String,
    paths: Paths,
    /// (GPU, cause) of MIG capability failures already logged as warnings.
    mig_warned: Mutex<BTreeSet<(String, String)>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").field("library", &self.library).finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads and initialises NVML as `cfg.nvml.library` and `cfg.paths.driver_root` say.
    pub fn load(cfg: &Config) -> Result<Self, InventoryError> {
        let candidates = host::library_candidates(&cfg.nvml.library, &cfg.paths.driver_root);
        let mut first = None;
        for candidate in candidates {
            let library = candidate.display().to_string();
            match Nvml::builder().lib_path(candidate.as_os_str()).init() {
                Ok(nvml) => {
                    tracing::info!(%library, "NVML loaded");
                    return Ok(Self { nvml, library, paths: cfg.paths.clone(), mig_warned: Mutex::default() });
                }
                Err(NvmlError::LibloadingError(e)) => {
                    tracing::debug!(%library, error = %e, "NVML library not loadable");
                    // Keep the first failure: an explicit file under the driver root says more
                    // than the loader's search that follows it.
                    first.get_or_insert(InventoryError::LoadLibrary { library, source: Box::new(e) });
                }
                Err(source @ NvmlError::FailedToLoadSymbol(_)) => {
                    return Err(InventoryError::NotNvml { library, source });
                }
                Err(source) => {
                    return Err(InventoryError::Call {
                        call: "nvmlInit_v2",
                        device: format!("the library {library}"),
                        source,
                    });
                }
            }
        }
        Err(first.unwrap_or_else(|| InventoryError::LoadLibrary {
            library: cfg.nvml.library.display().to_string(),
            source: Box::new(NvmlError::LibraryNotFound),
        }))
    }

    /// The library file or name that was loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The loaded library (for the health watch, which needs its event API).
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    fn gpu_facts(
        &self,
        dev: &nvml_wrapper::Device<'_>,
        index: u32,
        inv: &Inventory,
    ) -> Result<GpuFacts, InventoryError> {
        let mut label = format!("GPU {index}");
        let uuid = required("nvmlDeviceGetUUID", &label, dev.uuid())?;
        label = format!("GPU {index} ({uuid})");
        let pci_bus_id =
            optional("nvmlDeviceGetPciInfo_v3", &label, dev.pci_info())?.map(|p| normalize_pci_bus_id(&p.bus_id));
        let brand = optional("nvmlDeviceGetBrand", &label, raw_u32!(self.nvml, nvmlDeviceGetBrand, dev))?;
        let arch = optional("nvmlDeviceGetArchitecture", &label, raw_u32!(self.nvml, nvmlDeviceGetArchitecture, dev))?;
        let cc = optional("nvmlDeviceGetCudaComputeCapability", &label, dev.cuda_compute_capability())?;
        let sms = optional("nvmlDeviceGetAttributes_v2", &label, dev.attributes())?;
        Ok(GpuFacts {
            index: required("nvmlDeviceGetIndex", &label, dev.index())?,
            minor: required("nvmlDeviceGetMinorNumber", &label, dev.minor_number())?,
            product_name: required("nvmlDeviceGetName", &label, dev.name())?,
            brand: brand.and_then(brand_name).map(str::to_string),
            architecture: arch.and_then(architecture_name).map(str::to_string),
            cuda_compute_capability: cc.map(|c| format!("{}.{}", c.major, c.minor)),
            driver_version: inv.driver_version.clone(),
            cuda_driver_version: inv.cuda_driver_version.clone(),
            pcie_root: pci_bus_id.as_deref().and_then(|b| host::pcie_root(&self.paths.sys_root, b)),
            numa_node: pci_bus_id.as_deref().and_then(|b| host::numa_node(&self.paths.sys_root, b)),
            pci_bus_id,
            memory: required("nvmlDeviceGetMemoryInfo_v2", &label, dev.memory_info())?.total,
            multiprocessors: sms.map(|a| a.multiprocessor_count),
            uuid,
        })
    }

    /// Whether a GPU is in MIG mode (false when MIG is unsupported).
    fn mig_enabled(&self, dev: &nvml_wrapper::Device<'_>, gpu: &GpuFacts) -> Result<bool, InventoryError> {
        let label = format!("GPU {} ({})", gpu.index, gpu.uuid);
        let mode = optional("nvmlDeviceGetMigMode", &label, dev.mig_mode())?;
        Ok(mode.map(|m| m.current) == Some(MIG_ENABLED))
    }

    /// The MIG devices of a GPU in MIG mode.
    fn mig_devices(&self, dev: &nvml_wrapper::Device<'_>, gpu: &GpuFacts) -> Result<Vec<Device>, InventoryError> {
        let label = format!("GPU {} ({})", gpu.index, gpu.uuid);
        let max = required("nvmlDeviceGetMaxMigDeviceCount", &label, dev.mig_device_count())?;
        let mut out = Vec::new();
        for slot in 0..max {
            let mig = match dev.mig_device_by_index(slot) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => continue,
                Err(source) => {
                    return Err(InventoryError::Call {
                        call: "nvmlDeviceGetMigDeviceHandleByIndex",
                        device: label,
                        source,
                    });
                }
            };
            let mlabel = format!("MIG device {slot} of {label}");
            let gi =
                required("nvmlDeviceGetGpuInstanceId", &mlabel, raw_u32!(self.nvml, nvmlDeviceGetGpuInstanceId, mig))?;
            let ci = required(
                "nvmlDeviceGetComputeInstanceId",
                &mlabel,
                raw_u32!(self.nvml, nvmlDeviceGetComputeInstanceId, mig),
            )?;
            let attrs = required("nvmlDeviceGetAttributes_v2", &mlabel, mig.attributes())?;
            let facts = MigFacts {
                gi,
                ci,
                uuid: required("nvmlDeviceGetUUID", &mlabel, mig.uuid())?,
                profile: mig_profile_name(
                    attrs.gpu_instance_slice_count,
                    attrs.compute_instance_slice_count,
                    mig_memory_gb(gpu.memory, attrs.memory_size_mb),
                ),
                memory: required("nvmlDeviceGetMemoryInfo_v2", &mlabel, mig.memory_info())?.total,
                multiprocessors: attrs.multiprocessor_count,
            };
            out.push(mig_device(gpu, &facts, &self.paths.dev_root, self.cap_nodes(gpu.minor, gi, ci)));
        }
        if out.is_empty() && self.first_time(&gpu.uuid, "no MIG devices") {
            tracing::info!(
                gpu = %label,
                "MIG mode is enabled but no MIG devices exist: the whole GPU is published (unless [mig] dynamic selects it)"
            );
        }
        Ok(out)
    }

    /// The GI and CI capability device nodes, skipping (with a warning) those procfs lacks.
    fn cap_nodes(&self, minor: u32, gi: u32, ci: u32) -> Vec<PathBuf> {
        let mut nodes = Vec::new();
        for which in [None, Some(ci)] {
            match host::mig_cap_minor(&self.paths.proc_root, minor, gi, which) {
                Some(n) => nodes.push(self.paths.dev_root.join(format!("nvidia-caps/nvidia-cap{n}"))),
                None => tracing::warn!(
                    gpu.minor = minor,
                    gi,
                    ci = ?which,
                    proc_root = %self.paths.proc_root.display(),
                    "MIG capability not found under procfs; its device node is not listed"
                ),
            }
        }
        nodes
    }
}

impl DeviceBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Inventory, InventoryError> {
        let system = "the system";
        let mut inv = Inventory {
            devices: Vec::new(),
            driver_version: optional("nvmlSystemGetDriverVersion", system, self.nvml.sys_driver_version())?,
            cuda_driver_version: optional(
                "nvmlSystemGetCudaDriverVersion_v2",
                system,
                self.nvml.sys_cuda_driver_version(),
            )?
            .map(cuda_version_text),
            mig_gpus: Vec::new(),
            counter_sets: Vec::new(),
        };
        let count = required("nvmlDeviceGetCount_v2", system, self.nvml.device_count())?;
        for index in 0..count {
            let dev =
                required("nvmlDeviceGetHandleByIndex_v2", &format!("GPU {index}"), self.nvml.device_by_index(index))?;
            let gpu = self.gpu_facts(&dev, index, &inv)?;
            let mig = self.mig_enabled(&dev, &gpu)?;
            let migs = if mig { self.mig_devices(&dev, &gpu)? } else { Vec::new() };
            let mut device = gpu_device(&gpu, &self.paths.dev_root);
            if let Some(bus_id) = &gpu.pci_bus_id {
                device.device_nodes.extend(host::drm_nodes(&self.paths.sys_root, &self.paths.dev_root, bus_id));
            }
            if mig {
                match self.mig_gpu(&dev, &gpu.uuid, gpu.memory, device.clone()) {
                    Ok(m) => inv.mig_gpus.push(m),
                    Err(e) => self.warn_mig_once(&gpu.uuid, &e),
                }
            }
            if migs.is_empty() {
                inv.devices.push(device);
            } else {
                inv.devices.extend(migs);
            }
        }
        inv.devices.sort_by(|a, b| a.name.cmp(&b.name));
        tracing::debug!(devices = inv.devices.len(), mig_gpus = inv.mig_gpus.len(), "NVML discovery done");
        Ok(inv)
    }

    fn mig(&self) -> Option<&dyn crate::gpu::mig_control::MigControl> {
        Some(self)
    }
}

impl NvmlBackend {
    /// Whether `what` is said of GPU `uuid` for the first time (then it is remembered).
    fn first_time(&self, uuid: &str, what: &str) -> bool {
        match self.mig_warned.lock() {
            Ok(mut seen) => seen.insert((uuid.to_string(), what.to_string())),
            Err(_) => true,
        }
    }

    /// Logs that a GPU's MIG capability could not be read, once per GPU and cause.
    fn warn_mig_once(&self, uuid: &str, error: &crate::gpu::mig_control::MigError) {
        let first = self.first_time(uuid, &error.to_string());
        if first {
            tracing::warn!(gpu = uuid, %error, "MIG capability not readable; the GPU gets no dynamic MIG devices");
        } else {
            tracing::debug!(gpu = uuid, %error, "MIG capability still not readable");
        }
    }
}

fn nvml_mode(mode: ComputeMode) -> nvml_wrapper::enum_wrappers::device::ComputeMode {
    use nvml_wrapper::enum_wrappers::device::ComputeMode as N;
    match mode {
        ComputeMode::Default => N::Default,
        ComputeMode::ExclusiveThread => N::ExclusiveThread,
        ComputeMode::Prohibited => N::Prohibited,
        ComputeMode::ExclusiveProcess => N::ExclusiveProcess,
    }
}

impl NvmlBackend {
    fn by_uuid(&self, uuid: &str) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        self.nvml.device_by_uuid(uuid).map_err(|e| match e {
            NvmlError::NotFound => GpuError::UnknownGpu { uuid: uuid.to_string() },
            source => {
                GpuError::Nvml { call: "nvmlDeviceGetHandleByUUID", uuid: uuid.to_string(), source: Box::new(source) }
            }
        })
    }
}

impl ComputeModes for NvmlBackend {
    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as N;
        let mode = self.by_uuid(uuid)?.compute_mode().map_err(|source| GpuError::Nvml {
            call: "nvmlDeviceGetComputeMode",
            uuid: uuid.to_string(),
            source: Box::new(source),
        })?;
        Ok(match mode {
            N::Default => ComputeMode::Default,
            N::ExclusiveThread => ComputeMode::ExclusiveThread,
            N::Prohibited => ComputeMode::Prohibited,
            N::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        })
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        self.by_uuid(uuid)?.set_compute_mode(nvml_mode(mode)).map_err(|source| GpuError::Nvml {
            call: "nvmlDeviceSetComputeMode",
            uuid: uuid.to_string(),
            source: Box::new(source),
        })?;
        tracing::info!(gpu = uuid, ?mode, "GPU compute mode set");
        Ok(())
    }
}

fn required<T>(call: &'static str, device: &str, r: Result<T, NvmlError>) -> Result<T, InventoryError> {
    r.map_err(|source| InventoryError::Call { call, device: device.to_string(), source })
}

/// A getter whose absence (old driver, unsupported device) only drops an attribute.
fn optional<T>(call: &'static str, device: &str, r: Result<T, NvmlError>) -> Result<Option<T>, InventoryError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e @ (NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_))) => {
            tracing::debug!(call, device, error = %e, "not available; attribute skipped");
            Ok(None)
        }
        Err(source) => Err(InventoryError::Call { call, device: device.to_string(), source }),
    }
}

/// NVML brand values (`nvmlBrandType_t`) by name; `None` for unknown.
fn brand_name(v: u32) -> Option<&'static str> {
    const NAMES: [&str; 17] = [
        "",
        "Quadro",
        "Tesla",
        "NVS",
        "GRID",
        "GeForce",
        "Titan",
        "NvidiaVApps",
        "NvidiaVPC",
        "NvidiaVCS",
        "NvidiaVWS",
        "NvidiaCloudGaming",
        "QuadroRTX",
        "NvidiaRTX",
        "Nvidia",
        "GeForceRTX",
        "TitanRTX",
    ];
    NAMES.get(v as usize).copied().filter(|n| !n.is_empty())
}

/// NVML architecture values (`nvmlDeviceArchitecture_t`) by name; `None` for unknown.
fn architecture_name(v: u32) -> Option<&'static str> {
    Some(match v {
        2 => "Kepler",
        3 => "Maxwell",
        4 => "Pascal",
        5 => "Volta",
        6 => "Turing",
        7 => "Ampere",
        8 => "Ada Lovelace",
        9 => "Hopper",
        10 => "Blackwell",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
