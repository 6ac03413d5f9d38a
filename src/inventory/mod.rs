//! The device model and the backends that discover devices.
//!
//! A [`DeviceBackend`] turns the node's hardware into an [`Inventory`]: the devices edra
//! publishes (whole GPUs, or MIG devices in place of a GPU in MIG mode) with their
//! attributes and capacity, plus what the prepare path needs to hand them to a container
//! (device nodes, UUIDs). The publisher and the prepare path share this model.
//!
//! Backends: [`nvml::NvmlBackend`] (the real hardware), [`tegra::TegraBackend`] (a Jetson's
//! integrated GPU) and [`mock::MockBackend`] (configured fake GPUs), chosen by
//! [`backend_from_config`]; [`attributes`] holds the
//! attribute vocabulary and limits both share; `edra inventory`'s report is [`crate::publish::report`].

pub mod attributes;
pub mod host;
pub mod mock;
pub mod nvml;
pub mod nvml_mig;
pub mod tegra;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::{BackendKind, Config};

/// A device attribute value as published in a ResourceSlice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttributeValue {
    /// `int` (int64).
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string` (at most 64 bytes).
    String(String),
    /// `version` (semantic version 2.0.0).
    Version(String),
}

/// What kind of device this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// A whole GPU.
    Gpu,
    /// A MIG device carved out of a GPU.
    Mig(MigInfo),
    /// A MIG device a dynamic-MIG GPU can be carved into: it does not exist until a claim
    /// allocated it is prepared (see [`crate::gpu::mig_control`]).
    MigSlot(Box<MigSlot>),
}

/// A (profile, placement) of a dynamic-MIG GPU, published as a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSlot {
    /// UUID of the parent GPU.
    pub parent_uuid: String,
    /// Minor number of the parent GPU (`/dev/nvidia<minor>`).
    pub parent_minor: u32,
    /// Index of the parent GPU.
    pub parent_index: u32,
    /// The GPU instance profile.
    pub profile: crate::gpu::mig_control::MigProfile,
    /// Where the GPU instance is created.
    pub placement: crate::gpu::mig_control::Placement,
}

/// Where a MIG device lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInfo {
    /// UUID of the parent GPU.
    pub parent_uuid: String,
    /// Minor number of the parent GPU (`/dev/nvidia<minor>`).
    pub parent_minor: u32,
    /// Index of the parent GPU.
    pub parent_index: u32,
    /// GPU instance ID.
    pub gi: u32,
    /// Compute instance ID.
    pub ci: u32,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
}

/// One allocatable device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Name in the ResourceSlice: `gpu-<minor>` or `gpu-<minor>-mig-<gi>-<ci>` (DNS label).
    pub name: String,
    /// GPU or MIG.
    pub kind: DeviceKind,
    /// The device's UUID (`GPU-...` or `MIG-...`).
    pub uuid: String,
    /// Index as NVML enumerates GPUs (the parent's index for MIG).
    pub index: u32,
    /// Minor number of the GPU device node (the parent's for MIG).
    pub minor: u32,
    /// Attributes to publish, keyed by qualified name (`uuid`, `resource.kubernetes.io/pciBusID`).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacity to publish in base units (bytes for `memory`), keyed by qualified name.
    pub capacity: BTreeMap<String, u64>,
    /// Device nodes this device needs in a container, as paths on the host
    /// (e.g. `<dev root>/nvidia0`, MIG capability nodes). Control nodes shared by all GPUs
    /// (`nvidiactl`, `nvidia-uvm`, ...) are not listed here.
    pub device_nodes: Vec<PathBuf>,
    /// Published as shareable (consumable capacity) with this memory policy; set by
    /// [`crate::sharing`], never by a backend.
    pub shared: Option<SharePolicy>,
    /// The counters this device consumes from its GPU's counter set (dynamic MIG); set by
    /// [`crate::dynamic_mig`], never by a backend.
    pub consumes: Option<CounterUse>,
}

/// A set of counters devices draw from (`spec.sharedCounters[]` of a ResourceSlice): one
/// per dynamic-MIG GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSet {
    /// The set's name (DNS label, unique in the pool).
    pub name: String,
    /// Counter values in base units (bytes for `memory`), keyed by counter name.
    pub counters: BTreeMap<String, u64>,
}

/// What a device consumes from one counter set (`devices[].consumesCounters[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterUse {
    /// The counter set's name.
    pub counter_set: String,
    /// Amounts in base units, keyed by counter name.
    pub counters: BTreeMap<String, u64>,
}

/// The UUID of the GPU `device` is (or is carved from).
pub fn gpu_of(device: &Device) -> &str {
    match &device.kind {
        DeviceKind::Gpu => &device.uuid,
        DeviceKind::Mig(m) => &m.parent_uuid,
        DeviceKind::MigSlot(s) => &s.parent_uuid,
    }
}

/// A MIG-capable GPU in MIG mode: what it supports and what exists on it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// The whole GPU as it is published when it is not carved up (kind
    /// [`DeviceKind::Gpu`], its attributes and capacity), whether or not
    /// MIG devices exist on it now.
    pub device: Device,
    /// What it can be carved into.
    pub capability: crate::gpu::mig_control::MigCapability,
    /// The GPU instances that exist, created by edra or not.
    pub instances: Vec<crate::gpu::mig_control::MigInstance>,
}

/// The memory request policy of a shareable GPU, in bytes: `default` when a claim asks for
/// no memory, otherwise the request rounded up to `min + k·step` (`min` = `step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharePolicy {
    /// Consumed by a claim that names no memory: the whole memory, rounded down to the step.
    pub default: u64,
    /// Smallest share and the rounding step.
    pub step: u64,
}

/// Everything a backend discovered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    /// Devices, sorted by name.
    pub devices: Vec<Device>,
    /// The kernel driver version as the driver spells it (`535.104.05`, the form its file
    /// names use), when known.
    pub driver_version: Option<String>,
    /// The CUDA driver version as a semantic version, e.g. `12.4.0`, when known.
    pub cuda_driver_version: Option<String>,
    /// GPUs in MIG mode whose MIG capability the backend could read, with the MIG
    /// instances on them now (for dynamic MIG); their static MIG devices are in `devices`.
    pub mig_gpus: Vec<MigGpu>,
    /// Counter sets to publish (dynamic MIG); set by [`crate::dynamic_mig`], never by a backend.
    pub counter_sets: Vec<CounterSet>,
}

impl Device {
    /// A `string` or `version` attribute's text (empty when absent or of another type).
    pub fn text(&self, key: &str) -> String {
        match self.attributes.get(key) {
            Some(AttributeValue::String(v) | AttributeValue::Version(v)) => v.clone(),
            _ => String::new(),
        }
    }
}

impl Inventory {
    /// The device called `name`, if any.
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// Turns the node's hardware into an [`Inventory`]; also reads and sets compute modes
/// (see [`crate::gpu`]), since the backend is what holds the GPUs' handles.
pub trait DeviceBackend: crate::gpu::ComputeModes + Send + Sync {
    /// Short name for logs and messages (`nvml`, `mock`).
    fn name(&self) -> &'static str;
    /// Discovers the devices now. Devices come back sorted by name, validated for publishing.
    fn discover(&self) -> Result<Inventory, InventoryError>;
    /// MIG instance control, when this backend can create and destroy MIG instances.
    fn mig(&self) -> Option<&dyn crate::gpu::mig_control::MigControl> {
        None
    }
}

/// Why devices could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// `backend = "auto"` found no usable NVML; edra never falls back to the mock silently.
    #[error("backend = \"auto\" ({origin}) found no usable NVML and does not fall back to the mock backend: {reason}")]
    NoBackend {
        /// Where `backend = "auto"` came from (the default, a file and line, a flag).
        origin: String,
        /// The NVML failure with its causes, on one line.
        reason: String,
        /// The NVML failure itself (not a `source`: `reason` already carries its text).
        cause: Box<InventoryError>,
    },
    /// The NVML library could not be opened.
    #[error(
        "cannot load the NVML library {library} (is the NVIDIA driver installed? check nvml.library and \
         paths.driver_root, or use --backend mock to run without GPUs)"
    )]
    LoadLibrary {
        /// The file or name tried (the first one when several were tried).
        library: String,
        /// The dynamic loader's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The library loaded but lacks NVML's entry points.
    #[error(
        "{library} is not a usable NVML library (a required function is missing); point nvml.library at libnvidia-ml.so.1"
    )]
    NotNvml {
        /// The library loaded.
        library: String,
        /// The missing symbol.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// An NVML call failed.
    #[error(
        "NVML {call} failed for {device}: check that the NVIDIA kernel driver is loaded (nvidia-smi works) and \
         that nvml.library / paths.driver_root match the installed driver"
    )]
    Call {
        /// The NVML function, e.g. `nvmlDeviceGetUUID`.
        call: &'static str,
        /// Which device (or `the system`).
        device: String,
        /// NVML's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// `backend = "tegra"` on a host that is not a Jetson.
    #[error(
        "backend = \"tegra\" but this host is not a Jetson: neither {release} exists nor does {family} name a \
         Tegra SoC (check paths.driver_root and paths.sys_root, or use backend = \"auto\")"
    )]
    NotTegra {
        /// The L4T release file looked for.
        release: String,
        /// The SoC family file looked at.
        family: String,
    },
    /// The `[mock]` configuration describes impossible hardware.
    #[error("mock configuration: {0}")]
    Mock(String),
}

/// The backend `cfg.backend` selects: `nvml`, `mock`, `tegra`, or `auto` (tegra on a
/// Jetson, else NVML when its library loads, otherwise [`InventoryError::NoBackend`];
/// never the mock).
pub fn backend_from_config(cfg: &Config) -> Result<Box<dyn DeviceBackend>, InventoryError> {
    match cfg.backend {
        BackendKind::Mock => Ok(Box::new(mock::MockBackend::new(cfg))),
        BackendKind::Nvml => Ok(Box::new(nvml::NvmlBackend::load(cfg)?)),
        BackendKind::Tegra => Ok(Box::new(tegra::TegraBackend::load(cfg)?)),
        BackendKind::Auto if tegra::platform::detect(&cfg.paths).is_some() => {
            Ok(Box::new(tegra::TegraBackend::load(cfg)?))
        }
        BackendKind::Auto => match nvml::NvmlBackend::load(cfg) {
            Ok(b) => Ok(Box::new(b)),
            Err(e) => Err(InventoryError::NoBackend {
                origin: cfg.backend_origin.clone(),
                reason: crate::util::error_chain(&e),
                cause: Box::new(e),
            }),
        },
    }
}
